"""The Hopper 4-bit GEMV fed by a TMA ring (kernels/gemv_w4_tma_sm90.py) against x @ dequant(w).T and against the
register-fed GEMV, its persistent walk over row blocks, what TMA can read, and its sm90 build. The kernel needs
an sm90 GPU (no interpreter runs Gluon): its numerics are GPU tests; on the CPU it must build for sm90 without
spills and stay out of gemm()'s way."""

from __future__ import annotations

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn as _randn  # this folder
from sm90_build import sm90_build_report  # this folder
from w4_schemes import SCHEMES, scheme_id  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import gemm_w4_tma_sm90, gemv_w4_tma_sm90, reference
from tritonllm.kernels.quant_formats import QuantizedWeight
from tritonllm.quantization.quantize import quantize_weight

tma = gemv_w4_tma_sm90
needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and tma.available()), reason="the TMA W4 GEMV runs on sm90 GPUs only"
)


@pytest.fixture
def spy(monkeypatch) -> LaunchSpy:
    """The TMA GEMV switched on (opt-in) and its launches counted; the 4-bit TMA GEMM out of the way."""
    monkeypatch.setattr(tma, "ENABLED", True)
    monkeypatch.setattr(gemm_w4_tma_sm90, "FORCE", "never")
    return LaunchSpy.install(monkeypatch, tma, "w4_gemv_tma_sm90_kernel")


