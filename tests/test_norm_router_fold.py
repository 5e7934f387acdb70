"""fuse_norm_into_router (opt-in until timed on a GPU): at decode steps of one or two tokens the residual add and
RMSNorm before each MoE block run inside its router's launch (kernels/moe_route.py's norm_router_route), which
also stores the normalized rows the experts read and the new residual; with it off, the norm kernel runs first.
The same values either way, so greedy tokens and their logprobs agree to the bit on the CPU."""

from __future__ import annotations

import pytest

from tritonllm import LLM, SamplingParams
from tritonllm.models.tiny import tiny_model_path

PROMPTS = [{"prompt_token_ids": list(range(10 + i, 40 + 3 * i))} for i in range(2)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)


def _generate(model: str, fold: bool, monkeypatch) -> tuple[list, list, int, int]:
    """(token ids, logprobs of each sampled token, norm_router_route calls that ran the fused kernel, fused add +
    RMSNorm launches of at most two rows) of one engine."""
    llm = LLM(model=model, max_model_len=128, kernel_backend="triton", fuse_norm_into_router=fold)
    kernels = llm.llm_engine.runner.kernels
    fused, small_norms = [], []
    norm_router, add_norm = kernels.norm_router_route, kernels.fused_add_rms_norm

    def norm_router_spy(*args, **kwargs):
        out = norm_router(*args, **kwargs)
        fused.append(out is not None)
        return out

    def add_norm_spy(x, *args, **kwargs):
        small_norms.append(x.shape[0] <= 2)
        return add_norm(x, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(kernels, "norm_router_route", norm_router_spy)
        m.setattr(kernels, "fused_add_rms_norm", add_norm_spy)
        outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outputs]
    logprobs = [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in outputs]
    return tokens, logprobs, sum(fused), sum(small_norms)


# Mixtral (softmax top-2), Qwen2-MoE (a shared expert beside the routed ones), gpt-oss (biases, sinks, MXFP4 experts)
@pytest.mark.parametrize("architecture", ["MixtralForCausalLM", "Qwen2MoeForCausalLM", "GptOssForCausalLM"])
def test_norm_in_the_router_serves_what_the_norm_kernel_does(architecture, monkeypatch):
    model = str(tiny_model_path(architecture))
    tokens, logprobs, fused, small_norms = _generate(model, True, monkeypatch)
    ref_tokens, ref_logprobs, ref_fused, ref_small_norms = _generate(model, False, monkeypatch)
    assert tokens == ref_tokens and logprobs == ref_logprobs
    assert ref_fused == 0 and fused > 0  # the fused kernel ran at decode steps, and only with the switch on
    # each decode step's MoE layers: the post-attention norms' launches gone (the input norms stay)
    assert small_norms <= ref_small_norms - fused
