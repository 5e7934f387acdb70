"""The skinny GEMM (M = 1..64) of 16-bit and FP8 operands for NVIDIA Hopper, in Gluon: the weight
streamed by TMA through a ring of shared-memory stages, the product on the tensor cores.

At decode sizes the weight read is the whole cost of a linear layer, so the kernel is built to keep
HBM busy: each program streams BLOCK_N weight rows x its K range through STAGES buffers filled by
the TMA engine (one thread issues a copy, an mbarrier counts its bytes in), far more bytes in
flight an SM than the pointer kernels' loads keep. The product is taken transposed, c^T = w . a^T
("swap AB"): the weight tile is the warpgroup MMA's 64-row A operand and the few activation rows are
its N (8 to 64 columns; rows past M read as zeros from TMA's out-of-bounds fill), both read from
shared memory, so no MMA row is padding. Each step waits for its stage, issues its MMA
asynchronously, waits for the previous step's MMA (whose stage is then free) and refills that stage
STAGES - 1 steps ahead. With programmatic dependent launch the first stages' weight copies are
issued before the wait for the previous kernel (the weight is not written by it), so the stream
starts while that kernel drains; the activations' copies follow the wait.

Operands: bf16 / fp16 (float32 accumulation), FP8 e4m3 W8A8 with per-channel (or one) weight scales
and per-token (or one) activation scales applied in the epilogue. K splits (skinny grids) are summed
in the kernel by each tile's last split program (kernels/splitk_sm90.py). Plans (rows a program,
K splits, stages, warps) come from `plan`, swept by experiments/gemm/skinny_sm90/sweep.py.

The kernel also has fused modes (constexpr flags; their launchers are in kernels/gemm_skinny_fused_sm90.py):
gated (gate_up's SiLU-mul in the epilogue: for gate_up = [gate | up] each stage holds a program's gate rows
and the matching up rows; optionally quantized per token by the last program to arrive, measured slower at
batch 1 than the GEMM and the activation kernel, experiments/gemm/README.md, session 18; or writing block
amaxes for an XQ down projection), XQ (FP8 weights, 16-bit activations quantized a K step at a time in shared
memory), XN (XQ applied to the RMSNorm of the residual stream) and ADD_C (the output added into c).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton

from tritonllm import platform
from tritonllm.kernels import splitk_sm90
from tritonllm.kernels.launch import (
    compile_gluon_sm90,
    gluon_barrier,
    gluon_pdl_wait,
    gluon_sm90_available,
)
from tritonllm.kernels.splitk_sm90 import scale_kind

try:  # recent triton ships Gluon; without it the portable kernels serve every shape
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Triton 3.6 (the H200 machine's) names the TMA load async_copy_global_to_shared, 3.9 async_load
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    HAVE_GLUON = True
    _GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}
except ImportError:  # pragma: no cover - older triton
    HAVE_GLUON = False
    _GL_DTYPES = {}

MAX_M = 64
BLOCK_ROWS = 128  # block-FP8's weight blocks are 128 x 128: a program's rows (64 or 128) lie in one block row
ROW_BYTES = 128  # bytes of K a stage holds per row: one 128-byte-swizzled TMA box (64 bf16 or 128 FP8 values)


@dataclass(frozen=True)
class Plan:
    block_n: int  # weight rows a program: 64 a warpgroup pass
    split: int  # K splits (float32 partials, summed by each tile's last split program)
    stages: int = 6  # shared-memory buffers of (weight, activation) tiles in flight
    warps: int = 4  # 4 or 8: one or two warpgroups
    stream: int = 0  # > 0: stream-K over this many programs an SM (kernels/gemm_stream_sm90.py; SPLIT unused)

    @classmethod
    def parse(cls, text: str) -> Plan:
        """ "BLOCK_N:SPLIT[:STAGES[:WARPS[:STREAM]]]"."""
        return cls(*(int(v) for v in text.split(":")))


# sweeps (experiments/gemm/skinny_sm90/sweep.py) set this to time one plan at every shape
PLAN_OVERRIDE: Plan | None = None
# deeper rings and stream-K where session 37's sweep measured them faster (plan()); opt-in, for A/B runs.
# TRITONLLM_SKINNY_STREAM=1: both; =rings / =stream: one half; =16bit: both, for 16-bit activations only. Off by
# default: the sweep's 1.02-1.20x cuBLAS (bf16 Llama-3-8B layers at M = 2..16, PDL launches back to back) does not
# hold in scripts/bench_gemm.py, graph-timed (session 38, H100: qkv 0.83-0.86x against 0.98-0.99x with today's
# plans, o 0.89-0.92 against 1.04-1.12, down 0.93-0.95 against 1.00-1.03), nor end to end (Llama-3-8B FP8 batch 1:
# 276.9 tok/s with the rings, 274.6 with stream-K, 285.2 without; bf16 at 16 sequences 1,997 against 1,993)
_STREAM_MODE = os.environ.get("TRITONLLM_SKINNY_STREAM", "0")
if _STREAM_MODE not in ("0", "1", "rings", "stream", "16bit"):
    raise ValueError(f"TRITONLLM_SKINNY_STREAM={_STREAM_MODE!r}: 0, 1, rings, stream or 16bit")
RINGS, STREAM = _STREAM_MODE in ("1", "rings", "16bit"), _STREAM_MODE in ("1", "stream", "16bit")
FP8_DEEP = _STREAM_MODE != "16bit"
# of a program's first STAGES - 1 weight tiles, how many it requests before its PDL wait (the rest right after). All of
# them by default (16: more than any plan's ring); TRITONLLM_SKINNY_PREWAIT=n for A/B runs. Why fewer might pay: at
# FP8 batch 1 a qkv launch requests ~20 MB of its 25 MB weight before it waits, and the quantizing RMSNorm it waits
# for takes 5.0 us exposed a launch against the bf16 step's 1.4 (experiments/gemm/README.md, session 47): the norm's
# few dependent loads queue behind those requests
PREWAIT_STAGES = int(os.environ.get("TRITONLLM_SKINNY_PREWAIT", "16"))
# M = 1: programs an SM that plan() aims the grid at (0: session 14's 128 rows, four K splits; for A/B runs,
# TRITONLLM_SKINNY_M1_FILL)
M1_FILL = int(os.environ.get("TRITONLLM_SKINNY_M1_FILL", "4"))


def block_m(m: int) -> int:
    """The MMA's N (activation rows a program): 8, 16, 32 or 64 (a power of two covering m)."""
    return max(8, triton.next_power_of_2(m))


