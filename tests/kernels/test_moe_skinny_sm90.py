"""The Hopper MoE experts fed by a TMA ring (kernels/moe_skinny_sm90.py): opt-in, and no interpreter runs Gluon, so
on the CPU it must build for sm90 (TMA copies, the PDL wait, no spills, four programs an SM) and stay out of
fused_moe's way; its numerics against the reference are GPU tests."""

from __future__ import annotations

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn as _randn  # this folder
from sm90_build import sm90_build_report  # this folder

from tritonllm import platform
from tritonllm.kernels import moe_skinny_sm90 as sk
from tritonllm.kernels import reference
from tritonllm.kernels.gemm import GemmTiles
from tritonllm.kernels.moe import fused_moe
from tritonllm.kernels.moe_tiles import MoeTiles
from tritonllm.kernels.quant_formats import FP4, QuantScheme
from tritonllm.quantization.quantize import quantize_experts

needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and sk.available()), reason="the MoE skinny GEMM runs on sm90 GPUs only"
)
GEMV = MoeTiles(*[GemmTiles(1, 16, 256, 4, 1, 1, gemv=True)] * 2)  # the decode path, where the kernel may run
# the portable GEMV's tiles for block-FP8 experts: K tiles within one 128-column scale group (fused_moe's rule)
GEMV_FP8 = MoeTiles(*[GemmTiles(1, 16, 128, 4, 1, 1, gemv=True)] * 2)
FP8_BLOCK = QuantScheme(torch.float8_e4m3fn, "block", "group")  # (sm90 only: e4m3fn)


def _problem(t: int, e: int, h: int, i: int, top_k: int, seed: int, dtype: torch.dtype, bias: bool = False):
    """fused_moe's arguments at outputs of O(1): x, w13, w2, top-k weights and ids (softmax routing, renormalised),
    and the biases (or none)."""
    weights, ids = reference.moe_route(_randn(t, e, seed=seed, dtype=torch.float32), top_k, True)
    w13 = (_randn(e, 2 * i, h, seed=seed + 1) * h**-0.5).to(dtype)
    w2 = (_randn(e, h, i, seed=seed + 2) * i**-0.5).to(dtype)
    biases = {}
    if bias:
        biases = dict(w13_bias=_randn(e, 2 * i, seed=seed + 3, dtype=dtype), w2_bias=_randn(e, h, seed=seed + 4,
                                                                                           dtype=dtype))  # fmt: skip
    return (_randn(t, h, seed=seed + 5, dtype=dtype), w13, w2, weights, ids), biases


@pytest.fixture
def spy(monkeypatch) -> LaunchSpy:
    """The kernel switched on everywhere (the default plan) and its launches counted."""
    monkeypatch.setattr(sk, "PLAN", sk.Plan())
    monkeypatch.setattr(sk, "AUTO", False)
    return LaunchSpy.install(monkeypatch, sk, "moe_skinny_sm90_kernel")


_BUILD = """
import json, sys
sys.path.insert(0, "scripts")
from cross_compile_attention import registers
from tritonllm.kernels import moe_skinny_sm90 as m
report = {}
for name, gated, bias, act, early, fp8 in (
        ("w13", True, False, 0, False, False), ("w13-oai-bias", True, True, 1, False, False),
        ("w2", False, False, 0, True, False), ("w2-bias-late", False, True, 0, False, False),
        ("w13-fp8", True, False, 0, False, True), ("w2-fp8-bias", False, True, 0, True, True)):
    kernel = m.compile_sm90(gated=gated, bias=bias, activation=act, early=early, fp8=fp8)
    ptx = kernel.asm["ptx"]
    report[name] = [".local" in ptx, ptx.count("cp.async.bulk.tensor"), "griddepcontrol.wait" in ptx,
                    ptx.count("wgmma.mma_async"), registers(kernel), kernel.metadata.shared]
print(json.dumps(report))
"""


