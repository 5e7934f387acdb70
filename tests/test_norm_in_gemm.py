"""fuse_norm_into_gemm: the decoder layers hand their RMSNorms to the next linear layer (linear's norm_linear
entry) and o_proj / down_proj add into the residual stream themselves (residual_linear). The Hopper kernels
that serve those entries are GPU tests (tests/kernels/test_gemm_skinny_sm90.py, tests/test_engine_gpu.py);
here the model's side runs on the CPU with reference entries that do what the kernels do, declining past
four rows as the kernels do, so prefill steps take the norm kernels and decode steps the entries."""

from __future__ import annotations

import pytest

from tritonllm import LLM, SamplingParams

PROMPTS = [{"prompt_token_ids": list(range(10 + i, 30 + 3 * i))} for i in range(2)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0, prompt_logprobs=0)
MAX_ROWS = 4  # gemm_skinny_fused_sm90.XN_MAX_M


def _reference_entries(kernels, calls: list[str]):
    """(norm_linear, residual_linear, gated_mlp_linear) built from the engine's own unfused kernels (as they
    are now: a spy set on them later sees only the layers' own calls)."""
    rms_norm_quant, quantized_linear = kernels.rms_norm_quant, kernels.quantized_linear
    silu_and_mul_quant = kernels.silu_and_mul_quant

    def norm_linear(x, norm_weight, eps, weight, bias):
        if x.shape[0] > MAX_ROWS:
            return None
        calls.append("norm_linear")
        act, _ = rms_norm_quant(x, None, norm_weight, eps, weight.scheme.weight_dtype, weight.input_scale)
        return quantized_linear(act, weight, bias)

    def residual_linear(x, weight, bias, residual):
        if residual.shape[0] > MAX_ROWS:
            return None
        calls.append("residual_linear")
        out = quantized_linear(x, weight, bias)
        residual.copy_((residual.float() + out.float()).to(residual.dtype))
        return residual

    def gated_mlp_linear(x, norm_weight, eps, gate_up, gate_up_bias, down, down_bias, residual):
        if x.shape[0] > MAX_ROWS:
            return None
        calls.append("gated_mlp_linear")
        if norm_weight is not None:
            x, _ = rms_norm_quant(x, None, norm_weight, eps, gate_up.scheme.weight_dtype, gate_up.input_scale)
        h = silu_and_mul_quant(quantized_linear(x, gate_up, gate_up_bias), down.scheme.weight_dtype, down.input_scale)
        out = quantized_linear(h, down, down_bias)
        if residual is None:
            return out
        residual.copy_((residual.float() + out.float()).to(residual.dtype))
        return residual

    return norm_linear, residual_linear, gated_mlp_linear


def _run(model: str, fused: bool, monkeypatch, calls: list[str], mlp: bool = False):
    """mlp: with fuse_gated_activation and fuse_down_input_quant too (the gated MLP entry, whose down projection
    quantizes its input per token as the Hopper XQ kernel does: so the unfused run too, not per 1 x 128 group)."""
    flags = dict(fuse_gated_activation=fused, fuse_down_input_quant=fused, decode_group_quant=False) if mlp else {}
    llm = LLM(model=model, max_model_len=128, quantization="fp8", fuse_norm_into_gemm=fused, **flags)
    kernels = llm.llm_engine.runner.kernels
    for name, entry in zip(("norm_linear", "residual_linear", "gated_mlp_linear"), _reference_entries(kernels, calls)):
        monkeypatch.setattr(kernels, name, entry)
    norms = []
    rms_norm_quant = kernels.rms_norm_quant
    monkeypatch.setattr(
        kernels, "rms_norm_quant", lambda *a, **kw: norms.append(a[0].shape[0]) or rms_norm_quant(*a, **kw)
    )
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    monkeypatch.undo()
    return outputs, norms


@pytest.mark.parametrize("mlp", [False, True], ids=["norms", "norms_and_gated_mlp"])
def test_norms_handed_to_the_gemms_give_the_unfused_results(mlp, monkeypatch):
    """Greedy tokens and every logprob equal to the fused add + norm kernels' (the same roundings); in decode
    steps no quantizing norm kernel runs but the final norm's, in prefill steps (more than four rows) the
    layers fall back to the norm kernels; with the flags off the entries are never asked. mlp: the MLP's two
    GEMMs through gated_mlp_linear, given the stream and adding into it."""
    from tritonllm.models.tiny import tiny_model_path

    model = str(tiny_model_path("LlamaForCausalLM"))
    calls: list[str] = []
    fused, fused_norms = _run(model, True, monkeypatch, calls, mlp)
    assert "norm_linear" in calls and "residual_linear" in calls
    assert ("gated_mlp_linear" in calls) == mlp
    assert all(rows > MAX_ROWS for rows in fused_norms), fused_norms  # the entries served every decode row
    calls.clear()
    unfused, unfused_norms = _run(model, False, monkeypatch, calls, mlp)
    assert calls == [] and any(rows <= MAX_ROWS for rows in unfused_norms)
    for a, b in zip(fused, unfused):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert [lp[t].logprob for t, lp in zip(a.outputs[0].token_ids, a.outputs[0].logprobs)] == [
            lp[t].logprob for t, lp in zip(b.outputs[0].token_ids, b.outputs[0].logprobs)
        ]
        assert [e[t].logprob for t, e in zip(a.prompt_token_ids[1:], a.prompt_logprobs[1:])] == [
            e[t].logprob for t, e in zip(b.prompt_token_ids[1:], b.prompt_logprobs[1:])
        ]
