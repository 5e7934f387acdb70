"""Session 3, call 4: FP8 decode with K/V widened as loaded (_widen_e4m3) against the operand-layout conversion."""
import json, sys
sys.path.insert(0, "scripts")
import torch
from bench_attention import CASES, build_inputs, reference_output, _timed_variant, work
from tritonllm.kernels.attention import AttentionTiles

byname = {c.name: c for c in CASES}
out = {}
for name in ("decode_fp8_128x8192", "decode_fp8_32x8192"):
    c = byname.get(name)
    if c is None:
        from bench_attention import _decode
        c = _decode(32, 8192, "fp8")
    inputs = build_inputs(c, "cuda", torch.bfloat16)
    expected = reference_output(inputs)
    nbytes, _ = work(c, 1)
    rows = []
    tiles = [(16, 64, 4, 3, None), (16, 64, 4, 3, 128), (16, 64, 4, 4, None), (16, 64, 4, 2, None), (16, 128, 4, 3, None),
             (16, 128, 4, 2, None), (16, 128, 4, 3, 168), (16, 128, 8, 3, None), (16, 64, 8, 3, None), (16, 32, 4, 3, None)]
    if name != "decode_fp8_128x8192":
        tiles = tiles[:1] + tiles[4:5]
    for t in tiles:
        for widen in (True, False):
            if not widen and t[4] is not None:
                continue
            r = _timed_variant(inputs, expected, AttentionTiles(*t), fp8_widen=widen)
            r["tb_s"] = nbytes / r["us"] / 1e6 if "us" in r else None
            rows.append(r)
            print(f"  {name} {t} widen={widen} -> {r.get('us', r.get('failed'))!s:.40} ok {r.get('correct')} err {r.get('max_abs_error')}", flush=True)
    out[name] = rows
    del inputs, expected
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
