"""paged_attention's optional features (sliding window, sinks, soft-capping) in the portable Triton
kernels against the torch reference: the unified kernel (prefill chunks after cached prefixes,
decodes), its tensor-descriptor prefill path, and split-KV decode with its merge.

Batches come from test_attention.make_batch (unowned cache slots and block-table padding are NaN).
Out-of-window tests also point every block wholly before a sequence's first visible key at the NaN
block, as the engine may once it has freed them: a kernel that reads such a block instead of
skipping it returns NaN.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_attention import TOL, PagedBatch, _new_kv, make_batch

from tritonllm.kernels import attention, reference
from tritonllm.kernels.attention import AttentionTiles, paged_attention, paged_attention_with_tiles
from tritonllm.kernels.registry import KernelContext, select_kernels

TILES = AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1)
# decodes, a prefill from scratch, chunks after cached prefixes (prefix caching, chunked prefill)
Q_LENS, CTX_LENS = [1, 37, 19, 5, 1], [40, 0, 23, 30, 7]
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 32, 8


def _sinks(seed: int, num_heads: int = NUM_HEADS) -> torch.Tensor:
    """Sink logits of the scores' magnitude (a few units), one per query head."""
    return 2.0 * torch.randn(num_heads, generator=torch.Generator().manual_seed(seed))


def _scaled_q(batch: PagedBatch, factor: float) -> PagedBatch:
    """Larger queries: scores of +-10..30, where a soft cap of 5-30 bites."""
    return dataclasses.replace(batch, q=batch.q * factor)


