"""The start-up heap frozen out of Python's cyclic GC (engine/host_gc.py, EngineConfig.gc_freeze)."""

from __future__ import annotations

import gc
import weakref

import pytest

from tritonllm import LLM
from tritonllm.engine.host_gc import GcPauses, freeze_startup_heap, release_frozen_heap


@pytest.fixture(autouse=True)
def _unfrozen():
    release_frozen_heap()
    yield
    release_frozen_heap()  # the other tests' engines stay collectable


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_an_engine_start_freezes_the_heap(tiny_llama):
    llm = LLM(tiny_llama, max_model_len=64)
    frozen = gc.get_freeze_count()
    # torch, transformers and the model's objects: far more than what a collection still walks
    assert frozen > 50_000 and len(gc.get_objects()) < frozen / 5
    metrics = {m.name: m.value for m in llm.get_metrics()}
    # the gauge reads the count when asked; frozen objects freed since (their last reference gone) leave it
    # (a CI run saw 2 of 610,534 go between the reads), and nothing freezes more in between
    assert gc.get_freeze_count() <= metrics["tritonllm:gc_frozen_objects"] <= frozen
    assert {f"tritonllm:gc_collections_gen{g}" for g in range(3)} <= metrics.keys()
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], use_tqdm=False)  # serving works on a frozen heap
    assert len(out[0].outputs[0].token_ids) > 0


def test_gc_freeze_off_leaves_the_heap_alone(tiny_llama):
    llm = LLM(tiny_llama, max_model_len=64, gc_freeze=False)
    assert gc.get_freeze_count() == 0
    assert {m.name: m.value for m in llm.get_metrics()}["tritonllm:gc_frozen_objects"] == 0


def test_an_engine_dropped_after_its_start_is_collected_when_the_next_one_starts(tiny_llama):
    """A frozen reference cycle survives collections (the negative check), so a new engine releases
    the frozen heap first: the engine dropped before it, frozen at its own start, is then freed."""
    cycle = _Cycle()
    dead = weakref.ref(cycle)
    freeze_startup_heap()
    del cycle
    gc.collect()
    assert dead() is not None  # frozen: not collected
    release_frozen_heap()
    gc.collect()
    assert dead() is None

    first = LLM(tiny_llama, max_model_len=64)
    first_engine = weakref.ref(first.llm_engine)
    first.llm_engine.cycle = _Cycle()  # whatever cycles an engine holds, it holds this one
    first.llm_engine.cycle.engine = first.llm_engine
    del first
    gc.collect()
    assert first_engine() is not None  # frozen with the heap at its start
    LLM(tiny_llama, max_model_len=64)
    assert first_engine() is None


def test_gc_pauses_count_collections_per_generation():
    pauses = GcPauses.install()
    assert GcPauses.install() is pauses  # one tracker a process
    before = list(pauses.collections), list(pauses.seconds)
    gc.collect(0)
    gc.collect(2)
    assert pauses.collections[0] >= before[0][0] + 1 and pauses.collections[2] >= before[0][2] + 1
    assert pauses.seconds[2] > before[1][2]
