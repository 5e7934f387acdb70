"""The kernel registry: selection per op from config, errors that name what is available, and
engines that own their choice (two in one process, each layer bound to its engine's kernels)."""

from __future__ import annotations

import pytest
import torch

from tritonllm import LLM, SamplingParams
from tritonllm.kernels import reference, registry
from tritonllm.kernels.registry import KernelContext, select_kernels


def test_auto_takes_the_highest_priority_supported_implementation() -> None:
    kernels = select_kernels(context=KernelContext(platform="cpu", dtype=torch.float32))
    assert kernels.choice["attention"] == "triton_unified"
    assert kernels.choice["rms_norm"] == "triton"
    # float64 is no Triton kernel's dtype: auto falls back to the references
    assert select_kernels(context=KernelContext(dtype=torch.float64)).choice["rms_norm"] == "torch_ref"
    assert select_kernels(default="torch_ref").rms_norm is reference.rms_norm


@pytest.mark.parametrize(
    "choices, context, message",
    [
        ({"attention": "flash9"}, None, "available: ['auto', 'triton_fp8_decode_sm90', 'triton_unified', 'torch_ref']"),
        ({"atention": "auto"}, None, "unknown kernel op(s) ['atention']"),
        ({"rms_norm": "triton"}, KernelContext(dtype=torch.float64), "usable here: ['auto', 'torch_ref']"),
        ({"rms_norm": "triton"}, KernelContext(platform="tpu"), "platform tpu is not among"),
    ],
)
def test_an_impossible_choice_names_what_is_available(choices, context, message) -> None:
    with pytest.raises(ValueError) as error:
        select_kernels(choices, context)
    assert message in str(error.value)


def test_a_registration_must_name_a_known_op_and_entry_point() -> None:
    with pytest.raises(ValueError, match="unknown op"):
        registry.register("gemm9", "x")
    with pytest.raises(ValueError, match="entry point"):
        registry.register("rms_norm", "x")(lambda x: x)


def _layers_kernels(llm: LLM) -> set[int]:
    return {id(m.kernels) for m in llm.llm_engine.model.modules() if hasattr(m, "kernels")}


def test_two_engines_in_one_process_keep_their_own_kernels(tiny_llama, monkeypatch) -> None:
    calls = {"n": 0}

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return reference.silu_and_mul(x)

    entries = {"silu_and_mul": counted, "silu_and_mul_quant": reference.silu_and_mul_quant}
    spy = registry.Implementation("activation", "spy", registry.Supports(), -1, entries)
    monkeypatch.setitem(registry._REGISTRY["activation"], "spy", spy)
    kw = dict(model=tiny_llama, max_model_len=64, max_num_seqs=4)
    ref = LLM(**kw, kernels={"attention": "torch_ref", "rms_norm": "torch_ref", "activation": "spy"})
    auto = LLM(**kw)
    assert ref.llm_engine.kernels.choice["attention"] == "torch_ref"
    assert auto.llm_engine.kernels.choice["attention"] == "triton_unified"
    assert _layers_kernels(ref) == {id(ref.llm_engine.kernels)}
    assert _layers_kernels(auto) == {id(auto.llm_engine.kernels)}
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompt = [{"prompt_token_ids": [5, 17, 230, 8, 99, 41]}]
    got_auto = auto.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert calls["n"] == 0  # the second engine did not switch the first one's layers, nor the reverse
    got_ref = ref.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert calls["n"] > 0
    assert got_ref == got_auto


def test_the_sm90_fp8_decode_kernel_is_an_implementation_auto_takes_only_where_it_runs() -> None:
    fp8 = torch.float8_e4m3fn
    cpu = KernelContext("cpu", torch.bfloat16, fp8, 128)
    assert select_kernels({}, cpu).choice["attention"] == "triton_unified"  # no sm90 GPU here
    with pytest.raises(ValueError, match="needs an NVIDIA sm90 GPU"):
        select_kernels({"attention": "triton_fp8_decode_sm90"}, KernelContext("cuda", torch.bfloat16, fp8, 128))
    # a bf16 cache is not its case, whatever the GPU
    bf16_cache = KernelContext("cuda", torch.bfloat16, torch.bfloat16, 128)
    with pytest.raises(ValueError, match="KV cache dtype"):
        select_kernels({"attention": "triton_fp8_decode_sm90"}, bf16_cache)


def test_references_that_sync_with_the_host_are_declared_uncapturable() -> None:
    ref = select_kernels(default="torch_ref")
    assert ref.uncapturable(registry.OPS) == ["attention", "kv_write", "rope_kv_write", "sampling", "moe"]
    assert select_kernels({"attention": "torch_ref"}).uncapturable(["attention", "rms_norm"]) == ["attention"]
    assert select_kernels().uncapturable(registry.OPS) == []


