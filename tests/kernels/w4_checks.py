"""Checks shared by the Hopper 4-bit GEMM tests (test_gemm_w4_sm90.py, test_gemm_w4_tma_sm90.py): each
kernel's output against x @ dequant(w).T, its plans, and every int4 / e2m1 code decoded exactly."""

from __future__ import annotations

import pytest
import torch
from closeness import assert_close_to_scale  # this folder
from seeded import randn  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import launch, reference
from tritonllm.kernels.quant_formats import E2M1_VALUES, FP4, INT4, QuantizedWeight, QuantScheme, pack_int4
from tritonllm.quantization.quantize import quantize_weight

MXFP4 = QuantScheme(FP4, "mx", "none")


def int4_scheme(group: int) -> QuantScheme:
    return QuantScheme(INT4, "group", "none", group_size=group)


def w4_gemm(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None, mode: str = "always"):
    """gemm() on a 4-bit weight, the Hopper kernels allowed (`mode`: gemm's sm90)."""
    return g.gemm(x, weight.data, bias, b_scale=weight.scale, b_zero=weight.zeros, sm90=mode,
                  **g.scale_args(weight.scheme))  # fmt: skip


def check_against_dequantized(m: int, n: int, k: int, scheme: QuantScheme, dtype: torch.dtype, seed: int,
                              mode: str = "always") -> None:  # fmt: skip
    """x [m, k] @ w.T + bias against the float32 product with the dequantized weight."""
    x = randn(m, k, seed=seed, dtype=dtype)
    bias = randn(n, seed=seed + 1, dtype=dtype)
    weight = quantize_weight(randn(n, k, seed=seed + 2), scheme)
    expected = x.float() @ reference.dequantize_weight(weight).T + bias.float()
    assert_close_to_scale(w4_gemm(x, weight, bias, mode), expected, 1e-2)


def check_plan(m: int, n: int, seed: int, mode: str = "always") -> None:
    """One plan at K = 4,224 and 4,096 (uneven splits): close to the reference, the same bits on a second
    call (splits summed in order), the split counters back at zero."""
    for k in (4224, 4096):
        x = randn(m, k, seed=seed, dtype=torch.bfloat16)
        weight = quantize_weight(randn(n, k, seed=seed + 1), int4_scheme(128))
        first = w4_gemm(x, weight, mode=mode)
        assert_close_to_scale(first, x.float() @ reference.dequantize_weight(weight).T, 1e-2)
        assert torch.equal(w4_gemm(x, weight, mode=mode), first)
    assert not launch.arrival_counters(x.device).any(), "a tile's arrival counter was left non-zero"


def _one_hot_columns(weight: QuantizedWeight, mode: str) -> torch.Tensor:
    """The weight [N, 128] as the kernel decodes it, column by column (one-hot activations, 16 a call)."""
    eye = torch.eye(128, device=platform.DEVICE, dtype=torch.bfloat16)
    return torch.cat([w4_gemm(eye[i : i + 16], weight, mode=mode) for i in range(0, 128, 16)]).T.float().cpu()


def _codes(rows: int, seed: int) -> torch.Tensor:
    """Every 4-bit code eight times a row, in a shuffled column order (the kernels' column permutation)."""
    codes = torch.arange(16, dtype=torch.uint8).repeat(rows, 8)
    return codes[:, torch.randperm(128, generator=torch.Generator().manual_seed(seed))]


def check_every_int4_code(group: int, mode: str = "always") -> None:
    """Every int4 code under zero points 0 / 8 / 15 / 3 and power-of-two scales (one group of 32 scaled
    otherwise where groups are smaller than K): exact."""
    codes = _codes(16, 75)
    scale = torch.tensor([1.0, 0.5, 4.0, 2.0]).repeat(4)[:, None].repeat(1, 128 // group)
    zeros = torch.tensor([0.0, 8.0, 15.0, 3.0]).repeat_interleave(4)[:, None].repeat(1, 128 // group)
    scale[:, -1] *= 2
    int4 = QuantizedWeight(int4_scheme(group), pack_int4(codes).to(platform.DEVICE),
                           scale.bfloat16().to(platform.DEVICE), zeros=zeros.bfloat16().to(platform.DEVICE))  # fmt: skip
    per_col = lambda t: t.float().repeat_interleave(group, 1)  # noqa: E731
    expected = ((codes.float() - per_col(zeros)) * per_col(scale)).bfloat16().float()
    assert torch.equal(_one_hot_columns(int4, mode), expected)


def check_every_e2m1_code(mode: str = "always") -> None:
    """Every e2m1 code (the subnormal 0.5 too) under scales 2**-27 .. 2**23: exact."""
    codes = _codes(16, 83)
    exps = torch.tensor([[127, 120, 100, 150], [130, 127, 104, 140], [127, 126, 101, 127], [127] * 4] * 4,
                        dtype=torch.uint8)  # fmt: skip
    fp4 = QuantizedWeight(MXFP4, pack_int4(codes).to(platform.DEVICE), exps.to(platform.DEVICE))
    values = torch.tensor(E2M1_VALUES)[codes.long()] * torch.exp2(exps.float() - 127).repeat_interleave(32, 1)
    assert torch.equal(_one_hot_columns(fp4, mode), values.bfloat16().float())


def check_broken_mask_caught(module, monkeypatch, mode: str = "always") -> None:
    """Negative check: with the nibble mask `module` passes shifted, the output fails the same comparison."""
    weight = quantize_weight(randn(128, 1024, seed=76), int4_scheme(128))
    x = randn(16, 1024, seed=77, dtype=torch.bfloat16)
    expected = x.float() @ reference.dequantize_weight(weight).T
    assert_close_to_scale(w4_gemm(x, weight, mode=mode), expected, 1e-2)
    monkeypatch.setattr(module, "INT4_PAIR_MASK", 0x000E000F)
    with pytest.raises(AssertionError):
        assert_close_to_scale(w4_gemm(x, weight, mode=mode), expected, 1e-2)
