"""The Triton MoE (kernels/moe_route.py, moe.py) against the torch reference (the alignment,
kernels/moe_align.py: test_moe_align.py).

Ragged, non-power-of-two shapes (T in {1, 5, 19}, E 6 or 8, H 48, I 40; MXFP4 needs K a multiple
of 32: H 64, I 96) keep the interpreter's grids to tens of programs. Tolerances are relative to
the reference output's scale (closeness.py). bfloat16 and model-sized shapes run on the GPU only.
"""

from __future__ import annotations

import json

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import reference
from tritonllm.kernels.moe import fused_moe
from tritonllm.kernels.moe_route import moe_route
from tritonllm.kernels.moe_tiles import MoeTiles
from tritonllm.kernels.quant_formats import FP4, QuantScheme
from tritonllm.quantization.quantize import quantize_experts

DEVICE = platform.DEVICE
DTYPE = platform.DEFAULT_DTYPE
FP8 = torch.float8_e4m3fnuz if platform.PLATFORM == "rocm" else torch.float8_e4m3fn
TOL = 2e-5 if DTYPE == torch.float32 else 2e-2


def _randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = DTYPE) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(DEVICE, dtype)


def _problem(t: int, e: int, h: int, i: int, top_k: int, seed: int, dtype: torch.dtype = DTYPE) -> dict:
    """Random activations, experts (scaled so the outputs stay O(1)), biases and a softmax routing."""
    weights, ids = reference.moe_route(_randn(t, e, seed=seed, dtype=torch.float32), top_k, True)
    return dict(
        x=_randn(t, h, seed=seed + 1, dtype=dtype),
        w13=_randn(e, 2 * i, h, seed=seed + 2, scale=h**-0.5, dtype=dtype),
        w2=_randn(e, h, i, seed=seed + 3, scale=i**-0.5, dtype=dtype),
        topk_weights=weights,
        topk_ids=ids,
        w13_bias=_randn(e, 2 * i, seed=seed + 4, dtype=dtype),
        w2_bias=_randn(e, h, seed=seed + 5, dtype=dtype),
    )


def _args(p: dict, bias: bool) -> tuple[tuple, dict]:
    biases = dict(w13_bias=p["w13_bias"], w2_bias=p["w2_bias"]) if bias else {}
    return (p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"]), biases


# ---- routing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_matches_reference(scoring, renormalize) -> None:
    for t, e, top_k in [(1, 6, 2), (5, 8, 3), (19, 130, 16)]:  # 130 experts: a 256-wide padded row
        logits = _randn(t, e, seed=t + e, scale=2.0)
        weights, ids = moe_route(logits, top_k, renormalize, scoring)
        ref_weights, ref_ids = reference.moe_route(logits, top_k, renormalize, scoring)
        assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and ids.shape == (t, top_k)
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)


def test_route_ties_go_to_the_lower_id() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0, 2.0], [0.0] * 6], device=DEVICE)
    _, ids = moe_route(logits, 4, False, "sigmoid")
    assert ids.tolist() == [[1, 2, 4, 5], [0, 1, 2, 3]]


@pytest.mark.parametrize("t", [1, 3])
def test_route_zero_scores_and_every_expert(t) -> None:
    """Scores that underflow to exactly 0 (softmax over logits hundreds apart) tie among themselves and still
    rank above the padding (6 experts in a row of 8): top_k = E picks every expert, zeros by id (torch's topk
    orders such ties as it likes: the reference is compared by value)."""
    row = [0.0, -200.0, -300.0, 5.0, -150.0, -1000.0]
    logits = torch.tensor([row] * t, device=DEVICE)
    weights, ids = moe_route(logits, 6, False, "softmax")
    ref_weights, ref_ids = reference.moe_route(logits, 6, False, "softmax")
    assert ids.tolist() == [[3, 0, 1, 2, 4, 5]] * t
    assert ref_ids[:, :2].tolist() == [[3, 0]] * t and float(ref_weights[:, 2:].abs().max()) == 0.0
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=0.0)


def test_route_nan_logits_still_give_valid_distinct_experts() -> None:
    """A row of NaN logits (an overflowed activation upstream) must not route to an expert id past E, which the
    expert kernels would read out of bounds: every pick is a valid, distinct id (a NaN score's bits are one key)."""
    logits = torch.full((2, 6), float("nan"), device=DEVICE)
    logits[1, 2] = 0.0  # one finite logit: softmax is NaN across the row all the same
    _, ids = moe_route(logits, 4, True)
    assert ids.tolist() == [[0, 1, 2, 3]] * 2


# ---- fused experts -----------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("t, e, top_k", [(1, 6, 2), (5, 8, 3), (19, 6, 2)])
def test_fused_moe_matches_reference(t, e, top_k, activation, bias) -> None:
    p = _problem(t, e, 48, 40, top_k, seed=10 * t + e)
    if activation == "swiglu_oai":  # some gate / up values past the clamp
        p["x"] = 4 * p["x"]
    args, kwargs = _args(p, bias)
    got = fused_moe(*args, activation=activation, **kwargs)
    expected = reference.fused_moe(*args, activation=activation, **kwargs)
    assert got.shape == expected.shape and got.dtype == DTYPE
    assert_close_to_scale(got, expected, TOL)


GEMV_TILES = {"gemv_16x16": g.GemmTiles(1, 16, 16, 1, 1, 1, gemv=True),
              "gemv_8x32": g.GemmTiles(1, 8, 32, 1, 1, 1, gemv=True)}  # fmt: skip


@pytest.mark.parametrize(
    "tiles",
    [g.GemmTiles(16, 16, 16, 1, 1, 2), g.GemmTiles(32, 32, 16, 1, 1, 1, 1), *GEMV_TILES.values()],
    ids=["16x16x16", "32x32x16", *GEMV_TILES],
)
def test_fused_moe_with_several_tiles_and_k_steps(tiles) -> None:
    """Small tiles: several column tiles and K steps, K both even (H 48) and ragged (I 40); the grouped
    GEMM and the GEMV (kernels/moe_gemv.py: one program per pair, no alignment)."""
    p = _problem(19, 8, 48, 40, 3, seed=3)
    args, kwargs = _args(p, True)
    got = fused_moe(*args, tiles=MoeTiles(tiles, tiles), **kwargs)
    assert_close_to_scale(got, reference.fused_moe(*args, **kwargs), TOL)


