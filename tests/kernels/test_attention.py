"""paged_attention (Triton) against the torch reference on ragged batches over shuffled paged caches.

Every cache slot that no sequence owns, and every padding entry of the block tables (which points
at a block of NaNs), is NaN: a kernel that reads past a sequence or past a row's causal limit
without masking returns NaN and fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from closeness import assert_close_per_row  # this folder (pytest puts it on sys.path)

from tritonllm.kernels import reference
from tritonllm.kernels.attention import AttentionTiles, paged_attention, paged_attention_with_tiles
from tritonllm.kernels.kv_cache_write import write_kv_cache

TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float16: dict(atol=2e-3, rtol=2e-3)}


@dataclass
class PagedBatch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    scale: float

    def args(self) -> tuple:
        return (
            self.q,
            self.k_cache,
            self.v_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            self.max_query_len,
            self.max_seq_len,
            self.scale,
        )


def make_block_tables(seq_lens: list[int], block_size: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """Shuffled physical blocks, 2 spare ones; padding entries point at the last block (the NaN block).
    Returns (block_tables int32 [num_seqs, max_blocks + 1], num_blocks)."""
    per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(per_seq) + 3
    poison_block = num_blocks - 1
    perm = torch.randperm(num_blocks - 1, generator=gen)
    tables = torch.full((len(seq_lens), max(per_seq) + 1), poison_block, dtype=torch.int32)
    used = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = perm[used : used + n].to(torch.int32)
        used += n
    return tables, num_blocks


def make_batch(
    q_lens: list[int],
    ctx_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> PagedBatch:
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(ctx_lens, q_lens)]
    block_tables, num_blocks = make_block_tables(seq_lens, block_size, gen)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"))
    v_cache = torch.full(shape, float("nan"))
    for i, seq_len in enumerate(seq_lens):
        pos = torch.arange(seq_len)
        blocks, offsets = block_tables[i, pos // block_size].long(), pos % block_size
        k_cache[blocks, offsets] = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
        v_cache[blocks, offsets] = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    return PagedBatch(
        q=q.to(device, dtype),
        k_cache=k_cache.to(device, dtype),
        v_cache=v_cache.to(device, dtype),
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        scale=head_dim**-0.5,
    )


# decodes (q_len 1), a prefill from scratch, chunks after cached context, odd lengths throughout
MIXED_Q_LENS = [1, 37, 1, 19, 5]
MIXED_CTX_LENS = [45, 0, 3, 26, 1]


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_mixed_batch_matches_reference(group: int, block_size: int) -> None:
    batch = make_batch(MIXED_Q_LENS, MIXED_CTX_LENS, 2 * group, 2, 64, block_size, seed=group + block_size)
    out = paged_attention(*batch.args())
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])


@pytest.mark.parametrize("head_dim", [128, 256])
def test_large_head_dims_match_reference(head_dim: int) -> None:
    batch = make_batch([1, 23, 1], [30, 0, 17], 4, 2, head_dim, 16, seed=head_dim)
    out = paged_attention(*batch.args())
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_float16_matches_reference() -> None:
    batch = make_batch(MIXED_Q_LENS, MIXED_CTX_LENS, 8, 2, 64, 16, dtype=torch.float16, seed=3)
    out = paged_attention(*batch.args())
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float16])


def test_decode_only_batch_matches_reference() -> None:
    batch = make_batch([1] * 6, [0, 1, 15, 16, 17, 70], 8, 2, 64, 16, seed=4)
    out = paged_attention(*batch.args())
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_sequence_without_new_tokens_is_skipped() -> None:
    batch = make_batch([3, 0, 1], [4, 9, 12], 4, 2, 64, 8, seed=5)
    out = paged_attention(*batch.args())
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_out_receives_the_result_in_place() -> None:
    """Piecewise graphs pass rows [:n] of a static buffer as `out` (both backends)."""
    batch = make_batch([2, 11], [5, 0], 4, 2, 64, 16, seed=8)
    expected = reference.paged_attention(*batch.args())
    for attend in (paged_attention, reference.paged_attention):
        buffer = torch.full((20, 4 * 64), float("nan"))
        out = buffer[:13].view(13, 4, 64)
        assert attend(*batch.args(), out=out) is out
        torch.testing.assert_close(out, expected, **TOL[torch.float32])
        assert buffer[13:].isnan().all()
    with pytest.raises(ValueError, match="must be a contiguous"):
        paged_attention(*batch.args(), out=torch.empty(13, 64, 4).transpose(1, 2))


@pytest.mark.parametrize(
    "block_size, tiles",
    [
        (1, AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1)),  # 16 blocks per tile
        (8, AttentionTiles(block_m=32, tile_n=64, num_warps=4, num_stages=1)),  # tile spans 8 blocks
        (64, AttentionTiles(block_m=64, tile_n=16, num_warps=4, num_stages=1)),  # tile is part of a block
        (256, AttentionTiles(block_m=16, tile_n=32, num_warps=4, num_stages=1)),
    ],
)
def test_tile_and_block_sizes_match_reference(block_size: int, tiles: AttentionTiles) -> None:
    batch = make_batch([1, 29, 2], [66, 7, 40], 4, 2, 64, block_size, seed=block_size)
    out = paged_attention_with_tiles(*batch.args(), tiles)
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_group_not_dividing_block_m_matches_reference() -> None:
    # 6 query heads over 2 KV heads: 16 rows hold 5 tokens x 3 heads and one masked row
    batch = make_batch([1, 13, 1], [20, 4, 0], 6, 2, 64, 16, seed=6)
    out = paged_attention(*batch.args())
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_written_kv_then_attention_matches_reference() -> None:
    """The layer's order: write the step's new K/V through write_kv_cache, then attend."""
    num_kv_heads, head_dim, block_size = 2, 64, 16
    batch = make_batch([1, 21, 6], [33, 0, 12], 8, num_kv_heads, head_dim, block_size, seed=7)
    gen = torch.Generator().manual_seed(8)
    num_tokens = batch.q.shape[0]
    k_new = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    v_new = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    slots = []
    starts = batch.query_start_loc.tolist()
    for i, seq_len in enumerate(batch.seq_lens.tolist()):
        q_len = starts[i + 1] - starts[i]
        for pos in range(seq_len - q_len, seq_len):
            slots.append(int(batch.block_tables[i, pos // block_size]) * block_size + pos % block_size)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)

    expected_k, expected_v = batch.k_cache.clone(), batch.v_cache.clone()
    reference.write_kv_cache(k_new, v_new, expected_k, expected_v, slot_mapping)
    write_kv_cache(k_new, v_new, batch.k_cache, batch.v_cache, slot_mapping)
    torch.testing.assert_close(batch.k_cache, expected_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(batch.v_cache, expected_v, atol=0, rtol=0, equal_nan=True)

    out = paged_attention(*batch.args())
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])


# ---- GPU: bfloat16 at Llama-3-8B shapes against the float32 reference ---------------------------

# per token, the RMS error relative to the reference's RMS (closeness.assert_close_per_row): bf16's
# P.V and output rounding stay well under 1%; a kernel that drops 128 of 8,192 keys is off by ~12%
GPU_REL_RMS = 2e-2
# FP8 K/V (and the FP8 P.V of the Hopper decode kernel): e4m3's 3 mantissa bits cost a few percent
GPU_FP8_REL_RMS = 8e-2


def _check_on_gpu(batch: PagedBatch) -> None:
    out = paged_attention(*batch.args())
    as_float = PagedBatch(
        **{**batch.__dict__, "q": batch.q.float(), "k_cache": batch.k_cache.float(), "v_cache": batch.v_cache.float()}
    )
    expected = reference.paged_attention(*as_float.args())
    assert_close_per_row(out, expected, GPU_REL_RMS)


def test_the_gpu_check_catches_a_kernel_that_drops_128_keys() -> None:
    """The GPU tests' tolerance must be able to fail: at Llama-3-8B's layout and 8k contexts, attention
    that skips the last 128 keys of each sequence (the torch reference, given seq_lens - 128) fails
    it, while the same output rounded to bfloat16 passes."""
    batch = make_batch([1, 1], [8191, 6000], 32, 8, 128, 16, seed=21)
    expected = reference.paged_attention(*batch.args())
    short = PagedBatch(**{**batch.__dict__, "seq_lens": batch.seq_lens - 128})
    with pytest.raises(AssertionError, match="RMS error"):
        assert_close_per_row(reference.paged_attention(*short.args()), expected, GPU_REL_RMS)
    assert_close_per_row(expected.to(torch.bfloat16), expected, GPU_REL_RMS)


def _gpu_batch(q_lens: list[int], ctx_lens: list[int], seed: int) -> PagedBatch:
    return make_batch(q_lens, ctx_lens, 32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", seed=seed)


@pytest.mark.gpu
def test_gpu_decode_batch_long_contexts() -> None:
    gen = torch.Generator().manual_seed(10)
    ctx = torch.randint(1, 8192, (24,), generator=gen).tolist() + [8191, 1, 16, 17]
    _check_on_gpu(_gpu_batch([1] * len(ctx), ctx, seed=10))


@pytest.mark.gpu
def test_gpu_causal_prefill_4096() -> None:
    _check_on_gpu(_gpu_batch([4096], [0], seed=11))


@pytest.mark.gpu
def test_gpu_chunk_512_after_3584_cached() -> None:
    _check_on_gpu(_gpu_batch([512], [3584], seed=12))


@pytest.mark.gpu
def test_gpu_mixed_decodes_and_chunks() -> None:
    q_lens = [1] * 20 + [512, 333, 1000]
    ctx = [100 * i + 7 for i in range(20)] + [3584, 0, 1200]
    _check_on_gpu(_gpu_batch(q_lens, ctx, seed=13))


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(28, 4, 128), (16, 8, 64), (8, 4, 256)])
def test_gpu_other_head_layouts(num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    """Qwen2.5-7B's group of 7 (rows of a tile not a multiple of the group), head_dim 64 and 256."""
    q_lens, ctx = [1] * 9 + [700, 64], [3000 + 11 * i for i in range(9)] + [0, 1500]
    for max_q in (1, None):  # a decode-only batch, then the mix
        n = 9 if max_q else len(q_lens)
        batch = make_batch(
            q_lens[:n], ctx[:n], num_heads, num_kv_heads, head_dim, 16, torch.bfloat16, "cuda", seed=head_dim
        )
        _check_on_gpu(batch)


