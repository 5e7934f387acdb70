"""The sm90 FP8 decode kernel (Gluon, attention_fp8_decode_sm90.py) against the float32 reference
and the bf16 cache, and its dispatch. The kernel itself needs an sm90 GPU (no interpreter runs
Gluon), so its numerics are GPU tests; on CPU the dispatch must leave it alone.

Batches come from test_attention.make_batch (unowned cache slots and block-table padding are NaN,
so reading past a sequence without a mask fails), rewritten to FP8 by write_kv_cache.
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
from test_attention import GPU_FP8_REL_RMS, PagedBatch, make_batch
from test_attention_split import FP8_ACCURACY, _gpu_fp8_batch

from tritonllm.kernels import attention_fp8_decode_sm90, reference, registry
from tritonllm.kernels.attention import (
    AttentionPlan,
    choose_tiles,
    paged_attention_fp8_decode_sm90,
    paged_attention_with_tiles,
)
from tritonllm.kernels.attention_fp8_decode_sm90 import Fp8DecodeTiles

needs_sm90 = pytest.mark.skipif(
    not attention_fp8_decode_sm90.available(), reason="the Gluon FP8 decode kernel runs on sm90 GPUs only"
)


def _plan(batch: PagedBatch, num_splits: int | None = None, fp8_gluon: bool | None = None) -> AttentionPlan:
    q, k_cache = batch.q, batch.k_cache
    return AttentionPlan(*batch.args()[3:8], q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1],
                         num_splits=num_splits, fp8_gluon=fp8_gluon, kv_dtype=k_cache.dtype)  # fmt: skip


def _check(batch: PagedBatch, k_scale: torch.Tensor, v_scale: torch.Tensor, num_splits: int | None = None,
           plan: AttentionPlan | None = None) -> None:  # fmt: skip
    plan = plan or _plan(batch, num_splits)
    assert plan.fp8_tiles is not None  # the Gluon kernel serves it
    out = plan.run(batch.q, batch.k_cache, batch.v_cache, batch.scale, k_scale=k_scale, v_scale=v_scale)
    expected = reference.paged_attention(*dataclasses.replace(batch, q=batch.q.float()).args(), k_scale=k_scale,
                                         v_scale=v_scale)  # fmt: skip
    assert_close_per_row(out, expected, GPU_FP8_REL_RMS)


# ---- CPU: dispatch ------------------------------------------------------------------------------


def test_hopper_config_names_the_kernel_and_cpu_leaves_it_alone() -> None:
    assert set(attention_fp8_decode_sm90.TILES) == {"hopper"}  # its tile table, beside the kernel
    assert all(t.tile_n in (64, 128) and t.num_stages >= 2 for t in attention_fp8_decode_sm90.TILES.values())
    assert not attention_fp8_decode_sm90.available()  # CPU: no sm90 GPU
    batch = make_batch([1, 1], [40, 7], 8, 2, 64, 16, seed=60)
    assert _plan(batch).fp8_tiles is None


def test_shapes_the_kernel_serves() -> None:
    supported = attention_fp8_decode_sm90.supported
    assert supported(128, 4, 16, 128) == attention_fp8_decode_sm90.HAVE_GLUON
    assert not supported(96, 4, 16, 64)  # head_dim outside 64/128/256
    assert not supported(128, 32, 16, 64)  # group > 16
    assert not supported(128, 4, 16, 32)  # tiles are 64 or 128 keys (wgmma's M per warpgroup)
    # the query heads of a KV head fill wgmma's N dim: at least 8, a power of two
    assert [attention_fp8_decode_sm90.padded_rows(g) for g in (1, 4, 7, 8, 9, 16)] == [8, 8, 8, 8, 16, 16]


def test_requiring_the_kernel_where_it_cannot_run_names_the_fix() -> None:
    batch = make_batch([1, 1], [40, 7], 8, 2, 64, 16, seed=61)
    with pytest.raises(ValueError, match="fp8_gluon=None"):
        _plan(batch, fp8_gluon=True)
    mixed = make_batch([1, 5], [40, 7], 8, 2, 64, 16, seed=62)  # a prefill chunk: not a decode batch
    with pytest.raises(ValueError, match="pure-decode"):
        _plan(mixed, fp8_gluon=True)


def test_kernel_compiles_for_sm90_with_this_triton() -> None:
    """No GPU needed: Triton's compiler and ptxas build the kernel for sm90 at every variant the engine
    can pick (scripts/cross_compile_attention.py --gluon), in a subprocess because Gluon does not run
    under the interpreter this process uses. Catches layout errors and Gluon API drift across Triton
    versions (the GPU tests run the device's Triton only)."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "scripts/cross_compile_attention.py", "--gluon"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "FAILED" not in result.stdout


# ---- GPU: numerics --------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("num_splits", [None, 1, 3, 16])
def test_gpu_ragged_decode_matches_reference(num_splits: int | None) -> None:
    """Contexts shorter than a tile, at tile edges (63/64/65, 127/128/129), one key, long ones."""
    ctx = [1, 15, 17, 63, 64, 65, 127, 128, 129, 1000, 8191, 3]
    _, batch, k_scale, v_scale = _gpu_fp8_batch([1] * len(ctx), ctx, seed=63)
    _check(batch, k_scale, v_scale, num_splits)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, block_size",
    [(28, 4, 128, 16), (16, 8, 64, 32), (8, 8, 128, 8), (32, 2, 128, 16), (8, 2, 256, 16)],
)
def test_gpu_other_head_layouts(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int) -> None:
    """Qwen2.5-7B's group of 7, head_dim 64 and 256, MHA (group 1), group 16, block sizes 8 and 32."""
    ctx = [5000, 3, 1234, 77]
    _, batch, k_scale, v_scale = _gpu_fp8_batch([1] * 4, ctx, 64, num_heads, num_kv_heads, head_dim, block_size)
    _check(batch, k_scale, v_scale)
    _check(batch, k_scale, v_scale, num_splits=4)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "tiles", [Fp8DecodeTiles(64, 2, False), Fp8DecodeTiles(64, 3, True), Fp8DecodeTiles(128, 3, False)]
)
def test_gpu_other_tiles(monkeypatch: pytest.MonkeyPatch, tiles: Fp8DecodeTiles) -> None:
    """Every ring depth, tile size and V buffer choice computes the same thing."""
    monkeypatch.setitem(attention_fp8_decode_sm90.TILES, "hopper", tiles)
    _, batch, k_scale, v_scale = _gpu_fp8_batch([1] * 4, [4000, 1, 130, 64], seed=65)
    _check(batch, k_scale, v_scale)
    _check(batch, k_scale, v_scale, num_splits=5)