def _gemv(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    return g.gemm(x, weight.data, bias, b_scale=weight.scale, b_zero=weight.zeros, sm90="always",
                  **g.scale_args(weight.scheme))  # fmt: skip


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@pytest.mark.parametrize("n, k", [(45, 1024), (130, 4096), (77, 3072), (1000, 14336)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_the_dequantized_weight_and_the_register_fed_gemv(scheme, n, k, with_bias, spy, monkeypatch) -> None:
    """Ragged N (the last row block's rows past N arrive as TMA's zeros, their sums masked), K in one, one and a
    half (3,072: a half-empty last step) and seven steps, every group size, the bias; the register-fed kernel's
    result beside it (the same decode, K summed in another order)."""
    x = _randn(1, k, seed=70, dtype=torch.bfloat16)
    bias = _randn(n, seed=71, dtype=torch.bfloat16) if with_bias else None
    weight = quantize_weight(_randn(n, k, seed=72), scheme)
    got = _gemv(x, weight, bias)
    assert spy.launches == 1, "the TMA GEMV did not run"
    expected = x.float() @ reference.dequantize_weight(weight).T + (bias.float() if with_bias else 0)
    assert_close_to_scale(got, expected, 1e-2)
    monkeypatch.setattr(tma, "ENABLED", False)
    assert_close_to_scale(_gemv(x, weight, bias), got.float(), 1e-2)
    assert spy.launches == 1


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("plan", ["2:1", "3:1", "4:2", "6:1"])
@pytest.mark.parametrize("scheme", SCHEMES[2:], ids=scheme_id)
def test_programs_walk_several_row_blocks(plan, scheme, spy, monkeypatch) -> None:
    """Fewer programs than row blocks (one or two an SM): each walks blocks pid, pid + G, ... through the ring,
    whose stages are refilled across row blocks; two to six stages; a ragged last block."""
    monkeypatch.setattr(tma, "PLAN", tma.Plan.parse(plan))
    n = tma.BLOCK_N * platform.num_multiprocessors() * 3 + 5
    x = _randn(1, 4096, seed=73, dtype=torch.bfloat16)
    weight = quantize_weight(_randn(n, 4096, seed=74), scheme)
    assert_close_to_scale(_gemv(x, weight), x.float() @ reference.dequantize_weight(weight).T, 1e-2)
    assert spy.launches == 1 and spy.grids[0][0] < -(-n // tma.BLOCK_N)


@pytest.mark.gpu
@needs_sm90
def test_a_wrong_scale_is_caught(spy) -> None:
    """The comparison can fail: the kernel given a weight whose second group's scales are doubled misses the
    reference of the true weight."""
    x = _randn(1, 4096, seed=75, dtype=torch.bfloat16)
    weight = quantize_weight(_randn(256, 4096, seed=76), SCHEMES[2])
    expected = x.float() @ reference.dequantize_weight(weight).T
    wrong = weight.scale.clone()
    wrong[:, 1] *= 2
    got = g.gemm(x, weight.data, None, b_scale=wrong, b_zero=weight.zeros, sm90="always", **g.scale_args(weight.scheme))
    assert spy.launches == 1
    with pytest.raises(AssertionError, match="max error"):
        assert_close_to_scale(got, expected, 1e-2)


def test_takes_only_rows_that_tma_reads() -> None:
    """TMA's 16-byte rows: int4 scales of 128-column groups need K a multiple of 1,024 (K = 640: 10-byte rows),
    MXFP4's e8m0 bytes K a multiple of 512; the word view's rows (K / 2 bytes) and a sliced, strided weight. Off
    by default, and nowhere without an sm90 GPU."""
    bf16 = torch.bfloat16
    assert tma._rows_aligned(torch.zeros(8, 32, dtype=bf16)) and not tma._rows_aligned(torch.zeros(8, 5, dtype=bf16))
    assert tma._rows_aligned(torch.zeros(8, 16, dtype=torch.uint8))
    assert not tma._rows_aligned(torch.zeros(8, 90, dtype=torch.uint8))  # gpt-oss's K = 2,880 in MXFP4
    assert not tma._rows_aligned(torch.zeros(8, 64, dtype=torch.int32)[:, 1:])  # base off 16 bytes
    assert not tma._rows_aligned(torch.zeros(64, 8, dtype=torch.int32).t())
    assert tma.steps_of(4096) == 2 and tma.steps_of(3072) == 2 and tma.steps_of(14336) == 7
    assert tma.Plan.parse("4:2") == tma.Plan(4, 2)
    if not (platform.is_gpu() and tma.available()):
        weight = quantize_weight(_randn(32, 1024, seed=77), SCHEMES[2])
        x = _randn(1, 1024, seed=78, dtype=platform.DEFAULT_DTYPE)
        assert not tma.takes(x, weight.data.view(torch.int32), weight.scale, weight.zeros, 128, False)


_BUILD = """
import json, sys
sys.path.insert(0, "scripts")
from cross_compile_attention import registers
from tritonllm.kernels import gemv_w4_tma_sm90 as t
report = {}
for name, fp4, group, k in (("int4-g128", False, 128, 4096), ("int4-g32", False, 32, 14336), ("mxfp4", True, 32, 4096),
                            ("mxfp4-long", True, 32, 14336)):
    kernel = t.compile_sm90(fp4=fp4, group_k=group, k=k)
    ptx = kernel.asm["ptx"]
    report[name] = [".local" in ptx, "cp.async.bulk.tensor" in ptx, "griddepcontrol.wait" in ptx, registers(kernel),
                    kernel.metadata.shared]
print(json.dumps(report))
"""


@pytest.mark.skipif(not tma.HAVE_GLUON, reason="this Triton has no Gluon")
def test_builds_for_sm90_without_spills() -> None:
    """int4 (groups of 128 and 32) and MXFP4 at two and seven K steps, the default plan (two stages): TMA copies
    and the PDL wait in the PTX, no local memory, and registers and shared memory that leave room for the plan's
    four programs an SM at K = 4,096 (Triton 3.6: 72-84 registers; 3.9: 64-72; 43 KB)."""
    report = sm90_build_report(_BUILD)
    for name, (spills, tma_copies, pdl, regs, shared) in report.items():
        assert not spills and tma_copies and pdl, (name, report)
        assert regs <= 128, (name, regs)  # 65,536 registers / (4 programs x 128 threads)
        if not name.endswith("long") and name != "int4-g32":
            assert shared <= 56 * 1024, (name, shared)  # 228 KB / 4, less the per-program reserve
