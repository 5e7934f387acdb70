"""Weights prefetched into L2 ahead of the kernel that reads them (NVIDIA Hopper and newer).

At batch-1 decode a step's kernels take turns with HBM: a memory-bound GEMV streams its weight near the
copy bandwidth, while the kernels between GEMVs (norms, RoPE, attention over a short context, the MoE
router, an MXFP4 expert GEMV that is bound by its instruction stream) leave most of it idle. A weight
does not depend on anything computed in the step, so its read can start early: `prefetch_l2` launches a
small kernel whose lanes each issue one `cp.async.bulk.prefetch.L2` of a chunk of the weight (one
instruction a chunk, fire-and-forget: no registers or shared memory wait for the data) and exits; the
copy engine streams the bytes into L2 while the kernels after it run, and the GEMV that reads the
weight then finds it there. The prefetch is a hint: it changes no value, only where the bytes come from.

Under PDL the kernel issues its prefetches before its wait (they read only the weight), then waits for
the kernel before it as every PDL kernel must, so that the chain's ordering holds.

Elsewhere (the interpreter, ROCm, GPUs before Hopper) `prefetch_l2` does nothing: `available()` says
whether it launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonllm import platform
from tritonllm.kernels.launch import pdl_launch, pdl_wait

CHUNK = 1 << 16  # bytes a lane's prefetch (a multiple of 16)
LANES = 32  # one warp a program, a chunk a lane
MAX_PROGRAMS = 64


def available() -> bool:
    """The bulk L2 prefetch exists: CUDA compute capability 9.0+, compiled (not the interpreter)."""
    return (
        platform.PLATFORM == "cuda" and not platform.is_interpreter() and torch.cuda.get_device_capability() >= (9, 0)
    )


@triton.jit
def _bulk_prefetch(addr, size):
    """cp.async.bulk.prefetch.L2 of `size` bytes (a multiple of 16) from `addr` (16-byte aligned), per element;
    none where size <= 0."""
    return tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.gt.s32 p, $2, 0;\n\t@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;\n\t}",
        "=r,l,r",
        [addr, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _prefetch_span(base, nbytes, program, programs, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Of the nbytes bytes from base (a uint8 pointer), the lanes of `program` (of `programs`) prefetch chunks
    program * LANES + lane, then every programs * LANES chunks on."""
    lane = tl.arange(0, LANES)
    for start in range(program * LANES * CHUNK, nbytes, programs * LANES * CHUNK):
        off = start + lane * CHUNK
        size = tl.minimum(nbytes - off, CHUNK)
        _bulk_prefetch(base + off, size.to(tl.int32))


@triton.jit
def l2_prefetch_kernel(w_ptr, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr, PDL: tl.constexpr = False):
    """The nbytes bytes from w_ptr (its element type does not matter: offsets are bytes), spread over the
    programs (_prefetch_span)."""
    w_ptr = w_ptr.to(tl.pointer_type(tl.uint8))
    _prefetch_span(w_ptr, nbytes, tl.program_id(0), tl.num_programs(0), CHUNK, LANES)
    pdl_wait(PDL)


@triton.jit
def l2_prefetch_experts_kernel(w_ptr, ids_ptr, expert_bytes, stride_bytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Program (i, p): the expert e = ids[i] of routed pair i, its expert_bytes bytes from w_ptr + e *
    stride_bytes, spread over the programs p (_prefetch_span). Launched on a side stream after the routing (no
    PDL: it reads the ids another kernel wrote)."""
    w_ptr = w_ptr.to(tl.pointer_type(tl.uint8))
    expert = tl.load(ids_ptr + tl.program_id(0)).to(tl.int64)
    _prefetch_span(w_ptr + expert * stride_bytes, expert_bytes, tl.program_id(1), tl.num_programs(1), CHUNK, LANES)


def prefetch_l2(t: torch.Tensor, nbytes: int | None = None, start: int = 0, pdl: bool = False) -> None:
    """Start streaming `nbytes` (default: the rest) of tensor t's bytes from byte `start` into L2 and return at
    once; t contiguous, its address, start and nbytes multiples of 16. pdl: launched in a PDL chain (on a
    stream whose kernels use it). A no-op where the prefetch does not exist (available())."""
    if not available():
        return
    size = t.numel() * t.element_size()
    nbytes = size - start if nbytes is None else min(nbytes, size - start)
    if not t.is_contiguous() or t.data_ptr() % 16 or start % 16 or nbytes % 16 or start < 0:
        raise ValueError(f"prefetch_l2 takes a contiguous tensor at a 16-byte aligned address, a start and a "
                         f"length in multiples of 16; got {tuple(t.shape)} {t.dtype}, {nbytes} bytes from {start}")  # fmt: skip
    if nbytes <= 0:
        return
    view = t.reshape(-1).view(torch.uint8)[start : start + nbytes]
    programs = min(MAX_PROGRAMS, triton.cdiv(nbytes, LANES * CHUNK))
    launch = pdl_launch() if pdl else {"PDL": False}
    l2_prefetch_kernel[(programs,)](view, nbytes, CHUNK=CHUNK, LANES=LANES, num_warps=1, **launch)


def prefetch_experts_l2(w: torch.Tensor, ids: torch.Tensor) -> None:
    """Start streaming the experts ids (any integer tensor, on the device: read by the kernel) of w [E, ...]
    into L2: expert e's span from w[e]'s first element to its last. Skipped where that span's start is not
    16-byte aligned. A no-op where the prefetch does not exist."""
    if not available() or ids.numel() == 0:
        return
    elem = w.element_size()
    stride_bytes = w.stride(0) * elem
    last = sum((n - 1) * s for n, s in zip(w.shape[1:], w.stride()[1:]))  # w[e]'s last element, in elements
    expert_bytes = (last + 1) * elem // 16 * 16
    if w.data_ptr() % 16 or stride_bytes % 16 or expert_bytes == 0:
        return
    ids = ids.reshape(-1)
    programs = min(MAX_PROGRAMS, triton.cdiv(expert_bytes, LANES * CHUNK))
    l2_prefetch_experts_kernel[(ids.numel(), programs)](w, ids, expert_bytes, stride_bytes, CHUNK=CHUNK, LANES=LANES,
                                                        num_warps=1)  # fmt: skip
