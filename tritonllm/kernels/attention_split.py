"""Split-KV (flash-decoding) kernels for decode batches of few sequences with long contexts.

With one query token per sequence, the unified kernel runs num_seqs x num_kv_heads programs: 8 for
a single Llama-3-8B sequence, which leaves most of a GPU idle. Here each sequence's keys are cut
into num_splits contiguous segments handled by separate programs, and a second kernel merges the
partial results with a log-sum-exp rescale. The launcher is in attention.py.

Layouts (element strides passed in; the last dim of every tensor must be contiguous):
  q, out           [num_tokens, num_heads, head_dim]; every sequence has q_len 0 or 1
  k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim] (FP8 caches: times k/v_scale)
  block_tables     [num_seqs, max_blocks] int32: physical block of each logical block
  seq_lens         [num_seqs] int32: keys of each sequence (its query is the last of them)
  query_start_loc  [num_seqs + 1] int32: cumulative q_len
  k_scale, v_scale [1] float32, read only when KV_SCALED
  partial_out      [num_seqs, num_heads, num_splits, head_dim] float32: unnormalised sum p * v
  partial_max      [num_seqs, num_heads, num_splits] float32: running max of the scores (log2 domain)
  partial_sum      [num_seqs, num_heads, num_splits] float32: sum of 2^(score - max)

Segments: a sequence's query sees keys key_lo .. seq_len - 1 (key_lo = 0, or seq_len - window
under a SLIDING window: keys before it are never read), vis_len = seq_len - key_lo of them, cut into
segments of split_len = cdiv(cdiv(vis_len, num_splits), TILE_N) * TILE_N keys (whole tiles, so only
the sequence's last tile needs a mask); segment s holds keys key_lo + s * split_len ..
min(key_lo + (s + 1) * split_len, seq_len) - 1 and may be empty for short sequences.
Both kernels derive the segments from seq_len on the device, so no host sync sizes them and any
num_splits is correct (it only changes speed).

Optional features (constexpr flags, off: no code): SLIDING (above), SOFTCAP (scores capped, see
attention_tile.py) in the split kernel; SINKS (sinks_ptr [num_heads] float32) in the merge, so each
head's sink logit enters the final denominator once.

Split kernel grid: (num_seqs, num_kv_heads, num_splits). A program holds the query rows of the GROUP
query heads sharing its KV head (padded to BLOCK_M >= 16 rows for tl.dot), so each K/V tile is read
once per KV head. Merge kernel grid: (num_seqs, num_heads).

Merge in the split kernel (MERGE): each program that wrote a partial counts its arrival on its
(sequence, KV head)'s counter (launch.arrival_counters: zeroed, and left at zero); the last of them
merges the GROUP heads and writes them, so no merge kernel follows. With QUANT as well, those mergers
count in on the sequence's counter and the last quantizes the token's whole output row for the next
linear layer (kernels/quant.py: per token, with a static scale, or per QGROUP columns), so no
quantization kernel follows either; where QGROUP divides the head size, each KV head's merger quantizes its
own heads instead, with no second arrival. Counters: [num_seqs * num_kv_heads] per KV head, then
[num_seqs] per sequence.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# platform switches on the interpreter on CPU; triton reads that when a kernel is defined, below
from tritonllm import platform  # noqa: F401
from tritonllm.kernels.attention_rope import rope_table, rotated_rows, write_newest_kv
from tritonllm.kernels.attention_tile import _attend_tile, _kv_tile_ptrs, _prepare_q, _softmax_step
from tritonllm.kernels.launch import pdl_wait
from tritonllm.kernels.quant import quantize_rows_and_store, round_and_store

_LOG2_E = tl.constexpr(1.4426950408889634)  # a kernel reads only constexpr globals


@triton.jit
def segment_len(seq_len, num_splits, TILE_N: tl.constexpr):
    """Keys per segment of a sequence: whole tiles, num_splits segments cover seq_len."""
    return tl.cdiv(tl.cdiv(seq_len, num_splits), TILE_N) * TILE_N


@triton.jit
def first_visible_key(seq_len, window, SLIDING: tl.constexpr):
    """The first key the sequence's decode query (its last position) sees."""
    if SLIDING:
        key_lo = tl.maximum(seq_len - window, 0)
    else:
        key_lo = 0
    return key_lo


