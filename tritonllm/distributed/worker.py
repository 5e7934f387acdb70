"""A tensor-parallel worker: rank 1..N-1's process. It sets up its shard of the model from the
engine's config, exactly as rank 0 does (worker/setup.py), reports that it is ready, then runs
each step rank 0 broadcasts until rank 0 stops it."""

from __future__ import annotations

import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import NoReturn

import torch

from tritonllm import platform
from tritonllm.config import EngineConfig
from tritonllm.distributed.parallel_state import TensorParallel, destroy_tensor_parallel, init_tensor_parallel
from tritonllm.engine.host_gc import freeze_startup_heap

READY = "ready"


def cpu_threads_per_rank(size: int) -> int:
    return max(1, (os.cpu_count() or 1) // size)


def run_worker(
    rank: int, size: int, init_method: str, config: EngineConfig, path: str, status: Connection | None
) -> NoReturn:
    """A worker's main: join the group at `init_method`, set up, report READY (or the error) on
    `status`, follow rank 0's steps until it stops them."""
    if platform.DEVICE.type == "cpu":  # share the cores with the other ranks (executor.py says why)
        torch.set_num_threads(cpu_threads_per_rank(size))
    tp = init_tensor_parallel(rank, size, init_method, platform.DEVICE, config.parallel.timeout_s)
    follow(config, path, tp, status)


def follow(config: EngineConfig, path: str, tp: TensorParallel, status: Connection | None = None) -> NoReturn:
    from tritonllm.worker.setup import set_up_rank  # the model code: not needed to import this module

    try:
        runner = set_up_rank(config, path, tp).runner
    except BaseException as error:
        if status is not None:
            status.send(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        raise
    if config.gc_freeze:
        freeze_startup_heap()  # as the engine on rank 0 (engine/host_gc.py)
    if status is not None:
        status.send(READY)
        status.close()
    while runner.follow_step():
        pass
    destroy_tensor_parallel(tp)
    # Exit now, as a forked multiprocessing child does: the layers still hold the process group, whose
    # destruction at interpreter shutdown can abort the process ("terminate called without an active
    # exception", seen on gloo) after a clean stop.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve_torchrun_worker(config: EngineConfig, path: str) -> NoReturn:
    """A rank > 0 started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT in the environment):
    follow rank 0's steps until it shuts down, then exit the process."""
    size = int(os.environ["WORLD_SIZE"])
    if size != config.parallel.tensor_parallel_size:
        raise ValueError(
            f"torchrun started {size} processes for tensor_parallel_size {config.parallel.tensor_parallel_size}"
        )
    if platform.DEVICE.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(size))
    tp = init_tensor_parallel(int(os.environ["RANK"]), size, "env://", platform.DEVICE, config.parallel.timeout_s)
    follow(config, path, tp)
