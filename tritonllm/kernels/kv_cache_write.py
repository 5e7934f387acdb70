"""Write the step's new K and V rows into the paged KV cache, optionally quantizing to FP8.

Layouts (element strides passed in; the last dim of every tensor must be contiguous):
  k, v           [num_tokens, num_kv_heads, head_dim]   any dtype, cast to the cache's
  k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]
  slot_mapping   [num_tokens] int: slot = physical_block * block_size + offset; < 0 skips the token
                 (padding rows of a CUDA-graph batch).
  k_scale, v_scale [1] float32 (FP8 caches only): the cache stores round(k / k_scale) clamped to the
                 FP8 range, rounded to nearest even; readers multiply by the scale.
A program copies TOKENS_PER_PROGRAM tokens x all heads, so CPU grids stay small and a GPU program
moves a few KiB; heads and dims are flattened into one padded axis of length HEADS_X_DIM_PAD.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# platform switches on the interpreter on CPU; triton reads that when a kernel is defined, below
from tritonllm import platform
from tritonllm.kernels.launch import DEFAULT_NUM_STAGES, Launcher, aligned, int_spec, pdl_wait
from tritonllm.kernels.registry import FLOATS, Supports, register

# FP8 cache flavours: e4m3fn (NVIDIA, AMD CDNA4) and e4m3fnuz (AMD CDNA3, see platform.fp8_e4m3_dtype)
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
KV_WRITE_SUPPORTS = Supports(dtypes=FLOATS, kv_dtypes=FLOATS | frozenset(FP8_KV_DTYPES), features=frozenset({"fp8_kv"}))


def check_kv_scales(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    op: str,
) -> bool:
    """Whether the caches are FP8 (scales needed; checked here without a host sync). Other caches
    ignore the scales."""
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"{op}: k_cache {k_cache.dtype} and v_cache {v_cache.dtype} differ")
    if k_cache.dtype not in FP8_KV_DTYPES:
        if k_cache.dtype.is_floating_point and k_cache.dtype.itemsize == 1:
            raise ValueError(f"{op}: KV cache dtype {k_cache.dtype} is not supported; FP8 caches are {FP8_KV_DTYPES}")
        return False
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None or scale.numel() != 1 or scale.dtype != torch.float32 or scale.device != k_cache.device:
            got = None if scale is None else (scale.dtype, tuple(scale.shape), str(scale.device))
            raise ValueError(
                f"{op}: a {k_cache.dtype} KV cache needs {name} as a 1-element float32 tensor on "
                f"{k_cache.device} (got {got}); pass torch.ones(1) for unscaled values"
            )
    return True


def fp8_grid_params(dtype: torch.dtype) -> tuple[float, int, int]:
    """(largest finite value, mantissa bits, exponent of the smallest normal) of an FP8 dtype."""
    info = torch.finfo(dtype)
    return info.max, -round(math.log2(info.eps)), round(math.log2(info.tiny))


@triton.jit
def _quantize_fp8(x, scale, FP8_MAX: tl.constexpr, MANTISSA_BITS: tl.constexpr, MIN_NORMAL_EXP: tl.constexpr):
    """x / scale clamped to +-FP8_MAX and rounded to nearest even on the FP8 grid, still in float32.

    The rounding is done here so the cast to FP8 that follows is exact on every backend: the
    interpreter's own float32 -> FP8 cast misrounds values whose mantissa carries into the exponent,
    and hardware casts differ in saturation. Division is IEEE (div_rn), as in the torch reference.
    """
    y = tl.math.div_rn(x, scale)
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    y_bits = y.to(tl.int32, bitcast=True)
    biased_exp = (y_bits >> 23) & 0xFF
    # the grid step at |y|: 2^(exp - MANTISSA_BITS), fixed below the smallest normal (subnormals)
    step_exp = tl.maximum(biased_exp, 127 + MIN_NORMAL_EXP) - MANTISSA_BITS
    step = (step_exp << 23).to(tl.float32, bitcast=True)
    inv_step = ((254 - step_exp) << 23).to(tl.float32, bitcast=True)  # exact power of two
    t = tl.abs(y) * inv_step
    t_floor = tl.floor(t)
    frac = t - t_floor
    round_up = (frac > 0.5) | ((frac == 0.5) & ((t_floor.to(tl.int32) & 1) == 1))
    mag = (t_floor + round_up.to(tl.float32)) * step
    return tl.where(y_bits < 0, -mag, mag)  # the sign bit, so -0 and tiny negatives keep their sign


@triton.jit
def _write_kv_cache_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    k_scale_ptr,
    v_scale_ptr,
    num_tokens,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_X_DIM: tl.constexpr,
    HEADS_X_DIM_PAD: tl.constexpr,
    TOKENS_PER_PROGRAM: tl.constexpr,
    QUANTIZE_FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MANTISSA_BITS: tl.constexpr,
    MIN_NORMAL_EXP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    tokens = tl.program_id(0) * TOKENS_PER_PROGRAM + tl.arange(0, TOKENS_PER_PROGRAM)
    token_ok = tokens < num_tokens
    slots = tl.load(slot_mapping_ptr + tokens, mask=token_ok, other=-1).to(tl.int64)
    row_ok = token_ok & (slots >= 0)
    # slots < 0 would give negative block ids; clamp so even masked-off addresses stay in range
    slots = tl.maximum(slots, 0)
    blocks = slots // BLOCK_SIZE
    offsets = slots % BLOCK_SIZE

    elems = tl.arange(0, HEADS_X_DIM_PAD)
    heads = elems // HEAD_DIM
    dims = elems % HEAD_DIM
    mask = row_ok[:, None] & (elems < HEADS_X_DIM)[None, :]
    tok64 = tokens.to(tl.int64)[:, None]

    k = tl.load(k_ptr + tok64 * stride_k_token + (heads * stride_k_head + dims)[None, :], mask=mask)
    v = tl.load(v_ptr + tok64 * stride_v_token + (heads * stride_v_head + dims)[None, :], mask=mask)
    if QUANTIZE_FP8:
        k = _quantize_fp8(k.to(tl.float32), tl.load(k_scale_ptr), FP8_MAX, MANTISSA_BITS, MIN_NORMAL_EXP)
        v = _quantize_fp8(v.to(tl.float32), tl.load(v_scale_ptr), FP8_MAX, MANTISSA_BITS, MIN_NORMAL_EXP)
    k_dst = blocks[:, None] * stride_kc_block + offsets[:, None] * stride_kc_slot
    v_dst = blocks[:, None] * stride_vc_block + offsets[:, None] * stride_vc_slot
    k_dst += (heads * stride_kc_head + dims)[None, :]
    v_dst += (heads * stride_vc_head + dims)[None, :]
    tl.store(k_cache_ptr + k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


_WRITE_KV_CACHE = Launcher(_write_kv_cache_kernel)


@register("kv_write", "triton", supports=KV_WRITE_SUPPORTS, priority=10)
def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """k, v [num_tokens, num_kv_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads,
    head_dim]; token t goes to slot s = slot_mapping[t] = block * block_size + offset (s < 0: skip).
    FP8 caches (FP8_KV_DTYPES) store round(k / k_scale), round(v / v_scale) clamped to the FP8 range
    (k_scale, v_scale: 1-element float32 tensors); other caches ignore the scales."""
    num_tokens, num_kv_heads, head_dim = k.shape
    quantize = check_kv_scales(k_cache, v_cache, k_scale, v_scale, "write_kv_cache")
    if num_tokens == 0:
        return
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"write_kv_cache: {name} must be contiguous in head_dim (stride {t.stride()})")
    fp8_max, mantissa_bits, min_normal_exp = fp8_grid_params(k_cache.dtype) if quantize else (0.0, 0, 0)
    heads_x_dim = num_kv_heads * head_dim
    # GPU: ~4 tokens x 8 heads x 128 dims per program; interpreter: few, fat programs
    tokens_per_program = 4 if platform.is_gpu() else 16
    grid = (triton.cdiv(num_tokens, tokens_per_program),)
    # the scales are passed (and float32, checked above) exactly when QUANTIZE_FP8, so the constexprs
    # in the key also say which pointers are None
    k_scale_arg, v_scale_arg = (k_scale, v_scale) if quantize else (None, None)
    strides = (*k.stride()[:2], *v.stride()[:2], *k_cache.stride()[:3], *v_cache.stride()[:3])
    args = (k, v, k_cache, v_cache, slot_mapping, k_scale_arg, v_scale_arg, num_tokens, *strides)
    constexprs = dict(
        BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim,
        HEADS_X_DIM=heads_x_dim,
        HEADS_X_DIM_PAD=triton.next_power_of_2(heads_x_dim),
        TOKENS_PER_PROGRAM=tokens_per_program,
        QUANTIZE_FP8=quantize,
        FP8_MAX=fp8_max,
        MANTISSA_BITS=mantissa_bits,
        MIN_NORMAL_EXP=min_normal_exp,
    )
    device_index = k_cache.device.index or 0
    # the strides are fixed by the model and the cache: raw values; num_tokens changes with the batch
    key = (
        k.dtype, v.dtype, k_cache.dtype, v_cache.dtype, slot_mapping.dtype,
        aligned(k, v, k_cache, v_cache, slot_mapping, k_scale_arg, v_scale_arg), int_spec(num_tokens), strides,
    )  # fmt: skip
    _WRITE_KV_CACHE(
        key, grid, args, constexprs, num_warps=4, num_stages=DEFAULT_NUM_STAGES, device_index=device_index
    )  # fmt: skip
