"""The Triton MoE alignment (kernels/moe_align.py) against its torch reference (reference.moe_align).

Routings at ragged shapes (T 1 to 1031, k 1 / 2 / 8, E 8 / 60 / 128 / 256, BLOCK_M 16 / 64), random
(k distinct experts a token, as a router picks) and skewed: every pair on one expert (the first or
the last), or on a few experts with none on the others. Each runs the default split (one program
up to MAX_SINGLE_PAIRS pairs, counted programs above) and the other path, forced: several programs
of a ragged number of pairs for small batches, one program for large ones. Equality is exact.
"""

from __future__ import annotations

import pytest
import torch

from tritonllm import platform
from tritonllm.kernels import reference
from tritonllm.kernels.moe_align import MAX_SINGLE_PAIRS, MoeAlignment, max_blocks, moe_align

DEVICE = platform.DEVICE


def _routing(t: int, top_k: int, e: int, kind: str, seed: int) -> torch.Tensor:
    """topk_ids int32 [t, top_k]: "random" (k distinct experts a token), "first" / "last" (every pair
    on expert 0 / E - 1), "few" (pairs on 3 experts, the last among them; the others get none)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "random":
        ids = torch.rand(t, e, generator=gen).topk(top_k, dim=1).indices
    elif kind in ("first", "last"):
        ids = torch.full((t, top_k), 0 if kind == "first" else e - 1)
    else:
        few = torch.tensor([1, e // 2, e - 1])
        ids = few[torch.randint(0, 3, (t, top_k), generator=gen)]
    return ids.to(DEVICE, torch.int32)


def assert_same_alignment(got: MoeAlignment, expected: MoeAlignment) -> None:
    """Exact equality of every field, naming the first entry that differs."""
    assert (got.num_pairs, got.num_blocks) == (expected.num_pairs, expected.num_blocks)
    for name in ("sorted_ids", "block_expert"):
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == torch.int32 and a.shape == b.shape, f"{name}: {a.dtype} {tuple(a.shape)}"
        differ = (a != b).cpu()
        if differ.any():
            i = int(differ.int().argmax())
            raise AssertionError(f"{name}[{i}] is {int(a[i])}, expected {int(b[i])} ({int(differ.sum())} differ)")


CASES = [  # (T, k, E, BLOCK_M)
    (1, 1, 8, 16),
    (1, 8, 128, 16),
    (1, 8, 256, 64),
    (3, 2, 60, 16),
    (3, 8, 60, 64),
    (17, 1, 256, 16),
    (17, 8, 128, 64),
    (100, 2, 8, 64),
    (100, 8, 256, 16),
    (1031, 2, 60, 64),
    (1031, 8, 128, 16),
]


@pytest.mark.parametrize("kind", ["random", "first", "last", "few"])
@pytest.mark.parametrize("t, top_k, e, block_m", CASES, ids=[f"T{t}_k{k}_E{e}_M{m}" for t, k, e, m in CASES])
def test_alignment_matches_reference(t, top_k, e, block_m, kind) -> None:
    ids = _routing(t, top_k, e, kind, seed=t * e + top_k)
    expected = reference.moe_align(ids, e, block_m)
    assert_same_alignment(moe_align(ids, e, block_m), expected)
    # the other path: one program for a large batch; small ones split into ragged ranges (not STEP multiples)
    num_pairs = t * top_k
    other = num_pairs if num_pairs > MAX_SINGLE_PAIRS else 5 + num_pairs // 3
    assert_same_alignment(moe_align(ids, e, block_m, pairs_per_program=other), expected)


def test_int64_ids_and_a_strided_view() -> None:
    ids = _routing(40, 4, 60, "random", seed=1)
    expected = reference.moe_align(ids, 60, 16)
    assert_same_alignment(moe_align(ids.long(), 60, 16), expected)
    wide = torch.zeros(40, 8, dtype=torch.int32, device=DEVICE)
    wide[:, ::2] = ids
    assert_same_alignment(moe_align(wide[:, ::2], 60, 16), expected)


def test_a_broken_alignment_fails_the_comparison() -> None:
    """Negative checks: two pairs of one expert swapped (token order lost), a pair moved to another
    expert's segment, a block's expert off by one: each is caught."""
    ids = _routing(17, 8, 60, "few", seed=2)
    good = reference.moe_align(ids, 60, 16)
    assert_same_alignment(moe_align(ids, 60, 16), good)
    swapped = good.sorted_ids.clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # the first segment (expert 1) starts at row 0
    second = int((good.block_expert != good.block_expert[0]).int().argmax()) * 16  # the next segment's first row
    moved = good.sorted_ids.clone()
    moved[[0, second]] = moved[[second, 0]]
    experts = good.block_expert.clone()
    experts[0] += 1
    for broken in (
        good._replace(sorted_ids=swapped),
        good._replace(sorted_ids=moved),
        good._replace(block_expert=experts),
    ):
        with pytest.raises(AssertionError):
            assert_same_alignment(broken, good)


def _no_host_reads(monkeypatch) -> None:
    """Make the Python-level ways of reading a device value back to the host raise."""

    def refuse(*args, **kwargs):
        raise AssertionError("host synchronisation")

    for name in ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    monkeypatch.setattr(torch, "nonzero", refuse)


@pytest.mark.parametrize("t, e, top_k, block_m", [(1, 6, 2, 16), (19, 8, 3, 16), (40, 5, 2, 4)])
def test_alignment_sorts_pairs_into_expert_blocks_without_host_reads(t, e, top_k, block_m, monkeypatch) -> None:
    """The contract checked from its definition, independently of the reference."""
    ids = torch.randint(0, e, (t, top_k), generator=torch.Generator().manual_seed(t), dtype=torch.int32).to(DEVICE)
    with monkeypatch.context() as m:
        _no_host_reads(m)
        align = moe_align(ids, e, block_m)
        several = moe_align(ids, e, block_m, pairs_per_program=7)
    assert_same_alignment(several, align)
    num_pairs = t * top_k
    assert align.num_blocks == max_blocks(num_pairs, e, block_m)
    assert align.sorted_ids.shape == (align.num_blocks * block_m,) and align.block_expert.shape == (align.num_blocks,)
    rows = align.sorted_ids.view(align.num_blocks, block_m).cpu()
    experts, flat = align.block_expert.cpu(), ids.reshape(-1).cpu()
    real = rows < num_pairs
    assert sorted(rows[real].tolist()) == list(range(num_pairs))  # every pair once, padding elsewhere
    for b in range(align.num_blocks):
        pairs = rows[b][real[b]]
        assert (flat[pairs.long()] == experts[b]).all()  # a block's pairs all go to its expert
        assert pairs.tolist() == sorted(pairs.tolist())  # in token order (deterministic)
        if experts[b] == e:
            assert not real[b].any()  # blocks past the last segment are empty
    used = (experts < e).sum().item()
    assert (experts[:used] < e).all() and used == sum(-(-int((flat == x).sum()) // block_m) for x in range(e))


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="CUDA graphs need the GPU")
def test_alignment_on_gpu_matches_reference_and_replays_from_a_graph() -> None:
    """Qwen3-30B-A3B's routing (E 128, top-8) at decode and prefill sizes, both paths; then a captured
    alignment replayed on new routings written into its input."""
    for t in (1, 64, 8192):
        for kind in ("random", "few"):
            ids = _routing(t, 8, 128, kind, seed=t)
            for block_m in (16, 64):
                expected = reference.moe_align(ids, 128, block_m)
                assert_same_alignment(moe_align(ids, 128, block_m), expected)
                assert_same_alignment(moe_align(ids, 128, block_m, pairs_per_program=1000), expected)
        ids = _routing(t, 8, 128, "random", seed=t + 1)
        moe_align(ids, 128, 16)  # compiles before capture
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            moe_align(ids, 128, 16)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = moe_align(ids, 128, 16)
        for seed, kind in ((t + 2, "random"), (t + 3, "last")):
            ids.copy_(_routing(t, 8, 128, kind, seed=seed))
            graph.replay()
            torch.cuda.synchronize()
            assert_same_alignment(captured, reference.moe_align(ids, 128, 16))
