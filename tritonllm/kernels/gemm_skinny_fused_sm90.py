"""The fused modes of the Hopper skinny GEMM (kernels/gemm_skinny_sm90.py, one Gluon kernel): launchers of
the kernel for work it absorbs from the ops around a linear layer at decode sizes, each an ablation of the
engine (EngineConfig) served through the linear op's optional entries (kernels/linear.py):

- XQ (xq_skinny_gemm_sm90): an FP8 down projection quantizing its 16-bit input itself, from block amaxes.
- XN (xn_skinny_gemm_sm90): an FP8 qkv / gate_up applying the RMSNorm before it to the residual stream.
- Gated (gated_skinny_gemm_sm90): gate_up's SiLU-mul in its epilogue (optionally quantized by the last program),
  and its block-amax form (gated_amax_skinny_gemm_sm90) that feeds XQ.

The kernel is looked up on its module at each launch (sk.skinny_gemm_sm90_kernel), so a test's launch spy set
there counts these launches too.
"""

from __future__ import annotations

import torch
import triton

from tritonllm.kernels import gemm_skinny_sm90 as sk
from tritonllm.kernels import splitk_sm90
from tritonllm.kernels.launch import arrival_counters
from tritonllm.kernels.splitk_sm90 import scale_kind

# the largest M at which the down projection's FP8 GEMM quantizes its own bf16 input (xq_skinny_gemm_sm90)
XQ_MAX_M = 16


def xq_takes(m: int, k: int, dtype: torch.dtype, b: torch.Tensor) -> bool:
    """Whether xq_skinny_gemm_sm90 serves a contiguous h [m, k] of `dtype` (16-bit) and the FP8 weight b
    [N, K] here: m <= XQ_MAX_M, the skinny GEMM measured faster for FP8 at this shape, TMA's alignment."""
    return (
        sk.HAVE_GLUON and 1 <= m <= XQ_MAX_M and dtype in (torch.bfloat16, torch.float16)
        and b.dtype == torch.float8_e4m3fn and b.shape[1] == k and k % 16 == 0 and sk.tma_ok(b)
        and sk.measured_faster(m, b.shape[0], k, b.dtype) and sk.available()
    )  # fmt: skip


