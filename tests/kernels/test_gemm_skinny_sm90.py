"""The Hopper skinny TMA GEMM (Gluon, kernels/gemm_skinny_sm90.py) against float32 references of its
operands at M = 1..64: bf16, fp16 and FP8 W8A8 with their scales, every plan, dispatch. The kernel
needs an sm90 GPU (no interpreter runs Gluon): its numerics are GPU tests; on the CPU it must compile
for sm90 and stay out of gemm()'s way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from fp8_operands import FP8, fp8_operands  # this folder
from launch_spy import LaunchSpy  # tests/
from seeded import randn  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import gemm_skinny_fused_sm90 as fz
from tritonllm.kernels import gemm_skinny_sm90 as sk
from tritonllm.kernels import launch, registry
from tritonllm.kernels.quant_formats import QuantScheme
from tritonllm.quantization.quantize import quantize_weight

needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and sk.available()), reason="the Gluon skinny GEMM runs on sm90 GPUs only"
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spy(monkeypatch) -> LaunchSpy:
    return LaunchSpy.install(monkeypatch, sk, "skinny_gemm_sm90_kernel")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 3, 8, 13, 16, 31, 64])
@pytest.mark.parametrize("n, k", [(45, 200), (200, 1000), (1000, 4160)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16_bit_matches_float32(m, n, k, dtype, spy) -> None:
    """Ragged M (rows past M read as TMA's zeros, masked), N (a partial weight tile) and K (a partial last
    K step), with the bias and the plan's K splits."""
    x, w, bias = randn(m, k, seed=90, dtype=dtype), randn(n, k, seed=91, dtype=dtype), randn(n, seed=92, dtype=dtype)
    expected = x.float() @ w.float().T + bias.float()
    assert_close_to_scale(g.gemm(x, w, bias, sm90="always"), expected, 1e-2)
    assert spy.launches == 1, "the Gluon skinny GEMM did not run"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 5, 16, 40])
@pytest.mark.parametrize("n, k", [(130, 512), (1000, 4224)])
def test_fp8_w8a8_matches_the_dequantized_operands(m, n, k, spy) -> None:
    """FP8 e4m3 both sides, per-channel weight scales and per-token activation scales in the epilogue."""
    q, scale, weight, expected = fp8_operands(m, n, k, seed=93)
    got = g.gemm(q, weight.data, out_dtype=torch.bfloat16, a_scale=scale, sm90="always", **g.scale_args(FP8),
                 b_scale=weight.scale)  # fmt: skip
    assert_close_to_scale(got, expected, 1e-2)
    # one activation scale for every row (a static input scale) takes the SCALE_ONE path
    one = scale.max().reshape(1)
    got = g.gemm(q, weight.data, out_dtype=torch.bfloat16, a_scale=one, sm90="always",
                 **{**g.scale_args(FP8), "a_scale_kind": g.A_TENSOR}, b_scale=weight.scale)  # fmt: skip
    assert_close_to_scale(got, (q.float() * one) @ (weight.data.float() * weight.scale[:, None]).T, 1e-2)
    assert spy.launches == 2


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 3, 8, 13, 16])
@pytest.mark.parametrize("n, k", [(130, 512), (1000, 4224), (4096, 4096)])
@pytest.mark.parametrize("plan", ["auto", "64:3:4", "128:1:2"])
def test_fp8_group_activation_scales_match_the_dequantized_operands(m, n, k, plan, monkeypatch, spy) -> None:
    """Activations quantized per 1 x 128 group (SCALE_GROUP: each K step's product scaled as it is added), with
    K splits whose programs start at later groups, fewer stages than steps, and the add into c (ADD_C); a kernel
    that applied the first group's scale to every step is caught (each group's values scaled apart)."""
    if plan != "auto":
        monkeypatch.setattr(sk, "PLAN_OVERRIDE", sk.Plan.parse(plan))
    q, scale, weight, expected = fp8_operands(m, n, k, seed=98, groups=True)
    args = dict(out_dtype=torch.bfloat16, a_scale=scale, b_scale=weight.scale, b_scale_kind=g.B_COLUMN, sm90="always")
    got = g.gemm(q, weight.data, a_scale_kind=g.A_GROUP, group_k=128, **args)
    assert_close_to_scale(got, expected, 1e-2)
    again = g.gemm(q, weight.data, a_scale_kind=g.A_GROUP, group_k=128, **args)
    assert torch.equal(again, got)
    c = randn(m, n, seed=99, dtype=torch.bfloat16)
    added = sk.skinny_gemm_sm90(q, weight.data, c.clone(), None, scale, weight.scale, launch.pdl_launch(), add_c=True)
    assert_close_to_scale(added.float() - c.float(), expected, 2e-2)
    assert spy.launches == 3 and not launch.arrival_counters(platform.DEVICE).any()
    one = sk.skinny_gemm_sm90(q, weight.data, torch.empty_like(got), None, scale[:, :1].contiguous(), weight.scale,
                              launch.pdl_launch())  # fmt: skip
    with pytest.raises(AssertionError, match="max error"):
        assert_close_to_scale(one, expected, 1e-2)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("n, k", [(200, 640), (4096, 4096), (1000, 4224)])
