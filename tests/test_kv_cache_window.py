"""KV blocks behind a sliding window go back to the pool (KVCacheManager.release_out_of_window):
only with a window, only blocks wholly before first position - W, published ones staying cached,
never twice, and the invariant free + in use + cached == total throughout."""

from tritonllm import SamplingParams
from tritonllm.engine.kv_cache import KVCacheManager
from tritonllm.engine.request import Request

BS, WINDOW = 4, 8


def request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), seed=0, max_tokens=8, eos_token_ids=frozenset())


def computed(kv: KVCacheManager, r: Request, num_tokens: int) -> None:
    assert kv.allocate_slots(r.request_id, num_tokens, kv.find_cached_prefix(r)) is not None
    r.num_computed_tokens = num_tokens
    kv.cache_computed_blocks(r, num_tokens)


def test_without_a_window_nothing_is_released() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    computed(kv, request("a", list(range(40))), 40)
    kv.release_out_of_window("a", 40)
    assert kv.num_used_blocks == 10


def test_blocks_wholly_before_the_window_are_released_once() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=False, sliding_window=WINDOW)
    computed(kv, request("a", list(range(40))), 40)
    kv.release_out_of_window("a", 19)  # queries from 19 on see keys >= 12: blocks 0-1 (keys < 8) are unread
    assert kv.num_used_blocks == 8 and kv.num_free_blocks == 8
    kv.release_out_of_window("a", 20)  # keys < 12: block 2 too
    kv.release_out_of_window("a", 20)  # idempotent
    assert kv.num_used_blocks == 7
    kv.check_invariant()
    assert len(kv.block_ids("a")) == 10  # the table keeps its (stale) entries: positions still map
    assert kv.allocate_slots("a", 44) is not None and len(kv.block_ids("a")) == 11
    kv.free("a")  # the rest, not the released ones a second time
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == 16
    kv.check_invariant()


def test_released_published_blocks_stay_cached_for_prefix_hits() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=WINDOW)
    a = request("a", list(range(40)))
    computed(kv, a, 20)  # 5 blocks published
    assert kv.allocate_slots("a", 40) is not None  # 5 more, not yet computed nor published
    kv.release_out_of_window("a", 40)  # 8 blocks out of the window, only the 5 published go
    assert kv.num_used_blocks == 5 and kv.num_cached_free_blocks == 5
    kv.check_invariant()
    b = request("b", list(range(30)))
    assert len(kv.find_cached_prefix(b)) == 5  # a new request with the same prefix hits them
    computed(kv, b, 30)
    kv.check_invariant()
    kv.free("a")
    kv.free("b")
    assert kv.num_used_blocks == 0
    kv.check_invariant()


def test_a_shared_block_stays_in_use_while_another_request_holds_it() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=WINDOW)
    computed(kv, request("a", list(range(12))), 12)
    computed(kv, request("b", list(range(12)) + [99] * 20), 32)  # shares a's 3 blocks
    kv.release_out_of_window("b", 32)  # b no longer reads its blocks 0-5; a still holds 0-2
    assert kv.num_used_blocks == 3 + 2  # a's (shared) and b's last two
    kv.check_invariant()
