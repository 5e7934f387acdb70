"""Per-op kernel benchmarks (GPU only): every registered implementation of each hot op
(kernels/registry.py) at a model-sized shape, beside the torch reference.

pytest-benchmark times rounds of calls with a clock that waits for the GPU; extra_info holds the
figures to report: triton.testing.do_bench medians (L2 flushed) of the implementation and of the
torch reference, the bytes each call must move, achieved TB/s (TFLOP/s for linear) and the ratio
to the reference. Attention has its own cases (test_bench_attention.py). A new implementation is
picked up with no edit here.

    python -m pytest -m gpu -o addopts="" tests/benchmarks/test_bench_ops.py --benchmark-json=$OUT/ops.json
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from tritonllm import platform
from tritonllm.kernels import registry
from tritonllm.kernels.quant_formats import QuantScheme
from tritonllm.layers.rotary import build_cos_sin_cache
from tritonllm.quantization.quantize import quantize_weight

FP8_LINEAR = QuantScheme(torch.float8_e4m3fn, "channel", "token")
TOKENS, HIDDEN, HEAD_DIM, HEADS, KV_HEADS, INTERMEDIATE, VOCAB, ROWS = 4096, 4096, 128, 32, 8, 14336, 151936, 256
# Qwen3-30B-A3B's experts: (experts, top-k, hidden, intermediate), a prefill chunk of MOE_TOKENS
MOE_SHAPE, MOE_TOKENS = (128, 8, 2048, 768), 256


@dataclass
class Case:
    """One call of an op's implementation: `call(entries)` runs it, `bytes` it must move, `flops`."""

    call: Callable[[dict[str, Callable]], object]
    bytes: int
    flops: int = 0