@pytest.mark.parametrize("plan", ["auto", "64:3:4", "128:1:2"])
def test_block_fp8_matches_the_dequantized_operands(m, n, k, plan, monkeypatch, spy) -> None:
    """Block-FP8 (128 x 128 weight scales, 1 x 128 activation groups, as Qwen3-FP8 ships): each K step's product
    times its rows' group scales and its weight block's scale (W_SCALE = SCALE_GROUP), 64- and 128-row programs
    (a 64-row program reads its 128-row block's scale), ragged N (a partial last block row), K splits; the
    portable kernels' result beside it; a kernel reading the first block's scale for every step is caught."""
    from tritonllm.kernels import reference
    from tritonllm.kernels.quant import quantize_per_group

    if plan != "auto":
        monkeypatch.setattr(sk, "PLAN_OVERRIDE", sk.Plan.parse(plan))
    scheme = QuantScheme(torch.float8_e4m3fn, "block", "group")
    w = randn(n, k, seed=100) * (1 + torch.arange(k, device=platform.DEVICE) // 128 % 4).float()  # blocks apart
    weight = quantize_weight(w, scheme)
    q, scale = quantize_per_group(randn(m, k, seed=101, dtype=torch.bfloat16), torch.float8_e4m3fn, 128)
    expected = reference.dequantize_activation(q, scale, scheme) @ reference.dequantize_weight(weight).T
    args = dict(out_dtype=torch.bfloat16, a_scale=scale, b_scale=weight.scale, **g.scale_args(scheme))
    got = g.gemm(q, weight.data, sm90="always", **args)
    assert spy.launches == 1
    assert_close_to_scale(got, expected, 1e-2)
    assert_close_to_scale(g.gemm(q, weight.data, sm90="never", **args), got.float(), 2e-2)
    first = weight.scale[:, :1].expand_as(weight.scale).contiguous()  # the first K block's scale everywhere
    wrong = g.gemm(q, weight.data, sm90="always", **{**args, "b_scale": first})
    with pytest.raises(AssertionError, match="max error"):
        assert_close_to_scale(wrong, expected, 1e-2)


@pytest.mark.gpu
@needs_sm90
def test_a_dropped_scale_is_caught(spy) -> None:
    """The comparison can fail: the product without the weight's scales is far from the reference."""
    q, scale, weight, expected = fp8_operands(16, 256, 1024, seed=94)
    got = g.gemm(q, weight.data, out_dtype=torch.bfloat16, a_scale=scale, a_scale_kind=g.A_ROW, sm90="always")
    with pytest.raises(AssertionError, match="max error"):
        assert_close_to_scale(got, expected, 1e-2)
    assert spy.launches == 1


def _twice(m: int, n: int, k: int, dtype: torch.dtype):
    """The kernel's product of seeded operands, twice, and the float32 reference."""
    if dtype == torch.bfloat16:
        x, w = randn(m, k, seed=95, dtype=dtype), randn(n, k, seed=96, dtype=dtype)
        return g.gemm(x, w, sm90="always"), g.gemm(x, w, sm90="always"), x.float() @ w.float().T
    q, scale, weight, expected = fp8_operands(m, n, k, seed=97)
    args = dict(out_dtype=torch.bfloat16, a_scale=scale, sm90="always", **g.scale_args(FP8), b_scale=weight.scale)
    return g.gemm(q, weight.data, **args), g.gemm(q, weight.data, **args), expected


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("plan", ["128:1:6", "128:3:2", "64:5:4", "64:1:8", "128:2:4:8", "128:8:3"])
@pytest.mark.parametrize("m", [1, 24, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_every_plan_matches(plan, m, dtype, monkeypatch, spy) -> None:
    """Rows a program, K splits (uneven: the last split shorter; summed in the kernel, the same bits on a
    second call, the counters back at zero), two to eight stages (fewer steps than stages too), two
    warpgroups."""
    monkeypatch.setattr(sk, "PLAN_OVERRIDE", sk.Plan.parse(plan))
    for k in (4224, 640):
        first, again, expected = _twice(m, 200, k, dtype)
        assert_close_to_scale(first, expected, 1e-2)
        assert torch.equal(again, first)  # deterministic: the splits summed in order, every call
    assert spy.launches == 4
    assert not launch.arrival_counters(platform.DEVICE).any(), "a tile's arrival counter was left non-zero"


@pytest.mark.gpu
@needs_sm90
def test_linear_sm90_takes_it_where_measured_faster(monkeypatch, spy) -> None:
    """kernels.linear=triton never runs it; triton_sm90 does where measured_faster says so."""
    monkeypatch.setattr(sk, "measured_faster", lambda m, n, k, dtype: True)
    impls = {impl.name: impl for impl in registry.implementations("linear")}
    x, w = randn(4, 512, seed=98, dtype=torch.bfloat16), randn(256, 512, seed=99, dtype=torch.bfloat16)
    impls["triton"].entries["linear"](x, w, None)
    assert spy.launches == 0
    assert_close_to_scale(impls["triton_sm90"].entries["linear"](x, w, None), x.float() @ w.float().T, 1e-2)
    assert spy.launches == 1


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.float().chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 2, 5, 16])
@pytest.mark.parametrize("inter, k", [(200, 1008), (1000, 4160), (14336, 4096)])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_gated_epilogue_is_the_gemm_then_the_silu_mul(m, inter, k, fp8, spy, monkeypatch) -> None:
    """gate_up's SiLU-mul in the GEMM's epilogue (GATED): each program's gate rows and the matching up rows,
    I ragged (a partial last program, whose gate box reads into the up rows); the same values as the GEMM
    then activation kernels (both round the GEMM's output and the product to bf16), and close to the
    float32 reference. FP8 at M <= 2 also quantizes per token in the launch (the last program to arrive; not
    taken when serving, GATED_QUANT_MAX_M):
    the same FP8 values and scales as silu_and_mul_quant, the counters left at zero."""
    from tritonllm.kernels.activation import silu_and_mul, silu_and_mul_quant

    monkeypatch.setattr(sk, "PLAN_OVERRIDE", sk.Plan(128, 1, 6))  # unsplit, as the fused launch: equal sums
    n = 2 * inter
    if fp8:
        a, a_scale, weight, expected = fp8_operands(m, n, k, seed=95)
        b, b_scale = weight.data, weight.scale
        unfused = g.gemm(a, b, out_dtype=torch.bfloat16, a_scale=a_scale, sm90="always", **g.scale_args(FP8),
                         b_scale=b_scale)  # fmt: skip
    else:
        a, b = randn(m, k, seed=96, dtype=torch.bfloat16), randn(n, k, seed=97, dtype=torch.bfloat16)
        a_scale = b_scale = None
        expected = a.float() @ b.float().T
        unfused = g.gemm(a, b, sm90="always")
    h = fz.gated_skinny_gemm_sm90(a, b, None, a_scale, b_scale, torch.bfloat16, None, launch.pdl_launch())
    assert spy.launches == 2
    assert torch.equal(h, silu_and_mul(unfused)), "the fused SiLU-mul differs from the GEMM then silu_and_mul"
    assert_close_to_scale(h, _silu_mul(expected), 2e-2)
    # a negative check: gate and up swapped is caught by the reference comparison
    assert not torch.allclose(h.float(), _silu_mul(expected.flip(-1)), atol=1e-2 * _silu_mul(expected).abs().max())
    if fp8 and m <= 2:
        q, scale = fz.gated_skinny_gemm_sm90(a, b, None, a_scale, b_scale, torch.bfloat16, torch.float8_e4m3fn,
                                             launch.pdl_launch())  # fmt: skip
        want = silu_and_mul_quant(unfused, torch.float8_e4m3fn)
        assert torch.equal(scale, want.scale), "per-token scales differ from silu_and_mul_quant's"
        assert torch.equal(q.view(torch.uint8), want.data.view(torch.uint8)), "FP8 values differ"
        assert not launch.arrival_counters(platform.DEVICE).any(), "the arrival counter was left non-zero"


@pytest.mark.gpu
@needs_sm90
def test_gated_linear_serves_batch_1_decode_and_declines_the_rest() -> None:
    """The triton_sm90 linear implementation's gated_linear entry: the fused kernel for FP8 per-channel
    gate_up (its output unquantized) and bf16 at M <= 4; None where it does not serve (an output to
    quantize beyond GATED_QUANT_MAX_M, static or per-group quantization, K split by the plan)."""
    from tritonllm.kernels.linear import gated_linear_sm90
    from tritonllm.kernels.quant_formats import OutputQuant, QuantizedActivation

    inter, k = 14336, 4096
    q, scale, weight, expected = fp8_operands(1, 2 * inter, k, seed=98)
    x = QuantizedActivation(q, scale, torch.bfloat16)
    assert_close_to_scale(gated_linear_sm90(x, weight, None, None), _silu_mul(expected), 2e-2)
    quantized = gated_linear_sm90(x, weight, None, OutputQuant(torch.float8_e4m3fn))
    assert (quantized is None) == (fz.GATED_QUANT_MAX_M < 1)
    assert gated_linear_sm90(x, weight, None, OutputQuant(torch.float8_e4m3fn, torch.ones(1, device=q.device))) is None
    assert gated_linear_sm90(x, weight, None, OutputQuant(torch.float8_e4m3fn, group=128)) is None
    q3, s3, w3, _ = fp8_operands(3, 2 * inter, k, seed=99)
    assert (
        gated_linear_sm90(QuantizedActivation(q3, s3, torch.bfloat16), w3, None, OutputQuant(torch.float8_e4m3fn))
        is None
    )
    assert gated_linear_sm90(QuantizedActivation(q3, s3, torch.bfloat16), w3, None, None).shape == (3, inter)
    small = randn(2 * 200, 1000, seed=100, dtype=torch.bfloat16)  # few tiles: the plan splits K
    assert gated_linear_sm90(randn(1, 1000, seed=101, dtype=torch.bfloat16), small, None, None) is None


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 2, 5, 16])
@pytest.mark.parametrize("inter, n", [(14336, 4096), (1008, 200), (4160, 1000)])
def test_xq_gemm_is_the_quantizing_silu_mul_then_the_gemm(m, inter, n, spy) -> None:
    """The XQ mode (a W8A8 down projection quantizing its bf16 input itself, with the scales from the
    SiLU-mul's block amaxes): the same FP8 values as silu_and_mul_quant then the FP8 GEMM, so the outputs
    agree to the summation order; close to the float32 product of the dequantized operands; amaxes an
    64th of the rows' (the largest values clamped at the FP8 maximum) are caught."""
    from tritonllm.kernels.activation import silu_and_mul_amax, silu_and_mul_quant

    y = 4 * randn(m, 2 * inter, seed=110 + m, dtype=torch.bfloat16)
    weight = quantize_weight(randn(n, inter, seed=111), FP8)
    act = silu_and_mul_quant(y, torch.float8_e4m3fn)
    unfused = g.gemm(act.data, weight.data, out_dtype=torch.bfloat16, a_scale=act.scale, sm90="always",
                     **g.scale_args(FP8), b_scale=weight.scale)  # fmt: skip
    expected = (act.data.float() * act.scale) @ (weight.data.float() * weight.scale[:, None]).T
    h, amax = silu_and_mul_amax(y)
    launches = spy.launches
    c = fz.xq_skinny_gemm_sm90(h, amax, weight.data, weight.scale, None, launch.pdl_launch())
    assert spy.launches == launches + 1 and c.dtype == torch.bfloat16 and c.shape == (m, n)
    assert_close_to_scale(c, unfused, 1e-2)
    assert_close_to_scale(c, expected, 1e-2)
    wrong = fz.xq_skinny_gemm_sm90(h, amax / 64, weight.data, weight.scale, None, launch.pdl_launch())
    assert not torch.allclose(wrong.float(), expected, atol=0.05 * expected.abs().max().item())
    assert not launch.arrival_counters(platform.DEVICE).any(), "an arrival counter was left non-zero"