def plan(m: int, n: int, k: int, elem_bytes: int, deep: bool = True) -> Plan:
    """Rows a program, K splits, stages and stream-K, from the sweeps (experiments/gemm/README.md, sessions 14,
    33 and 37): where 128-row programs alone fill the SMs (gate_up) no split; at M = 1, 64-row programs and K
    split until about M1_FILL programs an SM (at most 8 ways, each split at least four K steps); at M = 2..4, K
    split up to four ways over 64 rows (FP8 qkv at M = 4: 7.5 against 9.4 us); above, 64 rows, two splits,
    eight stages, but one split of 128 rows for wide layers at M > 16 (qkv: 10.4 against 14.7 us in FP8 at
    M = 64). Where up to 16 activation rows leave shared memory for 12-16 stages: with RINGS gate_up-wide
    layers take 12 stages (with STREAM too, stream-K in FP8 at M <= 4), and with STREAM stream-K over 64-row
    tiles serves K >= 8,192 (down; FP8 at M <= 4, only with FP8_DEEP) and 16-bit layers of N >= 4,096 at
    M = 2..16 (session 37, H100, PDL sweep: bf16 gate_up 0.97 -> 1.00x cuBLAS, qkv 0.95-1.02 -> 1.04-1.08x, o
    1.08-1.11 -> 1.14-1.19x, down 1.02 -> 1.06x; FP8 down at M = 4 1.85 -> 1.99x bf16). deep=False: without
    those (the fused modes' launches, gemm_skinny_fused_sm90, whose extra shared memory and epilogues the deep
    rings and stream-K do not take)."""
    if PLAN_OVERRIDE is not None:
        return PLAN_OVERRIDE
    most = max(1, k // (4 * ROW_BYTES // elem_bytes))
    sms = platform.num_multiprocessors()
    fp8_few = elem_bytes == 1 and m <= 4 and FP8_DEEP
    deep = deep and block_m(m) <= 16 and (fp8_few or (elem_bytes == 2 and m > 1))
    if triton.cdiv(n, 128) >= sms or (m > 16 and n >= 6144):
        return Plan(128, 1, 12, 4, int(fp8_few and STREAM)) if deep and RINGS else Plan(128, 1, 6)
    if deep and STREAM and (k >= 8192 or (elem_bytes == 2 and n >= 4096)):
        return Plan(64, 1, 16, 4, 1)
    if m == 1 and M1_FILL:
        # 64-row programs, K split until the grid holds about M1_FILL programs an SM (at most 8 splits, each at
        # least four K steps): gpt-oss's o_proj (2,880 x 4,096) took 92 programs as 128 x 4, 8.9 us against
        # 7.6 as 64 x 8 (360 programs), its qkv 9.5 against 8.8 as 64 x 6 (H200, L2 cold, PDL; session 33)
        tiles = triton.cdiv(n, 64)
        return Plan(64, max(1, min(8, most, M1_FILL * sms // tiles)), 6)
    if m <= 4:
        return Plan(128 if m == 1 else 64, min(4, most), 6)
    return Plan(64, min(2, most), 8)


# experiments may force the choice for whole engine runs: TRITONLLM_SKINNY_SM90=always|never
FORCE = os.environ.get("TRITONLLM_SKINNY_SM90", "")


# block-FP8 weights (128 x 128 scales) at decode sizes through this kernel: on an H100 (session 48, Llama-3-8B layers,
# M = 1 / 4 / 16) 1.03-1.16x the portable kernels that served them before (down at M = 4: 29.4 -> 25.5 us), within 1-6%
# of the FP8 per-channel kernel; TRITONLLM_SKINNY_BLOCK=0 turns it off for ablations
BLOCK_FP8 = os.environ.get("TRITONLLM_SKINNY_BLOCK", "1") != "0"


def measured_faster(m: int, n: int, k: int, dtype: torch.dtype) -> bool:
    """Where the H200 measured this kernel faster than the portable ones (experiments/gemm/README.md,
    session 14, Llama-3-8B layers): FP8 at M = 1..16 (M = 4: 1.1-1.2x the portable kernels; at M = 1 on
    its own as fast as the FP8 GEMV or 10% slower, but in the decode step, where its weight copies start
    under the previous kernel's tail (PDL), batch-1 FP8 decode ran 334.8 against 306.6 tok/s), not M = 64
    (the portable tiles' 7.5 us against 10.4 for qkv); 16-bit at M <= 4 (1.05-1.18x), not above (0.7-1.0x)
    but with RINGS / STREAM's plans at N >= 4,096 (session 37, H100, M = 8 / 16: 0.98-1.19x cuBLAS, the portable
    kernels 0.87-1.13x)."""
    if FORCE in ("always", "never"):
        return FORCE == "always"
    if dtype == torch.float8_e4m3fn:
        return m <= 16
    return m <= 4 or ((RINGS or STREAM) and m <= 16 and n >= 4096)


DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


def tma_ok(t: torch.Tensor) -> bool:
    """Whether TMA reads the 2-D t: unit column stride, rows and base 16-byte aligned."""
    return t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def takes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether gemm() can run this kernel for a [M, K] and the weight b [N, K]: 1..64 rows, one dtype
    among DTYPES, rows 16-byte aligned with unit column stride (TMA's rules), an sm90 GPU."""
    m, k = a.shape
    return (
        HAVE_GLUON and 1 <= m <= MAX_M and a.dtype in DTYPES and b.dtype == a.dtype and (k * a.element_size()) % 16 == 0
        and tma_ok(a) and tma_ok(b) and available()
    )  # fmt: skip


@functools.cache
def available() -> bool:
    """An NVIDIA sm90 GPU and a Triton whose Gluon compiles the kernel (else, with a warning, the
    portable kernels serve every shape)."""
    return gluon_sm90_available(
        HAVE_GLUON,
        "skinny GEMM",
        "the portable Triton kernels serve skinny GEMMs instead",
        lambda: compile_sm90(torch.bfloat16),
        lambda: compile_sm90(torch.float8_e4m3fn, split=2),
    )


def descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A TMA descriptor of [rows, ROW_BYTES] boxes of a [R, K] tensor (128-byte swizzle; also the block-FP8
    GEMM's: 128 FP8 values a row)."""
    block = [rows, ROW_BYTES // t.element_size()]
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype]))


def unswizzled_descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor of boxes `block` of t, unswizzled: a kernel reads each box back into registers in its own
    layout (this kernel's XQ / XN tiles, the 4-bit TMA GEMM's and GEMV's words and scales)."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=t.element_size() * 8, rank=len(block))
    return TensorDescriptor.from_tensor(t, block, layout)


def xq_descriptor(h: torch.Tensor, rows: int) -> TensorDescriptor:
    """The XQ mode's activations: unswizzled [rows, 128] boxes of the 16-bit h [M, K] (256-byte rows, read
    into registers a step and quantized)."""
    return unswizzled_descriptor(h, [rows, ROW_BYTES])


def xn_weight_descriptor(g: torch.Tensor) -> TensorDescriptor:
    """The XN mode's norm weight g [K] as [1, 128] boxes of a [1, K] view (unswizzled, a step's columns)."""
    return unswizzled_descriptor(g.view(1, -1), [1, ROW_BYTES])


def compile_sm90(dtype: torch.dtype = torch.bfloat16, block_n: int = 128, bm: int = 16, split: int = 1,
                 stages: int = 6, warps: int = 4, scales: bool = False, gated: int = 0, xq: bool = False,
                 xn: bool = False, add_c: bool = False, group_scales: bool = False,
                 block_scales: bool = False, prewait: int = 16):  # fmt: skip
    """Compile for sm90 without a GPU (launch.compile_gluon_sm90): tests, available(). xq: FP8 weights and
    bf16 activations quantized in the kernel (xq_skinny_gemm_sm90); xn: those activations RMS-normalized
    first (xn_skinny_gemm_sm90, implies xq); add_c: the output added to c; group_scales: (with scales) one
    activation scale a row and K step (SCALE_GROUP); block_scales: (with group_scales) 128 x 128 weight blocks;
    prewait: the weight tiles requested before the PDL wait (PREWAIT)."""
    from triton.runtime.jit import mangle_type

    xq = xq or xn
    w = torch.empty((block_n, 256), dtype=dtype)
    out = "*fp16" if dtype == torch.float16 else "*bf16"
    x_desc = xq_descriptor(torch.empty((bm, 256), dtype=torch.bfloat16), bm) if xq else descriptor(w, bm)
    g_desc = xn_weight_descriptor(torch.empty(256, dtype=torch.bfloat16)) if xn else x_desc
    w_scale = (3 if block_scales else 2) if scales else 0
    constexprs = dict(BLOCK_N=block_n, BLOCK_M=bm, STAGES=stages, HAS_BIAS=False, W_SCALE=w_scale,
                      A_SCALE=(3 if group_scales else 2) if scales and not xq else 0, SPLIT_K=split, PDL=True, GATED=gated, QMAX=448.0,
                      TAIL=16384, XQ=int(xq), XA_PAD=16, XN=xn, ROW_PAD=4096 if xn else 1, ADD_C=add_c,
                      PREWAIT=prewait)  # fmt: skip
    types = dict(w_desc=mangle_type(descriptor(w, block_n // 2 if gated else block_n)),
                 x_desc=mangle_type(x_desc), g_desc=mangle_type(g_desc), c_ptr=out, bias_ptr=out, w_scale_ptr="*fp32",
                 a_scale_ptr="*fp32", ws_ptr="*fp32", cnt_ptr="*i32", q_ptr="*fp8e4nv", qs_ptr="*fp32",
                 xa_ptr="*bf16" if xn else "*fp32", g_ptr="*bf16" if xn else "*fp32", eps="fp32")  # fmt: skip
    return compile_gluon_sm90(skinny_gemm_sm90_kernel, constexprs, types, ("stride_cm",), num_warps=warps)


def group_scales_fit(a: torch.Tensor, a_scale: torch.Tensor) -> bool:
    """Whether the kernel reads a_scale as one scale a row and K step (A_SCALE = SCALE_GROUP): FP8 a [M, K] and
    float32 scales [M, K / 128] laid out column-major (quant.fused_scales: group g of row m at g * M + m), so
    each 128-value K step (ROW_BYTES of FP8) is one group."""
    m, k = a.shape
    return (
        a.dtype == torch.float8_e4m3fn and a_scale.dtype == torch.float32 and k % ROW_BYTES == 0
        and tuple(a_scale.shape) == (m, k // ROW_BYTES) and (m == 1 or a_scale.stride() == (1, m))
    )  # fmt: skip


def block_scales_fit(b: torch.Tensor, b_scale: torch.Tensor) -> bool:
    """Whether the kernel reads b_scale as block-FP8's weight scales (W_SCALE = SCALE_GROUP): float32 [cdiv(N, 128),
    K / 128] contiguous, one a 128 x 128 block (each program's rows within one block row: plans of 64 or 128)."""
    n, k = b.shape
    return (
        b.dtype == torch.float8_e4m3fn and b_scale.dtype == torch.float32 and b_scale.is_contiguous()
        and k % ROW_BYTES == 0 and tuple(b_scale.shape) == (triton.cdiv(n, BLOCK_ROWS), k // ROW_BYTES)
    )  # fmt: skip


def skinny_gemm_sm90(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                     a_scale: torch.Tensor | None, b_scale: torch.Tensor | None, pdl: dict,
                     add_c: bool = False) -> torch.Tensor:  # fmt: skip
    """c = (a . b^T) x b_scale[n] x a_scale[m] (+ bias) for a [M, K], b [N, K] of one dtype (takes());
    a_scale: None, one float32, one per row [M, 1] or (FP8) one per row and 128-column group [M, K / 128]
    (group_scales_fit: each K step's product scaled as it is added); b_scale: None, one float32, one per column [N]
    or (with group activation scales) one per 128 x 128 block [cdiv(N, 128), K / 128] (block_scales_fit).
    K splits write float32 partials; the last split program of a tile to arrive sums them in split
    order (deterministic) and writes c: one launch, no reduce kernel. add_c: c += that product rounded to
    c's dtype (a residual add fused into the layer; each element of c read and written by one program)."""
    (m, k), n = a.shape, b.shape[0]
    p = plan(m, n, k, a.element_size())
    a_kind, w_kind = scale_kind(a_scale), scale_kind(b_scale)
    if a_kind == splitk_sm90.SCALE_GROUP and not group_scales_fit(a, a_scale):
        raise ValueError(f"skinny GEMM: group activation scales {tuple(a_scale.shape)} need FP8 rows of 128-column "
                         "groups, column-major (quant.fused_scales)")  # fmt: skip
    if w_kind == splitk_sm90.SCALE_GROUP:
        if a_kind != splitk_sm90.SCALE_GROUP or not block_scales_fit(b, b_scale):
            raise ValueError(f"skinny GEMM: weight block scales {tuple(b_scale.shape)} need [cdiv(N, 128), K / 128] "
                             "contiguous and activations scaled per 1 x 128 group")  # fmt: skip
        p = Plan(min(p.block_n, BLOCK_ROWS), p.split, p.stages, p.warps)
    if p.stream and a_kind != splitk_sm90.SCALE_GROUP:
        from tritonllm.kernels import gemm_stream_sm90

        if gemm_stream_sm90.takes(n, p.block_n, c):
            return gemm_stream_sm90.stream_gemm_sm90(a, b, c, bias, a_scale, b_scale, pdl, p, add_c)
        p = Plan(p.block_n, 1, p.stages, p.warps)
    block_k = ROW_BYTES // a.element_size()
    split, k_per_split, tiles, ws, cnt = splitk_sm90.plan_splits(m, n, k, p.split, block_k, p.block_n, c)
    x_desc = descriptor(a, block_m(m))
    skinny_gemm_sm90_kernel[(tiles, split)](
        descriptor(b, p.block_n), x_desc, x_desc, c, bias if bias is not None else c,
        b_scale if b_scale is not None else ws, a_scale if a_scale is not None else ws, ws, cnt, ws, ws, ws, ws,
        m, n, k, k_per_split, c.stride(0), a_scale.stride(0) if a_kind == splitk_sm90.SCALE_EACH else 0, 0,
        0.0, BLOCK_N=p.block_n, BLOCK_M=block_m(m), STAGES=p.stages, HAS_BIAS=bias is not None,
        W_SCALE=w_kind, A_SCALE=a_kind, SPLIT_K=split, ADD_C=add_c, PREWAIT=PREWAIT_STAGES, num_warps=p.warps,
        **pdl,
    )  # fmt: skip
    return c


if HAVE_GLUON:

    @gluon.jit
    def ring_barriers(STAGES: gl.constexpr):
        """One mbarrier a ring stage (count 1: the stage's bytes arrive through TMA), initialised and fenced
        (the TMA ring of this kernel, gemm_block_sm90's and gemm_w4_tma_sm90's)."""
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(STAGES):
            mbarrier.init(ready.index(b), count=1)
        fence_async_shared()
        return ready

    @gluon.jit
    def release_ring(ready, STAGES: gl.constexpr):
        """The ring's mbarriers invalidated (the kernel's end)."""
        for b in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(b))

    @gluon.jit
    def _issue(desc, row, k, bar, buf, pred):
        """One TMA copy of the box at (row, k) into buf, counted on bar."""
        _tma_load(desc, [row, k], bar, buf, pred=pred)

    @gluon.jit
    def _issue_w(desc, row, half, k, bar, buf, pred, GATED: gl.constexpr):
        """A stage's weight rows: the box at row, or (GATED: boxes of half the stage's rows) gate rows
        row.. into the stage's first half and the matching up rows half + row.. into its second."""
        if GATED:
            HALF: gl.constexpr = desc.block_type.shape[0]
            _tma_load(desc, [row, k], bar, buf.slice(0, HALF), pred=pred)
            _tma_load(desc, [half + row, k], bar, buf.slice(HALF, HALF), pred=pred)
        else:
            _tma_load(desc, [row, k], bar, buf, pred=pred)

    @gluon.jit
    def _issue_weights(w_desc, g_desc, w_smem, g_smem, ready, n0, N, k, i, steps, GATED: gl.constexpr,
                       XN: gl.constexpr):  # fmt: skip
        """The ring's first steps' constants into stage i (step i, at column k): the weight rows (_issue_w) and XN's
        norm weight; the kernel issues PREWAIT of them before its PDL wait, the rest after it."""
        _issue_w(w_desc, n0, N // 2, k, ready.index(i), w_smem.index(i), i < steps, GATED)
        if XN:
            _issue(g_desc, 0, k, ready.index(i), g_smem.index(i), i < steps)

    @gluon.jit
    def gated_epilogue(acc, h_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, cnt_ptr, q_ptr, qs_ptr, pid_n, M, inter,
                       stride_hm, stride_asm, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, ACC: gl.constexpr,
                       HAS_BIAS: gl.constexpr, W_SCALE: gl.constexpr, A_SCALE: gl.constexpr, GATED: gl.constexpr,
                       QMAX: gl.constexpr, TAIL: gl.constexpr):  # fmt: skip
        """h[m, j] = silu(gate[m, j]) * up[m, j] for this program's BLOCK_N / 2 columns j, from the accumulator
        of its gate rows (first half) and up rows (second half). Each product is rounded to h's dtype first,
        and h too, as the unfused GEMM and SiLU-mul store them. GATED = 2: each program also maxes its rows'
        amax over its columns into counter slots 1..M and counts in on slot 0; the last to arrive quantizes
        h per token (scale = amax / QMAX, as kernels/quant.py) into q [M, inter] and qs [M] and zeroes the
        slots: the SiLU-mul kernel's work, without its launch. GATED = 3: each program writes its rows' amax over
        its columns to qs [M, programs], the block amaxes an XQ down projection takes its scales from."""
        WARPS: gl.constexpr = gl.num_warps()
        HALF: gl.constexpr = BLOCK_N // 2
        r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
        col = pid_n * HALF + r % HALF
        m_out = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
        acc = splitk_sm90.scaled(acc, bias_ptr, w_scale_ptr, a_scale_ptr, gl.where(r < HALF, col, inter + col),
                                 col < inter, m_out, M, stride_asm, HAS_BIAS, W_SCALE, A_SCALE)  # fmt: skip
        acc = acc.to(h_ptr.dtype.element_ty).to(gl.float32)
        # the gate and up halves of the accumulator, row for row, through shared memory
        e_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        e_smem.store(acc)
        gluon_barrier()
        HL: gl.constexpr = gl.BlockedLayout([1, BLOCK_M // 2], [16, 2], [WARPS, 1], [1, 0])
        gate = e_smem.slice(0, HALF).load(HL)
        up = e_smem.slice(HALF, HALF).load(HL)
        h = (gate / (1.0 + gl.exp(-gate)) * up).to(h_ptr.dtype.element_ty)
        hc = pid_n * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, HL))
        hm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, HL))
        ok = gl.expand_dims(hc < inter, 1) & gl.expand_dims(hm < M, 0)
        gl.store(h_ptr + gl.expand_dims(hm.to(gl.int64) * stride_hm, 0) + gl.expand_dims(hc, 1), h, mask=ok)
        if GATED == 3:  # each row's amax over this program's columns, into qs [M, programs] (XQ's block amaxes)
            block_amax = gl.max(gl.where(ok, gl.abs(h.to(gl.float32)), 0.0), axis=0)
            gl.store(qs_ptr + hm * gl.num_programs(0) + pid_n, block_amax, mask=hm < M)
        if GATED == 2:
            # each row's amax over every program's columns: an atomic max on the float's bits (non-negative
            # floats order as their int32 bits) in the counter slots after the arrival counter
            amax = gl.max(gl.where(ok, gl.abs(h.to(gl.float32)), 0.0), axis=0)
            gl.atomic_max(cnt_ptr + 1 + hm, amax.to(gl.int32, bitcast=True), mask=hm < M, sem="relaxed", scope="gpu")
            gluon_barrier()  # every thread's h and amax written before the (releasing) arrival
            arrived = gl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
            if arrived == gl.num_programs(0) - 1:
                gluon_barrier()
                TL: gl.constexpr = gl.BlockedLayout([TAIL // (32 * WARPS)], [32], [WARPS], [0])
                for m in range(M):
                    offs = gl.arange(0, TAIL, layout=TL)
                    # the row's first values and its amax (read and reset to zero) in flight together
                    first = gl.load(h_ptr + m * stride_hm + offs, mask=offs < inter, other=0.0, cache_modifier=".cg")
                    bits = gl.atomic_xchg(cnt_ptr + 1 + m, 0, sem="relaxed", scope="gpu")
                    scale = gl.maximum(bits.to(gl.float32, bitcast=True), 1e-12) / QMAX
                    gl.store(qs_ptr + m, scale)
                    inverse = 1.0 / scale  # multiplied, as quant.quantize_rows_and_store does
                    for k0 in range(0, inter, TAIL):
                        v = first.to(gl.float32)
                        if k0 > 0:
                            v = gl.load(h_ptr + m * stride_hm + k0 + offs, mask=k0 + offs < inter, other=0.0,
                                        cache_modifier=".cg").to(gl.float32)  # fmt: skip
                        v = gl.minimum(gl.maximum(v * inverse, -QMAX), QMAX)
                        gl.store(q_ptr + m * inter + k0 + offs, v.to(q_ptr.dtype.element_ty), mask=k0 + offs < inter)
                gl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")  # ready for the next launch

    @gluon.jit
    def xq_scales(xa_ptr, M, XA_BLOCKS, BLOCK_M: gl.constexpr, XA_PAD: gl.constexpr, QMAX: gl.constexpr,
                  ACC: gl.constexpr, XL: gl.constexpr):  # fmt: skip
        """Each token's scale, max(amax, 1e-12) / QMAX as kernels/quant.py sets it, from the amaxes of its row's
        XA_BLOCKS column blocks (xa [M, XA_BLOCKS] float32): (the scales in the accumulator's column layout,
        their reciprocals in XL's row layout). Rows past M: scale 1e-12 / QMAX (their values are zeros)."""
        WARPS: gl.constexpr = gl.num_warps()
        AL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [WARPS, 1], [1, 0])
        ar = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, AL))
        ab = gl.arange(0, XA_PAD, layout=gl.SliceLayout(0, AL))
        ok = gl.expand_dims(ar < M, 1) & gl.expand_dims(ab < XA_BLOCKS, 0)
        amax = gl.load(xa_ptr + gl.expand_dims(ar * XA_BLOCKS, 1) + gl.expand_dims(ab, 0), mask=ok, other=0.0)
        scale = gl.maximum(gl.max(amax, axis=1), 1e-12) / QMAX
        inverse = 1.0 / scale  # multiplied, as quant.quantize_rows_and_store does
        return gl.convert_layout(scale, gl.SliceLayout(0, ACC)), gl.convert_layout(inverse, gl.SliceLayout(1, XL))

    @gluon.constexpr_function
    def xn_row_layout(row_pad, warps):
        """A whole row of row_pad values over the program's threads (xn_stats). A constexpr function, not a jit
        one: Triton 3.6 cannot return a layout from a jit function."""
        return gl.BlockedLayout([row_pad // (32 * warps)], [32], [warps], [0])

    @gluon.jit
    def xn_norm_weight(g_ptr, K, ROW_PAD: gl.constexpr):
        """The norm weight g [K] in float32, in xn_row_layout: a parameter, loaded before the PDL wait."""
        offs = gl.arange(0, ROW_PAD, layout=xn_row_layout(ROW_PAD, gl.num_warps()))
        return gl.load(g_ptr + offs, mask=offs < K, other=0.0).to(gl.float32)

    @gluon.jit
    def xn_stats(x_ptr, g, M, K, eps, BLOCK_M: gl.constexpr, ROW_PAD: gl.constexpr, QMAX: gl.constexpr,
                 XT: gl.constexpr, ACC: gl.constexpr, XL: gl.constexpr):  # fmt: skip
        """For the rows of x [M, K] (contiguous) and the norm weight g (xn_norm_weight): (each token's scale in the
        accumulator's column layout; its reciprocal and its 1 / rms in XL's row layout), as kernels/rmsnorm.py
        sets them: rstd = 1 / sqrt(mean(x^2) + eps), out = x rstd g rounded to XT, scale = max(amax(out),
        1e-12) / QMAX. A row at a time, the whole row in registers (ROW_PAD >= K). Rows past M: rstd 0,
        scale 1e-12 / QMAX (their values are zeros)."""
        offs = gl.arange(0, ROW_PAD, layout=xn_row_layout(ROW_PAD, gl.num_warps()))
        ok = offs < K
        rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, XL))
        rstd_rows = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, XL))
        scale_rows = gl.full([BLOCK_M], 1e-12 / QMAX, gl.float32, layout=gl.SliceLayout(1, XL))
        for m in range(M):
            x = gl.load(x_ptr + m * K + offs, mask=ok, other=0.0).to(gl.float32)
            rstd = 1.0 / gl.sqrt(gl.sum(x * x, axis=0) / K + eps)
            out = (x * rstd * g).to(XT).to(gl.float32)
            scale = gl.maximum(gl.max(gl.abs(out), axis=0), 1e-12) / QMAX
            rstd_rows = gl.where(rows == m, rstd, rstd_rows)
            scale_rows = gl.where(rows == m, scale, scale_rows)
        inverse = 1.0 / scale_rows  # multiplied, as quant.quantize_rows_and_store does
        return gl.convert_layout(scale_rows, gl.SliceLayout(0, ACC)), inverse, rstd_rows

    @gluon.jit
    def _refill(w_desc, x_desc, w_smem, x_smem, ready, n0, x_row, half, k0, j, steps, STEP_BYTES: gl.constexpr,
                GATED: gl.constexpr):  # fmt: skip
        """K step j's weight tile (rows from n0; GATED: up rows `half` below) and activation tile (rows from x_row: 0,
        or a MoE pair's, moe_skinny_sm90) into its ring stage (nothing past the last step)."""
        BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
        STAGES: gl.constexpr = w_smem.shape[0]
        sj = j % STAGES
        mbarrier.expect(ready.index(sj), STEP_BYTES, pred=j < steps)
        _issue_w(w_desc, n0, half, k0 + j * BLOCK_K, ready.index(sj), w_smem.index(sj), j < steps, GATED)
        _issue(x_desc, x_row, k0 + j * BLOCK_K, ready.index(sj), x_smem.index(sj), j < steps)

    @gluon.jit
    def _step_mma(w_smem, x_smem, ready, i, dead):
        """K step i's MMA (asynchronous) once its stage has arrived, into fresh values in dead's registers (a
        product already added)."""
        STAGES: gl.constexpr = w_smem.shape[0]
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        return warpgroup_mma(w_smem.index(s), x_smem.index(s).permute((1, 0)), dead, use_acc=False, is_async=True)

    @gluon.jit
    def _group_scaled_steps(acc, w_smem, x_smem, ready, w_desc, x_desc, a_scale_ptr, w_scale_ptr, n0, N, M, K, k0,
                            steps, STEP_BYTES: gl.constexpr, GATED: gl.constexpr, ACC: gl.constexpr,
                            W_BLOCKS: gl.constexpr):  # fmt: skip
        """acc + the sum over this split's K steps of each step's product times its activation rows' scales (one a
        row and 128-column group: a_scale_ptr + group * M + m) and, W_BLOCKS, its weight block's scale (128 x 128
        blocks, w_scale_ptr [cdiv(N, 128), cdiv(K, 128)] contiguous: the program's rows lie in one block row, so
        one scale a step). Two steps an iteration: the second step's MMA goes out before the first's product is
        waited for and added, so the MMAs stay back to back as in the unscaled loop; none is in flight across the
        loop's back edge (gemm_block_sm90's rule). Refills as that loop's: after step i's MMA is issued, step
        i + STAGES - 1 into step i - 1's stage (waited for already)."""
        BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
        STAGES: gl.constexpr = w_smem.shape[0]
        BLOCK_N: gl.constexpr = acc.shape[0]
        BLOCK_M: gl.constexpr = acc.shape[1]
        m_acc = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
        scales = a_scale_ptr + (k0 // BLOCK_K) * M + m_acc
        w_blocks = w_scale_ptr + (n0 // BLOCK_K) * gl.cdiv(K, BLOCK_K) + k0 // BLOCK_K  # W_BLOCKS: this block row's
        rows_ok = m_acc < M
        dead0 = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
        dead1 = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
        whole = steps - steps % 2
        for base in range(0, whole, 2):
            s0 = gl.load(scales + base * M, mask=rows_ok, other=0.0)
            s1 = gl.load(scales + (base + 1) * M, mask=rows_ok, other=0.0)
            if W_BLOCKS:
                s0 = s0 * gl.load(w_blocks + base)
                s1 = s1 * gl.load(w_blocks + base + 1)
            p0 = _step_mma(w_smem, x_smem, ready, base, dead0)
            _refill(w_desc, x_desc, w_smem, x_smem, ready, n0, 0, N // 2, k0, base + STAGES - 1, steps, STEP_BYTES,
                    GATED)  # fmt: skip
            p1 = _step_mma(w_smem, x_smem, ready, base + 1, dead1)
            p0, p1 = warpgroup_mma_wait(num_outstanding=1, deps=(p0, p1))
            acc += p0 * gl.expand_dims(s0, 0)
            _refill(w_desc, x_desc, w_smem, x_smem, ready, n0, 0, N // 2, k0, base + STAGES, steps, STEP_BYTES, GATED)
            p1 = warpgroup_mma_wait(num_outstanding=0, deps=(p1,))
            acc += p1 * gl.expand_dims(s1, 0)
            dead0 = p0
            dead1 = p1
        if whole < steps:  # an odd last step (its refill would be past the end)
            s0 = gl.load(scales + whole * M, mask=rows_ok, other=0.0)
            if W_BLOCKS:
                s0 = s0 * gl.load(w_blocks + whole)
            p0 = warpgroup_mma_wait(num_outstanding=0, deps=(_step_mma(w_smem, x_smem, ready, whole, dead0),))
            acc += p0 * gl.expand_dims(s0, 0)
        return acc

    @gluon.jit
    def skinny_gemm_sm90_kernel(
        w_desc, x_desc, g_desc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, ws_ptr, cnt_ptr, q_ptr, qs_ptr, xa_ptr,
        g_ptr, M, N, K, K_PER_SPLIT, stride_cm, stride_asm, XA_BLOCKS, eps,
        BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr,
        W_SCALE: gl.constexpr, A_SCALE: gl.constexpr, SPLIT_K: gl.constexpr, GATED: gl.constexpr = 0,
        QMAX: gl.constexpr = 448.0, TAIL: gl.constexpr = 1024, XQ: gl.constexpr = 0, XA_PAD: gl.constexpr = 1,
        XN: gl.constexpr = False, ROW_PAD: gl.constexpr = 1, ADD_C: gl.constexpr = False, PREWAIT: gl.constexpr = 16,
        PDL: gl.constexpr = False,
    ):  # fmt: skip
        """c[m, n] = sum_k a[m, k] w[n, k] x scales (+ bias[n]) for BLOCK_N weight rows and all M
        (<= BLOCK_M) activation rows a program, over the K range of its split (program_id 1).
        GATED (gate_up, w = [gate | up], N = 2 I): a program's rows are BLOCK_N / 2 gate rows and the
        same up rows, and it writes silu(gate) * up [M, I] to c (gated_epilogue); GATED = 2 quantizes
        that per token into q_ptr / qs_ptr as well (SPLIT_K 1); GATED = 3 writes its block amaxes to qs_ptr. XQ 1 / 2 (FP8 weights, activations given in
        bf16 / fp16): x_desc reads the unquantized rows, and each step quantizes its tile per token into shared
        memory before the MMA, with the scales of xq_scales (the rows' amaxes from XA_BLOCKS blocks at xa_ptr).
        XN (with XQ): the activations are the residual stream x (xa_ptr, [M, K] contiguous) and the layer's input is
        its RMSNorm with weight g (g_ptr; g_desc reads it a step at a time) quantized per token: each program
        takes every row's 1 / rms and scale from the whole row first (xn_stats), and each step normalizes and
        quantizes its tile as kernels/rmsnorm.py would. ADD_C: the output is added to c (a residual add).
        A_SCALE = 3 (FP8): one activation scale a row and K step (a_scale_ptr + group * M + m), each step's MMA
        into fresh registers, added scaled (_group_scaled_steps). PREWAIT: of the ring's first STAGES - 1 steps,
        those whose weight tiles are requested before the PDL wait (the rest right after it; PREWAIT_STAGES)."""
        WARPS: gl.constexpr = gl.num_warps()
        DT: gl.constexpr = w_desc.dtype
        # DT, or (XQ) the 16-bit activations' (not read from x_desc: nothing of it is touched before the PDL wait)
        XT: gl.constexpr = gl.float16 if XQ == 2 else gl.bfloat16 if XQ else DT
        BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_M, 256 // DT.primitive_bitwidth])  # fmt: skip
        # both tiles of a step
        XN_ROWS: gl.constexpr = 1 if XN else 0  # the norm weight's step tile rides in the stage
        X_BITS: gl.constexpr = (BLOCK_M + XN_ROWS) * XT.primitive_bitwidth
        STEP_BYTES: gl.constexpr = (BLOCK_N * DT.primitive_bitwidth + X_BITS) * BLOCK_K // 8

        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        n0 = pid_n * BLOCK_N // 2 if GATED else pid_n * BLOCK_N  # gated: the first gate row (its up row: + N / 2)
        k0 = pid_k * K_PER_SPLIT
        steps = gl.cdiv(gl.minimum(K, k0 + K_PER_SPLIT) - k0, BLOCK_K)

        w_smem = gl.allocate_shared_memory(DT, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
        g_smem = w_smem  # (unused without XN)
        if XN:
            g_smem = gl.allocate_shared_memory(XT, [STAGES, 1, BLOCK_K], g_desc.layout)
        ready = ring_barriers(STAGES)

        # the first STAGES - 1 steps: weights (and XN's norm weight) first (not written by the kernel before: no
        # wait for it; PREWAIT of them), then, once the previous kernel's writes are visible, the activations
        for i in gl.static_range(STAGES - 1):
            mbarrier.expect(ready.index(i), STEP_BYTES, pred=i < steps)
            if i < PREWAIT:
                _issue_weights(w_desc, g_desc, w_smem, g_smem, ready, n0, N, k0 + i * BLOCK_K, i, steps, GATED, XN)
        if XN:  # the norm weight whole, for the rows' statistics after the wait
            g_row = xn_norm_weight(g_ptr, K, ROW_PAD)
        gluon_pdl_wait(PDL)
        x_smem = gl.allocate_shared_memory(XT, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
        for i in gl.static_range(STAGES - 1):
            if i >= PREWAIT:
                _issue_weights(w_desc, g_desc, w_smem, g_smem, ready, n0, N, k0 + i * BLOCK_K, i, steps, GATED, XN)
            _issue(x_desc, 0, k0 + i * BLOCK_K, ready.index(i), x_smem.index(i), i < steps)
        if XQ:
            XL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])  # 16-byte shared reads
            # the quantized tile, three buffers: the MMA that read one last was issued three steps back, and
            # every warpgroup waited for it before the last step's barrier
            x8_smem = gl.allocate_shared_memory(DT, [3, BLOCK_M, BLOCK_K],
                                                gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))  # fmt: skip
            if XN:
                x_scale, x_inverse, x_rstd = xn_stats(xa_ptr, g_row, M, K, eps, BLOCK_M, ROW_PAD, QMAX, XT, ACC, XL)
            else:
                x_scale, x_inverse = xq_scales(xa_ptr, M, XA_BLOCKS, BLOCK_M, XA_PAD, QMAX, ACC, XL)

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
        if A_SCALE == 3:  # one scale a row and K step (a 128-value group): each step's product scaled as it is added
            acc = _group_scaled_steps(acc, w_smem, x_smem, ready, w_desc, x_desc, a_scale_ptr, w_scale_ptr, n0, N, M, K,
                                      k0, steps, STEP_BYTES, GATED, ACC, W_SCALE == 3)  # fmt: skip
        else:
            for i in range(steps):
                s = i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                if XQ:
                    v = x_smem.index(s).load(XL).to(gl.float32)
                    if XN:  # the RMSNorm's output, rounded to the model's dtype as the norm kernel stores it
                        gk = g_smem.index(s).load(XL).to(gl.float32)
                        v = (v * gl.expand_dims(x_rstd, 1) * gk).to(XT).to(gl.float32)
                    v = v * gl.expand_dims(x_inverse, 1)
                    x_op = x8_smem.index(i % 3)
                    x_op.store(gl.minimum(gl.maximum(v, -QMAX), QMAX).to(DT))
                    fence_async_shared()  # the generic proxy's stores, before the MMA's asynchronous reads
                    gluon_barrier()  # every warp's part written (and stage s read: it is refilled below)
                    acc = warpgroup_mma(w_smem.index(s), x_op.permute((1, 0)), acc, is_async=True)
                else:
                    acc = warpgroup_mma(w_smem.index(s), x_smem.index(s).permute((1, 0)), acc, is_async=True)
                # at most this step's MMA in flight: the previous step's stage is free for step i + STAGES - 1
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                j = i + STAGES - 1
                _refill(w_desc, x_desc, w_smem, x_smem, ready, n0, 0, N // 2, k0, j, steps, STEP_BYTES, GATED)
                if XN:
                    _issue(g_desc, 0, k0 + j * BLOCK_K, ready.index(j % STAGES), g_smem.index(j % STAGES), j < steps)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        release_ring(ready, STAGES)
        if XQ:  # the tokens' scales, before the K splits are summed (A_SCALE 0)
            acc = acc * gl.expand_dims(x_scale, 0)
        A_EPILOGUE: gl.constexpr = 0 if A_SCALE == 3 else A_SCALE  # group scales applied in the loop already
        W_EPILOGUE: gl.constexpr = 0 if W_SCALE == 3 else W_SCALE  # and block scales

        if GATED:
            gated_epilogue(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, cnt_ptr, q_ptr, qs_ptr, pid_n, M, N // 2,
                           stride_cm, stride_asm, BLOCK_N, BLOCK_M, ACC, HAS_BIAS, W_SCALE, A_SCALE, GATED, QMAX,
                           TAIL)  # fmt: skip
        else:
            splitk_sm90.finish_tile(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, ws_ptr, cnt_ptr, pid_n, pid_k, M,
                                    N, stride_cm, stride_asm, BLOCK_N, BLOCK_M, ACC, HAS_BIAS, W_EPILOGUE, A_EPILOGUE,
                                    SPLIT_K, ADD_C)  # fmt: skip
