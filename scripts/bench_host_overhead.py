"""Host overhead of the engine loop, on CPU: microseconds of host work per decode step.

The real engine loop (scheduler, KV-cache bookkeeping, the runner's persistent batch and input
staging on the decode-graph path, output processing, detokenization with a tokenizer covering a
151,936-token vocabulary) around a runner whose device work is stubbed out: the forward and the
sampling are replaced by random token ids. With 256 running requests, the figure is what the host
spends per step beside the GPU, so host regressions show up without a GPU. `streaming` decodes
text every step and builds every request's output each step (the server's path); `offline` is
`LLM.generate`'s (final outputs only, text decoded once at the end).

    python scripts/bench_host_overhead.py [--num-requests 256] [--steps 200] [--output-json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tritonllm import LLM, SamplingParams
from tritonllm.engine.output_processor import OutputProcessor
from tritonllm.models.covering_tokenizer import make_covering_tokenizer
from tritonllm.sampling_params import RequestOutputKind
from tritonllm.worker.model_runner import ModelRunner


class StubModel(torch.nn.Module):
    num_layers, num_kv_heads, head_dim = 1, 1, 16

    def forward(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], 1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


class StubRunner(ModelRunner):
    """The real runner's host side with the device work replaced by random tokens."""

    def __init__(self, vocab_size: int, **kwargs) -> None:
        super().__init__(StubModel(), torch.float32, torch.device("cpu"), **kwargs)
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(0)

    def _decode_body(self, size: int, v: dict[str, torch.Tensor]) -> torch.Tensor:
        self.last_sampled[:size] = torch.randint(self.vocab_size, (size,), generator=self.generator)
        return torch.zeros(size, 1)

    def _sample(self, logits, rows, sampled, special, flight, advance):
        return torch.randint(self.vocab_size, (logits.shape[0],), generator=self.generator), None


def build(num_requests: int, max_model_len: int, vocab_size: int, tokenizer=None) -> LLM:
    llm = LLM(max_model_len=max_model_len, max_num_seqs=num_requests, num_gpu_blocks_override=num_requests * max_model_len // 16)  # fmt: skip
    engine = llm.llm_engine
    engine.runner = StubRunner(vocab_size, block_size=16, max_num_seqs=num_requests, max_model_len=max_model_len,
                               max_num_batched_tokens=engine.config.scheduler.max_num_batched_tokens)  # fmt: skip
    engine.runner.enable_decode_graphs(num_requests, max_model_len, capture=False)
    engine.tokenizer = tokenizer or make_covering_tokenizer(vocab_size, {vocab_size - 1: "<|eos|>"})
    engine.output_processor = OutputProcessor(engine.tokenizer, engine.max_model_len, engine.scheduler, engine.stats)
    return llm


def measure(llm: LLM, num_requests: int, num_steps: int, streaming: bool, prompt_len: int = 200) -> dict[str, float]:
    """µs per decode step with `num_requests` running (after their prefills), split by phase."""
    engine = llm.llm_engine
    kind = RequestOutputKind.CUMULATIVE if streaming else RequestOutputKind.FINAL_ONLY
    params = SamplingParams(temperature=0.6, max_tokens=num_steps + 8, ignore_eos=True, output_kind=kind)
    for i in range(num_requests):
        engine.add_request(f"r{i}-{streaming}", [(i * 7 + j) % 600 + 5 for j in range(prompt_len)], params)
    while (
        any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) or engine.scheduler.waiting
    ):
        engine.step()  # prefills
    phases = {"schedule": 0.0, "execute": 0.0, "process": 0.0}
    wrapped = {"schedule": engine.scheduler, "execute": engine.runner, "process": engine.output_processor}
    originals = {name: getattr(obj, name) for name, obj in wrapped.items()}

    def timed(name):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return originals[name](*args, **kwargs)
            finally:
                phases[name] += time.perf_counter() - start

        return call

    for name, obj in wrapped.items():
        setattr(obj, name, timed(name))
    start = time.perf_counter()
    for _ in range(num_steps):
        engine.step()
    elapsed = time.perf_counter() - start
    for name, obj in wrapped.items():
        delattr(obj, name)
    for request_id in list(engine.output_processor.groups):
        engine.abort_request(request_id)
    per_step = lambda seconds: round(1e6 * seconds / num_steps, 1)
    return {
        "mode": "streaming" if streaming else "offline",
        "num_running": num_requests,
        "us_per_step": per_step(elapsed),
        **{f"{name}_us": per_step(seconds) for name, seconds in phases.items()},
        "us_per_request_step": round(1e6 * elapsed / num_steps / num_requests, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    llm = build(args.num_requests, 2048, args.vocab_size)
    results = [measure(llm, args.num_requests, args.steps, streaming) for streaming in (False, True)]
    print(json.dumps(results, indent=2))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
