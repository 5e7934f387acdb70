"""Paged attention for a flat ragged batch: one "unified" flash-attention kernel.

Every sequence i owns query rows query_start_loc[i]:query_start_loc[i+1] (decode: 1 row; prefill
chunk: many) that follow ctx_len = seq_len - q_len tokens already in the cache; the new tokens' K
and V are in the cache too (write_kv_cache ran first). Query row j sits at absolute position
ctx_len + j and attends causally to cache positions 0..ctx_len + j.

Layouts (element strides passed in; the last dim of every tensor must be contiguous):
  q, out          [num_tokens, num_heads, head_dim]
  k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]; FP8 caches hold K / k_scale, V / v_scale
  block_tables    [num_seqs, max_blocks] int32: physical block of each logical block
  seq_lens        [num_seqs] int32: ctx_len + q_len
  query_start_loc [num_seqs + 1] int32: cumulative q_len
  k_scale, v_scale [1] float32 (FP8 caches only): k_scale folds into the softmax scale, v_scale into
                  the output, both read on the device (no host sync)

Work split: a program owns one KV head and a tile of BLOCK_M query rows = BLOCK_Q query tokens of
one sequence x the GROUP query heads that share that KV head (GQA). Decode thus packs the group's
heads into the M dimension of tl.dot, and each K/V tile is read once per KV head, not per query
head. The program walks the sequence's keys in tiles of TILE_N, gathering each key's physical
block through the block table (TILE_N may span several blocks or part of one). Tiles wholly below
the tile's first query position need no mask; the rest, up to its last query position, are masked.
Softmax is online in the log2 domain with float32 statistics and accumulator.

Grid: (num_tokens // BLOCK_Q + num_seqs, num_kv_heads). Sequence i's query blocks start at global
index query_start_loc[i] // BLOCK_Q + i, an upper-bounded numbering that needs no host sync; a
program finds its sequence by binary search over query_start_loc and exits if its block is empty.

Pure-decode batches with too few (sequence, KV head) pairs to fill the GPU take the split-KV path
of attention_split.py instead (choose_num_splits). Tiles and split parameters come from a table per
GPU family (ATTENTION_CONFIGS), picked at run time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# platform switches on the interpreter on CPU; triton reads that when a kernel is defined, below
from tritonllm import platform
from tritonllm.kernels.attention_split import merge_splits_kernel, split_kv_decode_kernel
from tritonllm.kernels.attention_tile import _attend_tile
from tritonllm.kernels.kv_cache_write import check_kv_scales

_num_multiprocessors = functools.cache(platform.num_multiprocessors)
_LOG2_E = 1.4426950408889634


@dataclass(frozen=True)
class AttentionTiles:
    block_m: int  # query rows per program: query tokens x query heads of one KV head; >= 16
    tile_n: int  # keys per step of the KV loop; >= 16
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class AttentionConfig:
    """Tiles and split-KV parameters of one GPU family. block_m is a minimum (raised to the GQA
    group); tile_n is for head_dim <= 128 and halves per doubling beyond, so K/V stages fit."""

    decode_few: AttentionTiles  # pure decode, < few_programs_per_sm (seq, KV head) programs per SM
    decode_many: AttentionTiles  # pure decode, more programs
    mixed: AttentionTiles  # a batch with query runs of more than 16 rows (prefill chunks)
    split: AttentionTiles  # the split-KV decode kernel
    few_programs_per_sm: int
    split_programs_per_sm: int  # split-KV: split until seqs x KV heads x splits reaches this per SM
    split_min_keys: int  # and keep at least this many keys per split
    max_splits: int


ATTENTION_CONFIGS: dict[str, AttentionConfig] = {
    # H100/H200/B200 (sm90, sm100): 228 KiB shared memory per SM. decode and mixed tiles from a sweep on
    # an H200 (bf16, 32/8 heads, head_dim 128, block 16; triton 3.6): 128-key tiles with 3 stages keep
    # more loads in flight while programs are few (32 x 8192: 267 us vs 305 us with 64 keys); 64-key
    # tiles win by ~2% once there are several programs per SM (128 x 8192: 992 us, 4.3 TB/s). Longer
    # query runs: 64 rows x 64 keys, fastest or within 1% of the best of 8 configs on a 4096 causal
    # prefill (428 us, 320 TFLOP/s), a 512 chunk after 3584 cached (115 us) and 64 decodes + two 1024
    # chunks (240 us; 128-row tiles took 300-410 us there). The split-KV entries are a guess until
    # `scripts/bench_attention.py --sweep` has run on the H200.
    "hopper": AttentionConfig(
        decode_few=AttentionTiles(block_m=16, tile_n=128, num_warps=4, num_stages=3),
        decode_many=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=2),
        mixed=AttentionTiles(block_m=64, tile_n=64, num_warps=4, num_stages=2),
        split=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=3),
        few_programs_per_sm=4,
        split_programs_per_sm=2,
        split_min_keys=256,
        max_splits=64,
    ),
    # A100 (164 KiB) and consumer Ampere/Ada/Blackwell parts (~100 KiB shared memory per SM): two stages
    # of 64-key K and V tiles (64 KiB at head_dim 128 in bf16) fit all of them. Unmeasured.
    "ampere": AttentionConfig(
        decode_few=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=2),
        decode_many=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=2),
        mixed=AttentionTiles(block_m=64, tile_n=64, num_warps=4, num_stages=2),
        split=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=2),
        few_programs_per_sm=4,
        split_programs_per_sm=2,
        split_min_keys=256,
        max_splits=64,
    ),
    # AMD CDNA (MI200/MI300, gfx9xx): 64-wide wavefronts (4 warps = 256 lanes), 64 KiB LDS per CU on
    # MI300, so one stage (no LDS multi-buffering) of 64-key tiles. Unmeasured.
    "cdna": AttentionConfig(
        decode_few=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=1),
        decode_many=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=1),
        mixed=AttentionTiles(block_m=64, tile_n=64, num_warps=4, num_stages=1),
        split=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=1),
        few_programs_per_sm=4,
        split_programs_per_sm=2,
        split_min_keys=256,
        max_splits=64,
    ),
    # Triton's interpreter (CPU): small tiles keep the tests' multi-tile paths busy; num_multiprocessors
    # is 1, so the split path is taken only for a single (sequence, KV head) pair.
    "interpreter": AttentionConfig(
        decode_few=AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1),
        decode_many=AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1),
        mixed=AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1),
        split=AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1),
        few_programs_per_sm=4,
        split_programs_per_sm=2,
        split_min_keys=32,
        max_splits=16,
    ),
}


@functools.cache
def gpu_family() -> str:
    """The ATTENTION_CONFIGS key of this machine's accelerator."""
    if not platform.is_gpu():
        return "interpreter"
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(platform.DEVICE).gcnArchName
        # RDNA (gfx10-12, 32-wide wavefronts, small LDS) takes the conservative table
        return "cdna" if arch.startswith("gfx9") else "ampere"
    major, _ = torch.cuda.get_device_capability(platform.DEVICE)
    # sm120 (consumer Blackwell) has ~100 KiB of shared memory: the Ampere table fits it
    return "hopper" if major in (9, 10) else "ampere"


