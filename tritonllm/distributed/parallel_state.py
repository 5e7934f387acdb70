"""Who this process is among the tensor-parallel ranks, and the collectives they run together.

`TensorParallel` is passed explicitly to the model and its layers (no module-level state): the
single-process default `SINGLE` has size 1 and no process group, and its collectives are no-ops,
so a model built without tensor parallelism runs exactly as before. The collectives are thin
wrappers over torch.distributed: gloo on CPU (tests), NCCL on NVIDIA GPUs (RCCL on ROCm, which
torch also names "nccl").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None  # None when size == 1

    def share(self, total: int, what: str) -> tuple[int, int]:
        """(first, count) of this rank's even share of `total` items (heads, rows, columns); an
        uneven split is refused naming `what`."""
        if total % self.size:
            raise ValueError(
                f"{what} ({total}) is not divisible by tensor_parallel_size {self.size}: choose a size that divides it"
            )
        count = total // self.size
        return self.rank * count, count

    def kv_head_share(self, num_kv_heads: int) -> tuple[int, int]:
        """(first, count) of the KV heads this rank holds: an even share, or, with fewer KV heads than
        ranks, the one KV head its query heads read (replicated on size / num_kv_heads ranks)."""
        if num_kv_heads >= self.size:
            return self.share(num_kv_heads, "num_key_value_heads")
        if self.size % num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size {self.size} is not a multiple of num_key_value_heads ({num_kv_heads}): "
                "with fewer KV heads than ranks each KV head is replicated on the same number of ranks"
            )
        return self.rank * num_kv_heads // self.size, 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over ranks, in place (x itself with one rank)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x concatenated along the last dim, in rank order ([..., size * x.shape[-1]])."""
        if self.size == 1:
            return x
        x = x.contiguous()
        if dist.get_backend(self.group) == "nccl":  # one buffer, no per-rank list
            out = torch.empty((self.size, *x.shape), dtype=x.dtype, device=x.device)
            dist.all_gather_into_tensor(out, x, group=self.group)
            return torch.cat(out.unbind(0), dim=-1)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=-1)

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's `value` (e.g. the KV blocks each rank's memory holds)."""
        if self.size == 1:
            return value
        device = "cpu" if dist.get_backend(self.group) == "gloo" else torch.cuda.current_device()
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """x from rank `src` into every rank's x, in place."""
        if self.size > 1:
            dist.broadcast(x, src, group=self.group)
        return x


SINGLE = TensorParallel()


def backend_for(device: torch.device) -> str:
    return "gloo" if device.type == "cpu" else "nccl"


def init_tensor_parallel(
    rank: int, size: int, init_method: str, device: torch.device, timeout_s: float
) -> TensorParallel:
    """Join the process group of `size` ranks at `init_method` (a "tcp://host:port" or "file://path"
    rendezvous, or "env://" under torchrun). Collectives that wait longer than `timeout_s` fail
    instead of hanging (gloo; NCCL's watchdog aborts them)."""
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(
        backend_for(device), init_method=init_method, rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s)
    )
    return TensorParallel(rank, size, dist.group.WORLD)


def destroy_tensor_parallel(tp: TensorParallel) -> None:
    if tp.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
