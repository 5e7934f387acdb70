"""Torch references of every kernel, with the launchers' exact signatures.

They define what each kernel computes (tests compare the two on random ragged inputs) and serve
as the `torch_ref` backend for ablations. Written for clarity, computed in float32, returned in
the input dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tritonllm.kernels.moe_align import MoeAlignment, max_blocks
from tritonllm.kernels.quant import E4M3_EMAX, EPS
from tritonllm.kernels.quant_formats import (
    BLOCK,
    MX_GROUP,
    OutputQuant,
    QuantizedActivation,
    QuantizedWeight,
    QuantScheme,
    e2m1_to_float,
    qmax,
    unpack_int4,
)
from tritonllm.kernels.registry import Supports, register

# every reference is the "torch_ref" implementation of its op: any dtype, platform, head size.
# Those that read sizes back to the host (.tolist(), boolean masks) cannot be captured in graphs.
HOST_SYNC = Supports(graphs=False)
ATTENTION_REF = Supports(graphs=False, features=frozenset({"sliding_window", "sinks", "softcap"}))

# ---- norms, rotary embedding, activation ---------------------------------------------------


@register("rms_norm", "torch_ref", priority=0)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [num_rows, hidden] (any leading shape), weight [hidden] -> same shape and dtype as x."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return out.to(x.dtype)


@register("rms_norm", "torch_ref", priority=0)
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual_out = x + residual (in x's dtype); out = rms_norm(residual_out). Returns (out, residual_out)."""
    residual_out = (x.float() + residual.float()).to(x.dtype)
    return rms_norm(residual_out, weight, eps), residual_out


@register("rms_norm", "torch_ref", priority=0)
def rms_norm_quant(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    quant_dtype: torch.dtype,
    static_scale: torch.Tensor | None = None,
    group: int = 0,
) -> tuple[QuantizedActivation, torch.Tensor | None]:
    """rms_norm (or fused_add_rms_norm with a residual) whose output, as rounded to x's dtype, is
    quantized for the next linear layer: per token (dynamic, float32 [M, 1]), with static_scale
    ([1]), or per `group` (128) columns of a token (block-FP8, float32 [M, K / 128]). Returns
    (QuantizedActivation, residual_out or None)."""
    if residual is None:
        out, residual_out = rms_norm(x, weight, eps), None
    else:
        out, residual_out = fused_add_rms_norm(x, residual, weight, eps)
    return quantize_rows(out, quant_dtype, static_scale, group), residual_out


def quantize_rows(
    x: torch.Tensor, dtype: torch.dtype, static_scale: torch.Tensor | None, group: int = 0
) -> QuantizedActivation:
    """x [..., K] -> QuantizedActivation per token (or with static_scale, or per 1 x 128 group with
    group = 128), as kernels/quant.py does."""
    if group and group != BLOCK:
        raise ValueError(f"activation groups are {BLOCK} columns (block-FP8), not {group}")
    act = "group" if group else "token" if static_scale is None else "tensor"
    scheme = QuantScheme(dtype, "block" if group else "channel", act)
    data, scale = quantize_activation(x.reshape(-1, x.shape[-1]), scheme, static_scale)
    return QuantizedActivation(data, scale, x.dtype)


@register("rotary", "torch_ref", priority=0)
def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first rot_dim dims of every head of q and k at the given absolute positions.

    positions [num_tokens] int; q [num_tokens, num_heads * head_dim]; k [num_tokens,
    num_kv_heads * head_dim]; cos_sin_cache [max_position, rot_dim] float32 holding cos in the
    first rot_dim/2 columns and sin in the rest. NeoX layout pairs dim i with i + rot_dim/2;
    GPT-J layout pairs 2i with 2i+1. Dims past rot_dim pass through. Returns new (q, k).
    """
    cos_sin = cos_sin_cache[positions.long()].float()
    rot_dim = cos_sin.shape[-1]
    cos, sin = cos_sin[:, None, : rot_dim // 2], cos_sin[:, None, rot_dim // 2 :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float().view(x.shape[0], -1, head_dim)
        rot, rest = xf[..., :rot_dim], xf[..., rot_dim:]
        if is_neox:
            x1, x2 = rot[..., : rot_dim // 2], rot[..., rot_dim // 2 :]
            rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rot = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        return torch.cat([rot, rest], dim=-1).view(x.shape).to(x.dtype)

    return rotate(q), rotate(k)


@register("activation", "torch_ref", priority=0)
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, 2 * d] = [gate | up] -> silu(gate) * up, [num_tokens, d]."""
    d = x.shape[-1] // 2
    xf = x.float()
    return (torch.nn.functional.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)


