"""Block-FP8 GEMM (128 x 128 weight-scale blocks, 1 x 128 activation-scale groups) for NVIDIA Hopper,
in Gluon, at prefill sizes (M > 64).

Block-scaled FP8 (Qwen3-FP8 and DeepSeek-V3 as published) rescales every 128-deep K step's partial
product by its own scales, so the accumulation cannot stay inside the tensor cores as it does for
per-channel scales. The portable kernels (gemm.py, gemm_persistent.py) take each step's product, wait
for it and rescale it before the next MMA can start: the tensor cores idle while the warps multiply,
and block-FP8 ran at bf16 speed (1.0-1.1x bf16 cuBLAS on the H200, against 1.85x for per-channel
FP8). Here each step's MMA is issued asynchronously into a fresh accumulator and the *previous*
step's product is rescaled and added to the running sum while it runs ("promotion" overlapped with
the next MMA, as DeepGEMM does with two math warpgroups): two partial accumulators and the sum live
in registers (128 x 128 tile, two warpgroups: 3 x 64 float32 registers a thread).

A and B are streamed by TMA through STAGES shared-memory buffers (one mbarrier each counting the
bytes in); a step's buffer is refilled once the MMA that read it is known complete. With
programmatic dependent launch the weight's first copies go out before the wait for the previous
kernel. Tiles in grouped order (GROUP_M tile rows sweep the columns together, for L2 reuse).
Scales: a_scale [M, K / 128] float32 (any strides), b_scale [ceil(N / 128), K / 128] float32.
"""

from __future__ import annotations

import functools

import torch
import triton

from tritonllm.kernels import gemm_skinny_sm90 as skinny
from tritonllm.kernels.gemm_persistent import descriptors_fit
from tritonllm.kernels.launch import compile_gluon_sm90, gluon_pdl_wait, gluon_sm90_available

HAVE_GLUON = skinny.HAVE_GLUON
if HAVE_GLUON:
    from tritonllm.kernels.gemm_skinny_sm90 import (
        _tma_load,
        gl,
        gluon,
        mbarrier,
        release_ring,
        ring_barriers,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

BLOCK = 128  # the scale block: BLOCK_N = BLOCK_K = 128, the weight's 128 x 128 and the activation's 1 x 128
BLOCK_M = 128
STAGES = 4  # 4 x 32 KB of A and B tiles in flight
GROUP_M = 8
UNROLL = 8  # K steps a main-loop iteration
MIN_M = 65  # at M <= 64 the skinny kernels (FP8 GEMV / split-K tiles) stream the weight faster


def measured_faster(m: int, n: int, k: int) -> bool:
    """Where the H200 measured this kernel faster than the portable block-FP8 kernels (experiments/gemm/
    block_sm90/): every Llama-3-8B layer and 8192 x 8192 at M >= 1024 (1.21-1.39x bf16 cuBLAS against
    the portable kernels' 0.96-1.09x), and at M = 256 the layers larger than 4096 x 4096 (1.06-1.27x
    against 0.86-1.02x; o_proj 0.85x against 1.01x: 64 tiles of 128 x 128 leave half the SMs idle)."""
    return m >= 512 or (m >= 256 and n * k > 4096 * 4096)


def takes(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor, group_n: int,
          group_k: int, out_dtype: torch.dtype) -> bool:  # fmt: skip
    """Whether gemm() can run this kernel: e4m3fn a [M, K] (M > 64) and b [N, K] with 128 x 128 weight
    blocks and 1 x 128 activation groups of float32 scales, K a multiple of 128, TMA-describable rows,
    a 16-bit output, an sm90 GPU."""
    m, k = a.shape
    return (
        HAVE_GLUON and m >= MIN_M and a.dtype == b.dtype == torch.float8_e4m3fn and group_n == BLOCK
        and group_k == BLOCK and k % BLOCK == 0 and a_scale.dtype == b_scale.dtype == torch.float32
        and a_scale.dim() == 2 and b_scale.dim() == 2 and out_dtype in (torch.bfloat16, torch.float16)
        and descriptors_fit(a, b) and available()
    )  # fmt: skip


@functools.cache
def available() -> bool:
    """An NVIDIA sm90 GPU and a Triton whose Gluon compiles the kernel."""
    return gluon_sm90_available(
        HAVE_GLUON, "block-FP8 GEMM", "the portable Triton kernels serve block-FP8 GEMMs instead", compile_sm90
    )


def compile_sm90(out_dtype: torch.dtype = torch.bfloat16, stages: int = STAGES, has_bias: bool = False):
    """Compile for sm90 without a GPU (launch.compile_gluon_sm90): tests, available()."""
    from triton.runtime.jit import mangle_type

    t = torch.empty((BLOCK, 256), dtype=torch.float8_e4m3fn)
    out = "*fp16" if out_dtype == torch.float16 else "*bf16"
    constexprs = dict(BLOCK_M=BLOCK_M, STAGES=stages, GROUP_M=GROUP_M, UNROLL=UNROLL, HAS_BIAS=has_bias, PDL=True)
    types = dict(a_desc=mangle_type(skinny.descriptor(t, BLOCK_M)), b_desc=mangle_type(skinny.descriptor(t, BLOCK)), c_ptr=out,
                 bias_ptr=out, a_scale_ptr="*fp32", b_scale_ptr="*fp32")  # fmt: skip
    return compile_gluon_sm90(block_fp8_gemm_sm90_kernel, constexprs, types, ("stride_cm", "stride_ask"), num_warps=8)


def block_fp8_gemm_sm90(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                        a_scale: torch.Tensor, b_scale: torch.Tensor, pdl: dict) -> torch.Tensor:  # fmt: skip
    """c = sum over 128-deep K groups of (a . b^T)_group x a_scale[m, group] x b_scale[n / 128, group]
    (+ bias) for e4m3fn a [M, K], b [N, K] (takes())."""
    (m, k), n = a.shape, b.shape[0]
    grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK),)
    block_fp8_gemm_sm90_kernel[grid](
        skinny.descriptor(a, BLOCK_M), skinny.descriptor(b, BLOCK), c, bias if bias is not None else c, a_scale, b_scale,
        m, n, k, c.stride(0), a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
        BLOCK_M=BLOCK_M, STAGES=STAGES, GROUP_M=GROUP_M, UNROLL=UNROLL, HAS_BIAS=bias is not None, num_warps=8, **pdl,
    )  # fmt: skip
    return c