@pytest.mark.gpu
@needs_sm90
def test_silu_mul_linear_serves_fp8_decode_and_declines_the_rest() -> None:
    """The triton_sm90 linear implementation's silu_mul_linear entry: down(silu(gate) * up) for an FP8
    per-token down projection at M <= XQ_MAX_M, close to the activation op then the layer's GEMM; None
    for a static input scale, M beyond XQ_MAX_M, and 16-bit weights."""
    from tritonllm.kernels.activation import silu_and_mul_quant
    from tritonllm.kernels.linear import quantized_linear_sm90, silu_mul_linear_sm90

    inter, n = 14336, 4096
    weight = quantize_weight(randn(n, inter, seed=112), FP8)
    for m in (1, 3, fz.XQ_MAX_M):
        y = 4 * randn(m, 2 * inter, seed=113 + m, dtype=torch.bfloat16)
        unfused = quantized_linear_sm90(silu_and_mul_quant(y, torch.float8_e4m3fn), weight, None)
        assert_close_to_scale(silu_mul_linear_sm90(y, weight, None), unfused, 1e-2)
    y = 4 * randn(fz.XQ_MAX_M + 1, 2 * inter, seed=114, dtype=torch.bfloat16)
    assert silu_mul_linear_sm90(y, weight, None) is None
    static = quantize_weight(randn(n, inter, seed=115), QuantScheme(torch.float8_e4m3fn, "channel", "tensor"))
    static.input_scale = torch.ones(1, device=static.data.device)
    assert silu_mul_linear_sm90(y[:1], static, None) is None
    assert silu_mul_linear_sm90(y[:1], randn(n, inter, seed=116, dtype=torch.bfloat16), None) is None


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("k, n", [(4096, 6144), (1008, 200), (4160, 1000)])
def test_xn_gemm_is_the_quantizing_norm_then_the_gemm(m, k, n, spy) -> None:
    """The XN mode (a W8A8 qkv / gate_up taking the residual stream and RMS-normalizing and quantizing it
    itself): close to rms_norm_quant then the FP8 GEMM (the same values but where the two kernels' sums of
    squares round apart) and to the float32 product of the dequantized operands; scale-invariant in the
    stream as an RMSNorm is; a reversed norm weight is caught."""
    from tritonllm.kernels.rmsnorm import rms_norm_quant

    x = 3 * randn(m, k, seed=170 + m, dtype=torch.bfloat16)
    norm_weight = (1 + 0.5 * randn(k, seed=121)).to(torch.bfloat16)
    weight = quantize_weight(randn(n, k, seed=122), FP8)
    act, _ = rms_norm_quant(x, None, norm_weight, 1e-5, torch.float8_e4m3fn)
    unfused = g.gemm(act.data, weight.data, out_dtype=torch.bfloat16, a_scale=act.scale, sm90="always",
                     **g.scale_args(FP8), b_scale=weight.scale)  # fmt: skip
    expected = (act.data.float() * act.scale) @ (weight.data.float() * weight.scale[:, None]).T
    launches = spy.launches
    c = fz.xn_skinny_gemm_sm90(x, norm_weight, 1e-5, weight.data, weight.scale, None, launch.pdl_launch())
    assert spy.launches == launches + 1 and c.dtype == torch.bfloat16 and c.shape == (m, n)
    assert_close_to_scale(c, unfused, 1e-2)
    assert_close_to_scale(c, expected, 1e-2)
    doubled = fz.xn_skinny_gemm_sm90(2 * x, norm_weight, 1e-5, weight.data, weight.scale, None, launch.pdl_launch())
    assert_close_to_scale(doubled, expected, 1e-2)
    wrong = fz.xn_skinny_gemm_sm90(x, norm_weight.flip(0), 1e-5, weight.data, weight.scale, None, launch.pdl_launch())
    assert not torch.allclose(wrong.float(), expected, atol=0.05 * expected.abs().max().item())
    assert not launch.arrival_counters(platform.DEVICE).any(), "an arrival counter was left non-zero"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("n, k", [(4096, 4096), (4096, 14336), (200, 1008)])
