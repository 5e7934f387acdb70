"""The skinny GEMM (M = 1..64) as stream-K for NVIDIA Hopper, in Gluon: every SM streams the same number of
weight bytes through one unbroken ring of TMA stages.

gemm_skinny_sm90 gives each program a tile of BLOCK_N weight rows (and a K split). Where the tiles do not
divide evenly over the SMs the last wave runs part-empty: gate_up's 224 tiles of 128 rows take two waves of
132 programs (or two programs on 92 SMs and one on 40), and each program's ring starts empty. Here the
(tile, K step) pairs are laid end to end in tile order and each of the grid's programs (one or two an SM,
`Plan.stream`) takes an equal run of them: one prologue, one ring across its tiles (the next tile's copies are
in flight while a tile is finished), and a tile cut between programs is summed by the last of them to arrive
(float32 partials, in program order: the same bits every call). Same operands, scales, bias and ADD_C as the
skinny kernel's plain GEMM (no gated, XQ or XN modes). Chosen by gemm_skinny_sm90.plan where it measured faster.
"""

from __future__ import annotations

import torch
import triton

from tritonllm import platform
from tritonllm.kernels import gemm_skinny_sm90 as sk
from tritonllm.kernels import splitk_sm90
from tritonllm.kernels.launch import arrival_counters, compile_gluon_sm90, gluon_pdl_wait
from tritonllm.kernels.splitk_sm90 import scale_kind

if sk.HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait


