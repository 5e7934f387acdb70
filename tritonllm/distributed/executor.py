"""Rank 0's side of tensor parallelism: start the other ranks, join their process group, watch them.

Ranks 1..N-1 are processes of their own (spawned here, or started by torchrun with the same
program); each sets itself up from the engine's config (worker/setup.py) and then follows rank
0's steps (worker.py). The engine checks them before every step, and a step that fails because a
worker died (its collective broke) is reported naming that rank: `WorkerFailedError`. Once a
worker is gone the engine cannot go on (that rank's shard of the model went with it): the other
workers are stopped and every later step raises the same error, instead of hanging.
"""

from __future__ import annotations

import multiprocessing
import signal
import socket
from multiprocessing.connection import Connection, wait

import torch
import torch.distributed as dist

from tritonllm import platform
from tritonllm.config import EngineConfig
from tritonllm.distributed.parallel_state import TensorParallel, destroy_tensor_parallel, init_tensor_parallel
from tritonllm.distributed.step_channel import StepChannel
from tritonllm.distributed.worker import READY, cpu_threads_per_rank, run_worker

_STOP_TIMEOUT_S = 30.0  # how long workers get to exit after the stop message before they are killed


class WorkerFailedError(RuntimeError):
    """A tensor-parallel worker died or failed (or a step broke off midway): the engine cannot go on."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TensorParallelExecutor:
    def __init__(self, config: EngineConfig, path: str) -> None:
        parallel = config.parallel
        if dist.is_initialized():
            raise ValueError(
                "a tensor-parallel engine is already running in this process: shut it down (LLM.shutdown()) "
                "before starting another"
            )
        self.size = parallel.tensor_parallel_size
        self.timeout_s = parallel.timeout_s
        self.processes: dict[int, multiprocessing.Process] = {}
        self._status: dict[int, Connection] = {}
        self.failed: WorkerFailedError | None = None
        self._stopped = False
        self.tp: TensorParallel | None = None  # set once this process has joined the group
        # On CPU the ranks share the cores: each takes its share of threads (rank 0, this process, until
        # shutdown). Idle OpenMP threads spin, so one rank with all cores starves the others' collectives
        # (a 0.4 s tiny-model workload took 8.6 s on 2 cores).
        self._threads_before = torch.get_num_threads()
        if platform.DEVICE.type == "cpu":
            torch.set_num_threads(cpu_threads_per_rank(self.size))
        try:
            self._start(config, path)
        except BaseException:
            self.abort()
            raise

    def _start(self, config: EngineConfig, path: str) -> None:
        if config.parallel.launcher == "torchrun":  # the other ranks run the same program (engine/engine.py)
            self.tp = init_tensor_parallel(0, self.size, "env://", platform.DEVICE, self.timeout_s)
            return
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited CUDA or threads
        for rank in range(1, self.size):
            status_in, status_out = context.Pipe(duplex=False)
            process = context.Process(
                target=run_worker, args=(rank, self.size, init_method, config, path, status_out),
                name=f"tritonllm-tp-rank{rank}", daemon=True,
            )  # fmt: skip
            process.start()
            status_out.close()
            self.processes[rank] = process
            self._status[rank] = status_in
        self.tp = init_tensor_parallel(0, self.size, init_method, platform.DEVICE, self.timeout_s)

    def wait_until_ready(self) -> None:
        """Wait for every spawned worker to report that it is set up; one that failed or died is
        raised as WorkerFailedError naming its rank (and its error)."""
        for rank, status in self._status.items():
            process = self.processes[rank]
            if not wait([status, process.sentinel], self.timeout_s):
                raise self._fail(f"tensor-parallel rank {rank} did not finish starting in {self.timeout_s:.0f} s")
            message = status.recv() if status.poll() else None
            if message != READY:
                reason = message or f"its process exited with code {process.exitcode}"
                raise self._fail(f"tensor-parallel rank {rank} failed to start: {reason}")

    def startup_failed(self, error: BaseException) -> WorkerFailedError | None:
        """Rank 0's set-up raised: often because a worker failed first and broke a collective. Returns
        the worker's error to raise instead (naming it, with its own error), or None: none failed.
        The workers are stopped either way."""
        for rank, status in self._status.items():
            process = self.processes[rank]
            wait([status, process.sentinel], 1.0 if isinstance(error, RuntimeError) else 0.0)
            message = status.recv() if status.poll() else None
            if message not in (None, READY):
                return self._fail(f"tensor-parallel rank {rank} failed to start: {message}", error)
        dead = self._dead_workers(0.0)
        if dead:
            return self._fail(dead, error)
        self.abort()
        return None

    def check_workers(self) -> None:
        """Before a step: raise WorkerFailedError if a worker has died (or the engine failed before)."""
        if self.failed is not None:
            raise self.failed
        dead = self._dead_workers(0.0)
        if dead:
            raise self._fail(dead)

    def step_failed(self, error: BaseException) -> WorkerFailedError:
        """A step raised on rank 0: the ranks may be midway through it, out of step, so the engine
        cannot go on. Returns the error to raise: which worker died, if one did (the usual cause:
        its collective broke), else rank 0's own error."""
        dead = self._dead_workers(1.0 if isinstance(error, RuntimeError) else 0.0)
        if dead:
            return self._fail(dead, error)
        return self._fail(
            f"a tensor-parallel step failed on rank 0 ({type(error).__name__}: {error}); the ranks may be out of "
            "step, so the workers were stopped", error
        )  # fmt: skip

    def _dead_workers(self, wait_s: float) -> str | None:
        """A message naming the workers that have exited (waiting up to wait_s for one to), or None."""
        ended = wait([p.sentinel for p in self.processes.values()], wait_s) if self.processes else []
        for process in self.processes.values():
            if process.sentinel in ended:  # exiting: its files are closed, its exit status comes a moment later
                process.join(5.0)
        dead = [(rank, p) for rank, p in self.processes.items() if p.exitcode is not None]
        if not dead:
            return None
        return "; ".join(
            f"tensor-parallel worker rank {rank} (pid {p.pid}) {_exit_reason(p.exitcode)}" for rank, p in dead
        )

    def _fail(self, reason: str, cause: BaseException | None = None) -> WorkerFailedError:
        self.failed = WorkerFailedError(f"{reason}: the engine cannot continue; start a new LLM")
        self.failed.__cause__ = cause
        self.abort()
        return self.failed

    def abort(self) -> None:
        """Stop the workers now (terminate, then kill) and leave the process group."""
        if self._stopped:
            return
        self._stopped = True
        for process in self.processes.values():
            if process.exitcode is None:
                process.terminate()
        for process in self.processes.values():
            process.join(5.0)
            if process.exitcode is None:
                process.kill()
                process.join()
        if self.tp is not None:
            destroy_tensor_parallel(self.tp)
        torch.set_num_threads(self._threads_before)

    def shutdown(self, channel: StepChannel) -> None:
        """Tell the workers to stop, wait for them (killing those that do not exit), leave the group."""
        if self._stopped:
            return
        if self.failed is None and self._dead_workers(0.0) is None:
            channel.send_stop()
            for process in self.processes.values():
                process.join(_STOP_TIMEOUT_S)
        self.abort()


def _exit_reason(exitcode: int) -> str:
    if exitcode < 0:
        return f"was killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"
