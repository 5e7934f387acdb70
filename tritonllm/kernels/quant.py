"""Activation quantization before a quantized GEMM (kernels/quant_formats.py names the schemes).

x [M, K] (model dtype, last dim contiguous) -> (q [M, K] in FP8 e4m3 or int8, scales):
- per token, dynamic: scale[m] = max(amax(x[m, :]), EPS) / qmax, float32 [M, 1];
- per tensor, static: the checkpoint's input_scale (float32 [1]), given;
- per 1 x G group (G = 128 for block-FP8 weights), dynamic: float32 [M, K / G];
- MX (G = 32): scale = 2 ** (floor(log2(amax)) - 8) (e4m3's largest exponent is 8), stored as
  e8m0 uint8 [M, K / 32] (e = exponent + 127), as the OCP MX spec defines it.
Values are x times the scale's reciprocal (x / scale but for float32 ties; MX's powers of two divide,
exactly), in this module's kernels and the fused quantizations (quantize_rows_and_store) alike, clamped to
+-qmax, then rounded: to nearest even for FP8 (the conversion: explicit on the interpreter, the hardware's on
FP8 GPUs), half away from zero for int8. `kernels/reference.py` computes the same in torch (dividing).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tritonllm import platform  # noqa: F401  (switches on the interpreter on CPU first)
from tritonllm.kernels.launch import pdl_launch, pdl_wait
from tritonllm.kernels.quant_formats import MX_GROUP, OutputQuant, QuantizedActivation, qmax

# NVIDIA FP8 GPUs (sm89+; FP8 activations are made nowhere else: platform.has_fp8) convert float32 to
# e4m3 in hardware, rounding to nearest even with saturation (cvt.rn.satfinite): the same values as the
# explicit grid rounding below, which the interpreter needs (it rounds some values wrongly) and which
# costs ~20 instructions a value, most of a one-row quantization (a decode step's SiLU-mul + quantize of
# 14,336 values runs on one SM)
HW_FP8_CVT = tl.constexpr(platform.PLATFORM == "cuda" and not platform.is_interpreter())
EPS = 1e-12  # an all-zero row quantizes to zeros with a tiny (not zero) scale (the kernels' literal)
E4M3_EMAX = 8  # floor(log2(448)): MX scales put a group's amax into e4m3's top binade (the kernels' "- 8")


@triton.jit
def _round_half_even(x):
    f = tl.floor(x)
    d = x - f
    odd = f - 2.0 * tl.floor(f * 0.5)
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, f + odd))


@triton.jit
def round_and_store(q_ptrs, v, mask, QMAX: tl.constexpr, IS_INT: tl.constexpr, MIN_EXP: tl.constexpr):
    """Clamp to +-QMAX and round onto the target's grid before converting, so the conversion is
    exact: Triton's interpreter rounds some values wrongly (7.9 -> 4.0 in e4m3: the mantissa carry
    is lost), and the same arithmetic on every platform keeps CPU tests and GPUs in step. e4m3
    keeps 3 mantissa bits; MIN_EXP is its smallest normal exponent (-6 e4m3fn, -7 e4m3fnuz)."""
    v = tl.minimum(tl.maximum(v, -QMAX), QMAX)
    if IS_INT:
        v = tl.where(v >= 0, tl.floor(v + 0.5), tl.ceil(v - 0.5))
    elif not HW_FP8_CVT:
        v = fp8_grid(v, MIN_EXP)
    tl.store(q_ptrs, v.to(q_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def fp8_grid(v, MIN_EXP: tl.constexpr):
    """v (within +-QMAX) rounded to nearest even onto e4m3's grid (3 mantissa bits; below 2**MIN_EXP the
    subnormals' fixed step), so that its conversion is exact."""
    exponent = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step = tl.exp2((tl.maximum(exponent, MIN_EXP) - 3).to(tl.float32))
    r = _round_half_even(v / step) * step
    return tl.where(r == 0, v * 0.0, r)  # a negative value rounded to zero stays -0 (as the hardware rounds)


