"""Split-KV decode, FP8 KV caches and the per-GPU attention configs.

Batches come from test_attention.make_batch: unowned cache slots and block-table padding are NaN,
so reading past a sequence without a mask fails. The split path is forced through
paged_attention_with_tiles(num_splits=...) at small grids; the GPU tests run it at real shapes.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from closeness import assert_close_per_row  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from test_attention import GPU_FP8_REL_RMS, GPU_REL_RMS, TOL, PagedBatch, make_batch

from tritonllm import platform
from tritonllm.kernels import attention, attention_split, launch, quant, reference
from tritonllm.kernels.attention import (
    ATTENTION_CONFIGS,
    choose_num_splits,
    choose_tiles,
    paged_attention,
    paged_attention_with_tiles,
)
from tritonllm.kernels.kv_cache_write import write_kv_cache
from tritonllm.kernels.quant_formats import OutputQuant, QuantizedActivation

FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def _split(batch: PagedBatch, num_splits: int, **scales: torch.Tensor) -> torch.Tensor:
    group = batch.q.shape[1] // batch.k_cache.shape[2]
    num_seqs, num_kv_heads = batch.seq_lens.shape[0], batch.k_cache.shape[2]
    tiles = choose_tiles(1, group, batch.q.shape[2], num_seqs, num_kv_heads, num_splits)
    return paged_attention_with_tiles(*batch.args(), tiles, num_splits=num_splits, **scales)


def _decode_batch(ctx_lens: list[int], group: int, head_dim: int, block_size: int, **kw) -> PagedBatch:
    return make_batch([1] * len(ctx_lens), ctx_lens, 2 * group, 2, head_dim, block_size, **kw)


# ragged decode contexts: empty, exactly one block, odd lengths, one long sequence
DECODE_CTX_LENS = [0, 16, 95, 250, 63]


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size, num_splits", [(8, 3), (16, 4), (32, 7)])
def test_split_kv_decode_matches_reference(group: int, block_size: int, num_splits: int) -> None:
    batch = _decode_batch(DECODE_CTX_LENS, group, 64, block_size, seed=group * block_size)
    out = _split(batch, num_splits)
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])


@pytest.mark.parametrize("group, block_size, num_splits", [(1, 8, 3), (4, 16, 4), (2, 32, 7), (2, 8, 16)])
def test_split_kv_early_keys_match_reference(group: int, block_size: int, num_splits: int, monkeypatch) -> None:
    """TRITONLLM_ATTN_EARLY_KV=1: each segment's first tile of K read before the PDL wait but for the newest key
    (read after it), the tile taken out of the loop: ragged contexts, empty segments, a first tile that is the
    segment's only (ragged) one, sequences without a query."""
    monkeypatch.setattr(attention_split, "EARLY_KV", True)
    batch = _decode_batch(DECODE_CTX_LENS + [1, 2, 17], group, 64, block_size, seed=group + block_size)
    torch.testing.assert_close(
        _split(batch, num_splits), reference.paged_attention(*batch.args()), **TOL[torch.float32]
    )
    batch = make_batch([1, 0, 1], [70, 12, 33], 2 * group, 2, 64, block_size, seed=24)
    torch.testing.assert_close(
        _split(batch, num_splits), reference.paged_attention(*batch.args()), **TOL[torch.float32]
    )


def test_split_kv_head_dim_128_matches_reference() -> None:
    batch = _decode_batch([300, 7, 129], 2, 128, 16, seed=21)
    torch.testing.assert_close(_split(batch, 5), reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_split_kv_long_context_matches_reference() -> None:
    """~1000 keys in 6 segments of 11 tiles each, and a sequence that leaves the last segment short."""
    batch = _decode_batch([1000, 333], 2, 64, 16, seed=28)
    torch.testing.assert_close(_split(batch, 6), reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_split_kv_float16_matches_reference() -> None:
    batch = _decode_batch(DECODE_CTX_LENS, 4, 64, 16, dtype=torch.float16, seed=22)
    out = _split(batch, 4)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float16])


