"""Session 3: FP8 (and bf16) decode with the V cache's slots contiguous per dim ([blocks, heads, dim, slot])."""
import json, sys
sys.path.insert(0, "scripts")
import torch
from bench_attention import CASES, build_inputs, reference_output, _timed_variant, work
from tritonllm.kernels.attention import AttentionTiles

byname = {c.name: c for c in CASES}
out = {}
for name, tiles in (("decode_fp8_128x8192", [(16, 128, 4, 3), (16, 64, 4, 3), (16, 128, 4, 2), (16, 128, 4, 4), (16, 64, 4, 2), (16, 256, 8, 3)]),
                    ("decode_128x8192", [(16, 64, 4, 2), (16, 128, 4, 3)]),
                    ("decode_32x8192", [(16, 128, 4, 3)])):
    c = byname[name]
    inputs = build_inputs(c, "cuda", torch.bfloat16)
    expected = reference_output(inputs)
    nbytes, _ = work(c, 1 if c.kv_dtype == "fp8" else 2)
    v_std = inputs.v_cache
    nb, bs, h, d = v_std.shape
    v_t = torch.empty(nb, h, d, bs, dtype=v_std.dtype, device=v_std.device).permute(0, 3, 1, 2)
    v_t.copy_(v_std)
    rows = []
    for t in tiles:
        for layout, v in (("slot_contiguous", v_t), ("standard", v_std)):
            inputs.v_cache = v
            r = _timed_variant(inputs, expected, AttentionTiles(*t))
            r.update(v_layout=layout, tb_s=nbytes / r["us"] / 1e6 if "us" in r else None)
            rows.append(r)
            print(f"  {name} {t} {layout} -> {r.get('us', r.get('failed'))!s:.40} ok {r.get('correct')}", flush=True)
    out[name] = rows
    del inputs, expected, v_t, v_std
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