def attention_config() -> AttentionConfig:
    return ATTENTION_CONFIGS[gpu_family()]


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Split-KV segments per sequence for a pure-decode batch; 1 means the unified kernel.

    Splits until num_seqs x num_kv_heads x splits programs make split_programs_per_sm waves on
    num_sms multiprocessors, keeping at least split_min_keys keys per split (shorter splits spend
    more on the merge and the per-program prologue than they gain). Sized on max_seq_len, the host's
    bound on the context, so no host sync is needed.
    """
    config = attention_config()
    programs = num_seqs * num_kv_heads
    if programs == 0 or programs >= num_sms:
        # Already a full wave: on the H200 (2026-11-29) 2 splits gave 32x1024 116 us and 32x8192
        # 269 us, no better than (or, with the merge launch, worse than) the unsplit kernel.
        return 1
    wanted = triton.cdiv(config.split_programs_per_sm * num_sms, programs)
    return max(1, min(wanted, max_seq_len // config.split_min_keys, config.max_splits))


def choose_tiles(
    max_query_len: int, group: int, head_dim: int, num_seqs: int, num_kv_heads: int, num_splits: int = 1
) -> AttentionTiles:
    """Tiles for a batch whose longest query run is max_query_len rows, GQA group `group`, from this
    GPU family's ATTENTION_CONFIGS entry. Decode-only batches use the smallest M tile tl.dot allows
    (16, or the group if larger): the work there is reading K/V."""
    config = attention_config()
    if num_splits > 1:
        base = config.split
    elif max_query_len * group <= 16:
        few = num_seqs * num_kv_heads < config.few_programs_per_sm * _num_multiprocessors()
        base = config.decode_few if few else config.decode_many
    else:
        base = config.mixed
    # K and V tiles shrink with head_dim so the pipelined stages fit in shared memory
    dim_factor = max(1, head_dim // 128)
    return AttentionTiles(
        block_m=max(base.block_m, 16, triton.next_power_of_2(group)),
        tile_n=max(16, base.tile_n // dim_factor),
        num_warps=base.num_warps,
        num_stages=base.num_stages,
    )


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


@triton.jit(do_not_specialize=["num_seqs", "num_q_blocks"])
def _paged_attention_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    k_scale_ptr,
    v_scale_ptr,
    num_seqs,
    num_q_blocks,
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
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    KV_SCALED: tl.constexpr,
):
    # highest global blocks first: within a prefill they hold the most keys (shorter tail)
    q_block_global = num_q_blocks - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
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
    if KV_SCALED:
        qk_scale = qk_scale * tl.load(k_scale_ptr)

    block_table_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head_ptr = k_cache_ptr + kv_head * stride_kc_head
    v_head_ptr = v_cache_ptr + kv_head * stride_vc_head
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    first_pos = ctx_len + q_block * BLOCK_Q
    last_pos = ctx_len + tl.minimum(q_block * BLOCK_Q + BLOCK_Q, q_len) - 1
    num_full_tiles = (first_pos + 1) // TILE_N  # every key <= first_pos: visible to every row
    num_tiles = tl.cdiv(last_pos + 1, TILE_N)
    for tile in range(0, num_full_tiles):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, tile * TILE_N, last_pos, qk_scale, block_table_row_ptr,
            k_head_ptr, v_head_ptr, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            offs_n, offs_d, BLOCK_SIZE, False,
        )  # fmt: skip
    for tile in range(num_full_tiles, num_tiles):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, tile * TILE_N, last_pos, qk_scale, block_table_row_ptr,
            k_head_ptr, v_head_ptr, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            offs_n, offs_d, BLOCK_SIZE, True,
        )  # fmt: skip

    acc = acc / l_i[:, None]
    if KV_SCALED:
        acc = acc * tl.load(v_scale_ptr)
    o_offs = token[:, None] * stride_o_token + head[:, None] * stride_o_head + offs_d[None, :]
    tl.store(out_ptr + o_offs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a flat ragged batch over the paged KV cache.

    q [num_tokens, num_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads, head_dim];
    block_tables [num_seqs, max_blocks] int32; seq_lens [num_seqs] (ctx_len + q_len);
    query_start_loc [num_seqs + 1]. Query row j of sequence i sits at absolute position
    ctx_len + j and attends to cache positions 0..ctx_len + j. Query head h reads KV head
    h // (num_heads // num_kv_heads). FP8 caches hold K / k_scale and V / v_scale (see
    write_kv_cache): their values are multiplied by the scales; other caches ignore them.
    Returns [num_tokens, num_heads, head_dim] in q's dtype.
    """
    num_seqs, num_kv_heads = seq_lens.shape[0], k_cache.shape[2]
    num_splits = 1
    if max_query_len == 1:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, _num_multiprocessors())
    group = q.shape[1] // num_kv_heads
    tiles = choose_tiles(max_query_len, group, q.shape[2], num_seqs, num_kv_heads, num_splits)
    return paged_attention_with_tiles(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len, scale, tiles,
        k_scale=k_scale, v_scale=v_scale, num_splits=num_splits,
    )  # fmt: skip