def test_add_c_adds_the_rounded_product_into_c(m, n, k) -> None:
    """ADD_C (o_proj / down_proj adding into the residual stream): c + the product rounded to bf16, then
    rounded, exactly as the GEMM followed by the add, with and without K splits; c's other rows untouched."""
    q, scale, weight, _ = fp8_operands(m, n, k, seed=130)
    residual = 4 * randn(m, n, seed=132, dtype=torch.bfloat16)
    product = g.gemm(q, weight.data, out_dtype=torch.bfloat16, a_scale=scale, sm90="always", **g.scale_args(FP8),
                     b_scale=weight.scale)  # fmt: skip
    want = (residual.float() + product.float()).to(torch.bfloat16)
    c = residual.clone()
    out = sk.skinny_gemm_sm90(q, weight.data, c, None, scale, weight.scale, launch.pdl_launch(), add_c=True)
    assert out is c and torch.equal(c, want)
    assert not torch.equal(want, residual)
    assert not launch.arrival_counters(platform.DEVICE).any(), "an arrival counter was left non-zero"


@pytest.mark.gpu
@needs_sm90
def test_norm_and_residual_linear_serve_fp8_decode_and_decline_the_rest() -> None:
    """The triton_sm90 linear's norm_linear and residual_linear entries: FP8 per-token layers at M <= XN_MAX_M
    (close to the norm kernel then the layer; the residual updated in place), None for M beyond it, a static
    input scale or 16-bit weights (residual untouched)."""
    from tritonllm.kernels.linear import norm_linear_sm90, quantized_linear_sm90, residual_linear_sm90
    from tritonllm.kernels.quant_formats import QuantizedActivation
    from tritonllm.kernels.rmsnorm import rms_norm_quant

    k, n = 4096, 4096
    weight = quantize_weight(randn(n, k, seed=140), FP8)
    norm_weight = (1 + 0.5 * randn(k, seed=141)).to(torch.bfloat16)
    for m in (1, fz.XN_MAX_M):
        x = 3 * randn(m, k, seed=175 + m, dtype=torch.bfloat16)
        act, _ = rms_norm_quant(x, None, norm_weight, 1e-5, torch.float8_e4m3fn)
        want = quantized_linear_sm90(act, weight, None)
        assert_close_to_scale(norm_linear_sm90(x, norm_weight, 1e-5, weight, None), want, 1e-2)
        residual = randn(m, n, seed=148, dtype=torch.bfloat16)
        added = residual.clone()
        assert residual_linear_sm90(act, weight, None, added) is added
        assert torch.equal(added, (residual.float() + want.float()).to(torch.bfloat16))
    x = randn(fz.XN_MAX_M + 1, k, seed=144, dtype=torch.bfloat16)
    assert norm_linear_sm90(x, norm_weight, 1e-5, weight, None) is None
    act, _ = rms_norm_quant(x, None, norm_weight, 1e-5, torch.float8_e4m3fn)
    residual = randn(fz.XN_MAX_M + 1, n, seed=145, dtype=torch.bfloat16)
    before = residual.clone()
    assert residual_linear_sm90(act, weight, None, residual) is None and torch.equal(residual, before)
    static = quantize_weight(randn(n, k, seed=146), QuantScheme(torch.float8_e4m3fn, "channel", "tensor"))
    static.input_scale = torch.ones(1, device=static.data.device)
    assert norm_linear_sm90(x[:1], norm_weight, 1e-5, static, None) is None
    assert norm_linear_sm90(x[:1], norm_weight, 1e-5, randn(n, k, seed=147, dtype=torch.bfloat16), None) is None
    plain = QuantizedActivation(act.data[:1], act.scale[:1], torch.bfloat16)
    assert residual_linear_sm90(plain, static, None, residual[:1]) is None


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("normed", [False, True], ids=["fp8_input", "stream"])
@pytest.mark.parametrize("inter, hidden", [(14336, 4096), (1040, 1008)])
def test_gated_amax_feeds_the_xq_down_projection(m, normed, inter, hidden) -> None:
    """GATED 3 (gate_up's epilogue writes h and its programs' block amaxes) then XQ (down quantizes h from them):
    h and the amaxes as the SiLU-mul epilogue and torch give them, the MLP close to gate_up, silu_and_mul_quant
    and down; from the residual stream (XN) as from its quantizing norm; down added into a residual exactly as
    the GEMM then the add round; wrong amaxes caught."""
    from tritonllm.kernels.activation import silu_and_mul_quant
    from tritonllm.kernels.rmsnorm import rms_norm_quant

    x = 3 * randn(m, hidden, seed=180 + m, dtype=torch.bfloat16)
    norm_weight = (1 + 0.5 * randn(hidden, seed=151)).to(torch.bfloat16)
    w13 = quantize_weight(randn(2 * inter, hidden, seed=152), FP8)
    w2 = quantize_weight(randn(hidden, inter, seed=153), FP8)
    act, _ = rms_norm_quant(x, None, norm_weight, 1e-5, torch.float8_e4m3fn)
    monkey_plan = sk.PLAN_OVERRIDE
    sk.PLAN_OVERRIDE = sk.Plan(128, 1, 6)  # the small shape's plan would split K; gate_up's never does here
    try:
        y = g.gemm(act.data, w13.data, out_dtype=torch.bfloat16, a_scale=act.scale, sm90="always", **g.scale_args(FP8),
                   b_scale=w13.scale)  # fmt: skip
        if normed:
            h, amax = fz.gated_amax_skinny_gemm_sm90(x, None, w13.data, w13.scale, None, torch.bfloat16,
                                                     launch.pdl_launch(), (norm_weight, 1e-5))  # fmt: skip
        else:
            h, amax = fz.gated_amax_skinny_gemm_sm90(act.data, act.scale, w13.data, w13.scale, None, torch.bfloat16,
                                                     launch.pdl_launch())  # fmt: skip
        h_ref = fz.gated_skinny_gemm_sm90(act.data, w13.data, None, act.scale, w13.scale, torch.bfloat16, None,
                                          launch.pdl_launch())  # fmt: skip
        if not normed:
            assert torch.equal(h, h_ref)
        assert_close_to_scale(h, h_ref, 1e-2)
        blocks = amax.shape[1]
        assert blocks == triton_cdiv(inter, 64)
        want_amax = torch.nn.functional.pad(h.float().abs(), (0, blocks * 64 - inter)).view(m, blocks, 64).amax(-1)
        assert torch.equal(amax, want_amax)
        # down's input as XQ quantizes it: the row's scale from the block amaxes, values times its reciprocal
        scale = amax.amax(1, keepdim=True).clamp(min=1e-12) / 448
        hq = (h.float() * (1.0 / scale)).clamp(-448, 448).to(torch.float8_e4m3fn)
        w2f = w2.data.float() * w2.scale[:, None]
        from_h = (hq.float() * scale) @ w2f.T
        # XQ reads h and w2 by TMA: an inner size whose rows are not 16-byte multiples is declined
        assert not fz.xq_takes(m, inter - 8, torch.bfloat16, w2.data[:, : inter - 8])
        out = fz.xq_skinny_gemm_sm90(h, amax, w2.data, w2.scale, None, launch.pdl_launch())
        assert_close_to_scale(out, from_h, 1e-2)
        # against the unfused ops: two FP8 quantizations of the same h, whose scales part where the row's largest
        # value rounds to bf16 apart (the sigmoid's division differs), each about 3% of the output's scale off h
        q = silu_and_mul_quant(y, torch.float8_e4m3fn)
        expected = (q.data.float() * q.scale) @ w2f.T
        assert_close_to_scale(out, expected, 5e-2)
        residual = randn(m, hidden, seed=154, dtype=torch.bfloat16)
        added = residual.clone()
        assert fz.xq_skinny_gemm_sm90(h, amax, w2.data, w2.scale, None, launch.pdl_launch(), added) is added
        assert torch.equal(added, (residual.float() + out.float()).to(torch.bfloat16))
        wrong = fz.xq_skinny_gemm_sm90(h, amax / 64, w2.data, w2.scale, None, launch.pdl_launch())
        assert not torch.allclose(wrong.float(), expected, atol=0.05 * expected.abs().max().item())
    finally:
        sk.PLAN_OVERRIDE = monkey_plan
    assert not launch.arrival_counters(platform.DEVICE).any(), "an arrival counter was left non-zero"


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.gpu
@needs_sm90
def test_gated_mlp_linear_serves_fp8_decode_and_declines_the_rest() -> None:
    """The triton_sm90 linear's gated_mlp_linear entry at Llama-3-8B's MLP: close to gate_up, the quantizing
    SiLU-mul and down, from the quantized input or the residual stream, with and without the residual add; None
    beyond XN_MAX_M rows and for 16-bit weights."""
    from tritonllm.kernels.activation import silu_and_mul_quant
    from tritonllm.kernels.linear import gated_mlp_linear_sm90, quantized_linear_sm90
    from tritonllm.kernels.rmsnorm import rms_norm_quant

    hidden, inter = 4096, 14336
    w13 = quantize_weight(randn(2 * inter, hidden, seed=160), FP8)
    w2 = quantize_weight(randn(hidden, inter, seed=161), FP8)
    norm_weight = (1 + 0.5 * randn(hidden, seed=162)).to(torch.bfloat16)
    for m in (1, fz.XN_MAX_M):
        x = 3 * randn(m, hidden, seed=185 + m, dtype=torch.bfloat16)
        act, _ = rms_norm_quant(x, None, norm_weight, 1e-5, torch.float8_e4m3fn)
        want = quantized_linear_sm90(silu_and_mul_quant(quantized_linear_sm90(act, w13, None), torch.float8_e4m3fn),
                                     w2, None)  # fmt: skip
        # the two launches as the entry makes them, then against the unfused ops (two FP8 quantizations of h:
        # test_gated_amax_feeds_the_xq_down_projection)
        h, amax = fz.gated_amax_skinny_gemm_sm90(act.data, act.scale, w13.data, w13.scale, None, torch.bfloat16,
                                                 launch.pdl_launch())  # fmt: skip
        two = fz.xq_skinny_gemm_sm90(h, amax, w2.data, w2.scale, None, launch.pdl_launch())
        assert torch.equal(gated_mlp_linear_sm90(act, None, 0.0, w13, None, w2, None, None), two)
        assert_close_to_scale(two, want, 5e-2)
        assert_close_to_scale(gated_mlp_linear_sm90(x, norm_weight, 1e-5, w13, None, w2, None, None), want, 5e-2)
        residual = randn(m, hidden, seed=164, dtype=torch.bfloat16)
        added = residual.clone()
        assert gated_mlp_linear_sm90(x, norm_weight, 1e-5, w13, None, w2, None, added) is added
        assert_close_to_scale(added, residual.float() + want.float(), 5e-2)
    x = randn(fz.XN_MAX_M + 1, hidden, seed=165, dtype=torch.bfloat16)
    assert gated_mlp_linear_sm90(x, norm_weight, 1e-5, w13, None, w2, None, None) is None
    plain = randn(2 * inter, hidden, seed=166, dtype=torch.bfloat16)
    assert gated_mlp_linear_sm90(x[:1], norm_weight, 1e-5, plain, None, w2, None, None) is None