def xq_skinny_gemm_sm90(h: torch.Tensor, amax: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                        bias: torch.Tensor | None, pdl: dict, residual: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """c = quant(h) . b^T x b_scale[n] x scale[m] (+ bias) in h's dtype, for h [M, K] in 16 bits quantized to
    FP8 per token inside the GEMM (xq_takes): scale[m] = max(amax of row m, 1e-12) / 448 from amax [M, B],
    the row's amaxes over B column blocks (activation.silu_and_mul_amax writes them), and each value
    multiplied by 1 / scale, clamped and rounded, as kernels/quant.py quantizes a row. b_scale: float32, one
    or one per row of b. residual [M, N] (contiguous, h's dtype): c is residual, the product added into it
    (ADD_C, as skinny_gemm_sm90's add_c)."""
    (m, k), n = h.shape, b.shape[0]
    p = sk.plan(m, n, k, b.element_size(), deep=False)
    c = residual if residual is not None else torch.empty((m, n), dtype=h.dtype, device=h.device)
    split, k_per_split, tiles, ws, cnt = splitk_sm90.plan_splits(m, n, k, p.split, sk.ROW_BYTES, p.block_n, c)
    blocks = amax.shape[1]
    x_desc = sk.xq_descriptor(h, sk.block_m(m))
    sk.skinny_gemm_sm90_kernel[(tiles, split)](
        sk.descriptor(b, p.block_n), x_desc, x_desc, c, bias if bias is not None else c, b_scale, ws,
        ws, cnt, ws, ws, amax, ws, m, n, k, k_per_split, c.stride(0), 0, blocks, 0.0,
        BLOCK_N=p.block_n, BLOCK_M=sk.block_m(m), STAGES=p.stages, HAS_BIAS=bias is not None,
        W_SCALE=scale_kind(b_scale), A_SCALE=splitk_sm90.SCALE_NONE, SPLIT_K=split, QMAX=448.0,
        XQ=2 if h.dtype == torch.float16 else 1, XA_PAD=max(2, triton.next_power_of_2(blocks)),
        ADD_C=residual is not None, num_warps=p.warps, **pdl,
    )  # fmt: skip
    return c


# the largest M at which an FP8 qkv / gate_up GEMM takes the residual stream and RMS-normalizes and quantizes it
# itself (xn_skinny_gemm_sm90); its prologue reads each row whole, a row after another
XN_MAX_M = 4
XN_MAX_K = 8192  # the row in registers: ROW_PAD / 128 float32 values a thread for x, as many for g


def xn_takes(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether xn_skinny_gemm_sm90 serves the stream x [m, k] (contiguous, TMA-aligned), norm weight g and the
    FP8 weight b [N, K] here: m <= XN_MAX_M, k <= XN_MAX_K, g contiguous in x's dtype, what xq_takes asks."""
    (m, k), dtype = x.shape, x.dtype
    return (
        m <= XN_MAX_M and k <= XN_MAX_K and x.is_contiguous() and sk.tma_ok(x) and g.dtype == dtype
        and g.shape == (k,) and g.is_contiguous() and g.data_ptr() % 16 == 0 and xq_takes(m, k, dtype, b)
    )  # fmt: skip


def xn_skinny_gemm_sm90(x: torch.Tensor, g: torch.Tensor, eps: float, b: torch.Tensor, b_scale: torch.Tensor,
                        bias: torch.Tensor | None, pdl: dict) -> torch.Tensor:  # fmt: skip
    """c = quant(rms_norm(x) g) . b^T x b_scale[n] x scale[m] (+ bias) in x's dtype for the 16-bit residual
    stream x [M, K] (xn_takes): the values kernels/rmsnorm.py's quantizing norm would give the GEMM (per token,
    dynamic scales, multiplied by their reciprocals), computed inside it while the weight copies stream, so
    no norm kernel runs. b_scale: float32, one or one per row of b."""
    (m, k), n = x.shape, b.shape[0]
    p = sk.plan(m, n, k, b.element_size(), deep=False)
    c = torch.empty((m, n), dtype=x.dtype, device=x.device)
    split, k_per_split, tiles, ws, cnt = splitk_sm90.plan_splits(m, n, k, p.split, sk.ROW_BYTES, p.block_n, c)
    sk.skinny_gemm_sm90_kernel[(tiles, split)](
        sk.descriptor(b, p.block_n), sk.xq_descriptor(x, sk.block_m(m)), sk.xn_weight_descriptor(g), c,
        bias if bias is not None else c, b_scale, ws, ws, cnt, ws, ws, x, g, m, n, k, k_per_split, c.stride(0), 0, 0,
        float(eps), BLOCK_N=p.block_n, BLOCK_M=sk.block_m(m), STAGES=p.stages, HAS_BIAS=bias is not None,
        W_SCALE=scale_kind(b_scale), A_SCALE=splitk_sm90.SCALE_NONE, SPLIT_K=split, QMAX=448.0,
        XQ=2 if x.dtype == torch.float16 else 1, XN=True, ROW_PAD=max(32 * p.warps, triton.next_power_of_2(k)),
        num_warps=p.warps, **pdl,
    )  # fmt: skip
    return c


# the largest M at which gate_up's SiLU-mul also quantizes its output in the GEMM (GATED 2) when serving
# models: 0, none. The last program to arrive quantizes the M rows of h alone (4 warps, one division a
# value), after every program's arrival: on the H200 at Llama-3-8B's gate_up and M = 1 that launch took
# 34.8 us against 29.2 for the GEMM and 3.7 for the SiLU-mul + quantization kernel, whose 16 warps run
# while the down projection's weight copies start (PDL); batch-1 FP8 decode ran 343.0 against 358.1 tok/s
# (experiments/gemm/README.md, session 18). Kept callable (tests) for a distributed quantization to build on.
GATED_QUANT_MAX_M = 0


def gated_takes(a: torch.Tensor, b: torch.Tensor, quantized: bool) -> bool:
    """Whether gated_skinny_gemm_sm90 serves a [M, K] and gate_up's b [2 I, K] here: the skinny GEMM takes
    them and is measured faster, its plan does not split K (the SiLU-mul needs whole sums), and, for a
    quantized output, M <= GATED_QUANT_MAX_M and the device's arrival counters exist."""
    m, k = a.shape
    n = b.shape[0]
    if not (n % 2 == 0 and sk.takes(a, b) and sk.measured_faster(m, n, k, a.dtype)):
        return False
    if sk.plan(m, n, k, a.element_size(), deep=False).split != 1:
        return False
    return not quantized or (m <= GATED_QUANT_MAX_M and arrival_counters(a.device) is not None)


def gated_skinny_gemm_sm90(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, a_scale: torch.Tensor | None,
                           b_scale: torch.Tensor | None, out_dtype: torch.dtype, quant_dtype: torch.dtype | None,
                           pdl: dict) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """silu(gate) * up of gate_up = (a . b^T) x scales (+ bias), b = [gate | up] [2 I, K], in one launch
    (gated_takes): h [M, I] in out_dtype, or with quant_dtype (FP8) h quantized per token, (q [M, I],
    scales float32 [M, 1]), as kernels/activation.py's silu_and_mul(_quant) would give them."""
    (m, k), n = a.shape, b.shape[0]
    inter = n // 2
    p = sk.plan(m, n, k, a.element_size(), deep=False)
    programs = triton.cdiv(inter, p.block_n // 2)
    h = torch.empty((m, inter), dtype=out_dtype, device=a.device)
    if quant_dtype is None:
        q = qs = cnt = h
    else:
        q = torch.empty((m, inter), dtype=quant_dtype, device=a.device)
        qs = torch.empty((m, 1), dtype=torch.float32, device=a.device)
        cnt = arrival_counters(a.device)
    warps = p.warps
    x_desc = sk.descriptor(a, sk.block_m(m))
    sk.skinny_gemm_sm90_kernel[(programs, 1)](
        sk.descriptor(b, p.block_n // 2), x_desc, x_desc, h, bias if bias is not None else h,
        b_scale if b_scale is not None else h, a_scale if a_scale is not None else h, h, cnt, q, qs, qs, qs,
        m, n, k, k, h.stride(0), a_scale.stride(0) if scale_kind(a_scale) == splitk_sm90.SCALE_EACH else 0, 0, 0.0,
        BLOCK_N=p.block_n, BLOCK_M=sk.block_m(m), STAGES=p.stages, HAS_BIAS=bias is not None,
        W_SCALE=scale_kind(b_scale), A_SCALE=scale_kind(a_scale), SPLIT_K=1, GATED=1 if quant_dtype is None else 2,
        QMAX=float(torch.finfo(quant_dtype).max) if quant_dtype is not None else 448.0,
        TAIL=min(triton.next_power_of_2(inter), 4096 * warps),
        num_warps=warps, **pdl,
    )  # fmt: skip
    return h if quant_dtype is None else (q, qs)


# the most column blocks (gate_up programs) whose amaxes an XQ down projection reads in one tile
XA_MAX_BLOCKS = 512


def gated_amax_takes(a: torch.Tensor, b: torch.Tensor, norm_weight: torch.Tensor | None) -> bool:
    """Whether gated_amax_skinny_gemm_sm90 serves gate_up's FP8 weight b [2 I, K] for a [M, K]: FP8 activations
    (or, with norm_weight, the 16-bit residual stream, xn_takes), m <= XN_MAX_M, an unsplit plan, at most
    XA_MAX_BLOCKS programs."""
    m, (n, k) = a.shape[0], b.shape
    if n % 2 or m > XN_MAX_M or b.dtype != torch.float8_e4m3fn:
        return False
    if norm_weight is None:
        ok = sk.takes(a, b) and sk.measured_faster(m, n, k, a.dtype)
    else:
        ok = xn_takes(a, norm_weight, b)
    p = sk.plan(m, n, k, b.element_size(), deep=False)
    return ok and p.split == 1 and triton.cdiv(n // 2, p.block_n // 2) <= XA_MAX_BLOCKS


def gated_amax_skinny_gemm_sm90(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor, b_scale: torch.Tensor,
                                bias: torch.Tensor | None, out_dtype: torch.dtype, pdl: dict,
                                norm: tuple[torch.Tensor, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(h, amax): h = silu(gate) * up of the FP8 gate_up [gate | up] [2 I, K] in out_dtype (as gated_skinny_gemm_sm90
    gives it) and each row's amax over every program's columns, float32 [M, programs]: what
    xq_skinny_gemm_sm90 takes to quantize h itself, so no activation kernel runs between the two GEMMs
    (gated_amax_takes). a: FP8 [M, K] with per-token a_scale; or, with norm = (norm weight, eps), the 16-bit
    residual stream, RMS-normalized and quantized in the kernel (XN, a_scale None)."""
    (m, k), n = a.shape, b.shape[0]
    inter = n // 2
    p = sk.plan(m, n, k, b.element_size(), deep=False)
    programs = triton.cdiv(inter, p.block_n // 2)
    h = torch.empty((m, inter), dtype=out_dtype, device=a.device)
    amax = torch.empty((m, programs), dtype=torch.float32, device=a.device)
    if norm is None:
        x_desc = g_desc = sk.descriptor(a, sk.block_m(m))
        g, eps, xq, row_pad = h, 0.0, 0, 1
    else:
        g, eps = norm
        x_desc, g_desc = sk.xq_descriptor(a, sk.block_m(m)), sk.xn_weight_descriptor(g)
        xq, row_pad = 2 if a.dtype == torch.float16 else 1, max(32 * p.warps, triton.next_power_of_2(k))
    sk.skinny_gemm_sm90_kernel[(programs, 1)](
        sk.descriptor(b, p.block_n // 2), x_desc, g_desc, h, bias if bias is not None else h, b_scale,
        a_scale if a_scale is not None else h, h, h, h, amax, a if norm is not None else h, g,
        m, n, k, k, h.stride(0), a_scale.stride(0) if scale_kind(a_scale) == splitk_sm90.SCALE_EACH else 0, 0,
        float(eps), BLOCK_N=p.block_n, BLOCK_M=sk.block_m(m), STAGES=p.stages, HAS_BIAS=bias is not None,
        W_SCALE=scale_kind(b_scale), A_SCALE=scale_kind(a_scale), SPLIT_K=1, GATED=3, QMAX=448.0, XQ=xq,
        XN=norm is not None, ROW_PAD=row_pad, num_warps=p.warps, **pdl,
    )  # fmt: skip
    return h, amax
