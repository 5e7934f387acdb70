"""Prototype: FP8 decode with keys as the MMA's M dimension (swap AB), FP8 tensor cores for both dots."""
import os
import triton
import triton.language as tl
from tritonllm import platform  # noqa: F401


@triton.jit
def fp8_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr,
    qk_scale, stride_q_token, stride_q_head, stride_o_token, stride_o_head, stride_bt_seq,
    stride_kc_block, stride_kc_slot, stride_kc_head, stride_vc_block, stride_vc_slot, stride_vc_head, stride_vc_dim,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
    TILE_N: tl.constexpr, FP8_MAX: tl.constexpr, P_SCALE: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, TILE_N)
    head = kv_head * GROUP + offs_h
    row_ok = offs_h < GROUP
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_q_token + head[:, None] * stride_q_head + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(tl.float32)
    q_row_scale = tl.maximum(tl.max(tl.abs(q), 1), 1e-30) / FP8_MAX
    q8 = (q / q_row_scale[:, None]).to(k_cache_ptr.dtype.element_ty)
    qT = tl.trans(q8)  # [HEAD_DIM, BLOCK_H]
    score_scale = q_row_scale * (qk_scale * tl.load(k_scale_ptr))  # [BLOCK_H], log2 domain

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head = k_cache_ptr + kv_head * stride_kc_head
    v_head = v_cache_ptr + kv_head * stride_vc_head
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    accT = tl.zeros([HEAD_DIM, BLOCK_H], dtype=tl.float32)
    num_full = seq_len // TILE_N
    for tile in range(0, num_full):
        keys = tile * TILE_N + offs_n
        blocks = tl.load(bt_row + keys // BLOCK_SIZE).to(tl.int64)
        blocks = tl.max_constancy(blocks, BLOCK_SIZE)
        in_block = keys % BLOCK_SIZE
        k = tl.load(k_head + (blocks * stride_kc_block + in_block * stride_kc_slot)[:, None] + offs_d[None, :])
        sT = tl.dot(k, qT) * score_scale[None, :]  # [TILE_N, BLOCK_H]
        m_new = tl.maximum(m_i, tl.max(sT, 0))
        alpha = tl.math.exp2(m_i - m_new)
        pT = tl.math.exp2(sT - m_new[None, :])
        l_i = l_i * alpha + tl.sum(pT, 0)
        vT = tl.load(v_head + (blocks * stride_vc_block + in_block * stride_vc_slot)[None, :] + (offs_d * stride_vc_dim)[:, None])
        accT = tl.dot(vT, (pT * P_SCALE).to(v_cache_ptr.dtype.element_ty), accT * alpha[None, :])
        m_i = m_new
    if num_full * TILE_N < seq_len:
        keys = num_full * TILE_N + offs_n
        key_ok = keys < seq_len
        blocks = tl.load(bt_row + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        in_block = keys % BLOCK_SIZE
        k = tl.load(k_head + (blocks * stride_kc_block + in_block * stride_kc_slot)[:, None] + offs_d[None, :],
                    mask=key_ok[:, None], other=0.0)
        sT = tl.dot(k, qT) * score_scale[None, :]
        sT = tl.where(key_ok[:, None], sT, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sT, 0))
        alpha = tl.math.exp2(m_i - m_new)
        pT = tl.math.exp2(sT - m_new[None, :])
        l_i = l_i * alpha + tl.sum(pT, 0)
        vT = tl.load(v_head + (blocks * stride_vc_block + in_block * stride_vc_slot)[None, :] + (offs_d * stride_vc_dim)[:, None],
                     mask=key_ok[None, :], other=0.0)
        accT = tl.dot(vT, (pT * P_SCALE).to(v_cache_ptr.dtype.element_ty), accT * alpha[None, :])
    outT = accT * (tl.load(v_scale_ptr) / P_SCALE) / l_i[None, :]
    o_ptrs = out_ptr + seq.to(tl.int64) * stride_o_token + head[None, :] * stride_o_head + offs_d[:, None]
    tl.store(o_ptrs, outT.to(out_ptr.dtype.element_ty), mask=row_ok[None, :])


def run(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale, tile_n=128, warps=4, stages=3, out=None):
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if out is None:
        out = torch.empty_like(q)
    fp8_decode_kernel[(num_seqs, num_kv_heads)](
        out, q, k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        *k_cache.stride()[:3], *v_cache.stride(),
        GROUP=num_heads // num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_H=16, TILE_N=tile_n,
        FP8_MAX=float(torch.finfo(k_cache.dtype).max), P_SCALE=256.0, num_warps=warps, num_stages=stages)
    return out

@triton.jit
def fp8_decode_hybrid_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr,
    qk_scale, stride_q_token, stride_q_head, stride_o_token, stride_o_head, stride_bt_seq,
    stride_kc_block, stride_kc_slot, stride_kc_head, stride_vc_block, stride_vc_slot, stride_vc_head, stride_vc_dim,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
    TILE_N: tl.constexpr, FP8_MAX: tl.constexpr, P_SCALE: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, TILE_N)
    head = kv_head * GROUP + offs_h
    row_ok = offs_h < GROUP
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_q_token + head[:, None] * stride_q_head + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(tl.float32)
    q_row_scale = tl.maximum(tl.max(tl.abs(q), 1), 1e-30) / FP8_MAX
    q8 = (q / q_row_scale[:, None]).to(k_cache_ptr.dtype.element_ty)
    qT = tl.trans(q8)  # [HEAD_DIM, BLOCK_H]
    score_scale = q_row_scale * (qk_scale * tl.load(k_scale_ptr))  # [BLOCK_H], log2 domain

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head = k_cache_ptr + kv_head * stride_kc_head
    v_head = v_cache_ptr + kv_head * stride_vc_head
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    num_full = seq_len // TILE_N
    for tile in range(0, num_full):
        keys = tile * TILE_N + offs_n
        blocks = tl.load(bt_row + keys // BLOCK_SIZE).to(tl.int64)
        blocks = tl.max_constancy(blocks, BLOCK_SIZE)
        in_block = keys % BLOCK_SIZE
        k = tl.load(k_head + (blocks * stride_kc_block + in_block * stride_kc_slot)[:, None] + offs_d[None, :])
        sT = tl.dot(k, qT) * score_scale[None, :]  # [TILE_N, BLOCK_H]
        m_new = tl.maximum(m_i, tl.max(sT, 0))
        alpha = tl.math.exp2(m_i - m_new)
        pT = tl.math.exp2(sT - m_new[None, :])
        l_i = l_i * alpha + tl.sum(pT, 0)
        v = tl.load(v_head + (blocks * stride_vc_block + in_block * stride_vc_slot)[:, None] + (offs_d * stride_vc_dim)[None, :])
        acc = tl.dot(tl.trans(pT).to(tl.float16), v.to(tl.float16), acc * alpha[:, None])
        m_i = m_new
    if num_full * TILE_N < seq_len:
        keys = num_full * TILE_N + offs_n
        key_ok = keys < seq_len
        blocks = tl.load(bt_row + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        in_block = keys % BLOCK_SIZE
        k = tl.load(k_head + (blocks * stride_kc_block + in_block * stride_kc_slot)[:, None] + offs_d[None, :],
                    mask=key_ok[:, None], other=0.0)
        sT = tl.dot(k, qT) * score_scale[None, :]
        sT = tl.where(key_ok[:, None], sT, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sT, 0))
        alpha = tl.math.exp2(m_i - m_new)
        pT = tl.math.exp2(sT - m_new[None, :])
        l_i = l_i * alpha + tl.sum(pT, 0)
        v = tl.load(v_head + (blocks * stride_vc_block + in_block * stride_vc_slot)[:, None] + (offs_d * stride_vc_dim)[None, :],
                    mask=key_ok[:, None], other=0.0)
        acc = tl.dot(tl.trans(pT).to(tl.float16), v.to(tl.float16), acc * alpha[:, None])
    out = acc * tl.load(v_scale_ptr) / l_i[:, None]
    o_ptrs = out_ptr + seq.to(tl.int64) * stride_o_token + head[:, None] * stride_o_head + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])



def run_hybrid(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale, tile_n=128, warps=4, stages=3, out=None, maxnreg=None):
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if out is None:
        out = torch.empty_like(q)
    fp8_decode_hybrid_kernel[(num_seqs, num_kv_heads)](
        out, q, k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        *k_cache.stride()[:3], *v_cache.stride(),
        GROUP=num_heads // num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_H=16, TILE_N=tile_n,
        FP8_MAX=float(torch.finfo(k_cache.dtype).max), P_SCALE=1.0, num_warps=warps, num_stages=stages,
        **({} if maxnreg is None else dict(maxnreg=maxnreg)))
    return out


import torch