@pytest.mark.skipif(not sk.HAVE_GLUON, reason="this Triton has no Gluon")
def test_builds_for_sm90_without_spills() -> None:
    """w13 (gate and up rows: two TMA boxes a stage) and w2 (one), with and without biases and gpt-oss's activation,
    w2 with its weights requested before the PDL wait or after, 16-bit and block-FP8 experts: the ring's copies (the
    first STAGES - 1 steps' and the loop's refills: one, or FP8's two steps an iteration), the PDL wait, no local
    memory, and registers and shared memory that leave room for four programs an SM (the plan's fill)."""
    stages = sk.Plan().stages
    report = sm90_build_report(_BUILD)
    assert len(report) == 6
    for name, (spills, copies, pdl, mmas, regs, shared) in report.items():
        boxes = 3 if name.startswith("w13") else 2  # a step's copies: weight box(es) and the activation box
        refills = 2 if "fp8" in name else 1
        assert not spills and pdl and mmas > 0, (name, report)
        assert copies == boxes * (stages - 1 + refills), (name, copies)
        assert regs <= 128 and shared <= 56 * 1024, (name, regs, shared)


def test_plan_and_splits(monkeypatch) -> None:
    """K splits aim the grid at `fill` programs an SM, at most eight, each split at least four K steps of 64 (an
    H200's 132 SMs)."""
    sms = 132
    monkeypatch.setattr(platform, "num_multiprocessors", lambda: sms)
    plan = sk.Plan()
    assert sk.Plan.parse("64:4:2") == sk.Plan(64, 4, 2)
    split, per = sk.split_of(sms * plan.fill, 2048, plan)
    assert (split, per) == (1, 2048)  # enough programs already
    split, per = sk.split_of(1, 2048, plan)
    assert split == 8 and per == 256  # 32 steps: eight splits of four
    split, per = sk.split_of(1, 768, plan)
    assert split == 3 and per == 256  # 12 steps: at most three splits of four
    assert sk.split_of(192, 2048, plan)[0] == 2  # Qwen3's w13 at one token: 24 tiles x 8 pairs
    split, per = sk.split_of(1, 200, plan)
    assert (split, per) == (1, 256)  # four steps (the last ragged): no split


def test_takes_only_16_bit_experts_that_tma_reads(monkeypatch) -> None:
    """Off by default; switched on: 16-bit experts of x's dtype with 16-byte rows, SiLU or swiglu_oai, never MXFP4
    (QuantizedWeight) nor a float32 model, and nothing without an sm90 GPU."""
    monkeypatch.setattr(sk, "PLAN", None)
    (x, w13, w2, _, _), _ = _problem(2, 4, 64, 32, 2, seed=80, dtype=torch.float16)
    assert not sk.takes(x, w13, w2, 2, "silu")
    monkeypatch.setattr(sk, "PLAN", sk.Plan())
    monkeypatch.setattr(sk, "AUTO", False)
    assert sk._rows_fit(w13) and sk._rows_fit(w2)
    assert sk._rows_fit(w13[:, :, :60])  # rows 128 bytes apart, 60 values read (TMA's box masks the rest)
    assert not sk._rows_fit(torch.zeros(4, 64, 60, dtype=torch.float16))  # 120-byte rows
    assert not sk._rows_fit(w13[:, :32])  # experts 64 rows apart, read as 32
    assert not sk.takes(x.float(), w13.float(), w2.float(), 2, "silu")
    assert not sk.takes(x, w13, w2, 2, "gelu")
    mx = quantize_experts(_randn(4, 64, 64, seed=81), QuantScheme(FP4, "mx", "none"))
    assert not sk.takes(x, mx, w2, 2, "silu")
    fp8_13, fp8_2 = quantize_experts(w13.float(), FP8_BLOCK), quantize_experts(w2.float(), FP8_BLOCK)
    assert sk._experts_fit(fp8_13, x) == platform.has_fp8() and sk._experts_fit(fp8_2, x) == platform.has_fp8()
    assert not sk.takes(x, fp8_13, w2, 2, "silu")  # one block-FP8, one 16-bit
    if not (platform.is_gpu() and sk.available()):
        assert not sk.takes(x, w13, w2, 2, "silu")


