"""kernels/l2_prefetch.py (a weight streamed into L2 ahead of its GEMV) and layers/prefetch.py (which layer
prefetches which): the kernel builds for sm90 with the bulk prefetch before its PDL wait, changes no value on
the GPU, and refuses what the bulk copy cannot take; the chain follows the order a decoder layer runs its
projections, skips what is not worth a launch and stops at its share of L2; decode steps fork the prefetches
in that order, the MoE block once its first expert GEMV is queued."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tritonllm import platform
from tritonllm.kernels import l2_prefetch
from tritonllm.layers import prefetch
from tritonllm.layers.linear import Linear
from tritonllm.layers.moe import FusedMoE
from tritonllm.models.loader import load_model
from tritonllm.models.tiny import tiny_model_path

ROOT = Path(__file__).resolve().parents[2]
BUILD = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tritonllm.kernels import l2_prefetch as m
TYPES = {"w_ptr": "*bf16", "ids_ptr": "*i32", "nbytes": "i64", "expert_bytes": "i64", "stride_bytes": "i64"}
def build(fn, consts):
    sig = {n: "constexpr" if n in consts else TYPES[n] for n in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1}).asm["ptx"]
for pdl in (False, True):
    ptx = build(m.l2_prefetch_kernel, {"CHUNK": m.CHUNK, "LANES": m.LANES, "PDL": pdl})
    body = ptx[ptx.index("prefetch.L2"):]
    print(pdl, "cp.async.bulk.prefetch.L2.global" in ptx, "griddepcontrol.wait" in body)
ptx = build(m.l2_prefetch_experts_kernel, {"CHUNK": m.CHUNK, "LANES": m.LANES})
print("experts", "cp.async.bulk.prefetch.L2.global" in ptx)
"""


def test_kernel_compiles_for_sm90_with_the_prefetch_before_its_pdl_wait() -> None:
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", BUILD], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", "True", "False", "True", "True", "True", "experts", "True"]


def test_without_the_bulk_prefetch_nothing_launches(monkeypatch) -> None:
    """On the interpreter (and ROCm, pre-Hopper GPUs) prefetch_l2 returns without a launch."""
    if platform.is_gpu():
        pytest.skip("the CPU path")
    monkeypatch.setattr(l2_prefetch, "l2_prefetch_kernel", None)  # a launch would fail
    assert not l2_prefetch.available()
    l2_prefetch.prefetch_l2(torch.zeros(1024))


def _chain(model) -> list[tuple[str, list[str]]]:
    """(layer, names of the tensors it prefetches) for every linked layer, in module order."""
    names = {t.data_ptr(): n for n, t in model.named_parameters()}
    for m in model.modules():
        q = getattr(m, "qweight", None)
        if q is not None:
            names[q.data.data_ptr()] = "qweight"
    layers = {id(m): n for n, m in model.named_modules()}
    return [(layers[id(m)], [names.get(t.data_ptr(), "?") for t, _, _ in m.prefetch[1]])
            for m in model.modules() if getattr(m, "prefetch", None) is not None]  # fmt: skip


def _owner(max_bytes: int = 1 << 30) -> prefetch.WeightPrefetch:
    owner = prefetch.WeightPrefetch("cpu", max_bytes=max_bytes)
    owner.enabled = True  # links and forks as on a GPU; _launch records instead of launching
    owner.forks, owner.expert_forks = [], []
    owner._launch = lambda tensors: owner.forks.append([t.data_ptr() for t, _, _ in tensors])
    owner._launch_experts = lambda tensors, ids: owner.expert_forks.append(([t.data_ptr() for t in tensors], ids))
    return owner


def test_dense_layers_link_only_across_attention(monkeypatch) -> None:
    """qkv prefetches o_proj (attention runs between them); o_proj, gate_up and down, followed by a norm or
    an activation kernel alone, prefetch nothing."""
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    model, _ = load_model(str(tiny_model_path("LlamaForCausalLM")), torch.float32, "cpu", None, "auto")
    assert _owner().link(model) == model.num_layers
    assert _chain(model) == [
        (f"model.layers.{i}.self_attn.qkv_proj", [f"model.layers.{i}.self_attn.o_proj.weight"])
        for i in range(model.num_layers)
    ]