GEMV_VARIANTS = {"joint": dict(joint=True), "sum_slots": dict(sum_slots=True), "both": dict(joint=True, sum_slots=True)}


def _spy(monkeypatch, kernel: str, record) -> list:
    """What record(grid, kwargs) makes of each launch of kernels/moe.py's `kernel`, in order (the launches run)."""
    from tritonllm.kernels import moe

    seen, real = [], getattr(moe, kernel)

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(record(grid, kwargs))
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(moe, kernel, Spy())
    return seen


def _spy_gemv(monkeypatch) -> list[dict]:
    """The GEMV launches' JOINT / SLOTS / REDUCE flags and grids, in order."""
    return _spy(monkeypatch, "moe_gemv_kernel", lambda grid, kw: dict(joint=kw["JOINT"], slots=kw["SLOTS"],
                                                                      reduce=kw["REDUCE"], grid=tuple(grid)))  # fmt: skip


@pytest.mark.parametrize("variant", GEMV_VARIANTS)
@pytest.mark.parametrize(
    "top_k, tiles", [(3, GEMV_TILES["gemv_16x16"]), (2, GEMV_TILES["gemv_8x32"])], ids=["k3", "k2"]
)
def test_gemv_variants_match_reference(variant, top_k, tiles, monkeypatch) -> None:
    """The GEMV's gate and up rows in one pass (joint) and w2 summing each token's slots in registers
    (sum_slots: top-3 pads to four slots, one masked), with biases, several column tiles and K steps,
    K even (H 48) and ragged (I 40); the launches take the variant asked for."""
    seen = _spy_gemv(monkeypatch)
    p = _problem(5, 8, 48, 40, top_k, seed=21 + top_k)
    args, kwargs = _args(p, True)
    flags = GEMV_VARIANTS[variant]
    got = fused_moe(*args, tiles=MoeTiles(tiles, tiles, **flags), activation="swiglu_oai", **kwargs)
    assert_close_to_scale(got, reference.fused_moe(*args, activation="swiglu_oai", **kwargs), TOL)
    slots = 4 if top_k == 3 else 2
    w13, w2 = seen
    assert w13["joint"] == flags.get("joint", False) and w13["slots"] == 0 and w13["grid"][1] == 5 * top_k
    assert w2["slots"] == (slots if flags.get("sum_slots") else 0) and w2["grid"][1] == (
        5 if w2["slots"] else 5 * top_k
    )
    if w2["slots"]:  # the slots share the tile's rows
        assert w2["grid"][0] == -(-48 // max(1, tiles.block_n // slots))


@pytest.mark.parametrize(
    "scheme, h, i",
    [(QuantScheme(FP8, "block", "group"), 128, 40), (QuantScheme(FP4, "mx", "none"), 64, 96)],
    ids=["fp8_block", "mxfp4"],
)
def test_gemv_variants_with_quantized_experts(scheme, h, i, monkeypatch) -> None:
    """joint and sum_slots on FP8 block-128 experts (H 128: w2's scales whole row blocks) and MXFP4
    (words; K 96 ragged against the 64-column tile), against the reference."""
    seen = _spy_gemv(monkeypatch)
    p = _problem(3, 6, h, i, 2, seed=17)
    w13, w2 = quantize_experts(p["w13"].float(), scheme), quantize_experts(p["w2"].float(), scheme)
    args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
    kwargs = dict(activation="swiglu_oai", w13_bias=p["w13_bias"], w2_bias=p["w2_bias"])
    block_k = 64 if scheme.act == "none" else 32
    tiles = MoeTiles(*[g.GemmTiles(1, 16, block_k, 1, 1, 1, gemv=True)] * 2, joint=True, sum_slots=True)
    got = fused_moe(*args, tiles=tiles, **kwargs)
    tol = 1e-2 if scheme.act == "group" else (4 * TOL if DTYPE == torch.float32 else 2e-2)
    assert_close_to_scale(got, reference.fused_moe(*args, **kwargs), tol)
    assert [(s["joint"], s["slots"]) for s in seen] == [(True, 0), (False, 2)]


def _assert_refused(monkeypatch, name: str, value: str, switch) -> None:
    """An A/B switch (a cached moe_tiles reader) refuses an unknown value by the variable's name."""
    monkeypatch.setenv(name, value)
    switch.cache_clear()
    with pytest.raises(ValueError, match=name):
        switch()


@pytest.mark.parametrize("reduce", [0, 1, 2])
@pytest.mark.parametrize("fp8", [False, True], ids=["float", "fp8_block"])
def test_gemv_k_reductions_match_reference(reduce, fp8, monkeypatch) -> None:
    """Each way the float GEMV sums its K tiles (REDUCE: every step across threads, once after the loop,
    every step within each thread's eight columns) on ragged K (I 40 against 32-column tiles; FP8: H 128,
    I 136), plain and with joint + sum_slots, against the reference; the launches take the mode set."""
    from tritonllm.kernels import moe_tiles

    seen = _spy_gemv(monkeypatch)
    monkeypatch.setenv("TRITONLLM_MOE_GEMV_REDUCE", str(reduce))
    moe_tiles.gemv_reduce.cache_clear()
    try:
        h, i = (128, 136) if fp8 else (48, 40)
        p = _problem(3, 6, h, i, 3, seed=40 + reduce)
        w13, w2 = p["w13"], p["w2"]
        if fp8:
            scheme = QuantScheme(FP8, "block", "group")
            w13, w2 = quantize_experts(w13.float(), scheme), quantize_experts(w2.float(), scheme)
        args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
        kwargs = dict(activation="swiglu_oai", w13_bias=p["w13_bias"], w2_bias=p["w2_bias"])
        expected = reference.fused_moe(*args, **kwargs)
        tol = 1e-2 if fp8 else TOL
        t = g.GemmTiles(1, 32, 32, 1, 1, 1, gemv=True)  # several column tiles, the last ragged
        for flags in ({}, dict(joint=True, sum_slots=True)):
            assert_close_to_scale(fused_moe(*args, tiles=MoeTiles(t, t, **flags), **kwargs), expected, tol)
        assert [s["reduce"] for s in seen] == [reduce] * 4
        _assert_refused(monkeypatch, "TRITONLLM_MOE_GEMV_REDUCE", "3", moe_tiles.gemv_reduce)
    finally:
        moe_tiles.gemv_reduce.cache_clear()


@pytest.mark.parametrize("loads", [0, 1, 2])
@pytest.mark.parametrize("kind", ["mxfp4", "fp8_block", "float"])
def test_gemv_load_schedules_match_reference(loads, kind, monkeypatch) -> None:
    """Each schedule of the GEMV's loads (LOADS: the scales after the products / the activation's layout
    change, every load at the top of its step, a step ahead) on K even over several steps (MXFP4: H 256
    against 64-column tiles, where the step past the end reloads the last; float: H 128 on 32) and ragged
    (I 96 / 40; FP8 block: H 128, I 136 on 32-column tiles), plain and with joint + sum_slots (float: under
    the K reductions 0 and 2 too), against the reference; the launches take the schedule set, and an
    unknown one is refused by name."""
    from tritonllm.kernels import moe_tiles

    seen = _spy(monkeypatch, "moe_gemv_kernel", lambda grid, kw: kw["LOADS"])
    monkeypatch.setenv("TRITONLLM_MOE_GEMV_LOADS", str(loads))
    moe_tiles.gemv_loads.cache_clear()
    try:
        # FP8 block in bf16: w13's output is rounded to bf16 before its per-group FP8 quantization (the reference
        # quantizes the float32 value), so some FP8 codes differ by one step: 0.7-1.7% of the output's scale
        # depending on the seed (the H100 failed 1e-2 at 1.2%), the same under every schedule
        fp8_tol = 1e-2 if DTYPE == torch.float32 else 3e-2
        h, i, block_k, tol = {"mxfp4": (256, 96, 64, 4 * TOL if DTYPE == torch.float32 else 2e-2),
                              "fp8_block": (128, 136, 32, fp8_tol), "float": (128, 40, 32, TOL)}[kind]  # fmt: skip
        p = _problem(3, 6, h, i, 3, seed=50)  # every schedule on the same problem
        w13, w2 = p["w13"], p["w2"]
        if kind != "float":
            scheme = QuantScheme(FP4, "mx", "none") if kind == "mxfp4" else QuantScheme(FP8, "block", "group")
            w13, w2 = quantize_experts(w13.float(), scheme), quantize_experts(w2.float(), scheme)
        args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
        kwargs = dict(activation="swiglu_oai", w13_bias=p["w13_bias"], w2_bias=p["w2_bias"])
        expected = reference.fused_moe(*args, **kwargs)
        t = g.GemmTiles(1, 32, block_k, 1, 1, 1, gemv=True)  # several column tiles, the last ragged
        for reduce in (0, 2) if kind == "float" else (2,):
            monkeypatch.setenv("TRITONLLM_MOE_GEMV_REDUCE", str(reduce))
            moe_tiles.gemv_reduce.cache_clear()
            for flags in ({}, dict(joint=True, sum_slots=True)):
                assert_close_to_scale(fused_moe(*args, tiles=MoeTiles(t, t, **flags), **kwargs), expected, tol)
        assert seen == [loads] * len(seen) and len(seen) == (8 if kind == "float" else 4)
        _assert_refused(monkeypatch, "TRITONLLM_MOE_GEMV_LOADS", "3", moe_tiles.gemv_loads)
    finally:
        moe_tiles.gemv_loads.cache_clear()
        moe_tiles.gemv_reduce.cache_clear()


@pytest.mark.parametrize("loads", [1, 2])
@pytest.mark.parametrize("i", [192, 160], ids=["even_k", "ragged_k"])
def test_w2_early_loads_match_reference(loads, i, monkeypatch) -> None:
    """w2's MXFP4 slot GEMV with its ids and first K step's weights loaded before the PDL wait (EARLY; the
    interpreter runs it without PDL, same numerics): w2's K (I) over several 64-column steps, even and
    ragged (160: the last step masked), both load schedules that take it, against the reference;
    only w2 takes EARLY, and the switch off (or an unknown value, refused by name) leaves it off."""
    from tritonllm.kernels import moe_tiles

    seen = _spy(monkeypatch, "moe_gemv_kernel", lambda grid, kw: (kw["SLOTS"], kw["EARLY"]))
    monkeypatch.setenv("TRITONLLM_MOE_GEMV_LOADS", str(loads))
    monkeypatch.setenv("TRITONLLM_MOE_GEMV_EARLY", "1")
    moe_tiles.gemv_loads.cache_clear()
    moe_tiles.gemv_early.cache_clear()
    try:
        p = _problem(3, 6, 64, i, 3, seed=60 + loads)
        scheme = QuantScheme(FP4, "mx", "none")
        w13, w2 = quantize_experts(p["w13"].float(), scheme), quantize_experts(p["w2"].float(), scheme)
        args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
        kwargs = dict(activation="swiglu_oai", w13_bias=p["w13_bias"], w2_bias=p["w2_bias"])
        expected = reference.fused_moe(*args, **kwargs)
        tiles = MoeTiles(*[g.GemmTiles(1, 16, 64, 1, 1, 1, gemv=True)] * 2, joint=True, sum_slots=True)
        tol = 4 * TOL if DTYPE == torch.float32 else 2e-2
        assert_close_to_scale(fused_moe(*args, tiles=tiles, **kwargs), expected, tol)
        assert seen == [(0, False), (4, True)]
        monkeypatch.setenv("TRITONLLM_MOE_GEMV_EARLY", "0")
        moe_tiles.gemv_early.cache_clear()
        fused_moe(*args, tiles=tiles, **kwargs)
        assert seen[2:] == [(0, False), (4, False)]
        _assert_refused(monkeypatch, "TRITONLLM_MOE_GEMV_EARLY", "2", moe_tiles.gemv_early)
    finally:
        moe_tiles.gemv_loads.cache_clear()
        moe_tiles.gemv_early.cache_clear()


def test_sum_slots_falls_back_where_the_experts_do_not_read_as_one_matrix(monkeypatch) -> None:
    """FP8 block experts with H 48 (w2's 128-row scale blocks span experts) and float experts that are
    a slice of wider storage take the per-slot buffer, with the same result."""
    seen = _spy_gemv(monkeypatch)
    tiles = MoeTiles(*[GEMV_TILES["gemv_16x16"]] * 2, sum_slots=True)
    p = _problem(3, 6, 48, 40, 2, seed=19)
    scheme = QuantScheme(FP8, "block", "group")
    w13, w2 = quantize_experts(p["w13"].float(), scheme), quantize_experts(p["w2"].float(), scheme)
    args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
    assert_close_to_scale(fused_moe(*args, tiles=tiles), reference.fused_moe(*args), 1e-2)
    wide = torch.zeros(6, 56, 40, device=DEVICE, dtype=DTYPE)
    wide[:, :48] = p["w2"]
    args = (p["x"], p["w13"], wide[:, :48], p["topk_weights"], p["topk_ids"])
    assert_close_to_scale(fused_moe(*args, tiles=tiles), reference.fused_moe(*args), TOL)
    assert [s["slots"] for s in seen] == [0, 0, 0, 0]


def test_variants_override_from_the_environment(monkeypatch) -> None:
    from tritonllm.kernels import moe_tiles

    cases = (("joint,sum_slots", (True, True, False, False)), ("sum_slots,tma", (False, True, True, True)),
             ("tma_w2", (False, False, False, True)), ("none", (False, False, False, False)))  # fmt: skip
    for text, (joint, sum_slots, tma_w13, tma_w2) in cases:
        monkeypatch.setenv("TRITONLLM_MOE_VARIANTS", text)
        moe_tiles.variants_override.cache_clear()
        tiles = moe_tiles.pick_moe_tiles("bfloat16", 128, 2048, 768, 1, 8, 2, 2)
        assert tiles.gemv and (tiles.joint, tiles.sum_slots, tiles.tma_w13, tiles.tma_w2) == (joint, sum_slots, 0, 0)
        tiles = moe_tiles.pick_moe_tiles("bfloat16", 128, 2048, 768, 4096, 8, 2, 2)
        assert not tiles.gemv and (tiles.joint, tiles.sum_slots, tiles.tma_w13, tiles.tma_w2) == (0, 0, tma_w13, tma_w2)
    monkeypatch.setenv("TRITONLLM_MOE_VARIANTS", "joint,fast")
    moe_tiles.variants_override.cache_clear()
    with pytest.raises(ValueError, match="joint.*sum_slots"):
        moe_tiles.pick_moe_tiles("bfloat16", 128, 2048, 768, 1, 8, 2, 2)
    monkeypatch.delenv("TRITONLLM_MOE_VARIANTS")
    moe_tiles.variants_override.cache_clear()
    with pytest.raises(ValueError, match="variants of the GEMV"):
        MoeTiles(g.GemmTiles(16, 16, 16), g.GemmTiles(16, 16, 16), sum_slots=True)
    with pytest.raises(ValueError, match="variants of the grouped GEMM"):
        MoeTiles(GEMV_TILES["gemv_16x16"], GEMV_TILES["gemv_16x16"], tma_w2=True)


def _spy_grouped(monkeypatch, sorted_flags: bool = False) -> list:
    """The grouped GEMM launches' TMA_B flags (sorted_flags: (TMA_B, SORTED_C, SORTED_A, A through a
    descriptor)), in order."""

    def record(grid, kw):
        flags = (kw["TMA_B"], kw["SORTED_C"], kw["SORTED_A"], kw["TMA_A"])
        return flags if sorted_flags else flags[0]

    return _spy(monkeypatch, "fused_moe_kernel", record)


@pytest.mark.parametrize(
    "tiles",
    [g.GemmTiles(16, 16, 16, 1, 1, 2), g.GemmTiles(32, 32, 32, 1, 1, 1)],
    ids=["16x16x16", "32x32x32"],
)
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_grouped_gemm_reads_the_experts_through_a_descriptor(tiles, activation, monkeypatch) -> None:
    """tma_w13 / tma_w2: B's tiles through a tensor descriptor of the stacked experts; I 40 is not a
    multiple of BLOCK_N (the last gate tile reads up rows, the last expert's up tile reads past the
    end: zeros), K ragged against BLOCK_K (H 48 / 32, I 40). Each launch separately and both."""
    seen = _spy_grouped(monkeypatch)
    p = _problem(19, 8, 48, 40, 3, seed=29)
    if activation == "swiglu_oai":
        p["x"] = 4 * p["x"]
    args, kwargs = _args(p, True)
    expected = reference.fused_moe(*args, activation=activation, **kwargs)
    for flags in (dict(tma_w13=True), dict(tma_w2=True), dict(tma_w13=True, tma_w2=True)):
        seen.clear()
        got = fused_moe(*args, tiles=MoeTiles(tiles, tiles, **flags), activation=activation, **kwargs)
        assert_close_to_scale(got, expected, TOL)
        assert seen == [flags.get("tma_w13", False), flags.get("tma_w2", False)]


@pytest.mark.parametrize("block_n, one_group", [(64, True), (128, True), (256, False)])
def test_fp8_block_grouped_gemm_with_one_b_scale_a_tile(block_n, one_group, monkeypatch) -> None:
    """FP8 block experts with I and H whole 128-row scale blocks (I 256: w13's up rows start at block 2):
    tiles within one block load B's scale once a K step (ONE_B_GROUP, both launches), a tile spanning
    two does not; against the reference, with scales that differ from block to block (so a wrong block's
    scale is caught). Where N is not whole blocks (w13 at I 40) the gated launch keeps a scale a column."""
    seen = _spy(monkeypatch, "fused_moe_kernel", lambda grid, kw: kw["ONE_B_GROUP"])
    scheme = QuantScheme(FP8, "block", "group")
    p = _problem(9, 4, 256, 256, 2, seed=61)
    scale = torch.tensor([1.0, 4.0, 0.25, 2.0], device=DEVICE, dtype=DTYPE)  # per 128-row block of w13 / w2
    w13 = p["w13"] * scale.repeat_interleave(128)[:, None]
    w2 = p["w2"] * scale[:2].repeat_interleave(128)[:, None]
    w13, w2 = quantize_experts(w13.float(), scheme), quantize_experts(w2.float(), scheme)
    assert w13.scale[0, 1].min() > 4 * w13.scale[0, 2].max(), "the blocks' scales should differ"
    args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
    t = g.GemmTiles(16, block_n, 128, 4, 1, 1)
    got = fused_moe(*args, tiles=MoeTiles(t, t))
    assert_close_to_scale(got, reference.fused_moe(*args), 1e-2)
    assert seen == [one_group, one_group]
    if block_n == 64:  # the A/B switch: a scale a column, the same result
        monkeypatch.setenv("TRITONLLM_MOE_FP8_B_SCALE", "column")
        assert_close_to_scale(fused_moe(*args, tiles=MoeTiles(t, t)), got, 1e-3)
        assert seen[2:] == [False, False]
        monkeypatch.delenv("TRITONLLM_MOE_FP8_B_SCALE")
        del seen[2:]
        q = _problem(5, 4, 128, 40, 2, seed=62)
        args = (q["x"], *(quantize_experts(q[w].float(), scheme) for w in ("w13", "w2")), q["topk_weights"],
                q["topk_ids"])  # fmt: skip
        assert_close_to_scale(fused_moe(*args, tiles=MoeTiles(t, t)), reference.fused_moe(*args), 1e-2)
        assert seen[2:] == [False, True]


@pytest.mark.parametrize("fp8", [False, True], ids=["float", "fp8_block"])
def test_w2_reads_an_intermediate_in_block_order(fp8, monkeypatch) -> None:
    """sorted_w2: w13 writes the intermediate in the alignment's order (padding rows too) and w2 reads
    each block's rows whole through a descriptor; alone and with both B descriptors; FP8 block experts
    quantize that intermediate per row group as before."""
    seen = _spy_grouped(monkeypatch, sorted_flags=True)
    p = _problem(19, 6, 64, 96, 3, seed=37)
    args, kwargs = _args(p, True)
    tol = TOL
    if fp8:
        scheme = QuantScheme(FP8, "block", "group")
        args = (p["x"], quantize_experts(p["w13"].float(), scheme), quantize_experts(p["w2"].float(), scheme),
                p["topk_weights"], p["topk_ids"])  # fmt: skip
        tol = 1e-2
    expected = reference.fused_moe(*args, **kwargs)
    base = g.GemmTiles(16, 32, 32, 1, 1, 1)
    for flags in (dict(sorted_w2=True), dict(sorted_w2=True, tma_w13=True, tma_w2=True)):
        seen.clear()
        got = fused_moe(*args, tiles=MoeTiles(base, base, **flags), **kwargs)
        assert_close_to_scale(got, expected, tol)
        tma = flags.get("tma_w2", False)
        assert seen == [(tma, True, False, False), (tma, False, True, True)]


def test_a_wrong_block_order_is_caught(monkeypatch) -> None:
    """Negative check: w2 reading the sorted intermediate one block off fails the tolerance."""
    from tritonllm.kernels import moe

    p = _problem(19, 6, 64, 96, 3, seed=37)
    args, kwargs = _args(p, True)
    real = moe.TensorDescriptor.from_tensor

    def shifted(t, block):  # A's descriptor over the intermediate minus its first block
        return real(t[block[0] :], block) if t.dtype == DTYPE and t.shape[1] == 96 else real(t, block)

    monkeypatch.setattr(moe.TensorDescriptor, "from_tensor", staticmethod(shifted))
    base = g.GemmTiles(16, 32, 32, 1, 1, 1)
    got = fused_moe(*args, tiles=MoeTiles(base, base, sorted_w2=True), **kwargs)
    with pytest.raises(AssertionError):
        assert_close_to_scale(got, reference.fused_moe(*args, **kwargs), TOL)


def test_grouped_gemm_descriptor_with_fp8_experts_and_fallbacks(monkeypatch) -> None:
    """FP8 block-128 experts through the descriptor (e4m3 boxes, the scales as before); MXFP4 experts
    (decoded from bytes) and a slice of wider storage keep the pointer loads, with the same result."""
    seen = _spy_grouped(monkeypatch)
    tiles = MoeTiles(*[g.GemmTiles(16, 32, 32, 1, 1, 1)] * 2, tma_w13=True, tma_w2=True)
    p = _problem(19, 6, 64, 96, 2, seed=31)
    for scheme, tol, expect in ((QuantScheme(FP8, "block", "group"), 1e-2, [True, True]),
                                (QuantScheme(FP4, "mx", "none"), 4 * TOL if DTYPE == torch.float32 else 2e-2, [False, False])):  # fmt: skip
        seen.clear()
        w13, w2 = quantize_experts(p["w13"].float(), scheme), quantize_experts(p["w2"].float(), scheme)
        args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
        assert_close_to_scale(fused_moe(*args, tiles=tiles), reference.fused_moe(*args), tol)
        assert seen == expect
    seen.clear()
    wide = torch.zeros(6, 72, 96, device=DEVICE, dtype=DTYPE)
    wide[:, :64] = p["w2"]
    args = (p["x"], p["w13"], wide[:, :64], p["topk_weights"], p["topk_ids"])
    assert_close_to_scale(fused_moe(*args, tiles=tiles), reference.fused_moe(*args), TOL)
    assert seen == [True, False]


def test_decode_batches_take_the_gemv_by_default(monkeypatch) -> None:
    """Few pairs per expert: the GEMV, and no alignment is computed; many: the grouped GEMM."""
    from tritonllm.kernels import moe

    aligned, align = [], moe.moe_align
    monkeypatch.setattr(moe, "moe_align", lambda *a: aligned.append(a) or align(*a))
    for t, expect_gemv in ((2, True), (19, False)):
        p = _problem(t, 8, 48, 40, 2, seed=13)
        args, kwargs = _args(p, True)
        aligned.clear()
        assert_close_to_scale(fused_moe(*args, **kwargs), reference.fused_moe(*args, **kwargs), TOL)
        assert (not aligned) == expect_gemv


def test_mixed_gemv_and_grouped_tiles_are_refused() -> None:
    with pytest.raises(ValueError, match="GEMV"):
        MoeTiles(GEMV_TILES["gemv_16x16"], g.GemmTiles(1, 16, 16))


def test_top_1_writes_out_directly() -> None:
    p = _problem(5, 6, 48, 40, 1, seed=4)
    args, kwargs = _args(p, True)
    out = torch.full_like(p["x"], float("nan"))
    assert fused_moe(*args, out=out, **kwargs) is out
    assert_close_to_scale(out, reference.fused_moe(*args, **kwargs), TOL)


@pytest.mark.skipif(platform.is_gpu(), reason="the float16 interpreter case; the GPU runs bfloat16 below")
def test_float16() -> None:
    p = _problem(5, 6, 48, 40, 2, seed=5, dtype=torch.float16)
    args, kwargs = _args(p, True)
    assert_close_to_scale(fused_moe(*args, **kwargs), reference.fused_moe(*args, **kwargs), 1e-2)


def test_a_wrong_result_fails_the_tolerance() -> None:
    """Negative checks: a dropped expert, or top-k weights off by 1%, are caught by the tolerance above."""
    p = _problem(5, 8, 48, 40, 3, seed=6)
    args, kwargs = _args(p, True)
    expected = reference.fused_moe(*args, **kwargs)
    dropped = p["topk_weights"].clone()
    dropped[2, 1] = 0.0
    off = p["topk_weights"] * 1.01
    for weights in (dropped, off):
        got = fused_moe(p["x"], p["w13"], p["w2"], weights, p["topk_ids"], **kwargs)
        with pytest.raises(AssertionError):
            assert_close_to_scale(got, expected, TOL)


# ---- quantized experts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "scheme, h, i",
    [(QuantScheme(FP8, "block", "group"), 48, 40), (QuantScheme(FP4, "mx", "none"), 64, 96)],
    ids=["fp8_block", "mxfp4"],
)
@pytest.mark.parametrize(
    "gemv, activation", [(False, "silu"), (False, "swiglu_oai"), (True, "swiglu_oai")], ids=["silu", "oai", "gemv_oai"]
)
def test_quantized_experts_match_reference(scheme, h, i, activation, gemv) -> None:
    p = _problem(19, 6, h, i, 2, seed=7)
    w13, w2 = quantize_experts(p["w13"].float(), scheme), quantize_experts(p["w2"].float(), scheme)
    args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
    kwargs = dict(activation=activation, w13_bias=p["w13_bias"], w2_bias=p["w2_bias"])
    # GEMV K tiles: two MXFP4 scale groups (K 64 even, 96 ragged), within one FP8 128-group
    tiles = MoeTiles(*[g.GemmTiles(1, 32, 64 if scheme.act == "none" else 32, 1, 1, 1, gemv=True)] * 2)
    got = fused_moe(*args, tiles=tiles if gemv else None, **kwargs)
    # FP8: the kernels' activation quantization may round a boundary value the other way
    tol = 1e-2 if scheme.act == "group" else (4 * TOL if DTYPE == torch.float32 else 2e-2)
    assert_close_to_scale(got, reference.fused_moe(*args, **kwargs), tol)


