"""Decode steps stream each linear layer's weight into L2 while the kernels before it run.

A batch-1 decode step alternates weight-bound GEMVs with kernels that leave HBM mostly idle: RoPE and
attention over a short context between qkv and o_proj, norms, an MoE block whose expert GEMVs are bound by
their instruction stream. Nothing computed in the step decides a dense layer's weight, so its read can
start as soon as the GEMV before it has finished: once a linear layer's kernel is launched, a side stream
waits for it and launches kernels/l2_prefetch.py on the next linear layer's tensors (weight, scales, ...),
which the copy engine streams into L2 during the kernels in between; the next GEMV then reads them from L2
(on an H100: gpt-oss-20b's qkv 16.4 -> 10.8 us, Llama-3-8B's int4 qkv 9.8 -> 7.9 us, experiments/l2_prefetch).

`WeightPrefetch.link(model)` links only the layers between which HBM has time to spare, found in module
order (a decoder layer's projections are registered in the order they run):
- an attention block's qkv projection prefetches its output projection: RoPE, the KV write and attention
  over a short context run in between;
- an MoE block prefetches the next linear layer (the next decoder layer's qkv projection) once its first
  expert GEMV is queued (fused_moe's after_w13): the bytes arrive while the second runs, bound by its
  instruction stream, and after the first's stream of expert weights has gone by (started earlier, they
  would be evicted by it). Nothing prefetches the experts: they depend on the routing.
Between the other GEMVs of a step only a norm or an activation kernel runs (2-3 us): a prefetch there ran
into the next GEMV's own reads and cost Llama-3-8B 4.5-6.5% a step on an H100 (bf16 and int4 weights,
experiments/l2_prefetch), so those layers are not linked. Nor are FP8 layers (`_gains`): linked, they cost
Llama-3-8B FP8 1% a step on an H200, where the same links gain int4 4% and gpt-oss's bf16 projections 0.4%
(1.5% on an H100). A link to a layer that runs elsewhere or not at all would only cost a wasted prefetch: it
changes no value. Layers under `MIN_BYTES` (MoE routers, whose weight the fused router kernel reads anyway)
are left out, and a prefetch stops at `max_bytes` (a share of L2).

Prefetches are forked only inside `decode()`, which the runner enters for decode-graph steps of up to
`MAX_PREFETCH_SEQS` sequences (captured; run eagerly only in CPU tests); its exit joins the side stream back,
so that a captured graph holds both the fork and the join. Prefill, mixed and enforce_eager steps never
prefetch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import nn

from tritonllm.kernels import l2_prefetch
from tritonllm.kernels.quant_formats import FP8_DTYPES

# decode steps of more rows do not prefetch: measured a gain at 1 (H100), a loss at 16 (Llama-3-8B int4 TPOT
# 3.824 -> 3.884 ms on an H200, one run each); 2..8 not measured yet (TRITONLLM_PREFETCH_MAX_SEQS: the A/B's
# override, scripts/gpu_check.sh prefetch)
MAX_PREFETCH_SEQS = int(os.environ.get("TRITONLLM_PREFETCH_MAX_SEQS", "1"))
MIN_BYTES = 1 << 20  # layers with less weight are not worth a launch
# Ablation knobs, off by default because they measured slower (H200, batch 1, session 33; the A/B:
# scripts/gpu_check.sh prefetch):
# - TRITONLLM_PREFETCH_SHORT_MB: also link the layers a norm or an activation kernel apart, each prefetching only
#   the last this many MB of the next weight (what HBM can deliver in 2-3 us, read by the next GEMV's last
#   programs), where linking them with the whole weight cost 4.5-6.5%. At 8 MB: Llama-3-8B int4 361.1 against
#   361.7 tok/s, FP8 344.3 against 354.1;
# - TRITONLLM_PREFETCH_EXPERTS=1: an MoE block, once routed, prefetches its routed experts' w2 (and scales)
#   while w13 runs (prefetch_experts_l2 reads the expert ids on the device). gpt-oss-20b 505.5 against 520.8.
SHORT_BYTES = int(float(os.environ.get("TRITONLLM_PREFETCH_SHORT_MB", "0")) * (1 << 20))
EXPERTS = os.environ.get("TRITONLLM_PREFETCH_EXPERTS", "0") == "1"
L2_SHARE = 0.5  # a prefetch stops at this share of the L2 (the GEMV before it streams through the rest)


def _gains(layer: nn.Module) -> bool:
    """Whether prefetching this layer's weight paid where measured: not for FP8 weights (Llama-3-8B online FP8,
    batch 1, H200: 354.2 / 354.1 tok/s with the links against 357.6 / 358.3 without, session 33)."""
    tensors = layer_tensors(layer)
    return not tensors or tensors[0].dtype not in FP8_DTYPES


def layer_tensors(layer: nn.Module) -> list[torch.Tensor]:
    """The device tensors a linear layer's kernel reads, the weight first: a quantized layer's packed weight,
    scales and zero points (its `qweight`), else its parameters; then its bias. Each once."""
    qweight = getattr(layer, "qweight", None)
    if qweight is not None:
        tensors = [qweight.data, qweight.scale, qweight.zeros, getattr(layer, "bias", None)]
    else:
        tensors = list(layer.parameters(recurse=False))
    seen, out = set(), []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel() and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out.append(t.data)
    return out


class WeightPrefetch:
    """The side stream and the state of one model's weight prefetches (see the module docstring)."""

    def __init__(self, device: torch.device | str, max_bytes: int | None = None) -> None:
        self.enabled = l2_prefetch.available() and torch.device(device).type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.enabled else None
        if max_bytes is None and self.enabled:
            max_bytes = int(torch.cuda.get_device_properties(device).L2_cache_size * L2_SHARE)
        self.max_bytes = max_bytes or 0
        self.active = False
        self.forked = False

    def link(self, model: nn.Module) -> int:
        """Link the layers of `model` across which HBM has time to spare (see the module docstring): each
        attention block's qkv projection prefetches its output projection, each MoE block the next linear
        layer in module order; returns the number of links."""
        from tritonllm.layers.attention import Attention
        from tritonllm.layers.linear import Linear
        from tritonllm.layers.moe import FusedMoE

        parents = {id(child): module for module in model.modules() for child in module.children()}
        chain = [
            m for m in model.modules()
            if isinstance(m, FusedMoE) or (isinstance(m, Linear) and _nbytes(layer_tensors(m)) >= MIN_BYTES)
        ]  # fmt: skip
        for m in model.modules():
            if isinstance(m, (Linear, FusedMoE)):
                m.prefetch = None
            if isinstance(m, FusedMoE):
                m.expert_prefetch = self if EXPERTS else None
        links = 0
        for layer, nxt in zip(chain, chain[1:]):
            if isinstance(nxt, FusedMoE) or not _gains(nxt):  # an MoE's experts follow the routing
                continue
            parent = parents.get(id(layer))
            across_attention = parent is parents.get(id(nxt)) and any(
                isinstance(c, Attention) for c in parent.children()
            )
            if isinstance(layer, FusedMoE) or across_attention:
                layer.prefetch = (self, _budgeted(layer_tensors(nxt), self.max_bytes))
            elif SHORT_BYTES:
                layer.prefetch = (self, _budgeted(layer_tensors(nxt), min(SHORT_BYTES, self.max_bytes), tail=True))
            else:
                continue
            links += 1
        return links

    def fork(self, tensors: list[tuple[torch.Tensor, int, int]]) -> None:
        """Inside decode(): once the work queued so far on the current stream is done, stream `tensors`
        ((tensor, first byte, bytes), _budgeted's) into L2 on the side stream (the caller does not wait)."""
        self._on_side(self._launch, tensors)

    def fork_experts(self, tensors: list[torch.Tensor | None], ids: torch.Tensor) -> None:
        """Inside decode(): once the routing queued so far is done, stream the experts `ids` of each [E, ...]
        tensor into L2 on the side stream (TRITONLLM_PREFETCH_EXPERTS)."""
        self._on_side(self._launch_experts, [t for t in tensors if t is not None], ids)

    def _on_side(self, launch, *args) -> None:
        """launch(*args) on the side stream after the current stream's queued work, inside decode() only."""
        if not (self.enabled and self.active):
            return
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            launch(*args)
        self.forked = True

    def _launch(self, tensors: list[tuple[torch.Tensor, int, int]]) -> None:
        for t, start, nbytes in tensors:
            l2_prefetch.prefetch_l2(t, nbytes=nbytes, start=start)

    def _launch_experts(self, tensors: list[torch.Tensor], ids: torch.Tensor) -> None:
        for t in tensors:
            l2_prefetch.prefetch_experts_l2(t, ids)

    @contextlib.contextmanager
    def decode(self) -> Iterator[None]:
        """Prefetches on for a decode step's forward; the side stream joined back at the end."""
        self.active = self.enabled
        try:
            yield
        finally:
            self.active = False
            if self.forked and self.stream is not None:
                torch.cuda.current_stream().wait_stream(self.stream)
            self.forked = False


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _budgeted(tensors: list[torch.Tensor], max_bytes: int, tail: bool = False) -> list[tuple[torch.Tensor, int, int]]:
    """(tensor, first byte, bytes) to prefetch within max_bytes in all, the first tensor (the weight) served
    first: from its start, or its last bytes (tail); 16-byte multiples. Tensors the bulk prefetch cannot take
    (not contiguous, not 16-byte aligned) are left out."""
    out, left = [], max_bytes
    for t in tensors:
        if left < 16 or not t.is_contiguous() or t.data_ptr() % 16:
            continue
        size = t.numel() * t.element_size() // 16 * 16
        nbytes = min(size, left) // 16 * 16
        if nbytes:
            out.append((t, size - nbytes if tail else 0, nbytes))
            left -= nbytes
    return out
