"""kv_cache_dtype="fp8": e4m3 K/V with per-layer scales, end to end against the unquantized cache."""

import pytest
import torch

from tritonllm import LLM, SamplingParams, platform
from tritonllm.models.tiny import tiny_model_path


def test_fp8_cache_takes_one_byte_per_element(tiny_llama):
    full = LLM(model=tiny_llama, max_model_len=128)
    fp8 = LLM(model=tiny_llama, max_model_len=128, kv_cache_dtype="fp8")
    assert fp8.llm_engine.runner.kv_caches[0][0].dtype == platform.fp8_e4m3_dtype()
    ratio = full.llm_engine.runner.kv_bytes_per_block() / fp8.llm_engine.runner.kv_bytes_per_block()
    assert ratio == full.llm_engine.dtype.itemsize


def prompt_logprob_diffs(a_outputs, b_outputs) -> torch.Tensor:
    diffs = []
    for a, b in zip(a_outputs, b_outputs):
        for pos, (ea, eb) in enumerate(zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:])):
            token = a.prompt_token_ids[pos + 1]
            diffs.append(abs(ea[token].logprob - eb[token].logprob))
    return torch.tensor(diffs)


PROMPTS = [{"prompt_token_ids": list(range(10 + i, 40 + 3 * i))} for i in range(3)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=0)


# The engine runs that several tests compare against, made once for the module: greedy runs of the
# same prompts on a fresh engine, so each test sees exactly what its own run would have produced
@pytest.fixture(scope="module")
def full_out(tiny_llama):
    return LLM(model=tiny_llama, max_model_len=128).generate(PROMPTS, PARAMS, use_tqdm=False)


@pytest.fixture(scope="module")
def fp8_out(tiny_llama):
    return LLM(model=tiny_llama, max_model_len=128, kv_cache_dtype="fp8").generate(PROMPTS, PARAMS, use_tqdm=False)


def test_fp8_engine_matches_the_fp8_torch_reference(tiny_llama, fp8_out):
    """Same quantisation in both backends: the Triton path computes what the reference defines."""
    triton_out = fp8_out
    ref_out = LLM(model=tiny_llama, max_model_len=128, kv_cache_dtype="fp8", kernel_backend="torch_ref").generate(
        PROMPTS, PARAMS, use_tqdm=False
    )
    assert prompt_logprob_diffs(triton_out, ref_out).max() < 2e-3
    assert [o.outputs[0].token_ids for o in triton_out] == [o.outputs[0].token_ids for o in ref_out]


def test_fp8_cache_accuracy_against_the_full_precision_cache(full_out, fp8_out):
    """e4m3 keeps 3 mantissa bits (~2.7% relative error on this model's K/V, |K| ~ 2); the tiny
    model's attention is sharp (scores ~ 4), so prompt logprobs move by ~0.2 on average."""
    diffs = prompt_logprob_diffs(full_out, fp8_out)
    assert diffs.mean() < 0.3 and diffs.max() < 1.0


def test_unknown_kv_cache_dtype_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(model=tiny_llama, kv_cache_dtype="int3")


def test_calculated_kv_scales_come_from_the_first_prompt_step(tiny_llama, full_out):
    """calculate_kv_scales: each layer's K/V scale is amax / 448 of the first prompt step's K/V (the
    scales then stay), and the cache tracks the full-precision one about as closely as with scale 1
    (e4m3 is a floating-point format: the scale guards its range, not its relative precision)."""
    llm = LLM(model=tiny_llama, max_model_len=128, kv_cache_dtype="fp8", calculate_kv_scales=True)
    layers = llm.llm_engine.model.model.layers
    seen = {}  # the first step's K/V amax per layer, from the K/V the attention layer receives (K rotated)

    def record(i: int):
        def hook(module, args) -> None:
            q, k, v, rope = args[0], args[1], args[2], args[5]
            k = rope.rotary(rope.positions, q, k)[1]
            seen.setdefault(i, (k.abs().amax().item(), v.abs().amax().item()))

        return hook

    hooks = [layer.self_attn.attn.register_forward_pre_hook(record(i)) for i, layer in enumerate(layers)]
    fp8 = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    for h in hooks:
        h.remove()
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    for i, layer in enumerate(layers):
        attn = layer.self_attn.attn
        assert attn.k_scale.item() == pytest.approx(seen[i][0] / fp8_max, rel=1e-6)
        assert attn.v_scale.item() == pytest.approx(seen[i][1] / fp8_max, rel=1e-6)
    diffs = prompt_logprob_diffs(full_out, fp8)
    # as with scale 1 (mean ~0.2 on this sharp random model); the largest single move is 1.17 here
    assert diffs.mean() < 0.3 and diffs.max() < 1.5
    with pytest.raises(ValueError, match="calculate_kv_scales needs an FP8 KV cache"):
        LLM(model=tiny_llama, max_model_len=128, calculate_kv_scales=True)


def test_the_fused_rope_and_cache_write_serve_what_the_two_kernels_do(monkeypatch):
    """fuse_rope_kv_write (the default): one kernel normalises q and k per head (Qwen3), rotates them and
    writes the FP8 cache, and no separate norm or KV write runs; with it off, the RMSNorm kernel, the
    rotary kernel and then the KV write store the same bytes, so logprobs and tokens are the same to
    the bit."""
    qwen3 = str(tiny_model_path("Qwen3ForCausalLM"))
    fused = LLM(model=qwen3, max_model_len=128, kv_cache_dtype="fp8")
    separate = []
    kernels = fused.llm_engine.runner.kernels
    monkeypatch.setattr(kernels, "write_kv_cache", lambda *args, **kw: separate.append("write_kv_cache"))
    monkeypatch.setattr(kernels, "rotary_embedding", lambda *args, **kw: separate.append("rotary_embedding"))
    fused_out = fused.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert separate == []
    monkeypatch.undo()
    split = LLM(model=qwen3, max_model_len=128, kv_cache_dtype="fp8", fuse_rope_kv_write=False)
    split_out = split.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert prompt_logprob_diffs(fused_out, split_out).max() == 0
    assert [o.outputs[0].token_ids for o in fused_out] == [o.outputs[0].token_ids for o in split_out]
