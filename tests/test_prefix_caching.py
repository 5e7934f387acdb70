"""Prefix caching: block hashing, ref counts, LRU eviction, and outputs identical with it on and off."""

import random

import pytest

from tritonllm import LLM, SamplingParams
from tritonllm.engine.kv_cache import KVCacheManager, hash_block
from tritonllm.engine.request import Request

BS = 4


def request(rid: str, tokens: list[int], **params) -> Request:
    return Request(rid, tokens, SamplingParams(**params), seed=0, max_tokens=8, eos_token_ids=frozenset())


def admit(kv: KVCacheManager, r: Request) -> int:
    """Admit and fully compute a request's prompt; returns the cached tokens it hit."""
    hit = kv.find_cached_prefix(r)
    assert kv.allocate_slots(r.request_id, r.num_tokens, hit) is not None
    r.num_computed_tokens = r.num_tokens
    kv.cache_computed_blocks(r, r.num_tokens)
    kv.check_invariant()
    return len(hit) * BS


def test_block_hash_chains_parent_tokens_and_extra_keys():
    a = hash_block(None, [1, 2, 3, 4])
    assert a == hash_block(None, [1, 2, 3, 4])
    assert hash_block(a, [5, 6, 7, 8]) != hash_block(None, [5, 6, 7, 8])
    assert hash_block(None, [1, 2, 3, 4], ("lora-1",)) != a


def test_shared_prefix_hits_full_blocks_only():
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    assert admit(kv, request("a", list(range(10)))) == 0  # 2 full blocks + a partial one
    assert admit(kv, request("b", list(range(9)) + [99])) == 8  # diverges inside block 3: 2 blocks hit
    assert admit(kv, request("c", [0, 1, 2, 7, 4, 5, 6, 7])) == 0  # diverges inside block 1
    assert kv.block_ids("a")[:2] == kv.block_ids("b")[:2]
    assert kv.block_ids("a")[2] != kv.block_ids("b")[2]  # the partial last block is never shared


def test_fully_cached_prompt_still_computes_its_last_token():
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    admit(kv, request("a", list(range(8))))
    assert len(kv.find_cached_prefix(request("b", list(range(8))))) == 1  # 7 of 8 tokens may hit: 1 block


def test_ref_counts_keep_shared_blocks_until_the_last_user_frees():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    admit(kv, request("a", list(range(9))))
    admit(kv, request("b", list(range(9))))
    shared = kv.block_ids("a")[:2]
    kv.free("a")
    assert kv.num_used_blocks == 3 and all(b in kv.block_ids("b") for b in shared)
    kv.free("b")
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == 8 and kv.num_cached_free_blocks == 2
    kv.check_invariant()


def test_freed_cached_blocks_are_reused_then_evicted_lru():
    kv = KVCacheManager(num_blocks=6, block_size=BS)
    admit(kv, request("old", [1] * 8))
    kv.free("old")
    admit(kv, request("new", [2] * 8))
    kv.free("new")
    assert admit(kv, request("again", [2] * 8 + [3])) == 8  # finished requests' blocks still serve hits
    kv.free("again")
    # 6 blocks, all needed: every cached block is evicted, "old" first (least recently freed)
    assert admit(kv, request("big", list(range(100, 124)))) == 0
    assert kv.num_cached_free_blocks == 0
    kv.free("big")
    assert admit(kv, request("old2", [1] * 8 + [5])) == 0


def test_reset_prefix_cache_forgets_unused_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    admit(kv, request("a", list(range(9))))
    admit(kv, request("b", [7] * 9))
    kv.free("a")
    assert kv.reset_prefix_cache() is False  # b's blocks are in use and stay cached
    assert admit(kv, request("c", list(range(9)))) == 0
    assert admit(kv, request("d", [7] * 9)) == 8


def test_disabled_prefix_caching_never_hits():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    admit(kv, request("a", list(range(9))))
    assert admit(kv, request("b", list(range(9)))) == 0


# ---- through the engine, against caching off ----------------------------------------------

SYSTEM = list(range(100, 140))  # 40 tokens: 2 full blocks of 16 and a partial one


