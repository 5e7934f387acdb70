"""Session 3, first GPU call: deeper pipelining (num_stages) for FP8 decode and the prefill paths."""
import json, sys, time
sys.path.insert(0, "scripts")
import torch
from bench_attention import CASES, build_inputs, reference_output, _timed_variant, median_ms, work
from tritonllm.kernels.attention import AttentionTiles

out = {}
byname = {c.name: c for c in CASES}
plans = {
    "decode_fp8_128x8192": [((16, n, 4, st), {}) for n in (64, 128) for st in (3, 5, 6, 7)],
    "decode_128x8192": [((16, 64, 4, st), {}) for st in (2, 4, 5)] + [((16, 128, 4, st), {}) for st in (3, 5)],
    "prefill_4096": [((64, 64, 4, st), {}) for st in (3, 5, 6)] + [((128, 64, 8, st), {}) for st in (3, 5)]
        + [((m, n, w, st), dict(new_kv_desc=True)) for (m, n, w) in ((64, 64, 4), (64, 128, 4), (128, 64, 8), (128, 128, 8)) for st in (2, 3, 4)],
    "chunk_512_after_3584": [((64, 64, 4, st), {}) for st in (3, 5, 6)] + [((128, 64, 8, st), {}) for st in (3, 5)]
        + [((m, n, w, st), dict(new_kv_desc=True)) for (m, n, w) in ((64, 64, 4), (128, 64, 8)) for st in (2, 3, 4)],
}
for name, variants in plans.items():
    c = byname[name]
    inputs = build_inputs(c, "cuda", torch.bfloat16)
    expected = reference_output(inputs)
    default_us = median_ms(inputs.run) * 1e3
    nbytes, flops = work(c, 1 if c.kv_dtype == "fp8" else 2)
    rows = []
    print(f"{name}: default {default_us:.1f} us", flush=True)
    for t, kw in variants:
        r = _timed_variant(inputs, expected, AttentionTiles(*t), **kw)
        if "us" in r:
            r["rate"] = (nbytes / r["us"] / 1e6) if c.is_decode else (flops / r["us"] / 1e6)
        rows.append(r)
        print(f"  {t} {kw} -> {r.get('us', r.get('failed'))!s:.40} rate {r.get('rate', 0):.2f} ok {r.get('correct')}", flush=True)
    out[name] = dict(default_us=default_us, rows=rows)
    del inputs, expected
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