def _drop_out_of_window_blocks(batch: PagedBatch, window: int) -> PagedBatch:
    """The batch with each sequence's blocks wholly before its first query's window pointing at the
    NaN block (the last one), as after the engine freed them."""
    tables = batch.block_tables.clone()
    poison, block_size = batch.k_cache.shape[0] - 1, batch.k_cache.shape[1]
    starts = batch.query_start_loc.tolist()
    for i, seq_len in enumerate(batch.seq_lens.tolist()):
        first_visible = seq_len - (starts[i + 1] - starts[i]) - window + 1
        tables[i, : max(first_visible, 0) // block_size] = poison
    return dataclasses.replace(batch, block_tables=tables)


# windows smaller than every context, around the chunks' lengths, equal to the longest sequence, larger
FEATURES = [
    pytest.param(dict(sliding_window=1), id="window1"),
    pytest.param(dict(sliding_window=8), id="window8"),
    pytest.param(dict(sliding_window=21), id="window21"),
    pytest.param(dict(sliding_window=53), id="window_eq_longest"),
    pytest.param(dict(sliding_window=1000), id="window_larger"),
    pytest.param(dict(sinks=_sinks(1)), id="sinks"),
    pytest.param(dict(softcap=5.0), id="softcap5"),
    pytest.param(dict(sliding_window=13, sinks=_sinks(2), softcap=30.0), id="all"),
]


@pytest.mark.parametrize("features", FEATURES)
def test_unified_kernel_matches_reference(features: dict) -> None:
    batch = _scaled_q(make_batch(Q_LENS, CTX_LENS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, seed=3), 3.0)
    expected = reference.paged_attention(*batch.args(), **features)
    if "sliding_window" in features:
        batch = _drop_out_of_window_blocks(batch, features["sliding_window"])
    out = paged_attention_with_tiles(*batch.args(), TILES, **features)
    torch.testing.assert_close(out, expected, **TOL[torch.float32])


@pytest.mark.parametrize("features", [FEATURES[1], FEATURES[2], FEATURES[-1]])
def test_new_kv_descriptor_path_matches_reference(features: dict) -> None:
    """Prefill chunks reading new K/V through tensor descriptors: windows that start in the cached
    prefix, in its partial last tile and among the new keys."""
    batch = _scaled_q(make_batch(Q_LENS, CTX_LENS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, seed=4), 3.0)
    k_new, v_new = _new_kv(batch, Q_LENS, CTX_LENS, 16 + 2 * NUM_KV_HEADS * HEAD_DIM + 32)
    expected = reference.paged_attention(*batch.args(), **features)
    batch = _drop_out_of_window_blocks(batch, features["sliding_window"])
    out = paged_attention_with_tiles(*batch.args(), TILES, new_kv_desc=True, k_new=k_new, v_new=v_new, **features)
    torch.testing.assert_close(out, expected, **TOL[torch.float32])


# decode contexts: empty, one block, odd lengths, one longer than every window
DECODE_CTX_LENS = [0, 8, 95, 250]


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("features", [FEATURES[1], FEATURES[3], FEATURES[5], FEATURES[6], FEATURES[-1]])
def test_decode_matches_reference(features: dict, num_splits: int) -> None:
    """Decode through the unified kernel (1 split) and split-KV with its merge (sinks once, there)."""
    batch = make_batch([1] * 4, DECODE_CTX_LENS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, seed=5)
    batch = _scaled_q(batch, 3.0)
    expected = reference.paged_attention(*batch.args(), **features)
    if "sliding_window" in features:
        batch = _drop_out_of_window_blocks(batch, features["sliding_window"])
    out = paged_attention_with_tiles(*batch.args(), TILES, num_splits=num_splits, **features)
    torch.testing.assert_close(out, expected, **TOL[torch.float32])


def test_a_wrong_window_or_ignored_sinks_fail() -> None:
    """The comparisons above can fail: a window off by one, or sinks dropped, are caught."""
    batch = make_batch(Q_LENS, CTX_LENS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, seed=6)
    out = paged_attention_with_tiles(*batch.args(), TILES, sliding_window=8, sinks=_sinks(3))
    expected = reference.paged_attention(*batch.args(), sliding_window=8, sinks=_sinks(3))
    torch.testing.assert_close(out, expected, **TOL[torch.float32])
    for wrong in (dict(sliding_window=9, sinks=_sinks(3)), dict(sliding_window=8)):
        assert not torch.allclose(out, reference.paged_attention(*batch.args(), **wrong), **TOL[torch.float32])


def test_split_count_follows_the_visible_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long single-sequence decode on 8 multiprocessors splits its keys; under a short window
    there is little to split (the plan is sized on min(max_seq_len, window))."""
    monkeypatch.setattr(attention, "_num_multiprocessors", lambda: 8)
    meta = make_batch([1], [999], NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE).args()[3:8]
    shape = (NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
    assert attention.plan_attention(*meta, *shape).num_splits > 2
    assert attention.plan_attention(*meta, *shape, sliding_window=64).num_splits == 2
    assert attention.plan_attention(*meta, *shape, sliding_window=32).num_splits == 1


def test_bad_feature_arguments_are_rejected() -> None:
    batch = make_batch([1], [5], NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
    with pytest.raises(ValueError, match="sliding_window 0"):
        paged_attention(*batch.args(), sliding_window=0)
    with pytest.raises(ValueError, match="sinks"):
        paged_attention(*batch.args(), sinks=torch.zeros(NUM_HEADS, dtype=torch.float16))
    with pytest.raises(ValueError, match="softcap"):
        paged_attention(*batch.args(), softcap=0.0)


def test_models_with_features_get_the_portable_kernels() -> None:
    """triton_unified declares the features; the sm90 FP8 Gluon decode does not, so it is refused for
    models that use them (auto then falls back to triton_unified)."""
    features = {"attention": frozenset({"sliding_window", "sinks", "softcap"})}
    context = KernelContext("cpu", torch.float32, torch.float32, HEAD_DIM, features=features)
    assert select_kernels({}, context).choice["attention"] == "triton_unified"
    fp8 = KernelContext("cuda", torch.bfloat16, torch.float8_e4m3fn, 128, features=features)
    with pytest.raises(ValueError, match="feature"):
        select_kernels({"attention": "triton_fp8_decode_sm90"}, fp8)


# ---- GPU: bfloat16 at Mistral/gpt-oss-like shapes against the float32 reference ------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "features",
    [dict(sliding_window=4096), dict(sliding_window=128, sinks=7), dict(softcap=30.0), dict(sinks=8)],
)
@pytest.mark.parametrize("case", ["decode", "split", "mixed", "prefill"])
def test_gpu_features_bf16(features: dict, case: str) -> None:
    from closeness import assert_close_per_row
    from test_attention import GPU_REL_RMS

    q_lens, ctx = {
        "decode": ([1] * 24, [100 * i + 7000 for i in range(24)]),
        "split": ([1], [8191]),
        "mixed": ([1] * 8 + [512, 333], [5000 + i for i in range(8)] + [3584, 0]),
        "prefill": ([4096], [0]),
    }[case]
    batch = make_batch(q_lens, ctx, 32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", seed=31)
    if "sinks" in features:  # the seed of the 32 heads' sink logits
        features = {**features, "sinks": _sinks(features["sinks"], 32).cuda()}
    as_float = dataclasses.replace(
        batch, q=batch.q.float(), k_cache=batch.k_cache.float(), v_cache=batch.v_cache.float()
    )
    expected = reference.paged_attention(*as_float.args(), **features)
    if "sliding_window" in features:
        batch = _drop_out_of_window_blocks(batch, features["sliding_window"])
    assert_close_per_row(paged_attention(*batch.args(), **features), expected, GPU_REL_RMS)