def test_mxfp4_gemv_reads_the_experts_as_words(monkeypatch) -> None:
    """The GEMV path's MXFP4 experts go through the word decode (kernels/gemv_w4.py), and its result
    matches the reference; experts at an odd byte offset fall back to the byte decode."""
    from tritonllm.kernels import moe as moe_module

    seen = []
    real = moe_module.as_words
    monkeypatch.setattr(moe_module, "as_words", lambda t: seen.append(real(t) is not None) or real(t))
    scheme = QuantScheme(FP4, "mx", "none")
    p = _problem(3, 6, 64, 96, 2, seed=9)
    w13, w2 = quantize_experts(p["w13"].float(), scheme), quantize_experts(p["w2"].float(), scheme)
    args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
    tiles = MoeTiles(*[g.GemmTiles(1, 16, 64, 1, 1, 1, gemv=True)] * 2)
    expected = reference.fused_moe(*args, activation="swiglu_oai")
    assert_close_to_scale(fused_moe(*args, tiles=tiles, activation="swiglu_oai"), expected, 4 * TOL)
    assert seen == [True, True]
    odd = torch.empty(w2.data.numel() + 1, dtype=torch.uint8, device=w2.data.device)[1:].view_as(w2.data)
    odd.copy_(w2.data)
    w2.data = odd
    got = fused_moe(*args, tiles=tiles, activation="swiglu_oai")
    assert seen[2:] == [True, False]
    assert_close_to_scale(got, expected, 4 * TOL)