@pytest.mark.parametrize("quantization, linked", [("fp8", False), ("int4", True)])
def test_fp8_layers_are_not_linked(quantization, linked, monkeypatch) -> None:
    """A layer whose weight is FP8 is never prefetched (measured slower: prefetch._gains); 4-bit ones are."""
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    model, _ = load_model(str(tiny_model_path("LlamaForCausalLM")), torch.float32, "cpu", quantization, "auto")
    o_proj = model.model.layers[0].self_attn.o_proj
    assert (o_proj.qweight.data.dtype == torch.float8_e4m3fn) == (not linked)
    assert _owner().link(model) == (model.num_layers if linked else 0)


def test_moe_block_prefetches_the_next_layer_and_nothing_prefetches_its_experts(monkeypatch) -> None:
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    model, _ = load_model(str(tiny_model_path("GptOssForCausalLM")), torch.float32, "cpu", None, "auto")
    assert _owner().link(model) == 2 * model.num_layers - 1
    chain = dict(_chain(model))
    assert chain["model.layers.0.self_attn.qkv_proj"] == ["model.layers.0.self_attn.o_proj.weight",
                                                          "model.layers.0.self_attn.o_proj.bias"]  # fmt: skip
    # o_proj is followed by a norm and the router; the router by the MoE block, whose experts follow the routing
    assert "model.layers.0.self_attn.o_proj" not in chain and "model.layers.0.mlp.router" not in chain
    assert chain["model.layers.0.mlp.experts"] == ["model.layers.1.self_attn.qkv_proj.weight",
                                                   "model.layers.1.self_attn.qkv_proj.bias"]  # fmt: skip


def test_small_layers_leave_the_chain_and_a_prefetch_stops_at_its_budget(monkeypatch) -> None:
    model, _ = load_model(str(tiny_model_path("LlamaForCausalLM")), torch.float32, "cpu", None, "auto")
    monkeypatch.setattr(prefetch, "MIN_BYTES", 1 << 30)
    assert _owner().link(model) == 0  # every layer under MIN_BYTES
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    owner = _owner(max_bytes=1000)
    owner.link(model)
    for layer in model.modules():
        if isinstance(layer, Linear) and layer.prefetch is not None:
            (t, start, nbytes), *rest = layer.prefetch[1]
            assert start == 0 and nbytes == min(t.numel() * t.element_size(), 1000) // 16 * 16
            assert sum(n for _, _, n in layer.prefetch[1]) <= 1000


def _decode_one_token(model) -> None:
    """One decode forward of `model`: token 5 at position 3 of a sequence in one block of a zeroed KV cache."""
    from tritonllm.layers.attention import AttentionMetadata

    caches = [(torch.zeros(4, 16, model.num_kv_heads, model.head_dim),) * 2 for _ in range(model.num_layers)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([3]), block_tables=torch.tensor([[0]], dtype=torch.int32),
        seq_lens=torch.tensor([4], dtype=torch.int32), query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        max_query_len=1, max_seq_len=4,
    )  # fmt: skip
    model(torch.tensor([5]), torch.tensor([3]), caches, meta)


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "GptOssForCausalLM"])
def test_a_decode_forward_forks_each_prefetch_once_in_order_and_only_inside_decode(architecture, monkeypatch):
    """One forward of a token under decode() forks every link once, in the chain's order (the MoE block's
    from fused_moe's after_w13 hook); outside decode() nothing is forked."""
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    model, _ = load_model(str(tiny_model_path(architecture)), torch.float32, "cpu", None, "auto")
    owner = _owner()
    links = owner.link(model)
    expected = [[t.data_ptr() for t, _, _ in m.prefetch[1]] for m in model.modules() if getattr(m, "prefetch", None)]
    _decode_one_token(model)
    assert owner.forks == []
    with owner.decode():
        _decode_one_token(model)
    assert owner.forks == expected and len(expected) == links
    assert any(isinstance(m, FusedMoE) and m.prefetch for m in model.modules()) == (architecture != "LlamaForCausalLM")


