"""SiLU-and-multiply, the gate of SwiGLU MLPs: out = silu(gate) * up with x = [gate | up].

Grid (row blocks, column blocks) over the output, so a wide intermediate size (14336 for an 8B
model) spreads over many programs on a GPU; the interpreter gets a handful of big tiles.
"""

from __future__ import annotations

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)

import torch
import triton
import triton.language as tl

from tritonllm.kernels.launch import DEFAULT_NUM_STAGES, Launcher, aligned, int_spec, pdl_wait
from tritonllm.kernels.quant import fused_scales, min_exponent, quantize_rows_and_store
from tritonllm.kernels.quant_formats import QuantizedActivation, qmax
from tritonllm.kernels.registry import FLOATS, Supports, register


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [num_rows, 2 * d]: gate in columns [0, d), up in [d, 2d); rows x_row_stride apart
    out_ptr,  # [num_rows, d] contiguous, x's dtype
    num_rows,
    d,
    x_row_stride,
    amax_ptr,  # AMAX: float32 [num_rows, column blocks]
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    AMAX: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """AMAX: also each row's amax over the program's columns (of the stored values), for a GEMM that
    quantizes the output per token itself (gemm_skinny_sm90's XQ mode); the sigmoid then divides as the
    fused quantizing kernel below does, so the two quantize to the same values."""
    pdl_wait(PDL)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < num_rows)[:, None] & (cols < d)[None, :]
    rows64 = rows.to(tl.int64)
    x_offs = (rows64 * x_row_stride)[:, None] + cols[None, :]
    gate = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + x_offs + d, mask=mask, other=0.0).to(tl.float32)
    if AMAX:
        out = (tl.fdiv(gate, 1.0 + tl.exp(-gate)) * up).to(out_ptr.dtype.element_ty)
        amax = tl.max(tl.where(mask, tl.abs(out.to(tl.float32)), 0.0), axis=1)
        tl.store(amax_ptr + rows64 * tl.num_programs(1) + tl.program_id(1), amax, mask=rows < num_rows)
    else:
        out = (gate / (1.0 + tl.exp(-gate)) * up).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + (rows64 * d)[:, None] + cols[None, :], out, mask=mask)


_SILU_AND_MUL = Launcher(_silu_and_mul_kernel)


