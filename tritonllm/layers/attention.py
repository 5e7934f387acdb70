"""Attention over the paged KV cache, and the per-step metadata it needs.

The runner builds one `AttentionMetadata` per step (host work once, not per layer); every layer
reads the same tensors. Piecewise CUDA/HIP graphs (worker/piecewise_graph.py) set its `piecewise`
hook: each layer then hands its q, k, v to the hook instead of attending, which is where a graph
capture is split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from tritonllm.kernels.attention_rope import FoldedRope
from tritonllm.kernels.quant_formats import QuantizedActivation
from tritonllm.kernels.registry import Kernels, default_kernels
from tritonllm.layers.linear import Linear


class AttentionSplit(Protocol):
    """Takes a layer's attention call over (worker/piecewise_graph.py): returns its output
    [num_tokens, num_heads * head_dim], computed now or later into that same tensor."""

    def split(
        self,
        layer: Attention,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        rope: Rope | None,
    ) -> torch.Tensor: ...


class RopeTable(Protocol):
    """What Attention needs of a rotary embedding (layers/rotary.py's RotaryEmbedding)."""

    cos_sin_cache: torch.Tensor
    head_dim: int
    is_neox: bool

    def __call__(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class HeadNorm(Protocol):
    """A per-head RMSNorm of q or k (layers/norm.py's RMSNorm over head_dim)."""

    weight: torch.Tensor
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class Rope:
    """RoPE for Attention to apply to q and k itself (then one kernel rotates q and k and writes the
    KV cache, `rope_kv_write`): the step's positions, the layer's rotary embedding, and the per-head
    RMSNorms of q and k that come before RoPE (Qwen3's q_norm, k_norm), if any."""

    positions: torch.Tensor  # [num_tokens]
    rotary: RopeTable
    qk_norm: tuple[HeadNorm, HeadNorm] | None = None

    def head(self, n: int) -> Rope:
        """The first n tokens' (a piecewise graph's padded rows dropped)."""
        return self if self.positions.shape[0] == n else Rope(self.positions[:n], self.rotary, self.qk_norm)

    def norm_args(self) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """qk_norm as rotary_write_kv_cache takes it: (q weight, k weight, eps)."""
        if self.qk_norm is None:
            return None
        q_norm, k_norm = self.qk_norm
        if q_norm.eps != k_norm.eps:
            raise ValueError(f"q_norm and k_norm must share eps to be fused (got {q_norm.eps}, {k_norm.eps})")
        return q_norm.weight, k_norm.weight, q_norm.eps

    def apply(self, q: torch.Tensor, k: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The unfused path: the norms' and the rotary embedding's own kernels."""
        if self.qk_norm is not None:
            q_norm, k_norm = self.qk_norm
            q = q_norm(q.reshape(-1, head_dim)).view(q.shape[0], -1)
            k = k_norm(k.reshape(-1, head_dim)).view(k.shape[0], -1)
        return self.rotary(self.positions, q, k)


@dataclass
class AttentionMetadata:
    """A flat ragged batch: sequence i owns query rows query_start_loc[i]:query_start_loc[i+1];
    its q_len new tokens follow ctx_len = seq_lens[i] - q_len tokens already in the cache."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot (block * block_size + offset); -1 skips
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, physical block ids
    seq_lens: torch.Tensor  # [num_seqs] int32: ctx_len + q_len
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative q_len
    max_query_len: int
    max_seq_len: int
    # set by piecewise graphs: every layer's attention goes to it (Attention.forward)
    piecewise: AttentionSplit | None = None
    # kernel set-up of this step per (num_heads, num_kv_heads, head_dim, block_size, KV dtype), built
    # by the first layer of that shape and reused by the others
    _plans: dict = field(default_factory=dict, repr=False)

    def attention_plan(
        self, kernels: Kernels, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
        kv_dtype: torch.dtype, sliding_window: int | None = None, fuse_epilogue: bool = True,
    ) -> object:  # fmt: skip
        """The set-up of `kernels`' attention implementation for layers of this shape (and sliding
        window, which bounds the keys a split-KV decode divides), built once. fuse_epilogue False: split-KV
        results merged by a kernel of their own (ablation)."""
        key = (
            kernels.choice["attention"], num_heads, num_kv_heads, head_dim, block_size, kv_dtype, sliding_window,
            fuse_epilogue,
        )  # fmt: skip
        if key not in self._plans:
            window = {} if sliding_window is None else {"sliding_window": sliding_window}
            if not fuse_epilogue:
                window["merge_in_kernel"] = False
            self._plans[key] = kernels.plan_attention(
                self.block_tables, self.seq_lens, self.query_start_loc, self.max_query_len, self.max_seq_len,
                num_heads, num_kv_heads, head_dim, block_size, kv_dtype=kv_dtype, **window,
            )  # fmt: skip
        return self._plans[key]


class Attention(nn.Module):
    """Paged attention of one layer. Optional features, passed to the kernel only when used (and
    required of the chosen implementation, `features`): a sliding window of `sliding_window` keys,
    one learned sink logit per head (`sinks=True`: a float32 [num_heads] parameter the checkpoint
    fills), and logit soft-capping at `softcap` (kernels/reference.py's paged_attention defines them)."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        *,
        sliding_window: int | None = None,
        sinks: bool = False,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.softcap = softcap
        self.sinks = nn.Parameter(torch.empty(num_heads, dtype=torch.float32), requires_grad=False) if sinks else None
        used = {"sliding_window": sliding_window is not None, "sinks": sinks, "softcap": softcap is not None}
        self.features = frozenset(name for name, on in used.items() if on)
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        # per-tensor dequantisation scales of an FP8 KV cache (set by the runner); None otherwise
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        # the checkpoint's calibrated FP8 KV scales ({"k_scale": ..., "v_scale": ...}), if it has them
        self.checkpoint_kv_scales: dict[str, float] = {}
        # set by the runner for one step (calculate_kv_scales): raise the scales to this step's amax / fp8 max
        self.calibrate_kv_scales = False
        # with RoPE given to forward: one rope_kv_write kernel rotates q, k and writes the cache (EngineConfig.
        # fuse_rope_kv_write); False: the rotary kernel, then the KV write (ablation)
        self.fuse_rope_kv_write = True
        # with it, where the step's attention plan folds RoPE (split-KV decode): no rope_kv_write launch, the
        # attention kernel rotates q and writes the step's K/V itself (EngineConfig.fold_rope_into_attention, opt-in)
        self.fold_rope = False
        # split-KV decode merged (and o_proj's input quantized) in the split kernel (EngineConfig.
        # fuse_attention_epilogue); False: by kernels after it (ablation)
        self.fuse_epilogue = True
        # o_proj's input quantized per 1 x 128 group (each head) where o_proj's linear implementation asks for it
        # (its input_quant: FP8 W8A8 at decode sizes), so the split-KV kernel's KV-head mergers quantize their own
        # heads and no program waits for the token's whole row (EngineConfig.decode_group_quant); False: the
        # scheme's per-token scales (ablation)
        self.group_quant = True
        self._quant_for: tuple = ()  # (the linear layer whose input this layer quantizes,): no submodule

    def quantize_for(self, linear: Linear) -> None:
        """Return the output quantized for `linear` (o_proj) where its method allows it, as RMSNorm does:
        the attention kernels quantize it (in the split-KV kernel itself where it merges, else right
        after). A no-op for float layers and schemes that quantize their own input."""
        self._quant_for = (linear,) if linear.method.input_quant_fusable else ()

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads * head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        kv_cache: tuple[torch.Tensor, torch.Tensor],  # each [num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        rope: Rope | None = None,  # q and k not yet rotated: this layer applies RoPE first
    ) -> torch.Tensor | QuantizedActivation:
        if meta.piecewise is not None:
            return meta.piecewise.split(self, q, k, v, kv_cache, rope)
        return self.run(q, k, v, kv_cache, meta, rope=rope)

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        out: torch.Tensor | None = None,
        rope: Rope | None = None,
        kv_written: bool = False,
    ) -> torch.Tensor | QuantizedActivation:
        """RoPE of q and k (when `rope` is given), this step's K/V into the cache (slot -1: skipped),
        then paged attention of q over it; returns [num_tokens, num_heads * head_dim], written into
        `out` when given (contiguous, that shape, q's dtype), else quantized for the next layer when
        quantize_for set one. Piecewise graphs call this between their pieces; `kv_written`: q and k
        are rotated and the K/V written already (`rope_write_kv` ran inside the graph), attention only."""
        num_tokens = q.shape[0]
        k_cache, v_cache = kv_cache
        plan = meta.attention_plan(
            self.kernels, self.num_heads, self.num_kv_heads, self.head_dim, k_cache.shape[1], k_cache.dtype,
            self.sliding_window, self.fuse_epilogue,
        )  # fmt: skip
        fused = not kv_written and self.fuses_rope(rope)
        folded = None
        if fused and self.folds_rope(rope, plan) and q.stride(-1) == 1:
            # the attention kernel rotates q and writes the step's K/V (kernels/attention_rope.py)
            rotary = rope.rotary
            folded = FoldedRope(rope.positions, rotary.cos_sin_cache, rotary.is_neox, k.reshape(num_tokens, -1),
                                v.reshape(num_tokens, -1), meta.slot_mapping, rope.norm_args())  # fmt: skip
        elif fused:  # RoPE and the cache write in one kernel
            q, k = self.rope_write_kv(q, k, v, kv_cache, rope, meta.slot_mapping)
        elif rope is not None and not kv_written:
            q, k = rope.apply(q, k, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if not fused and not kv_written:
            if self.calibrate_kv_scales:  # on the device, no host sync; before this step's K/V are written
                fp8_max = torch.finfo(k_cache.dtype).max
                torch.maximum(self.k_scale, k.abs().amax().float().reshape(1) / fp8_max, out=self.k_scale)
                torch.maximum(self.v_scale, v.abs().amax().float().reshape(1) / fp8_max, out=self.v_scale)
            self.kernels.write_kv_cache(
                k, v, k_cache, v_cache, meta.slot_mapping, k_scale=self.k_scale, v_scale=self.v_scale
            )  # fmt: skip
        out = self.kernels.paged_attention(
            q.view(num_tokens, self.num_heads, self.head_dim),
            k_cache,
            v_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            meta.max_query_len,
            meta.max_seq_len,
            self.scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            plan=plan,
            k_new=k,
            v_new=v,
            out=None if out is None else out.view(num_tokens, self.num_heads, self.head_dim),
            **self._feature_args(),
            **self._quantize_args(out, num_tokens),
            **({"rope": folded} if folded is not None else {}),
        )
        if isinstance(out, QuantizedActivation):
            return out
        return out.view(num_tokens, self.num_heads * self.head_dim)

    def fuses_rope(self, rope: Rope | None) -> bool:
        """Whether `run` rotates q and k and writes the KV cache in one kernel (`rope_write_kv`) for this
        rope: not without one, not in the ablation, not while the step calibrates the FP8 KV scales."""
        return rope is not None and self.fuse_rope_kv_write and not self.calibrate_kv_scales

    def folds_rope(self, rope: Rope, plan: object) -> bool:
        """Whether the attention kernel of `plan` takes this layer's RoPE and K/V write over (the plan's
        `folds_rope`: split-KV decode; on unless fold_rope is off): the rotary embedding's head size is the layer's."""
        return self.fold_rope and getattr(plan, "folds_rope", False) and rope.rotary.head_dim == self.head_dim

    def rope_write_kv(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
        rope: Rope, slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """RoPE of q and k ([rows, heads * head_dim], rope.positions [rows]) and the rotated K and V into
        the cache at slot_mapping [rows] (-1: skipped) in one kernel; returns the rotated (q, k). Device
        work only, over fixed shapes: piecewise graphs capture it with their static positions and slots."""
        rotary = rope.rotary
        return self.kernels.rotary_write_kv_cache(
            rope.positions, q, k, v, rotary.cos_sin_cache, rotary.head_dim, rotary.is_neox, kv_cache[0], kv_cache[1],
            slot_mapping, k_scale=self.k_scale, v_scale=self.v_scale, qk_norm=rope.norm_args(),
        )  # fmt: skip

    def _quantize_args(self, out: torch.Tensor | None, num_tokens: int) -> dict:
        """paged_attention's `quantize`, when this layer's output goes quantized to o_proj (and not into a
        given `out`, as piecewise graphs ask): as o_proj's implementation asks for num_tokens rows (group_quant),
        else as its scheme says (Linear.input_quant)."""
        if not self._quant_for or out is not None or not self.fuse_epilogue:
            return {}
        return {"quantize": self._quant_for[0].input_quant(num_tokens, self.group_quant)}

    def _feature_args(self) -> dict:
        """The optional features' arguments of paged_attention, only those this layer uses."""
        if not self.features:
            return {}
        args = {"sliding_window": self.sliding_window, "sinks": self.sinks, "softcap": self.softcap}
        return {name: args[name] for name in self.features}
