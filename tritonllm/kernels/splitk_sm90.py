"""K splits summed inside one launch, and the transposed output store, of the Hopper Gluon GEMMs that
compute c^T = w . a^T (kernels/gemm_w4_sm90.py, kernels/gemm_skinny_sm90.py).

A skinny GEMM (a few activation rows) has too few output tiles to fill the SMs, so K is split over
programs. Each split program writes its float32 partial to a workspace [SPLIT_K, M, N] and counts its
arrival on the tile's counter; the last to arrive sums the partials in split order (deterministic),
applies the scales and bias, writes the output and resets the counter: no second launch, no atomics
on the output. The counters are one zeroed int32 tensor per device that every kernel leaves at zero.
"""

from __future__ import annotations

import torch
import triton

from tritonllm.kernels.launch import MAX_ARRIVAL_COUNTERS, arrival_counters, gluon_barrier

try:  # recent triton ships Gluon
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older triton
    HAVE_GLUON = False


def counters_serve(tiles: int, device: torch.device) -> bool:
    """Whether the arrival counters can count `tiles` tiles in (one counter a tile): no more tiles than
    counters, and counters allocated (none are while a CUDA graph is being captured before they exist,
    launch.arrival_counters)."""
    return tiles <= MAX_ARRIVAL_COUNTERS and arrival_counters(device) is not None


def usable_split(split: int, tiles: int, device: torch.device) -> int:
    """`split`, or 1 where the arrival counters cannot serve it (counters_serve)."""
    return split if split == 1 or counters_serve(tiles, device) else 1