@pytest.mark.gpu
def test_gpu_written_kv_then_attention() -> None:
    batch = _gpu_batch([1, 1, 300], [2000, 17, 700], seed=14)
    num_tokens = batch.q.shape[0]
    k_new = torch.randn(num_tokens, 8, 128, device="cuda", dtype=torch.bfloat16)
    v_new = torch.randn(num_tokens, 8, 128, device="cuda", dtype=torch.bfloat16)
    slots = []
    starts = batch.query_start_loc.tolist()
    tables = batch.block_tables.cpu()
    for i, seq_len in enumerate(batch.seq_lens.tolist()):
        q_len = starts[i + 1] - starts[i]
        slots += [int(tables[i, p // 16]) * 16 + p % 16 for p in range(seq_len - q_len, seq_len)]
    slot_mapping = torch.tensor(slots + [-1, -1], dtype=torch.int64, device="cuda")
    k_padded = torch.cat([k_new, torch.randn_like(k_new[:2])])
    v_padded = torch.cat([v_new, torch.randn_like(v_new[:2])])
    expected_k, expected_v = batch.k_cache.clone(), batch.v_cache.clone()
    reference.write_kv_cache(k_padded, v_padded, expected_k, expected_v, slot_mapping)
    write_kv_cache(k_padded, v_padded, batch.k_cache, batch.v_cache, slot_mapping)
    torch.testing.assert_close(batch.k_cache, expected_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(batch.v_cache, expected_v, atol=0, rtol=0, equal_nan=True)
    _check_on_gpu(batch)


def _new_kv(batch: PagedBatch, q_lens: list[int], ctx_lens: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's new tokens' K and V gathered from its cache, as [num_tokens, kv_heads, head_dim]
    views with row stride `width` (as the K/V slices of a fused QKV projection)."""
    block_size, kv_heads, head_dim = batch.k_cache.shape[1:]
    rows_k, rows_v = [], []
    for i, (n, ctx) in enumerate(zip(q_lens, ctx_lens)):
        pos = torch.arange(ctx, ctx + n)
        blocks, offsets = batch.block_tables[i, pos // block_size].long(), pos % block_size
        rows_k.append(batch.k_cache[blocks, offsets])
        rows_v.append(batch.v_cache[blocks, offsets])
    qkv = torch.randn(sum(q_lens), width)
    k = qkv[:, 16 : 16 + kv_heads * head_dim].view(-1, kv_heads, head_dim)
    v = qkv[:, -kv_heads * head_dim :].view(-1, kv_heads, head_dim)
    k.copy_(torch.cat(rows_k))
    v.copy_(torch.cat(rows_v))
    return k, v


def test_new_kv_through_tensor_descriptors_matches_reference() -> None:
    """Prefill chunks whose new keys/values come through tensor descriptors over strided views of
    the projections, cached prefixes (partial last tiles) gathered from the cache, and decodes."""
    q_lens, ctx_lens = [1, 37, 19, 5, 1], [40, 0, 23, 30, 7]
    batch = make_batch(q_lens, ctx_lens, 8, 2, 64, 16, seed=41)
    k_new, v_new = _new_kv(batch, q_lens, ctx_lens, 16 + 4 * 2 * 64 + 32)
    tiles = AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1)
    out = paged_attention_with_tiles(*batch.args(), tiles, new_kv_desc=True, k_new=k_new, v_new=v_new)
    expected = reference.paged_attention(*batch.args())
    torch.testing.assert_close(out, expected, **TOL[torch.float32])
    # the new K/V really are read from k_new/v_new: other values there change the result
    wrong = paged_attention_with_tiles(*batch.args(), tiles, new_kv_desc=True, k_new=k_new * 2, v_new=v_new)
    assert not torch.allclose(wrong, expected, **TOL[torch.float32])
