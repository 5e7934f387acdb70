"""The unified paged-attention kernel: prefill chunks and decodes of a flat ragged batch in one
launch. The contract, layouts and work split are described in attention.py (the launcher).

Optional features, each a constexpr flag (off: no code, the kernel compiles as without it):
SLIDING (a window of `window` keys: p - window < key <= p; key tiles wholly before every row's
window are skipped, not masked), SINKS (sinks_ptr [num_heads] float32: one logit per head in the
final denominator) and SOFTCAP (scores capped at softcap2 / log2(e), see attention_tile.py).
"""

import triton
import triton.language as tl

# platform switches on the interpreter on CPU; triton reads that when a kernel is defined, below
from tritonllm import platform  # noqa: F401
from tritonllm.kernels.attention_tile import _add_sinks, _attend_new_tile, _attend_tile, _prepare_q
from tritonllm.kernels.launch import pdl_wait


@triton.jit
def _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence i whose first query block, query_start_loc[i] // BLOCK_Q + i, is <= q_block."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _window_tiles(first_key, last_lo, base, TILE_N: tl.constexpr):
    """Tiles (of keys base + tile * TILE_N) of a query block under a sliding window: the first
    holding a key some row sees (first_key, the first row's window start), and the first whose keys
    every row's window holds (last_lo, the last row's window start); tiles in between are masked."""
    lo = tl.maximum(first_key - base, 0) // TILE_N
    return lo, tl.maximum(tl.cdiv(tl.maximum(last_lo - base, 0), TILE_N), lo)


