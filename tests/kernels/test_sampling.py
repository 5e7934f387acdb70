"""Sampling kernels against the torch reference: log-softmax, the top-k / top-p / min-p mask (exact,
up to tokens whose fate float rounding decides), greedy argmax, and Gumbel-max draws that stay in
the mask, reproduce from their seed in any batch and follow the masked distribution."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from launch_spy import LaunchSpy  # tests/

from tritonllm import platform
from tritonllm.kernels import reference, sampling
from tritonllm.kernels.sampling import log_softmax, sample, sampling_mask

GPU_VOCAB = 151936


def _logits(num_rows, vocab, seed, dtype=torch.float32, device="cpu", scale=3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(num_rows, vocab, generator=gen)).to(device, dtype)


def _params(num_rows, seed, filters=("top_k", "top_p", "min_p"), device="cpu") -> dict[str, torch.Tensor]:
    """Random per-row parameters; every fourth row is greedy and some rows switch a filter off."""
    gen = torch.Generator().manual_seed(seed)
    temperature = 0.2 + 1.5 * torch.rand(num_rows, generator=gen)
    temperature[::4] = 0.0
    top_k = torch.randint(-2, 60, (num_rows,), generator=gen, dtype=torch.int32)
    top_p = 0.3 + 0.8 * torch.rand(num_rows, generator=gen)
    min_p = 0.25 * torch.rand(num_rows, generator=gen) - 0.05
    params = {
        "temperature": temperature,
        "top_k": top_k if "top_k" in filters else torch.zeros_like(top_k),
        "top_p": top_p if "top_p" in filters else torch.ones_like(top_p),
        "min_p": min_p if "min_p" in filters else torch.zeros_like(min_p),
    }
    return {name: value.to(device) for name, value in params.items()}


def _seeds(num_rows, first=0, device="cpu") -> torch.Tensor:
    return (first + 7919 * torch.arange(num_rows, dtype=torch.int64)).to(device)


def _rounding_decides(logits, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """bool [num_rows, vocab]: tokens whose membership in the mask float rounding may flip: where
    the top-p mass above the token or its min-p ratio lies within rounding of the cut (computed
    in float64), where its float32 probability ties one of a larger logit, or where distinct
    logits share the k-th largest value of logits / temperature (the kernel cuts on the logits)."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    scaled = logits.float() / t[:, None]
    vocab = scaled.shape[-1]
    k = torch.where(top_k > 0, top_k.long(), torch.full_like(top_k.long(), vocab)).clamp(max=vocab)
    kth_largest = scaled.sort(dim=-1, descending=True).values.gather(-1, (k - 1)[:, None])
    kept_k = scaled >= kth_largest
    at_kth = scaled == kth_largest
    raw = logits.float()
    collapsed = raw.masked_fill(~at_kth, float("inf")).amin(-1) < raw.masked_fill(~at_kth, float("-inf")).amax(-1)
    near_top_k = at_kth & collapsed[:, None]
    probs = torch.softmax(scaled.double().masked_fill(~kept_k, float("-inf")), dim=-1)
    ascending = probs.sort(dim=-1).values
    suffix_mass = torch.cat([ascending.flip(-1).cumsum(-1).flip(-1), torch.zeros_like(ascending[:, :1])], -1)

    def mass_above(p: torch.Tensor) -> torch.Tensor:
        return suffix_mass.gather(-1, torch.searchsorted(ascending, p.contiguous(), right=True))

    cut = top_p[:, None].double()
    near_top_p = (cut < 1) & kept_k & (mass_above(probs * (1 + 1e-5)) - 1e-4 <= cut)
    near_top_p &= cut <= mass_above(probs) + 1e-4
    ratio = torch.exp(scaled.double() - scaled.double().max(-1, keepdim=True).values)
    near_min_p = (min_p[:, None] > 0) & ((ratio / min_p[:, None].double() - 1).abs() <= 1e-4)
    return near_top_k | near_top_p | near_min_p