def test_unserved_formats_are_refused() -> None:
    p = _problem(1, 6, 48, 40, 2, seed=8)
    w13 = quantize_experts(p["w13"].float(), QuantScheme(FP8, "channel", "token"))
    with pytest.raises(ValueError, match="not among"):
        fused_moe(p["x"], w13, p["w2"], p["topk_weights"], p["topk_ids"])


# ---- GPU: bfloat16, model-sized, graph capture ----------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="bfloat16 tl.dot and CUDA graphs need the GPU")
@pytest.mark.parametrize("t", [1, 7, 300])
@pytest.mark.parametrize("e, top_k, h, i", [(128, 8, 2048, 768), (8, 2, 1024, 1408)], ids=["qwen3", "mixtral"])
def test_bf16_model_shapes(t, e, top_k, h, i) -> None:
    p = _problem(t, e, h, i, top_k, seed=9, dtype=torch.bfloat16)
    for bias in (False, True):
        args, kwargs = _args(p, bias)
        assert_close_to_scale(fused_moe(*args, **kwargs), reference.fused_moe(*args, **kwargs), 2e-2)
    for scheme in (QuantScheme(FP8, "block", "group"), QuantScheme(FP4, "mx", "none")):
        w13, w2 = quantize_experts(p["w13"], scheme), quantize_experts(p["w2"], scheme)
        args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
        assert_close_to_scale(fused_moe(*args), reference.fused_moe(*args), 3e-2)


