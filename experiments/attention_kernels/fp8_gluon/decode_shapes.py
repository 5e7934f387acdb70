"""FP8 decode at the six decode shapes: the Gluon kernel (the plan's default on sm90) vs the portable
Triton kernel (fp8_gluon=False), next to the bf16 cache; each output checked against the reference."""
import json, os, sys
sys.path.insert(0, "scripts")
import torch
from bench_attention import _decode, build_inputs, reference_output, max_error, median_ms
from tritonllm.kernels.attention import AttentionPlan, paged_attention
rows = []
# warm the GPU up (clocks) before the first measured case
w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(200):
    w @ w
torch.cuda.synchronize()
for n, ctx in ((1, 1024), (1, 8192), (32, 1024), (32, 8192), (128, 1024), (128, 8192), (1, 1024), (1, 2048), (4, 1024)):
    if True:
        r = dict(case=f"{n}x{ctx}")
        for kv in ("bf16", "fp8"):
            inp = build_inputs(_decode(n, ctx, kv), "cuda", torch.bfloat16)
            exp = reference_output(inp)
            c = inp.case
            for gl in ((None, False) if kv == "fp8" else (None,)):
                plan = AttentionPlan(*inp.args()[3:8], c.num_heads, c.num_kv_heads, c.head_dim, c.block_size,
                                     fp8_gluon=gl, kv_dtype=inp.k_cache.dtype)
                run = lambda: paged_attention(*inp.args(), k_scale=inp.k_scale, v_scale=inp.v_scale, plan=plan)
                err, ok = max_error(run(), exp)
                name = kv if kv == "bf16" else ("fp8_gluon" if plan.fp8_tiles is not None else "fp8_triton")
                r[name + "_us"] = median_ms(run) * 1e3
                r[name + "_ok"] = ok
                r["splits"] = plan.num_splits
            del inp, exp
        print(r, flush=True)
        rows.append(r)
json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "fp8_shapes.json"), "w"), indent=1)