@pytest.mark.gpu
@needs_sm90
def test_gpu_close_to_bf16_cache_and_to_the_triton_kernel() -> None:
    """The FP8 cache's accuracy budget against the bf16 cache, and agreement with the portable FP8 path."""
    ctx = [100 * i + 7 for i in range(16)] + [8191]
    bf16, batch, k_scale, v_scale = _gpu_fp8_batch([1] * len(ctx), ctx, seed=66)
    out = paged_attention_fp8_decode_sm90(*batch.args(), k_scale=k_scale, v_scale=v_scale)
    error = (out - paged_attention_fp8_decode_sm90(*bf16.args())).float().abs()
    assert error.max() <= FP8_ACCURACY["max_abs"] and error.mean() <= FP8_ACCURACY["mean_abs"], (
        error.max(),
        error.mean(),
    )
    tiles = choose_tiles(1, 4, 128, batch.q.shape[0], 8, kv_fp8=True)
    triton_path = paged_attention_with_tiles(*batch.args(), tiles, k_scale=k_scale, v_scale=v_scale)
    assert_close_per_row(out, triton_path, GPU_FP8_REL_RMS)


@pytest.mark.gpu
@needs_sm90
def test_gpu_engine_plan_takes_it_and_skips_empty_sequences() -> None:
    """The engine's choice (registry auto) on sm90 with an FP8 cache is this kernel's implementation, and
    its step plan uses the kernel; a sequence without a query is left alone."""
    _, batch, k_scale, v_scale = _gpu_fp8_batch([1, 0, 1], [300, 20, 900], seed=67)
    context = registry.KernelContext("cuda", torch.bfloat16, batch.k_cache.dtype, 128)
    kernels = registry.select_kernels({}, context)
    assert kernels.choice["attention"] == "triton_fp8_decode_sm90"
    plan = kernels.plan_attention(*batch.args()[3:8], 32, 8, 128, 16, kv_dtype=batch.k_cache.dtype)
    _check(batch, k_scale, v_scale, plan=plan)
