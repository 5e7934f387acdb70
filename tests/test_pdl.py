"""Programmatic dependent launch (kernels/launch.py): every PDL-aware kernel waits for the previous
kernel before touching memory, the switch is off where the hardware lacks it, and on the GPU the
same steps give the same results with and without it."""

import ast
import importlib
import inspect
import pkgutil
import textwrap

import pytest
import torch

import tritonllm.kernels
from tritonllm import LLM, SamplingParams, platform
from tritonllm.config import EngineConfig
from tritonllm.kernels import launch
from tritonllm.models.tiny import fitted_tiny_model_path


def _jit_kernels():
    """Every @triton.jit function of tritonllm.kernels, by qualified name."""
    found = {}
    for info in pkgutil.iter_modules(tritonllm.kernels.__path__):
        module = importlib.import_module(f"tritonllm.kernels.{info.name}")
        for name, obj in vars(module).items():
            if hasattr(obj, "arg_names") and getattr(getattr(obj, "fn", None), "__module__", None) == module.__name__:
                found[f"{info.name}.{name}"] = obj
    return found


def _first_statement(fn) -> ast.stmt:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    body = tree.body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):  # the docstring
        body = body[1:]
    return body[0]


def _is_pdl_wait(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and getattr(stmt.value.func, "id", None) in ("pdl_wait", "gluon_pdl_wait")
        and [getattr(a, "id", None) for a in stmt.value.args] == ["PDL"]
    )


# the kernels of a decode step (dense and MoE models, quantized or not): all must take part, or
# the launch before and after them serialises again
DECODE_KERNELS = {
    "rmsnorm._rms_norm_kernel", "rotary._rotary_kernel", "kv_cache_write._write_kv_cache_kernel",
    "attention_split.split_kv_decode_kernel", "attention_split.merge_splits_kernel",
    "attention_unified.unified_attention_kernel", "activation._silu_and_mul_kernel",
    "activation._silu_and_mul_quant_kernel", "gemm_gemv.gemv_kernel", "gemv_w4.w4_gemv_kernel", "gemm.gemm_kernel",
    "gemm.split_k_reduce_kernel", "quant._quant_token_kernel", "quant._quant_group_kernel",
    "moe_gemv.moe_gemv_kernel", "moe.fused_moe_kernel", "moe_route.moe_route_kernel", "sampling._sample_kernel",
    "sampling._sample_split_kernel", "step_inputs.decode_inputs_kernel", "step_inputs.sampling_params_kernel",
    "sampling._sampling_mask_kernel", "sampling._log_softmax_kernel", "gemv_w4_sm90.w4_gemv_sm90_kernel",
    "gemm_w4_sm90.w4_gemm_sm90_kernel", "gemm_skinny_sm90.skinny_gemm_sm90_kernel",
    "gemm_block_sm90.block_fp8_gemm_sm90_kernel",
}  # fmt: skip
# kernels that read operands no kernel writes (weights) before the wait, so that the weight stream starts
# while the previous kernel drains: the memory parameters they may touch before pdl_wait(PDL)
READ_BEFORE_WAIT = {
    "gemm_skinny_sm90.skinny_gemm_sm90_kernel": {"w_desc", "g_desc", "g_ptr"},  # the weight, XN's norm weight
    "gemm_block_sm90.block_fp8_gemm_sm90_kernel": {"b_desc"},
    "gemm_stream_sm90.stream_gemm_sm90_kernel": {"w_desc"},
    "gemm_w4_tma_sm90.w4_tma_gemm_sm90_kernel": {"w_desc", "s_desc"},  # the weight's words and scales
    "gemv_w4_sm90.w4_gemv_sm90_kernel": {"w_ptr", "s_ptr", "z_ptr"},  # the first K tile's words, scales, zeros
    "gemv_w4_tma_sm90.w4_gemv_tma_sm90_kernel": {"w_desc", "s_desc", "z_desc"},  # the ring's first steps, as those
    # EARLY (w2): the experts' words and scales, and the expert ids, which the router wrote two launches back
    "moe_gemv.moe_gemv_kernel": {"b_ptr", "b_scale_ptr", "topk_ids_ptr"},
    # EARLY (w2): the expert id (the router's, two launches back) and its first K tile's words and scales
    "moe_gemv_sm90.moe_w4_gemv_sm90_kernel": {"w_ptr", "s_ptr", "topk_ids_ptr"},
    "moe_route.router_route_kernel": {"w_ptr", "bias_ptr"},  # the router's weight and bias
    # EARLY (w2): the expert ids (the router's, two launches back) and the ring's first weight stages
    "moe_skinny_sm90.moe_skinny_sm90_kernel": {"w_desc", "ids_ptr"},
    "l2_prefetch.l2_prefetch_kernel": {"w_ptr"},  # the weight it streams into L2
    "rmsnorm._rms_norm_kernel": {"weight_ptr"},  # the norm's weight
    # the rotation's positions and cos / sin, and the tokens' cache slots: written at the step's start (the step
    # inputs), at least three launches back, by when the previous kernel's own wait has passed
    "rotary._rotary_kernel": {"positions_ptr", "cache_ptr", "slot_mapping_ptr"},
    # the step inputs, as RoPE's, the first tile's keys that earlier steps wrote (all but the newest), and (ROPE)
    # the query's position, its cos / sin and its key's cache slot
    "attention_split.split_kv_decode_kernel": {
        "query_start_loc_ptr",
        "seq_lens_ptr",
        "block_tables_ptr",
        "k_cache_ptr",
        "v_cache_ptr",
        "pos_ptr",
        "cos_sin_ptr",
        "slot_ptr",
    },
}


