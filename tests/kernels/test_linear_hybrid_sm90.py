"""The `hybrid_sm90` linear (kernels/linear_hybrid_sm90.py): cuBLAS, with the skinny Gluon GEMM at M <= 4 on
Hopper. On the GPU its output matches the float32 product at gpt-oss's and Llama-3-8B's layer shapes, with and
without a bias, and the skinny kernel runs exactly where measured faster; elsewhere it is F.linear."""

from __future__ import annotations

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from seeded import randn  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm_skinny_sm90, linear_hybrid_sm90


def _operands(m: int, n: int, k: int, dtype: torch.dtype, seed: int) -> tuple:
    w = (randn(n, k, seed=seed + 1) * k**-0.5).to(dtype)  # outputs O(1)
    return randn(m, k, seed=seed, dtype=dtype), w, randn(n, seed=seed + 2, dtype=dtype)


def test_without_the_skinny_kernel_it_is_f_linear() -> None:
    x, w, b = _operands(3, 40, 48, platform.DEFAULT_DTYPE, seed=0)
    if gemm_skinny_sm90.available():
        pytest.skip("an sm90 GPU: the skinny kernel runs here (test_matches_the_float32_product_on_hopper)")
    assert torch.equal(linear_hybrid_sm90.linear(x, w, b), torch.nn.functional.linear(x, w, b))


@pytest.mark.gpu
@pytest.mark.skipif(not (platform.is_gpu() and gemm_skinny_sm90.available()), reason="an sm90 GPU")
@pytest.mark.parametrize("n, k", [(5120, 2880), (2880, 4096), (28672, 4096)])  # gpt-oss qkv / o, Llama gate_up
@pytest.mark.parametrize("m", [1, 3, 4, 5, 64])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_matches_the_float32_product_on_hopper(m, n, k, bias, monkeypatch) -> None:
    launches = []
    skinny = gemm_skinny_sm90.skinny_gemm_sm90
    monkeypatch.setattr(gemm_skinny_sm90, "skinny_gemm_sm90", lambda *a, **kw: launches.append(1) or skinny(*a, **kw))
    x, w, b = _operands(m, n, k, torch.bfloat16, seed=m + n)
    b = b if bias else None
    got = linear_hybrid_sm90.linear(x, w, b)
    expected = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    assert_close_to_scale(got, expected, 2e-2)
    assert bool(launches) == (m <= 4), "the skinny kernel runs at M <= 4 only"