def test_split_kv_more_splits_than_tiles_leaves_empty_segments() -> None:
    """16 splits of sequences of 1 to 40 keys: most segments are empty and must not count."""
    batch = _decode_batch([0, 5, 39], 2, 64, 8, seed=23)
    torch.testing.assert_close(_split(batch, 16), reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_split_kv_skips_sequences_without_query() -> None:
    batch = make_batch([1, 0, 1], [70, 12, 33], 4, 2, 64, 16, seed=24)
    out = _split(batch, 3)
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_split_kv_group_not_dividing_block_m_matches_reference() -> None:
    # 6 query heads over 2 KV heads: 16 rows hold the group of 3 and 13 masked rows
    batch = make_batch([1, 1, 1], [80, 3, 41], 6, 2, 64, 16, seed=25)
    torch.testing.assert_close(_split(batch, 3), reference.paged_attention(*batch.args()), **TOL[torch.float32])


def test_split_kv_rejects_prefill_chunks() -> None:
    batch = make_batch([1, 4], [10, 3], 4, 2, 64, 16, seed=26)
    with pytest.raises(ValueError, match="pure-decode"):
        _split(batch, 2)


def test_single_sequence_decode_takes_split_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """One sequence with one KV head is too few programs for a GPU of 8 multiprocessors."""
    monkeypatch.setattr(attention, "_num_multiprocessors", lambda: 8)
    batch = make_batch([1], [150], 4, 1, 64, 16, seed=27)
    plan = attention.plan_attention(*batch.args()[3:8], 4, 1, 64, 16)
    assert plan.num_splits > 1
    out = paged_attention(*batch.args(), plan=plan)
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), **TOL[torch.float32])
    # the plan serves every layer of the step: a second layer's caches through the same plan
    layer2 = (torch.randn_like(batch.q), batch.k_cache * 0.5, -batch.v_cache, *batch.args()[3:])
    out = paged_attention(*layer2, plan=plan)
    expected = reference.paged_attention(*layer2)
    torch.testing.assert_close(out, expected, **TOL[torch.float32])


@pytest.mark.parametrize(
    "num_seqs, max_seq_len, expected",
    [
        (1, 8192, 33),
        (1, 1024, 32),
        (1, 520, 16),
        (4, 640, 9),
        (4, 8192, 9),
        (16, 8192, 3),
        (32, 8192, 1),
        (128, 8192, 1),
        (1, 40, 1),
        (0, 100, 1),
    ],
)
def test_choose_num_splits_on_h200(
    monkeypatch: pytest.MonkeyPatch, num_seqs: int, max_seq_len: int, expected: int
) -> None:
    """Hopper table, 132 SMs, 8 KV heads: ~2 waves of programs, >= 32 keys a split, none once
    the unsplit grid fills a wave."""
    monkeypatch.setattr(attention, "attention_config", lambda: ATTENTION_CONFIGS["hopper"])
    assert choose_num_splits(num_seqs, 8, max_seq_len, 132) == expected


@pytest.mark.parametrize("family", sorted(ATTENTION_CONFIGS))
def test_attention_configs_are_launchable(family: str) -> None:
    config = ATTENTION_CONFIGS[family]
    for field in dataclasses.fields(config):
        tiles = getattr(config, field.name)
        if isinstance(tiles, bool):
            continue
        if isinstance(tiles, int):
            assert tiles >= 1, field.name
            continue
        for size in (tiles.block_m, tiles.tile_n):
            assert size >= 16 and size & (size - 1) == 0, (family, field.name, tiles)
        assert tiles.num_warps in (1, 2, 4, 8, 16) and tiles.num_stages >= 1


@pytest.mark.skipif(platform.is_gpu(), reason="the interpreter's table")
def test_cpu_uses_interpreter_tiles() -> None:
    assert attention.gpu_family() == "interpreter"
    assert choose_tiles(1, 4, 256, 3, 2) == ATTENTION_CONFIGS["interpreter"].decode_few


# ---- the merge, and o_proj's input quantization, in the split kernel ---------------------------