def workspace(split: int, m: int, n: int, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 partials [split, M, N], the counters) for a split launch; (c, c) stand-ins without one."""
    if split == 1:
        return c, c
    return torch.empty((split, m, n), dtype=torch.float32, device=c.device), arrival_counters(c.device)


def plan_splits(m: int, n: int, k: int, split: int, block_k: int, block_n: int,
                c: torch.Tensor) -> tuple[int, int, int, torch.Tensor, torch.Tensor]:  # fmt: skip
    """A launch's K splits: (splits, columns a split (whole K steps of block_k), tiles of block_n rows, the
    float32 partials and the counters (workspace)) for `split` asked and an output c [M, N]; one split where
    the counters cannot serve more (usable_split)."""
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_per_split)
    tiles = triton.cdiv(n, block_n)
    if usable_split(split, tiles, c.device) == 1:
        split, k_per_split = 1, k
    return (split, k_per_split, tiles, *workspace(split, m, n, c))


# scale kinds of the epilogue: none, one value for every row (or column), one a row (column); SCALE_GROUP (the
# skinny GEMM's): the activations' one a row and 128-column group of K, or the weight's one a 128 x 128 block,
# applied in the K loop, not here
SCALE_NONE, SCALE_ONE, SCALE_EACH, SCALE_GROUP = 0, 1, 2, 3


def scale_kind(scale: torch.Tensor | None) -> int:
    """The kind of a scale tensor: none, one value, one a row (column), or (SCALE_GROUP) one a row and group of
    K columns: [M, G > 1] (quant.fused_scales' column-major layout, the only one the kernels read)."""
    if scale is None:
        return SCALE_NONE
    if scale.dim() == 2 and scale.shape[1] > 1:
        return SCALE_GROUP
    return SCALE_ONE if scale.numel() == 1 else SCALE_EACH


if HAVE_GLUON:

    @gluon.jit
    def scaled(acc, bias_ptr, w_scale_ptr, a_scale_ptr, n_w, n_ok, m_out, M, stride_asm, HAS_BIAS: gl.constexpr,
               W_SCALE: gl.constexpr, A_SCALE: gl.constexpr):  # fmt: skip
        """acc[n, m] x the weight's scale of row n_w[n] x the activations' scale of m (+ bias[n_w[n]]) where
        n_ok; scale kinds SCALE_NONE (0), SCALE_ONE (1), SCALE_EACH (2)."""
        if W_SCALE == 2:
            acc = acc * gl.expand_dims(gl.load(w_scale_ptr + n_w, mask=n_ok, other=0.0), 1)
        elif W_SCALE == 1:
            acc = acc * gl.load(w_scale_ptr)
        if A_SCALE == 2:
            acc = acc * gl.expand_dims(gl.load(a_scale_ptr + m_out * stride_asm, mask=m_out < M, other=0.0), 0)
        elif A_SCALE == 1:
            acc = acc * gl.load(a_scale_ptr)
        if HAS_BIAS:
            acc += gl.expand_dims(gl.load(bias_ptr + n_w, mask=n_ok, other=0.0).to(gl.float32), 1)
        return acc

    @gluon.jit
    def _store(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, n_out, m_out, ok, M, N, stride_cm, stride_asm,
               HAS_BIAS: gl.constexpr, W_SCALE: gl.constexpr, A_SCALE: gl.constexpr, ADD_C: gl.constexpr):  # fmt: skip
        """c[m, n] = acc[n, m], scaled (+ bias); ADD_C: c[m, n] += that, the product rounded to c's dtype first
        (a residual add after the layer, as the unfused GEMM and add round)."""
        acc = scaled(acc, bias_ptr, w_scale_ptr, a_scale_ptr, n_out, n_out < N, m_out, M, stride_asm, HAS_BIAS,
                     W_SCALE, A_SCALE)  # fmt: skip
        offs = gl.expand_dims(m_out.to(gl.int64) * stride_cm, 0) + gl.expand_dims(n_out, 1)
        if ADD_C:
            old = gl.load(c_ptr + offs, mask=ok, other=0.0).to(gl.float32)
            acc = acc.to(c_ptr.dtype.element_ty).to(gl.float32) + old
        gl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=ok)

    @gluon.jit
    def _tile_coords(tile, M, N, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, ACC: gl.constexpr):
        """(the weight rows of tile, the activation rows, the mask of both in range) in the accumulator's layout."""
        n_out = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
        m_out = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
        return n_out, m_out, gl.expand_dims(n_out < N, 1) & gl.expand_dims(m_out < M, 0)

    @gluon.jit
    def finish_tile(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, ws_ptr, cnt_ptr, pid_n, pid_k, M, N, stride_cm,
                    stride_asm, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, ACC: gl.constexpr,
                    HAS_BIAS: gl.constexpr, W_SCALE: gl.constexpr, A_SCALE: gl.constexpr,
                    SPLIT_K: gl.constexpr, ADD_C: gl.constexpr = False):  # fmt: skip
        """Write the [BLOCK_N, BLOCK_M] accumulator (layout ACC) of weight rows pid_n x BLOCK_N.. as
        c[m, n] (ADD_C: added to c, _store); with K splits, write this split's partial and let the tile's
        last one sum them (finish_part: so one program reads and writes each element of c)."""
        if SPLIT_K > 1:
            finish_part(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, ws_ptr, cnt_ptr, pid_n, pid_k, SPLIT_K, M, N,
                        stride_cm, stride_asm, BLOCK_N, BLOCK_M, ACC, HAS_BIAS, W_SCALE, A_SCALE, SPLIT_K, ADD_C)  # fmt: skip
        else:
            n_out, m_out, ok = _tile_coords(pid_n, M, N, BLOCK_N, BLOCK_M, ACC)
            _store(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, n_out, m_out, ok, M, N, stride_cm, stride_asm,
                   HAS_BIAS, W_SCALE, A_SCALE, ADD_C)  # fmt: skip

    @gluon.jit
    def finish_part(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, ws_ptr, cnt_ptr, tile, part, parts, M, N,
                    stride_cm, stride_asm, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, ACC: gl.constexpr,
                    HAS_BIAS: gl.constexpr, W_SCALE: gl.constexpr, A_SCALE: gl.constexpr, MAX_PARTS: gl.constexpr,
                    ADD_C: gl.constexpr = False):  # fmt: skip
        """Part `part` of a tile cut into `parts` (2..MAX_PARTS: K splits, or stream-K runs; a run-time value):
        write its float32 partial to ws [parts, M, N] and arrive on the tile's counter; the last to arrive sums
        the partials in part order (every load in flight at once), writes c (_store) and resets the counter."""
        n_out, m_out, ok = _tile_coords(tile, M, N, BLOCK_N, BLOCK_M, ACC)
        tile_ws = ws_ptr + gl.expand_dims(m_out * N, 0) + gl.expand_dims(n_out, 1)
        gl.store(tile_ws + part * M * N, acc, mask=ok)
        gluon_barrier()  # every thread's partial written before the (releasing) arrival
        arrived = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == parts - 1:
            gluon_barrier()
            acc = gl.load(tile_ws, mask=ok, other=0.0, cache_modifier=".cg")
            for sp in gl.static_range(1, MAX_PARTS):
                acc += gl.load(tile_ws + sp * M * N, mask=ok & (sp < parts), other=0.0, cache_modifier=".cg")
            _store(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, n_out, m_out, ok, M, N, stride_cm, stride_asm,
                   HAS_BIAS, W_SCALE, A_SCALE, ADD_C)  # fmt: skip
            gl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch
