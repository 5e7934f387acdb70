"""Paged-attention kernel benchmark: decode, prefill and chunked prefill next to torch SDPA.

Every case is bf16 (or an FP8 KV cache), 32 query heads / 8 KV heads, head_dim 128, block size 16,
random block tables. Each is checked against the float32 torch reference, then timed with
triton.testing.do_bench (median, L2 flushed between runs) alongside torch SDPA on the same K/V
stored contiguously (measured in the same process: the ratio is what to compare across machines).
Decode cases report TB/s (K + V + q + out bytes), the others TFLOP/s (4 * head_dim * heads per
visible query-key pair). --sweep also times every split count and a few split-KV tilings for the
decode cases, to tune attention.ATTENTION_CONFIGS. Writes one JSON and prints a table:

    PYTHONPATH=. python scripts/bench_attention.py experiments/attention/h200.json [--sweep]
    PYTHONPATH=. python scripts/bench_attention.py /tmp/smoke.json --smoke    # CPU: tiny shapes

tests/benchmarks/test_bench_attention.py runs the same cases under pytest-benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

# first: on CPU it switches on Triton's interpreter, which must precede importing triton (and
# torch.nn.attention, which imports it)
from tritonllm import platform

# isort: split
import torch
import torch.nn.functional as F
import triton
from torch.nn.attention.bias import causal_lower_right

from tritonllm.kernels import attention_fp8_decode_sm90, reference, registry
from tritonllm.kernels.attention import (
    AttentionPlan,
    AttentionTiles,
    choose_num_splits,
    choose_tiles,
    gpu_family,
    paged_attention,
    paged_attention_with_tiles,
    plan_attention,
    plan_attention_fp8_decode_sm90,
)

GPU_TOL = dict(atol=1.5e-2, rtol=2e-2)  # bf16 against the float32 reference, as tests/kernels


@dataclass(frozen=True)
class Case:
    name: str
    num_seqs: int
    q_len: int  # new tokens per sequence
    ctx_len: int  # tokens already cached before them
    kv_dtype: str = "bf16"  # or "fp8": platform.fp8_e4m3_dtype() with per-tensor scales
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16

    @property
    def seq_len(self) -> int:
        return self.ctx_len + self.q_len

    @property
    def is_decode(self) -> bool:
        return self.q_len == 1


def _decode(num_seqs: int, context: int, kv_dtype: str = "bf16") -> Case:
    prefix = "decode_fp8" if kv_dtype == "fp8" else "decode"
    return Case(f"{prefix}_{num_seqs}x{context}", num_seqs, 1, context - 1, kv_dtype)


CASES = [_decode(n, c) for n in (1, 32, 128) for c in (1024, 8192)] + [
    Case("prefill_4096", 1, 4096, 0),
    Case("chunk_512_after_3584", 1, 512, 3584),
    _decode(128, 8192, "fp8"),
]
_TINY = dict(num_heads=4, num_kv_heads=2, head_dim=64)
SMOKE_CASES = [
    Case("decode_3x70", 3, 1, 69, **_TINY),
    Case("prefill_40", 1, 40, 0, **_TINY),
    Case("chunk_9_after_30", 1, 9, 30, **_TINY),
    Case("decode_fp8_3x70", 3, 1, 69, "fp8", **_TINY),
]


@dataclass
class Inputs:
    case: Case
    q: torch.Tensor  # [num_seqs * q_len, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, blocks_per_seq] int32, a random permutation
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    sdpa: Callable[[], torch.Tensor]  # the same attention by torch SDPA on contiguous K/V
    plan: AttentionPlan | None = None  # the step's set-up, built once as the engine does per step
    kernels: registry.Kernels | None = None  # the engine's attention choice here, made once
    k_new: torch.Tensor | None = None  # the new tokens' K/V, contiguous [num_tokens, kv_heads, head_dim]
    v_new: torch.Tensor | None = None

    @property
    def scale(self) -> float:
        return self.case.head_dim**-0.5

    def args(self) -> tuple:
        c = self.case
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens, self.query_start_loc,
                c.q_len, c.seq_len, self.scale)  # fmt: skip

    def run(self) -> torch.Tensor:
        """One layer's attention, by the implementation an engine picks here (registry "auto": on sm90
        with an FP8 cache the Gluon decode kernel), once the step's plan exists."""
        c = self.case
        if self.kernels is None:
            context = registry.KernelContext(platform.PLATFORM, self.q.dtype, self.k_cache.dtype, c.head_dim)
            self.kernels = registry.select_kernels({}, context)
        kernels = self.kernels
        if self.plan is None:
            self.plan = kernels.plan_attention(*self.args()[3:8], c.num_heads, c.num_kv_heads, c.head_dim,
                                               c.block_size, kv_dtype=self.k_cache.dtype)  # fmt: skip
        return kernels.paged_attention(*self.args(), k_scale=self.k_scale, v_scale=self.v_scale, plan=self.plan,
                                       k_new=self.k_new, v_new=self.v_new)  # fmt: skip


def build_inputs(case: Case, device: str | torch.device, dtype: torch.dtype, seed: int = 0) -> Inputs:
    """Random K/V made contiguous per sequence, scattered into a paged cache through a random block
    table; SDPA reads the contiguous copy (bf16 even for the FP8 case: the baseline a user has)."""
    torch.manual_seed(seed)
    c = case
    group = c.num_heads // c.num_kv_heads
    blocks_per_seq = triton.cdiv(c.seq_len, c.block_size)
    padded_len = blocks_per_seq * c.block_size
    k = torch.randn(c.num_seqs, padded_len, c.num_kv_heads, c.head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(c.num_seqs * c.q_len, c.num_heads, c.head_dim, device=device, dtype=dtype)
    block_tables = torch.randperm(c.num_seqs * blocks_per_seq, device=device).view(c.num_seqs, -1)
    cache_shape = (c.num_seqs * blocks_per_seq, c.block_size, c.num_kv_heads, c.head_dim)
    k_cache, v_cache = (
        torch.empty(cache_shape, device=device, dtype=dtype),
        torch.empty(cache_shape, device=device, dtype=dtype),
    )
    k_cache[block_tables.flatten()] = k.view(-1, *cache_shape[1:])
    v_cache[block_tables.flatten()] = v.view(-1, *cache_shape[1:])
    k_scale = v_scale = None
    if c.kv_dtype == "fp8":
        fp8 = platform.fp8_e4m3_dtype()
        fp8_max = torch.finfo(fp8).max
        k_scale = (k_cache.float().abs().amax() / fp8_max).reshape(1)
        v_scale = (v_cache.float().abs().amax() / fp8_max).reshape(1)
        k_cache = (k_cache.float() / k_scale).clamp(-fp8_max, fp8_max).to(fp8)  # reference.write_kv_cache's rule
        v_cache = (v_cache.float() / v_scale).clamp(-fp8_max, fp8_max).to(fp8)

    scale = c.head_dim**-0.5
    if c.is_decode:
        # the group's query heads as 'group' query rows of one KV head: plain MHA reading K/V once
        q_sdpa = q.view(c.num_seqs, c.num_kv_heads, group, c.head_dim)
        k_sdpa = k[:, : c.seq_len].transpose(1, 2).contiguous()
        v_sdpa = v[:, : c.seq_len].transpose(1, 2).contiguous()

        def sdpa() -> torch.Tensor:
            return F.scaled_dot_product_attention(q_sdpa, k_sdpa, v_sdpa, scale=scale)
    else:
        if c.num_seqs != 1:
            raise ValueError(f"{c.name}: SDPA comparison of prefill cases takes one sequence")
        q_sdpa = q.view(1, c.q_len, c.num_heads, c.head_dim).transpose(1, 2).contiguous()
        k_sdpa = k[:, : c.seq_len].repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
        v_sdpa = v[:, : c.seq_len].repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
        mask = None if c.ctx_len == 0 else causal_lower_right(c.q_len, c.seq_len)

        def sdpa() -> torch.Tensor:
            return F.scaled_dot_product_attention(
                q_sdpa, k_sdpa, v_sdpa, attn_mask=mask, is_causal=mask is None, scale=scale
            )

    seq_lens = torch.full((c.num_seqs,), c.seq_len, dtype=torch.int32, device=device)
    query_start_loc = torch.arange(0, c.num_seqs + 1, dtype=torch.int32, device=device) * c.q_len
    # the new tokens' K/V as the engine has them: rows of the step's projections, sequence after sequence
    k_new = k[:, c.ctx_len : c.seq_len].reshape(-1, c.num_kv_heads, c.head_dim)
    v_new = v[:, c.ctx_len : c.seq_len].reshape(-1, c.num_kv_heads, c.head_dim)
    return Inputs(case, q, k_cache, v_cache, block_tables.to(torch.int32), seq_lens, query_start_loc, k_scale,
                  v_scale, sdpa, k_new=k_new, v_new=v_new)  # fmt: skip


def reference_output(inputs: Inputs) -> torch.Tensor:
    """The float32 torch reference (FP8 caches are read as stored, times their scales)."""
    q, k_cache, v_cache, *rest = inputs.args()
    if k_cache.dtype in (torch.bfloat16, torch.float16):
        k_cache, v_cache = k_cache.float(), v_cache.float()
    return reference.paged_attention(q.float(), k_cache, v_cache, *rest, k_scale=inputs.k_scale, v_scale=inputs.v_scale)


def sdpa_as_tokens(case: Case, out: torch.Tensor) -> torch.Tensor:
    """SDPA's output in the kernel's [num_tokens, num_heads, head_dim] layout."""
    if case.is_decode:  # [num_seqs, num_kv_heads, group, head_dim]: head = kv_head * group + g
        return out.reshape(case.num_seqs, case.num_heads, case.head_dim)
    return out.transpose(1, 2).reshape(case.q_len, case.num_heads, case.head_dim)


def max_error(out: torch.Tensor, expected: torch.Tensor) -> tuple[float, bool]:
    """(largest absolute error, whether out is within GPU_TOL of expected)."""
    out = out.float()
    return (out - expected).abs().max().item(), torch.allclose(out, expected, **GPU_TOL)


def work(case: Case, kv_bytes_per_elem: int) -> tuple[int, int]:
    """(bytes that must move: K + V of every sequence, q and out; FLOPs over visible query-key pairs)."""
    c = case
    kv_bytes = c.num_seqs * c.seq_len * c.num_kv_heads * c.head_dim * 2 * kv_bytes_per_elem
    qo_bytes = 2 * c.num_seqs * c.q_len * c.num_heads * c.head_dim * 2
    pairs = c.num_seqs * (c.q_len * c.ctx_len + c.q_len * (c.q_len + 1) // 2)
    return kv_bytes + qo_bytes, 4 * c.head_dim * c.num_heads * pairs


def median_ms(fn: Callable[[], object]) -> float:
    """do_bench's median on a GPU; on CPU (--smoke, interpreter) a wall-clock median of 3 runs."""
    if platform.is_gpu():
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def graph_us(fn: Callable[[], object], calls: int = 20) -> float:
    """GPU time of one call without host launch cost: `calls` calls captured in a CUDA graph, the
    graph replayed and timed with events (L2 warm, unlike do_bench); NaN where graphs fail."""
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()  # no JIT compile during capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        return triton.testing.do_bench(graph.replay, warmup=5, rep=50, return_mode="median") * 1e3 / calls
    except Exception as error:  # noqa: BLE001 - a diagnostic, never fatal
        print(f"  cuda graph timing failed: {error}", flush=True)
        return float("nan")


def host_us(fn: Callable[[], object], calls: int = 200) -> float:
    """Host time of one call (Python and launch), GPU running behind: the launch overhead."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e6 / calls


def synchronized_clock() -> float:
    """A pytest-benchmark timer that waits for the GPU, so a round times the kernels it launched."""
    if platform.is_gpu():
        torch.cuda.synchronize()
    return time.perf_counter()


def measure(inputs: Inputs) -> dict:
    """Median times of the kernel and of SDPA, the achieved rate of both and their ratio."""
    c = inputs.case
    group = c.num_heads // c.num_kv_heads
    num_splits = (
        choose_num_splits(c.num_seqs, c.num_kv_heads, c.seq_len, platform.num_multiprocessors()) if c.is_decode else 1
    )
    tiles = choose_tiles(c.q_len, group, c.head_dim, c.num_seqs, c.num_kv_heads, num_splits, c.kv_dtype == "fp8")
    us = median_ms(inputs.run) * 1e3
    sdpa_us = median_ms(inputs.sdpa) * 1e3
    kv_bytes_per_elem = 1 if c.kv_dtype == "fp8" else 2
    num_bytes, flops = work(c, kv_bytes_per_elem)
    sdpa_bytes, _ = work(c, 2)
    result = dict(case=c.name, us=us, sdpa_us=sdpa_us, speedup_vs_sdpa=sdpa_us / us, num_splits=num_splits,
                  tiles=asdict(tiles))  # fmt: skip
    if platform.is_gpu():  # where the time goes: GPU work alone, and the host's launch cost
        result.update(graph_us=graph_us(inputs.run), host_us=host_us(inputs.run), sdpa_graph_us=graph_us(inputs.sdpa),
                      sdpa_host_us=host_us(inputs.sdpa))  # fmt: skip
    if c.is_decode:
        result.update(tb_s=num_bytes / us / 1e6, sdpa_tb_s=sdpa_bytes / sdpa_us / 1e6)
    else:
        result.update(tflop_s=flops / us / 1e6, sdpa_tflop_s=flops / sdpa_us / 1e6)
    return result


SWEEP_SPLITS = (1, 2, 4, 8, 16, 32, 64)
SWEEP_SPLIT_TILES = ((32, 3), (64, 2), (64, 3), (128, 2), (128, 3))  # (tile_n, num_stages), 4 warps
# many-query cases: (block_m, tile_n, num_warps, num_stages); the new K/V through tensor descriptors
# (TMA) for the best tilings of the gathered path
SWEEP_DESC_TILES = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 3)]
SWEEP_QUERY_TILES = [
    (m, n, w, st)
    for m in (64, 128)
    for n in (32, 64, 128)
    for w in (4, 8)
    for st in (2, 3, 4)
    if not (m == 128 and w == 4 and n == 128)  # noqa: E131 - too many registers
]
# (tile_n, num_stages, num_warps); float16 dots (bf16 dots were 30% slower on the first sweep), with
# the query-key dot in float16 or in FP8 (fp8_qk). 8 warps and 256-key tiles were 60% slower.
SWEEP_FP8_TILES = ((64, 3, 4), (64, 4, 4), (128, 3, 4), (128, 4, 4), (64, 4, 2), (128, 3, 2))
# the sm90 Gluon FP8 decode kernel (attention_fp8_decode_sm90.py): (tile_n, ring slots, V widened in place)
SWEEP_FP8_GLUON = [(64, 2, False), (64, 2, True), (64, 3, True), (64, 4, True), (128, 2, True), (128, 2, False),
                   (128, 3, True)]  # fmt: skip


def _timed_fp8_gluon(inputs: Inputs, expected: torch.Tensor, tiles: attention_fp8_decode_sm90.Fp8DecodeTiles) -> dict:
    """The sm90 FP8 decode kernel with other tiles: this GPU family's tile entry, swapped for the run."""
    family = gpu_family()
    table = attention_fp8_decode_sm90.TILES
    previous = table.get(family)
    table[family] = tiles
    try:
        plan = plan_attention_fp8_decode_sm90(*inputs.args()[3:8], inputs.case.num_heads, inputs.case.num_kv_heads,
                              inputs.case.head_dim, inputs.case.block_size, kv_dtype=inputs.k_cache.dtype)  # fmt: skip
        if plan.fp8_tiles is None:
            return dict(fp8_gluon=asdict(tiles), failed="the Gluon kernel does not serve this case or machine")

        def run() -> torch.Tensor:
            return paged_attention(*inputs.args(), k_scale=inputs.k_scale, v_scale=inputs.v_scale, plan=plan)

        error, ok = max_error(run(), expected)
        return dict(fp8_gluon=asdict(tiles), us=median_ms(run) * 1e3, max_abs_error=error, correct=ok)
    finally:
        if previous is None:
            del table[family]
        else:
            table[family] = previous


def _timed_variant(inputs: Inputs, expected: torch.Tensor, tiles: AttentionTiles, **kw) -> dict:
    if kw.get("new_kv_desc"):
        kw = dict(kw, k_new=inputs.k_new, v_new=inputs.v_new)

    def run() -> torch.Tensor:
        return paged_attention_with_tiles(*inputs.args(), tiles, k_scale=inputs.k_scale, v_scale=inputs.v_scale, **kw)

    try:
        error, ok = max_error(run(), expected)
        if kw.get("fp8_qk"):  # q itself is rounded to FP8: the FP8 cache's accuracy budget (tests/kernels)
            ok = error <= 0.25
    except Exception as failure:  # noqa: BLE001 - a variant that does not compile (shared memory) is skipped
        shown = {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}
        return dict(tiles=asdict(tiles), **shown, failed=str(failure).splitlines()[0][:200])
    shown = {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}
    return dict(tiles=asdict(tiles), **shown, us=median_ms(run) * 1e3, max_abs_error=error, correct=ok)


def sweep(inputs: Inputs, expected: torch.Tensor) -> list[dict]:
    """Times of a case over tilings (and, for decode, split counts; FP8: float16 or bf16 dots),
    each output checked."""
    c = inputs.case
    group = c.num_heads // c.num_kv_heads
    rows = []
    if not c.is_decode:
        for m, n, w, st in SWEEP_QUERY_TILES:
            rows.append(_timed_variant(inputs, expected, AttentionTiles(m, n, w, st)))
        for m, n, w, st in SWEEP_DESC_TILES:
            rows.append(_timed_variant(inputs, expected, AttentionTiles(m, n, w, st), new_kv_desc=True))
        return rows
    if c.kv_dtype == "fp8":
        block_m = choose_tiles(1, group, c.head_dim, c.num_seqs, c.num_kv_heads).block_m
        for fp8_qk in (False, True):
            for n, st, w in SWEEP_FP8_TILES:
                tiles = AttentionTiles(block_m, n, w, st)
                rows.append(_timed_variant(inputs, expected, tiles, fp8_dot_f16=True, fp8_qk=fp8_qk))
        for n, st, inplace in SWEEP_FP8_GLUON:
            rows.append(_timed_fp8_gluon(inputs, expected, attention_fp8_decode_sm90.Fp8DecodeTiles(n, st, inplace)))
        return rows
    for num_splits in SWEEP_SPLITS:
        if num_splits > 1 and c.seq_len < num_splits * 16:
            continue
        default = choose_tiles(1, group, c.head_dim, c.num_seqs, c.num_kv_heads, num_splits)
        variants = [default] if num_splits == 1 else [
            AttentionTiles(default.block_m, tile_n, 4, stages) for tile_n, stages in SWEEP_SPLIT_TILES
        ]  # fmt: skip
        for tiles in variants:
            rows.append(_timed_variant(inputs, expected, tiles, num_splits=num_splits))
    return rows


def mixed_batch(device: str | torch.device, dtype: torch.dtype, num_decodes: int = 64, decode_ctx: int = 1024,
                chunks: tuple[tuple[int, int], ...] = ((1024, 0), (512, 1536))) -> dict:  # fmt: skip
    """Decodes and prefill chunks in one launch against the same work as two launches (the decodes,
    then the chunks), each with its own step plan, as an engine without a unified kernel would."""
    torch.manual_seed(1)
    h, kvh, d, bs = 32, 8, 128, 16
    q_lens = [1] * num_decodes + [q for q, _ in chunks]
    seq_lens_list = [decode_ctx] * num_decodes + [q + ctx for q, ctx in chunks]
    blocks = [triton.cdiv(n, bs) for n in seq_lens_list]
    k_cache = torch.randn(sum(blocks), bs, kvh, d, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(sum(blocks), device=device).to(torch.int32)
    tables = torch.zeros(len(q_lens), max(blocks), dtype=torch.int32, device=device)
    start = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[start : start + n]
        start += n
    q = torch.randn(sum(q_lens), h, d, device=device, dtype=dtype)
    scale = d**-0.5

    # the step's new K/V as the engine has them (contiguous projections; already in the cache)
    positions = [(i, p) for i, (ql, n) in enumerate(zip(q_lens, seq_lens_list)) for p in range(n - ql, n)]
    seq_ids = torch.tensor([i for i, _ in positions], device=device)
    pos = torch.tensor([p for _, p in positions], device=device)
    slots = (tables[seq_ids, pos // bs].long(), pos % bs)
    k_new, v_new = k_cache[slots], v_cache[slots]

    def batch(lo: int, hi: int) -> tuple:
        lens = torch.tensor(seq_lens_list[lo:hi], dtype=torch.int32, device=device)
        qsl = torch.tensor([0, *torch.tensor(q_lens[lo:hi]).cumsum(0).tolist()], dtype=torch.int32, device=device)
        rows = slice(sum(q_lens[:lo]), sum(q_lens[:hi]))
        meta = (tables[lo:hi], lens, qsl, max(q_lens[lo:hi]), max(seq_lens_list[lo:hi]))
        return q[rows], meta, plan_attention(*meta, h, kvh, d, bs), dict(k_new=k_new[rows], v_new=v_new[rows])

    q_all, meta_all, plan_all, new_all = batch(0, len(q_lens))
    q_dec, meta_dec, plan_dec, new_dec = batch(0, num_decodes)
    q_chk, meta_chk, plan_chk, new_chk = batch(num_decodes, len(q_lens))

    def one() -> torch.Tensor:
        return paged_attention(q_all, k_cache, v_cache, *meta_all, scale, plan=plan_all, **new_all)

    def two() -> tuple[torch.Tensor, torch.Tensor]:
        return (paged_attention(q_dec, k_cache, v_cache, *meta_dec, scale, plan=plan_dec, **new_dec),
                paged_attention(q_chk, k_cache, v_cache, *meta_chk, scale, plan=plan_chk, **new_chk))  # fmt: skip

    expected = reference.paged_attention(q_all.float(), k_cache.float(), v_cache.float(), *meta_all, scale)
    error, ok = max_error(one(), expected)
    error_two, ok_two = max_error(torch.cat(two()), expected)
    one_us, two_us = median_ms(one) * 1e3, median_ms(two) * 1e3
    return dict(case=f"mixed_{num_decodes}x{decode_ctx}+chunks{list(chunks)}", one_launch_us=one_us,
                two_launches_us=two_us, one_vs_two=two_us / one_us, correct=ok and ok_two,
                max_abs_error=max(error, error_two))  # fmt: skip


def environment() -> dict:
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=torch.cuda.get_device_name() if platform.is_gpu() else "cpu (triton interpreter)",
        gpu_family=gpu_family(),
        num_multiprocessors=platform.num_multiprocessors(),
        torch=torch.__version__,
        triton=triton.__version__,
        command=" ".join([Path(sys.executable).name, *sys.argv]),
    )


def _table(results: list[dict]) -> str:
    lines = [
        f"{'case':<24} {'us':>9} {'rate':>13} {'SDPA us':>9} {'SDPA rate':>13} {'x SDPA':>7} {'splits':>6} ok"
        "  graph/host us  SDPA graph/host us"
    ]
    for r in results:
        unit, key = ("TB/s", "tb_s") if "tb_s" in r else ("TFLOP/s", "tflop_s")
        lines.append(
            f"{r['case']:<24} {r['us']:>9.1f} {r[key]:>8.2f} {unit:<4} {r['sdpa_us']:>9.1f} "
            f"{r['sdpa_' + key]:>8.2f} {unit:<4} {r['speedup_vs_sdpa']:>7.2f} {r['num_splits']:>6} "
            f"{'yes' if r['correct'] else 'NO '}"
            f" {r.get('graph_us', float('nan')):6.1f}/{r.get('host_us', float('nan')):<6.1f}"
            f" {r.get('sdpa_graph_us', float('nan')):6.1f}/{r.get('sdpa_host_us', float('nan')):<6.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="JSON file to write")
    parser.add_argument("--sweep", action="store_true", help="also time split counts and split tilings (decode)")
    parser.add_argument("--smoke", action="store_true", help="tiny float32 shapes (CPU, interpreter)")
    parser.add_argument("--cases", nargs="*", help="only these case names")
    args = parser.parse_args()
    if not platform.is_gpu() and not args.smoke:
        parser.error("no GPU: use --smoke to run tiny shapes under the interpreter")

    cases = SMOKE_CASES if args.smoke else CASES
    cases = [c for c in cases if not args.cases or c.name in args.cases]
    dtype = torch.bfloat16 if platform.is_gpu() else torch.float32
    report = dict(environment(), results=[], sweeps={})
    for case in cases:
        inputs = build_inputs(case, platform.DEVICE, dtype)
        expected = reference_output(inputs)
        error, ok = max_error(inputs.run(), expected)
        # the baseline must compute the same thing (FP8: up to the cache's quantization error)
        sdpa_error, _ = max_error(sdpa_as_tokens(case, inputs.sdpa()), expected)
        result = dict(measure(inputs), max_abs_error=error, correct=ok, sdpa_max_abs_error=sdpa_error)
        report["results"].append(result)
        print(
            f"{case.name}: {result['us']:.1f} us, x{result['speedup_vs_sdpa']:.2f} vs SDPA, error {error:.2e}",
            flush=True,
        )
        if args.sweep and (not case.is_decode or case.kv_dtype == "fp8" or case.num_seqs < 128):
            rows = report["sweeps"][case.name] = sweep(inputs, expected)
            best = min((r for r in rows if r.get("correct")), key=lambda r: r["us"])
            print(f"  sweep best: {best['us']:.1f} us: {best}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))  # after every case: a timeout keeps what ran
        del inputs, expected
        if platform.is_gpu():
            torch.cuda.empty_cache()
    if not args.smoke and not args.cases or args.cases and "mixed" in args.cases:
        mixed = report["mixed"] = mixed_batch(platform.DEVICE, dtype)
        print(f"{mixed['case']}: one launch {mixed['one_launch_us']:.1f} us, two launches "
              f"{mixed['two_launches_us']:.1f} us (x{mixed['one_vs_two']:.2f}), correct {mixed['correct']}")  # fmt: skip
    elif args.smoke:
        mixed = report["mixed"] = mixed_batch(platform.DEVICE, dtype, 3, 40, ((9, 0), (5, 20)))
        print(f"{mixed['case']}: correct {mixed['correct']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\n{report['gpu']} ({report['gpu_family']}), torch {report['torch']}, triton {report['triton']}")
    print(_table(report["results"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
