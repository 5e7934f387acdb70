"""The 4-bit skinny GEMM (M = 1..64) for NVIDIA Hopper with the packed weight streamed by TMA, in Gluon.

gemm_w4_sm90.py decodes the weight in the register layout of the warpgroup MMA's A operand, but loads
it with ordinary loads one K step ahead: about 12 KB of weight in flight an SM, which at HBM's latency
under load caps the read near 1.3-2 TB/s (experiments/quant4/README.md, session 13). Here the words,
the scales and the activation tile of each K step go through a ring of STAGES shared-memory buffers
filled by the TMA engine (one thread issues the copies, an mbarrier counts their bytes in), as the
16-bit / FP8 skinny GEMM (gemm_skinny_sm90.py) streams its weight: tens of KB in flight an SM. Each
step reads its words from shared memory in the A operand's layout (gemm_w4_sm90._words_layout: four
contiguous words a thread and row, conflict-free), decodes them as gemm_w4_sm90 does, permutes the
activation tile's columns the same way into a swizzled buffer and multiplies; the stage is refilled
with the step STAGES ahead as soon as every thread has read it. With programmatic dependent launch the
first stages' weight and scale copies are issued before the wait for the previous kernel.

The scales are read as the kernel wants them, transposed [K / group, N] so that a step's are one TMA box
of contiguous rows: int4, the 16-bit pair (s, -z s) in one int32 (rounded as gemm_w4_sm90 rounds them);
MXFP4, the e8m0 bytes. They are built from the checkpoint's layout at the first call (the eager warm-up
before graph capture) and kept on the scale tensor (`kernel_scales`). Groups of 32 (one scale a quad
lane of the A layout) and 128 (one a row) are served; groups of 64 take gemm_w4_sm90.

Measured on the H200 (experiments/quant4/README.md, session 19): slower than the pointer-loading kernels
at every Llama-3-8B shape but gate_up at M = 2..16, and slower in the engine there too, so gemm() takes it
only when forced (TRITONLLM_W4_TMA_SM90=always). The W4 kernels are not held back by the weight read: a
step's decode, activation permutation, barrier and MMA run one after another in each program, and more
bytes in flight do not shorten that chain (four stages beat eight: more programs an SM). Kept as the
base for a warp-specialised version (a TMA producer warp, consumer warpgroups decoding one step while
the other multiplies).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton

from tritonllm import platform
from tritonllm.kernels import gemm_skinny_sm90, splitk_sm90
from tritonllm.kernels.gemm_skinny_sm90 import block_m, unswizzled_descriptor
from tritonllm.kernels.gemm_w4_sm90 import BF16_BIAS, FP4_MASKS, FP16_BIAS, INT4_PAIR_MASK
from tritonllm.kernels.launch import compile_gluon_sm90, gluon_barrier, gluon_pdl_wait, gluon_sm90_available

try:  # recent triton ships Gluon; without it the portable kernels serve every shape
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma

    from tritonllm.kernels.gemm_skinny_sm90 import _tma_load, release_ring, ring_barriers
    from tritonllm.kernels.gemm_w4_sm90 import _decode, _row_bases, _words_layout, a_operand_order, e8m0_bf16

    HAVE_GLUON = True
    _BLOCK_K = gl.constexpr(128)
except ImportError:  # pragma: no cover - older triton
    HAVE_GLUON = False

BLOCK_K = 128  # columns a K step: a thread's four words a row (the A layout's)
MAX_M = 64
GROUPS = (32, 128)


@dataclass(frozen=True)
class Plan(gemm_skinny_sm90.Plan):
    """The skinny GEMM's plan fields (rows a program, K splits, stages of words, scales and activations in
    flight, 4 or 8 warps), four stages by default."""

    stages: int = 4

    def __post_init__(self) -> None:
        if self.warps not in (4, 8) or self.block_n % (16 * self.warps) or self.block_n % 64:
            raise ValueError(f"W4 TMA plan {self}: 4 or 8 warps and 64 weight rows a warpgroup pass")


# sweeps (experiments/quant4/gemm_tma_sm90/sweep.py) set this to time one plan at every shape
PLAN_OVERRIDE: Plan | None = None


def plan(m: int, n: int, k: int, fp4: bool = False) -> Plan:
    """Rows a program, K splits and stages for a shape, from the H200 sweeps (experiments/quant4/README.md,
    session 19): where 128-row programs alone fill the SMs (gate_up), 128 rows and no split; else 64 rows
    and K split until the grid holds about four programs an SM (each split at least four K steps, at most
    four splits); four stages (fewer stages, more programs an SM: gate_up at M = 16 30.5 us against 33.8
    with eight)."""
    if PLAN_OVERRIDE is not None:
        return PLAN_OVERRIDE
    sms = platform.num_multiprocessors()
    if triton.cdiv(n, 128) >= sms:
        return Plan(128, 1, fit_stages(Plan(128, 1), block_m(m), fp4, 32 if fp4 else 128))
    want = round(4 * sms / triton.cdiv(n, 64))
    split = max(1, min(4, want, k // (4 * BLOCK_K)))
    return Plan(64, split, fit_stages(Plan(64, split), block_m(m), fp4, 32 if fp4 else 128))


SMEM_PER_PROGRAM = 113 * 1024  # two programs an SM (227 KB of shared memory on Hopper)


def fit_stages(p: Plan, bm: int, fp4: bool, group_k: int, most: int = 4) -> int:
    """The most stages (2..most) a program of plan p keeps within SMEM_PER_PROGRAM."""
    stage, fixed = _smem_parts(p, bm, fp4, group_k)
    return max(2, min(most, (SMEM_PER_PROGRAM - fixed) // stage))


# experiments and tests may force the choice: TRITONLLM_W4_TMA_SM90=always|never (else measured_faster's)
FORCE = os.environ.get("TRITONLLM_W4_TMA_SM90", "")


def measured_faster(m: int, n: int, k: int, fp4: bool = False) -> bool:
    """Nowhere, on the H200 (experiments/quant4/README.md, session 19): against the pointer-loading W4 GEMV
    (M = 1) and GEMM it lost at every Llama-3-8B shape but gate_up at M = 2..16 (30.5 against 35.8 us at
    M = 16, graph-replayed alone), and there, in the engine, it made the batch-16 decode step slower (TPOT
    4.25 against 4.09-4.13 ms). FORCE=always takes it wherever it serves the shape."""
    if FORCE in ("always", "never"):
        return FORCE == "always"
    return False


def _smem_parts(p: Plan, bm: int, fp4: bool, group_k: int) -> tuple[int, int]:
    """Shared memory of a plan-p program: (a ring stage: words, scales, activations, its barrier; the two
    swizzled activation buffers)."""
    scales = (BLOCK_K // group_k) * p.block_n * (1 if fp4 else 4)
    return p.block_n * BLOCK_K // 2 + scales + bm * BLOCK_K * 2 + 8, 2 * bm * BLOCK_K * 2


def smem_bytes(p: Plan, bm: int, fp4: bool, group_k: int) -> int:
    """Shared memory a program of plan p takes."""
    stage, fixed = _smem_parts(p, bm, fp4, group_k)
    return p.stages * stage + fixed


def supported(m: int, n: int, k: int, group_k: int, fp4: bool = False) -> bool:
    """Whether this kernel takes the shape: 1..64 activation rows, K whole 128-column steps, groups of
    32 or 128 columns, N a multiple of 16 (the transposed scales' rows are TMA boxes: 16-byte strides)."""
    return HAVE_GLUON and 1 <= m <= MAX_M and k % BLOCK_K == 0 and group_k in GROUPS and n % 16 == 0


def takes(a: torch.Tensor, words: torch.Tensor, group_k: int, fp4: bool = False) -> bool:
    """Whether gemm() can run this kernel for activations a [M, K] and the word view [N, K / 8] of a 4-bit
    weight: the shape supported, 16-bit activations (MXFP4: bf16) whose rows are TMA boxes (unit column
    stride, 16-byte aligned rows), 16-byte aligned words, an sm90 GPU."""
    (m, k), n = a.shape, words.shape[0]
    dtypes = (torch.bfloat16,) if fp4 else (torch.bfloat16, torch.float16)
    return (
        supported(m, n, k, group_k, fp4) and a.dtype in dtypes and a.stride(1) == 1 and (a.stride(0) * 2) % 16 == 0
        and a.data_ptr() % 16 == 0 and words.stride(1) == 1 and words.stride(0) % 4 == 0
        and words.data_ptr() % 16 == 0 and available()
    )  # fmt: skip


@functools.cache
def available() -> bool:
    """An NVIDIA sm90 GPU and a Triton whose Gluon compiles the kernel (else, with a warning, the
    pointer-loading W4 kernels serve instead)."""
    return gluon_sm90_available(
        HAVE_GLUON,
        "TMA W4 GEMM",
        "the W4 GEMV and GEMM that load with pointers serve 4-bit GEMMs instead",
        compile_sm90,
        lambda: compile_sm90(fp4=True, group_k=32),
    )


def kernel_scales(scale: torch.Tensor, zero: torch.Tensor | None, dtype: torch.dtype, fp4: bool) -> torch.Tensor:
    """The scales [N, K / group] (and int4 zero points) as the kernel reads them, transposed [K / group, N]:
    MXFP4 the e8m0 bytes; int4 an int32 of the 16-bit pair (s, -z s) in `dtype` (s low), rounded as the
    decode of gemm_w4_sm90 rounds them (s to dtype, then z to dtype times s). Built at the first call and
    kept on the scale tensor, per dtype."""
    cache = scale.__dict__.setdefault("_w4_tma_scales", {})
    key = dtype  # (quantized weights are built once at load and never rewritten in place)
    if key not in cache:
        if fp4:
            v = scale
        else:
            s = scale.to(dtype)
            zs = -(zero.to(dtype) * s)
            v = (s.view(torch.int16).to(torch.int32) & 0xFFFF) | (zs.view(torch.int16).to(torch.int32) << 16)
        # row-major strides whatever the sizes (contiguous() keeps a size-1 dimension's stride, which TMA refuses)
        cache[key] = torch.empty((v.shape[1], v.shape[0]), dtype=v.dtype, device=v.device).copy_(v.t())
    return cache[key]


def compile_sm90(group_k: int = 128, block_n: int = 128, bm: int = 8, fp16: bool = False, split: int = 1,
                 stages: int = 8, warps: int = 4, fp4: bool = False):  # fmt: skip
    """Compile for sm90 without a GPU (launch.compile_gluon_sm90): tests, scripts/sass_loop_mix.py,
    available()."""
    from triton.runtime.jit import mangle_type

    act = torch.float16 if fp16 else torch.bfloat16
    words = torch.empty((block_n, 64, 4), dtype=torch.int32)
    scales = torch.empty((8, block_n), dtype=torch.uint8 if fp4 else torch.int32)
    x = torch.empty((bm, 256), dtype=act)
    constexprs = dict(GROUP_K=32 if fp4 else group_k, BLOCK_N=block_n, BLOCK_M=bm, FP16=fp16, FP4=fp4,
                      HAS_BIAS=False, SPLIT_K=split, STAGES=stages, PDL=True)  # fmt: skip
    out = "*fp16" if fp16 else "*bf16"
    gs = BLOCK_K // constexprs["GROUP_K"]
    types = dict(w_desc=mangle_type(unswizzled_descriptor(words, [block_n, 4, 4])),
                 s_desc=mangle_type(unswizzled_descriptor(scales, [gs, block_n])),
                 x_desc=mangle_type(unswizzled_descriptor(x, [bm, 128])), c_ptr=out, bias_ptr=out, ws_ptr="*fp32",
                 cnt_ptr="*i32")  # fmt: skip
    return compile_gluon_sm90(w4_tma_gemm_sm90_kernel, constexprs, types, ("stride_cm",), num_warps=warps)


def w4_tma_gemm_sm90(a: torch.Tensor, words: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                     scale: torch.Tensor, zero: torch.Tensor | None, group_k: int, fp4: bool,
                     pdl: dict) -> torch.Tensor:  # fmt: skip
    """c = a . w^T (+ bias) for a [M, K] and the int32 word view [N, K / 8] of an int4 weight with scales
    and zero points [N, K / group_k], or (fp4; zero None) of an MXFP4 weight with e8m0 scales [N, K / 32]
    (takes()). K splits are summed in the launch by each tile's last split program."""
    (m, k), n = a.shape, words.shape[0]
    p = plan(m, n, k, fp4)
    split, k_per_split, tiles, ws, cnt = splitk_sm90.plan_splits(m, n, k, p.split, BLOCK_K, p.block_n, c)
    bm = block_m(m)
    w_desc = unswizzled_descriptor(words.view(n, k // 32, 4), [p.block_n, 4, 4])
    s_desc = unswizzled_descriptor(kernel_scales(scale, zero, a.dtype, fp4), [BLOCK_K // group_k, p.block_n])
    w4_tma_gemm_sm90_kernel[(tiles, split)](
        w_desc, s_desc, unswizzled_descriptor(a, [bm, BLOCK_K]), c, bias if bias is not None else c, ws, cnt,
        m, n, k, k_per_split, c.stride(0),
        *(FP4_MASKS if fp4 else (INT4_PAIR_MASK, FP16_BIAS if a.dtype == torch.float16 else BF16_BIAS)),
        GROUP_K=group_k, BLOCK_N=p.block_n, BLOCK_M=bm, FP16=a.dtype == torch.float16, FP4=fp4,
        HAS_BIAS=bias is not None, SPLIT_K=split, STAGES=p.stages, num_warps=p.warps, **pdl,
    )  # fmt: skip
    return c


if HAVE_GLUON:

    @gluon.jit
    def _issue_weight(w_desc, s_desc, n0, kk, bar, stage, w_smem, s_smem, pred, GS: gl.constexpr):
        """The copies of the weight's words and scales of the K step at column kk into ring buffer `stage`,
        counted on bar."""
        _tma_load(w_desc, [n0, kk // 32, 0], bar, w_smem.index(stage), pred=pred)
        _tma_load(s_desc, [kk // _BLOCK_K * GS, n0], bar, s_smem.index(stage), pred=pred)

    @gluon.jit
    def _issue_act(x_desc, kk, bar, stage, x_ring, pred):
        """The copy of the activation tile of the K step at column kk into ring buffer `stage`."""
        _tma_load(x_desc, [0, kk], bar, x_ring.index(stage), pred=pred)

    @gluon.constexpr_function
    def _scales_layout(block_n, warps):
        """[4, BLOCK_N]: a step's four groups of 32 x rows as the words' layout holds them transposed (a quad
        lane's group, its rows): loaded as stored, then transposed in registers."""
        return gl.DistributedLinearLayout(
            reg_bases=[[0, r] for r, _ in _row_bases(block_n, warps)],
            lane_bases=[[1, 0], [2, 0], [0, 1], [0, 2], [0, 4]],
            warp_bases=[[0, 16 << i] for i in range(warps.bit_length() - 1)],
            block_bases=[],
            shape=[4, block_n],
        )

    @gluon.jit
    def _step_scales(s_smem, stage, BLOCK_N: gl.constexpr, LW: gl.constexpr, GS: gl.constexpr, FP4: gl.constexpr):
        """A step's (s, s) and (-z s, -z s) 16-bit pairs (MXFP4: (2**(e - 64), ...) twice) for the words
        [BLOCK_N, 4, 4] in layout LW: [BLOCK_N, 4, 1] (a group of 32 a quad lane) or [BLOCK_N, 1, 1]."""
        L2: gl.constexpr = gl.SliceLayout(2, LW)
        if GS == 4:
            v = s_smem.index(stage).load(_scales_layout(BLOCK_N, gl.num_warps()))
            v = gl.convert_layout(gl.permute(v, (1, 0)), L2)
        else:
            v = s_smem.index(stage).permute((1, 0)).load(L2)  # [BLOCK_N, 1]
        if FP4:
            s2 = e8m0_bf16(v)
            s2 = s2 | (s2 << 16)
            zs2 = s2  # no zero points
        else:
            lo = v & 0xFFFF
            s2 = lo | (lo << 16)
            zs2 = ((v >> 16) & 0xFFFF) | (v & -65536)
        return gl.expand_dims(s2, 2), gl.expand_dims(zs2, 2)

    @gluon.jit
    def w4_tma_gemm_sm90_kernel(
        w_desc, s_desc, x_desc, c_ptr, bias_ptr, ws_ptr, cnt_ptr,
        M, N, K, K_PER_SPLIT, stride_cm, mask, bias,
        GROUP_K: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, FP16: gl.constexpr, FP4: gl.constexpr,
        HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr = False,
    ):  # fmt: skip
        """c[m, n] = sum_k a[m, k] w[n, k] (+ bias[n]) for BLOCK_N weight rows and all M (<= BLOCK_M)
        activation rows a program, over the K range of its split (program_id 1)."""
        WARPS: gl.constexpr = gl.num_warps()
        DT: gl.constexpr = gl.float16 if FP16 else gl.bfloat16
        GS: gl.constexpr = _BLOCK_K // GROUP_K  # scale groups a K step
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_M, 16])  # fmt: skip
        LA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
        LW: gl.constexpr = _words_layout(BLOCK_N, WARPS)
        LX: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])  # activations, 16-byte reads
        SX: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        W_BYTES: gl.constexpr = BLOCK_N * _BLOCK_K // 2 + GS * BLOCK_N * (1 if FP4 else 4)
        X_BYTES: gl.constexpr = BLOCK_M * _BLOCK_K * 2

        pid_n = gl.program_id(0)
        n0 = pid_n * BLOCK_N
        k0 = gl.program_id(1) * K_PER_SPLIT
        steps = gl.cdiv(gl.minimum(K, k0 + K_PER_SPLIT) - k0, _BLOCK_K)

        w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 4, 4], w_desc.layout)
        s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES, GS, BLOCK_N], s_desc.layout)
        ready = ring_barriers(STAGES)

        # the first STAGES steps: weights first (not written by the kernel before: no wait for it), then,
        # once the previous kernel's writes are visible, the activations
        for i in gl.static_range(STAGES):
            mbarrier.expect(ready.index(i), W_BYTES + X_BYTES, pred=i < steps)
            _issue_weight(w_desc, s_desc, n0, k0 + i * _BLOCK_K, ready.index(i), i, w_smem, s_smem, i < steps, GS)
        gluon_pdl_wait(PDL)
        x_ring = gl.allocate_shared_memory(DT, [STAGES, BLOCK_M, _BLOCK_K], x_desc.layout)
        for i in gl.static_range(STAGES):
            _issue_act(x_desc, k0 + i * _BLOCK_K, ready.index(i), i, x_ring, i < steps)

        # the activation tile in the A operand's column order, two buffers: a step writes one while no
        # thread can still be reading it (the MMA two steps back finished before the last step's barrier)
        x_smem = gl.allocate_shared_memory(DT, [2, BLOCK_M, _BLOCK_K], SX)
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
        for i in range(steps):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            words = w_smem.index(s).load(LW)
            s2, zs2 = _step_scales(s_smem, s, BLOCK_N, LW, GS, FP4)
            x = a_operand_order(x_ring.index(s).load(LX), BLOCK_M, FP4)
            x_buf = x_smem.index(i % 2)
            x_buf.store(x)
            fence_async_shared()
            gluon_barrier()
            # every thread has read stage s: refill it with the step STAGES ahead
            j = i + STAGES
            mbarrier.expect(ready.index(s), W_BYTES + X_BYTES, pred=j < steps)
            _issue_weight(w_desc, s_desc, n0, k0 + j * _BLOCK_K, ready.index(s), s, w_smem, s_smem, j < steps, GS)
            _issue_act(x_desc, k0 + j * _BLOCK_K, ready.index(s), s, x_ring, j < steps)
            a_op = _decode(words, mask, bias, s2, zs2, BLOCK_N, DT, LA, FP4)
            # synchronous: the A operand's registers are rewritten by the next step's decode (an asynchronous
            # MMA reading them was measured wrong on the H200, and no faster: experiments/quant4/README.md)
            acc = warpgroup_mma(a_op, x_buf.permute((1, 0)), acc)
        release_ring(ready, STAGES)

        splitk_sm90.finish_tile(acc, c_ptr, bias_ptr, c_ptr, c_ptr, ws_ptr, cnt_ptr, pid_n, gl.program_id(1), M, N,
                                stride_cm, 0, BLOCK_N, BLOCK_M, ACC, HAS_BIAS, 0, 0, SPLIT_K)  # fmt: skip