def _assert_masks_agree(logits, params) -> torch.Tensor:
    mask = sampling_mask(logits, **params)
    expected = reference.sampling_mask(logits, **params)
    assert mask.dtype == torch.bool and mask.shape == expected.shape
    disagree = mask != expected
    unexplained = disagree & ~_rounding_decides(logits, **params)
    assert not unexplained.any(), f"{int(unexplained.sum())} tokens differ from the reference mask"
    assert disagree.sum() <= max(1, expected.shape[0] // 8), "too many near-threshold disagreements"
    return expected


def _masked_probs(logits, params) -> torch.Tensor:
    keep = reference.sampling_mask(logits, **params)
    t = torch.where(params["temperature"] > 0, params["temperature"], 1.0).float()
    return torch.softmax((logits.float() / t[:, None]).masked_fill(~keep, float("-inf")), dim=-1)


def _total_variation_of_draws(logits_row, params_row, num_draws, device="cpu") -> float:
    """Draw num_draws tokens in one call (one row per draw, same logits, distinct seeds)."""
    logits = logits_row.expand(num_draws, -1).contiguous()
    params = {name: value.expand(num_draws).contiguous() for name, value in params_row.items()}
    tokens = sample(logits, **params, seeds=_seeds(num_draws, first=11, device=device))
    empirical = torch.bincount(tokens, minlength=logits.shape[-1]).double() / num_draws
    expected = _masked_probs(logits[:1], {name: value[:1] for name, value in params.items()})[0].double()
    assert reference.sampling_mask(logits[:1], **{n: v[:1] for n, v in params.items()})[0, tokens].all()
    return 0.5 * (empirical - expected).abs().sum().item()


# ---- log_softmax ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_rows, vocab", [(1, 7), (13, 500), (5, 5000)])
def test_log_softmax_matches_reference(num_rows: int, vocab: int, dtype: torch.dtype) -> None:
    logits = _logits(num_rows, vocab, seed=vocab, dtype=dtype)
    out = log_softmax(logits)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference.log_softmax(logits), atol=1e-5, rtol=1e-5)


def test_log_softmax_of_strided_logits_with_masked_tokens() -> None:
    padded = _logits(9, 4200, seed=1)
    padded[:, :4096] = float("-inf")  # a whole first chunk of banned tokens
    padded[:, 4100::3] = float("-inf")
    logits = padded[:, :4150]
    torch.testing.assert_close(log_softmax(logits), reference.log_softmax(logits), atol=1e-5, rtol=1e-5)


# ---- sampling_mask -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "filters", [(), ("top_k",), ("top_p",), ("min_p",), ("top_k", "top_p"), ("top_k", "top_p", "min_p")]
)
def test_sampling_mask_matches_reference(filters: tuple[str, ...], dtype: torch.dtype) -> None:
    logits = _logits(29, 517, seed=len(filters), dtype=dtype)
    _assert_masks_agree(logits, _params(29, seed=3 + len(filters), filters=filters))


def test_sampling_mask_matches_reference_over_several_vocab_chunks() -> None:
    logits = _logits(6, 5003, seed=4, dtype=torch.float16)
    _assert_masks_agree(logits, _params(6, seed=5))


def test_sampling_mask_keeps_tied_logits_together() -> None:
    logits = torch.round(_logits(24, 300, seed=6, scale=4.0))  # integers: many exact ties
    params = _params(24, seed=7)
    params["top_k"] = torch.randint(1, 40, (24,), generator=torch.Generator().manual_seed(8), dtype=torch.int32)
    expected = _assert_masks_agree(logits, params)
    for row in range(24):  # the reference keeps a value's ties together; so must the kernel
        kept_values = logits[row][expected[row]].unique()
        assert expected[row].sum() == torch.isin(logits[row], kept_values).sum()


def test_a_zero_top_p_keeps_the_most_probable_token() -> None:
    """top_p 0 (what a top_p below float32's smallest normal becomes in float32) keeps the most probable
    token in both masks: the reference kept none and its draw failed on NaN probabilities."""
    logits = _logits(5, 300, seed=9)
    params = _params(5, seed=10)
    params["top_p"] = torch.zeros(5)
    expected = _assert_masks_agree(logits, params)
    assert (expected.sum(-1) >= 1).all() and expected[torch.arange(5), logits.float().argmax(-1)].all()


# ---- sample --------------------------------------------------------------------------------