def conversations(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared_system = [SYSTEM + [rng.randrange(5, 600) for _ in range(rng.randint(1, 20))] for _ in range(4)]
    turns, history = [], list(SYSTEM[:20])
    for _ in range(3):  # multi-turn: each turn extends the last
        history = history + [rng.randrange(5, 600) for _ in range(rng.randint(5, 25))]
        turns.append(list(history))
    identical = [list(range(200, 237))] * 3
    diverge = [list(range(300, 340)) + [7], list(range(300, 340)) + [8], list(range(300, 341))[:-3] + [9, 9]]
    return shared_system + turns + identical + diverge


def run(llm: LLM, prompts: list[list[int]], waves: bool, check_every_step: bool = True) -> list[list[int]]:
    """Run prompts in two waves (the first of each group alone, then the rest) so that later
    requests find the earlier ones' blocks, checking the block invariant after every step."""
    engine = llm.llm_engine
    params = [
        SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=3 + i % 4, ignore_eos=True)
        for i in range(len(prompts))
    ]
    order = (
        [list(range(len(prompts)))]
        if not waves
        else [[0, 4, 7, 10], [i for i in range(len(prompts)) if i not in (0, 4, 7, 10)]]
    )
    results = {}
    for wave in order:
        for i in wave:
            engine.add_request(str(i), prompts[i], params[i])
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    results[int(out.request_id)] = out.outputs[0].token_ids
            if check_every_step:
                engine.kv_cache.check_invariant()
    return [results[i] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def uncached(tiny_llama):
    llm = LLM(model=tiny_llama, max_model_len=128, enable_prefix_caching=False)
    return run(llm, conversations(), waves=True, check_every_step=False)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"max_num_batched_tokens": 13},  # chunked prefill after cached blocks
        {"num_gpu_blocks_override": 9},  # preemption and eviction in a tiny cache
    ],
    ids=["plain", "chunked", "tiny-cache"],
)
def test_outputs_identical_with_prefix_caching_on_and_off(tiny_llama, uncached, kwargs):
    llm = LLM(model=tiny_llama, **{"max_model_len": 128, **kwargs})
    assert run(llm, conversations(), waves=True) == uncached
    metrics = {m.name: m.value for m in llm.get_metrics()}
    assert metrics["tritonllm:prefix_cache_hits"] > 0
    assert metrics["tritonllm:prefix_cache_queries"] >= metrics["tritonllm:prefix_cache_hits"]
    if "num_gpu_blocks_override" in kwargs:
        assert llm.llm_engine.scheduler.num_preemptions > 0


def test_hits_are_counted_in_tokens(tiny_llama):
    llm = LLM(model=tiny_llama, max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    first = SYSTEM + [1, 2, 3]
    llm.generate([{"prompt_token_ids": first}], params, use_tqdm=False)
    others = [{"prompt_token_ids": SYSTEM + [i, i + 1]} for i in range(5, 9)]
    llm.generate(others, params, use_tqdm=False)
    metrics = {m.name: m.value for m in llm.get_metrics()}
    assert metrics["tritonllm:prefix_cache_queries"] == len(first) + sum(len(o["prompt_token_ids"]) for o in others)
    assert metrics["tritonllm:prefix_cache_hits"] == 4 * 32  # two full 16-token blocks each
    assert llm.reset_prefix_cache()
    llm.generate(others[:1], params, use_tqdm=False)
    assert {m.name: m.value for m in llm.get_metrics()}["tritonllm:prefix_cache_hits"] == 4 * 32


def test_shared_prefix_workload_reports_hit_rate(tiny_llama):
    from tritonllm.workloads import run_workload

    llm = LLM(model=tiny_llama, max_model_len=128)
    workload = {
        "kind": "shared_prefix",
        "num_requests": 4,
        "prefix_len": 40,
        "suffix_len": 5,
        "output_len": 2,
        "temperature": 0.0,
        "seed": 0,
    }
    result = run_workload(llm, workload)
    assert result["output_tokens"] == 8 and 0.0 < result["prefix_cache_hit_rate"] < 1.0