# specialising num_seqs == 1 would make the binary search's bound a constant of another type
@triton.jit(do_not_specialize=["num_seqs", "num_q_blocks"])
def unified_attention_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    k_scale_ptr,
    v_scale_ptr,
    sinks_ptr,
    k_new_desc,
    v_new_desc,
    num_seqs,
    num_q_blocks,
    qk_scale,
    window,
    softcap2,
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
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    KV_SCALED: tl.constexpr,
    FP8_DOT_F16: tl.constexpr,
    FP8_QK: tl.constexpr,
    FP8_MAX: tl.constexpr,
    NEW_KV_DESC: tl.constexpr,
    SLIDING: tl.constexpr,
    SINKS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    # the KV heads of a query block run side by side (they read neighbouring cache rows: a 512 chunk
    # after 3584 cached took 102 us against 115 us with heads outermost on the H200); highest global
    # blocks first: within a prefill they hold the most keys (shorter tail)
    # (one grid axis: a second one would cap the query blocks at 65535)
    kv_head = tl.program_id(0) % NUM_KV_HEADS
    q_block_global = num_q_blocks - 1 - tl.program_id(0) // NUM_KV_HEADS
    seq = _find_seq(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = q_block_global - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    ctx_len = tl.load(seq_lens_ptr + seq) - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM)
    token_in_seq = q_block * BLOCK_Q + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    # rows past BLOCK_Q * GROUP exist only when GROUP does not divide BLOCK_M
    row_ok = (offs_m < BLOCK_Q * GROUP) & (token_in_seq < q_len)
    q_pos = ctx_len + token_in_seq
    token = (q_start + token_in_seq).to(tl.int64)
    q_offs = token[:, None] * stride_q_token + head[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)
    q, qk_scale = _prepare_q(q, qk_scale, k_scale_ptr, k_cache_ptr, BLOCK_M, KV_SCALED, FP8_DOT_F16, FP8_QK, FP8_MAX)

    block_table_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head_ptr = k_cache_ptr + kv_head * stride_kc_head
    v_head_ptr = v_cache_ptr + kv_head * stride_vc_head
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    first_pos = ctx_len + q_block * BLOCK_Q
    last_pos = ctx_len + tl.minimum(q_block * BLOCK_Q + BLOCK_Q, q_len) - 1
    # sliding window: row r sees keys >= win_lo[r]; no row sees keys < first_key, so tiles wholly
    # below it are never read, and tiles below the last row's window start (last_lo) are masked
    win_lo = q_pos
    first_key = 0
    last_lo = 0
    if SLIDING:
        win_lo = q_pos - window + 1
        first_key = first_pos - window + 1
        last_lo = last_pos - window + 1
    # tiles wholly below first_pos are visible to every row: no mask. With NEW_KV_DESC only the cached
    # prefix [0, ctx_len) is gathered from the paged cache; the new tokens' keys come afterwards
    if NEW_KV_DESC:
        num_full_tiles = ctx_len // TILE_N
        num_tiles = num_full_tiles
    else:
        num_full_tiles = (first_pos + 1) // TILE_N
        num_tiles = tl.cdiv(last_pos + 1, TILE_N)
    tile_start = 0
    masked_start = num_full_tiles
    if SLIDING:
        win_start, tile_start = _window_tiles(first_key, last_lo, 0, TILE_N)
        masked_start = tl.maximum(num_full_tiles, tile_start)
        for tile in range(win_start, tl.minimum(tile_start, num_tiles)):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q, q_pos, tile * TILE_N, last_pos, qk_scale, block_table_row_ptr,
                k_head_ptr, v_head_ptr, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
                offs_n, offs_d, win_lo, first_key, softcap2, BLOCK_SIZE, True, SLIDING, SOFTCAP,
            )  # fmt: skip
    for tile in range(tile_start, num_full_tiles):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, tile * TILE_N, last_pos, qk_scale, block_table_row_ptr,
            k_head_ptr, v_head_ptr, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            offs_n, offs_d, win_lo, first_key, softcap2, BLOCK_SIZE, False, SLIDING, SOFTCAP,
        )  # fmt: skip
    if NEW_KV_DESC:
        # the prefix's partial last tile sees keys < ctx_len (and, SLIDING, holds a visible key)
        partial = num_full_tiles * TILE_N < ctx_len
        if SLIDING:
            partial = partial & (ctx_len > first_key)
        if partial:
            prefix_pos = tl.minimum(q_pos, ctx_len - 1)
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q, prefix_pos, num_full_tiles * TILE_N, ctx_len - 1, qk_scale,
                block_table_row_ptr, k_head_ptr, v_head_ptr, stride_kc_block, stride_kc_slot, stride_vc_block,
                stride_vc_slot, offs_n, offs_d, win_lo, first_key, softcap2, BLOCK_SIZE, True, SLIDING, SOFTCAP,
            )  # fmt: skip
        # the new tokens' keys [ctx_len, last_pos] from the contiguous projections
        col = kv_head * HEAD_DIM
        num_new_full = (first_pos + 1 - ctx_len) // TILE_N  # every key <= first_pos
        num_new = tl.cdiv(last_pos + 1 - ctx_len, TILE_N)
        new_start = 0
        new_masked_start = num_new_full
        if SLIDING:
            new_win, new_start = _window_tiles(first_key, last_lo, ctx_len, TILE_N)
            new_masked_start = tl.maximum(num_new_full, new_start)
            for tile in range(new_win, tl.minimum(new_start, num_new)):
                acc, m_i, l_i = _attend_new_tile(
                    acc, m_i, l_i, q, q_pos, k_new_desc, v_new_desc, q_start + tile * TILE_N, col,
                    ctx_len + tile * TILE_N, qk_scale, offs_n, win_lo, softcap2, True, SLIDING, SOFTCAP,
                )  # fmt: skip
        for tile in range(new_start, num_new_full):
            acc, m_i, l_i = _attend_new_tile(
                acc, m_i, l_i, q, q_pos, k_new_desc, v_new_desc, q_start + tile * TILE_N, col,
                ctx_len + tile * TILE_N, qk_scale, offs_n, win_lo, softcap2, False, SLIDING, SOFTCAP,
            )  # fmt: skip
        for tile in range(new_masked_start, num_new):
            acc, m_i, l_i = _attend_new_tile(
                acc, m_i, l_i, q, q_pos, k_new_desc, v_new_desc, q_start + tile * TILE_N, col,
                ctx_len + tile * TILE_N, qk_scale, offs_n, win_lo, softcap2, True, SLIDING, SOFTCAP,
            )  # fmt: skip
    else:
        # the rest, up to the block's last query position, masked
        for tile in range(masked_start, num_tiles):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q, q_pos, tile * TILE_N, last_pos, qk_scale, block_table_row_ptr,
                k_head_ptr, v_head_ptr, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
                offs_n, offs_d, win_lo, first_key, softcap2, BLOCK_SIZE, True, SLIDING, SOFTCAP,
            )  # fmt: skip

    if SINKS:
        acc, l_i = _add_sinks(acc, m_i, l_i, sinks_ptr, head)
    acc = acc / l_i[:, None]
    if KV_SCALED:
        acc = acc * tl.load(v_scale_ptr)
    o_offs = token[:, None] * stride_o_token + head[:, None] * stride_o_head + offs_d[None, :]
    tl.store(out_ptr + o_offs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