def test_greedy_rows_take_the_first_argmax_whatever_the_filters() -> None:
    logits = _logits(19, 333, seed=9)
    params = _params(19, seed=10)
    params["temperature"][:] = 0.0
    params["temperature"][5] = 0.9  # a sampled row in the batch must not change the greedy ones
    top = logits.max(dim=-1).values + 1.0
    logits[:, 200], logits[:, 17], logits[:, 300] = top, top, top  # ties: 17 comes first
    tokens = sample(logits, **params, seeds=_seeds(19))
    greedy = params["temperature"] <= 0
    assert tokens.dtype == torch.int64
    assert (tokens[greedy] == 17).all()


def test_greedy_batch_equals_argmax() -> None:
    logits = _logits(33, 1001, seed=12, dtype=torch.float16)
    params = _params(33, seed=13)
    params["temperature"][:] = -1.0
    assert torch.equal(sample(logits, **params, seeds=_seeds(33)), logits.float().argmax(dim=-1))


@pytest.mark.parametrize("filters", [(), ("top_k", "top_p", "min_p")])
def test_sampled_tokens_lie_inside_reference_mask(filters: tuple[str, ...]) -> None:
    logits = _logits(48, 301, seed=14)
    params = _params(48, seed=15, filters=filters)
    keep = reference.sampling_mask(logits, **params)
    rows = torch.arange(48)
    for first_seed in (0, 1000, 123457):
        tokens = sample(logits, **params, seeds=_seeds(48, first_seed))
        assert keep[rows, tokens].all()


def test_same_seed_draws_same_token_in_any_batch() -> None:
    logits = _logits(40, 257, seed=16, scale=0.5)
    params = _params(40, seed=17)
    seeds = _seeds(40, first=5)
    tokens = sample(logits, **params, seeds=seeds)
    assert torch.equal(sample(logits, **params, seeds=seeds), tokens)
    subset = torch.tensor([22, 3, 7, 39])
    alone = sample(logits[subset], **{n: v[subset] for n, v in params.items()}, seeds=seeds[subset])
    assert torch.equal(alone, tokens[subset])


def test_different_seeds_draw_different_tokens() -> None:
    logits = _logits(1, 300, seed=18, scale=0.3).expand(64, -1).contiguous()
    params = {
        "temperature": torch.ones(64),
        "top_k": torch.zeros(64, dtype=torch.int32),
        "top_p": torch.ones(64),
        "min_p": torch.zeros(64),
    }
    tokens = sample(logits, **params, seeds=_seeds(64))
    assert tokens.unique().numel() >= 40
    assert not torch.equal(sample(logits, **params, seeds=_seeds(64, first=1)), tokens)


@pytest.mark.parametrize(
    "temperature, top_k, top_p, min_p",
    [(0.8, 0, 1.0, 0.0), (1.3, 10, 0.9, 0.0), (1.0, 0, 0.85, 0.1), (2.0, 7, 1.0, 0.05)],
)
def test_draws_follow_reference_masked_distribution(temperature, top_k, top_p, min_p) -> None:
    logits_row = _logits(1, 40, seed=19, scale=1.5)
    params_row = {
        "temperature": torch.tensor([temperature]),
        "top_k": torch.tensor([top_k], dtype=torch.int32),
        "top_p": torch.tensor([top_p]),
        "min_p": torch.tensor([min_p]),
    }
    assert _total_variation_of_draws(logits_row, params_row, num_draws=4000) < 0.05


# ---- candidates: top-k / top-p rows drawn from the scratch, and the fallback ------------------


def _peaked(logits: torch.Tensor, rows: slice, num_peaks: int, seed: int) -> torch.Tensor:
    """The rows `rows` get num_peaks tokens far above the rest: top-p keeps only a few of them."""
    gen = torch.Generator().manual_seed(seed)
    for row in range(*rows.indices(logits.shape[0])):
        logits[row, torch.randperm(logits.shape[1], generator=gen)[:num_peaks]] += 12.0
    return logits


