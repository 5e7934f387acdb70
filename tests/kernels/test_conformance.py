"""Every registered implementation of every op against the torch reference (kernels/registry.py).

A new implementation needs no test of its own to be checked here: each op's case below runs
every implementation the registry lists, at ragged, non-power-of-two shapes, on the platform's
device (CPU: Triton's interpreter, float32). Tolerances are relative to the size of the
reference output. Kernel-specific edge cases stay in each kernel's own test file.
"""

from __future__ import annotations

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)

from tritonllm import platform
from tritonllm.kernels import reference, registry
from tritonllm.kernels.quant_formats import OutputQuant
from tritonllm.layers.rotary import build_cos_sin_cache

DEVICE = platform.DEVICE
# on a GPU every case is also a GPU test, so `-m gpu` runs the suite there (float32 and bfloat16)
DTYPES = [torch.float32] if not platform.is_gpu() else [torch.float32, torch.bfloat16]


def _cases(op: str) -> list:
    """(implementation, dtype) for every registered implementation of `op` and every dtype it serves
    on this machine (an sm90-only kernel is not a CPU case: the engine's selection refuses it there)."""
    marks = [pytest.mark.gpu] if platform.is_gpu() else []
    return [
        pytest.param(impl, dtype, marks=marks, id=f"{impl.name}-{str(dtype).removeprefix('torch.')}")
        for impl in registry.implementations(op)
        for dtype in DTYPES
        if impl.supports.refusal(registry.KernelContext(platform.PLATFORM, dtype, dtype)) is None
    ]


def _tol(dtype: torch.dtype) -> float:
    return 2e-5 if dtype == torch.float32 else 2e-2


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


def test_every_op_has_a_reference_and_a_config_key() -> None:
    from tritonllm.config import KernelConfig

    ops_in_config = {name for name in KernelConfig.__dataclass_fields__} - {"backend"}
    assert ops_in_config == set(registry.OPS)
    for op in registry.OPS:
        assert "torch_ref" in [impl.name for impl in registry.implementations(op)], op


@pytest.mark.parametrize("impl, dtype", _cases("rms_norm"))
def test_rms_norm(impl, dtype) -> None:
    x, residual = _randn(37, 200, dtype=dtype, seed=1), _randn(37, 200, dtype=dtype, seed=2)
    weight = _randn(200, dtype=dtype, seed=3)
    assert_close_to_scale(impl.entries["rms_norm"](x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6), _tol(dtype))
    out, res = impl.entries["fused_add_rms_norm"](x.clone(), residual.clone(), weight, 1e-6)
    ref_out, ref_res = reference.fused_add_rms_norm(x, residual, weight, 1e-6)
    assert_close_to_scale(out, ref_out, _tol(dtype))
    assert_close_to_scale(res, ref_res, _tol(dtype))


QUANT_DTYPES = [torch.float8_e4m3fnuz if platform.PLATFORM == "rocm" else torch.float8_e4m3fn, torch.int8]


def _same_quantized(got, expected, dtype: torch.dtype) -> None:
    """A QuantizedActivation against the reference's: scales equal to float32 rounding, values equal
    but for the rare element on a rounding boundary (the kernels divide as the GPU does)."""
    assert got.data.dtype == expected.data.dtype and got.data.shape == expected.data.shape and got.dtype == dtype
    torch.testing.assert_close(got.scale, expected.scale, rtol=1e-5, atol=0)
    assert (got.data.float() != expected.data.float()).float().mean() < 0.01


@pytest.mark.parametrize("quant_dtype", QUANT_DTYPES, ids=["fp8", "int8"])
@pytest.mark.parametrize("impl, dtype", _cases("rms_norm"))
def test_rms_norm_quant(impl, dtype, quant_dtype) -> None:
    x, residual = _randn(37, 200, dtype=dtype, seed=31), _randn(37, 200, dtype=dtype, seed=32)
    weight = _randn(200, dtype=dtype, seed=33)
    for res in (None, residual):
        for static in (None, torch.tensor([0.01], device=DEVICE)):
            got, got_res = impl.entries["rms_norm_quant"](x, res, weight, 1e-6, quant_dtype, static)
            ref, ref_res = reference.rms_norm_quant(x, res, weight, 1e-6, quant_dtype, static)
            _same_quantized(got, ref, dtype)
            if res is not None:
                assert_close_to_scale(got_res, ref_res, _tol(dtype))


