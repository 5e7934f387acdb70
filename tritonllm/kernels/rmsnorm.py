"""RMSNorm, optionally fused with the residual add that precedes it in every decoder layer.

A program normalizes BLOCK_ROWS rows; the whole hidden vector of a row is one tile (hidden sizes
of LLMs fit in registers), masked to the real hidden size. Rows are addressed through two strides
so that Qwen3's per-head q/k norm reads q straight out of the fused qkv projection: row r lives at
(r // inner_rows) * outer_stride + (r % inner_rows) * inner_stride.
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
def _rms_norm_kernel(
    x_ptr,  # rows of x: [outer, inner_rows, hidden] with strides (x_outer_stride, x_inner_stride, 1)
    residual_ptr,  # same layout as x with its own strides; read only when HAS_RESIDUAL
    weight_ptr,  # [hidden]
    out_ptr,  # [num_rows, hidden] contiguous, x's dtype
    residual_out_ptr,  # [num_rows, hidden] contiguous, x's dtype; written only when HAS_RESIDUAL
    num_rows,
    hidden,
    inner_rows,
    x_outer_stride,
    x_inner_stride,
    res_outer_stride,
    res_inner_stride,
    eps,
    q_ptr,  # QUANT: [num_rows, hidden] contiguous, FP8 e4m3 or int8: the output quantized per row
    scale_ptr,  # QUANT: float32 [num_rows] written (dynamic) or [1] read (STATIC)
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    QUANT: tl.constexpr = False,
    STATIC: tl.constexpr = False,
    QMAX: tl.constexpr = 448.0,
    IS_INT: tl.constexpr = False,
    MIN_EXP: tl.constexpr = -6,
    GROUP: tl.constexpr = 0,  # QUANT: 0 per row, or one scale per GROUP columns (block-FP8's 1 x 128)
    PDL: tl.constexpr = False,
):
    # the weight is a constant: read before waiting on the previous kernel, so that under PDL its load is in flight
    # during that kernel's tail rather than after this row's sum (one memory round trip off each norm's path)
    cols = tl.arange(0, BLOCK_H)
    w = tl.load(weight_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    mask = (rows < num_rows)[:, None] & (cols < hidden)[None, :]
    rows64 = rows.to(tl.int64)
    outer, inner = rows64 // inner_rows, rows64 % inner_rows
    x_offs = (outer * x_outer_stride + inner * x_inner_stride)[:, None] + cols[None, :]
    out_offs = (rows64 * hidden)[:, None] + cols[None, :]

    x = tl.load(x_ptr + x_offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        res_offs = (outer * res_outer_stride + inner * res_inner_stride)[:, None] + cols[None, :]
        res = tl.load(residual_ptr + res_offs, mask=mask, other=0.0)
        # the sum is rounded to x's dtype before it is normalized, as the residual stream is stored
        x = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + out_offs, x, mask=mask)
    xf = x.to(tl.float32)
    mean_square = tl.sum(xf * xf, axis=1) / hidden
    rstd = 1.0 / tl.sqrt(mean_square + eps)
    out = xf * rstd[:, None] * w[None, :]
    if QUANT:  # the output as the unfused path stores it (x's dtype), quantized per row for the next GEMM
        out = out.to(x.dtype).to(tl.float32)
        quantize_rows_and_store(out, q_ptr + out_offs, mask, scale_ptr, rows64, num_rows, STATIC, QMAX, IS_INT, MIN_EXP,
                                GROUP)  # fmt: skip
    else:
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=mask)


_RMS_NORM = Launcher(_rms_norm_kernel)


def _as_rows(t: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """View t as [outer, inner_rows, hidden] without copying when its rows are evenly strided."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    hidden = t.shape[-1]
    if t.dim() == 1:
        t = t.view(1, 1, hidden)
    elif t.dim() == 2:
        t = t.unsqueeze(1)
    else:
        t = t.reshape(-1, t.shape[-2], hidden)
    return t, t.shape[1], t.stride(0), t.stride(1)