def test_auto_takes_cublas_for_unquantized_models_only() -> None:
    """The torch (cuBLAS) linear serves FP8 row/column formats when chosen, but `auto` takes the
    Triton GEMMs for any quantized model (faster on the GPU) and cuBLAS for unquantized ones."""
    fp8 = KernelContext(linear_formats=frozenset({"fp8:channel:token"}))
    assert select_kernels({"linear": "auto"}, KernelContext()).choice["linear"] == "torch"
    assert select_kernels({"linear": "auto"}, fp8).choice["linear"] == "triton"
    assert select_kernels({"linear": "torch"}, fp8).choice["linear"] == "torch"


def test_auto_takes_hybrid_sm90_for_unquantized_models_on_hopper(monkeypatch) -> None:
    """Where the skinny Gluon GEMM runs (an sm90 GPU), `auto` takes cuBLAS with it at decode sizes (hybrid_sm90)
    for unquantized bf16 / fp16 models; quantized models still take the Triton GEMMs, float32 and other platforms
    cuBLAS; `kernels.linear=torch` stays the plain cuBLAS baseline."""
    from tritonllm.kernels import gemm_skinny_sm90

    monkeypatch.setattr(gemm_skinny_sm90, "available", lambda: True)
    hopper = KernelContext(platform="cuda", dtype=torch.bfloat16)
    assert select_kernels({"linear": "auto"}, hopper).choice["linear"] == "hybrid_sm90"
    assert select_kernels({"linear": "torch"}, hopper).choice["linear"] == "torch"
    fp8 = KernelContext(platform="cuda", dtype=torch.bfloat16, linear_formats=frozenset({"fp8:channel:token"}))
    assert select_kernels({"linear": "auto"}, fp8).choice["linear"] != "hybrid_sm90"
    for other in (
        KernelContext(platform="rocm", dtype=torch.bfloat16),
        KernelContext(platform="cuda", dtype=torch.float32),
    ):
        assert select_kernels({"linear": "auto"}, other).choice["linear"] == "torch"
    monkeypatch.setattr(gemm_skinny_sm90, "available", lambda: False)  # another NVIDIA GPU
    assert select_kernels({"linear": "auto"}, hopper).choice["linear"] == "torch"


def test_moe_selection_follows_the_expert_formats_not_the_linear_layers() -> None:
    """The fused MoE serves float, FP8 block and MXFP4 experts whatever the model's linear layers are
    (a W8A16 model's bf16 experts still take it); experts in another format take the reference."""
    w8a16_linears = KernelContext("cpu", torch.float32, linear_formats=frozenset({"fp8:channel:none"}))
    assert select_kernels({}, w8a16_linears).choice["moe"] == "triton"
    mxfp4 = KernelContext("cpu", torch.float32, features={"moe": frozenset({"mxfp4:mx:none"})})
    assert select_kernels({}, mxfp4).choice["moe"] == "triton"
    other = KernelContext("cpu", torch.float32, features={"moe": frozenset({"fp8:block:none"})})  # W8A16 experts
    assert select_kernels({}, other).choice["moe"] == "torch_ref"


def test_an_optional_entry_left_out_answers_none_and_the_layer_runs_the_unfused_ops(monkeypatch) -> None:
    """linear's gated_linear (registry.OPTIONAL_ENTRIES): an implementation without it is still complete, its
    entry answers None, and SiluAndMul.gated runs the GEMM and then the activation; where a method answers
    with a fused result, that is the layer's output (and fuse_gemm False never asks)."""
    from tritonllm.layers.activation import SiluAndMul
    from tritonllm.layers.linear import Linear

    registry.register("linear", "gemm_only", entry="linear")(reference.linear)
    registry.register("linear", "gemm_only", entry="quantized_linear")(reference.quantized_linear)
    monkeypatch.setitem(registry._REGISTRY["linear"], "gemm_only", registry._REGISTRY["linear"].pop("gemm_only"))
    kernels = select_kernels({"linear": "gemm_only"})
    assert kernels.gated_linear(torch.ones(1, 4), torch.ones(8, 4), None, None) is None
    gate_up, act = Linear(4, 8, False, torch.float32), SiluAndMul()
    gate_up.weight.data = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    gate_up.kernels = act.kernels = kernels
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    gate, up = (x @ gate_up.weight.T).chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    act.fuse_gemm = True
    torch.testing.assert_close(act.gated(gate_up, x), want)
    monkeypatch.setattr(type(gate_up.method), "apply_gated", lambda self, layer, x, quant: torch.zeros(3, 4))
    assert not act.gated(gate_up, x).any()  # the method's fused result is taken as it is
    act.fuse_gemm = False
    torch.testing.assert_close(act.gated(gate_up, x), want)