def test_gemm_leaves_it_alone_off_hopper(spy) -> None:
    """Without an sm90 GPU (CPU, other GPUs) gemm(sm90="always") runs the portable kernels."""
    if platform.is_gpu() and sk.available():
        pytest.skip("an sm90 GPU: the kernel runs here")
    x, w = randn(3, 64, seed=100), randn(40, 64, seed=101)
    assert_close_to_scale(g.gemm(x, w, sm90="always"), x @ w.T, 1e-4)
    assert spy.launches == 0


def test_plans_and_shapes(monkeypatch) -> None:
    """Plans from the H200 sweep (132 SMs); MMA widths; parse; where it is taken."""
    assert sk.block_m(1) == sk.block_m(8) == 8 and sk.block_m(9) == 16 and sk.block_m(33) == 64
    assert sk.Plan.parse("64:3:4:8") == sk.Plan(64, 3, 4, 8)
    sms = 132
    monkeypatch.setattr(platform, "num_multiprocessors", lambda: sms)
    for name, value in (("RINGS", False), ("STREAM", False), ("FP8_DEEP", True)):  # TRITONLLM_SKINNY_STREAM=0
        monkeypatch.setattr(sk, name, value)
    # M = 1: 64-row programs, K split until about M1_FILL (4) programs an SM, at most 8 ways, 4 K steps each
    assert sk.plan(1, 2880, 4096, 2) == sk.Plan(64, 8, 6)  # gpt-oss o_proj: 45 tiles, 360 programs
    assert sk.plan(1, 5120, 2880, 2) == sk.Plan(64, 6, 6)  # gpt-oss qkv: 80 tiles, 480 programs
    assert sk.plan(1, 4096, 4096, 1) == sk.Plan(64, 8, 6)  # FP8: 32 K steps of 128 values, 4 a split
    assert sk.plan(1, 4096, 2048, 1).split == 4 and sk.plan(1, 6144, 4096, 2).split == 5
    assert sk.plan(1, 4096, 256, 2).split == 1  # K of four 64-column steps: no split
    monkeypatch.setattr(sk, "M1_FILL", 0)  # session 14's plan, TRITONLLM_SKINNY_M1_FILL=0
    assert sk.plan(1, 4096, 4096, 1) == sk.Plan(128, 4, 6)  # M <= 4: split K four ways
    assert sk.plan(4, 4096, 4096, 1) == sk.Plan(64, 4, 6)
    assert sk.plan(16, 4096, 14336, 1) == sk.Plan(64, 2, 8)
    assert sk.plan(1, 128 * sms, 4096, 2) == sk.plan(64, 6144, 4096, 1) == sk.Plan(128, 1, 6)
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    assert sk.measured_faster(1, 4096, 4096, fp8) and sk.measured_faster(16, 4096, 4096, fp8)
    assert not sk.measured_faster(17, 4096, 4096, fp8)
    assert sk.measured_faster(4, 2880, 4096, bf16) and not sk.measured_faster(5, 2880, 4096, bf16)
    assert sk.plan(4, 28672, 4096, 2) == sk.Plan(128, 1, 6) and not sk.measured_faster(5, 4096, 4096, bf16)
    monkeypatch.setattr(sk, "RINGS", True)  # TRITONLLM_SKINNY_STREAM=rings: only the deeper rings
    assert sk.plan(4, 28672, 4096, 2) == sk.Plan(128, 1, 12) and sk.plan(1, 28672, 4096, 1) == sk.Plan(128, 1, 12)
    assert sk.plan(1, 4096, 14336, 1) == sk.Plan(128, 4, 6) and sk.measured_faster(16, 4096, 4096, bf16)
    monkeypatch.setattr(sk, "STREAM", True)  # TRITONLLM_SKINNY_STREAM=1: both
    # session 37: 12 stages for gate_up-wide layers, stream-K over 64-row tiles for down (and 16-bit N >= 4096)
    # where at most 16 activation rows share the shared memory; 16-bit M <= 16 at N >= 4096 on this kernel
    assert sk.plan(4, 28672, 4096, 2) == sk.Plan(128, 1, 12) and sk.plan(1, 28672, 4096, 1) == sk.Plan(128, 1, 12, 4, 1)
    assert sk.plan(1, 4096, 14336, 1) == sk.plan(16, 6144, 4096, 2) == sk.Plan(64, 1, 16, 4, 1)
    assert sk.plan(17, 4096, 14336, 2) == sk.Plan(64, 2, 8) and sk.plan(8, 4096, 14336, 1) == sk.Plan(64, 2, 8)
    assert sk.plan(1, 28672, 4096, 2) == sk.plan(4, 28672, 4096, 2, deep=False) == sk.Plan(128, 1, 6)
    assert sk.measured_faster(16, 4096, 4096, bf16) and not sk.measured_faster(17, 4096, 4096, bf16)
    monkeypatch.setattr(sk, "FP8_DEEP", False)  # TRITONLLM_SKINNY_STREAM=16bit: FP8 keeps its plans
    assert sk.plan(1, 28672, 4096, 1) == sk.Plan(128, 1, 6) and sk.plan(4, 4096, 14336, 1) == sk.Plan(64, 4, 6)
    assert sk.plan(4, 28672, 4096, 2) == sk.Plan(128, 1, 12) and sk.plan(8, 6144, 4096, 2) == sk.Plan(64, 1, 16, 4, 1)
    assert sk.plan(1, 6144, 4096, 2) == sk.Plan(128, 4, 6)  # 16-bit M = 1: no deep plan (M1_FILL 0 here)


