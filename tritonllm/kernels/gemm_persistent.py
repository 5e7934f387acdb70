"""The persistent, tensor-descriptor variant of the GEMM family (kernels/gemm.py), for large M.

One program per SM walks the output tiles (grouped order, `tl.range(..., flatten=True)` so the
loads of the next tile overlap the epilogue of this one); A [M, K], B [N, K] and C [M, N] are read
and written through host-built tensor descriptors, which Hopper turns into TMA bulk copies. Same
operands, scales and bias as `gemm_kernel`: row/column scales in the epilogue, block-FP8's
K-grouped float32 scales on each K tile's partial product (BLOCK_K equals the group); no e8m0 (MX)
operand scales, weight widening or split-K (those shapes keep the pointer kernel). A tile table entry
asks for it with `GemmTiles(persistent=True)`; `gemm()` falls back to the pointer kernel where a
descriptor cannot describe the tensors (row strides that are not 16-byte multiples).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonllm import platform  # noqa: F401  (switches on the interpreter on CPU first)


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(tile row, tile column) of tile `tile_id` in grouped order: GROUP_M consecutive tile rows
    sweep the tile columns together, so the B columns they share stay in L2 (both GEMM kernels)."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile_id // per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile_id % per_group) % group_rows, (tile_id % per_group) // group_rows


@triton.jit
def gemm_persistent_kernel(
    a_desc, b_desc, c_desc, bias_ptr, a_scale_ptr, b_scale_ptr,
    M, N, K, stride_asm, stride_ask, stride_bsn, stride_bsk,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr,
    INT_ACC: tl.constexpr, HAS_BIAS: tl.constexpr,
    OUT_DTYPE: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    # the epilogue recomputes its tile from its own counter: the loop body then has no value that
    # lives from the loads of one tile into the stores of the last, which flattening needs
    tile_id_c = start - NUM_PROGRAMS
    for tile_id in tl.range(start, num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        if INT_ACC:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if A_SCALE == 3 or B_SCALE == 3:  # rows and columns whose K-group scales the K loop reads
            rm = tl.minimum(pid_m * BLOCK_M + tl.arange(0, BLOCK_M), M - 1).to(tl.int64)
            rn = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])  # out-of-range rows and columns read zeros
            b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            if A_SCALE == 3 or B_SCALE == 3:  # block-FP8: this K tile is one scale group
                part = tl.dot(a, b.T)
                if A_SCALE == 3:
                    part = part * tl.load(a_scale_ptr + rm * stride_asm + ki * stride_ask)[:, None]
                if B_SCALE == 3:
                    part = part * tl.load(b_scale_ptr + (rn // GROUP_N) * stride_bsn + ki * stride_bsk)[None, :]
                acc += part
            elif INT_ACC:
                acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
            else:
                acc = tl.dot(a, b.T, acc)
        tile_id_c += NUM_PROGRAMS
        pid_m, pid_n = tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        out = acc.to(tl.float32)
        if A_SCALE == 1:
            out = out * tl.load(a_scale_ptr)
        if A_SCALE == 2:
            out = out * tl.load(a_scale_ptr + offs_m.to(tl.int64) * stride_asm, mask=offs_m < M, other=0.0)[:, None]
        if B_SCALE == 2:
            out = out * tl.load(b_scale_ptr + offs_n.to(tl.int64) * stride_bsn, mask=offs_n < N, other=0.0)[None, :]
        if HAS_BIAS:
            out += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :].to(tl.float32)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], out.to(OUT_DTYPE))  # clipped at the edges


def descriptors_fit(*tensors) -> bool:
    """Whether tensor descriptors can describe these 2-D tensors: unit last stride, row strides and
    base addresses 16-byte aligned."""
    return all(
        t.dim() == 2 and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
        for t in tensors
    )
