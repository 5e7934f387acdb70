"""Split-KV decode attention at few sequences, timed graph-replayed at every split count (session 21).

Each (sequences, context) case is built as scripts/bench_attention.py builds its decode cases (bf16, 32 query /
8 KV heads, head_dim 128, block 16, random block tables), run through AttentionPlan as an engine step runs it
(the merge in the split kernel), checked against the float32 reference, then timed as 20 calls in a CUDA graph.
From the repository root, on the GPU:

    PYTHONPATH=. python experiments/attention_kernels/h200_session21/split_counts.py OUT.json --seqs 1 4 16 \
        --contexts 520 640 1024 2048 4096
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tritonllm import platform  # first: the interpreter switch on CPU

# isort: split
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from bench_attention import Case, build_inputs, graph_us, max_error, reference_output  # noqa: E402

from tritonllm.kernels.attention import AttentionPlan, choose_num_splits, paged_attention  # noqa: E402

SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seqs", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--contexts", type=int, nargs="+", default=[520, 640, 1024, 2048, 4096])
    args = parser.parse_args()
    report = {}
    for seqs in args.seqs:
        for ctx in args.contexts:
            case = Case(f"decode_{seqs}x{ctx}", seqs, 1, ctx - 1)
            inputs = build_inputs(case, platform.DEVICE, torch.bfloat16)
            expected = reference_output(inputs)
            default = choose_num_splits(seqs, case.num_kv_heads, ctx, platform.num_multiprocessors())
            row = {}
            for n in sorted({*SPLITS, default}):
                if n > 1 and ctx < n * 16:
                    continue
                plan = AttentionPlan(*inputs.args()[3:8], case.num_heads, case.num_kv_heads, case.head_dim,
                                     case.block_size, kv_dtype=inputs.k_cache.dtype, fp8_gluon=False,
                                     reuse_output=True, num_splits=n)  # fmt: skip

                def run(plan: AttentionPlan = plan, inputs=inputs) -> torch.Tensor:
                    return paged_attention(*inputs.args(), plan=plan)

                _, ok = max_error(run().clone(), expected)
                row[n] = round(graph_us(run), 2) if ok else "wrong"
            best_us, best = min((us, n) for n, us in row.items() if us != "wrong")
            print(f"seqs {seqs} ctx {ctx}: default {default} -> {row[default]} us; best {best} -> {best_us}; {row}",
                  flush=True)  # fmt: skip
            report[case.name] = dict(default_splits=default, us_by_splits=row)
            args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