GPU_VARIANTS = {
    True: [dict(joint=True), dict(sum_slots=True), dict(joint=True, sum_slots=True)],  # the GEMV's
    False: [dict(tma_w13=True, tma_w2=True), dict(sorted_w2=True), dict(tma_w13=True, tma_w2=True, sorted_w2=True)],
}


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="bfloat16 tl.dot, TMA and CUDA graphs need the GPU")
@pytest.mark.parametrize("t", [1, 4, 300])
@pytest.mark.parametrize(
    "e, top_k, h, i, activation",
    [(128, 8, 2048, 768, "silu"), (32, 4, 2880, 2880, "swiglu_oai")],
    ids=["qwen3", "gptoss"],
)
def test_variants_at_model_shapes(t, e, top_k, h, i, activation, monkeypatch) -> None:
    """Every variant of the picked tiles (the GEMV's at 1 and 4 tokens, the grouped GEMM's descriptor
    reads at 300) at Qwen3-30B-A3B's and gpt-oss-20b's layers, bf16 / FP8 block / MXFP4 experts, with
    biases, against the reference; then one of them captured in a CUDA graph and replayed. The TMA-fed
    kernel (block FP8 at one token by default) is off: these are the Triton GEMV's variants."""
    from dataclasses import replace

    from tritonllm.kernels import moe_skinny_sm90
    from tritonllm.kernels.moe import moe_tiles_for

    monkeypatch.setattr(moe_skinny_sm90, "PLAN", None)

    p = _problem(t, e, h, i, top_k, seed=41, dtype=torch.bfloat16)
    kwargs = dict(activation=activation, w13_bias=p["w13_bias"], w2_bias=p["w2_bias"])
    for scheme in (None, QuantScheme(FP8, "block", "group"), QuantScheme(FP4, "mx", "none")):
        w13, w2 = (
            (p["w13"], p["w2"])
            if scheme is None
            else (quantize_experts(p["w13"], scheme), quantize_experts(p["w2"], scheme))
        )
        args = (p["x"], w13, w2, p["topk_weights"], p["topk_ids"])
        expected = reference.fused_moe(*args, **kwargs)
        picked = moe_tiles_for(p["x"], w13, w2, top_k)
        for flags in GPU_VARIANTS[picked.gemv]:
            got = fused_moe(*args, tiles=replace(picked, **flags), **kwargs)
            assert_close_to_scale(got, expected, 2e-2 if scheme is None else 3e-2)
    tiles = replace(picked, **GPU_VARIANTS[picked.gemv][-1])
    out = torch.empty_like(p["x"])
    run = lambda: fused_moe(*args, tiles=tiles, out=out, **kwargs)  # noqa: E731
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_scale(out, expected, 3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="CUDA graphs need the GPU")
def test_decode_step_runs_without_host_syncs_and_replays_from_a_graph() -> None:
    p = _problem(4, 128, 512, 256, 8, seed=11, dtype=torch.bfloat16)
    logits = _randn(4, 128, seed=12, dtype=torch.bfloat16)

    def step() -> torch.Tensor:
        weights, ids = moe_route(logits, 8, True)
        return fused_moe(p["x"], p["w13"], p["w2"], weights, ids)

    expected = step()  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="PDL and CUDA graphs need the GPU")
