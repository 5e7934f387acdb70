"""Python's cyclic garbage collector and the serving loop.

A full (generation-2) collection walks every tracked object of the process: after an engine has
started, torch, transformers, the model's modules and the tokenizer make that hundreds of thousands
(~310k for the tiny model here, 150-190 ms a collection on this 2-core machine). CPython runs one
whenever the objects that survived into generation 2 since the last one exceed a quarter of those
there, which is what the first stream of requests after a start does (the request objects, token
lists and outputs it makes grow the old generation), so the first run after a start stalls the
step loop for that long a few times; later runs, with the old generation larger, rarely do.

`freeze_startup_heap` does as vLLM's engine core does after start-up: one collection, then
`gc.freeze()`, which moves every surviving object to a permanent generation that collections no
longer walk. What serving makes is still collected as before. Frozen objects are still freed when
their reference count drops; only reference cycles among them are not, so a new engine calls
`release_frozen_heap` first, and an engine dropped before it (with its KV cache) can be collected.
The EngineConfig switch `gc_freeze` turns this off (ablation).

`GcPauses` counts the collections and the time they take per generation (through gc.callbacks),
exported as metrics (and reported by workloads.py and scripts/bench_serving.py per run) so that a
benchmark can tell a run that paid for collections.
"""

from __future__ import annotations

import atexit
import gc
import threading
import time

from tritonllm.metrics.stats import PREFIX, Counter, Gauge


def freeze_startup_heap() -> int:
    """Collect once, then freeze every object that survived; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def release_frozen_heap() -> None:
    """Make frozen objects collectable again (they rejoin the oldest generation), so that engines
    frozen at their start and dropped since can be freed by the next collection."""
    gc.unfreeze()


# at exit the heap is released, so that interpreter shutdown finalizes frozen objects as usual
# (extension types report the ones it does not as leaks)
atexit.register(release_frozen_heap)


class GcPauses:
    """Collections per generation and the seconds they took, since `install()` (once a process)."""

    _installed: GcPauses | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started: float | None = None

    @classmethod
    def install(cls) -> GcPauses:
        """The process's tracker, registered with gc.callbacks the first time."""
        with cls._lock:
            if cls._installed is None:
                cls._installed = cls()
                gc.callbacks.append(cls._installed._callback)
            return cls._installed

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation = info["generation"]
            self.collections[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started
            self._started = None

    def metrics(self) -> list[Gauge | Counter]:
        """tritonllm:gc_collections_gen{0,1,2} and tritonllm:gc_pause_seconds_gen{0,1,2} (counters),
        and tritonllm:gc_frozen_objects (gauge)."""
        out: list[Gauge | Counter] = []
        for generation in range(3):
            out.append(Counter(f"{PREFIX}gc_collections_gen{generation}", self.collections[generation]))
            out.append(Counter(f"{PREFIX}gc_pause_seconds_gen{generation}", self.seconds[generation]))
        out.append(Gauge(PREFIX + "gc_frozen_objects", gc.get_freeze_count()))
        return out
