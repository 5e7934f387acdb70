"""What a prompt arriving beside running decodes adds to its step (issue 15's TPOT under arrivals).

Keeps `--decodes` sequences decoding, then lets one fresh prompt of each length in `--prompt-lens` join
(prefix caching off, so nothing is reused), timing that mixed step against the decode-only steps around
it: the step's wall time from `engine.step()` to its return (synchronous scheduling, so each step ends
with its tokens on the host). Each length is warmed up once (first compiles), then timed `--repeats`
times. A mixed step of n tokens replays the piecewise graphs of the next padded size up
(`piecewise_first_size`), which is the question: how much does the padding cost?

    python experiments/serving/mixed_step.py --model DIR [--load-format dummy] [--piecewise-first-size 128]
        [--no-piecewise-graphs] [--output-json OUT.json] [--trace TRACE.json]

With --trace, one more mixed step (the first prompt length) and the decode step after it are recorded by the
torch profiler (GPU activity only) into a Chrome trace, for `scripts/step_timeline.py TRACE --steps 2 --gaps 12`:
where the GPU waits for the host in a mixed step.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from tritonllm import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model folder (default: the tiny built-in Llama)")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--decodes", type=int, default=13)
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[128, 256, 400, 512, 640, 1000, 2000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--piecewise-first-size", type=int, default=128)
    parser.add_argument("--no-piecewise-graphs", action="store_true")
    parser.add_argument("--piecewise-rope-kv-write", action=argparse.BooleanOptionalAction, default=True,
                        help="the fused RoPE + KV write inside the piecewise graphs (else eager beside attention)")  # fmt: skip
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--trace", default=None, help="a Chrome trace of one mixed step and the decode step after it")
    args = parser.parse_args()
    start = time.perf_counter()
    llm = LLM(model=args.model, load_format=args.load_format, enable_prefix_caching=False, async_scheduling=False,
              piecewise_graphs=not args.no_piecewise_graphs, piecewise_first_size=args.piecewise_first_size,
              piecewise_rope_kv_write=args.piecewise_rope_kv_write)  # fmt: skip
    start_s = time.perf_counter() - start
    engine = llm.llm_engine
    graphs = engine.runner.piecewise_graphs
    rng = random.Random(0)
    vocab = min(10000, engine.hf_config.vocab_size)
    ids = lambda n: [rng.randrange(vocab) for _ in range(n)]  # noqa: E731
    counter = iter(range(10**9))

    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None

    def timed_step() -> float:
        sync()
        t0 = time.perf_counter()
        engine.step()
        sync()
        return 1000 * (time.perf_counter() - t0)

    long = SamplingParams(temperature=0.0, max_tokens=100000, ignore_eos=True)
    for _ in range(args.decodes):
        engine.add_request(f"d{next(counter)}", ids(512), long)
    for _ in range(4):  # their prefill, then decode-only steps
        timed_step()
    decode = [timed_step() for _ in range(20)]
    rows = []
    for n in args.prompt_lens:
        mixed = []
        for rep in range(args.repeats + 1):
            engine.add_request(f"p{next(counter)}", ids(n), SamplingParams(temperature=0.0, max_tokens=1))
            t = timed_step()
            if rep:  # the first: warm-up
                mixed.append(t)
            timed_step()
        tokens = n + args.decodes
        padded = graphs.padded_size(tokens) if graphs is not None else None
        row = {"prompt_len": n, "tokens": tokens, "padded_to": padded, "mixed_ms": round(statistics.median(mixed), 3),
               "mixed_all_ms": [round(t, 3) for t in mixed]}  # fmt: skip
        row["added_ms"] = round(row["mixed_ms"] - statistics.median(decode), 3)
        print(row, flush=True)
        rows.append(row)
    if args.trace:
        engine.add_request(f"p{next(counter)}", ids(args.prompt_lens[0]), SamplingParams(temperature=0.0, max_tokens=1))
        activity = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU  # CPU: a dry run
        with profile(activities=[activity]) as prof:
            traced = [timed_step(), timed_step()]
        prof.export_chrome_trace(args.trace)
        print({"traced_prompt_len": args.prompt_lens[0], "traced_ms": [round(t, 3) for t in traced]}, flush=True)
    report = {"decodes": args.decodes, "piecewise_first_size": args.piecewise_first_size,
              "piecewise_rope_kv_write": args.piecewise_rope_kv_write,
              "piecewise_graphs": graphs is not None, "sizes": graphs.sizes if graphs is not None else None,
              "start_s": round(start_s, 1), "decode_ms": round(statistics.median(decode), 3), "rows": rows}  # fmt: skip
    print({k: v for k, v in report.items() if k != "rows"}, flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
