"""Mixed batch, one launch vs two, alternated 3 times per config (medians)."""
import dataclasses, json, statistics, sys
sys.path.insert(0, "scripts")
import torch
from bench_attention import mixed_batch
from tritonllm.kernels import attention
from tritonllm.kernels.attention import AttentionTiles
hopper = attention.ATTENTION_CONFIGS["hopper"]
out = []
for t, desc in [((64, 64, 4, 3), True), ((64, 64, 4, 2), True), ((64, 64, 4, 3), False), ((64, 64, 4, 2), False)]:
    attention.ATTENTION_CONFIGS["hopper"] = dataclasses.replace(hopper, mixed=AttentionTiles(*t), prefill_new_kv_desc=desc)
    runs = [mixed_batch("cuda", torch.bfloat16) for _ in range(3)]
    one = statistics.median(r["one_launch_us"] for r in runs)
    two = statistics.median(r["two_launches_us"] for r in runs)
    out.append(dict(tiles=t, desc=desc, one_launch_us=one, two_launches_us=two, runs=runs))
    print(f"mixed {t} desc={desc}: one {one:.1f} two {two:.1f} (x{two / one:.3f}) ok {all(r['correct'] for r in runs)}", flush=True)
attention.ATTENTION_CONFIGS["hopper"] = hopper
json.dump(out, open(sys.argv[1], "w"), indent=1)