@triton.jit
def _silu_and_mul_quant_kernel(
    x_ptr,  # [num_rows, 2 * d] as above
    q_ptr,  # [num_rows, d] contiguous, FP8 e4m3 or int8
    scale_ptr,  # float32 [num_rows] written (dynamic) or [1] read (STATIC)
    num_rows,
    d,
    x_row_stride,
    STATIC: tl.constexpr,
    QMAX: tl.constexpr,
    IS_INT: tl.constexpr,
    MIN_EXP: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    """silu(gate) * up, rounded to x's dtype as the unfused kernel stores it, then quantized per row
    (or per GROUP columns of a row) for the quantized down projection: a program holds BLOCK_ROWS
    whole rows (the row's amax), or, per GROUP columns, BLOCK_D columns of them (program_id 1: no program
    needs another's values, so a decode row spreads over many SMs). With whole rows at decode one program
    holds the row and its SM's instruction issue is the cost, so the sigmoid's division is the full-range
    fast one (2 ulp; the unfused kernel's IEEE division agrees after rounding to x's dtype but for ties) and
    quantization multiplies."""
    pdl_wait(PDL)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    if GROUP > 0:  # this program's first group's scales
        scale_ptr += tl.program_id(1) * (BLOCK_D // GROUP) * num_rows
    mask = (rows < num_rows)[:, None] & (cols < d)[None, :]
    rows64 = rows.to(tl.int64)
    x_offs = (rows64 * x_row_stride)[:, None] + cols[None, :]
    gate = tl.load(x_ptr + x_offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + x_offs + d, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    out = (tl.fdiv(g, 1.0 + tl.exp(-g)) * up.to(tl.float32)).to(gate.dtype).to(tl.float32)
    q_ptrs = q_ptr + (rows64 * d)[:, None] + cols[None, :]
    quantize_rows_and_store(out, q_ptrs, mask, scale_ptr, rows64, num_rows, STATIC, QMAX, IS_INT, MIN_EXP, GROUP)


_SILU_AND_MUL_QUANT = Launcher(_silu_and_mul_quant_kernel)
# columns a program of the quantizing kernel holds when it quantizes per group (a power of two, whole groups)
GROUP_COLUMNS = 1024


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
        key, grid, (x2, out, num_rows, d, row_stride, out), dict(BLOCK_ROWS=block_rows, BLOCK_D=block_d, AMAX=False),
        num_warps=num_warps, num_stages=DEFAULT_NUM_STAGES, device_index=device_index,
    )  # fmt: skip
    return out


def silu_and_mul_amax(x: torch.Tensor, block_d: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """silu_and_mul of x [num_rows, 2 * d] (unit column stride) and each row's amax over block_d-column
    blocks, float32 [num_rows, cdiv(d, block_d)]: what a GEMM quantizing its input per token itself needs
    (gemm_skinny_fused_sm90.xq_skinny_gemm_sm90; no registry entry: the triton_sm90 linear's silu_mul_linear calls
    it). block_d: a power of two."""
    num_rows, d = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_rows, d), dtype=x.dtype, device=x.device)
    block_d = min(block_d, triton.next_power_of_2(d))
    amax = torch.empty((num_rows, triton.cdiv(d, block_d)), dtype=torch.float32, device=x.device)
    if num_rows == 0:
        return out, amax
    row_stride = x.stride(0)
    key = (x.dtype, aligned(x, out), int_spec(num_rows), d, row_stride, "amax")
    _SILU_AND_MUL(
        key, (num_rows, amax.shape[1]), (x, out, num_rows, d, row_stride, amax),
        dict(BLOCK_ROWS=1, BLOCK_D=block_d, AMAX=True),
        num_warps=1 if platform.is_interpreter() else 4, num_stages=DEFAULT_NUM_STAGES, device_index=x.device.index or 0,
    )  # fmt: skip
    return out, amax


@register("activation", "triton")
def silu_and_mul_quant(
    x: torch.Tensor, quant_dtype: torch.dtype, static_scale: torch.Tensor | None = None, group: int = 0
) -> QuantizedActivation:
    """silu_and_mul quantized per row (or with static_scale, float32 [1]; or per `group` columns of a
    row, block-FP8's 1 x 128) in the same kernel, for the quantized down projection: [num_rows, d] in
    quant_dtype and float32 scales [num_rows, 1] (per group: [num_rows, d / group], column-major)."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dim ([gate | up]), got {x.shape[-1]}")
    d = x.shape[-1] // 2
    num_rows = x.numel() // (2 * d) if d else 0
    q = torch.empty((num_rows, d), dtype=quant_dtype, device=x.device)
    scale = fused_scales(num_rows, d, static_scale, group, x.device)
    if num_rows == 0:
        return QuantizedActivation(q, scale, x.dtype)
    x2 = x.reshape(num_rows, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    block_d = triton.next_power_of_2(d)  # whole rows: their amax sets their scale
    if group:  # whole groups: a program holds GROUP_COLUMNS of a row
        block_d = max(group, min(block_d, GROUP_COLUMNS))
    if platform.is_interpreter():
        block_rows, num_warps = min(triton.next_power_of_2(triton.cdiv(num_rows, 8)), max(1, 65536 // block_d)), 1
    else:
        block_rows, num_warps = max(1, 2048 // block_d), min(16, max(4, block_d // 1024))
    row_stride = x2.stride(0)
    constexprs = dict(
        STATIC=static_scale is not None, QMAX=qmax(quant_dtype), IS_INT=quant_dtype == torch.int8,
        MIN_EXP=min_exponent(quant_dtype), BLOCK_ROWS=block_rows, BLOCK_D=block_d, GROUP=group,
    )  # fmt: skip
    key = (x.dtype, quant_dtype, aligned(x2, q, scale), int_spec(num_rows), d, row_stride, group)
    _SILU_AND_MUL_QUANT(
        key, (triton.cdiv(num_rows, block_rows), triton.cdiv(d, block_d)), (x2, q, scale, num_rows, d, row_stride),
        constexprs,
        num_warps=num_warps, num_stages=DEFAULT_NUM_STAGES, device_index=x.device.index or 0,
    )  # fmt: skip
    return QuantizedActivation(q, scale, x.dtype)
