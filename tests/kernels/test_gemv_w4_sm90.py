"""The Hopper 4-bit GEMV (Gluon, kernels/gemv_w4_sm90.py) against x @ dequant(w).T, its dispatch, its
SASS, and the arithmetic of its int4 decode. The kernel itself needs an sm90 GPU (no interpreter
runs Gluon), so its numerics are GPU tests; on the CPU it must compile for sm90 and stay out of
gemm()'s way, and the decode's algebra is checked in torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn as _randn  # this folder
from sm90_build import sm90_build_report  # this folder
from w4_schemes import SCHEMES, scheme_id  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import gemm_w4_tma_sm90, gemv_w4, gemv_w4_sm90, gemv_w4_tma_sm90, reference, registry
from tritonllm.kernels import linear as linear_kernels
from tritonllm.kernels.quant_formats import E2M1_VALUES, FP4, INT4, OutputQuant, QuantizedWeight, QuantScheme, pack_int4
from tritonllm.quantization.quantize import quantize_weight

needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and gemv_w4_sm90.available()), reason="the Gluon W4 GEMV runs on sm90 GPUs only"
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spy(monkeypatch) -> LaunchSpy:
    spy = LaunchSpy.install(monkeypatch, gemv_w4_sm90, "w4_gemv_sm90_kernel")
    monkeypatch.setattr(gemm_w4_tma_sm90, "FORCE", "never")  # the TMA kernel would take these shapes first
    monkeypatch.setattr(gemv_w4_tma_sm90, "ENABLED", False)  # and the TMA-fed GEMV, where switched on
    return spy


def _gemv(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None, gluon: str = "always"
) -> torch.Tensor:
    return g.gemm(x, weight.data, bias, b_scale=weight.scale, b_zero=weight.zeros, sm90=gluon,
                  **g.scale_args(weight.scheme))  # fmt: skip


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@pytest.mark.parametrize("n, k", [(45, 640), (130, 4096), (77, 4224), (9, 8192 + 128)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_the_dequantized_weight(scheme, n, k, with_bias, spy) -> None:
    """Ragged N (rows past N masked), K below, at and above the 4096-column tile (masked groups), bias."""
    group = scheme.group_size or 32
    if k % group:
        pytest.skip("K must be whole groups")
    x = _randn(1, k, seed=50, dtype=torch.bfloat16)
    bias = _randn(n, seed=51, dtype=torch.bfloat16) if with_bias else None
    weight = quantize_weight(_randn(n, k, seed=52), scheme)
    got = _gemv(x, weight, bias)
    expected = x.float() @ reference.dequantize_weight(weight).T + (bias.float() if with_bias else 0)
    assert_close_to_scale(got, expected, 1e-2)
    assert spy.launches == 1, "the Gluon GEMV did not run"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("scheme", SCHEMES[::2], ids=scheme_id)
@pytest.mark.parametrize("n, k", [(45, 640), (1000, 4224), (3, 8192 + 128)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gated_matches_silu_mul_of_the_dequantized_weight(scheme, n, k, with_bias, spy) -> None:
    """The gated build (the triton_sm90 linear's gated_linear entry for a 4-bit gate_up [gate | up] [2 N, K]):
    silu(gate) * up of the float32 product with the dequantized weight, in one launch, at ragged N (columns past N
    masked) and K below, at and above the 4096-column tile, with the bias (gate's n, up's N + n); the same
    comparison fails with gate and up swapped (the negative check)."""
    if k % (scheme.group_size or 32):
        pytest.skip("K must be whole groups")
    x = _randn(1, k, seed=53, dtype=torch.bfloat16)
    bias = _randn(2 * n, seed=54, dtype=torch.bfloat16) if with_bias else None
    weight = quantize_weight(_randn(2 * n, k, seed=55), scheme)
    got = linear_kernels.gated_linear_sm90(x, weight, bias, None)
    h = x.float() @ reference.dequantize_weight(weight).T + (bias.float() if with_bias else 0)
    assert got is not None and got.shape == (1, n)
    assert_close_to_scale(got, torch.nn.functional.silu(h[:, :n]) * h[:, n:], 1e-2)
    assert spy.launches == 1 and spy.calls[0]["GATED"]
    with pytest.raises(AssertionError):
        assert_close_to_scale(got, torch.nn.functional.silu(h[:, n:]) * h[:, :n], 1e-2)


def test_the_gated_entry_leaves_4bit_weights_to_the_activation_kernel_where_the_gemv_does_not_serve() -> None:
    """Off Hopper (here), at two rows or with a quantized output: None, so that
    SiluAndMul runs the GEMM and then its own kernel."""
    weight = quantize_weight(_randn(64, 256, seed=56), SCHEMES[2])
    x = _randn(1, 256, seed=57, dtype=platform.DEFAULT_DTYPE)
    if not (platform.is_gpu() and gemv_w4_sm90.available()):
        assert linear_kernels.gated_linear_sm90(x, weight, None, None) is None
    assert linear_kernels.gated_linear_sm90(torch.cat([x, x]), weight, None, None) is None
    quant = OutputQuant(torch.float8_e4m3fn)
    assert linear_kernels.gated_linear_sm90(x, weight, None, quant) is None


@pytest.mark.skipif(not gemv_w4_sm90.HAVE_GLUON, reason="this Triton has no Gluon")
@pytest.mark.parametrize("fp4", [False, True], ids=["int4", "mxfp4"])
def test_the_gated_build_keeps_the_k_loop(fp4: bool) -> None:
    """The GATED build for sm90 (half pairs, the default): no spills, and its K loop within two instructions of
    the plain build's (the SiLU-mul is in the epilogue; Triton 3.9: int4 571 / 571, MXFP4 713 / 712)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    loops = []
    for extra in ([], ["--gated"]):
        args = [sys.executable, "scripts/sass_loop_mix.py", "--gluon", "--half2"] + (["--fp4"] if fp4 else []) + extra
        out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "no spills" in out.stdout, out.stdout
        loops.append(int(re.search(r"loop: (\d+)", out.stdout).group(1)))
    assert abs(loops[1] - loops[0]) <= 2, loops


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("rows, warps_k, prefetch", [(8, 4, False), (4, 1, True), (2, 2, True), (4, 1, False)])
@pytest.mark.parametrize("scheme", SCHEMES[2:], ids=scheme_id)
@pytest.mark.parametrize("n, k", [(45, 640), (77, 4224), (130, 8192)])
def test_every_tiling_matches(rows, warps_k, prefetch, scheme, n, k, monkeypatch, spy) -> None:
    """Rows a thread, warps along K or along rows, the next tile prefetched (its loads past K masked)."""
    tiling = gemv_w4_sm90.Tiling(rows, warps_k, prefetch)
    monkeypatch.setattr(gemv_w4_sm90, "TILINGS", {"int4": tiling, "fp4": tiling})
    x = _randn(1, k, seed=60, dtype=torch.bfloat16)
    weight = quantize_weight(_randn(n, k, seed=61), scheme)
    assert_close_to_scale(_gemv(x, weight), x.float() @ reference.dequantize_weight(weight).T, 1e-2)
    assert spy.launches == 1


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fp4_bits", ["float32", "half2"])
@pytest.mark.parametrize("scheme", [SCHEMES[0], SCHEMES[2], SCHEMES[3]], ids=scheme_id)
@pytest.mark.parametrize("n, k, blocks", [(56, 640, 3), (8 * 33, 4096, 4), (16, 4096, 2), (8 * 9, 3968, 8)])
def test_row_blocks_a_program_match(fp4_bits, scheme, n, k, blocks, monkeypatch) -> None:
    """The blocked kernel (a tiling of several row blocks a program, K within one tile, N whole blocks): programs
    with fewer blocks than BLOCKS at the end, a program of one block, K below the tile (masked groups) and at
    it, a bias; in float32 and in half pairs, against the dequantized weight."""
    monkeypatch.setattr(gemv_w4, "FP4_BITS", gemv_w4.FP4_HALF2 if fp4_bits == "half2" else gemv_w4.FP4_F32)
    tiling = gemv_w4_sm90.Tiling(8, 4, blocks=blocks)
    monkeypatch.setattr(gemv_w4_sm90, "TILINGS", {"int4": tiling, "fp4": tiling})
    monkeypatch.setattr(gemm_w4_tma_sm90, "FORCE", "never")
    blocked = LaunchSpy.install(monkeypatch, gemv_w4_sm90, "w4_gemv_sm90_blocks_kernel")
    weight = quantize_weight(_randn(n, k, seed=66), scheme)
    bias = _randn(n, seed=67, dtype=torch.bfloat16)
    for seed, factor in ((68, 1.0), (69, 1e4)):
        x = (_randn(1, k, seed=seed) * factor).bfloat16()
        expected = x.float() @ reference.dequantize_weight(weight).T + bias.float()
        assert_close_to_scale(_gemv(x, weight, bias), expected, 2e-2)
    assert blocked.launches == 2 and blocked.calls[0]["BLOCKS"] == blocks


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fp4_bits", ["float32", "half2"])
@pytest.mark.parametrize("scheme", [SCHEMES[0], SCHEMES[2], SCHEMES[3]], ids=scheme_id)
@pytest.mark.parametrize("n, k, split", [(45, 14336, 4), (4096, 14336, 2), (77, 8192, 4), (9, 4096 * 3 + 640, 8)])
def test_k_splits_match(fp4_bits, scheme, n, k, split, monkeypatch, spy) -> None:
    """K cut into runs of whole K tiles (Tiling.split), each run a program, the row block's last to arrive summing
    them: runs of one tile and of several, a short last run (masked groups), K whole tiles (EVEN), a split asked
    beyond the tiles K has, ragged N, a bias; rows whose runs differ in scale by 1e4 (half pairs take each run's
    own factor); float32 and half pairs. The arrival counters are left at zero."""
    monkeypatch.setattr(gemv_w4, "FP4_BITS", gemv_w4.FP4_HALF2 if fp4_bits == "half2" else gemv_w4.FP4_F32)
    tiling = gemv_w4_sm90.Tiling(8, 4, split=split)
    monkeypatch.setattr(gemv_w4_sm90, "TILINGS", {"int4": tiling, "fp4": tiling})
    weight = quantize_weight(_randn(n, k, seed=72), scheme)
    bias = _randn(n, seed=73, dtype=torch.bfloat16)
    x = _randn(1, k, seed=74)
    x[:, : k // 3] *= 1e4  # the first run(s) far larger than the rest
    x = x.bfloat16()
    for _ in range(2):  # a second launch finds the counters reset
        expected = x.float() @ reference.dequantize_weight(weight).T + bias.float()
        assert_close_to_scale(_gemv(x, weight, bias), expected, 2e-2)
    runs = min(split, -(-k // gemv_w4_sm90.tile_k(tiling)))
    assert spy.launches == 2 and spy.calls[0]["SPLIT_K"] == runs > 1
    from tritonllm.kernels.launch import arrival_counters

    assert int(arrival_counters(x.device).abs().sum()) == 0


@pytest.mark.gpu
@needs_sm90
def test_a_split_tiling_leaves_one_tile_rows_and_the_gated_build_unsplit(spy, monkeypatch) -> None:
    """K within one tile has nothing to split, and the gated build's epilogue needs both sums: one run each."""
    tiling = gemv_w4_sm90.Tiling(8, 4, split=4)
    monkeypatch.setattr(gemv_w4_sm90, "TILINGS", {"int4": tiling, "fp4": tiling})
    weight = quantize_weight(_randn(64, 4096, seed=75), SCHEMES[2])
    x = _randn(1, 4096, seed=76, dtype=torch.bfloat16)
    assert_close_to_scale(_gemv(x, weight), x.float() @ reference.dequantize_weight(weight).T, 2e-2)
    assert spy.calls[0]["SPLIT_K"] == 1


@pytest.mark.gpu
@needs_sm90
def test_the_blocked_kernel_leaves_other_shapes_to_the_one_block_kernel(spy, monkeypatch) -> None:
    """K past one tile, or N not whole blocks: the one-block kernel."""
    tiling = gemv_w4_sm90.Tiling(8, 4, blocks=4)
    monkeypatch.setattr(gemv_w4_sm90, "TILINGS", {"int4": tiling, "fp4": tiling})
    blocked = LaunchSpy.install(monkeypatch, gemv_w4_sm90, "w4_gemv_sm90_blocks_kernel")
    for n, k in ((64, 4224), (60, 4096)):
        weight = quantize_weight(_randn(n, k, seed=70), SCHEMES[2])
        x = _randn(1, k, seed=71, dtype=torch.bfloat16)
        assert_close_to_scale(_gemv(x, weight), x.float() @ reference.dequantize_weight(weight).T, 2e-2)
    assert blocked.launches == 0 and spy.launches == 2


@pytest.mark.gpu
@needs_sm90
def test_every_code_decodes_exactly(spy) -> None:
    """Every int4 code under zero points 0 / 8 / 15, every e2m1 code under scales 2**-27 .. 2**23, picked
    out column by column with one-hot activations: exact."""
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 8)  # [3, 128]
    scale = torch.tensor([[1.0], [0.5], [4.0]]).bfloat16()
    zeros = torch.tensor([[0.0], [8.0], [15.0]]).bfloat16()
    int4 = QuantizedWeight(QuantScheme(INT4, "group", "none", group_size=128), pack_int4(codes).to(platform.DEVICE),
                           scale.to(platform.DEVICE), zeros=zeros.to(platform.DEVICE))  # fmt: skip
    exps = torch.tensor([[127, 120, 100, 150], [130, 127, 104, 140], [127, 126, 101, 127]], dtype=torch.uint8)
    fp4 = QuantizedWeight(
        QuantScheme(FP4, "mx", "none"), pack_int4(codes).to(platform.DEVICE), exps.to(platform.DEVICE)
    )
    eye = torch.eye(128, device=platform.DEVICE, dtype=torch.bfloat16)
    got_int4 = torch.stack([_gemv(eye[i : i + 1], int4)[0] for i in range(128)], 1).float().cpu()
    got_fp4 = torch.stack([_gemv(eye[i : i + 1], fp4)[0] for i in range(128)], 1).float().cpu()
    assert torch.equal(got_int4, ((codes.float() - zeros.float()) * scale.float()).bfloat16().float())
    values = torch.tensor(E2M1_VALUES).repeat(3, 8) * torch.exp2(exps.float() - 127).repeat_interleave(32, 1)
    assert torch.equal(got_fp4, values.bfloat16().float())
    assert spy.launches == 256


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("half2", [False, True])
def test_a_broken_decode_is_caught(monkeypatch, half2) -> None:
    """Negative check: with the nibble masks the decode uses swapped (float32: INT4_MASKS; half pairs:
    gemv_w4.INT4_HALF2_MASKS) the kernel's output fails the same comparison."""
    monkeypatch.setattr(gemv_w4, "FP4_BITS", gemv_w4.FP4_HALF2 if half2 else gemv_w4.FP4_F32)
    weight = quantize_weight(_randn(64, 4096, seed=53), SCHEMES[2])
    x = _randn(1, 4096, seed=54, dtype=torch.bfloat16)
    expected = x.float() @ reference.dequantize_weight(weight).T
    assert_close_to_scale(_gemv(x, weight), expected, 1e-2)
    module, name = (gemv_w4, "INT4_HALF2_MASKS") if half2 else (gemv_w4_sm90, "INT4_MASKS")
    monkeypatch.setattr(module, name, getattr(module, name)[::-1])
    with pytest.raises(AssertionError):
        assert_close_to_scale(_gemv(x, weight), expected, 1e-2)


@pytest.mark.gpu
@needs_sm90
def test_the_triton_implementation_keeps_the_portable_kernel(spy) -> None:
    """kernels.linear=triton (the ablation baseline) never runs it; triton_sm90 does where it was
    measured faster (int4: everywhere)."""
    weight = quantize_weight(_randn(64, 4096, seed=55), SCHEMES[2])
    x = _randn(1, 4096, seed=56, dtype=torch.bfloat16)
    expected = x.float() @ reference.dequantize_weight(weight).T
    impls = {impl.name: impl for impl in registry.implementations("linear")}
    assert_close_to_scale(impls["triton"].entries["quantized_linear"](x, weight, None), expected, 1e-2)
    assert spy.launches == 0
    assert_close_to_scale(impls["triton_sm90"].entries["quantized_linear"](x, weight, None), expected, 1e-2)
    assert spy.launches == 1


def test_gemm_leaves_it_alone_off_hopper(spy) -> None:
    """Without an sm90 GPU (here: the interpreter) gemm() at M = 1 runs the portable kernels."""
    if platform.is_gpu() and gemv_w4_sm90.available():
        pytest.skip("an sm90 GPU: the kernel is meant to run here")
    weight = quantize_weight(_randn(16, 256, seed=57), SCHEMES[0])
    x = _randn(1, 256, seed=58, dtype=platform.DEFAULT_DTYPE)
    assert_close_to_scale(_gemv(x, weight), x.float() @ reference.dequantize_weight(weight).T, 1e-2)
    assert spy.launches == 0


def test_tilings_parse_from_the_environment_form() -> None:
    assert gemv_w4_sm90.Tiling.parse("4:1:1:128") == gemv_w4_sm90.Tiling(4, 1, True, 128)
    assert gemv_w4_sm90.Tiling.parse("8:4:0:0") == gemv_w4_sm90.Tiling(8, 4, False, None)
    assert gemv_w4_sm90.Tiling.parse("8:4:0:0:4") == gemv_w4_sm90.Tiling(8, 4, False, None, blocks=4)
    assert gemv_w4_sm90.Tiling.parse("8:4:0:0:1:4") == gemv_w4_sm90.Tiling(8, 4, False, None, split=4)
    for text in ("4:1:1:128", "8:4:0:0", "8:4:0:0:4", "8:4:0:0:1:4", "16:4:1:168:2:3"):
        assert gemv_w4_sm90.Tiling.parse(text).spec() == text


@pytest.mark.skipif(not gemv_w4_sm90.HAVE_GLUON, reason="this Triton has no Gluon")
def test_the_split_build_compiles_for_sm90_without_spills() -> None:
    """The SPLIT_K build (runs of one K tile: Llama-3-8B's down in four) at 8 rows a thread, half pairs, K whole
    tiles or not: no spills, and few enough registers for three programs an SM (int4 161-165 under Triton 3.6,
    MXFP4 127). A subprocess: this one runs the interpreter."""
    code = (
        "import json, sys\n"
        "sys.path.insert(0, '.')\n"
        "from scripts.cross_compile_attention import disassemble, registers\n"
        "from tritonllm.kernels import gemv_w4_sm90 as g\n"
        "out = {}\n"
        "for fp4 in (False, True):\n"
        "    for even in (True, False):\n"
        "        k = g.compile_sm90(fp4, tiling=g.Tiling(8, 4, split=4), even=even, half2=True, one_tile=True)\n"
        "        out[f'{fp4}-{even}'] = [registers(k), 'STL' in disassemble(k)]\n"
        "print(json.dumps(out))\n"
    )
    builds = sm90_build_report(code)
    assert len(builds) == 4 and all(regs <= 168 and not spills for regs, spills in builds.values()), builds


def test_long_k_takes_its_own_tiling_where_one_is_set(monkeypatch) -> None:
    """int4 in half pairs takes 16 rows a thread above LONG_K (Llama-3-8B's down); a format without a long-K entry
    (MXFP4, or one set from the environment) keeps its tiling at every K."""
    base, long = gemv_w4_sm90.Tiling(8, 4), gemv_w4_sm90.Tiling(16, 4)
    monkeypatch.setattr(gemv_w4_sm90, "TILINGS", {"int4": base, "fp4": base, "int4_long": long})
    assert gemv_w4_sm90.tiling_for(False, 4096) == base and gemv_w4_sm90.tiling_for(False, 14336) == long
    assert gemv_w4_sm90.tiling_for(True, 14336) == base


def test_measured_faster_takes_every_llama_layer() -> None:
    """Llama-3-8B: int4 and MXFP4 at every layer (MXFP4's down, K 14,336, since its pair decode: session 31)."""
    shapes = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
    assert all(gemv_w4_sm90.measured_faster(n, k, fp4) for n, k in shapes for fp4 in (False, True))


def test_decode_batch_one_takes_the_word_gemv_without_a_tuned_table() -> None:
    """GPUs and shapes without a tuned entry: one row of 4-bit weights takes the word GEMV, two rows the tiles."""
    for family in ("hopper", "ampere", "cdna"):
        assert g.pick_tiles("w4a16", 1, family).gemv and not g.pick_tiles("w4a16", 2, family).gemv


def test_supported_shapes() -> None:
    assert gemv_w4_sm90.supported(1, 4096, 128) == gemv_w4_sm90.HAVE_GLUON
    assert not gemv_w4_sm90.supported(2, 4096, 128)  # M above 1: the portable kernel's rows a program
    assert not gemv_w4_sm90.supported(1, 4096, 4096)  # one group over all of K
    assert not gemv_w4_sm90.supported(1, 4100, 128)


def _emulated_int4_dot(words: torch.Tensor, a: torch.Tensor, s: torch.Tensor, z: torch.Tensor, group: int):
    """The kernel's int4 arithmetic in torch (int32 words [N, K / 8], a [K], s / z [N, K / group]): the
    five-shift decode at float bits 12..15 / 16..19, activations x 2**11 / 2**7, the per-group bias terms."""

    def decode(x: torch.Tensor, mask: int) -> torch.Tensor:
        return ((x & mask) | 0x3F800000).view(torch.float32)

    m0, m1 = gemv_w4_sm90.INT4_MASKS
    shifted = {12: words << 12, 4: words << 4, 0: words, -8: words >> 8, -12: words >> 12}
    plan = {0: (12, m0), 1: (12, m1), 2: (4, m0), 3: (0, m0), 4: (0, m1), 5: (-8, m0), 6: (-8, m1), 7: (-12, m1)}
    cols = a.view(-1, 8)
    part = torch.zeros(words.shape, dtype=torch.float32)
    for j, (shift, mask) in plan.items():
        part += decode(shifted[shift], mask) * cols[:, j] * (2048.0 if mask == m0 else 128.0)
    lo, hi = [j for j, (_, m) in plan.items() if m == m0], [j for j, (_, m) in plan.items() if m == m1]
    per_group = cols.view(-1, group // 8, 8)
    a_lo, a_hi = per_group[..., lo].sum((-1, -2)), per_group[..., hi].sum((-1, -2))
    part_g = part.view(words.shape[0], -1, group // 8).sum(-1)
    return (s * (part_g - (2048.0 * a_lo + 128.0 * a_hi) - z * (a_lo + a_hi))).sum(-1)


@pytest.mark.parametrize("group", [32, 128])
def test_int4_decode_arithmetic(group: int) -> None:
    """The decode's algebra (its constants, the shifts' nibble order, the bias terms) against the
    dequantized weight, bounded by float32's 2**-13 loss under the 1 + q 2**-11 bias; a wrong
    nibble order fails it."""
    n, k = 7, 4 * group
    gen = torch.Generator().manual_seed(59)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    s, z = torch.rand(n, k // group, generator=gen) / 8, torch.randint(0, 16, (n, k // group), generator=gen).float()
    a = torch.randn(k, generator=gen).bfloat16().float()
    words = pack_int4(codes.to(torch.uint8)).view(torch.int32)
    expected = ((codes - z.repeat_interleave(group, 1)) * s.repeat_interleave(group, 1)) @ a
    assert_close_to_scale(_emulated_int4_dot(words, a, s, z, group), expected, 1e-4)
    swapped = pack_int4(codes.view(n, -1, 8).flip(-1).reshape(n, k).to(torch.uint8)).view(torch.int32)
    with pytest.raises(AssertionError):
        assert_close_to_scale(_emulated_int4_dot(swapped, a, s, z, group), expected, 1e-4)


@pytest.mark.skipif(not gemv_w4_sm90.HAVE_GLUON, reason="this Triton has no Gluon")
@pytest.mark.parametrize("half2", [False, True], ids=["float32", "half2"])
def test_the_blocked_kernel_builds_for_sm90_with_fewer_instructions_a_block(half2: bool) -> None:
    """Four row blocks a program (K in one tile): no spills, and a block costs fewer instructions than a
    one-block program's whole build (its pointers, activations, factor and epilogue once a program); the sm90
    SASS, Triton 3.6: int4 half pairs 629 a block against 1,568, MXFP4 778 against 1,752."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    base = [sys.executable, "scripts/sass_loop_mix.py", "--gluon", "--fp4"] + (
        ["--half2", "--one-tile"] if half2 else []
    )
    counts = []
    for extra in ([], ["--blocks", "4"]):
        out = subprocess.run(base + extra, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "no spills" in out.stdout, out.stdout
        counts.append(
            (int(re.search(r"loop: (\d+)", out.stdout).group(1)), int(re.search(r"kernel: (\d+)", out.stdout).group(1)))
        )
    (_, one_block_total), (a_block, _) = counts
    assert a_block < 0.9 * one_block_total, counts


@pytest.mark.skipif(not gemv_w4_sm90.HAVE_GLUON, reason="this Triton has no Gluon")
@pytest.mark.parametrize("fp4, most", [(False, 5.0), (True, 6.0)], ids=["int4", "mxfp4"])
def test_sm90_sass_per_weight(fp4: bool, most: float) -> None:
    """Built for sm90 with Triton's bundled ptxas (a subprocess: this one runs the interpreter): the K
    loop stays under `most` instructions a weight at the H200's tilings (the portable kernel: 5.2 int4,
    6.2 MXFP4; int4 at 8 rows a thread would be 3.6, its H200 tiling of 4 rows with a prefetched tile
    is 4.7 and faster), no spills."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    args = [sys.executable, "scripts/sass_loop_mix.py", "--gluon"] + (["--fp4"] if fp4 else [])
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    per_weight = float(re.search(r"([0-9.]+) a weight", result.stdout).group(1))
    assert 2 < per_weight < most, result.stdout
    assert "no spills" in result.stdout