class _CountingLauncher:
    """A kernels.launch.Launcher stand-in that counts its launches."""

    def __init__(self, launcher) -> None:
        self.launcher, self.launches = launcher, 0

    def __call__(self, *args, **kwargs) -> None:
        self.launches += 1
        self.launcher(*args, **kwargs)


def _spies(monkeypatch: pytest.MonkeyPatch) -> tuple:
    """Launch counters of the merge kernel and the two activation-quantization kernels."""
    merge = _CountingLauncher(attention._MERGE)
    monkeypatch.setattr(attention, "_MERGE", merge)
    spies = [merge]
    for name in ("_quant_token_kernel", "_quant_group_kernel"):
        spies.append(LaunchSpy.install(monkeypatch, quant, name))
    return tuple(spies)


def _counters_at_zero() -> bool:
    return not launch.arrival_counters(platform.DEVICE).any()


@pytest.mark.parametrize("sinks", [False, True])
def test_merge_in_split_kernel_matches_merge_kernel(monkeypatch: pytest.MonkeyPatch, sinks: bool) -> None:
    """The split kernel's last program per KV head merges its heads (no merge launch), as the merge
    kernel does: a sequence without a query, one of a single key, segments left empty."""
    merge, _, _ = _spies(monkeypatch)
    batch = make_batch([1, 0, 1, 1], [300, 12, 0, 95], 8, 2, 64, 16, seed=40)
    features = (
        {"sinks": torch.randn(8, generator=torch.Generator().manual_seed(41)).to(platform.DEVICE)} if sinks else {}
    )
    tiles = choose_tiles(1, 4, 64, 4, 2, 7)
    fused = paged_attention_with_tiles(*batch.args(), tiles, num_splits=7, merge_in_kernel=True, **features)
    assert merge.launches == 0 and _counters_at_zero()
    separate = paged_attention_with_tiles(*batch.args(), tiles, num_splits=7, merge_in_kernel=False, **features)
    assert merge.launches == 1
    torch.testing.assert_close(fused, separate, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused, reference.paged_attention(*batch.args(), **features), **TOL[torch.float32])


QUANTS = {  # (dtype, static scale, group, head size)
    "fp8_token": (FP8_DTYPES[0], None, 0, 64),
    "fp8_static": (FP8_DTYPES[0], 0.02, 0, 64),
    "fp8_group": (FP8_DTYPES[0], None, 128, 64),  # groups across heads: the sequence's last merger quantizes
    "fp8_group_per_head": (FP8_DTYPES[0], None, 128, 128),  # a group a head: each KV head's merger quantizes
    "int8_token": (torch.int8, None, 0, 64),
}


