"""Checks the engine tests share (tests/ is on sys.path)."""

from __future__ import annotations

from tritonllm import LLM, SamplingParams


def assert_serves_on_with_every_block_free(llm: LLM) -> None:
    """After a refused request: the engine still serves, and every KV block is free again."""
    out = llm.generate([{"prompt_token_ids": [5, 6]}], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    kv = llm.llm_engine.kv_cache
    kv.check_invariant()
    assert kv.num_free_blocks == kv.num_blocks
