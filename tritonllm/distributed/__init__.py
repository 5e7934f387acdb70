"""Tensor parallelism on torch.distributed: the process group and its collectives (parallel_state.py),
the worker processes of ranks 1..N-1 and the per-step hand-off from rank 0 (executor.py, worker.py)."""

from tritonllm.distributed.parallel_state import SINGLE, TensorParallel, init_tensor_parallel

__all__ = ["SINGLE", "TensorParallel", "init_tensor_parallel"]
