"""The stream-K skinny GEMM (Gluon, kernels/gemm_stream_sm90.py) against float32 references of its operands:
bf16 and FP8 W8A8 with scales, bias and ADD_C, programs that share a tile (its partials summed by the last to
arrive) and tiles wholly in one program's run. Its numerics need an sm90 GPU; on the CPU the split of the
work is checked by brute force and the kernel must compile for sm90 without spills."""

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
from tritonllm.kernels import gemm_skinny_sm90 as sk
from tritonllm.kernels import gemm_stream_sm90 as st
from tritonllm.kernels import launch

needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and sk.available()), reason="the Gluon stream-K GEMM runs on sm90 GPUs only"
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spy(monkeypatch) -> LaunchSpy:
    return LaunchSpy.install(monkeypatch, st, "stream_gemm_sm90_kernel")


def _product(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, seed: int):
    """(the GEMM's output through gemm(), the float32 reference) for seeded operands."""
    b = randn(n, seed=seed + 2, dtype=torch.bfloat16) if bias else None
    if dtype == torch.bfloat16:
        x, w = randn(m, k, seed=seed, dtype=dtype), randn(n, k, seed=seed + 1, dtype=dtype)
        want = x.float() @ w.float().T + (b.float() if bias else 0)
        return g.gemm(x, w, bias=b, sm90="always"), want
    q, scale, weight, product = fp8_operands(m, n, k, seed)
    want = product + (b.float() if bias else 0)
    args = dict(out_dtype=torch.bfloat16, a_scale=scale, sm90="always", **g.scale_args(FP8), b_scale=weight.scale)
    return g.gemm(q, weight.data, bias=b, **args), want


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("plan", ["128:1:12:4:1", "64:1:6:4:2", "128:1:4:8:1", "64:1:3:4:1"])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
@pytest.mark.parametrize("n, k", [(200, 1008), (1000, 4160), (28672, 4096), (4096, 14336)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_stream_plans_match_float32(plan, m, n, k, dtype, monkeypatch, spy) -> None:
    """Ragged N (a partial last tile) and K (a partial last K step, TMA's zeros), few tiles (many programs a
    tile) and many (runs across several tiles), with the bias; the same bits on a second call (partials summed
    in program order) and the counters back at zero."""
    p = sk.Plan.parse(plan)
    if m > 16 and p.stages > 6:
        p = sk.Plan(p.block_n, 1, 6, p.warps, p.stream)  # shared memory: 64 activation rows a stage
    monkeypatch.setattr(sk, "PLAN_OVERRIDE", p)
    first, want = _product(m, n, k, dtype, bias=True, seed=150)
    again, _ = _product(m, n, k, dtype, bias=True, seed=150)
    assert_close_to_scale(first, want, 1e-2)
    assert torch.equal(again, first)
    assert spy.launches == 2
    assert not launch.arrival_counters(platform.DEVICE).any(), "a tile's arrival counter was left non-zero"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("n, k", [(4096, 4096), (200, 1008)])
def test_add_c_adds_the_rounded_product_into_c(n, k, monkeypatch) -> None:
    """ADD_C: c + the product rounded to bf16, then rounded, as the GEMM followed by the add."""
    monkeypatch.setattr(sk, "PLAN_OVERRIDE", sk.Plan(128, 1, 12, 4, 1))
    x, w = randn(3, k, seed=160, dtype=torch.bfloat16), randn(n, k, seed=161, dtype=torch.bfloat16)
    residual = 4 * randn(3, n, seed=162, dtype=torch.bfloat16)
    want = (residual.float() + g.gemm(x, w, sm90="always").float()).to(torch.bfloat16)
    c = residual.clone()
    assert sk.skinny_gemm_sm90(x, w, c, None, None, None, launch.pdl_launch(), add_c=True) is c
    assert torch.equal(c, want) and not torch.equal(want, residual)


@pytest.mark.gpu
@needs_sm90
def test_a_lost_partial_is_caught(monkeypatch) -> None:
    """Negative check: with the first tile's arrival counter set past its runs (so no run takes the tile's sum)
    that tile of c keeps its NaNs and the output fails the same comparison; the other tiles are the product."""
    monkeypatch.setattr(sk, "PLAN_OVERRIDE", sk.Plan(128, 1, 6, 4, 1))
    x, w = randn(4, 4160, seed=170, dtype=torch.bfloat16), randn(1000, 4160, seed=171, dtype=torch.bfloat16)
    want = x.float() @ w.float().T
    counters = launch.arrival_counters(platform.DEVICE)
    counters[0] = 1000
    try:
        c = torch.full((4, 1000), float("nan"), dtype=torch.bfloat16, device=x.device)
        sk.skinny_gemm_sm90(x, w, c, None, None, None, launch.pdl_launch())
        assert c[:, :128].isnan().all()
        assert_close_to_scale(c[:, 128:], want[:, 128:], 1e-2)
        with pytest.raises(AssertionError):
            assert_close_to_scale(c, want, 1e-2)
    finally:
        counters.zero_()


@pytest.mark.parametrize("n, k, block_n, programs", [(28672, 4096, 128, 132), (4096, 4096, 128, 264),
                                                     (200, 1000, 64, 132), (128256, 4096, 128, 132),
                                                     (4096, 14336, 64, 132), (1000, 4160, 128, 5)])  # fmt: skip
def test_runs_bound_the_programs_that_share_a_tile(n, k, block_n, programs) -> None:
    """runs() (the partials' workspace depth and the kernel's MAX_PARTS) is at least the number of runs that
    hold pairs of any one tile, as the kernel cuts them (program p from p x total // programs), and the
    kernel's owner formula names each pair's run."""
    got_programs, parts = st.runs(1, n, k, block_n, 64, programs)
    steps = -(-k // 64)
    total = -(-n // block_n) * steps
    starts = [p * total // got_programs for p in range(got_programs + 1)]
    owner = [p for p in range(got_programs) for _ in range(starts[p], starts[p + 1])]
    assert len(owner) == total and all(owner[pair] == ((pair + 1) * got_programs - 1) // total for pair in range(total))
    most = max(owner[(t + 1) * steps - 1] - owner[t * steps] + 1 for t in range(total // steps))
    assert most <= parts and got_programs == min(programs, total)


def test_plan_takes_a_stream_field() -> None:
    assert sk.Plan.parse("128:1:12:4:1") == sk.Plan(128, 1, 12, 4, 1)
    assert sk.Plan.parse("64:2:8").stream == 0


_COMPILE = """
import torch
from tritonllm.kernels import gemm_stream_sm90 as st
for dtype, scales in ((torch.bfloat16, False), (torch.float8_e4m3fn, True)):
    kernel = st.compile_sm90(dtype, bm=16, stages=12, scales=scales)
    ptx = kernel.asm["ptx"]
    print(dtype, "cp.async.bulk.tensor" in ptx, "wgmma.mma_async" in ptx, "atom.global.gpu.acq_rel.add" in ptx,
          ".local" in ptx, kernel.metadata.shared <= 232448)
"""


@pytest.mark.skipif(not sk.HAVE_GLUON, reason="this Triton has no Gluon")
def test_compiles_for_sm90_without_spills() -> None:
    """The kernel compiles for sm90 (a subprocess: this one runs the interpreter) with TMA copies, the
    asynchronous warpgroup MMA and the tiles' arrival counters, no local memory, within sm90's shared memory."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split("\n")[:2]
    assert lines == ["torch.bfloat16 True True True False True", "torch.float8_e4m3fn True True True False True"]
