"""SiLU-and-multiply kernel against the torch reference at ragged, non-power-of-two shapes."""

from __future__ import annotations

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)

from tritonllm import platform
from tritonllm.kernels import reference
from tritonllm.kernels.activation import silu_and_mul

TOLERANCES = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _check(x: torch.Tensor) -> None:
    out = silu_and_mul(x)
    expected = reference.silu_and_mul(x)
    tol = TOLERANCES[x.dtype]
    assert out.shape == expected.shape and out.dtype == expected.dtype
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 22), (37, 600), (5, 7, 192), (130, 2 * 1000)])
def test_silu_and_mul_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(shape[0])
    _check((4 * torch.randn(shape, generator=gen)).to(dtype))


def test_silu_and_mul_of_strided_rows_matches_reference() -> None:
    wide = 4 * torch.randn(23, 700, generator=torch.Generator().manual_seed(1))
    _check(wide[:, 50:650])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # exp(-gate) -> inf is the path under test
def test_silu_and_mul_saturates_without_nan() -> None:
    gate = torch.tensor([[-200.0, -90.0, 0.5, 90.0, 200.0]])
    x = torch.cat([gate, torch.full_like(gate, 3.0)], dim=-1)
    out = silu_and_mul(x)
    assert torch.isfinite(out).all()
    _check(x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("shape", [(1, 2 * 14336), (1000, 2 * 14336), (4097, 2 * 11008), (3, 2 * 1000)])
def test_silu_and_mul_bfloat16_on_gpu(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(shape[0])
    _check((4 * torch.randn(shape, generator=gen)).to("cuda", torch.bfloat16))


@pytest.mark.parametrize("rows, d, block_d", [(1, 200, 64), (3, 1000, 256), (5, 96, 128)])
def test_silu_and_mul_amax_gives_the_rows_block_amaxes(rows: int, d: int, block_d: int) -> None:
    """silu_and_mul_amax (the XQ down projection's SiLU-mul): the SiLU-mul's values and each row's amax over
    block_d-column blocks (a ragged last block); quantizing with the max of those amaxes gives what
    silu_and_mul_quant gives."""
    from tritonllm.kernels.activation import silu_and_mul_amax, silu_and_mul_quant
    from tritonllm.kernels.quant_formats import qmax

    x = (3 * torch.randn(rows, 2 * d, generator=torch.Generator().manual_seed(rows + d))).to(
        platform.DEVICE, torch.float16
    )
    h, amax = silu_and_mul_amax(x, block_d)
    assert_close_to_scale(h, reference.silu_and_mul(x), 2e-3)
    blocks = -(-d // block_d)
    assert amax.shape == (rows, blocks)
    padded = torch.nn.functional.pad(h.float().abs(), (0, blocks * block_d - d))
    assert torch.equal(amax, padded.view(rows, blocks, block_d).amax(-1)), "block amaxes differ from h's"
    want = silu_and_mul_quant(x, torch.float8_e4m3fn)
    scale = amax.amax(-1, keepdim=True).clamp_min(1e-12) / qmax(torch.float8_e4m3fn)
    assert torch.equal(scale, want.scale), "the scales from the block amaxes differ from silu_and_mul_quant's"