def _memory_names_before_wait(fn) -> set[str]:
    """The pointer and descriptor parameters (*_ptr, *_desc) named by the statements before pdl_wait(PDL)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    memory = {a for a in fn.arg_names if a.endswith(("_ptr", "_desc"))}
    named: set[str] = set()
    for stmt in tree.body[0].body:
        if _is_pdl_wait(stmt):
            return named
        named |= {node.id for node in ast.walk(stmt) if isinstance(node, ast.Name) and node.id in memory}
    raise AssertionError(f"{fn.fn.__name__}: no top-level pdl_wait(PDL)")


def test_every_pdl_aware_kernel_waits_before_its_first_memory_access():
    kernels = _jit_kernels()
    aware = {name for name, fn in kernels.items() if "PDL" in fn.arg_names} - {
        "launch.pdl_wait",
        "launch.gluon_pdl_wait",
    }
    assert DECODE_KERNELS <= aware, sorted(DECODE_KERNELS - aware)
    for name in aware:
        fn = kernels[name]
        assert fn.arg_names[-1] == "PDL", f"{name}: PDL must be the last parameter (Launcher's fast path)"
        if name in READ_BEFORE_WAIT:
            early = _memory_names_before_wait(fn)
            assert early <= READ_BEFORE_WAIT[name], f"{name}: touches {sorted(early)} before pdl_wait(PDL)"
        else:
            assert _is_pdl_wait(_first_statement(fn)), f"{name}: the first statement must be pdl_wait(PDL)"


def test_the_static_check_catches_a_kernel_that_touches_memory_first():
    class Fn:  # a jit function's stand-in: fn.fn the Python function, fn.arg_names its parameters
        arg_names = ["w_desc", "x_desc", "PDL"]

        @staticmethod
        def fn(w_desc, x_desc, PDL):
            load(w_desc)  # noqa: F821
            load(x_desc)  # noqa: F821
            pdl_wait(PDL)  # noqa: F821

    assert _memory_names_before_wait(Fn) == {"w_desc", "x_desc"}  # x_desc too: READ_BEFORE_WAIT refuses it
    src = "def k(x_ptr, PDL):\n    x = tl.load(x_ptr)\n    pdl_wait(PDL)\n"
    assert not _is_pdl_wait(ast.parse(src).body[0].body[0])
    src = 'def k(x_ptr, PDL):\n    """doc"""\n    pdl_wait(PDL)\n'
    body = ast.parse(src).body[0].body[1:]
    assert _is_pdl_wait(body[0])


@pytest.mark.skipif(platform.is_gpu(), reason="the CPU's answer")
def test_pdl_stays_off_without_a_hopper_gpu():
    assert launch.set_pdl(True) is False
    assert launch.pdl_launch() == {"PDL": False} and not launch.pdl_on()


def test_the_engine_config_switch():
    assert EngineConfig().pdl is True
    assert EngineConfig.from_dict({"pdl": False}).pdl is False


@pytest.mark.gpu
def test_a_pdl_kernel_compiles_the_wait_and_launches_with_the_attribute():
    from tritonllm.kernels.rmsnorm import _RMS_NORM, rms_norm

    if not launch.pdl_supported():
        pytest.skip("PDL needs NVIDIA compute capability 9.0+")
    before = launch.pdl_on()
    try:
        launch.set_pdl(True)
        x = torch.randn(3, 200, device="cuda", dtype=torch.bfloat16)
        rms_norm(x, torch.ones(200, device="cuda", dtype=torch.bfloat16), 1e-6)
        torch.cuda.synchronize()
        compiled = [c for c, _ in _RMS_NORM._compiled.values() if c.metadata.launch_pdl]
        assert compiled and "griddepcontrol.wait" in compiled[0].asm["ptx"]
    finally:
        launch.set_pdl(before)


@pytest.mark.gpu
@pytest.mark.parametrize("quantization, num_prompts", [(None, 5), (None, 1), ("int4", 1), ("mxfp4", 1), ("fp8", 1)])
def test_graph_replayed_steps_give_the_same_tokens_with_and_without_pdl(quantization, num_prompts):
    """Batch 1 too: there the kernels that read before their wait (READ_BEFORE_WAIT: the norm's weight, RoPE's and
    split-KV attention's step inputs and older keys, the W4 GEMV's and the skinny GEMM's weights) all run."""
    if not launch.pdl_supported():
        pytest.skip("PDL needs NVIDIA compute capability 9.0+")
    prompts = [{"prompt_token_ids": list(range(3 + i, 60 + 9 * i))} for i in range(num_prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1)
    runs = {}
    for pdl in (False, True):
        llm = LLM(model=str(fitted_tiny_model_path("LlamaForCausalLM")), dtype="bfloat16", max_model_len=256, pdl=pdl,
                  quantization=quantization)  # fmt: skip
        assert launch.pdl_on() is pdl
        runs[pdl] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        del llm
    for off, on in zip(runs[False], runs[True], strict=True):
        assert off.token_ids == on.token_ids
        assert off.cumulative_logprob == pytest.approx(on.cumulative_logprob, abs=1e-3)
