"""Sliding-window attention through the whole engine against HF transformers on the same tiny
Mistral (every layer windowed, 8 keys), with prompts several windows long, prefix caching and
chunked prefill on: greedy tokens identical and logprobs within 1e-3 of HF's, while the KV cache
manager gives blocks behind the window back to the pool (their stale table entries never read)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tritonllm import LLM, SamplingParams
from tritonllm.models.tiny import tiny_model_path

WINDOW = 8
NUM_STEPS = 12
TOL = 1e-3


@pytest.fixture(scope="module")
def windowed_mistral() -> str:
    return str(tiny_model_path("MistralForCausalLM", sliding_window=WINDOW))


def _check_against_hf(hf: torch.nn.Module, prompt: list[int], out) -> None:
    completion = out.outputs[0]
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + completion.token_ids[:-1]])).logits[0]
    ref = torch.log_softmax(logits.float(), dim=-1)
    plen = len(prompt)
    assert completion.token_ids == ref[plen - 1 :].argmax(-1).tolist()
    for i in range(1, plen if out.prompt_logprobs else 0):
        assert abs(out.prompt_logprobs[i][prompt[i]].logprob - ref[i - 1, prompt[i]].item()) < TOL
    for step, token_id in enumerate(completion.token_ids):
        assert abs(completion.logprobs[step][token_id].logprob - ref[plen - 1 + step, token_id].item()) < TOL


def test_sliding_window_engine_matches_hf(windowed_mistral: str, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(
        model=windowed_mistral, block_size=4, max_model_len=64, num_gpu_blocks_override=20, enable_prefix_caching=True,
        enable_chunked_prefill=True, max_num_batched_tokens=16,
    )  # fmt: skip
    layers = [m for m in llm.llm_engine.model.modules() if hasattr(m, "sliding_window")]
    assert layers and {m.sliding_window for m in layers} == {WINDOW}
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(5, 600, (21,), generator=g).tolist()
    # prompts of 2-5 windows in 16-token chunks; the second and third share 5 cached blocks
    prompts = [torch.randint(5, 600, (n,), generator=g).tolist() for n in (37, 9)]
    prompts += [shared + [7, 8, 9], shared + torch.randint(5, 600, (12,), generator=g).tolist()]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_STEPS, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    # 20 blocks: the first three requests would need 28 at their ends; released blocks are reused at once,
    # so stale table entries point at other requests' KV and reading one would show
    kv = llm.llm_engine.scheduler.kv_cache
    assert kv.sliding_window == WINDOW
    released = []  # the most blocks released out of the window at once, over the run
    release = kv.release_out_of_window

    def spy(request_id: str, first_position: int) -> None:
        release(request_id, first_position)
        released.append(sum(kv._num_released.values()))
        kv.check_invariant()

    monkeypatch.setattr(kv, "release_out_of_window", spy)
    first = llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], params, use_tqdm=False)
    assert max(released) >= 10  # the 37 + 12 token request alone leaves 10 blocks behind its window
    assert llm.llm_engine.scheduler.num_preemptions == 0  # the released blocks made room
    # after the first batch finished: the shared prefix comes from the cache
    hits = kv.prefix_cache_hits
    # (prompt logprobs turn the lookup off: they need every prompt position computed)
    cached_params = SamplingParams(temperature=0.0, max_tokens=NUM_STEPS, ignore_eos=True, logprobs=1)
    last = llm.generate([{"prompt_token_ids": prompts[3]}], cached_params, use_tqdm=False)
    assert kv.prefix_cache_hits - hits == 20  # 5 blocks of the shared 21 tokens
    kv.check_invariant()
    assert kv.num_used_blocks == 0
    hf = AutoModelForCausalLM.from_pretrained(windowed_mistral, dtype=torch.float32, attn_implementation="eager")
    for prompt, out in zip(prompts, first + last, strict=True):
        _check_against_hf(hf, prompt, out)