# the first tile's older keys read before the PDL wait (split_kv_decode_kernel's EARLY_KV): opt-in; timed in
# session 39 (H100, Llama-3-8B FP8 batch 1: 276.8 tok/s with it, 278.8 without), so it stays off
EARLY_KV = os.environ.get("TRITONLLM_ATTN_EARLY_KV", "0") == "1"


@triton.jit
def _block_rows(block_table_row_ptr, keys, ok, BLOCK_SIZE: tl.constexpr):
    """(cache block, slot in it) of `keys` through the block table (block 0 where not ok)."""
    blocks = tl.load(block_table_row_ptr + keys // BLOCK_SIZE, mask=ok, other=0, cache_modifier=".cg").to(tl.int64)
    return blocks, keys % BLOCK_SIZE


@triton.jit(do_not_specialize=["num_splits"])
def split_kv_decode_kernel(
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
    num_splits,
    qk_scale,
    window,
    softcap2,
    stride_q_token,
    stride_q_head,
    stride_bt_seq,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    out_ptr,  # MERGE: [num_tokens, num_heads, head_dim] in q's dtype (strides below)
    q_out_ptr,  # QUANT: [num_tokens, num_heads * head_dim] contiguous, FP8 e4m3 or int8
    q_scale_ptr,  # QUANT: its scales (quant.fused_scales' layout)
    counter_ptr,  # MERGE: int32 arrival counters (module docstring)
    v_scale_ptr,
    sinks_ptr,
    num_tokens,
    stride_o_token,
    stride_o_head,
    # ROPE only (attention_rope.py; else stand-ins): positions, the cos / sin table, this step's unrotated keys and
    # values [num_tokens, num_kv_heads * head_dim] (rows stride_kn / stride_vn apart), their cache slots, the
    # per-head norms' weights and eps (QK_NORM)
    pos_ptr,
    cos_sin_ptr,
    k_new_ptr,
    v_new_ptr,
    slot_ptr,
    stride_kn,
    stride_vn,
    q_norm_ptr,
    k_norm_ptr,
    norm_eps,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    KV_SCALED: tl.constexpr,
    FP8_DOT_F16: tl.constexpr,
    FP8_QK: tl.constexpr,
    FP8_MAX: tl.constexpr,
    SLIDING: tl.constexpr,
    SOFTCAP: tl.constexpr,
    MERGE: tl.constexpr = False,
    GROUP_PAD: tl.constexpr = 1,
    SPLITS_PAD: tl.constexpr = 1,
    CHUNK: tl.constexpr = 1,
    SINKS: tl.constexpr = False,
    QUANT: tl.constexpr = False,
    ROW_PAD: tl.constexpr = 1,
    STATIC: tl.constexpr = False,
    QMAX: tl.constexpr = 1.0,
    IS_INT: tl.constexpr = False,
    MIN_EXP: tl.constexpr = 0,
    QGROUP: tl.constexpr = 0,
    EARLY_KV: tl.constexpr = False,
    ROPE: tl.constexpr = 0,
    ROT_DIM: tl.constexpr = 0,
    QK_NORM: tl.constexpr = False,
    MANTISSA_BITS: tl.constexpr = 0,
    MIN_NORMAL_EXP: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # Before the PDL wait: the step's inputs (written when the step began, at least three launches back, so done
    # once the previous kernel may let this one start; read past L1) and, EARLY_KV (opt-in, no gain when timed:
    # TRITONLLM_ATTN_EARLY_KV=1), the K of the segment's first tile that earlier steps wrote: every key but the
    # newest (last_pos), which this step's KV write - the previous kernel or the one before - stores. Those loads
    # then stream under that kernel's tail; the newest key, q, V and every later tile are read after the wait.
    q_start = tl.load(query_start_loc_ptr + seq, cache_modifier=".cg")
    q_len = tl.load(query_start_loc_ptr + seq + 1, cache_modifier=".cg") - q_start
    seq_len = tl.load(seq_lens_ptr + seq, cache_modifier=".cg")
    key_lo = first_visible_key(seq_len, window, SLIDING)
    split_len = segment_len(seq_len - key_lo, num_splits, TILE_N)
    key_start = key_lo + split * split_len
    key_end = tl.minimum(key_start + split_len, seq_len)
    last_pos = seq_len - 1
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM)
    block_table_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head_ptr = k_cache_ptr + kv_head * stride_kc_head
    v_head_ptr = v_cache_ptr + kv_head * stride_vc_head
    keys0 = key_start + offs_n
    if EARLY_KV:
        early = keys0 < tl.where(q_len > 0, tl.minimum(key_end, last_pos), 0)  # (keys0 >= 0)
        # K only: the query-key dot needs it first; V's loads, issued after the wait, overlap that dot and the
        # softmax (holding V too cost registers: 320 -> 664 bytes of stack a thread at 64-key tiles, sm90; K alone
        # 448)
        blocks0, in_block0 = _block_rows(block_table_row_ptr, keys0, early, BLOCK_SIZE)
        k_ptrs0, _ = _kv_tile_ptrs(k_head_ptr, v_head_ptr, blocks0, in_block0, stride_kc_block, stride_kc_slot,
                                   stride_vc_block, stride_vc_slot, offs_d)  # fmt: skip
        k0 = tl.load(k_ptrs0, mask=early[None, :], other=0.0)
    if ROPE:  # the query's cos / sin and its key's cache slot: step inputs, read before the wait
        cos, signed_sin, partner = rope_table(pos_ptr, cos_sin_ptr, q_start, q_len > 0, HEAD_DIM, ROT_DIM, ROPE)
        new_slot = tl.load(slot_ptr + q_start, mask=q_len > 0, other=-1, cache_modifier=".cg")
    pdl_wait(PDL)
    if (q_len == 0) | (key_start >= key_end):
        return  # the merge skips empty segments and sequences without a query

    offs_m = tl.arange(0, BLOCK_M)
    head = kv_head * GROUP + offs_m
    row_ok = offs_m < GROUP
    if ROPE:  # attention_rope.py: the segment holding the newest key writes it (and its value) first
        if (key_start <= last_pos) & (last_pos < key_end):
            write_newest_kv(
                k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, k_norm_ptr, norm_eps,
                q_start, new_slot, kv_head, stride_kn, stride_vn, stride_kc_block, stride_kc_slot, stride_kc_head,
                stride_vc_block, stride_vc_slot, stride_vc_head, cos, signed_sin, partner, BLOCK_SIZE, HEAD_DIM,
                ROT_DIM, ROPE, QK_NORM, KV_SCALED, FP8_MAX, MANTISSA_BITS, MIN_NORMAL_EXP,
            )  # fmt: skip
        tl.debug_barrier()  # every thread's part of it stored before any reads it back with its tile
        q = rotated_rows(q_ptr, q_start.to(tl.int64) * stride_q_token + head * stride_q_head, row_ok, cos, signed_sin,
                         partner, q_norm_ptr, norm_eps, HEAD_DIM, ROT_DIM, ROPE, QK_NORM)  # fmt: skip
    else:
        q_offs = q_start.to(tl.int64) * stride_q_token + head[:, None] * stride_q_head + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)
    q, qk_scale = _prepare_q(q, qk_scale, k_scale_ptr, k_cache_ptr, BLOCK_M, KV_SCALED, FP8_DOT_F16, FP8_QK, FP8_MAX)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # the decode query is the sequence's last position: it sees every key of its segments (all within
    # its window), so only the tail tile masks
    q_pos = tl.full([BLOCK_M], 0, dtype=tl.int32) + last_pos
    num_full_tiles = (key_end - key_start) // TILE_N
    first_tile = 0
    if EARLY_KV:
        # the first tile (a full one, or the segment's only, ragged one): K's early keys, the rest of K now (the
        # newest key where this segment holds it) into the same registers, and all of V; keys past the segment
        # read as zeros
        valid = (keys0 <= last_pos) & (keys0 < key_end)
        late = valid & ~early
        blocks1, _ = _block_rows(block_table_row_ptr, keys0, late, BLOCK_SIZE)
        # the newest key's K pointers from its own block-table read, V's from the merged one (deriving K's from
        # one merged read held more registers across the wait: 800 bytes of stack a thread against 448, sm90)
        k_ptrs1, _ = _kv_tile_ptrs(k_head_ptr, v_head_ptr, blocks1, in_block0, stride_kc_block, stride_kc_slot,
                                   stride_vc_block, stride_vc_slot, offs_d)  # fmt: skip
        k = tl.load(k_ptrs1, mask=late[None, :], other=k0)
        _, v_ptrs = _kv_tile_ptrs(k_head_ptr, v_head_ptr, tl.where(early, blocks0, blocks1), in_block0,
                                  stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot, offs_d)  # fmt: skip
        v = tl.load(v_ptrs, mask=valid[:, None], other=0.0)
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, q, k, v, keys0, q_pos, q_pos, qk_scale, softcap2, True, False,
                                      SOFTCAP)  # fmt: skip
        first_tile = 1
    for tile in range(first_tile, num_full_tiles):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, key_start + tile * TILE_N, last_pos, qk_scale, block_table_row_ptr,
            k_head_ptr, v_head_ptr, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            offs_n, offs_d, q_pos, 0, softcap2, BLOCK_SIZE, False, False, SOFTCAP,
        )  # fmt: skip
    tail_start = key_start + num_full_tiles * TILE_N
    if (tail_start < key_end) & ((num_full_tiles > 0) | (not EARLY_KV)):  # (EARLY_KV: the first tile, if no full one)
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, tail_start, last_pos, qk_scale, block_table_row_ptr,
            k_head_ptr, v_head_ptr, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            offs_n, offs_d, q_pos, 0, softcap2, BLOCK_SIZE, True, False, SOFTCAP,
        )  # fmt: skip

    # partial rows of (seq, head, split); num_heads = num_kv_heads * GROUP
    row = (seq * tl.num_programs(1) * GROUP + head).to(tl.int64) * num_splits + split
    tl.store(partial_max_ptr + row, m_i, mask=row_ok)
    tl.store(partial_sum_ptr + row, l_i, mask=row_ok)
    tl.store(partial_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
    if MERGE:
        _merge_in_kernel(
            out_ptr, q_out_ptr, q_scale_ptr, counter_ptr, partial_out_ptr, partial_max_ptr, partial_sum_ptr,
            v_scale_ptr, sinks_ptr, seq, kv_head, q_start, tl.cdiv(seq_len - key_lo, split_len), num_splits,
            num_tokens, stride_o_token, stride_o_head, GROUP, HEAD_DIM, GROUP_PAD, SPLITS_PAD, CHUNK, KV_SCALED,
            SINKS, QUANT, ROW_PAD, STATIC, QMAX, IS_INT, MIN_EXP, QGROUP,
        )  # fmt: skip


@triton.jit
def _merge_in_kernel(
    out_ptr, q_out_ptr, q_scale_ptr, counter_ptr, partial_out_ptr, partial_max_ptr, partial_sum_ptr, v_scale_ptr,
    sinks_ptr, seq, kv_head, token, num_used, num_splits, num_tokens, stride_o_token, stride_o_head,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
    CHUNK: tl.constexpr, KV_SCALED: tl.constexpr, SINKS: tl.constexpr, QUANT: tl.constexpr, ROW_PAD: tl.constexpr,
    STATIC: tl.constexpr, QMAX: tl.constexpr, IS_INT: tl.constexpr, MIN_EXP: tl.constexpr, QGROUP: tl.constexpr,
):  # fmt: skip
    """The split kernel's tail with MERGE: this program's arrival; the KV head's last segment merges
    its GROUP heads into out, and (QUANT) the sequence's last merger quantizes the token's row."""
    tl.debug_barrier()  # every thread's partial stored before the (releasing) arrival
    num_kv_heads = tl.num_programs(1)
    num_heads = num_kv_heads * GROUP
    head_counter = counter_ptr + seq * num_kv_heads + kv_head
    if tl.atomic_add(head_counter, 1, sem="acq_rel", scope="gpu") == num_used - 1:
        heads = kv_head * GROUP + tl.arange(0, GROUP_PAD)
        head_ok = tl.arange(0, GROUP_PAD) < GROUP
        acc = merged_heads(
            partial_out_ptr, partial_max_ptr, partial_sum_ptr, v_scale_ptr, sinks_ptr, seq, heads, head_ok, num_heads,
            num_used, num_splits, HEAD_DIM, SPLITS_PAD, CHUNK, KV_SCALED, SINKS,
        )  # fmt: skip
        offs_d = tl.arange(0, HEAD_DIM)
        HEAD_GROUPS: tl.constexpr = QUANT and QGROUP > 0 and HEAD_DIM % QGROUP == 0
        if HEAD_GROUPS:
            # groups within a head: this merger quantizes its own heads (as quant.quantize_rows does, from the
            # values rounded to out's dtype), no second arrival; the unquantized output is not stored
            G: tl.constexpr = HEAD_DIM // QGROUP
            grouped = tl.reshape(acc.to(out_ptr.dtype.element_ty).to(tl.float32), (GROUP_PAD, G, QGROUP))
            scale = tl.maximum(tl.max(tl.abs(grouped), axis=2), 1e-12) / QMAX  # [GROUP_PAD, G]
            group_ids = heads[:, None] * G + tl.arange(0, G)[None, :]
            tl.store(q_scale_ptr + group_ids * num_tokens + token, scale, mask=head_ok[:, None])
            values = tl.reshape(grouped * (1.0 / scale)[:, :, None], (GROUP_PAD, HEAD_DIM))
            q_offs = token.to(tl.int64) * (num_heads * HEAD_DIM) + heads[:, None] * HEAD_DIM + offs_d[None, :]
            round_and_store(q_out_ptr + q_offs, values, head_ok[:, None], QMAX, IS_INT, MIN_EXP)
        else:
            o_offs = token.to(tl.int64) * stride_o_token + heads[:, None] * stride_o_head + offs_d[None, :]
            tl.store(out_ptr + o_offs, acc.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])
        tl.atomic_xchg(head_counter, 0, sem="relaxed", scope="gpu")  # ready for the next launch
        if QUANT and not HEAD_GROUPS:
            tl.debug_barrier()  # the merged heads stored before the arrival
            seq_counter = counter_ptr + tl.num_programs(0) * num_kv_heads + seq
            if tl.atomic_add(seq_counter, 1, sem="acq_rel", scope="gpu") == num_kv_heads - 1:
                # the token's row (as rounded to out's dtype) quantized as quant.quantize_per_token does
                cols = tl.arange(0, ROW_PAD)
                col_ok = cols < num_heads * HEAD_DIM
                row_offs = token.to(tl.int64) * stride_o_token + (cols // HEAD_DIM) * stride_o_head + cols % HEAD_DIM
                x = tl.load(out_ptr + row_offs, mask=col_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
                rows = token.to(tl.int64) + tl.arange(0, 1)
                q_ptrs = q_out_ptr + rows[:, None] * (num_heads * HEAD_DIM) + cols[None, :]
                quantize_rows_and_store(
                    tl.reshape(x, (1, ROW_PAD)), q_ptrs, col_ok[None, :], q_scale_ptr, rows, num_tokens, STATIC, QMAX,
                    IS_INT, MIN_EXP, QGROUP,
                )  # fmt: skip
                tl.atomic_xchg(seq_counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def merged_heads(
    partial_out_ptr, partial_max_ptr, partial_sum_ptr, v_scale_ptr, sinks_ptr, seq, heads, head_ok, num_heads, num_used,
    num_splits, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr, CHUNK: tl.constexpr, KV_SCALED: tl.constexpr,
    SINKS: tl.constexpr,
):  # fmt: skip
    """The attention output, float32 [H, HEAD_DIM], of query heads `heads` [H] (head_ok: the real ones;
    padded ones give 0) of `seq`, from the partial results of its num_used non-empty segments: the
    maxima and sums of all segments at once ([H, SPLITS_PAD]), the partial outputs CHUNK segments at a
    time ([H, CHUNK, HEAD_DIM]). Loads bypass L1: other programs of the same launch may have written them."""
    offs_s = tl.arange(0, SPLITS_PAD)
    rows = (seq * num_heads + heads).to(tl.int64) * num_splits  # each head's first partial row
    used = head_ok[:, None] & (offs_s < num_used)[None, :]
    m_s = tl.load(
        partial_max_ptr + rows[:, None] + offs_s[None, :], mask=used, other=float("-inf"), cache_modifier=".cg"
    )
    m = tl.max(m_s, 1)  # finite for real heads: segment 0 always holds the first visible key
    if SINKS:  # the head's sink logit (natural log) joins the denominator once, here
        sink = tl.load(sinks_ptr + heads, mask=head_ok, other=0.0) * _LOG2_E
        m = tl.maximum(m, sink)
    m = tl.where(head_ok, m, 0.0)
    l_s = tl.load(partial_sum_ptr + rows[:, None] + offs_s[None, :], mask=used, other=0.0, cache_modifier=".cg")
    denominator = tl.sum(l_s * tl.math.exp2(m_s - m[:, None]), 1)  # unused segments weigh 0
    if SINKS:
        denominator += tl.math.exp2(sink - m)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([heads.shape[0], HEAD_DIM], dtype=tl.float32)
    for first in range(0, num_used, CHUNK):
        seg_rows = rows[:, None] + first + offs_c[None, :]  # [H, CHUNK]
        seg_ok = head_ok[:, None] & (first + offs_c < num_used)[None, :]
        weight = tl.math.exp2(
            tl.load(partial_max_ptr + seg_rows, mask=seg_ok, other=float("-inf"), cache_modifier=".cg") - m[:, None]
        )
        part = tl.load(
            partial_out_ptr + seg_rows[:, :, None] * HEAD_DIM + offs_d[None, None, :], mask=seg_ok[:, :, None], other=0.0,
            cache_modifier=".cg",
        )  # fmt: skip
        acc += tl.sum(part * weight[:, :, None], 1)
    acc = acc / tl.where(head_ok, denominator, 1.0)[:, None]
    if KV_SCALED:
        acc = acc * tl.load(v_scale_ptr)
    return acc


@triton.jit(do_not_specialize=["num_splits"])
def merge_splits_kernel(
    out_ptr,
    partial_out_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    v_scale_ptr,
    sinks_ptr,
    num_splits,
    window,
    stride_o_token,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    KV_SCALED: tl.constexpr,
    SLIDING: tl.constexpr,
    SINKS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_len == 0:
        return
    vis_len = tl.load(seq_lens_ptr + seq)
    if SLIDING:
        vis_len = vis_len - first_visible_key(vis_len, window, SLIDING)
    num_used = tl.cdiv(vis_len, segment_len(vis_len, num_splits, TILE_N))  # non-empty segments
    heads = head + tl.arange(0, 1)
    acc = merged_heads(
        partial_out_ptr, partial_max_ptr, partial_sum_ptr, v_scale_ptr, sinks_ptr, seq, heads, heads >= 0,
        tl.num_programs(1), num_used, num_splits, HEAD_DIM, SPLITS_PAD, SPLITS_PAD, KV_SCALED, SINKS,
    )  # fmt: skip
    offs_d = tl.arange(0, HEAD_DIM)
    o_offs = q_start.to(tl.int64) * stride_o_token + heads[:, None] * stride_o_head + offs_d[None, :]
    tl.store(out_ptr + o_offs, acc.to(out_ptr.dtype.element_ty))