def test_short_links_prefetch_the_tail_of_the_next_weight(monkeypatch) -> None:
    """TRITONLLM_PREFETCH_SHORT_MB: the layers a norm or an activation apart link too, each prefetching the last
    SHORT_BYTES of the next weight (16-byte multiples); qkv still prefetches o_proj from its start."""
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    monkeypatch.setattr(prefetch, "SHORT_BYTES", 1000)
    model, _ = load_model(str(tiny_model_path("LlamaForCausalLM")), torch.float32, "cpu", None, "auto")
    assert _owner().link(model) == 4 * model.num_layers - 1
    for i in range(model.num_layers):
        layers = model.model.layers[i]
        (t, start, nbytes), *_ = layers.self_attn.qkv_proj.prefetch[1]
        assert t.data_ptr() == layers.self_attn.o_proj.weight.data_ptr() and start == 0
        assert nbytes == t.numel() * 4  # the whole weight (under the L2 budget)
        (t, start, nbytes), *_ = layers.mlp.gate_up_proj.prefetch[1]
        size = t.numel() * 4
        assert t.data_ptr() == layers.mlp.down_proj.weight.data_ptr()
        assert nbytes == 992 and start == size - 992 and start % 16 == 0


def test_routed_experts_prefetch_forks_with_the_routing(monkeypatch) -> None:
    """TRITONLLM_PREFETCH_EXPERTS: in a decode forward each MoE block forks its w2's prefetch with the expert
    ids the routing chose (a device tensor the kernel reads), before the next layer's qkv prefetch."""
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    monkeypatch.setattr(prefetch, "EXPERTS", True)
    model, _ = load_model(str(tiny_model_path("GptOssForCausalLM")), torch.float32, "cpu", None, "auto")
    owner = _owner()
    owner.link(model)
    moes = [m for m in model.modules() if isinstance(m, FusedMoE)]
    routes = []
    for moe in moes:
        route = moe.route
        monkeypatch.setattr(moe, "route", lambda x, *a, _r=route, **k: routes.append(_r(x, *a, **k)) or routes[-1])
    with owner.decode():
        _decode_one_token(model)
    assert [ptrs for ptrs, _ in owner.expert_forks] == [[m.w2.data_ptr()] for m in moes]  # bf16: no scales
    assert all(ids is r[1] for (_, ids), r in zip(owner.expert_forks, routes, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", [16, 4096 + 16, (1 << 20) * 3 + 48, 130 << 20])
def test_prefetch_changes_no_value(nbytes) -> None:
    """Sizes below a chunk, ragged, and past one pass of every program's lanes (64 x 32 x 64 KB)."""
    t = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    before = t.clone()
    l2_prefetch.prefetch_l2(t)
    l2_prefetch.prefetch_l2(t.view(torch.int32) if nbytes % 4 == 0 else t, nbytes=nbytes // 32 * 16)
    l2_prefetch.prefetch_l2(t, start=nbytes // 32 * 16)  # a tail
    torch.cuda.synchronize()
    assert torch.equal(t, before)


@pytest.mark.gpu
def test_expert_prefetch_changes_no_value() -> None:
    """Routed experts of a stacked [E, N, K] tensor, rows padded as MXFP4 experts are (a strided view), ids
    repeated and out of order; and of a contiguous bf16 one."""
    from tritonllm.layers.moe import aligned_rows

    words = aligned_rows(torch.randint(0, 255, (6, 40, 1440), dtype=torch.uint8, device="cuda"))
    dense = torch.randn(6, 64, 96, device="cuda", dtype=torch.bfloat16)
    ids = torch.tensor([[5, 0], [5, 3]], dtype=torch.int32, device="cuda")
    before = words.clone(), dense.clone()
    l2_prefetch.prefetch_experts_l2(words, ids)
    l2_prefetch.prefetch_experts_l2(dense, ids.long())
    torch.cuda.synchronize()
    assert torch.equal(words, before[0]) and torch.equal(dense, before[1])


@pytest.mark.gpu
def test_prefetch_refuses_what_the_bulk_copy_cannot_take() -> None:
    t = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        l2_prefetch.prefetch_l2(t[1:17])
    with pytest.raises(ValueError, match="multiples of 16"):
        l2_prefetch.prefetch_l2(t[:40])
    with pytest.raises(ValueError, match="multiples of 16"):
        l2_prefetch.prefetch_l2(t, start=8)
    with pytest.raises(ValueError, match="contiguous"):
        l2_prefetch.prefetch_l2(t.view(64, 64)[:, :32])
