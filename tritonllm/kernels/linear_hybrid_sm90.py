"""The linear op for unquantized models on Hopper as `auto` takes it (`kernels.linear=hybrid_sm90`): cuBLAS,
except at decode sizes, where the skinny Gluon GEMM (kernels/gemm_skinny_sm90.py) was measured faster.

At M <= 4 rows of 16-bit activations (gemm_skinny_sm90.measured_faster) the skinny GEMM streams the weight by TMA
and sums its K splits in its own kernel (cuBLAS launches a reduction kernel after a split-K GEMV), and starts its
weight copies under the previous kernel's tail (PDL). On an H100 (session 29, experiments/moe/README.md) gpt-oss-20b
batch-1 TPOT fell from 2.728 to 2.541 ms with every bf16 projection on the Triton GEMMs (`triton_sm90`), and with
this implementation Llama-3-8B bf16 batch-1 TPOT went from 6.223 to 5.975 ms (cuBLAS alone); on the H200 Llama-3-8B
bf16 batch 1 ran 1.11x cuBLAS on `triton_sm90` (session 14, experiments/gemm/README.md). Larger M
(prefill, many sequences) stays on cuBLAS, where the Triton GEMMs were 0.96-1.03x of it. Quantized layers are
`torch`'s (cuBLAS's FP8 / INT8 GEMMs; `auto` takes the Triton implementations for quantized models).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tritonllm.kernels import gemm_skinny_sm90, linear_torch
from tritonllm.kernels.launch import pdl_launch
from tritonllm.kernels.registry import Supports, register


def _unavailable() -> str | None:
    if gemm_skinny_sm90.available():
        return None
    return "needs an NVIDIA sm90 GPU and a Triton whose Gluon compiles the skinny GEMM"


SUPPORTS = Supports(
    dtypes=frozenset({torch.bfloat16, torch.float16}), platforms=frozenset({"cuda"}),
    linear_formats=linear_torch.TORCH_FORMATS, auto_linear_formats=frozenset(), available=_unavailable,
)  # fmt: skip


def takes_skinny(x2: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a layer's call on the rows x2 [M, K] runs the skinny GEMM: where measured faster, and it can."""
    m, k = x2.shape
    return gemm_skinny_sm90.measured_faster(m, weight.shape[0], k, x2.dtype) and gemm_skinny_sm90.takes(x2, weight)


@register("linear", "hybrid_sm90", supports=SUPPORTS, priority=25)
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if not takes_skinny(x2, weight):
        return F.linear(x, weight, bias)
    c = torch.empty((x2.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    gemm_skinny_sm90.skinny_gemm_sm90(x2, weight, c, bias, None, None, pdl_launch())
    return c.view(*x.shape[:-1], weight.shape[0])


register("linear", "hybrid_sm90", entry="quantized_linear")(linear_torch.quantized_linear)