def test_w2_early_loads_read_each_replays_routing_under_pdl(monkeypatch) -> None:
    """w2's MXFP4 slot GEMV reads its expert ids before its PDL wait (EARLY): in a CUDA graph of router +
    w13 + w2 launched with PDL, every replay's new router logits must reach w2 (a stale id would pick
    another expert's rows): each of several replays against the reference of its own routing."""
    from tritonllm.kernels import launch, moe_tiles

    if not launch.pdl_supported():
        pytest.skip("PDL needs NVIDIA compute capability 9.0+")
    monkeypatch.setenv("TRITONLLM_MOE_GEMV_EARLY", "1")
    moe_tiles.gemv_early.cache_clear()
    seen = _spy(monkeypatch, "moe_gemv_kernel", lambda grid, kw: kw["EARLY"])
    before = launch.pdl_on()
    try:
        launch.set_pdl(True)
        p = _problem(1, 32, 2880, 2880, 4, seed=70, dtype=torch.bfloat16)
        scheme = QuantScheme(FP4, "mx", "none")
        w13, w2 = quantize_experts(p["w13"].float(), scheme), quantize_experts(p["w2"].float(), scheme)
        logits = torch.empty(1, 32, device="cuda", dtype=torch.bfloat16)
        tiles = MoeTiles(*[g.GemmTiles(1, 16, 1024, 4, 2, 1, gemv=True)] * 2, joint=True, sum_slots=True)

        def step() -> torch.Tensor:
            weights, ids = moe_route(logits, 4, True)
            return fused_moe(p["x"], w13, w2, weights, ids, activation="swiglu_oai", tiles=tiles)

        logits.copy_(_randn(1, 32, seed=71, dtype=torch.bfloat16))
        step()  # compiles
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        assert True in seen
        for seed in range(72, 80):
            logits.copy_(_randn(1, 32, seed=seed, dtype=torch.bfloat16))
            graph.replay()
            torch.cuda.synchronize()
            weights, ids = reference.moe_route(logits.float(), 4, True)
            expected = reference.fused_moe(p["x"], w13, w2, weights, ids, activation="swiglu_oai")
            assert_close_to_scale(out, expected, 2e-2)
    finally:
        launch.set_pdl(before)
        moe_tiles.gemv_early.cache_clear()