@pytest.mark.parametrize(
    "setting, plan, auto",
    [
        (None, sk.Plan(), True),
        ("auto", sk.Plan(), True),
        ("0", None, False),
        ("1", sk.Plan(), False),
        ("64:4:2", sk.Plan(64, 4, 2), False),
    ],
)
def test_the_switch(monkeypatch, setting, plan, auto) -> None:
    """TRITONLLM_MOE_SKINNY: unset or "auto" the default plan where it pays, "1" / a plan everywhere, "0" off."""
    if setting is None:
        monkeypatch.delenv("TRITONLLM_MOE_SKINNY", raising=False)
    else:
        monkeypatch.setenv("TRITONLLM_MOE_SKINNY", setting)
    assert sk._mode_from_env() == (plan, auto)


def test_auto_takes_block_fp8_experts_at_decode_sizes_only(monkeypatch) -> None:
    """The default (AUTO): 16-bit experts never, block-FP8 ones at up to AUTO_FP8_TOKENS tokens (and only where the
    kernel builds: an sm90 GPU)."""
    monkeypatch.setattr(sk, "PLAN", sk.Plan())
    monkeypatch.setattr(sk, "AUTO", True)
    (x, w13, w2, _, _), _ = _problem(sk.AUTO_FP8_TOKENS + 1, 4, 256, 64, 2, seed=83, dtype=torch.bfloat16)
    fp8_13, fp8_2 = quantize_experts(w13.float(), FP8_BLOCK), quantize_experts(w2.float(), FP8_BLOCK)
    on_sm90 = platform.is_gpu() and sk.available()
    assert not sk.takes(x[:1], w13, w2, 2, "silu")  # 16-bit
    assert not sk.takes(x, fp8_13, fp8_2, 2, "silu")  # past the decode sizes
    for t in (1, 2, sk.AUTO_FP8_TOKENS):
        assert sk.takes(x[:t], fp8_13, fp8_2, 2, "silu") == on_sm90
    monkeypatch.setattr(sk, "AUTO", False)
    assert sk.takes(x[:1], w13, w2, 2, "silu") == on_sm90