@triton.jit
def quantize_rows_and_store(
    out, q_ptrs, mask, scale_ptr, rows, num_rows,
    STATIC: tl.constexpr, QMAX: tl.constexpr, IS_INT: tl.constexpr, MIN_EXP: tl.constexpr, GROUP: tl.constexpr = 0,
):  # fmt: skip
    """The epilogue of an op that quantizes its own output for a W8A8 GEMM (RMSNorm, SiLU-mul): out
    [BLOCK_ROWS, cols] float32 holds whole rows; each row's scale is its amax / QMAX (stored at
    scale_ptr + row), or the STATIC scale read from scale_ptr. GROUP > 0: one scale per GROUP columns
    of a row (block-FP8's 1 x 128 groups; cols a multiple of GROUP), stored column-major as
    quantize_per_group lays them out (scale_ptr + group * num_rows + row). Values are multiplied by the
    scale's reciprocal, not divided by the scale: a decode step quantizes a whole 14,336-wide row on one
    SM, bound by its instruction issue, and an IEEE division is ~10 instructions a value. The two differ
    only where x / scale lies within a float32 ulp of an FP8 rounding boundary."""
    if GROUP > 0:
        R: tl.constexpr = out.shape[0]
        G: tl.constexpr = out.shape[1] // GROUP
        grouped = tl.reshape(out, (R, G, GROUP))
        scale = tl.maximum(tl.max(tl.abs(grouped), axis=2), 1e-12) / QMAX  # [R, G]
        in_group = tl.max(tl.reshape(mask, (R, G, GROUP)).to(tl.int32), axis=2) > 0
        groups = tl.arange(0, G)
        tl.store(scale_ptr + groups[None, :] * num_rows + rows[:, None], scale, mask=in_group)
        q = tl.reshape(grouped * (1.0 / scale)[:, :, None], (R, G * GROUP))
        round_and_store(q_ptrs, q, mask, QMAX, IS_INT, MIN_EXP)
    else:
        if STATIC:
            scale = tl.load(scale_ptr) + tl.zeros([out.shape[0]], dtype=tl.float32)
        else:
            scale = tl.maximum(tl.max(tl.abs(out), axis=1), 1e-12) / QMAX
            tl.store(scale_ptr + rows, scale, mask=rows < num_rows)
        round_and_store(q_ptrs, out * (1.0 / scale)[:, None], mask, QMAX, IS_INT, MIN_EXP)


def fused_scales(num_rows: int, cols: int, static_scale: torch.Tensor | None, group: int, device) -> torch.Tensor:
    """The scale tensor an op that quantizes its own output fills (quantize_rows_and_store): static_scale
    itself, float32 [num_rows, 1] per row, or with group > 0 float32 [num_rows, cdiv(cols, group)]
    column-major (quantize_per_group's layout)."""
    if static_scale is not None:
        return static_scale
    if group:
        return torch.empty((triton.cdiv(cols, group), num_rows), dtype=torch.float32, device=device).t()
    return torch.empty((num_rows, 1), dtype=torch.float32, device=device)