def _candidate_ids(monkeypatch) -> dict[str, torch.Tensor]:
    """Keeps the candidate scratch of the next launch (ids pre-filled with -1) for inspection."""
    held: dict[str, torch.Tensor] = {}
    scratch = sampling._scratch

    def kept(num_rows, compact, device):
        x, ids = scratch(num_rows, compact, device)
        held["ids"] = ids.fill_(-1)
        return x, ids

    monkeypatch.setattr(sampling, "_scratch", kept)
    return held


def _top_k_and_peaked_top_p(num_rows: int = 24, vocab: int = 3000, banned: bool = True) -> tuple[torch.Tensor, dict]:
    logits = _peaked(_logits(num_rows, vocab, seed=40), slice(num_rows // 2, None), num_peaks=5, seed=41)
    if banned:  # tokens banned (min_tokens) in every third row: the window must still find its scale
        logits[::3, :40] = float("-inf")
    gen = torch.Generator().manual_seed(42)
    half = num_rows // 2
    params = {
        "temperature": 0.3 + torch.rand(num_rows, generator=gen),
        "top_k": torch.cat(
            [
                torch.randint(1, 61, (half,), generator=gen, dtype=torch.int32),
                torch.zeros(num_rows - half, dtype=torch.int32),
            ]
        ),  # fmt: skip
        "top_p": 0.5 + 0.45 * torch.rand(num_rows, generator=gen),
        "min_p": torch.zeros(num_rows),
    }
    return logits, params


def test_top_k_and_peaked_top_p_rows_keep_their_survivors_among_candidates(monkeypatch) -> None:
    logits, params = _top_k_and_peaked_top_p()
    held = _candidate_ids(monkeypatch)
    mask = sampling_mask(logits, **params)
    _assert_masks_agree(logits, params)
    for row in range(logits.shape[0]):
        survivors = set(mask[row].nonzero()[:, 0].tolist())
        assert 1 <= len(survivors) <= 60
        assert survivors <= set(held["ids"][row].tolist()), f"row {row}: survivors missing from the candidates"
    tokens = sample(logits, **params, seeds=_seeds(logits.shape[0]))
    assert mask[torch.arange(logits.shape[0]), tokens].all()


def test_rows_without_top_k_or_top_p_draw_alike_beside_candidate_rows() -> None:
    """Under the interpreter a program holds many rows: temperature-only and min-p-only rows must
    not take the thresholds of the candidate rows beside them."""
    logits, params = _top_k_and_peaked_top_p(num_rows=16, banned=False)  # no row falls back to the searches
    plain = {"temperature": 0.5 + torch.rand(16), "top_k": torch.zeros(16, dtype=torch.int32),
             "top_p": torch.ones(16), "min_p": torch.where(torch.arange(16) % 2 == 0, 0.0, 0.05)}  # fmt: skip
    order = torch.arange(32).view(2, 16).t().reshape(-1)  # rows alternate: 0, 16, 1, 17, ...
    mixed = {name: torch.cat([params[name], plain[name]])[order] for name in params}
    both = torch.cat([logits, logits])[order]
    seeds = _seeds(32, first=3)
    tokens = torch.empty(32, dtype=torch.int64)
    tokens[order] = sample(both, **mixed, seeds=seeds[order])
    assert torch.equal(tokens[16:], sample(logits, **plain, seeds=seeds[16:]))
    assert torch.equal(tokens[:16], sample(logits, **params, seeds=seeds[:16]))
    assert reference.sampling_mask(both, **mixed)[torch.arange(32), tokens[order]].all()
    _assert_masks_agree(both, mixed)


def _without_candidates(monkeypatch) -> None:
    """Every launch gets a one-slot scratch: no window fits (bar top-k 1), the searches serve all rows."""
    filters = sampling._filters

    def one_slot(num_rows, vocab, dtype):
        f = filters(num_rows, vocab, dtype)
        return f._replace(constexprs={**f.constexprs, "COMPACT": 1}, compact=1)

    monkeypatch.setattr(sampling, "_filters", one_slot)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_draws_among_candidates_equal_draws_over_the_vocabulary(monkeypatch, dtype: torch.dtype) -> None:
    logits, params = _top_k_and_peaked_top_p()
    more_logits = _logits(32, 3000, seed=43)
    more_params = _params(32, seed=44)
    logits = torch.cat([logits, more_logits]).to(dtype)
    params = {name: torch.cat([value, more_params[name].to(value.dtype)]) for name, value in params.items()}
    seeds = _seeds(logits.shape[0], first=9)
    from_candidates = sample(logits, **params, seeds=seeds)
    mask = sampling_mask(logits, **params)
    _without_candidates(monkeypatch)
    assert torch.equal(sample(logits, **params, seeds=seeds), from_candidates)
    assert torch.equal(sampling_mask(logits, **params), mask)


@triton.jit
def _lowest_surviving_id(x, ids, survives, seeds, temperature, vocab):
    return tl.min(tl.where(survives, ids, vocab), axis=1)  # no noise: not a draw


@pytest.mark.skipif(not platform.is_interpreter(), reason="swaps a jit function, which only the interpreter re-reads")
def test_a_broken_draw_among_candidates_is_caught(monkeypatch) -> None:
    """Negative check: the equality above fails when the draw among candidates ignores its noise."""
    logits, params = _top_k_and_peaked_top_p()
    seeds = _seeds(logits.shape[0], first=9)
    drawn = sample(logits, **params, seeds=seeds)
    monkeypatch.setattr(sampling, "draw_candidates", _lowest_surviving_id)
    assert not torch.equal(sample(logits, **params, seeds=seeds), drawn)


# ---- the same checks in bfloat16 at model sizes, on a GPU -----------------------------------


# ---- few rows, each row's vocabulary over several programs ------------------------------------


def _split_case(num_rows: int, vocab: int, seed: int, device="cpu"):
    """Logits whose greedy rows tie across chunk boundaries, one row all -inf but a token, and parameters
    mixing greedy, temperature-only and filtered rows."""
    logits = _logits(num_rows, vocab, seed=seed, device=device)
    top = logits.max().item() + 1.0
    logits[0, [vocab - 1, 70, 5 * vocab // 8]] = top  # ties in three chunks: 70 comes first
    if num_rows > 1:  # (a one-row case keeps its ties alone)
        logits[1] = float("-inf")
        logits[1, vocab - 3] = 0.0
    params = _params(num_rows, seed=seed + 1, device=device)
    params["temperature"][:3] = 0.0
    params["temperature"][3:5] = 0.7  # temperature alone: split
    for name, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)):
        params[name][:5] = off
    return logits, params


@pytest.mark.parametrize("splits", [2, 3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rows_split_over_programs_draw_the_tokens_of_one_program_a_row(splits, dtype, monkeypatch) -> None:
    """_sample_split_kernel: the same token as _sample_kernel for greedy rows (first argmax, ties across
    splits), temperature-only rows (noise by token id) and filtered rows (split 0 alone); the arrival
    counters are left at zero."""
    from tritonllm.kernels.launch import arrival_counters

    logits, params = _split_case(9, 1000, seed=40)
    logits = logits.to(dtype)
    seeds = _seeds(9, first=3)
    spy = LaunchSpy.install(monkeypatch, sampling._SAMPLE_SPLIT, "fn")
    split = sampling.sample_rows(logits, **params, seeds=seeds, splits=splits, block_v=64)
    one = sampling.sample_rows(logits, **params, seeds=seeds)
    assert spy.grids == [(9, splits)]
    assert torch.equal(split, one)
    assert split[0] == 70 and split[1] == 997
    assert torch.equal(split[:3], logits[:3].float().argmax(dim=-1))
    assert int(arrival_counters(logits.device).abs().sum()) == 0


def test_a_split_launch_over_fewer_chunks_than_splits_takes_one_split_a_chunk() -> None:
    logits, params = _split_case(3, 200, seed=44)
    seeds = _seeds(3)
    tokens = sampling.sample_rows(logits, **params, seeds=seeds, splits=64, block_v=16)  # 13 chunks
    assert torch.equal(tokens, sampling.sample_rows(logits, **params, seeds=seeds))


def test_every_sampling_kernel_builds_for_sm90_and_gfx942_without_spills() -> None:
    """scripts/cross_compile_sampling.py at the GPU launch configurations, the split kernel and the decode step's
    input kernels included. In a subprocess: this one runs the interpreter."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "scripts/cross_compile_sampling.py"], cwd=root, env=dict(os.environ, TRITON_INTERPRET="0"),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert result.stdout.count(": ok") == 20, result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("num_rows", [1, 64, 1000])
def test_log_softmax_bfloat16_matches_reference_on_gpu(num_rows: int) -> None:
    logits = _logits(num_rows, GPU_VOCAB, seed=20, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(log_softmax(logits), reference.log_softmax(logits), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("filters", [("top_k",), ("top_p",), ("min_p",), ("top_k", "top_p", "min_p")])
def test_sampling_mask_bfloat16_matches_reference_on_gpu(filters: tuple[str, ...]) -> None:
    logits = _logits(64, GPU_VOCAB, seed=21, dtype=torch.bfloat16, device="cuda")
    params = _params(64, seed=22, filters=filters, device="cuda")
    params["top_k"] = params["top_k"] * 50  # up to ~3000 of 151936
    _assert_masks_agree(logits, params)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_sample_bfloat16_on_gpu() -> None:
    logits = _logits(256, GPU_VOCAB, seed=23, dtype=torch.bfloat16, device="cuda")
    params = _params(256, seed=24, device="cuda")
    seeds = _seeds(256, device="cuda")
    tokens = sample(logits, **params, seeds=seeds)
    greedy = params["temperature"] <= 0
    assert torch.equal(tokens[greedy], logits[greedy].float().argmax(dim=-1))
    assert reference.sampling_mask(logits, **params)[torch.arange(256, device="cuda"), tokens].all()
    assert torch.equal(sample(logits, **params, seeds=seeds), tokens)
    subset = torch.tensor([200, 3, 77], device="cuda")
    alone = sample(logits[subset], **{n: v[subset] for n, v in params.items()}, seeds=seeds[subset])
    assert torch.equal(alone, tokens[subset])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_draws_follow_reference_masked_distribution_on_gpu() -> None:
    logits_row = _logits(1, GPU_VOCAB, seed=25, dtype=torch.float32, scale=1.0) - 4.0
    logits_row[0, torch.randperm(GPU_VOCAB, generator=torch.Generator().manual_seed(26))[:30]] += 9.0
    logits_row = logits_row.to("cuda", torch.bfloat16)
    params_row = {
        "temperature": torch.tensor([0.9], device="cuda"),
        "top_k": torch.tensor([20], dtype=torch.int32, device="cuda"),
        "top_p": torch.tensor([0.9], device="cuda"),
        "min_p": torch.tensor([0.02], device="cuda"),
    }
    assert _total_variation_of_draws(logits_row, params_row, num_draws=4000, device="cuda") < 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("num_rows", [1, 3, 8])
def test_split_rows_draw_the_tokens_of_one_program_a_row_on_gpu(num_rows: int) -> None:
    """At a real vocabulary in bf16, split as `sample` splits (SPLIT_ROWS on), eagerly and replayed from a CUDA
    graph over new logits (the arrival counters reset by each launch), against one program a row."""
    from tritonllm.kernels.launch import arrival_counters

    splits = max(1, min(triton.cdiv(GPU_VOCAB, sampling.SPLIT_BLOCK_V), sampling.SPLIT_PROGRAMS // num_rows))
    logits, params = _split_case(num_rows, GPU_VOCAB, seed=50 + num_rows, device="cuda")
    logits = logits.to(torch.bfloat16)
    seeds = _seeds(num_rows, first=9, device="cuda")
    one = sampling.sample_rows(logits, **params, seeds=seeds)
    assert torch.equal(sampling.sample_rows(logits, **params, seeds=seeds, splits=splits), one)
    arrival_counters(logits.device)
    static = logits.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampling.sample_rows(static, **params, seeds=seeds, splits=splits)
    for seed in (60, 61):
        fresh, _ = _split_case(num_rows, GPU_VOCAB, seed=seed, device="cuda")
        static.copy_(fresh.to(torch.bfloat16))
        graph.replay()
        assert torch.equal(out, sampling.sample_rows(static, **params, seeds=seeds))
    assert int(arrival_counters(logits.device).abs().sum()) == 0
