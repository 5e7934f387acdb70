"""Our model family against HF transformers on the same tiny checkpoints (float32, CPU).

One flat prefill of three prompts of different lengths through our paged KV cache must give, at
every position, the log-probabilities HF's eager model gives for each prompt on its own.
"""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch
import transformers

from tritonllm.kernels.registry import bind_kernels, select_kernels
from tritonllm.layers.attention import AttentionMetadata
from tritonllm.layers.rotary import build_cos_sin_cache, inverse_frequencies, rope_parameters
from tritonllm.models.loader import load_model
from tritonllm.models.tiny import TINY_ARCHITECTURES, TINY_MOE_ARCHITECTURES, tiny_model_path

BLOCK_SIZE = 16
PROMPT_LENS = (7, 19, 33)
_TRITON_OPS_MODULES = ("rmsnorm", "rotary", "activation", "kv_cache_write", "attention")
_TRITON_MISSING = [m for m in _TRITON_OPS_MODULES if importlib.util.find_spec(f"tritonllm.kernels.{m}") is None]


@pytest.fixture(
    params=[
        "torch_ref",
        pytest.param(
            "triton",
            marks=pytest.mark.skipif(bool(_TRITON_MISSING), reason=f"Triton kernels missing: {_TRITON_MISSING}"),
        ),
    ]
)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@functools.cache
def _hf_model(architecture: str) -> torch.nn.Module:
    path = tiny_model_path(architecture)
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _prefill_metadata(prompt_lens: tuple[int, ...]) -> tuple[AttentionMetadata, int]:
    """Each sequence gets consecutive physical blocks after the previous one's (block 0 left
    unused, so a wrong block id reads garbage). Returns (metadata, blocks needed)."""
    blocks_per_seq = [-(-n // BLOCK_SIZE) for n in prompt_lens]
    block_tables = torch.zeros(len(prompt_lens), max(blocks_per_seq), dtype=torch.int32)
    slots: list[int] = []
    next_block = 1
    for i, (n, num_blocks) in enumerate(zip(prompt_lens, blocks_per_seq, strict=True)):
        block_tables[i, :num_blocks] = torch.arange(next_block, next_block + num_blocks)
        slots += range(next_block * BLOCK_SIZE, next_block * BLOCK_SIZE + n)
        next_block += num_blocks
    starts = torch.tensor([0, *prompt_lens]).cumsum(0).to(torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=block_tables,
        seq_lens=torch.tensor(prompt_lens, dtype=torch.int32),
        query_start_loc=starts,
        max_query_len=max(prompt_lens),
        max_seq_len=max(prompt_lens),
    )
    return meta, next_block


@pytest.mark.parametrize("architecture", TINY_ARCHITECTURES + TINY_MOE_ARCHITECTURES)
def test_batched_prefill_log_probs_match_hf_at_every_position(architecture: str, backend: str) -> None:
    path = tiny_model_path(architecture)
    model, config = load_model(path, torch.float32, "cpu")
    bind_kernels(model, select_kernels(default="torch_ref" if backend == "torch_ref" else "auto"))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen) for n in PROMPT_LENS]
    meta, num_blocks = _prefill_metadata(PROMPT_LENS)
    cache_shape = (num_blocks, BLOCK_SIZE, model.num_kv_heads, model.head_dim)
    kv_caches = [
        (torch.randn(cache_shape, generator=gen), torch.randn(cache_shape, generator=gen))
        for _ in range(model.num_layers)
    ]
    input_ids = torch.cat(prompts)
    positions = torch.cat([torch.arange(n) for n in PROMPT_LENS])

    with torch.inference_mode():
        logits = model.compute_logits(model(input_ids, positions, kv_caches, meta))
        hf = _hf_model(architecture)
        expected = torch.cat([hf(p[None]).logits[0].float().log_softmax(-1) for p in prompts])

    assert logits.dtype == torch.float32
    assert logits.shape == (sum(PROMPT_LENS), config.vocab_size)
    torch.testing.assert_close(logits.log_softmax(-1), expected, atol=1e-3, rtol=0)


def test_llama3_rope_table_matches_hf_up_to_max_position() -> None:
    config = transformers.AutoConfig.from_pretrained(tiny_model_path("LlamaForCausalLM"), local_files_only=True)
    assert rope_parameters(config)["rope_type"] == "llama3"
    head_dim = config.head_dim
    cache = build_cos_sin_cache(config.max_position_embeddings, inverse_frequencies(head_dim, rope_parameters(config)))
    hf_rope = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    positions = torch.arange(config.max_position_embeddings)[None]
    cos, sin = hf_rope(torch.zeros(1, dtype=torch.float32), positions)
    torch.testing.assert_close(cache[:, : head_dim // 2], cos[0, :, : head_dim // 2], atol=1e-6, rtol=0)
    torch.testing.assert_close(cache[:, head_dim // 2 :], sin[0, :, : head_dim // 2], atol=1e-6, rtol=0)


@pytest.mark.parametrize("architecture", TINY_ARCHITECTURES)
def test_tiny_model_greedy_decoding_has_clear_winners(architecture: str) -> None:
    """Random weights must give peaked next-token distributions, not near-uniform ones whose
    greedy choice flips with rounding."""
    hf = _hf_model(architecture)
    prompt = torch.arange(3, 12)[None]
    with torch.inference_mode():
        out = hf.generate(prompt, max_new_tokens=24, do_sample=False, output_logits=True, return_dict_in_generate=True)
    logits = torch.cat(out.logits).float()
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3
    assert logits.softmax(-1).max(-1).values.mean() > 0.1
