"""RoPE and the step's K/V write folded into split-KV decode (kernels/attention_rope.py) against the engine's
unfolded path: rope_kv_write (rotary.py) rotates q and k and writes the cache, then the same split kernel attends.

The new keys' cache slots start as NaN, so a fold that does not write them (or writes the wrong slot) poisons its
sequence's output; outputs and caches are compared bit for bit on the CPU (the same float32 arithmetic in both
paths), within a rounding of the model's dtype on a GPU (reductions may be ordered differently).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_attention import make_batch
from test_rotary import _cos_sin_cache

from tritonllm import platform
from tritonllm.kernels.attention import choose_tiles, paged_attention_with_tiles
from tritonllm.kernels.attention_rope import FoldedRope
from tritonllm.kernels.quant_formats import OutputQuant
from tritonllm.kernels.rotary import rotary_write_kv_cache

DEVICE = platform.DEVICE


def _case(ctx_lens, q_lens, group, head_dim, block_size, rot_dim, is_neox, dtype, cache_dtype, qk_norm, seed):
    """A decode batch whose newest keys are not yet in the cache (NaN there), the step's raw q / k / v as slices of
    one qkv row, their positions and slots (the first sequence's token: slot -1, its cache left as it was)."""
    num_kv_heads = 2
    batch = make_batch(q_lens, ctx_lens, group * num_kv_heads, num_kv_heads, head_dim, block_size, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    num_tokens = sum(q_lens)
    width = num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, (group + 2) * width, generator=gen).to(dtype)
    q, k, v = qkv.split([group * width, width, width], dim=1)
    positions, slots = [], []
    for i, (c, n) in enumerate(zip(ctx_lens, q_lens, strict=True)):
        if n:
            block = int(batch.block_tables[i, c // block_size])
            positions.append(c)
            slots.append(-1 if i == 0 else block * block_size + c % block_size)
            if i:  # the unwritten newest key: poisoned
                batch.k_cache[block, c % block_size] = float("nan")
                batch.v_cache[block, c % block_size] = float("nan")
    kv_scales = {}
    caches = (batch.k_cache, batch.v_cache)
    if cache_dtype.itemsize == 1:
        kv_scales = dict(k_scale=torch.tensor([0.02]), v_scale=torch.tensor([0.03]))
        caches = (
            (batch.k_cache / 0.02).to(cache_dtype), (batch.v_cache / 0.03).to(cache_dtype)
        )  # fmt: skip
    else:
        caches = tuple(c.to(cache_dtype) for c in caches)
    norm = None
    if qk_norm:
        weights = (1 + 0.3 * torch.randn(2, head_dim, generator=gen)).to(dtype)
        norm = (weights[0].to(DEVICE), weights[1].to(DEVICE), 1e-6)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return dict(
        batch=dataclasses.replace(batch, q=q.reshape(num_tokens, -1, head_dim)), qkv=to(qkv),
        split=[group * width, width, width], caches=tuple(map(to, caches)),
        kv_scales={n: to(s) for n, s in kv_scales.items()},
        positions=torch.tensor(positions, dtype=torch.int64, device=DEVICE),
        slots=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        cos_sin=to(_cos_sin_cache(4096, rot_dim, 10000.0)), is_neox=is_neox, norm=norm, head_dim=head_dim,
    )  # fmt: skip


def _attend(case, q, caches, num_splits, rope=None, quantize=None, **features):
    b = case["batch"]
    num_seqs, num_kv_heads, head_dim = b.seq_lens.shape[0], caches[0].shape[2], case["head_dim"]
    group = q.shape[1] // num_kv_heads
    tiles = choose_tiles(1, group, head_dim, num_seqs, num_kv_heads, num_splits)
    args = (q, *caches, *(t.to(DEVICE) for t in (b.block_tables, b.seq_lens, b.query_start_loc)), b.max_query_len,
            b.max_seq_len, b.scale)  # fmt: skip
    return paged_attention_with_tiles(*args, tiles, num_splits=num_splits, rope=rope, quantize=quantize,
                                      **case["kv_scales"], **features)  # fmt: skip


def _both(case, num_splits, quantize=None, positions=None, **features):
    """(unfolded output, its caches), (folded output, its caches)."""
    q, k, v = case["qkv"].split(case["split"], dim=1)
    head_dim, num_tokens = case["head_dim"], q.shape[0]
    ref_caches = tuple(c.clone() for c in case["caches"])
    q_rot, _ = rotary_write_kv_cache(case["positions"], q, k, v, case["cos_sin"], head_dim, case["is_neox"],
                                     *ref_caches, case["slots"], qk_norm=case["norm"], **case["kv_scales"])  # fmt: skip
    ref = _attend(case, q_rot.view(num_tokens, -1, head_dim), ref_caches, num_splits, quantize=quantize, **features)
    fold_caches = tuple(c.clone() for c in case["caches"])
    rope = FoldedRope(case["positions"] if positions is None else positions, case["cos_sin"], case["is_neox"], k, v,
                      case["slots"], case["norm"])  # fmt: skip
    got = _attend(case, q.view(num_tokens, -1, head_dim), fold_caches, num_splits, rope=rope, quantize=quantize,
                  **features)  # fmt: skip
    return (ref, ref_caches), (got, fold_caches)


def _assert_same(a, b, dtype):
    if platform.is_interpreter():
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    else:
        rtol = 0.13 if a.dtype.itemsize == 1 else (1e-2 if dtype != torch.float32 else 1e-5)
        torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=rtol)


CASES = [  # group, head_dim, block_size, rot_dim, is_neox, dtype, cache dtype, qk_norm, splits
    (2, 64, 16, 64, True, torch.float32, torch.float32, False, 3),
    (4, 64, 8, 32, False, torch.float32, torch.float32, True, 4),  # GPT-J, partial rotary, per-head norms
    (1, 128, 16, 128, True, torch.float16, torch.float16, True, 5),
    (2, 64, 16, 48, True, torch.float16, torch.float8_e4m3fn, False, 2),  # FP8 cache: the write quantizes
]


@pytest.mark.parametrize("group, head_dim, block_size, rot_dim, is_neox, dtype, cache_dtype, qk_norm, splits", CASES)
def test_folded_rope_matches_rope_kv_write_then_attention(group, head_dim, block_size, rot_dim, is_neox, dtype,
                                                          cache_dtype, qk_norm, splits):  # fmt: skip
    """Ragged contexts (one empty, one ending a block, one long), a sequence without a query, a token whose slot is
    -1: the folded kernel's output and both caches equal the unfolded path's."""
    case = _case([5, 0, 31, 16, 90, 7], [1, 1, 1, 1, 1, 0], group, head_dim, block_size, rot_dim, is_neox, dtype,
                 cache_dtype, qk_norm, seed=group + head_dim)  # fmt: skip
    (ref, ref_caches), (got, got_caches) = _both(case, splits)
    assert torch.isfinite(ref.float()).all()
    _assert_same(got, ref, dtype)
    for a, b in zip(got_caches, ref_caches, strict=True):
        _assert_same(a, b, dtype)


def test_folded_rope_with_the_output_quantized_in_the_kernel():
    """The fold beside the merge's quantization for a W8A8 o_proj (per token and per 128-column group)."""
    if not platform.has_fp8():
        pytest.skip("FP8 output quantization")
    case = _case([12, 40, 3], [1, 1, 1], 2, 64, 16, 64, True, torch.float32, torch.float32, False, seed=5)
    for group in (0, 128):
        quantize = OutputQuant(torch.float8_e4m3fn, group=group)
        (ref, _), (got, _) = _both(case, 3, quantize=quantize)
        _assert_same(got.data, ref.data, torch.float32)
        _assert_same(got.scale, ref.scale, torch.float32)


def test_folded_rope_with_a_sliding_window_sinks_and_early_keys(monkeypatch):
    """gpt-oss's features (a sliding window, so segments start past key 0; a sink logit a head) and the opt-in early
    keys (the first tile's older keys read before the wait, the newest after the fold wrote it)."""
    from tritonllm.kernels import attention_split

    case = _case([5, 70, 31, 48], [1, 1, 1, 1], 4, 64, 16, 64, True, torch.float32, torch.float32, False, seed=13)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    for early in (False, True):
        monkeypatch.setattr(attention_split, "EARLY_KV", early)
        (ref, ref_caches), (got, got_caches) = _both(case, 3, sliding_window=24, sinks=sinks)
        assert torch.isfinite(ref).all()
        _assert_same(got, ref, torch.float32)
        for a, b in zip(got_caches, ref_caches, strict=True):
            _assert_same(a, b, torch.float32)


def test_folded_rope_uses_the_positions():
    """Negative check: positions one step late rotate q and k differently, and the output shows it."""
    case = _case([20, 33], [1, 1], 2, 64, 16, 64, True, torch.float32, torch.float32, False, seed=9)
    (ref, _), (got, _) = _both(case, 2, positions=case["positions"] + 1)
    assert (got - ref).abs().max() > 1e-3 * ref.abs().max()


def test_folded_rope_is_refused_where_the_plan_cannot_fold():
    """An unsplit plan (or the torch path) does not take rope: a clear error, not a silently unrotated q."""
    case = _case([20, 33], [1, 1], 2, 64, 16, 64, True, torch.float32, torch.float32, False, seed=11)
    q, k, v = case["qkv"].split(case["split"], dim=1)
    rope = FoldedRope(case["positions"], case["cos_sin"], True, k, v, case["slots"])
    with pytest.raises(ValueError, match="folded into split-KV decode only"):
        _attend(case, q.reshape(2, -1, 64), case["caches"], 1, rope=rope)
    with pytest.raises(ValueError, match="must be \\[2, 128\\]"):
        _attend(case, q.reshape(2, -1, 64), case["caches"], 2, rope=dataclasses.replace(rope, k=k[:, :64]))