if HAVE_GLUON:

    @gluon.jit
    def _mma_step(a_smem, b_smem, ready, step, dead, STAGES: gl.constexpr):
        """Issue K step `step`'s MMA (asynchronous) once its stage has arrived, into the registers of
        `dead` (a product already added: its values are ignored)."""
        stage = step % STAGES
        mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
        return warpgroup_mma(a_smem.index(stage), b_smem.index(stage).permute((1, 0)), dead, use_acc=False,
                             is_async=True)  # fmt: skip

    @gluon.jit
    def _promote(acc, part, a_scale_rows, b_scale_block, step, stride_ask, stride_bsk):
        """acc + K step `step`'s partial product x its activation-row scales x its weight-block scale."""
        scale = gl.load(a_scale_rows + step * stride_ask) * gl.load(b_scale_block + step * stride_bsk)
        return acc + part * scale[:, None]

    @gluon.jit
    def _refill(a_desc, b_desc, off_m, off_n, done, steps, ready, a_smem, b_smem, STAGES: gl.constexpr,
                STEP_BYTES: gl.constexpr):  # fmt: skip
        """Step `done`'s MMA has completed: its stage takes step done + STAGES (if any)."""
        stage = done % STAGES
        j = done + STAGES
        k = j * a_desc.block_type.shape[1]
        mbarrier.expect(ready.index(stage), STEP_BYTES, pred=j < steps)
        _tma_load(b_desc, [off_n, k], ready.index(stage), b_smem.index(stage), pred=j < steps)
        _tma_load(a_desc, [off_m, k], ready.index(stage), a_smem.index(stage), pred=j < steps)

    @gluon.jit
    def block_fp8_gemm_sm90_kernel(
        a_desc, b_desc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr,
        M, N, K, stride_cm, stride_asm, stride_ask, stride_bsn, stride_bsk,
        BLOCK_M: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, UNROLL: gl.constexpr,
        HAS_BIAS: gl.constexpr, PDL: gl.constexpr = False,
    ):  # fmt: skip
        """One BLOCK_M x 128 output tile a program (grouped order); K in 128-deep steps, each step's
        product rescaled by its row and block scales while the next step's MMA runs."""
        WARPS: gl.constexpr = gl.num_warps()
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = b_desc.block_type.shape[1]
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_N, 32])  # fmt: skip
        STEP_BYTES: gl.constexpr = (BLOCK_M + BLOCK_N) * BLOCK_K  # one byte a value

        pid = gl.program_id(0)
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * num_pid_n
        first_m = (pid // per_group) * GROUP_M
        group_rows = gl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % group_rows
        pid_n = (pid % per_group) // group_rows
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        steps = gl.cdiv(K, BLOCK_K)

        b_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
        ready = ring_barriers(STAGES)

        # every stage filled: the weight's copies first (not written by the previous kernel: no wait
        # for it), then, once that kernel's writes are visible, the activations'
        for s in gl.static_range(STAGES):
            mbarrier.expect(ready.index(s), STEP_BYTES, pred=s < steps)
            _tma_load(b_desc, [off_n, s * BLOCK_K], ready.index(s), b_smem.index(s), pred=s < steps)
        gluon_pdl_wait(PDL)
        a_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        for s in gl.static_range(STAGES):
            _tma_load(a_desc, [off_m, s * BLOCK_K], ready.index(s), a_smem.index(s), pred=s < steps)

        rows = gl.minimum(off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACC)), M - 1)
        a_scale_rows = a_scale_ptr + rows.to(gl.int64) * stride_asm
        b_scale_block = b_scale_ptr + pid_n * stride_bsn
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=ACC)
        # UNROLL steps an iteration: each step's MMA goes out while the previous step's product is added.
        # No product is in flight across the loop's back edge, where the compiler would copy it (and a
        # copy of an accumulator an MMA still writes makes ptxas wait for every MMA of the kernel). Each
        # MMA writes (use_acc=False) into the registers of the product two steps back, already added, so
        # three accumulators' registers serve (a fresh zero tensor an MMA would need a fourth's).
        older = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=ACC)
        old = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=ACC)
        whole = steps - steps % UNROLL
        for base in range(0, whole, UNROLL):
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            prev = _mma_step(a_smem, b_smem, ready, base, older, STAGES)
            dead = old
            for u in gl.static_range(1, UNROLL):
                # the previous product's additions stay above this point (the compiler would otherwise
                # sink them below the next MMAs, which then need more registers than there are)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                cur = _mma_step(a_smem, b_smem, ready, base + u, dead, STAGES)
                prev, cur = warpgroup_mma_wait(num_outstanding=1, deps=(prev, cur))
                acc = _promote(acc, prev, a_scale_rows, b_scale_block, base + u - 1, stride_ask, stride_bsk)
                _refill(a_desc, b_desc, off_m, off_n, base + u - 1, steps, ready, a_smem, b_smem, STAGES, STEP_BYTES)
                dead = prev
                prev = cur
            prev = warpgroup_mma_wait(num_outstanding=0, deps=(prev,))
            acc = _promote(acc, prev, a_scale_rows, b_scale_block, base + UNROLL - 1, stride_ask, stride_bsk)
            _refill(a_desc, b_desc, off_m, off_n, base + UNROLL - 1, steps, ready, a_smem, b_smem, STAGES, STEP_BYTES)
            older = dead
            old = prev
        for i in range(whole, steps):  # the last steps % UNROLL, one at a time
            old = warpgroup_mma_wait(num_outstanding=0, deps=(_mma_step(a_smem, b_smem, ready, i, old, STAGES),))
            acc = _promote(acc, old, a_scale_rows, b_scale_block, i, stride_ask, stride_bsk)
            _refill(a_desc, b_desc, off_m, off_n, i, steps, ready, a_smem, b_smem, STAGES, STEP_BYTES)
        release_ring(ready, STAGES)

        offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACC))
        offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, ACC))
        if HAS_BIAS:
            acc = acc + gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)[None, :]
        mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        c_ptrs = c_ptr + offs_m.to(gl.int64)[:, None] * stride_cm + offs_n[None, :]
        gl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
