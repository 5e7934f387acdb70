"""Which Triton kernels compile while serving, and which steps stall: the serving benchmark's load
(Poisson arrivals, random 512-token prompts, 128 new tokens, temperature 0.8) driven straight into
LLMEngine.step() after start-up and warm-up, with Triton's post-compile hook recording every
compilation and the step it happened in.

    python scripts/find_jit_compiles.py --model DIR [--rates 16 64] [--num-prompts 400] [--output-json OUT]

Prints each compile (kernel, the step's tokens and sequences, the step's wall time) and the slowest
steps; a compile after warm-up is a stall every user in that step pays.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from tritonllm import LLM, SamplingParams, platform  # before triton: sets up the interpreter on CPU

from triton import knobs  # noqa: E402  isort: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rates", type=float, nargs="+", default=[16.0, 64.0])
    parser.add_argument("--num-prompts", type=int, default=400)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    llm = LLM(model=args.model)
    engine = llm.llm_engine
    compiles: list[dict] = []

    def hook(*_, **kwargs) -> None:
        fn = kwargs.get("fn")
        compiles.append({"kernel": getattr(fn, "name", repr(fn)), "key": str(kwargs.get("key"))[:4000]})

    if platform.is_gpu():  # the interpreter (CPU) compiles nothing
        knobs.runtime.jit_post_compile_hook = hook
    rng = random.Random(0)
    report = {"rates": []}
    for rate in args.rates:
        t0, clock, arrivals = time.perf_counter(), 0.0, []
        for i in range(args.num_prompts):
            clock += rng.expovariate(rate)
            arrivals.append((clock, i))
        steps, done = [], 0
        while done < args.num_prompts:
            now = time.perf_counter() - t0
            while arrivals and arrivals[0][0] <= now:
                _, i = arrivals.pop(0)
                ids = [rng.randrange(min(10000, engine.hf_config.vocab_size)) for _ in range(args.input_len)]
                params = SamplingParams(temperature=0.8, max_tokens=args.output_len, ignore_eos=True, detokenize=True)
                engine.add_request(f"{rate}-{i}", ids, params)
            if not engine.has_unfinished_requests():
                time.sleep(0.0005)
                continue
            before = len(compiles)
            start = time.perf_counter()
            outputs = engine.step()
            wall = time.perf_counter() - start
            sched = engine.stats.steps[-1]
            row = {"t": round(start - t0, 3), "wall_ms": round(1000 * wall, 2), "step": vars(sched)}
            for c in compiles[before:]:
                c.update(rate=rate, **row)
                print("compile:", c["kernel"], row, flush=True)
            steps.append(row)
            done += sum(1 for o in outputs if o.finished)
        slow = sorted(steps, key=lambda r: -r["wall_ms"])[:8]
        print(f"rate {rate}: {len(steps)} steps, slowest:", *slow, sep="\n  ", flush=True)
        report["rates"].append({"rate": rate, "steps": len(steps), "slowest": slow})
    report["compiles"] = compiles
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(report, f, indent=2, default=str)


if __name__ == "__main__":
    main()