def test_tile_table_lookup(tmp_path, monkeypatch) -> None:
    """tune_moe.py's table: the smallest tuned token count >= T, else the largest; None without an entry."""
    from dataclasses import asdict

    from tritonllm.kernels import moe_tiles

    small, large = g.GemmTiles(16, 64, 128, 4, 4, 8), g.GemmTiles(64, 128, 64, 4, 3, 8)
    entry = lambda t: dict(w13=asdict(t), w2=asdict(t), us=1.0)  # noqa: E731
    path = tmp_path / "moe_GPU.json"
    path.write_text(json.dumps({"bfloat16": {"128,2048,768": {"16": entry(small), "1024": entry(large)}}}))
    monkeypatch.setattr(moe_tiles, "tuned_file", lambda name: path)
    moe_tiles._table.cache_clear()
    try:
        pick = lambda t: moe_tiles.tuned_moe_tiles("bfloat16", 128, 2048, 768, t, "GPU")  # noqa: E731
        assert pick(1).w13 == small and pick(16).w2 == small and pick(17).w13 == large and pick(9000).w13 == large
        assert moe_tiles.tuned_moe_tiles("mxfp4", 128, 2048, 768, 1, "GPU") is None
        # a table of decode sizes only (session 10's gpt-oss sweep had just T = 1): larger batches take the
        # default, not the GEMV; its variants come with the entry
        gemv = g.GemmTiles(1, 16, 512, 4, 2, 1, gemv=True)
        path.write_text(json.dumps({"mxfp4": {"32,2880,2880": {"4": dict(entry(gemv), joint=True, sum_slots=True)}}}))
        moe_tiles._table.cache_clear()
        tiles = moe_tiles.tuned_moe_tiles("mxfp4", 32, 2880, 2880, 2, "GPU")
        assert tiles.gemv and tiles.joint and tiles.sum_slots
        assert moe_tiles.tuned_moe_tiles("mxfp4", 32, 2880, 2880, 5, "GPU") is None
    finally:
        moe_tiles._table.cache_clear()
    assert moe_tiles.default_moe_tiles(0.1, "hopper").gemv and moe_tiles.default_moe_tiles(0.1, "cpu").gemv
    assert moe_tiles.default_moe_tiles(2, "hopper").block_m == 16
    assert moe_tiles.default_moe_tiles(500, "hopper").block_m == 128
    # Hopper's float experts beyond 128 rows an expert: the H100 sweep's winners (four stages, w2 256 wide);
    # MXFP4 and other families keep the three-stage 128 x 128 tile
    wide = moe_tiles.default_moe_tiles(500, "hopper")
    assert (wide.w13.block_n, wide.w13.num_stages, wide.w2.block_n, wide.w2.num_stages) == (128, 4, 256, 4)
    assert moe_tiles.default_moe_tiles(500, "hopper", "mxfp4").w2.block_n == 128
    assert moe_tiles.default_moe_tiles(500, "ampere").w2 == moe_tiles.default_moe_tiles(500, "ampere").w13
    assert (
        moe_tiles.fit_moe_tiles(moe_tiles.default_moe_tiles(500, "hopper"), "fp8_block", 1, 1, "hopper").w2.block_k
        <= 128
    )
    fp8 = moe_tiles.default_moe_tiles(500, "hopper", "fp8_block")  # a 128 x 128 scale block a tile and step
    assert (fp8.block_m, fp8.w13.block_n, fp8.w13.block_k) == (64, 128, 128)


