"""Session 3, call 2: FP8 decode register caps; mixed batch / prefill with the descriptor path per config."""
import dataclasses, json, sys
sys.path.insert(0, "scripts")
import torch
from bench_attention import CASES, build_inputs, reference_output, _timed_variant, median_ms, work, mixed_batch
from tritonllm.kernels import attention
from tritonllm.kernels.attention import AttentionTiles

out = {}
byname = {c.name: c for c in CASES}
c = byname["decode_fp8_128x8192"]
inputs = build_inputs(c, "cuda", torch.bfloat16)
expected = reference_output(inputs)
nbytes, _ = work(c, 1)
rows = []
for t in [(16, 128, 4, 3, None), (16, 64, 4, 3, 128), (16, 64, 4, 3, 168), (16, 64, 4, 5, 128), (16, 64, 4, 5, 168),
          (16, 128, 4, 3, 168), (16, 128, 4, 3, 128), (16, 128, 8, 3, 128), (16, 128, 8, 5, 128), (16, 128, 8, 3, None),
          (16, 64, 4, 4, 128), (16, 64, 8, 3, 128), (16, 64, 8, 5, 128)]:
    for qk in (False, True):
        if qk and t[4] is None:
            continue
        r = _timed_variant(inputs, expected, AttentionTiles(*t), fp8_qk=qk)
        r["tb_s"] = nbytes / r["us"] / 1e6 if "us" in r else None
        rows.append(r)
        print(f"  fp8 {t} qk={qk} -> {r.get('us', r.get('failed'))!s:.40} ok {r.get('correct')}", flush=True)
out["decode_fp8_128x8192"] = rows
del inputs, expected
torch.cuda.empty_cache()

hopper = attention.ATTENTION_CONFIGS["hopper"]
mixed_rows = []
for t, desc in [((64, 64, 4, 2), False), ((64, 64, 4, 2), True), ((64, 64, 4, 3), True), ((128, 64, 8, 3), True), ((128, 128, 8, 3), True)]:
    attention.ATTENTION_CONFIGS["hopper"] = dataclasses.replace(hopper, mixed=AttentionTiles(*t), prefill_new_kv_desc=desc)
    m = mixed_batch("cuda", torch.bfloat16)
    row = dict(tiles=t, desc=desc, **m)
    for name in ("prefill_4096", "chunk_512_after_3584"):
        inputs = build_inputs(byname[name], "cuda", torch.bfloat16)
        row[name + "_us"] = median_ms(inputs.run) * 1e3
        row[name + "_tflops"] = work(byname[name], 2)[1] / row[name + "_us"] / 1e6
        del inputs
    mixed_rows.append(row)
    print(f"  mixed {t} desc={desc}: one {m['one_launch_us']:.1f} two {m['two_launches_us']:.1f} ok {m['correct']}; "
          f"prefill {row['prefill_4096_tflops']:.0f} chunk {row['chunk_512_after_3584_tflops']:.0f} TFLOP/s", flush=True)
out["mixed"] = mixed_rows
json.dump(out, open(sys.argv[1], "w"), indent=1)
