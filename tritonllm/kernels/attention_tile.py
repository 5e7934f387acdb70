"""One online-softmax step of paged attention, shared by the unified and the split-KV kernels.

Tensors it touches: K and V caches [num_blocks, block_size, num_kv_heads, head_dim] through
per-head base pointers and element strides; a block-table row [max_blocks] int32; q [BLOCK_M,
HEAD_DIM] already in registers; accumulators acc [BLOCK_M, HEAD_DIM], m_i and l_i [BLOCK_M] float32
in the log2 domain.

Optional features (constexpr flags: off, they generate no code): SLIDING masks keys below each
row's window start win_lo [BLOCK_M] (= q_pos - window + 1) and keeps masked loads at or above
first_key (blocks wholly before it may point at a block that holds anything, even NaN); SOFTCAP
caps the log2-domain scores z to softcap2 * tanh(z / softcap2), softcap2 = softcap x log2(e).
"""

import triton
import triton.language as tl

# platform switches on the interpreter on CPU; triton reads that when a kernel is defined, below
from tritonllm import platform  # noqa: F401


@triton.jit
def _attend_tile(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    start_n,
    last_pos,
    qk_scale,
    block_table_row_ptr,
    k_head_ptr,
    v_head_ptr,
    stride_kc_block,
    stride_kc_slot,
    stride_vc_block,
    stride_vc_slot,
    offs_n,
    offs_d,
    win_lo,
    first_key,
    softcap2,
    BLOCK_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    SLIDING: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One online-softmax step over keys start_n..start_n+TILE_N-1; MASKED tiles may hold keys past
    some row's causal limit or past the sequence (last_pos is the tile's last query position), or,
    SLIDING, before some row's window (first_key: the lowest key any row sees).
    qk_scale [BLOCK_M]: each row's score factor (softmax scale x log2(e) x FP8 scales)."""
    keys = start_n + offs_n
    if MASKED:
        key_ok = keys <= last_pos
        if SLIDING:
            key_ok = key_ok & (keys >= first_key)
        blocks = tl.load(block_table_row_ptr + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
    else:
        blocks = tl.load(block_table_row_ptr + keys // BLOCK_SIZE).to(tl.int64)
    k_ptrs, v_ptrs = _kv_tile_ptrs(k_head_ptr, v_head_ptr, blocks, keys % BLOCK_SIZE, stride_kc_block, stride_kc_slot,
                                   stride_vc_block, stride_vc_slot, offs_d)  # fmt: skip
    if MASKED:
        # other=0 also keeps uninitialised cache memory (NaN, inf) out of the dot products
        k = tl.load(k_ptrs, mask=key_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=key_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)

    return _softmax_step(acc, m_i, l_i, q, k, v, keys, q_pos, win_lo, qk_scale, softcap2, MASKED, SLIDING, SOFTCAP)


@triton.jit
def _kv_tile_ptrs(k_head_ptr, v_head_ptr, blocks, in_block, stride_kc_block, stride_kc_slot, stride_vc_block,
                  stride_vc_slot, offs_d):  # fmt: skip
    """Pointers of a tile's K [HEAD_DIM, TILE_N] and V [TILE_N, HEAD_DIM] in the paged caches: its keys' cache
    blocks (int64) and slots in them."""
    k_ptrs = k_head_ptr + (blocks * stride_kc_block + in_block * stride_kc_slot)[None, :] + offs_d[:, None]
    v_ptrs = v_head_ptr + (blocks * stride_vc_block + in_block * stride_vc_slot)[:, None] + offs_d[None, :]
    return k_ptrs, v_ptrs


@triton.jit
def _attend_new_tile(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    k_desc,
    v_desc,
    row,
    col,
    start_n,
    qk_scale,
    offs_n,
    win_lo,
    softcap2,
    MASKED: tl.constexpr,
    SLIDING: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One online-softmax step over keys start_n..start_n+TILE_N-1 (absolute positions) of the
    step's new tokens, read through tensor descriptors (TMA on Hopper) from the contiguous K/V
    projections [num_tokens, num_kv_heads * head_dim]: rows row.., columns col.. (the KV head).
    Rows past the sequence belong to the next one or lie outside the tensor (zeros): a MASKED tile
    drops them with the causal mask, as they sit past every query's position."""
    keys = start_n + offs_n
    k = tl.trans(k_desc.load([row, col]))
    v = v_desc.load([row, col])
    return _softmax_step(acc, m_i, l_i, q, k, v, keys, q_pos, win_lo, qk_scale, softcap2, MASKED, SLIDING, SOFTCAP)


@triton.jit
def _soft_cap(z, softcap2):
    """softcap2 * tanh(z / softcap2), through exp2 (no portable tanh): exact limits +-softcap2."""
    return softcap2 - 2.0 * softcap2 / (tl.math.exp2(z * (2.0 * 1.4426950408889634 / softcap2)) + 1.0)


@triton.jit
def _softmax_step(
    acc, m_i, l_i, q, k, v, keys, q_pos, win_lo, qk_scale, softcap2,
    MASKED: tl.constexpr, SLIDING: tl.constexpr, SOFTCAP: tl.constexpr,
):  # fmt: skip
    """The online-softmax update with k [HEAD_DIM, TILE_N] and v [TILE_N, HEAD_DIM] of keys
    `keys`; MASKED applies the causal mask keys <= q_pos (and, SLIDING, keys >= win_lo)."""
    # FP8 caches are widened to the dot dtype (q's, or float16: see _prepare_q); k_scale and q's row
    # scales are in qk_scale, folded into the exponent's multiply-add
    if q.dtype == tl.float32:
        s = tl.dot(q, k.to(q.dtype), input_precision="ieee")  # [BLOCK_M, TILE_N]
    else:
        s = tl.dot(q, k.to(q.dtype))
    if SOFTCAP:  # capped before the mask; s is then in the log2 domain already
        s = _soft_cap(s * qk_scale[:, None], softcap2)
    if MASKED:
        visible = keys[None, :] <= q_pos[:, None]
        if SLIDING:
            visible = visible & (keys[None, :] >= win_lo[:, None])
        s = tl.where(visible, s, float("-inf"))
    # every row sees key 0 in the first tile, so m_new is finite and no exp2(-inf - -inf) occurs;
    # with a window a row may see nothing in its first tiles: its maximum stays -inf, exp2 gets 0
    if SOFTCAP:
        m_new = tl.maximum(m_i, tl.max(s, 1))
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # log2 domain; qk_scale > 0
    m_use = m_new
    if SLIDING:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_use)
    if SOFTCAP:
        p = tl.math.exp2(s - m_use[:, None])
    else:
        p = tl.math.exp2(s * qk_scale[:, None] - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if q.dtype.is_fp8():  # FP8 query-key dots; probabilities and values in float16
        acc = tl.dot(p.to(tl.float16), v.to(tl.float16), acc * alpha[:, None])
    elif q.dtype == tl.float32:
        acc = tl.dot(p, v.to(q.dtype), acc * alpha[:, None], input_precision="ieee")
    else:
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _add_sinks(acc, m_i, l_i, sinks_ptr, head):
    """The final normalisation with one sink logit per head (natural log; sinks_ptr [num_heads]
    float32) in the denominator: acc / l rescaled to max(m_i, sink). Returns (acc, l)."""
    sink = tl.load(sinks_ptr + head) * 1.4426950408889634
    m = tl.maximum(m_i, sink)
    corr = tl.math.exp2(m_i - m)
    return acc * corr[:, None], l_i * corr + tl.math.exp2(sink - m)


@triton.jit
def _prepare_q(
    q,
    qk_scale,
    k_scale_ptr,
    k_cache_ptr,
    BLOCK_M: tl.constexpr,
    KV_SCALED: tl.constexpr,
    FP8_DOT_F16: tl.constexpr,
    FP8_QK: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """q in the dtype of the query-key dot, and the per-row factor of its scores (log2 domain).

    FP8 caches: k_scale joins the factor; FP8_QK quantises each query row to the cache's FP8 type
    with its own scale (amax / FP8_MAX, also in the factor) so the query-key dot runs on FP8 tensor
    cores without widening K; else FP8_DOT_F16 runs the dots in float16, K/V widened in one step."""
    scale_rows = tl.zeros([BLOCK_M], dtype=tl.float32) + qk_scale
    if KV_SCALED:
        scale_rows = scale_rows * tl.load(k_scale_ptr)
        if FP8_QK:
            q32 = q.to(tl.float32)
            row_scale = tl.maximum(tl.max(tl.abs(q32), 1), 1e-30) / FP8_MAX
            q = (q32 / row_scale[:, None]).to(k_cache_ptr.dtype.element_ty)
            scale_rows = scale_rows * row_scale
        elif FP8_DOT_F16:
            q = q.to(tl.float16)
    return q, scale_rows