def test_fused_moe_layer_takes_the_triton_moe_by_default() -> None:
    from tritonllm.kernels.registry import default_kernels, select_kernels
    from tritonllm.layers.moe import FusedMoE

    layer = FusedMoE(6, 2, 48, 40, DTYPE, renormalize=False, scoring="sigmoid", activation="swiglu_oai", bias=True)
    for seed, param in enumerate(layer.parameters()):
        param.data = _randn(*param.shape, seed=20 + seed, scale=param.shape[-1] ** -0.5)
    x, logits = _randn(7, 48, seed=30), _randn(7, 6, seed=31)
    assert default_kernels().choice["moe"] == "triton"

    def run() -> torch.Tensor:
        return layer(x, layer.kernels.moe_route(logits, layer.top_k, layer.renormalize, layer.scoring))

    got = run()
    layer.kernels = select_kernels({"moe": "torch_ref"})
    assert_close_to_scale(got, run(), TOL)


def test_default_variants_where_the_h200_measured_them_faster(tmp_path, monkeypatch) -> None:
    """Hopper's defaults (session 27's H200 A/B): the GEMV's joint and sum_slots at one token only, the grouped
    GEMM's descriptor reads for float and FP8-block experts beyond 32 rows an expert (MXFP4: pointer loads);
    nothing on other families; a table entry's named variants win, unnamed ones take the default."""
    from dataclasses import asdict

    from tritonllm.kernels import moe_tiles

    gemv = moe_tiles.default_moe_tiles(0.1, "hopper")
    grouped = moe_tiles.default_moe_tiles(500, "hopper")
    dv = moe_tiles.default_variants
    assert dv(gemv, "hopper", "bfloat16", 1, 0.06) == dict(joint=True, sum_slots=True)
    assert dv(gemv, "hopper", "mxfp4", 1, 0.1) == dict(joint=True, sum_slots=True)
    assert dv(gemv, "hopper", "bfloat16", 4, 0.25) == {}
    on = dict(tma_w13=True, tma_w2=True, sorted_w2=True)
    assert dv(grouped, "hopper", "bfloat16", 1024, 64) == on and dv(grouped, "hopper", "fp8_block", 8192, 512) == on
    assert dv(grouped, "hopper", "mxfp4", 8192, 1024) == {} and dv(grouped, "hopper", "bfloat16", 256, 16) == {}
    assert dv(gemv, "cdna", "bfloat16", 1, 0.06) == {} and dv(grouped, "cpu", "bfloat16", 1024, 64) == {}

    # through pick_moe_tiles as on an H200: a table entry naming joint only keeps it and gets sum_slots' default
    monkeypatch.setattr(moe_tiles.platform, "is_gpu", lambda: True)
    monkeypatch.setattr(moe_tiles.torch.cuda, "get_device_name", lambda device=None: "GPU")
    monkeypatch.setattr(moe_tiles, "gpu_family", lambda: "hopper")
    monkeypatch.setattr(moe_tiles, "variants_override", lambda: None)
    t = gemv.w13
    path = tmp_path / "moe_GPU.json"
    entry = dict(w13=asdict(t), w2=asdict(t), us=1.0, joint=False)
    path.write_text(json.dumps({"bfloat16": {"8,64,32": {"1": entry}}}))
    monkeypatch.setattr(moe_tiles, "tuned_file", lambda name: path)
    moe_tiles._table.cache_clear()
    try:
        picked = moe_tiles.pick_moe_tiles("bfloat16", 8, 64, 32, 1, 2, 2, 2)
        assert picked.gemv and not picked.joint and picked.sum_slots
        big = moe_tiles.pick_moe_tiles("bfloat16", 8, 64, 32, 4096, 2, 2, 2)  # no entry this large: the default
        assert not big.gemv and big.tma_w13 and big.tma_w2 and big.sorted_w2
    finally:
        moe_tiles._table.cache_clear()