def test_fused_moe_leaves_it_alone_without_hopper(monkeypatch) -> None:
    """Switched on, a machine without an sm90 GPU keeps the Triton GEMV (the reference's result)."""
    if platform.is_gpu() and sk.available():
        pytest.skip("an sm90 GPU: the kernel runs here (test_matches_the_reference)")
    monkeypatch.setattr(sk, "PLAN", sk.Plan())
    args, biases = _problem(3, 6, 64, 96, 2, seed=82, dtype=platform.DEFAULT_DTYPE, bias=True)
    got = fused_moe(*args, tiles=GEMV, activation="swiglu_oai", **biases)
    tol = 4e-5 if platform.DEFAULT_DTYPE == torch.float32 else 2e-2
    assert_close_to_scale(got, reference.fused_moe(*args, activation="swiglu_oai", **biases), tol)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "t, e, h, i, top_k",
    [(1, 128, 2048, 768, 8), (4, 128, 2048, 768, 8), (1, 32, 2880, 2880, 4), (3, 6, 200, 136, 2), (2, 4, 512, 64, 1),
     (16, 8, 1024, 1000, 2)],
)  # fmt: skip
@pytest.mark.parametrize("activation, bias", [("silu", False), ("swiglu_oai", True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matches_the_reference(t, e, h, i, top_k, activation, bias, dtype, spy) -> None:
    """Both launches run the kernel and the layer matches the float32 reference: Qwen3-30B-A3B's layer at one and
    four tokens (w13 split over K at one), gpt-oss's (K = 2,880: a half-empty last K step), ragged H and I (200,
    136: the last tiles' rows past the expert read its neighbour's rows or TMA's zeros, their columns masked), top_k
    1, sixteen tokens; biases with gpt-oss's activation."""
    args, biases = _problem(t, e, h, i, top_k, seed=83 + t, dtype=dtype, bias=bias)
    got = fused_moe(*args, tiles=GEMV, activation=activation, **biases)
    assert spy.launches == 2, "the MoE skinny GEMM did not run"
    expected = reference.fused_moe(*[a.float() if a.is_floating_point() else a for a in args], activation=activation,
                                   **{k: v.float() for k, v in biases.items()})  # fmt: skip
    assert_close_to_scale(got, expected, 2e-2)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "t, e, h, i, top_k, activation, bias",
    [(1, 128, 2048, 768, 8, "silu", False), (4, 128, 2048, 768, 8, "silu", False),
     (3, 6, 384, 160, 2, "swiglu_oai", True), (2, 4, 1040, 96, 1, "silu", False)],
)  # fmt: skip
def test_block_fp8_experts_match_the_portable_gemv(t, e, h, i, top_k, activation, bias, spy) -> None:
    """Block-FP8 experts (Qwen3-30B-A3B-FP8's layer at one and four tokens; I = 160: a gate / up tile's scale
    blocks differ from its neighbour's; H = 1,040: a ragged last K group and scale block): against the portable
    Triton GEMV on the same quantized activations (tight) and the float32 reference (the activations' FP8 rounding
    included, as test_moe's bound)."""
    args, biases = _problem(t, e, h, i, top_k, seed=95 + t, dtype=torch.bfloat16, bias=bias)
    x, w13, w2, weights, ids = args
    w13, w2 = quantize_experts(w13.float(), FP8_BLOCK), quantize_experts(w2.float(), FP8_BLOCK)
    got = fused_moe(x, w13, w2, weights, ids, tiles=GEMV_FP8, activation=activation, **biases)
    assert spy.launches == 2, "the MoE skinny GEMM did not run"
    sk.PLAN = None  # (the fixture's monkeypatch restores it)
    portable = fused_moe(x, w13, w2, weights, ids, tiles=GEMV_FP8, activation=activation, **biases)
    assert spy.launches == 2
    # each quantizes its own bf16 intermediate, whose last bits depend on the summation order: a few FP8 codes of
    # w2's activations differ by a step (test_moe: 0.7-1.7% of the output's scale)
    assert_close_to_scale(got, portable, 2e-2)
    expected = reference.fused_moe(x, w13, w2, weights, ids, activation=activation, **biases)
    assert_close_to_scale(got, expected, 3e-2)


@pytest.mark.gpu
@needs_sm90
def test_deterministic_and_counters_left_at_zero(spy) -> None:
    """Split w13 and summed w2 slots are added in a fixed order: two runs agree bit for bit, and every arrival
    counter is back at zero after them (the next launch's count starts there)."""
    from tritonllm.kernels.launch import arrival_counters

    args, _ = _problem(1, 128, 2048, 768, 8, seed=90, dtype=torch.bfloat16)
    first = fused_moe(*args, tiles=GEMV)
    second = fused_moe(*args, tiles=GEMV)
    torch.cuda.synchronize()
    assert torch.equal(first, second)
    assert int(arrival_counters(first.device).abs().sum()) == 0
    assert max(grid[2] for grid in spy.grids) > 1, "no launch had several parts a row"


@pytest.mark.gpu
@needs_sm90
def test_a_wrong_slot_weight_is_caught(spy) -> None:
    """The comparison can fail: the kernel given a token's second slot weighted twice misses the reference."""
    args, _ = _problem(1, 128, 2048, 768, 8, seed=91, dtype=torch.bfloat16)
    x, w13, w2, weights, ids = args
    expected = reference.fused_moe(x.float(), w13.float(), w2.float(), weights, ids)
    wrong = weights.clone()
    wrong[:, 1] *= 2
    got = fused_moe(x, w13, w2, wrong, ids, tiles=GEMV)
    assert spy.launches == 2
    with pytest.raises(AssertionError, match="max error"):
        assert_close_to_scale(got, expected, 2e-2)
