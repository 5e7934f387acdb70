"""Sampling kernel benchmark (GPU): `kernels.sampling.sample` against a torch sort-based top-k /
top-p sampler (the shape of vLLM's PyTorch fallback: sort, cumsum, mask, softmax, multinomial),
on bf16 logits at decode batch sizes and Qwen3's / Llama-3's vocabularies.

Reports GPU time per call (triton.testing.do_bench median, L2 flushed), the logits read rate
(bytes of logits / time: one pass over the vocabulary is the floor) and the ratio to torch.

    python scripts/bench_sampling.py [OUT.json] [--rows 256 --vocab 151936]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from tritonllm.kernels import sampling

FILTERS = {  # name -> (temperature, top_k, top_p, min_p)
    "greedy": (0.0, 0, 1.0, 0.0),
    "temperature": (0.6, 0, 1.0, 0.0),
    "top_k50": (0.6, 50, 1.0, 0.0),
    "top_k50_top_p0.95": (0.6, 50, 0.95, 0.0),
    "top_p0.95": (0.6, 0, 0.95, 0.0),
    "top_p0.95_peaked": (0.6, 0, 0.95, 0.0),
    "min_p0.1": (0.6, 0, 1.0, 0.1),
}


def torch_sample(logits, temperature, top_k, top_p, generator=None):
    """Sort-based top-k / top-p sampling in torch (greedy rows: argmax)."""
    scaled = logits.float() / temperature.clamp(min=1e-5)[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    vocab = scaled.shape[-1]
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab).long()
    positions = torch.arange(vocab, device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(positions >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs
    probs = probs.masked_fill(before >= top_p[:, None], 0.0)
    drawn = order.gather(-1, torch.multinomial(probs, 1, generator=generator)).squeeze(-1)
    return torch.where(temperature > 0, drawn, logits.argmax(-1))


def make_logits(rows: int, vocab: int, peaked: bool, device: str) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(rows, vocab, generator=gen, device=device) * 2.0
    if peaked:  # a real model's shape: a few dozen likely tokens, a long flat tail
        logits[:, :64] += 12.0 * torch.rand(rows, 64, generator=gen, device=device)
    return logits.to(torch.bfloat16)


def measure(rows: int, vocab: int, name: str, device: str = "cuda") -> dict:
    temperature, top_k, top_p, min_p = FILTERS[name]
    logits = make_logits(rows, vocab, name.endswith("peaked"), device)
    t = torch.full((rows,), temperature, device=device)
    k = torch.full((rows,), top_k, dtype=torch.int32, device=device)
    p = torch.full((rows,), top_p, device=device)
    m = torch.full((rows,), min_p, device=device)
    seeds = torch.arange(rows, dtype=torch.int64, device=device)
    tokens = sampling.sample(logits, t, k, p, m, seeds)
    mask = sampling.sampling_mask(logits, t, k, p, m)
    inside = bool(mask.gather(1, tokens[:, None]).all()) or temperature <= 0
    ms = triton.testing.do_bench(lambda: sampling.sample(logits, t, k, p, m, seeds), warmup=20, rep=200)
    ms_torch = triton.testing.do_bench(lambda: torch_sample(logits, t, k.long(), p), warmup=5, rep=100)
    return {
        "filters": name,
        "rows": rows,
        "vocab": vocab,
        "us": round(1000 * ms, 1),
        "logits_tb_per_s": round(logits.numel() * logits.element_size() / ms / 1e9, 2),
        "torch_sort_us": round(1000 * ms_torch, 1),
        "speedup_vs_torch": round(ms_torch / ms, 2),
        "tokens_inside_mask": inside,
        "survivors_mean": round(mask.sum(-1).float().mean().item(), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_json", nargs="?", default=None)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--vocab", type=int, nargs="+", default=[151936, 128256])
    parser.add_argument("--filters", nargs="+", default=list(FILTERS))
    args = parser.parse_args()
    results = []
    for vocab in args.vocab:
        for rows in args.rows:
            for name in args.filters:
                result = measure(rows, vocab, name)
                print(json.dumps(result))
                results.append(result)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
