"""FP8-cache decode attention for Hopper (sm90), written in Gluon; the portable Triton kernels
(attention_unified.py, attention_split.py) serve every other GPU, dtype and batch.

Why a second kernel: with an FP8 cache the tensor-core operands must be widened to float16, and a
value tile's reduction dim (keys) is strided in the cache, so Triton's tl.dot path reads V's
operand byte by byte and widens K/V in registers (254 registers, 2 programs per SM, 64% of DRAM
bandwidth: experiments/attention_kernels/session3/). Here every layout is chosen by hand:

- K/V tiles [TILE_N, HEAD_DIM] (FP8) are gathered through the block table by cp.async into a ring
  of STAGES swizzled shared buffers, STAGES - 1 tiles ahead of the math.
- Scores are computed transposed, S^T = K Q^T (keys are the MMA's M dim, the GROUP query heads of
  the KV head its N dim, padded to ROWS >= 8), by wgmma with K in registers: each thread loads 32
  contiguous bytes of a key row (two 16-byte loads, no byte gathers) and widens them. That is legal
  because the dot's reduction order is free: the register layout loads key dims
  d = (HEAD_DIM / 4) t + 4 s + 2 h + e where the wgmma fragment expects k = 16 s + 8 h + 2 t + e,
  and q (the B operand, staged once in shared memory) is permuted the same way.
- V is widened once per tile into a float16 shared buffer (by default the tile's own ring slot,
  INPLACE_V, which saves 16-32 KB a program) that wgmma reads as a transposed A operand: O^T [HEAD_DIM, ROWS] += V^T P^T, P^T staged in shared memory. Accumulators stay tiny
  (S^T: 4 registers a thread at 64 keys, O^T: 8), so registers do not limit occupancy.

Layouts (element strides passed in; the last dim of every tensor must be contiguous):
  q, out           [num_tokens, num_heads, head_dim]; every sequence has q_len 0 or 1
  k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim] FP8 (values / k_scale, v_scale)
  k_scale, v_scale [1] float32
  partial_*        as attention_split.py (used when num_splits > 1; merge_splits_kernel finishes)
Grid: (num_kv_heads, num_seqs, num_splits); segments of a sequence as attention_split.segment_len.

Optional attention features (sliding window, sinks, soft-capping) are not implemented here: the
`triton_fp8_decode_sm90` implementation does not declare them, so the engine's auto selection takes
`triton_unified` for models that use them, and a call with a feature on its plan runs the portable
kernels (attention.AttentionPlan.run).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tritonllm.kernels.attention_split import segment_len
from tritonllm.kernels.launch import compile_gluon_sm90, gluon_barrier, gluon_sm90_available

try:  # recent triton ships Gluon (3.6 and 3.9 checked); without it the portable kernels serve FP8 caches
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    HAVE_GLUON = True
    # Gluon's API is experimental: triton 3.6 names the cp.async copy async_copy_global_to_shared and
    # the CTA barrier thread_barrier, later versions async_load and barrier (the old names then raise)
    _async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    _PUBLIC_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))  # else _reinterpret
except ImportError:  # pragma: no cover - older triton
    HAVE_GLUON = False

NUM_WARPS = 4  # one warpgroup


@dataclass(frozen=True)
class Fp8DecodeTiles:
    """Tiles of this kernel: one warpgroup a program."""

    tile_n: int  # keys per step (64 or 128; halved per doubling of head_dim past 128)
    num_stages: int  # ring slots of K/V tiles in flight
    inplace_v: bool  # widen V into its own ring slot instead of a separate float16 buffer


# per GPU family (attention.gpu_family); families without an entry never run this kernel.
# 128 x 8192 on the H200 (experiments/attention_kernels/fp8_gluon/): 128-key tiles, 2 slots, V widened in
# place (70 KB shared, 168 registers: 3 programs per SM) 530 us; 64-key tiles 551-554 us (2 slots),
# 572-636 us (3-4 slots: fewer programs per SM); the Triton kernel 713 us
TILES: dict[str, Fp8DecodeTiles] = {"hopper": Fp8DecodeTiles(tile_n=128, num_stages=2, inplace_v=True)}


@functools.cache
def available() -> bool:
    """Whether this machine runs the kernel: an NVIDIA sm90 GPU (wgmma) and a Triton whose Gluon
    compiles it (Gluon's API is experimental: a version that breaks it leaves FP8 decode to the
    portable kernels, with a warning, instead of failing a step)."""
    return gluon_sm90_available(
        HAVE_GLUON, "FP8 decode", "the portable Triton kernel serves FP8 caches instead", compile_sm90
    )


def padded_rows(group: int) -> int:
    """The wgmma N dim the GROUP query heads of a KV head are padded to (ROWS): 8 or a power of two."""
    return max(8, 1 << (group - 1).bit_length())


def compile_sm90(
    head_dim: int = 128,
    group: int = 4,
    block_size: int = 16,
    tile_n: int = 128,
    stages: int = 2,
    inplace_v: bool = True,
    direct: bool = True,
    q_dtype: str = "bf16",
):
    """Compile the kernel for sm90 without a GPU (Triton's own compiler and ptxas); returns the
    compiled kernel (its .asm holds the IR, PTX and cubin). For tests, scripts/cross_compile_attention.py
    and the probe of available()."""
    fn = fp8_decode_sm90_kernel
    constexprs = dict(GROUP=group, ROWS=padded_rows(group), BLOCK_SIZE=block_size,
                      HEAD_DIM=head_dim, TILE_N=tile_n, STAGES=stages, DIRECT=direct, INPLACE_V=inplace_v)  # fmt: skip
    types = dict(out_ptr=f"*{q_dtype}", q_ptr=f"*{q_dtype}", k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv",
                 block_tables_ptr="*i32", seq_lens_ptr="*i32", query_start_loc_ptr="*i32", qk_scale="fp32")  # fmt: skip
    types.update((n, "*fp32") for n in fn.arg_names if n.endswith("_ptr") and n not in types)
    # pointers and the block/token strides divisible by 16, as an engine's caches have them
    aligned = [n for n in fn.arg_names if n not in constexprs and (n.endswith("_ptr") or n.startswith("stride"))]
    return compile_gluon_sm90(fn, constexprs, types, aligned, num_warps=NUM_WARPS)


def supported(head_dim: int, group: int, block_size: int, tile_n: int) -> bool:
    """Whether this kernel serves a shape (else the portable kernels do)."""
    return (
        HAVE_GLUON
        and head_dim in (64, 128, 256)
        and 1 <= group <= 16
        and tile_n in (64, 128)
        and block_size & (block_size - 1) == 0
    )


if HAVE_GLUON:
    _WARPS = gl.constexpr(NUM_WARPS)

    @gluon.constexpr_function
    def _copy_layout(head_dim):
        """cp.async layout of a [TILE_N, HEAD_DIM] FP8 tile: 16 bytes a thread, rows over lanes/warps."""
        per_row = head_dim // 16
        return gl.BlockedLayout([1, 16], [32 // per_row, per_row], [NUM_WARPS, 1], [1, 0])

    @gluon.constexpr_function
    def _k_layout(tile_n, head_dim):
        """Registers of a [TILE_N, HEAD_DIM] K tile laid out as wgmma's A fragment up to the dim
        permutation in the module docstring: a thread holds HEAD_DIM / 4 contiguous dims of rows g
        and g + 8 (and + 64 per repeat) of its warp's 16-row slab."""
        quarter = head_dim // 4
        regs = [[0, 1 << i] for i in range(quarter.bit_length() - 1)] + [[8, 0]]
        regs += [[64 << i, 0] for i in range((tile_n // 64).bit_length() - 1)]
        lanes = [[0, quarter], [0, 2 * quarter], [1, 0], [2, 0], [4, 0]]
        return gl.DistributedLinearLayout(regs, lanes, [[16, 0], [32, 0]], [], [tile_n, head_dim])

    @gluon.jit
    def _to_fragment_order(x, HEAD_DIM: gl.constexpr):
        """Relabel dims d = (HEAD_DIM/4) t + 4 s + 2 h + e as k = 16 s + 8 h + 2 t + e (a permutation of
        the reduction dim, applied to K and q alike)."""
        R: gl.constexpr = x.shape[0]
        x = gl.reshape(x, [R, 4, HEAD_DIM // 16, 2, 2])
        x = gl.permute(x, (0, 2, 3, 1, 4))
        return gl.reshape(x, [R, HEAD_DIM])

    @gluon.jit
    def _tile_blocks(
        tile, key_start, key_end, block_row_ptr, TILE_N: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_SIZE: gl.constexpr
    ):
        """Physical block of each key of tile `tile` (0 past key_end), in the copy layout's rows."""
        keys = key_start + tile * TILE_N + gl.arange(0, TILE_N, layout=gl.SliceLayout(1, _copy_layout(HEAD_DIM)))
        return gl.load(block_row_ptr + keys // BLOCK_SIZE, mask=keys < key_end, other=0).to(gl.int64)

    @gluon.jit
    def _issue_tile(
        slot,
        blocks,
        tile,
        key_start,
        key_end,
        k_head_ptr,
        v_head_ptr,
        stride_kc_block,
        stride_kc_slot,
        stride_vc_block,
        stride_vc_slot,
        TILE_N: gl.constexpr,
        HEAD_DIM: gl.constexpr,
        BLOCK_SIZE: gl.constexpr,
    ):
        """cp.async of tile `tile`'s keys into a ring slot (K rows, then V rows); keys past key_end are
        zero-filled (the cache may hold NaN there, which p = 0 would not cancel)."""
        layout: gl.constexpr = _copy_layout(HEAD_DIM)
        keys = key_start + tile * TILE_N + gl.arange(0, TILE_N, layout=gl.SliceLayout(1, layout))
        offs_d = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout)), 0)
        mask = gl.expand_dims(keys < key_end, 1)
        in_block = keys % BLOCK_SIZE
        k_rows = gl.expand_dims(blocks * stride_kc_block + in_block * stride_kc_slot, 1)
        v_rows = gl.expand_dims(blocks * stride_vc_block + in_block * stride_vc_slot, 1)
        _async_load(slot.slice(0, TILE_N), k_head_ptr + k_rows + offs_d, mask=mask)
        _async_load(slot.slice(TILE_N, TILE_N), v_head_ptr + v_rows + offs_d, mask=mask)

    @gluon.jit(do_not_specialize=["num_splits"])
    def fp8_decode_sm90_kernel(
        out_ptr,
        partial_out_ptr,
        partial_max_ptr,
        partial_sum_ptr,
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        block_tables_ptr,
        seq_lens_ptr,
        query_start_loc_ptr,
        k_scale_ptr,
        v_scale_ptr,
        num_splits,
        qk_scale,
        stride_q_token,
        stride_q_head,
        stride_o_token,
        stride_o_head,
        stride_bt_seq,
        stride_kc_block,
        stride_kc_slot,
        stride_kc_head,
        stride_vc_block,
        stride_vc_slot,
        stride_vc_head,
        GROUP: gl.constexpr,
        ROWS: gl.constexpr,
        BLOCK_SIZE: gl.constexpr,
        HEAD_DIM: gl.constexpr,
        TILE_N: gl.constexpr,
        STAGES: gl.constexpr,
        DIRECT: gl.constexpr,
        INPLACE_V: gl.constexpr,
    ):
        kv_head = gl.program_id(0)
        seq = gl.program_id(1)
        split = gl.program_id(2)
        num_kv_heads = gl.num_programs(0)
        q_start = gl.load(query_start_loc_ptr + seq)
        q_len = gl.load(query_start_loc_ptr + seq + 1) - q_start
        seq_len = gl.load(seq_lens_ptr + seq)
        split_len = segment_len(seq_len, num_splits, TILE_N)
        key_start = split * split_len
        key_end = gl.minimum(key_start + split_len, seq_len)
        if (q_len == 0) | (key_start >= key_end):
            return
        num_tiles = gl.cdiv(key_end - key_start, TILE_N)

        # layouts
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[_WARPS, 1], instr_shape=[16, ROWS, 16]
        )
        a_frag: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        k_regs: gl.constexpr = _k_layout(TILE_N, HEAD_DIM)
        copy: gl.constexpr = _copy_layout(HEAD_DIM)
        ring_layout: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 8, order=[1, 0])
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], gl.float16)
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, TILE_N], gl.float16)
        vh_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE_N, HEAD_DIM], gl.float16)

        # a ring slot holds a tile's K rows then its V rows; INPLACE_V widens V into the slot itself
        ring = gl.allocate_shared_memory(k_cache_ptr.dtype.element_ty, [STAGES, 2 * TILE_N, HEAD_DIM], ring_layout)
        q_smem = gl.allocate_shared_memory(gl.float16, [ROWS, HEAD_DIM], q_layout)
        p_smem = gl.allocate_shared_memory(gl.float16, [ROWS, TILE_N], p_layout)
        if not INPLACE_V:
            vh_smem = gl.allocate_shared_memory(gl.float16, [TILE_N, HEAD_DIM], vh_layout)

        block_row_ptr = block_tables_ptr + seq.to(gl.int64) * stride_bt_seq
        k_head_ptr = k_cache_ptr + kv_head * stride_kc_head
        v_head_ptr = v_cache_ptr + kv_head * stride_vc_head
        for i in gl.static_range(STAGES - 1):
            blocks = _tile_blocks(i, key_start, key_end, block_row_ptr, TILE_N, HEAD_DIM, BLOCK_SIZE)
            _issue_tile(
                ring.index(i), blocks, i, key_start, key_end, k_head_ptr, v_head_ptr, stride_kc_block,
                stride_kc_slot, stride_vc_block, stride_vc_slot, TILE_N, HEAD_DIM, BLOCK_SIZE,
            )  # fmt: skip
            async_copy.commit_group()
        # block ids one tile ahead of their copies, so the copies never wait on the block table
        blocks = _tile_blocks(STAGES - 1, key_start, key_end, block_row_ptr, TILE_N, HEAD_DIM, BLOCK_SIZE)

        # q of the GROUP heads (rows past GROUP are zero), in float16 and the fragment's dim order
        offs_r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, copy))
        offs_dq = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, copy))
        q_offs = (
            q_start.to(gl.int64) * stride_q_token
            + gl.expand_dims((kv_head * GROUP + offs_r) * stride_q_head, 1)
            + gl.expand_dims(offs_dq, 0)
        )
        q = gl.load(q_ptr + q_offs, mask=gl.expand_dims(offs_r < GROUP, 1), other=0.0)
        q_smem.store(_to_fragment_order(q.to(gl.float16), HEAD_DIM))
        scale = qk_scale * gl.load(k_scale_ptr)

        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(0, mma))
        l_acc = gl.zeros([TILE_N, ROWS], gl.float32, layout=mma)
        o_acc = gl.zeros([HEAD_DIM, ROWS], gl.float32, layout=mma)
        offs_n = gl.arange(0, TILE_N, layout=gl.SliceLayout(1, mma))
        for tile in range(num_tiles):
            # tile `tile` landed (this thread's copies), then everyone's: and every thread is done
            # with the slot the next issue overwrites (read in the previous iteration)
            async_copy.wait_group(STAGES - 2)
            gluon_barrier()
            nxt = tile + STAGES - 1
            _issue_tile(
                ring.index(nxt % STAGES), blocks, nxt, key_start, key_end, k_head_ptr, v_head_ptr, stride_kc_block,
                stride_kc_slot, stride_vc_block, stride_vc_slot, TILE_N, HEAD_DIM, BLOCK_SIZE,
            )  # fmt: skip
            async_copy.commit_group()
            blocks = _tile_blocks(nxt + 1, key_start, key_end, block_row_ptr, TILE_N, HEAD_DIM, BLOCK_SIZE)
            slot = ring.index(tile % STAGES)

            # S^T = K Q^T on tensor cores, K widened in registers
            k = slot.slice(0, TILE_N).load(k_regs).to(gl.float16)
            k = gl.convert_layout(_to_fragment_order(k, HEAD_DIM), a_frag, assert_trivial=True)
            s = warpgroup_mma(k, q_smem.permute((1, 0)), l_acc, use_acc=False, is_async=True)

            # V widened once into the float16 operand buffer (overlaps the MMA)
            v = slot.slice(TILE_N, TILE_N).load(copy).to(gl.float16)
            if INPLACE_V:
                if _PUBLIC_REINTERPRET:
                    vh_smem = slot.reinterpret(gl.float16, [TILE_N, HEAD_DIM], vh_layout)
                else:
                    vh_smem = slot._reinterpret(gl.float16, [TILE_N, HEAD_DIM], vh_layout)
                gluon_barrier()  # every thread has read the slot's FP8 bytes
            vh_smem.store(v)

            s = warpgroup_mma_wait(0, deps=(s,))
            s = s * scale
            keys = key_start + tile * TILE_N + offs_n
            s = gl.where(gl.expand_dims(keys < key_end, 1), s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 0))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - gl.expand_dims(m_new, 0))
            l_acc = l_acc * gl.expand_dims(alpha, 0) + p
            m_i = m_new
            p_smem.store(gl.permute(p.to(gl.float16), (1, 0)))
            fence_async_shared()
            gluon_barrier()
            o_acc = warpgroup_mma(
                vh_smem.permute((1, 0)), p_smem.permute((1, 0)), o_acc * gl.expand_dims(alpha, 0), is_async=True
            )
            o_acc = warpgroup_mma_wait(0, deps=(o_acc,))
        async_copy.wait_group(0)

        l_i = gl.sum(l_acc, 0)
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, mma))
        offs_h = gl.arange(0, ROWS, layout=gl.SliceLayout(0, mma))
        head = kv_head * GROUP + offs_h
        row_ok = offs_h < GROUP
        if DIRECT:
            o = o_acc * gl.expand_dims(gl.load(v_scale_ptr) / l_i, 0)
            o_offs = q_start.to(gl.int64) * stride_o_token + gl.expand_dims(head * stride_o_head, 0)
            o_offs = o_offs + gl.expand_dims(offs_d, 1)
            gl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(row_ok, 0))
        else:
            row = (seq * num_kv_heads * GROUP + head).to(gl.int64) * num_splits + split
            gl.store(partial_max_ptr + row, m_i, mask=row_ok)
            gl.store(partial_sum_ptr + row, l_i, mask=row_ok)
            p_offs = gl.expand_dims(row * HEAD_DIM, 0) + gl.expand_dims(offs_d, 1)
            gl.store(partial_out_ptr + p_offs, o_acc, mask=gl.expand_dims(row_ok, 0))