def paged_attention_with_tiles(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    tiles: AttentionTiles,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int = 1,
) -> torch.Tensor:
    """`paged_attention` with explicit tiles and split count (tests and sweeps); same contract
    otherwise. num_splits > 1 takes the split-KV path, which serves pure-decode batches only
    (max_query_len <= 1); tiles.block_m then counts the query heads of one KV head."""
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    group = num_heads // num_kv_heads
    if head_dim < 16 or head_dim & (head_dim - 1) or k_cache.shape[3] != head_dim:
        raise ValueError(f"head_dim {head_dim} (cache {k_cache.shape[3]}) must be a power of two >= 16")
    if block_size & (block_size - 1):
        raise ValueError(f"block_size {block_size} must be a power of two")
    if tiles.block_m < group or tiles.block_m & (tiles.block_m - 1) or tiles.tile_n & (tiles.tile_n - 1):
        raise ValueError(f"{tiles}: block_m, tile_n must be powers of two, block_m >= group {group}")
    if num_splits < 1 or (num_splits > 1 and max_query_len > 1):
        raise ValueError(
            f"num_splits {num_splits} with max_query_len {max_query_len}: split-KV serves pure-decode "
            "batches (max_query_len 1); use num_splits=1 for batches with prefill chunks"
        )
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        if t.stride(-1) != 1:
            raise ValueError(f"paged_attention: {name} must be contiguous in its last dim (stride {t.stride()})")
    kv_scaled = check_kv_scales(k_cache, v_cache, k_scale, v_scale, "paged_attention")
    if not kv_scaled:
        k_scale = v_scale = None
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if num_splits > 1:
        _launch_split_kv(out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, tiles,
                         k_scale, v_scale, num_splits)  # fmt: skip
        return out

    block_q = tiles.block_m // group
    num_q_blocks = num_tokens // block_q + num_seqs
    _paged_attention_kernel[(num_q_blocks, num_kv_heads)](
        out,
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        k_scale,
        v_scale,
        num_seqs,
        num_q_blocks,
        scale * _LOG2_E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        GROUP=group,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_M=tiles.block_m,
        BLOCK_Q=block_q,
        TILE_N=tiles.tile_n,
        KV_SCALED=kv_scaled,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out


def _launch_split_kv(
    out: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    tiles: AttentionTiles,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    num_splits: int,
) -> None:
    """Split-KV decode (attention_split.py): partial results per segment, then their merge into out."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_seqs, num_kv_heads = seq_lens.shape[0], k_cache.shape[2]
    kv_scaled = k_scale is not None
    partial_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    partial_max = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
    partial_sum = torch.empty_like(partial_max)
    split_kv_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        partial_out,
        partial_max,
        partial_sum,
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        k_scale,
        num_splits,
        scale * _LOG2_E,
        q.stride(0),
        q.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        GROUP=num_heads // num_kv_heads,
        BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_M=tiles.block_m,
        TILE_N=tiles.tile_n,
        KV_SCALED=kv_scaled,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    merge_splits_kernel[(num_seqs, num_heads)](
        out,
        partial_out,
        partial_max,
        partial_sum,
        seq_lens,
        query_start_loc,
        v_scale,
        num_splits,
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        TILE_N=tiles.tile_n,
        KV_SCALED=kv_scaled,
        num_warps=4,
    )