@register("activation", "torch_ref", priority=0)
def silu_and_mul_quant(
    x: torch.Tensor, quant_dtype: torch.dtype, static_scale: torch.Tensor | None = None, group: int = 0
) -> QuantizedActivation:
    """silu_and_mul's output (rounded to x's dtype) quantized per token (or with static_scale, or per
    `group` columns of a token)."""
    return quantize_rows(silu_and_mul(x), quant_dtype, static_scale, group)


# ---- KV cache write and paged attention ----------------------------------------------------


_FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


@register("kv_write", "torch_ref", supports=HOST_SYNC, priority=0)
def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """k, v [num_tokens, num_kv_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads,
    head_dim]; token t goes to slot s = slot_mapping[t] = block * block_size + offset (s < 0: skip).

    FP8 caches (float8_e4m3fn, float8_e4m3fnuz) store k / k_scale and v / v_scale (IEEE float32
    division by 1-element float32 tensors) clamped to the FP8 range and rounded to nearest even;
    other caches store k, v cast to their dtype and ignore the scales.
    """
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for new, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        rows = new[keep].float()
        if cache.dtype in _FP8_KV_DTYPES:
            fp8_max = torch.finfo(cache.dtype).max
            rows = (rows / scale.reshape(())).clamp(-fp8_max, fp8_max)
        cache[slots // block_size, slots % block_size] = rows.to(cache.dtype)


@register("rope_kv_write", "torch_ref", supports=HOST_SYNC, priority=0)
def rotary_write_kv_cache(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    is_neox: bool,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm of every head of q and k when qk_norm = (q_weight, k_weight, eps) is given (Qwen3),
    rotary_embedding, then write_kv_cache of the rotated k (in the model's dtype) and v; returns the
    rotated (q, k)."""
    if qk_norm is not None:
        q_weight, k_weight, eps = qk_norm
        q = rms_norm(q.reshape(-1, head_dim), q_weight, eps).view(q.shape[0], -1)
        k = rms_norm(k.reshape(-1, head_dim), k_weight, eps).view(k.shape[0], -1)
    q, k = rotary_embedding(positions, q, k, cos_sin_cache, head_dim, is_neox)
    num_tokens, num_kv_heads = k.shape[0], k_cache.shape[2]
    rows = (num_tokens, num_kv_heads, head_dim)
    write_kv_cache(k.reshape(rows), v.reshape(rows), k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    return q, k


@register("attention", "torch_ref", supports=ATTENTION_REF, priority=0)
def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    plan: object = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
    quantize: OutputQuant | None = None,
) -> torch.Tensor | QuantizedActivation:
    """Causal attention of a flat ragged batch over the paged KV cache (`plan` is the Triton
    backend's per-step set-up, k_new/v_new the step's K/V that it may read contiguously; both are
    already reflected in the cache, so the reference ignores them). `out` (optional, q's shape and
    dtype) receives the result in place.

    q [num_tokens, num_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads, head_dim];
    block_tables [num_seqs, max_blocks] int32; seq_lens [num_seqs] (ctx_len + q_len);
    query_start_loc [num_seqs + 1]. Query row j of sequence i sits at absolute position
    ctx_len + j and attends to cache positions 0..ctx_len + j. Query head h reads KV head
    h // (num_heads // num_kv_heads). FP8 caches hold K / k_scale and V / v_scale (see
    write_kv_cache): their values are multiplied by the scales; other caches ignore them.
    Returns [num_tokens, num_heads, head_dim] in q's dtype.

    Optional features (kernels declare them in Supports.features): `sliding_window` W: a query at
    position p sees only keys at p - W < position <= p (Mistral, gpt-oss, Gemma); `sinks` float32
    [num_heads]: one extra logit per head in the softmax's denominator that attends to nothing
    (gpt-oss); `softcap` c: scores become c * tanh(scores / c) before the softmax (Gemma 2).
    `quantize`: the output [num_tokens, num_heads * head_dim] quantized for the next linear layer
    (quantize_rows), returned as a QuantizedActivation.
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_len = starts[i + 1] - starts[i]
        if q_len == 0:
            continue
        ctx_len = seq_len - q_len
        num_blocks = (seq_len + block_size - 1) // block_size
        blocks = block_tables[i, :num_blocks].long()
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].float()
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].float()
        if k_cache.dtype in _FP8_KV_DTYPES:
            k, v = k * k_scale.float().reshape(()), v * v_scale.float().reshape(())
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        qi = q[starts[i] : starts[i + 1]].float()
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = ctx_len + torch.arange(q_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        hidden = k_pos[None, None, :] > q_pos[None, :, None]
        if sliding_window is not None:
            hidden |= k_pos[None, None, :] <= q_pos[None, :, None] - sliding_window
        scores.masked_fill_(hidden, float("-inf"))
        if sinks is not None:  # the sink's logit joins the denominator only
            sink = sinks.float().reshape(num_heads, 1, 1).expand(num_heads, q_len, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out[starts[i] : starts[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    if quantize is not None:
        return quantize_rows(out.reshape(out.shape[0], -1), quantize.dtype, quantize.static_scale, quantize.group)
    return out


# ---- sampling ------------------------------------------------------------------------------


@register("attention", "torch_ref", priority=0)
def plan_attention(*args: object, **kwargs: object) -> None:
    """The reference keeps no per-step attention set-up (see attention.plan_attention)."""
    return None


@register("sampling", "torch_ref", supports=HOST_SYNC, priority=0)
def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [num_rows, vocab] -> float32 log-probabilities [num_rows, vocab]."""
    return torch.log_softmax(logits.float(), dim=-1)


def sampling_mask(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Which tokens each row may sample: bool [num_rows, vocab].

    On p = softmax(logits / temperature) (temperature <= 0 counts as 1 here): top_k keeps token t
    iff fewer than top_k tokens have a strictly larger logit (top_k <= 0: off); top_p keeps t iff
    the probability mass of tokens strictly more probable than t, renormalised over the tokens top_k
    kept, is below top_p (top_p >= 1: off); min_p keeps t iff p_t >= min_p * max(p) (min_p <= 0:
    off). Ties are kept together, so the most probable token always survives.
    """
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    scaled = logits.float() / t[:, None]
    vocab = scaled.shape[-1]
    # top_k: keep t iff logit_t >= the k-th largest logit (ties kept together)
    k = torch.where(top_k > 0, top_k.long(), torch.full_like(top_k.long(), vocab)).clamp(max=vocab)
    kth_largest = scaled.sort(dim=-1, descending=True).values.gather(-1, (k - 1)[:, None])
    keep = scaled >= kth_largest
    # top_p: sorted descending, a position is kept while the mass before it is below top_p; every
    # token at least as probable as the last kept one is kept
    probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)
    sorted_probs = probs.sort(dim=-1, descending=True).values
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    kept_sorted = (mass_before < top_p[:, None].float()) | (top_p[:, None] >= 1)
    kept_sorted[:, 0] = True  # the most probable token, whatever top_p (0 included)
    threshold = sorted_probs.masked_fill(~kept_sorted, float("inf")).min(-1, keepdim=True).values
    keep &= probs >= threshold
    p_full = torch.softmax(scaled, dim=-1)
    keep &= p_full >= min_p[:, None].float() * p_full.max(-1, keepdim=True).values
    return keep


@register("sampling", "torch_ref", priority=0)
def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
) -> torch.Tensor:
    """Draw one token per row: logits [num_rows, vocab] float; temperature, top_p, min_p
    [num_rows] float32; top_k [num_rows] int32; seeds [num_rows] int64, the per-row random seed
    of this step (the engine derives it from the request's seed and its step, so a seed
    reproduces). temperature <= 0 is greedy: the first index of the largest logit. Otherwise a
    token is drawn from softmax(logits / temperature) restricted to `sampling_mask`. The Triton
    kernel draws its own random stream (Gumbel-max on Philox); the two backends agree in
    distribution, not draw by draw. Returns int64 [num_rows].
    """
    greedy = logits.float().argmax(-1)
    keep = sampling_mask(logits, temperature, top_k, top_p, min_p)
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    probs = torch.softmax((logits.float() / t[:, None]).masked_fill(~keep, float("-inf")), dim=-1)
    drawn = torch.empty_like(greedy)
    for row, seed in enumerate(seeds.tolist()):
        gen = torch.Generator(device=logits.device).manual_seed(int(seed))
        drawn[row] = torch.multinomial(probs[row], 1, generator=gen)[0]
    return torch.where(temperature > 0, drawn, greedy)


@register("sampling", "torch_ref", priority=0)
def apply_penalties(
    logits: torch.Tensor,
    rows: torch.Tensor,
    counts: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    repetition: torch.Tensor,
) -> None:
    """Penalize logits [num_rows, vocab] in place at rows [P]: counts [P, vocab] of the generated
    tokens, prompt_mask [P, vocab] bool or None, frequency / presence / repetition [P]. A token seen in
    the prompt or the output has a positive logit divided by the repetition penalty and a negative one
    multiplied by it (vLLM); then logit -= frequency * count + presence * (count > 0) (OpenAI)."""
    x = logits[rows].float()
    generated = counts > 0
    seen = generated | prompt_mask if prompt_mask is not None else generated
    rep = repetition.float()[:, None]
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - frequency.float()[:, None] * counts.float() - presence.float()[:, None] * generated.float()
    logits[rows] = x.to(logits.dtype)


@register("sampling", "torch_ref", priority=0)
def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """logits [num_rows, vocab] to -inf, in place, at rows [P] where bit t % 32 of word t // 32 of
    bitmask [P, ceil(vocab / 32)] int32 is 0 (token t not allowed)."""
    vocab = logits.shape[-1]
    tokens = torch.arange(vocab, device=logits.device)
    allowed = (bitmask.long()[:, tokens // 32] >> (tokens % 32)) & 1
    logits[rows] = logits[rows].masked_fill(allowed == 0, float("-inf"))


# ---- linear ----------------------------------------------------------------------------------


def round_quantized(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """v (float32, already divided by its scale) -> dtype: clamped to +-qmax, then rounded (FP8:
    the conversion's nearest even; int8: half away from zero), as kernels/quant.py does."""
    v = v.clamp(-qmax(dtype), qmax(dtype))
    if dtype == torch.int8:
        v = torch.where(v >= 0, torch.floor(v + 0.5), torch.ceil(v - 0.5))
    return v.to(dtype)


def quantize_activation(
    x: torch.Tensor, scheme: QuantScheme, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q, scale) as kernels/quant.py computes them for `scheme.act` (token: float32
    [M, 1]; tensor: input_scale; group: float32 [M, K/128]; mx: e8m0 uint8 [M, K/32])."""
    xf, dtype = x.float(), scheme.weight_dtype
    if scheme.act == "tensor":
        return round_quantized(xf / input_scale, dtype), input_scale
    if scheme.act == "token":
        scale = xf.abs().amax(-1, keepdim=True).clamp(min=EPS) / qmax(dtype)
        return round_quantized(xf / scale, dtype), scale
    group = MX_GROUP if scheme.act == "mx" else BLOCK
    m, k = xf.shape
    padded = F.pad(xf, (0, -k % group)).view(m, -1, group)
    amax = padded.abs().amax(-1)
    if scheme.act == "mx":
        exponent = torch.floor(torch.log2(amax)).clamp(min=-127) - E4M3_EMAX  # log2(0) = -inf -> -127
        exponent = exponent.clamp(-127, 127)
        q = round_quantized(padded / torch.exp2(exponent)[..., None], dtype).view(m, -1)[:, :k]
        return q, (exponent + 127).to(torch.uint8)
    scale = amax.clamp(min=EPS) / qmax(dtype)
    return round_quantized(padded / scale[..., None], dtype).view(m, -1)[:, :k], scale


def _expand_groups(scale: torch.Tensor, rows: int, cols: int, group_rows: int, group_cols: int) -> torch.Tensor:
    return scale.repeat_interleave(group_rows, 0)[:rows].repeat_interleave(group_cols, 1)[:, :cols]


def dequantize_activation(q: torch.Tensor, scale: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """The float32 values a quantized activation stands for (scales of 1 x 128 groups, [M, K / 128], whatever the
    scheme: a linear implementation's input_quant may ask for them)."""
    grouped = scale.dim() == 2 and scale.shape[1] > 1
    if scheme.act in ("token", "tensor") and not grouped:
        return q.float() * scale.float().reshape(-1, 1)
    if scheme.act == "mx":
        return q.float() * _expand_groups(torch.exp2(scale.float() - 127), *q.shape, 1, MX_GROUP)
    return q.float() * _expand_groups(scale, *q.shape, 1, BLOCK)


def dequantize_weight(weight: QuantizedWeight) -> torch.Tensor:
    """The float32 [N, K] matrix a quantized weight stands for (quant_formats.py's layouts)."""
    data, scale, kind = weight.data.float(), weight.scale, weight.scheme.weight_scale
    if kind == "group":  # int4 / uint8: (q - zero) * scale per row and group of columns
        q = (unpack_int4(weight.data) if weight.scheme.packed else weight.data).float()
        g = weight.scheme.group_size
        w = (q - weight.zeros.float().repeat_interleave(g, 1)) * scale.float().repeat_interleave(g, 1)
        if weight.perm is not None:  # columns stored in act order: back to the input's order
            w = torch.empty_like(w).index_copy_(1, weight.perm, w)
        return w
    if kind == "channel":
        return data * scale.float().reshape(-1, 1)
    if kind == "mx":
        if weight.scheme.packed:  # MXFP4: e2m1 pairs
            data = e2m1_to_float(unpack_int4(weight.data))
        return data * _expand_groups(torch.exp2(scale.float() - 127), *data.shape, 1, MX_GROUP)
    return data * _expand_groups(scale.float(), *data.shape, BLOCK, BLOCK)


@register("linear", "torch_ref", priority=0)  # every format (linear_formats None): the float32 definition
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ weight.T (+ bias), weight [out_features, in_features] (F.linear)."""
    return F.linear(x, weight, bias)


@register("linear", "torch_ref")
def quantized_linear(
    x: torch.Tensor | QuantizedActivation, weight: QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """y = dequant(quantize(x)) @ dequant(weight).T (+ bias) in float32, returned in x's dtype:
    activations are quantized per weight.scheme.act first (weight-only: used as they are; a
    QuantizedActivation: already quantized by the op before)."""
    if isinstance(x, QuantizedActivation):  # quantized for this layer's scheme by the op before
        a, out_dtype = dequantize_activation(x.data, x.scale, weight.scheme), x.dtype
    elif weight.scheme.act == "none":
        a, out_dtype = x.reshape(-1, x.shape[-1]).float(), x.dtype
    else:
        q, scale = quantize_activation(x.reshape(-1, x.shape[-1]), weight.scheme, weight.input_scale)
        a, out_dtype = dequantize_activation(q, scale, weight.scheme), x.dtype
    y = a @ dequantize_weight(weight).T
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype).view(*x.shape[:-1], -1)


# ---- mixture of experts ---------------------------------------------------------------------

MOE_SCORINGS = ("softmax", "sigmoid")
MOE_ACTIVATIONS = ("silu", "swiglu_oai")


# the expert formats FusedMoE stores (layers/moe.py): the reference serves each of them
MOE_REF = Supports(graphs=False, features=frozenset({"fp8:block:group", "fp8:block:none", "mxfp4:mx:none"}))


@register("moe", "torch_ref", supports=MOE_REF, priority=0)
def moe_route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, scoring: str = "softmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights float32 [T, top_k], expert ids int32 [T, top_k]): each
    token's top_k experts by score (softmax over the experts, or a sigmoid per expert), their scores
    as weights, divided by their sum when `renormalize` (Mixtral; Qwen3-MoE's norm_topk_prob;
    gpt-oss's softmax over the top logits is the same thing). Ties go to the lower expert id."""
    if scoring not in MOE_SCORINGS:
        raise ValueError(f"MoE scoring {scoring!r} is not one of {MOE_SCORINGS}")
    logits = router_logits.float()
    scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
    weights, ids = scores.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids.to(torch.int32)


@register("moe", "torch_ref")
def router_route(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int, renormalize: bool,
    scoring: str = "softmax",
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The router's linear layer, its logits rounded to x's dtype as the layer gives them, then moe_route."""
    logits = F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
    return moe_route(logits, top_k, renormalize, scoring)


@register("moe", "torch_ref")
def norm_router_route(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
    bias: torch.Tensor | None, top_k: int, renormalize: bool, scoring: str = "softmax",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """fused_add_rms_norm(x, residual), then router_route on its output: (weights, ids, normed, residual_out)."""
    normed, residual_out = fused_add_rms_norm(x, residual, norm_weight, eps)
    return (*router_route(normed, weight, bias, top_k, renormalize, scoring), normed, residual_out)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """topk_ids [T, k] -> the pairs (p = t * k + j) sorted by expert, each expert's segment padded to
    a multiple of block_m with T * k, blocks past the last segment marked expert E; each expert's pairs
    in pair order (kernels/moe_align.py's contract). Torch ops that read no size back to the host: a
    scatter-add histogram, cumsums, a stable sort, searchsorted."""
    device = topk_ids.device
    experts = topk_ids.reshape(-1).long()
    num_pairs = experts.numel()
    num_blocks = max_blocks(num_pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, experts, torch.ones_like(experts))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    first_of_expert = torch.cumsum(counts, 0) - counts  # where each expert's pairs start once sorted
    sorted_experts, order = torch.sort(experts, stable=True)
    rank = torch.arange(num_pairs, device=device) - first_of_expert[sorted_experts]
    dest = padded_end[sorted_experts] - padded[sorted_experts] + rank
    sorted_ids = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True).to(torch.int32)
    return MoeAlignment(sorted_ids, block_expert, num_pairs, num_blocks)


def moe_activation(gate_up: torch.Tensor, activation: str, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """[T, 2I] (gate columns, then up columns) -> [T, I]. "silu": silu(gate) * up (Mixtral, Qwen);
    "swiglu_oai": gpt-oss's clamped SwiGLU, (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)
    with g = clamp(gate, max=limit)."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "swiglu_oai":
        gate = gate.clamp(max=limit)
        return (up.clamp(-limit, limit) + 1) * gate * torch.sigmoid(alpha * gate)
    raise ValueError(f"MoE activation {activation!r} is not one of {MOE_ACTIVATIONS}")


def expert_weight(w: torch.Tensor | QuantizedWeight, expert: int) -> torch.Tensor | QuantizedWeight:
    """Expert `expert`'s [N, K] matrix of stacked expert weights [E, N, K] (quantized: its data and scales)."""
    if isinstance(w, QuantizedWeight):
        zeros = None if w.zeros is None else w.zeros[expert]
        return QuantizedWeight(w.scheme, w.data[expert], w.scale[expert], zeros=zeros)
    return w[expert]


def _expert_linear(x: torch.Tensor, w: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    if isinstance(w, QuantizedWeight):
        return quantized_linear(x, w, bias).float()
    return F.linear(x.float(), w.float(), None if bias is None else bias.float())


@register("moe", "torch_ref", priority=0)
def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor | QuantizedWeight,
    w2: torch.Tensor | QuantizedWeight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
    out: torch.Tensor | None = None,
    after_w13: Callable[[], None] | None = None,
) -> torch.Tensor:
    """The experts' sum: out[t] = sum_j topk_weights[t, j] * expert(topk_ids[t, j], x[t]), where
    expert(e, x) = w2[e] @ act(w13[e] @ x + w13_bias[e]) + w2_bias[e].

    x [T, H]; w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I], as tensors in x's dtype or
    QuantizedWeight with stacked data/scales (kernels/quant_formats.py layouts per expert: FP8 block
    128 with 1 x 128 activation groups, MXFP4); biases [E, 2I] / [E, H]; topk_* [T, top_k].
    Computed in float32 (the intermediate activation rounded to x's dtype, as the kernels store it);
    returns [T, H] in x's dtype (into `out` when given). after_w13: called before the sum (the Triton
    implementation's hook between its two launches)."""
    if after_w13 is not None:
        after_w13()
    out = torch.empty_like(x) if out is None else out
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in topk_ids.unique().tolist():
        token, slot = (topk_ids == e).nonzero(as_tuple=True)
        bias13 = None if w13_bias is None else w13_bias[e]
        h = moe_activation(_expert_linear(x[token], expert_weight(w13, e), bias13), activation, alpha, limit)
        y = _expert_linear(h.to(x.dtype), expert_weight(w2, e), None if w2_bias is None else w2_bias[e])
        acc.index_add_(0, token, y * topk_weights[token, slot].float()[:, None])
    return out.copy_(acc)