def _cases() -> dict[str, Case]:
    """Llama-3-8B-sized shapes, bf16: 4096 tokens through the norms/RoPE/activation/KV write, 256 rows
    of a Qwen3 vocabulary through sampling, a decode-sized and a prefill-sized GEMM, and a Qwen3-30B-A3B
    MoE layer (routing and experts) at 256 tokens."""
    dev, bf16 = "cuda", torch.bfloat16
    x, res = (torch.randn(TOKENS, HIDDEN, device=dev, dtype=bf16) for _ in range(2))
    w = torch.randn(HIDDEN, device=dev, dtype=bf16)
    q = torch.randn(TOKENS, HEADS * HEAD_DIM, device=dev, dtype=bf16)
    k = torch.randn(TOKENS, KV_HEADS * HEAD_DIM, device=dev, dtype=bf16)
    inv_freq = 1.0 / (500000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    cos_sin = build_cos_sin_cache(8192, inv_freq).to(dev)
    positions = torch.randint(0, 8192, (TOKENS,), device=dev)
    gate_up = torch.randn(TOKENS, 2 * INTERMEDIATE, device=dev, dtype=bf16)
    kv = torch.randn(TOKENS, KV_HEADS, HEAD_DIM, device=dev, dtype=bf16)
    k_cache, v_cache = (torch.zeros(TOKENS // 16 + 1, 16, KV_HEADS, HEAD_DIM, device=dev, dtype=bf16) for _ in range(2))
    slots = torch.randperm(TOKENS, device=dev)
    logits = torch.randn(ROWS, VOCAB, device=dev, dtype=bf16) * 3
    ones = torch.ones(ROWS, device=dev)
    rows = torch.arange(ROWS, device=dev)
    counts = torch.randint(0, 3, (ROWS, VOCAB), device=dev, dtype=torch.int32) * (
        torch.rand(ROWS, VOCAB, device=dev) < 0.01
    )
    prompt_mask = torch.rand(ROWS, VOCAB, device=dev) < 0.01
    weight = torch.randn(HIDDEN, HIDDEN, device=dev, dtype=bf16)
    fp8_weight = quantize_weight(weight, FP8_LINEAR)
    b = 2  # bytes per bf16 element
    experts, top_k, moe_h, moe_i = MOE_SHAPE
    moe_x = torch.randn(MOE_TOKENS, moe_h, device=dev, dtype=bf16)
    w13 = torch.randn(experts, 2 * moe_i, moe_h, device=dev, dtype=bf16) * moe_h**-0.5
    w2 = torch.randn(experts, moe_h, moe_i, device=dev, dtype=bf16) * moe_i**-0.5
    router_logits = torch.randn(MOE_TOKENS, experts, device=dev, dtype=bf16)
    return {
        "rms_norm": Case(lambda e: e["fused_add_rms_norm"](x, res, w, 1e-5), 4 * TOKENS * HIDDEN * b),
        "rotary": Case(
            lambda e: e["rotary_embedding"](positions, q, k, cos_sin, HEAD_DIM, True), 2 * (q.numel() + k.numel()) * b
        ),  # fmt: skip
        "activation": Case(lambda e: e["silu_and_mul"](gate_up), 3 * TOKENS * INTERMEDIATE * b),
        "kv_write": Case(lambda e: e["write_kv_cache"](kv, kv, k_cache, v_cache, slots), 4 * kv.numel() * b),
        "sampling": Case(
            lambda e: e["sample"](
                logits, 0.6 * ones, (50 * ones).int(), 0.95 * ones, 0 * ones, torch.arange(ROWS, device=dev)
            ),
            logits.numel() * b,
        ),  # fmt: skip
        # presence / frequency / repetition penalties on every row, in place (a fresh copy each call would
        # be timed too: the logits are rewritten with the same values' penalties, same work)
        "penalties": Case(
            lambda e: e["apply_penalties"](logits, rows, counts, prompt_mask, 0.5 * ones, 0.3 * ones, 1.2 * ones),
            logits.numel() * (2 * b + 4 + 1),
        ),  # fmt: skip
        "linear": Case(
            lambda e: e["linear"](x[:64], weight, None),
            (weight.numel() + 2 * 64 * HIDDEN) * b,
            2 * 64 * HIDDEN * HIDDEN,
        ),  # fmt: skip
        # routing and the experts of one MoE layer (every expert is hit at 256 tokens x top-8 of 128)
        "moe": Case(
            lambda e: e["fused_moe"](moe_x, w13, w2, *e["moe_route"](router_logits, top_k, True)),
            (w13.numel() + w2.numel() + 2 * MOE_TOKENS * moe_h) * b,
            2 * MOE_TOKENS * top_k * 3 * moe_h * moe_i,
        ),  # fmt: skip
        # the same layer with FP8 weights and per-token activations, activation quantization included
        "linear_fp8": Case(
            lambda e: e["quantized_linear"](x[:64], fp8_weight, None),
            weight.numel() + 64 * HIDDEN * (b + 1) + 64 * HIDDEN * b,
            2 * 64 * HIDDEN * HIDDEN,
        ),  # fmt: skip
    }


OP_OF = {"linear_fp8": "linear", "penalties": "sampling"}  # cases named otherwise than their op


def _serves(impl: registry.Implementation, case: str) -> bool:
    if case != "linear_fp8":
        return True
    context = registry.KernelContext(linear_formats=frozenset({FP8_LINEAR.format_name}))
    return impl.supports.refusal(context) is None


def _impls() -> list:
    return [
        pytest.param(case, impl, id=f"{case}-{impl.name}")
        for case in (
            "rms_norm",
            "rotary",
            "activation",
            "kv_write",
            "sampling",
            "penalties",
            "linear",
            "linear_fp8",
            "moe",
        )
        for impl in registry.implementations(OP_OF.get(case, case))
        if _serves(impl, case)
    ]


def _synchronized_clock() -> float:
    if platform.is_gpu():
        torch.cuda.synchronize()
    return time.perf_counter()


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="kernel benchmarks run on the GPU")
@pytest.mark.benchmark(group="ops", timer=_synchronized_clock, disable_gc=True)
@pytest.mark.parametrize("case_name, impl", _impls())
def test_bench_op(benchmark, case_name, impl) -> None:
    from triton.testing import do_bench

    case, op = _cases()[case_name], impl.op
    baseline = registry.select_kernels(default="torch_ref")
    ours_ms = do_bench(lambda: case.call(impl.entries))
    ref_ms = do_bench(lambda: case.call({e: getattr(baseline, e) for e in registry.OPS[op]}))
    info = {"us": ours_ms * 1e3, "torch_ref_us": ref_ms * 1e3, "speedup_vs_torch_ref": ref_ms / ours_ms}
    info["tb_per_s"] = case.bytes / (ours_ms * 1e-3) / 1e12
    if case.flops:
        info["tflop_per_s"] = case.flops / (ours_ms * 1e-3) / 1e12
    benchmark.extra_info.update(info)
    benchmark.pedantic(lambda: case.call(impl.entries), rounds=20, iterations=5, warmup_rounds=2)
