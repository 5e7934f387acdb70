"""One online-softmax step of paged attention, shared by the unified and the split-KV kernels.

Tensors it touches: K and V caches [num_blocks, block_size, num_kv_heads, head_dim] through
per-head base pointers and element strides; a block-table row [max_blocks] int32; q [BLOCK_M,
HEAD_DIM] already in registers; accumulators acc [BLOCK_M, HEAD_DIM], m_i and l_i [BLOCK_M] float32
in the log2 domain.
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
    BLOCK_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One online-softmax step over keys start_n..start_n+TILE_N-1; MASKED tiles may hold keys past
    some row's causal limit or past the sequence (last_pos is the tile's last query position)."""
    keys = start_n + offs_n
    if MASKED:
        key_ok = keys <= last_pos
        blocks = tl.load(block_table_row_ptr + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
    else:
        blocks = tl.load(block_table_row_ptr + keys // BLOCK_SIZE).to(tl.int64)
    in_block = keys % BLOCK_SIZE
    k_ptrs = k_head_ptr + (blocks * stride_kc_block + in_block * stride_kc_slot)[None, :] + offs_d[:, None]
    v_ptrs = v_head_ptr + (blocks * stride_vc_block + in_block * stride_vc_slot)[:, None] + offs_d[None, :]
    if MASKED:
        # other=0 also keeps uninitialised cache memory (NaN, inf) out of the dot products
        k = tl.load(k_ptrs, mask=key_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=key_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)

    # FP8 caches are widened to q's dtype; their scales are folded into qk_scale and the epilogue
    s = tl.dot(q, k.to(q.dtype), input_precision="ieee") * qk_scale  # [BLOCK_M, TILE_N], log2 domain
    if MASKED:
        s = tl.where(keys[None, :] <= q_pos[:, None], s, float("-inf"))
    # every row sees key 0 in the first tile, so m_new is finite and no exp2(-inf - -inf) occurs
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc * alpha[:, None], input_precision="ieee")
    return acc, m_new, l_i
