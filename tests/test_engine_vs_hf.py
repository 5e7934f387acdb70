"""The whole engine against HuggingFace transformers on the same tiny model folders (CPU, float32):
prompt logprobs and per-step logprobs within 1e-3, greedy tokens identical for 20 steps (the 40-token prompt decodes into its fourth block)."""

import pytest
import torch
from launch_spy import LaunchSpy  # tests/
from transformers import AutoModelForCausalLM

from tritonllm import LLM, SamplingParams
from tritonllm.models.tiny import TINY_MOE_ARCHITECTURES, tiny_model_path

NUM_STEPS = 20
TOL = 1e-3


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = [3, 17, 40, 9]  # ragged, crossing block boundaries (block size 16)
    return [torch.randint(5, 600, (n,), generator=g).tolist() for n in lengths]


# the Triton kernels run end to end on Llama (plain) and Qwen3 (q/k norms); Mistral and Qwen2 (biases) differ
# from them only in layers, checked here on the torch reference kernels (the Triton interpreter's ~45 s a
# model is the CPU suite's largest cost; the kernels themselves have their own conformance tests)
TRITON_DENSE = ("LlamaForCausalLM", "Qwen3ForCausalLM")


@pytest.mark.parametrize("block_size", [16])
def test_greedy_tokens_and_logprobs_match_hf(tiny_model, prompts, block_size):
    triton = any(str(tiny_model_path(arch)) == str(tiny_model) for arch in TRITON_DENSE)
    check_against_hf(tiny_model, prompts, block_size=block_size, max_model_len=256,
                     kernel_backend="triton" if triton else "torch_ref")  # fmt: skip


# the torch reference kernels keep these engine runs short on the CPU (the Triton MoE and attention
# features are checked against HF in test_models_vs_hf.py); gpt-oss also runs the Triton kernels
MOE_CASES = [(arch, "torch_ref") for arch in TINY_MOE_ARCHITECTURES] + [("GptOssForCausalLM", "triton")]


@pytest.mark.parametrize("architecture, kernels", MOE_CASES)
def test_moe_models_match_hf_with_chunked_prefill_and_prefix_caching(architecture, kernels, prompts):
    """Mixtral, Qwen2-MoE (shared expert), Qwen3-MoE (a dense layer) and gpt-oss (sinks, an 8-token
    window on alternate layers, yarn) through the whole engine: prompts chunked by a 24-token budget,
    the last prompt sharing the third's first 32 tokens (a prefix-cache hit)."""
    shared = [*prompts[:3], prompts[2][:32] + prompts[3]]
    check_against_hf(
        str(tiny_model_path(architecture)), shared, num_steps=8, block_size=16, max_model_len=256,
        max_num_batched_tokens=24, enable_chunked_prefill=True, enable_prefix_caching=True, kernel_backend=kernels,
    )  # fmt: skip


def test_moe_kernel_variants_match_hf(prompts, monkeypatch):
    """gpt-oss through the whole engine on the Triton MoE with every variant forced on (kernels/moe_tiles.py
    TRITONLLM_MOE_VARIANTS): the GEMV's joint gate/up pass and in-register slot sum at decode, the grouped
    GEMM's descriptor reads and block-ordered intermediate at prefill; on by default only on Hopper
    (moe_tiles.default_variants), so on the CPU this is their engine-level check against HF."""
    from tritonllm.kernels import moe_tiles

    monkeypatch.setenv("TRITONLLM_MOE_VARIANTS", "joint,sum_slots,tma")
    moe_tiles.variants_override.cache_clear()
    try:
        test_moe_models_match_hf_with_chunked_prefill_and_prefix_caching("GptOssForCausalLM", "triton", prompts)
    finally:
        monkeypatch.delenv("TRITONLLM_MOE_VARIANTS")
        moe_tiles.variants_override.cache_clear()


def test_fused_moe_router_matches_hf(prompts, monkeypatch):
    """gpt-oss with fuse_moe_router (the default): its decode steps of one sequence route with the router's
    linear layer and the top-k in one kernel (kernels/moe_route.py's router_route), its prefill chunks (24
    tokens) with the GEMM and moe_route; greedy tokens and logprobs as HF's, and the fused kernel seen running."""
    from tritonllm.kernels import moe_route

    spy = LaunchSpy.install(monkeypatch, moe_route, "router_route_kernel")
    shared = [*prompts[:3], prompts[2][:32] + prompts[3]]
    check_against_hf(
        str(tiny_model_path("GptOssForCausalLM")), shared, num_steps=8, block_size=16, max_model_len=256,
        max_num_batched_tokens=24, max_num_seqs=1, kernel_backend="triton", fuse_moe_router=True,
    )  # fmt: skip
    assert spy.launches >= 2 * 7  # two MoE layers a decode step, at least seven decode steps


