"""The gated activation of SwiGLU MLPs."""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.distributed.parallel_state import SINGLE
from tritonllm.kernels.quant_formats import OutputQuant, QuantizedActivation
from tritonllm.kernels.registry import default_kernels
from tritonllm.layers.linear import Linear, NormedInput


class SiluAndMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        self._quant_for: tuple = ()  # (the linear layer whose input this op quantizes,): no submodule
        # gated(): the SiLU-mul in the gate_up GEMM's epilogue where the linear implementation has such a
        # kernel (EngineConfig.fuse_gated_activation, off by default); False: a kernel after the GEMM
        self.fuse_gemm = False
        # mlp(): where the next layer quantizes its input (W8A8), its GEMM quantizes the SiLU-mul's 16-bit output
        # itself where its linear implementation can (its `silu_mul_linear` entry; EngineConfig.fuse_down_input_quant)
        self.fuse_down_input = False
        # forward(): the down projection's FP8 input per 1 x 128 group at decode sizes where its linear implementation
        # asks for it (Linear.input_quant), so the quantizing kernel spreads a row over many programs instead of one
        # (EngineConfig.decode_group_quant); False: the scheme's per-token scales (ablation)
        self.group_quant = True

    def quantize_for(self, linear: Linear) -> None:
        """Quantize the output for `linear` in this op's kernel where its method allows it (as RMSNorm)."""
        self._quant_for = (linear,) if linear.method.input_quant_fusable else ()

    def gated(self, gate_up: Linear, x: torch.Tensor | QuantizedActivation) -> torch.Tensor | QuantizedActivation:
        """silu(gate) * up of gate_up(x) (quantized for the next layer as forward quantizes it): in the GEMM's
        epilogue where gate_up's linear implementation serves it (its `gated_linear` entry), else the GEMM
        and then this op's kernel."""
        if self.fuse_gemm:
            if isinstance(x, NormedInput):  # the gated epilogue takes the norm's output
                x = x.materialize()
            quant = OutputQuant.of(self._quant_for[0].qweight) if self._quant_for else None
            fused = gate_up.queued(gate_up.method.apply_gated(gate_up, x, quant))
            if fused is not None:
                return fused
        return self(gate_up(x))

    def mlp(
        self, gate_up: Linear, down: Linear, x: torch.Tensor | QuantizedActivation | NormedInput,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor | None:  # fmt: skip
        """down(silu(gate) * up of gate_up(x)): with fuse_down_input, where down quantizes its input and its
        kernels take the SiLU-mul's 16-bit output and quantize it in the GEMM (forward_silu_mul), that one
        call; else gated(), then down. Given the residual stream, None where down added its output into it
        (Linear.forward_residual). With fuse_gemm and fuse_down_input both, where the kernels serve it, the two GEMMs
        alone (gate_up's epilogue writes h and its block amaxes, down quantizes h: apply_gated_mlp)."""
        if self.fuse_down_input and self._quant_for and self.fuse_gemm and getattr(down, "tp", SINGLE).size == 1:
            parts = (x.stream, x.norm.weight, x.norm.eps) if isinstance(x, NormedInput) else (x, None, 0.0)
            out = down.queued(gate_up.method.apply_gated_mlp(gate_up, down, *parts, residual))
            if out is not None:
                return None if out is residual else out
        if self.fuse_down_input and self._quant_for and not self.fuse_gemm:
            y = gate_up(x)
            out = down.forward_silu_mul(y)
            return down(self(y)) if out is None else out
        h = self.gated(gate_up, x)
        if residual is not None and down.forward_residual(h, residual):
            return None
        return down(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor | QuantizedActivation:
        """x [num_tokens, 2 * d] = [gate | up] -> silu(gate) * up [num_tokens, d] (quantized for the
        next layer when quantize_for set one)."""
        if self._quant_for:
            quant = self._quant_for[0].input_quant(x.numel() // x.shape[-1], self.group_quant)
            return self.kernels.silu_and_mul_quant(x, quant.dtype, quant.static_scale, group=quant.group)
        return self.kernels.silu_and_mul(x)
