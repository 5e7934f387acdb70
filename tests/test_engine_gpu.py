"""The engine on the GPU in bfloat16 against HF transformers in float32 (same tiny folders)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tritonllm import LLM, SamplingParams

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_bf16_engine_tracks_hf_float32(tiny_model, kv_cache_dtype):
    prompts = [list(range(5 + i, 30 + 7 * i)) for i in range(4)]
    llm = LLM(model=tiny_model, dtype="bfloat16", max_model_len=256, kv_cache_dtype=kv_cache_dtype)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).cuda()
    diffs = []
    for prompt, out in zip(prompts, outputs):
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([prompt], device="cuda")).logits[0].float(), -1)
        diffs += [
            abs(out.prompt_logprobs[i][prompt[i]].logprob - ref[i - 1, prompt[i]].item()) for i in range(1, len(prompt))
        ]
    diffs = torch.tensor(diffs)
    limit = 0.1 if kv_cache_dtype == "auto" else 0.3  # bf16 activations (3 significant digits); e4m3 K/V
    assert diffs.mean() < limit, diffs