@pytest.mark.parametrize("case", sorted(QUANTS))
def test_split_kernel_quantizes_the_output(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """With the merge in the split kernel, the sequence's last merger also quantizes its token's row for
    o_proj (no merge or quantization launch), or, with groups within a head, each KV head's merger its own
    heads: the same values and scales as quantizing the merged output afterwards (the unfused path, which
    launches both), and close to the reference's."""
    dtype, static, group, head_dim = QUANTS[case]
    quantize = OutputQuant(dtype, None if static is None else torch.tensor([static], device=platform.DEVICE), group)
    merge, token, per_group = _spies(monkeypatch)
    batch = make_batch([1, 1, 0, 1], [250, 0, 40, 77], 8, 2, head_dim, 16, seed=42)
    tiles = choose_tiles(1, 4, head_dim, 4, 2, 5)
    got = paged_attention_with_tiles(*batch.args(), tiles, num_splits=5, quantize=quantize)
    assert isinstance(got, QuantizedActivation) and got.data.shape == (3, 8 * head_dim) and got.data.dtype == dtype
    assert merge.launches == token.launches == per_group.launches == 0 and _counters_at_zero()
    unfused = paged_attention_with_tiles(*batch.args(), tiles, num_splits=5, merge_in_kernel=False, quantize=quantize)
    assert merge.launches == 1 and token.launches + per_group.launches == 1
    torch.testing.assert_close(got.scale, unfused.scale, rtol=1e-5, atol=0)
    assert (got.data.float() != unfused.data.float()).float().mean() < 0.01
    expected = reference.paged_attention(*batch.args(), quantize=quantize)
    torch.testing.assert_close(got.scale, expected.scale, rtol=1e-5, atol=0)
    assert (got.data.float() != expected.data.float()).float().mean() < 0.01
    if static is not None:
        assert got.scale is quantize.static_scale


def test_split_kernel_quantization_is_checked() -> None:
    """The comparison above catches a wrong scale: the output quantized with the wrong static scale
    differs from the per-token one."""
    batch = make_batch([1, 1], [250, 77], 8, 2, 64, 16, seed=43)
    tiles = choose_tiles(1, 4, 64, 2, 2, 5)
    per_token = paged_attention_with_tiles(*batch.args(), tiles, num_splits=5, quantize=OutputQuant(FP8_DTYPES[0]))
    wrong = torch.tensor([1.0], device=platform.DEVICE)
    static = paged_attention_with_tiles(
        *batch.args(), tiles, num_splits=5, quantize=OutputQuant(FP8_DTYPES[0], wrong)
    )  # fmt: skip
    assert (per_token.data.float() != static.data.float()).float().mean() > 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("ctx_lens", [[600], [8191], [3000, 17, 900, 5000]], ids=["one", "long", "four"])
def test_gpu_merge_and_quantization_in_split_kernel(ctx_lens: list[int]) -> None:
    """Llama-3-8B heads in bf16, the engine's split counts: the split kernel's merge (and its FP8
    quantization of each token's row) against the merge and quantization kernels, and both against the
    float32 reference; the arrival counters back at zero."""
    batch = make_batch([1] * len(ctx_lens), ctx_lens, 32, 8, 128, 16, dtype=torch.bfloat16, device="cuda", seed=45)
    as_float = dataclasses.replace(
        batch, q=batch.q.float(), k_cache=batch.k_cache.float(), v_cache=batch.v_cache.float()
    )
    expected = reference.paged_attention(*as_float.args()).reshape(len(ctx_lens), -1)
    plan = attention.plan_attention(*batch.args()[3:8], 32, 8, 128, 16)
    assert plan.num_splits > 1 and plan.counters is not None
    fused = paged_attention(*batch.args(), plan=plan).reshape(len(ctx_lens), -1).clone()
    unfused = attention.plan_attention(*batch.args()[3:8], 32, 8, 128, 16, merge_in_kernel=False)
    separate = paged_attention(*batch.args(), plan=unfused).reshape(len(ctx_lens), -1)
    assert_close_per_row(fused.float(), expected, GPU_REL_RMS)
    assert (fused.float() - separate.float()).abs().max() <= 2e-2 * separate.float().abs().max()
    for quantize in (OutputQuant(torch.float8_e4m3fn), OutputQuant(torch.float8_e4m3fn, None, 128)):
        got = paged_attention(*batch.args(), plan=plan, quantize=quantize)
        ref = paged_attention(*batch.args(), plan=unfused, quantize=quantize)
        assert launch.arrival_counters(batch.q.device).sum() == 0
        torch.testing.assert_close(got.scale, ref.scale, rtol=2e-2, atol=0)
        scale = got.scale.repeat_interleave(128, 1) if quantize.group else got.scale
        assert_close_per_row(got.data.float() * scale, expected, 0.05)  # e4m3: 3 mantissa bits
        assert (got.data.float() != ref.data.float()).float().mean() < 0.02


def test_merge_in_kernel_needs_a_split_plan() -> None:
    batch = make_batch([1], [50], 4, 1, 64, 16, seed=44)
    with pytest.raises(ValueError, match="merge_in_kernel=True"):
        paged_attention_with_tiles(*batch.args(), choose_tiles(1, 4, 64, 1, 1), num_splits=1, merge_in_kernel=True)


# ---- FP8 KV caches ------------------------------------------------------------------------------


def _quantized(batch: PagedBatch, dtype: torch.dtype) -> tuple[PagedBatch, torch.Tensor, torch.Tensor]:
    """The batch with its caches written to `dtype` through write_kv_cache, per-tensor scales
    amax / fp8_max (the NaN poison of unowned slots stays NaN)."""
    fp8_max = torch.finfo(dtype).max
    k_scale = (batch.k_cache.nan_to_num(0).abs().amax() / fp8_max).reshape(1)
    v_scale = (batch.v_cache.nan_to_num(0).abs().amax() / fp8_max).reshape(1)
    caches = []
    for cache, scale in ((batch.k_cache, k_scale), (batch.v_cache, v_scale)):
        rows = cache.reshape(-1, *cache.shape[2:])
        out = torch.full(cache.shape, float("nan")).to(dtype)
        owned = ~rows.isnan().any(-1).any(-1)
        slots = torch.nonzero(owned).flatten()
        write_kv_cache(rows[owned], rows[owned], out, out, slots, k_scale=scale, v_scale=scale)
        caches.append(out)
    return dataclasses.replace(batch, k_cache=caches[0], v_cache=caches[1]), k_scale, v_scale


@pytest.mark.parametrize("dtype", FP8_DTYPES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_fp8_cache_matches_reference(dtype: torch.dtype, num_splits: int) -> None:
    """The kernel against the reference on the same FP8 cache: only float32 rounding differs."""
    q_lens = [1] * 4 if num_splits > 1 else [1, 23, 1, 6]
    batch, k_scale, v_scale = _quantized(make_batch(q_lens, [90, 0, 35, 12], 8, 2, 64, 16, seed=30), dtype)
    out = _split(batch, num_splits, k_scale=k_scale, v_scale=v_scale)
    expected = reference.paged_attention(*batch.args(), k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(out, expected, **TOL[torch.float32])


@pytest.mark.parametrize("num_splits", [1, 4])
def test_fp8_cache_float16_dots_match_reference(num_splits: int) -> None:
    """The float16-dot path GPUs take for a bf16 q (forced here for a float32 q): q rounds to
    float16 once, so the result is within float16 rounding of the reference."""
    q_lens = [1] * 4 if num_splits > 1 else [1, 23, 1, 6]
    batch, k_scale, v_scale = _quantized(make_batch(q_lens, [90, 0, 35, 12], 8, 2, 64, 16, seed=31), FP8_DTYPES[0])
    group = batch.q.shape[1] // batch.k_cache.shape[2]
    tiles = choose_tiles(max(q_lens), group, 64, 4, 2, num_splits)
    out = paged_attention_with_tiles(*batch.args(), tiles, num_splits=num_splits, k_scale=k_scale,
                                     v_scale=v_scale, fp8_dot_f16=True)  # fmt: skip
    expected = reference.paged_attention(*batch.args(), k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(out, expected, **TOL[torch.float16])
    exact = paged_attention_with_tiles(*batch.args(), tiles, num_splits=num_splits, k_scale=k_scale,
                                       v_scale=v_scale, fp8_dot_f16=False)  # fmt: skip
    assert (out - exact).abs().max() > 0  # the float16 path really ran


# e4m3 keeps 3 mantissa bits (relative rounding error <= 1/16). Unit-normal K and V with amax
# scales, on CPU: max error 0.10-0.13 and mean 0.012 over 4 seeds, for |out| averaging 0.4
FP8_ACCURACY = dict(max_abs=0.25, mean_abs=0.03)


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_cache_attention_close_to_float32_cache(dtype: torch.dtype) -> None:
    full = make_batch([1, 17, 1, 1], [120, 0, 8, 60], 8, 2, 64, 16, seed=31)
    batch, k_scale, v_scale = _quantized(full, dtype)
    error = (paged_attention(*batch.args(), k_scale=k_scale, v_scale=v_scale) - paged_attention(*full.args())).abs()
    assert error.max() <= FP8_ACCURACY["max_abs"] and error.mean() <= FP8_ACCURACY["mean_abs"], (
        error.max(),
        error.mean(),
    )


@pytest.mark.parametrize("num_splits", [1, 3])
def test_fp8_query_key_dot_close_to_float32_cache(num_splits: int) -> None:
    """fp8_qk (q quantised per row to FP8 for the query-key dot) stays within the FP8 budget."""
    q_lens = [1] * 4 if num_splits > 1 else [1, 17, 1, 1]
    full = make_batch(q_lens, [120, 9, 8, 60], 8, 2, 64, 16, seed=34)
    batch, k_scale, v_scale = _quantized(full, torch.float8_e4m3fn)
    group = 4
    tiles = choose_tiles(max(q_lens), group, 64, 4, 2, num_splits)
    out = paged_attention_with_tiles(*batch.args(), tiles, num_splits=num_splits, k_scale=k_scale, v_scale=v_scale,
                                     fp8_qk=True)  # fmt: skip
    error = (out - paged_attention(*full.args())).abs()
    assert error.max() <= FP8_ACCURACY["max_abs"] and error.mean() <= FP8_ACCURACY["mean_abs"], (
        error.max(),
        error.mean(),
    )


def test_fp8_cache_without_scales_is_rejected() -> None:
    batch, k_scale, _ = _quantized(make_batch([1], [20], 4, 2, 64, 16, seed=32), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="v_scale"):
        paged_attention(*batch.args(), k_scale=k_scale)


def test_scales_are_ignored_for_float_caches() -> None:
    batch = make_batch([1, 9], [30, 4], 4, 2, 64, 16, seed=33)
    scaled = paged_attention(*batch.args(), k_scale=torch.full((1,), 3.0), v_scale=torch.full((1,), 5.0))
    torch.testing.assert_close(scaled, paged_attention(*batch.args()), atol=0, rtol=0)


# ---- GPU: bfloat16 and FP8 at Llama-3-8B shapes against the float32 reference ---------------------


def _check_on_gpu(batch: PagedBatch, num_splits: int | None, **scales: torch.Tensor) -> None:
    out = paged_attention(*batch.args(), **scales) if num_splits is None else _split(batch, num_splits, **scales)
    as_float = dataclasses.replace(batch, q=batch.q.float())
    if batch.k_cache.dtype == torch.bfloat16:
        as_float = dataclasses.replace(as_float, k_cache=batch.k_cache.float(), v_cache=batch.v_cache.float())
    expected = reference.paged_attention(*as_float.args(), **scales)
    assert_close_per_row(out, expected, GPU_REL_RMS if batch.k_cache.dtype == torch.bfloat16 else GPU_FP8_REL_RMS)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 2, 13, 64])
def test_gpu_split_kv_long_single_sequence(num_splits: int | None) -> None:
    batch = make_batch([1], [8191], 32, 8, 128, 16, torch.bfloat16, "cuda", seed=40)
    if num_splits is None:  # the default path must choose to split this one
        assert choose_num_splits(1, 8, batch.max_seq_len, platform.num_multiprocessors()) > 1
    _check_on_gpu(batch, num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [4, 32])
def test_gpu_split_kv_ragged_contexts(num_splits: int) -> None:
    ctx = [8000, 1, 16, 17, 4095, 300, 2047]
    _check_on_gpu(make_batch([1] * len(ctx), ctx, 32, 8, 128, 16, torch.bfloat16, "cuda", seed=41), num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, block_size",
    [(28, 4, 128, 16), (16, 8, 64, 32), (8, 4, 256, 8), (32, 32, 128, 16)],
)
def test_gpu_split_kv_other_head_layouts(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int) -> None:
    """Qwen2.5-7B's group of 7, head_dim 64 and 256, MHA (group 1), block sizes 8 and 32."""
    ctx = [5000, 3, 1234]
    batch = make_batch([1] * 3, ctx, num_heads, num_kv_heads, head_dim, block_size, torch.bfloat16, "cuda", seed=42)
    _check_on_gpu(batch, 8)


def _gpu_fp8_batch(
    q_lens: list[int],
    ctx_lens: list[int],
    seed: int,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    device: str = "cuda",
) -> tuple[PagedBatch, PagedBatch, torch.Tensor, torch.Tensor]:
    """A bf16 batch and the same batch with its caches rewritten as FP8 by write_kv_cache (the NaN
    poison of unowned slots kept): (bf16, fp8, k_scale, v_scale)."""
    dtype = platform.fp8_e4m3_dtype()
    bf16 = make_batch(q_lens, ctx_lens, num_heads, num_kv_heads, head_dim, block_size, torch.bfloat16, device, seed)
    fp8_max = torch.finfo(dtype).max
    scales = [(c.nan_to_num(0).float().abs().amax() / fp8_max).reshape(1) for c in (bf16.k_cache, bf16.v_cache)]
    k8 = torch.full(bf16.k_cache.shape, float("nan"), device=device).to(dtype)
    v8 = torch.full(bf16.v_cache.shape, float("nan"), device=device).to(dtype)
    rows_k = bf16.k_cache.reshape(-1, num_kv_heads, head_dim)
    rows_v = bf16.v_cache.reshape(-1, num_kv_heads, head_dim)
    slots = torch.nonzero(~rows_k.isnan().any(-1).any(-1)).flatten()
    write_kv_cache(rows_k[slots], rows_v[slots], k8, v8, slots, k_scale=scales[0], v_scale=scales[1])
    return bf16, dataclasses.replace(bf16, k_cache=k8, v_cache=v8), scales[0], scales[1]


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_gpu_fp8_cache_decode_matches_reference(num_splits: int | None) -> None:
    ctx = [8191] if num_splits is None else [3000, 7, 8000, 513]
    _, batch, k_scale, v_scale = _gpu_fp8_batch([1] * len(ctx), ctx, seed=43)
    _check_on_gpu(batch, num_splits, k_scale=k_scale, v_scale=v_scale)


@pytest.mark.gpu
def test_gpu_fp8_cache_mixed_batch_close_to_bf16() -> None:
    q_lens, ctx = [1] * 8 + [512, 300], [100 * i + 7 for i in range(8)] + [3584, 0]
    bf16, batch, k_scale, v_scale = _gpu_fp8_batch(q_lens, ctx, seed=44)
    _check_on_gpu(batch, 1, k_scale=k_scale, v_scale=v_scale)
    error = paged_attention(*batch.args(), k_scale=k_scale, v_scale=v_scale) - paged_attention(*bf16.args())
    error = error.float().abs()
    assert error.max() <= FP8_ACCURACY["max_abs"] and error.mean() <= FP8_ACCURACY["mean_abs"]


@pytest.mark.gpu
@pytest.mark.parametrize("fp8_qk", [False, True])
def test_gpu_fp8_dot_paths_close_to_bf16(fp8_qk: bool) -> None:
    """Both FP8 dot paths (float16 dots; FP8 query-key dot with per-row q scales) stay within the
    FP8 cache's accuracy budget of the bf16 cache, decode and prefill rows alike."""
    q_lens, ctx = [1] * 6 + [200], [64 * i + 5 for i in range(6)] + [700]
    bf16, batch, k_scale, v_scale = _gpu_fp8_batch(q_lens, ctx, seed=45)
    group = 4
    tiles = choose_tiles(max(q_lens), group, 128, len(q_lens), 8)
    out = paged_attention_with_tiles(*batch.args(), tiles, k_scale=k_scale, v_scale=v_scale, fp8_qk=fp8_qk)
    error = (out - paged_attention(*bf16.args())).float().abs()
    assert error.max() <= FP8_ACCURACY["max_abs"] and error.mean() <= FP8_ACCURACY["mean_abs"], (
        error.max(),
        error.mean(),
    )


def test_the_portable_kernels_compile_for_sm90_sm80_and_gfx942() -> None:
    """The unified and split-KV kernels build for every target with every branch a launch may take (the
    interpreter runs only the taken ones), the split kernel's early reads of the step inputs and its mergers'
    FP8 quantization (per token, per head) and the folded RoPE + K/V write (NeoX; GPT-J with the per-head norms)
    included. In a subprocess: this one runs the interpreter."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "scripts/cross_compile_attention.py", "--portable"], cwd=root,
        env=dict(os.environ, TRITON_INTERPRET="0"), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0 and "FAILED" not in result.stdout, result.stdout + result.stderr[-2000:]
    assert result.stdout.count("split_kv_decode_kernel") == 43 and result.stdout.count(": ok") == 45, result.stdout
