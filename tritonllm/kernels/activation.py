"""SiLU-and-multiply, the gate of SwiGLU MLPs: out = silu(gate) * up with x = [gate | up].

Grid (row blocks, column blocks) over the output, so a wide intermediate size (14336 for an 8B
model) spreads over many programs on a GPU; the interpreter gets a handful of big tiles.
"""

from __future__ import annotations

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)

import torch
import triton
import triton.language as tl

from tritonllm.kernels.launch import DEFAULT_NUM_STAGES, Launcher, aligned, int_spec
from tritonllm.kernels.registry import FLOATS, Supports, register


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [num_rows, 2 * d]: gate in columns [0, d), up in [d, 2d); rows x_row_stride apart
    out_ptr,  # [num_rows, d] contiguous, x's dtype
    num_rows,
    d,
    x_row_stride,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < num_rows)[:, None] & (cols < d)[None, :]
    rows64 = rows.to(tl.int64)
    x_offs = (rows64 * x_row_stride)[:, None] + cols[None, :]
    gate = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + x_offs + d, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + (rows64 * d)[:, None] + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


_SILU_AND_MUL = Launcher(_silu_and_mul_kernel)


@register("activation", "triton", supports=Supports(dtypes=FLOATS), priority=10)
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2 * d] = [gate | up] (rows may be strided) -> silu(gate) * up, [..., d] in x's dtype."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dim ([gate | up]), got {x.shape[-1]}")
    d = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    num_rows = out.numel() // d if d else 0
    if num_rows == 0:
        return out
    x2 = x.reshape(num_rows, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if platform.is_interpreter():
        block_d = triton.next_power_of_2(d)
        block_rows = min(triton.next_power_of_2(triton.cdiv(num_rows, 8)), max(1, 65536 // block_d))
        num_warps = 1
    else:
        block_d = min(triton.next_power_of_2(d), 1024)
        block_rows = max(1, 1024 // block_d)
        num_warps = 4
    grid = (triton.cdiv(num_rows, block_rows), triton.cdiv(d, block_d))
    row_stride = x2.stride(0)
    device_index = x.device.index or 0
    # out has x's dtype; d and the row stride are fixed by the model: raw values
    key = (x.dtype, aligned(x2, out), int_spec(num_rows), d, row_stride)
    _SILU_AND_MUL(
        key, grid, (x2, out, num_rows, d, row_stride), dict(BLOCK_ROWS=block_rows, BLOCK_D=block_d),
        num_warps=num_warps, num_stages=DEFAULT_NUM_STAGES, device_index=device_index,
    )  # fmt: skip
    return out