def test_norm_folded_into_moe_router_matches_hf(prompts, monkeypatch):
    """Qwen3-MoE with fuse_norm_into_router: its decode steps of one sequence run each MoE block's residual add and
    RMSNorm in the router's launch (kernels/moe_route.py's norm_router_route), seen running; greedy tokens and
    logprobs as HF's."""
    from tritonllm.kernels import moe_route

    spy = LaunchSpy.install(monkeypatch, moe_route, "router_route_kernel")
    check_against_hf(
        str(tiny_model_path("Qwen3MoeForCausalLM")), prompts[:2], num_steps=8, block_size=16, max_model_len=256,
        max_num_seqs=1, kernel_backend="triton", fuse_norm_into_router=True,
    )  # fmt: skip
    assert any(call.get("NORM") for call in spy.calls)


def test_rope_folded_into_split_decode_matches_hf(prompts, monkeypatch):
    """Qwen3 (per-head q / k norms before RoPE) with fold_rope_into_attention and split-KV decode forced on the CPU
    (a 64-SM wave, segments of 8 keys and up): its decode steps rotate q and write the new K/V inside the split
    kernel (kernels/attention_rope.py), seen running; greedy tokens and logprobs as HF's."""
    import dataclasses

    from tritonllm.kernels import attention

    monkeypatch.setattr(attention, "_num_multiprocessors", lambda: 64)
    config = attention.ATTENTION_CONFIGS["interpreter"]
    monkeypatch.setitem(attention.ATTENTION_CONFIGS, "interpreter", dataclasses.replace(config, split_min_keys=8))
    folded, run = [], attention.AttentionPlan.run
    monkeypatch.setattr(attention.AttentionPlan, "run",
                        lambda self, *a, **kw: folded.append(kw.get("rope") is not None) or run(self, *a, **kw))  # fmt: skip
    check_against_hf(str(tiny_model_path("Qwen3ForCausalLM")), prompts, num_steps=8, block_size=16,
                     max_model_len=256, kernel_backend="triton", fold_rope_into_attention=True)  # fmt: skip
    assert any(folded)


def check_against_hf(model_path: str, prompts: list[list[int]], num_steps: int = NUM_STEPS, **llm_args: object) -> None:
    tiny_model = model_path
    llm = LLM(model=model_path, **llm_args)
    params = SamplingParams(temperature=0.0, max_tokens=num_steps, ignore_eos=True, logprobs=3, prompt_logprobs=3)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="eager")
    for prompt, out in zip(prompts, outputs, strict=True):
        completion = out.outputs[0]
        assert len(completion.token_ids) == num_steps
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion.token_ids[:-1]])).logits[0]
        ref = torch.log_softmax(logits.float(), dim=-1)
        plen = len(prompt)
        # greedy: HF's argmax after our prefix is our token, at every step
        assert completion.token_ids == ref[plen - 1 :].argmax(-1).tolist()
        # prompt logprobs: position i is scored by HF's row i - 1, top-k included
        assert out.prompt_logprobs[0] is None
        for i in range(1, plen):
            entry = out.prompt_logprobs[i]
            assert prompt[i] in entry
            for token_id, lp in entry.items():
                assert abs(lp.logprob - ref[i - 1, token_id].item()) < TOL
        # per-step logprobs, with the top-3 ranked as HF ranks them
        for step, token_id in enumerate(completion.token_ids):
            entry = completion.logprobs[step]
            row = ref[plen - 1 + step]
            assert abs(entry[token_id].logprob - row[token_id].item()) < TOL
            assert entry[token_id].rank == 1
            top3 = row.topk(3).indices.tolist()
            assert set(top3) <= set(entry)
            for token, lp in entry.items():
                assert abs(lp.logprob - row[token].item()) < TOL
        assert completion.cumulative_logprob == pytest.approx(
            sum(e[t].logprob for e, t in zip(completion.logprobs, completion.token_ids)), abs=1e-4
        )