def _launch_config(num_rows: int, hidden: int) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_H, num_warps). GPU: about 2-4K elements per program, one row when the
    row alone is that big. Interpreter: few programs, since each one costs milliseconds."""
    block_h = triton.next_power_of_2(hidden)
    if platform.is_interpreter():
        block_rows = triton.next_power_of_2(triton.cdiv(num_rows, 8))
        return min(block_rows, max(1, 65536 // block_h)), block_h, 1
    block_rows = max(1, min(16, 2048 // block_h))
    num_warps = min(16, max(1, block_rows * block_h // 512))
    return block_rows, block_h, num_warps


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    quant_dtype: torch.dtype | None = None,
    static_scale: torch.Tensor | None = None,
    group: int = 0,
) -> tuple[torch.Tensor | QuantizedActivation, torch.Tensor | None]:
    """(rms_norm output, or with quant_dtype that output quantized per row (per `group` columns of a row
    with group > 0); residual_out or None)."""
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"rms_norm weight has shape {tuple(weight.shape)}, expected ({hidden},)")
    num_rows = x.numel() // hidden
    if quant_dtype is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        q = scale = None
    else:  # the output lives only as q; `out` stands in for its unused pointer
        q = torch.empty((num_rows, hidden), dtype=quant_dtype, device=x.device)
        scale = fused_scales(num_rows, hidden, static_scale, group, x.device)
        out = QuantizedActivation(q, scale, x.dtype)
    residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    if num_rows == 0:
        return out, residual_out
    x_rows, inner_rows, x_outer, x_inner = _as_rows(x)
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} differs from x {tuple(x.shape)}")
        res_rows, res_inner_rows, res_outer, res_inner = _as_rows(residual)
        if res_inner_rows != inner_rows:
            raise ValueError("residual and x must share their leading shape")
    else:
        res_rows, res_outer, res_inner = x_rows, 0, 0
    block_rows, block_h, num_warps = _launch_config(num_rows, hidden)
    out_t = q if q is not None else out
    res_out = residual_out if residual_out is not None else out_t
    q_arg, scale_arg = (q, scale) if q is not None else (out_t, out_t)
    # eps as a float: an int would compile as an integer argument, which the key does not cover
    args = (
        x_rows, res_rows, weight, out_t, res_out, num_rows, hidden, inner_rows, x_outer, x_inner, res_outer, res_inner,
        float(eps), q_arg, scale_arg,
    )  # fmt: skip
    # every constexpr given, in order (the direct-launch path needs them all)
    constexprs = dict(
        HAS_RESIDUAL=residual is not None, BLOCK_ROWS=block_rows, BLOCK_H=block_h, QUANT=q is not None,
        STATIC=static_scale is not None, QMAX=qmax(quant_dtype) if q is not None else 448.0,
        IS_INT=quant_dtype == torch.int8, MIN_EXP=min_exponent(quant_dtype) if q is not None else -6, GROUP=group,
    )  # fmt: skip
    device_index = x.device.index or 0
    # out and residual_out have x's dtype; all but num_rows are fixed by the model: raw values
    key = (
        x.dtype, res_rows.dtype, weight.dtype, out_t.dtype, res_out.dtype,
        aligned(x_rows, res_rows, weight, out_t, res_out, q_arg, scale_arg), int_spec(num_rows),
        hidden, inner_rows, x_outer, x_inner, res_outer, res_inner, group,
    )  # fmt: skip
    _RMS_NORM(
        key, (triton.cdiv(num_rows, block_rows),), args, constexprs, num_warps=num_warps, num_stages=DEFAULT_NUM_STAGES,
        device_index=device_index,
    )  # fmt: skip
    return out, residual_out


@register("rms_norm", "triton", supports=Supports(dtypes=FLOATS), priority=10)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., hidden] (rows may be strided), weight [hidden] -> new tensor, x's shape and dtype."""
    return _launch(x, None, weight, eps)[0]


@register("rms_norm", "triton")
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual_out = x + residual (rounded to x's dtype); returns (rms_norm(residual_out), residual_out)."""
    out, residual_out = _launch(x, residual, weight, eps)
    assert residual_out is not None
    return out, residual_out


@register("rms_norm", "triton")
def rms_norm_quant(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    quant_dtype: torch.dtype,
    static_scale: torch.Tensor | None = None,
    group: int = 0,
) -> tuple[QuantizedActivation, torch.Tensor | None]:
    """rms_norm (with the residual add when given) whose output is quantized per row (or per `group`
    columns of a row) in the same kernel, for the quantized linear layer after it
    (kernels/reference.py defines the values)."""
    return _launch(x, residual, weight, eps, quant_dtype, static_scale, group)