_COMPILE = """
import torch
from tritonllm.kernels import gemm_skinny_sm90 as sk
for dtype, scales in ((torch.bfloat16, False), (torch.float8_e4m3fn, True)):
    ptx = sk.compile_sm90(dtype, bm=64, split=2, scales=scales).asm["ptx"]
    print(dtype, "cp.async.bulk.tensor" in ptx, "wgmma.mma_async" in ptx, "mbarrier.try_wait" in ptx, ".local" in ptx)
ptx = sk.compile_sm90(torch.float8_e4m3fn, bm=8, scales=True, gated=2).asm["ptx"]
print("gated", "cvt.rn.satfinite.e4m3x2.f32" in ptx, "atom.global.gpu.acq_rel.add" in ptx and "max.s32" in ptx, ".local" in ptx)
for bm, warps in ((8, 4), (16, 8)):
    ptx = sk.compile_sm90(torch.float8_e4m3fn, bm=bm, split=4, scales=True, warps=warps, xq=True).asm["ptx"]
    print("xq", "cvt.rn.satfinite.e4m3x2.f32" in ptx, "wgmma.mma_async" in ptx, "cp.async.bulk.tensor" in ptx, ".local" in ptx)
for split in (1, 4):
    ptx = sk.compile_sm90(torch.float8_e4m3fn, bm=8, split=split, scales=True, xn=True).asm["ptx"]
    print("xn", "cvt.rn.satfinite.e4m3x2.f32" in ptx, "sqrt" in ptx, "cp.async.bulk.tensor" in ptx, ".local" in ptx)
ptx = sk.compile_sm90(torch.float8_e4m3fn, bm=8, split=4, scales=True, add_c=True).asm["ptx"]
print("add_c", "wgmma.mma_async" in ptx, "ld.global" in ptx, ".local" in ptx)
for xn in (False, True):
    ptx = sk.compile_sm90(torch.float8_e4m3fn, bm=8, scales=True, gated=3, xn=xn).asm["ptx"]
    print("gated3", "wgmma.mma_async" in ptx, "ex2.approx" in ptx, ".local" in ptx)
for split, add_c in ((8, False), (1, True)):
    ptx = sk.compile_sm90(torch.float8_e4m3fn, bm=8, split=split, scales=True, add_c=add_c, group_scales=True).asm["ptx"]
    print("groups", "wgmma.mma_async" in ptx, "cp.async.bulk.tensor" in ptx, ".local" in ptx)
ptx = sk.compile_sm90(torch.float8_e4m3fn, block_n=64, bm=16, split=4, scales=True, group_scales=True,
                      block_scales=True).asm["ptx"]
print("blocks", "wgmma.mma_async" in ptx, "cp.async.bulk.tensor" in ptx, ".local" in ptx)
for prewait in (16, 1):  # TMA copies issued before the PDL wait, of all the kernel's
    ptx = sk.compile_sm90(torch.float8_e4m3fn, block_n=64, bm=8, split=4, scales=True, prewait=prewait).asm["ptx"]
    print("prewait", ptx.split("griddepcontrol.wait")[0].count("cp.async.bulk.tensor"), ptx.count("cp.async.bulk.tensor"))
"""


@pytest.mark.skipif(not sk.HAVE_GLUON, reason="this Triton has no Gluon")
def test_compiles_for_sm90_without_spills() -> None:
    """The kernel compiles for sm90 (a subprocess: this one runs the interpreter) with TMA copies, mbarrier
    waits and the asynchronous warpgroup MMA in its PTX, and no local memory (spills)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split("\n")[:15]
    assert lines == ["torch.bfloat16 True True True False", "torch.float8_e4m3fn True True True False",
                     "gated True True False", "xq True True True False", "xq True True True False",
                     "xn True True True False", "xn True True True False", "add_c True True False",
                     "gated3 True True False", "gated3 True True False", "groups True True False",
                     "groups True True False", "blocks True True False",
                     # the ring's first five weight tiles before the wait, or (PREWAIT 1) one; the other four after it
                     "prewait 5 12", "prewait 1 12"], result.stdout  # fmt: skip
