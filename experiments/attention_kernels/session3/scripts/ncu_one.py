"""Run one attention case a few times (for ncu): python scratch/ncu_one.py CASE [m n w st [desc|qk] [maxnreg]]"""
import sys
sys.path.insert(0, "scripts")
import torch
from bench_attention import CASES, build_inputs
from tritonllm.kernels.attention import AttentionTiles, paged_attention_with_tiles
c = {c.name: c for c in CASES}[sys.argv[1]]
inputs = build_inputs(c, "cuda", torch.bfloat16)
if len(sys.argv) > 2:
    m, n, w, st = map(int, sys.argv[2:6])
    flag = sys.argv[6] if len(sys.argv) > 6 else ""
    reg = int(sys.argv[7]) if len(sys.argv) > 7 else None
    kw = dict(new_kv_desc=True, k_new=inputs.k_new, v_new=inputs.v_new) if flag == "desc" else {}
    if flag == "qk":
        kw = dict(fp8_qk=True)
    run = lambda: paged_attention_with_tiles(*inputs.args(), AttentionTiles(m, n, w, st, reg), k_scale=inputs.k_scale, v_scale=inputs.v_scale, **kw)
else:
    run = inputs.run
for _ in range(3):
    run()
torch.cuda.synchronize()