@triton.jit
def _quant_token_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_x, stride_q,
    QMAX: tl.constexpr, IS_INT: tl.constexpr, MIN_EXP: tl.constexpr, STATIC: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """One program per row: its amax (unless STATIC: s_ptr holds the scale), then the values, multiplied by
    the scale's reciprocal as the fused quantizations do (quantize_rows_and_store), so an unfused op and its
    fused form give the same bytes."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    if STATIC:
        scale = tl.load(s_ptr)
    else:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for k in range(0, K, BLOCK):
            x = tl.load(x_ptr + row * stride_x + k + offs, mask=k + offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / QMAX
        tl.store(s_ptr + row, scale)
    inverse = 1.0 / scale
    for k in range(0, K, BLOCK):
        mask = k + offs < K
        x = tl.load(x_ptr + row * stride_x + k + offs, mask=mask, other=0.0).to(tl.float32)
        round_and_store(q_ptr + row * stride_q + k + offs, x * inverse, mask, QMAX, IS_INT, MIN_EXP)


@triton.jit
def _quant_group_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s, stride_sg,
    QMAX: tl.constexpr, IS_INT: tl.constexpr, MIN_EXP: tl.constexpr, MX: tl.constexpr, GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program (row, j) quantizes GROUPS consecutive groups of GROUP columns of one row (multiplied by each
    scale's reciprocal, as the fused quantizations do; MX's powers of two divide, exactly)."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    g0 = tl.program_id(1) * GROUPS
    cols = (g0 + tl.arange(0, GROUPS))[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = cols < K
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)  # [GROUPS]
    groups = g0 + tl.arange(0, GROUPS)
    in_row = groups * GROUP < K
    if MX:
        # floor(log2(amax)) from the float32 exponent bits (amax 0 -> the smallest scale, 2**-127)
        exponent = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        exponent = tl.minimum(tl.maximum(exponent - 8, -127), 127)
        scale = tl.exp2(exponent.to(tl.float32))
        tl.store(s_ptr + row * stride_s + groups * stride_sg, (exponent + 127).to(tl.uint8), mask=in_row)
        q = x / scale[:, None]  # a power of two: exact either way
    else:
        scale = tl.maximum(amax, 1e-12) / QMAX
        tl.store(s_ptr + row * stride_s + groups * stride_sg, scale, mask=in_row)
        q = x * (1.0 / scale)[:, None]
    round_and_store(q_ptr + row * stride_q + cols, q, mask, QMAX, IS_INT, MIN_EXP)


def min_exponent(dtype: torch.dtype) -> int:
    """The smallest normal exponent of an FP8 type (e4m3fn -6, e4m3fnuz -7); 0 for int8 (unused)."""
    return 0 if dtype == torch.int8 else round(math.log2(torch.finfo(dtype).smallest_normal))


def _check(x: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(
            f"activations must be 2-D with contiguous rows, got shape {tuple(x.shape)} strides {x.stride()}"
        )


def quantize_per_token(
    x: torch.Tensor, dtype: torch.dtype, static_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] dtype, scale float32 [M, 1]); with static_scale (float32 [1]) every row
    uses it and the returned scale is static_scale itself."""
    _check(x)
    m, k = x.shape
    q = torch.empty((m, k), dtype=dtype, device=x.device)
    scale = static_scale if static_scale is not None else torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block = min(triton.next_power_of_2(k), 4096 if platform.is_gpu() else 256)
        _quant_token_kernel[(m,)](
            x, q, scale, k, x.stride(0), q.stride(0),
            QMAX=qmax(dtype), IS_INT=dtype == torch.int8, MIN_EXP=min_exponent(dtype), STATIC=static_scale is not None, BLOCK=block,
            num_warps=4 if block <= 1024 else 8, **pdl_launch(),
        )  # fmt: skip
    return q, scale


def quantize_rows(x: torch.Tensor, quant: OutputQuant) -> QuantizedActivation:
    """x [M, K] quantized as an op that fuses it would (quantize_rows_and_store): per token, with
    quant's static scale, or per quant.group columns."""
    if quant.group:
        q, scale = quantize_per_group(x, quant.dtype, quant.group)
    else:
        q, scale = quantize_per_token(x, quant.dtype, quant.static_scale)
    return QuantizedActivation(q, scale, x.dtype)


def quantize_per_group(
    x: torch.Tensor, dtype: torch.dtype, group: int, mx: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] dtype, scale [M, cdiv(K, group)]: float32, or e8m0 uint8 with mx). Float32
    scales are column-major (a [groups, M] buffer seen as [M, groups]), as DeepGEMM lays them out: the
    block-FP8 GEMM reads one K group's scales for BLOCK_M consecutive rows per K tile, one coalesced load."""
    _check(x)
    m, k = x.shape
    if mx and group != MX_GROUP:
        raise ValueError(f"MX scales cover {MX_GROUP} elements, not {group}")
    num_groups = triton.cdiv(k, group)
    q = torch.empty((m, k), dtype=dtype, device=x.device)
    if mx:
        scale = torch.empty((m, num_groups), dtype=torch.uint8, device=x.device)
    else:
        scale = torch.empty((num_groups, m), dtype=torch.float32, device=x.device).t()
    # the interpreter's cost is per program: 256 columns a program there (still several programs a row in
    # the kernel tests' wide rows), 1024 on a GPU
    groups_per_program = max(1, min(triton.next_power_of_2(num_groups), (1024 if platform.is_gpu() else 256) // group))
    if m:
        grid = (m, triton.cdiv(num_groups, groups_per_program))
        _quant_group_kernel[grid](
            x, q, scale, k, x.stride(0), q.stride(0), scale.stride(0), scale.stride(1),
            QMAX=qmax(dtype), IS_INT=dtype == torch.int8, MIN_EXP=min_exponent(dtype), MX=mx, GROUP=group, GROUPS=groups_per_program,
            **pdl_launch(),
        )  # fmt: skip
    return q, scale