def runs(m: int, n: int, k: int, block_n: int, block_k: int, programs: int) -> tuple[int, int]:
    """(programs, the most programs that share one tile) for the (tile, K step) pairs of an [M, K] x [N, K]^T
    product cut into `programs` equal runs (fewer programs where there are fewer pairs)."""
    steps = triton.cdiv(k, block_k)
    total = triton.cdiv(n, block_n) * steps
    programs = max(1, min(programs, total))
    return programs, triton.cdiv(steps, total // programs) + 1


def takes(n: int, block_n: int, c: torch.Tensor) -> bool:
    """Whether the arrival counters serve a launch over n rows (splitk_sm90.counters_serve)."""
    return splitk_sm90.counters_serve(triton.cdiv(n, block_n), c.device)


def stream_gemm_sm90(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                     a_scale: torch.Tensor | None, b_scale: torch.Tensor | None, pdl: dict, p: sk.Plan,
                     add_c: bool = False) -> torch.Tensor:  # fmt: skip
    """gemm_skinny_sm90.skinny_gemm_sm90's product (its arguments) with plan p's rows a tile, stages and warps,
    over p.stream programs an SM."""
    (m, k), n = a.shape, b.shape[0]
    block_k = sk.ROW_BYTES // a.element_size()
    programs, parts = runs(m, n, k, p.block_n, block_k, p.stream * platform.num_multiprocessors())
    ws = torch.empty((parts, m, n), dtype=torch.float32, device=c.device)
    x_desc = sk.descriptor(a, sk.block_m(m))
    stream_gemm_sm90_kernel[(programs,)](
        sk.descriptor(b, p.block_n), x_desc, c, bias if bias is not None else c,
        b_scale if b_scale is not None else ws, a_scale if a_scale is not None else ws, ws,
        arrival_counters(c.device), m, n, k, c.stride(0),
        a_scale.stride(0) if scale_kind(a_scale) == splitk_sm90.SCALE_EACH else 0,
        BLOCK_N=p.block_n, BLOCK_M=sk.block_m(m), STAGES=p.stages, HAS_BIAS=bias is not None,
        W_SCALE=scale_kind(b_scale), A_SCALE=scale_kind(a_scale), MAX_PARTS=parts, ADD_C=add_c, num_warps=p.warps,
        **pdl,
    )  # fmt: skip
    return c


def compile_sm90(dtype: torch.dtype = torch.bfloat16, block_n: int = 128, bm: int = 16, stages: int = 12,
                 warps: int = 4, scales: bool = False):  # fmt: skip
    """Compile for sm90 without a GPU (launch.compile_gluon_sm90): the build tests."""
    from triton.runtime.jit import mangle_type

    w = torch.empty((block_n, 256), dtype=dtype)
    out = "*fp16" if dtype == torch.float16 else "*bf16"
    constexprs = dict(BLOCK_N=block_n, BLOCK_M=bm, STAGES=stages, HAS_BIAS=False, W_SCALE=2 if scales else 0,
                      A_SCALE=2 if scales else 0, MAX_PARTS=3, ADD_C=False, PDL=True)  # fmt: skip
    types = dict(w_desc=mangle_type(sk.descriptor(w, block_n)), x_desc=mangle_type(sk.descriptor(w, bm)), c_ptr=out,
                 bias_ptr=out, w_scale_ptr="*fp32", a_scale_ptr="*fp32", ws_ptr="*fp32", cnt_ptr="*i32")  # fmt: skip
    return compile_gluon_sm90(stream_gemm_sm90_kernel, constexprs, types, ("stride_cm",), num_warps=warps)


if sk.HAVE_GLUON:

    @gluon.jit
    def _issue_weight(w_desc, g, steps, j, pred, ready, w_smem, STAGES: gl.constexpr, STEP_BYTES: gl.constexpr,
                      BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):  # fmt: skip
        """Where pred, the weight box of this program's step j (global pair g: tile g // steps, K step g % steps)
        into ring stage j % STAGES, with the stage's byte count (the activation box's too)."""
        s = j % STAGES
        mbarrier.expect(ready.index(s), STEP_BYTES, pred=pred)
        sk._issue(w_desc, (g // steps) * BLOCK_N, (g % steps) * BLOCK_K, ready.index(s), w_smem.index(s), pred)

    @gluon.jit
    def _issue_act(x_desc, g, steps, j, pred, ready, x_smem, STAGES: gl.constexpr, BLOCK_K: gl.constexpr):
        """Where pred, the activation box of step j (pair g) into ring stage j % STAGES."""
        s = j % STAGES
        sk._issue(x_desc, 0, (g % steps) * BLOCK_K, ready.index(s), x_smem.index(s), pred)

    @gluon.jit
    def stream_gemm_sm90_kernel(
        w_desc, x_desc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, ws_ptr, cnt_ptr, M, N, K, stride_cm, stride_asm,
        BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr,
        W_SCALE: gl.constexpr, A_SCALE: gl.constexpr, MAX_PARTS: gl.constexpr, ADD_C: gl.constexpr = False,
        PDL: gl.constexpr = False,
    ):  # fmt: skip
        """c[m, n] = sum_k a[m, k] w[n, k] x scales (+ bias[n]) for this program's run of (tile, K step) pairs
        (tiles of BLOCK_N weight rows, all M <= BLOCK_M activation rows; a program's pairs are
        [pid x pairs / programs, (pid + 1) x pairs / programs)). A tile wholly in the run is written to c; a
        tile cut between runs is written as a partial to ws [parts, M, N] (part: the program's rank among the
        tile's, at most MAX_PARTS of them) and summed by its last program to arrive (splitk_sm90.finish_part)."""
        WARPS: gl.constexpr = gl.num_warps()
        DT: gl.constexpr = w_desc.dtype
        BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_M, 256 // DT.primitive_bitwidth])  # fmt: skip
        STEP_BYTES: gl.constexpr = (BLOCK_N + BLOCK_M) * DT.primitive_bitwidth * BLOCK_K // 8

        steps = gl.cdiv(K, BLOCK_K)  # K steps a tile
        total = gl.cdiv(N, BLOCK_N) * steps
        programs = gl.num_programs(0)
        pid = gl.program_id(0)
        start = pid * total // programs
        end = (pid + 1) * total // programs
        run = end - start

        w_smem = gl.allocate_shared_memory(DT, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
        ready = sk.ring_barriers(STAGES)
        # the first STAGES - 1 steps' weights before the PDL wait (the previous kernel does not write them),
        # their activations after it
        for i in gl.static_range(STAGES - 1):
            _issue_weight(w_desc, start + i, steps, i, i < run, ready, w_smem, STAGES, STEP_BYTES, BLOCK_N, BLOCK_K)
        gluon_pdl_wait(PDL)
        x_smem = gl.allocate_shared_memory(DT, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
        for i in gl.static_range(STAGES - 1):
            _issue_act(x_desc, start + i, steps, i, i < run, ready, x_smem, STAGES, BLOCK_K)

        i = 0  # the ring's step
        for tile in range(start // steps, (end - 1) // steps + 1):
            lo = gl.maximum(start, tile * steps)
            hi = gl.minimum(end, (tile + 1) * steps)
            acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
            for _ in range(lo, hi):
                s = i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                acc = warpgroup_mma(w_smem.index(s), x_smem.index(s).permute((1, 0)), acc, is_async=True)
                # at most this step's MMA in flight: the previous step's stage is free for step i + STAGES - 1
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                j = i + STAGES - 1
                _issue_weight(w_desc, start + j, steps, j, j < run, ready, w_smem, STAGES, STEP_BYTES, BLOCK_N, BLOCK_K)
                _issue_act(x_desc, start + j, steps, j, j < run, ready, x_smem, STAGES, BLOCK_K)
                i += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            # the programs whose runs hold this tile's first and last pairs (program p starts at p x total //
            # programs, so pair g is in the run of ((g + 1) x programs - 1) // total)
            first = ((tile * steps + 1) * programs - 1) // total
            last = (((tile + 1) * steps) * programs - 1) // total
            if last > first:
                splitk_sm90.finish_part(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, ws_ptr, cnt_ptr, tile,
                                        pid - first, last - first + 1, M, N, stride_cm, stride_asm, BLOCK_N, BLOCK_M,
                                        ACC, HAS_BIAS, W_SCALE, A_SCALE, MAX_PARTS, ADD_C)  # fmt: skip
            else:
                splitk_sm90.finish_tile(acc, c_ptr, bias_ptr, w_scale_ptr, a_scale_ptr, ws_ptr, cnt_ptr, tile, 0, M, N,
                                        stride_cm, stride_asm, BLOCK_N, BLOCK_M, ACC, HAS_BIAS, W_SCALE, A_SCALE, 1,
                                        ADD_C)  # fmt: skip
        sk.release_ring(ready, STAGES)