@pytest.mark.parametrize("quant_dtype", QUANT_DTYPES, ids=["fp8", "int8"])
@pytest.mark.parametrize("impl, dtype", _cases("activation"))
def test_silu_and_mul_quant(impl, dtype, quant_dtype) -> None:
    x = 3 * _randn(29, 2 * 75, dtype=dtype, seed=34)
    for static in (None, torch.tensor([0.02], device=DEVICE)):
        got = impl.entries["silu_and_mul_quant"](x, quant_dtype, static)
        _same_quantized(got, reference.silu_and_mul_quant(x, quant_dtype, static), dtype)


FP8 = QUANT_DTYPES[0]


@pytest.mark.parametrize("hidden", [200, 384], ids=["ragged", "three-groups"])
@pytest.mark.parametrize("impl, dtype", _cases("rms_norm"))
def test_rms_norm_quant_per_group(impl, dtype, hidden) -> None:
    """Block-FP8's 1 x 128 activation groups quantized in the norm's kernel: one scale per group of a
    row, column-major as quantize_per_group lays them out (a partial last group at hidden 200)."""
    x, residual = _randn(37, hidden, dtype=dtype, seed=35), _randn(37, hidden, dtype=dtype, seed=36)
    x[5, 130:140] *= 50  # one group of one row much larger: its own scale, the row's others unchanged
    weight = _randn(hidden, dtype=dtype, seed=37)
    for res in (None, residual):
        got, got_res = impl.entries["rms_norm_quant"](x, res, weight, 1e-6, FP8, None, group=128)
        ref, ref_res = reference.rms_norm_quant(x, res, weight, 1e-6, FP8, None, group=128)
        assert got.scale.shape == (37, -(-hidden // 128))
        assert impl.name == "torch_ref" or got.scale.stride() == (1, 37)  # the kernels: column-major
        _same_quantized(got, ref, dtype)
        if res is not None:
            assert_close_to_scale(got_res, ref_res, _tol(dtype))
    assert got.scale[5, 1] > 10 * got.scale[5, 0]


@pytest.mark.parametrize("rows, d", [(29, 300), (3, 2500)], ids=["ragged", "many-programs"])
@pytest.mark.parametrize("impl, dtype", _cases("activation"))
def test_silu_and_mul_quant_per_group(impl, dtype, rows, d) -> None:
    """Per 1 x 128 group (block-FP8's, or a decode down projection's input_quant): at d = 2500 the Triton kernel
    spreads a row over three programs of 1024 columns (activation.GROUP_COLUMNS), each storing its groups' scales
    (one group of a later program made much larger: its own scale, its row's others unchanged)."""
    x = 3 * _randn(rows, 2 * d, dtype=dtype, seed=38)
    x[rows - 1, 2100:2110] *= 30 if d > 2110 else 1
    got = impl.entries["silu_and_mul_quant"](x, FP8, None, group=128)
    expected = reference.silu_and_mul_quant(x, FP8, None, group=128)
    assert got.scale.shape == (rows, -(-d // 128))
    _same_quantized(got, expected, dtype)


@pytest.mark.parametrize("impl, dtype", _cases("rotary"))
def test_rotary(impl, dtype) -> None:
    head_dim, num_tokens = 64, 23
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    cache = build_cos_sin_cache(300, inv_freq).to(DEVICE)
    positions = torch.randint(0, 300, (num_tokens,), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    q, k = _randn(num_tokens, 5 * head_dim, dtype=dtype, seed=5), _randn(num_tokens, 3 * head_dim, dtype=dtype, seed=6)
    got = impl.entries["rotary_embedding"](positions, q.clone(), k.clone(), cache, head_dim, True)
    expected = reference.rotary_embedding(positions, q, k, cache, head_dim, True)
    for a, b in zip(got, expected, strict=True):
        assert_close_to_scale(a, b, _tol(dtype))


@pytest.mark.parametrize("impl, dtype", _cases("activation"))
def test_activation(impl, dtype) -> None:
    x = _randn(29, 2 * 75, dtype=dtype, seed=7)
    assert_close_to_scale(impl.entries["silu_and_mul"](x), reference.silu_and_mul(x), _tol(dtype))


@pytest.mark.parametrize("impl, dtype", _cases("linear"))
def test_linear(impl, dtype) -> None:
    x, w, b = _randn(19, 72, dtype=dtype, seed=8), _randn(45, 72, dtype=dtype, seed=9), _randn(45, dtype=dtype, seed=10)
    assert_close_to_scale(impl.entries["linear"](x, w, b), reference.linear(x, w, b), 4 * _tol(dtype))
    assert_close_to_scale(impl.entries["linear"](x, w, None), reference.linear(x, w, None), 4 * _tol(dtype))


def _quantized_cases() -> list:
    """(implementation, scheme) for every quantized format each linear implementation serves here."""
    from tritonllm.kernels.quant_formats import INT4, QuantScheme

    fp8 = torch.float8_e4m3fnuz if platform.PLATFORM == "rocm" else torch.float8_e4m3fn
    schemes = [QuantScheme(fp8, "channel", act) for act in ("token", "tensor", "none")]
    schemes += [QuantScheme(fp8, "block", act) for act in ("group", "none")]
    schemes += [QuantScheme(torch.int8, "channel", act) for act in ("token", "tensor", "none")]
    schemes += [QuantScheme(fp8, "mx", "mx"), QuantScheme(INT4, "group", "none", group_size=128)]
    marks = [pytest.mark.gpu] if platform.is_gpu() else []
    cases = []
    for impl in registry.implementations("linear"):
        for scheme in schemes:
            context = registry.KernelContext(
                platform.PLATFORM, platform.DEFAULT_DTYPE, None, None, frozenset({scheme.format_name})
            )
            if impl.supports.refusal(context) is None:
                cases.append(pytest.param(impl, scheme, marks=marks, id=f"{impl.name}-{scheme.format_name}"))
    return cases


@pytest.mark.parametrize("impl, scheme", _quantized_cases())
def test_quantized_linear(impl, scheme) -> None:
    from tritonllm.quantization.quantize import quantize_weight

    dtype = platform.DEFAULT_DTYPE
    x = _randn(2, 11, 256, dtype=dtype, seed=21)  # leading dims are kept
    weight = quantize_weight(_randn(70, 256, dtype=torch.float32, seed=22), scheme)
    weight.input_scale = (x.float().abs().amax() / 300).reshape(1) if scheme.act == "tensor" else None
    bias = _randn(70, dtype=dtype, seed=23)
    got = impl.entries["quantized_linear"](x, weight, bias)
    assert got.shape == (2, 11, 70) and got.dtype == dtype
    if scheme.act in ("token", "tensor"):  # activations quantized by the op before (fused RMSNorm / SiLU-mul)
        pre = reference.quantize_rows(x, scheme.weight_dtype, weight.input_scale)
        assert_close_to_scale(
            impl.entries["quantized_linear"](pre, weight, bias),
            reference.quantized_linear(pre, weight, bias).view(22, 70),
            1e-5 if dtype == torch.float32 else 2e-2,
        )
    # activations quantized by the kernel may round a boundary value the other way: a few levels of slack
    assert_close_to_scale(got, reference.quantized_linear(x, weight, bias), 1e-2 if dtype == torch.float32 else 3e-2)


def _paged_batch(dtype: torch.dtype) -> dict:
    """Three sequences (a prefill chunk after a cached prefix, a fresh prompt, a decode) over a
    paged cache of 16-token blocks, their blocks scattered."""
    num_kv_heads, num_heads, head_dim, block_size = 2, 6, 64, 16
    q_lens, ctx_lens = [13, 21, 1], [35, 0, 50]
    seq_lens = [q + c for q, c in zip(q_lens, ctx_lens)]
    blocks = [-(-n // block_size) for n in seq_lens]
    order = torch.randperm(sum(blocks) + 2, generator=torch.Generator().manual_seed(11))
    table = torch.zeros(3, max(blocks), dtype=torch.int32)
    first = 0
    for i, nb in enumerate(blocks):
        table[i, :nb] = order[first : first + nb]
        first += nb
    cache_shape = (sum(blocks) + 2, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = _randn(*cache_shape, dtype=dtype, seed=12), _randn(*cache_shape, dtype=dtype, seed=13)
    num_tokens = sum(q_lens)
    slots = torch.cat([
        table[i, (c + torch.arange(q)) // block_size].long() * block_size + (c + torch.arange(q)) % block_size
        for i, (q, c) in enumerate(zip(q_lens, ctx_lens))
    ])  # fmt: skip
    return dict(
        q=_randn(num_tokens, num_heads, head_dim, dtype=dtype, seed=14),
        k=_randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, seed=15),
        v=_randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, seed=16),
        k_cache=k_cache, v_cache=v_cache, slots=slots.to(DEVICE), block_tables=table.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        query_start_loc=torch.tensor([0, 13, 34, 35], dtype=torch.int32, device=DEVICE),
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), shape=(num_heads, num_kv_heads, head_dim, block_size),
    )  # fmt: skip


@pytest.mark.parametrize("impl, dtype", _cases("kv_write"))
def test_kv_write(impl, dtype) -> None:
    b = _paged_batch(dtype)
    slots = b["slots"].clone()
    slots[::4] = -1  # skipped tokens
    got_k, got_v = b["k_cache"].clone(), b["v_cache"].clone()
    impl.entries["write_kv_cache"](b["k"], b["v"], got_k, got_v, slots)
    ref_k, ref_v = b["k_cache"].clone(), b["v_cache"].clone()
    reference.write_kv_cache(b["k"], b["v"], ref_k, ref_v, slots)
    assert torch.equal(got_k, ref_k) and torch.equal(got_v, ref_v)


@pytest.mark.parametrize("impl, dtype", _cases("rope_kv_write"))
def test_rope_kv_write(impl, dtype) -> None:
    """q, k, v as slices of one fused qkv output (strided rows); the rotated q and k returned, the
    rotated k and v in the cache, skipped slots untouched."""
    b = _paged_batch(dtype)
    num_heads, num_kv_heads, head_dim, _ = b["shape"]
    num_tokens = b["q"].shape[0]
    qkv = torch.cat([b["q"], b["k"], b["v"]], dim=1).reshape(num_tokens, -1)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 48, 2, dtype=torch.float32) / 48))  # partial: 48 of 64 dims
    table = build_cos_sin_cache(300, inv_freq).to(DEVICE)
    positions = torch.randint(0, 300, (num_tokens,), generator=torch.Generator().manual_seed(18)).to(DEVICE)
    slots = b["slots"].clone()
    slots[::4] = -1  # skipped tokens
    got_k, got_v = b["k_cache"].clone(), b["v_cache"].clone()
    got = impl.entries["rotary_write_kv_cache"](positions, q, k, v, table, head_dim, True, got_k, got_v, slots)
    ref_k, ref_v = b["k_cache"].clone(), b["v_cache"].clone()
    expected = reference.rotary_write_kv_cache(positions, q, k, v, table, head_dim, True, ref_k, ref_v, slots)
    for a, e in zip(got, expected, strict=True):
        assert_close_to_scale(a, e, _tol(dtype))
    assert_close_to_scale(got_k, ref_k, _tol(dtype))
    assert torch.equal(got_v, ref_v)  # copied, not computed
    skipped = b["slots"][::4]  # their slots keep the rows they held
    assert torch.equal(got_k.flatten(0, 1)[skipped], b["k_cache"].flatten(0, 1)[skipped])
    # Qwen3's per-head RMSNorm of q and k before RoPE, in the same call
    norm = (1 + 0.2 * _randn(head_dim, dtype=dtype, seed=19), 1 + 0.2 * _randn(head_dim, dtype=dtype, seed=20), 1e-6)
    got = impl.entries["rotary_write_kv_cache"](
        positions, q, k, v, table, head_dim, True, got_k, got_v, slots, qk_norm=norm
    )
    expected = reference.rotary_write_kv_cache(
        positions, q, k, v, table, head_dim, True, ref_k, ref_v, slots, qk_norm=norm
    )
    for a, e in zip((*got, got_k), (*expected, ref_k), strict=True):
        assert_close_to_scale(a, e, _tol(dtype))


@pytest.mark.parametrize("impl, dtype", _cases("attention"))
def test_attention(impl, dtype) -> None:
    b = _paged_batch(dtype)
    reference.write_kv_cache(b["k"], b["v"], b["k_cache"], b["v_cache"], b["slots"])
    meta = (b["block_tables"], b["seq_lens"], b["query_start_loc"], b["max_query_len"], b["max_seq_len"])
    plan = impl.entries["plan_attention"](*meta, *b["shape"], kv_dtype=b["k_cache"].dtype)
    args = (b["q"], b["k_cache"], b["v_cache"], *meta, 0.125)
    got = impl.entries["paged_attention"](*args, plan=plan, k_new=b["k"], v_new=b["v"])
    assert_close_to_scale(got, reference.paged_attention(*args), 5 * _tol(dtype))


@pytest.mark.parametrize("impl, dtype", _cases("attention"))
@pytest.mark.parametrize("group", [0, 128], ids=["per_token", "per_group"])
def test_attention_quantized_output(impl, dtype, group) -> None:
    """`quantize`: the output quantized for a W8A8 o_proj (per token, or per 1 x 128 group), as the
    reference quantizes its own output: scales to the attention's rounding, values to e4m3's step."""
    b = _paged_batch(dtype)
    reference.write_kv_cache(b["k"], b["v"], b["k_cache"], b["v_cache"], b["slots"])
    meta = (b["block_tables"], b["seq_lens"], b["query_start_loc"], b["max_query_len"], b["max_seq_len"])
    plan = impl.entries["plan_attention"](*meta, *b["shape"], kv_dtype=b["k_cache"].dtype)
    args = (b["q"], b["k_cache"], b["v_cache"], *meta, 0.125)
    fp8 = QUANT_DTYPES[0]
    quant = OutputQuant(fp8, None, group)
    got = impl.entries["paged_attention"](*args, plan=plan, k_new=b["k"], v_new=b["v"], quantize=quant)
    expected = reference.paged_attention(*args, quantize=quant)
    assert got.data.dtype == fp8 and got.data.shape == (35, 6 * 64) and got.dtype == dtype
    assert got.scale.shape == expected.scale.shape
    torch.testing.assert_close(got.scale, expected.scale, rtol=5 * _tol(dtype), atol=0)
    dequantized = got.data.float() * (got.scale.repeat_interleave(group, 1) if group else got.scale)
    reference_out = reference.paged_attention(*args).reshape(35, -1).float()
    assert_close_to_scale(dequantized, reference_out, 1 / 16 + 5 * _tol(dtype))  # e4m3: 3 mantissa bits


@pytest.mark.parametrize("impl, dtype", _cases("sampling"))
def test_sampling(impl, dtype) -> None:
    num_rows, vocab = 12, 1500
    logits = 3 * _randn(num_rows, vocab, dtype=dtype, seed=17)
    assert_close_to_scale(impl.entries["log_softmax"](logits), reference.log_softmax(logits), 10 * _tol(dtype))
    gen = torch.Generator().manual_seed(18)
    params = {
        "temperature": torch.where(torch.arange(num_rows) % 3 == 0, 0.0, 0.8).to(DEVICE),
        "top_k": torch.tensor([0, 20, 5, 1] * 3, dtype=torch.int32, device=DEVICE),
        "top_p": (0.5 + 0.5 * torch.rand(num_rows, generator=gen)).to(DEVICE),
        "min_p": torch.zeros(num_rows, device=DEVICE),
    }
    seeds = torch.arange(num_rows, dtype=torch.int64, device=DEVICE) * 7919
    tokens = impl.entries["sample"](logits, **params, seeds=seeds)
    greedy = params["temperature"] <= 0
    assert torch.equal(tokens[greedy], logits[greedy].float().argmax(-1))
    keep = reference.sampling_mask(logits, **params)
    assert keep[torch.arange(num_rows, device=DEVICE), tokens].all()


def _penalty_case(num_rows: int, vocab: int, dtype: torch.dtype, prompt: bool) -> tuple[torch.Tensor, tuple]:
    """Logits and apply_penalties' arguments for 5 of num_rows rows: sparse counts (some tokens
    generated several times), a sparse prompt mask, frequency / presence of both signs, repetition
    above and below 1 (one row off)."""
    gen = torch.Generator().manual_seed(50)
    logits = 3 * _randn(num_rows, vocab, dtype=dtype, seed=51)
    rows = torch.tensor([9, 0, 4, 10, 2], dtype=torch.int64)
    counts = torch.randint(0, 4, (5, vocab), generator=gen, dtype=torch.int32)
    counts *= torch.rand(5, vocab, generator=gen) < 0.05
    mask = torch.rand(5, vocab, generator=gen) < 0.05 if prompt else None
    frequency = torch.tensor([0.5, -0.3, 0.0, 1.7, 0.25])
    presence = torch.tensor([0.0, 1.0, -0.5, 0.2, 2.0])
    repetition = torch.tensor([1.3, 0.8, 1.0, 2.0, 1.1])
    args = (rows, counts, mask, frequency, presence, repetition)
    return logits, tuple(a.to(DEVICE) if a is not None else None for a in args)


@pytest.mark.parametrize("impl, dtype", _cases("sampling"))
@pytest.mark.parametrize("num_rows, vocab, prompt", [(11, 1500, True), (13, 4099, False)])
def test_apply_penalties(impl, dtype, num_rows, vocab, prompt) -> None:
    """In place, on the given rows only, as the reference; a count off by one at one token is caught."""
    logits, args = _penalty_case(num_rows, vocab, dtype, prompt)
    got, expected = logits.clone(), logits.clone()
    impl.entries["apply_penalties"](got, *args)
    reference.apply_penalties(expected, *args)
    untouched = torch.ones(num_rows, dtype=torch.bool, device=DEVICE)
    untouched[args[0]] = False
    assert torch.equal(got[untouched], logits[untouched])
    assert_close_to_scale(got, expected, _tol(dtype))
    assert (got != logits).sum() > 0.02 * len(args[0]) * vocab  # the penalties did change the rows (~4% of tokens)
    miscounted = logits.clone()
    counts = args[1].clone()
    counts[3, 7] += 1  # the frequency penalty of row 10 is 1.7: a count off by one moves its logit by 1.7
    reference.apply_penalties(miscounted, args[0], counts, *args[2:])
    with pytest.raises(AssertionError):
        assert_close_to_scale(got, miscounted, _tol(dtype))


@pytest.mark.parametrize("impl, dtype", _cases("moe"))
def test_moe(impl, dtype) -> None:
    num_tokens, experts, hidden, inter = 13, 6, 48, 40
    logits = _randn(num_tokens, experts, dtype=dtype, seed=40)
    for scoring, top_k, renormalize in [("softmax", 2, True), ("sigmoid", 3, False)]:
        weights, ids = impl.entries["moe_route"](logits, top_k, renormalize, scoring)
        ref_weights, ref_ids = reference.moe_route(logits, top_k, renormalize, scoring)
        assert torch.equal(ids, ref_ids)
        assert_close_to_scale(weights, ref_weights, _tol(dtype))
    x = _randn(num_tokens, hidden, dtype=dtype, seed=41)
    router_route = impl.entries.get("router_route")  # optional: the router's GEMM and the routing in one kernel
    if router_route is not None:
        router, router_bias = _randn(experts, hidden, dtype=dtype, seed=46), _randn(experts, dtype=dtype, seed=47)
        for tokens in (1, 5):
            got = router_route(x[:tokens], router, router_bias, 2, True, "softmax")
            expected = reference.router_route(x[:tokens], router, router_bias, 2, True, "softmax")
            assert torch.equal(got[1], expected[1])
            assert_close_to_scale(got[0], expected[0], 4 * _tol(dtype))
    w13 = _randn(experts, 2 * inter, hidden, dtype=dtype, seed=42) * hidden**-0.5
    w2 = _randn(experts, hidden, inter, dtype=dtype, seed=43) * inter**-0.5
    biases = dict(
        w13_bias=_randn(experts, 2 * inter, dtype=dtype, seed=44), w2_bias=_randn(experts, hidden, dtype=dtype, seed=45)
    )
    for activation, bias in [("silu", {}), ("swiglu_oai", biases)]:
        args = (x, w13, w2, ref_weights, ref_ids)
        got = impl.entries["fused_moe"](*args, activation=activation, **bias)
        assert_close_to_scale(got, reference.fused_moe(*args, activation=activation, **bias), 4 * _tol(dtype))


def test_a_broken_implementation_is_caught(monkeypatch) -> None:
    """Negative check: an rms_norm that forgets its weight fails the suite above."""
    broken = registry.Implementation("rms_norm", "broken", registry.Supports(), 0)
    broken.entries = {
        "rms_norm": lambda x, weight, eps: reference.rms_norm(x, torch.ones_like(weight), eps),
        "fused_add_rms_norm": reference.fused_add_rms_norm,
        # quantizes the norm's output with a scale 1% too large
        "rms_norm_quant": lambda x, res, w, eps, dtype, static=None: _scaled_quant(
            reference.rms_norm_quant(x, res, w, eps, dtype, static), 1.01
        ),
    }
    monkeypatch.setitem(registry._REGISTRY["rms_norm"], "broken", broken)
    assert "broken" in [impl.name for impl in registry.implementations("rms_norm")]
    with pytest.raises(AssertionError):
        test_rms_norm(broken, torch.float32)
    with pytest.raises(AssertionError):
        test_rms_norm_quant(broken, torch.float32, torch.int8)


def _scaled_quant(result, factor: float):
    quantized, residual_out = result
    quantized.scale = quantized.scale * factor
    return quantized, residual_out


@pytest.mark.parametrize("impl, dtype", _cases("sampling"))
@pytest.mark.parametrize("vocab", [1500, 4099])
def test_apply_token_bitmask(impl, dtype, vocab) -> None:
    """Disallowed tokens (bit 0, bit 31 included: a negative int32 word) to -inf on the given rows only;
    the words past the vocabulary are ignored; one bit read wrong is caught."""
    gen = torch.Generator().manual_seed(60)
    logits = 3 * _randn(9, vocab, dtype=dtype, seed=61)
    rows = torch.tensor([7, 2, 0], dtype=torch.int64, device=DEVICE)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31, (3, words), generator=gen, dtype=torch.int64).to(torch.int32).to(DEVICE)
    got, expected = logits.clone(), logits.clone()
    impl.entries["apply_token_bitmask"](got, rows, bitmask)
    reference.apply_token_bitmask(expected, rows, bitmask)
    assert torch.equal(got, expected)
    tokens = torch.arange(vocab, device=DEVICE)
    allowed = ((bitmask.long()[:, tokens // 32] >> (tokens % 32)) & 1).bool()
    assert torch.isinf(got[rows]).eq(~allowed).all() and 0.3 < allowed.float().mean() < 0.7
    flipped = bitmask.clone()
    flipped[1, 3] ^= 1 << 31
    wrong = logits.clone()
    reference.apply_token_bitmask(wrong, rows, flipped)
    assert not torch.equal(got, wrong)
