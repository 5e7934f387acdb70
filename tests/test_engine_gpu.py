"""The engine on the GPU in bfloat16 against HF transformers in float32 (same tiny folders)."""

import pytest
import torch
from launch_spy import LaunchSpy  # tests/
from transformers import AutoModelForCausalLM

from tritonllm import LLM, SamplingParams
from tritonllm.models.tiny import TINY_ARCHITECTURES, fitted_tiny_model_path

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


@pytest.mark.parametrize("architecture", TINY_ARCHITECTURES)
def test_bf16_engine_greedy_tokens_equal_hf_float32(architecture):
    """Greedy tokens, not only mean logprobs: the engine in bfloat16 (CUDA graphs, Triton kernels)
    continues counting prompts exactly as HF transformers in float32 does, on the tiny model of each
    architecture fitted to the counting pattern (peaked distributions: no near-ties to flip)."""
    path = fitted_tiny_model_path(architecture)
    prompts = [list(range(100, 116)) + list(range(300, 310)), list(range(520, 530)), list(range(40, 77))]
    llm = LLM(model=str(path), dtype="bfloat16", max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
    for prompt, out in zip(prompts, outputs):
        ids = torch.tensor([prompt], device="cuda")
        with torch.no_grad():
            for _ in range(8):  # greedy, without HF's end-of-sequence handling (ignore_eos above)
                ids = torch.cat([ids, hf(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert out.outputs[0].token_ids == ids[0, len(prompt) :].tolist(), (architecture, prompt[:3])


def test_an_uncapturable_kernel_runs_its_steps_eagerly_with_the_same_tokens(tiny_llama):
    # the torch reference attention reads sequence lengths back to the host: no decode graph can
    # hold it, so the engine runs decode steps eagerly (piecewise graphs still hold the rest)
    kw = dict(model=tiny_llama, dtype="bfloat16", max_model_len=256)
    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 5 * i))} for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ref = LLM(**kw, kernels={"attention": "torch_ref"})
    assert ref.llm_engine.runner.decode_graphs is None and ref.llm_engine.runner.piecewise_graphs is not None
    got = [o.outputs[0].token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    del ref
    auto = LLM(**kw)
    assert auto.llm_engine.runner.decode_graphs is not None
    want = [o.outputs[0].token_ids for o in auto.generate(prompts, params, use_tqdm=False)]
    agree = sum(a == b for g, w in zip(got, want) for a, b in zip(g, w)) / sum(len(w) for w in want)
    assert agree > 0.9, (got, want)  # bf16: a near-tie may flip late tokens


def test_fp8_batch1_decode_with_the_attention_epilogue_fused_matches_unfused(monkeypatch):
    """Online FP8 at batch 1 with a long max_model_len: every decode step (CUDA graphs) takes split-KV
    attention, whose kernel merges its results and quantizes o_proj's input (fuse_attention_epilogue:
    no merge kernel is launched, captured or not). Greedy tokens and their logprobs as with the merge
    and quantization kernels after it."""
    from tritonllm.kernels import attention

    merges = []
    merge = attention._MERGE
    monkeypatch.setattr(attention, "_MERGE", lambda *args, **kwargs: merges.append(1) or merge(*args, **kwargs))
    # split-KV ran, merged by its own kernel only when fused
    _fused_matches_unfused("fuse_attention_epilogue", merges, False, max_model_len=2048, quantization="fp8")


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_fp8_batch1_decode_with_o_projs_input_per_head_matches_per_token(architecture, monkeypatch):
    """Online FP8 batch-1 decode with o_proj's input quantized per 1 x 128 group by the split-KV kernel
    (decode_group_quant: groups across two heads of 64 in the tiny Llama, one a head of 128 in the tiny Qwen3,
    where each KV head's merger quantizes its own) and applied a K step at a time by the skinny GEMM: greedy
    tokens and logprobs as with per-token scales."""
    from tritonllm.kernels import gemm_skinny_sm90, splitk_sm90

    grouped, launcher = [], gemm_skinny_sm90.skinny_gemm_sm90

    def spy(a, b, c, bias, a_scale, *args, **kwargs):
        if splitk_sm90.scale_kind(a_scale) == splitk_sm90.SCALE_GROUP:
            grouped.append(1)
        return launcher(a, b, c, bias, a_scale, *args, **kwargs)

    monkeypatch.setattr(gemm_skinny_sm90, "skinny_gemm_sm90", spy)
    _fused_matches_unfused("decode_group_quant", grouped, True, architecture, max_model_len=2048,
                           quantization="fp8", kernels={"linear": "triton_sm90"})  # fmt: skip


def test_bf16_batch1_decode_with_the_gated_activation_fused_matches_unfused(monkeypatch):
    """Batch-1 bf16 decode with gate_up's SiLU-mul in the skinny GEMM's epilogue (fuse_gated_activation).
    The tiny model's gate_up is too narrow for an unsplit plan, so both runs take one (PLAN_OVERRIDE):
    greedy tokens equal, logprobs as with the GEMM and then the activation kernel."""
    calls = _spy_fused_launcher(monkeypatch, "gated_skinny_gemm_sm90", unsplit=True)
    _fused_matches_unfused("fuse_gated_activation", calls, True, max_model_len=512, kernels={"linear": "triton_sm90"})


@pytest.mark.parametrize("quantization", ["int4", "mxfp4"])
def test_4bit_batch1_decode_with_the_gated_activation_fused_matches_unfused(quantization, monkeypatch):
    """Batch-1 int4 / MXFP4 decode with gate_up's SiLU-mul in the Gluon W4 GEMV's epilogue (fuse_gated_activation:
    gemv_w4_sm90's GATED build); greedy tokens equal, logprobs as with the GEMV and then the activation kernel."""
    from tritonllm.kernels import gemv_w4_sm90

    if not gemv_w4_sm90.available():
        pytest.skip("the Gluon W4 GEMV runs on sm90 GPUs only")
    gated, launcher = [], gemv_w4_sm90.w4_gemv_sm90
    monkeypatch.setattr(gemv_w4_sm90, "w4_gemv_sm90",
                        lambda *args, **kwargs: (kwargs.get("gated") and gated.append(1)) or launcher(*args, **kwargs))  # fmt: skip
    _fused_matches_unfused("fuse_gated_activation", gated, True, max_model_len=512, quantization=quantization,
                           kernels={"linear": "triton_sm90"})  # fmt: skip


def test_fp8_batch1_decode_with_the_down_input_quantized_in_its_gemm_matches_unfused(monkeypatch):
    """Online FP8 at batch 1 with fuse_down_input_quant: the down projection's skinny GEMM quantizes the
    many-program SiLU-mul's bf16 output itself (XQ); greedy tokens equal and logprobs close to the
    quantizing SiLU-mul kernel and the GEMM."""
    calls = _spy_fused_launcher(monkeypatch, "xq_skinny_gemm_sm90")
    _fused_matches_unfused("fuse_down_input_quant", calls, True, max_model_len=512, quantization="fp8",
                           kernels={"linear": "triton_sm90"})  # fmt: skip


def test_bf16_batch1_decode_with_the_moe_router_fused_matches_unfused(monkeypatch):
    """gpt-oss (the fitted tiny one) in bf16 with fuse_moe_router: its decode steps (CUDA graphs) run each MoE
    block's router GEMM and routing as one kernel (kernels/moe_route.py's router_route, its arrival counter
    reset for every replay); greedy tokens equal and logprobs close to the router's GEMM and moe_route."""
    from tritonllm.kernels import moe_route

    spy = LaunchSpy.install(monkeypatch, moe_route, "router_route_kernel")
    _fused_matches_unfused("fuse_moe_router", spy.grids, True, "GptOssForCausalLM", max_model_len=512)


def test_bf16_batch1_decode_with_the_norm_in_the_moe_router_matches_unfused(monkeypatch):
    """gpt-oss (the fitted tiny one) in bf16 with fuse_norm_into_router: its decode steps (CUDA graphs) run the
    residual add and RMSNorm before each MoE block in the router's launch (kernels/moe_route.py's
    norm_router_route); greedy tokens equal and logprobs close to the norm kernel and then the router."""
    from tritonllm.kernels import moe_route

    launches, launch = [], moe_route._router_launch

    def spy(*args):
        if args[-1] is not None:  # the norm's operands: the folded kernel
            launches.append(args[0].shape[0])
        return launch(*args)

    monkeypatch.setattr(moe_route, "_router_launch", spy)
    _fused_matches_unfused("fuse_norm_into_router", launches, True, "GptOssForCausalLM", max_model_len=512)


def test_fp8_batch1_decode_with_the_norms_in_the_gemms_matches_unfused(monkeypatch):
    """Online FP8 at batch 1 with fuse_norm_into_gemm: qkv and gate_up normalize and quantize the residual
    stream in their skinny GEMMs (XN), o_proj and down_proj add into it in their epilogues; greedy tokens
    equal and logprobs close to the fused add + norm + quantization kernels."""
    calls = _spy_fused_launcher(monkeypatch, "xn_skinny_gemm_sm90")
    _fused_matches_unfused("fuse_norm_into_gemm", calls, True, max_model_len=512, quantization="fp8",
                           kernels={"linear": "triton_sm90"})  # fmt: skip


def test_fp8_batch1_decode_with_the_gated_mlp_in_two_gemms_matches_unfused(monkeypatch):
    """Online FP8 at batch 1 with fuse_gated_activation, fuse_down_input_quant and fuse_norm_into_gemm: a layer's
    MLP is gate_up's GEMM (normalizing the stream, writing h and its block amaxes) and down's (quantizing h,
    adding into the stream); greedy tokens equal and logprobs close to the kernels between the GEMMs. The tiny
    model's gate_up is too narrow for an unsplit plan, so both runs take one (PLAN_OVERRIDE)."""
    calls = _spy_fused_launcher(monkeypatch, "gated_amax_skinny_gemm_sm90", unsplit=True)
    _fused_matches_unfused("fuse_down_input_quant", calls, True, max_model_len=512, quantization="fp8",
                           kernels={"linear": "triton_sm90"}, fuse_gated_activation=True, fuse_norm_into_gemm=True)  # fmt: skip


def _spy_fused_launcher(monkeypatch, name: str, unsplit: bool = False) -> list:
    """The calls of gemm_skinny_fused_sm90's launcher `name` (skipped off sm90); unsplit: every skinny GEMM takes
    one unsplit plan (PLAN_OVERRIDE), as a fused epilogue on the tiny model's narrow gate_up needs."""
    from tritonllm.kernels import gemm_skinny_fused_sm90 as fz
    from tritonllm.kernels import gemm_skinny_sm90 as sk

    if not sk.available():
        pytest.skip("the skinny GEMM runs on sm90 GPUs only")
    calls = []
    launcher = getattr(fz, name)
    monkeypatch.setattr(fz, name, lambda *a, **kw: calls.append(1) or launcher(*a, **kw))
    if unsplit:
        monkeypatch.setattr(sk, "PLAN_OVERRIDE", sk.Plan(128, 1, 6))
    return calls


@pytest.mark.parametrize("untimed", [False, True], ids=["default", "short_and_experts"])
@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "GptOssForCausalLM"])
def test_batch1_decode_with_weight_prefetch_matches_without(architecture, untimed, monkeypatch):
    """prefetch_weights: decode steps (CUDA graphs, the side stream's forks and join captured) launch the L2
    prefetch kernel (every layer linked: MIN_BYTES 0 for the tiny models; untimed: also the short links' tails
    and the routed experts, whose kernel reads the ids in the graph); greedy tokens and logprobs as without
    (the prefetch changes no value)."""
    from tritonllm.kernels import l2_prefetch
    from tritonllm.layers import prefetch

    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)
    if untimed:
        monkeypatch.setattr(prefetch, "SHORT_BYTES", 4096)
        monkeypatch.setattr(prefetch, "EXPERTS", True)
    spy = LaunchSpy.install(monkeypatch, l2_prefetch, "l2_prefetch_kernel")
    _fused_matches_unfused("prefetch_weights", spy.grids, True, architecture, max_model_len=512)


def _fused_matches_unfused(flag: str, launches: list, launched_when_fused: bool,
                           architecture: str = "LlamaForCausalLM", **llm_args) -> None:  # fmt: skip
    """Batch-1 greedy decode of the fitted tiny model in bf16 with `flag` on, then off: `launches` (filled by a
    spied kernel) non-empty exactly when `flag` is launched_when_fused; greedy tokens equal, logprobs close."""
    path = str(fitted_tiny_model_path(architecture))
    prompts = [{"prompt_token_ids": list(range(100, 160))}]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0)
    runs = []
    for fused in (True, False):
        launches.clear()
        llm = LLM(model=path, dtype="bfloat16", max_num_seqs=4, **llm_args, **{flag: fused})
        out = llm.generate(prompts, params, use_tqdm=False)[0].outputs[0]
        runs.append((out.token_ids, [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]))
        del llm
        assert bool(launches) == (fused == launched_when_fused), (flag, fused, len(launches))
    (fused_ids, fused_lp), (ids, lp) = runs
    assert fused_ids == ids
    assert max(abs(a - b) for a, b in zip(fused_lp, lp)) < 0.05
