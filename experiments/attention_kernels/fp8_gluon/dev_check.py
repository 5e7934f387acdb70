"""Dev check of the Gluon FP8 decode kernel: correctness at ragged shapes, then timings."""
import json, sys, time, traceback
import torch, triton
sys.path.insert(0, "scripts")
from tritonllm import platform
from tritonllm.kernels import reference
from tritonllm.kernels.attention import paged_attention, paged_attention_with_tiles, AttentionTiles
from tritonllm.kernels.attention_split import merge_splits_kernel
from tritonllm.kernels import attention_fp8_decode_sm90 as g
from bench_attention import Case, build_inputs, reference_output

LOG2E = 1.4426950408889634
FP8 = torch.float8_e4m3fn

def run_g(q, kc, vc, bt, sl, qsl, ks, vs, scale, num_splits=1, tile_n=64, stages=4, group=4, inplace=False, maxnreg=None):
    num_seqs = sl.shape[0]; H = q.shape[1]; D = q.shape[2]; KVH = kc.shape[2]
    out = torch.empty_like(q)
    rows = 8 if group <= 8 else 16
    if num_splits > 1:
        po = torch.empty(num_seqs, H, num_splits, D, device=q.device, dtype=torch.float32)
        pm = torch.empty(num_seqs * H * num_splits, device=q.device, dtype=torch.float32)
        ps = torch.empty_like(pm)
    else:
        po = pm = ps = out
    g.fp8_decode_sm90_kernel[(KVH, num_seqs, num_splits)](
        out, po, pm, ps, q, kc, vc, bt, sl, qsl, ks, vs, num_splits, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), bt.stride(0),
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        GROUP=group, ROWS=rows, BLOCK_SIZE=kc.shape[1], HEAD_DIM=D, TILE_N=tile_n, STAGES=stages,
        DIRECT=num_splits == 1, INPLACE_V=inplace, num_warps=4, **({} if maxnreg is None else dict(maxnreg=maxnreg)))
    if num_splits > 1:
        merge_splits_kernel[(num_seqs, H)](out, po, pm, ps, sl, qsl, vs, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=D, SPLITS_PAD=triton.next_power_of_2(num_splits), TILE_N=tile_n, KV_SCALED=True, num_warps=4)
    return out

def ragged(ctx, H, KVH, D, bs, seed):
    gen = torch.Generator().manual_seed(seed)
    per = [-(-c // bs) for c in ctx]
    nb = sum(per) + 3
    perm = torch.randperm(nb - 1, generator=gen)
    bt = torch.full((len(ctx), max(per) + 1), nb - 1, dtype=torch.int32)
    u = 0
    for i, n in enumerate(per):
        bt[i, :n] = perm[u:u + n].to(torch.int32); u += n
    k = torch.randn(nb, bs, KVH, D, generator=gen); v = torch.randn(nb, bs, KVH, D, generator=gen)
    ks = (k.abs().amax() / 448).reshape(1); vs = (v.abs().amax() / 448).reshape(1)
    k8 = (k / ks).to(FP8); v8 = (v / vs).to(FP8)
    # poison: the spare (padding) block holds NaN
    k8[nb - 1] = float("nan"); v8[nb - 1] = float("nan")
    q = torch.randn(len(ctx), H, D, generator=gen)
    dev = "cuda"
    return (q.to(dev, torch.bfloat16), k8.to(dev), v8.to(dev), bt.to(dev), torch.tensor(ctx, dtype=torch.int32, device=dev),
            torch.arange(len(ctx) + 1, dtype=torch.int32, device=dev), ks.to(dev), vs.to(dev), D ** -0.5)

res = {"correct": [], "timing": []}
cases = [
    dict(ctx=[1, 15, 17, 64, 65, 100, 1000, 8191, 129, 3], H=32, KVH=8, D=128, bs=16),
    dict(ctx=[5000, 3, 1234, 77], H=28, KVH=4, D=128, bs=16),   # group 7
    dict(ctx=[700, 33, 64], H=16, KVH=8, D=64, bs=32),          # group 2, d 64
    dict(ctx=[300, 9], H=8, KVH=8, D=128, bs=8),                # MHA
    dict(ctx=[2000, 31], H=32, KVH=2, D=128, bs=16),            # group 16
    dict(ctx=[900, 50], H=8, KVH=2, D=256, bs=16),              # d 256
]
for ci, c in enumerate(cases):
    args = ragged(c["ctx"], c["H"], c["KVH"], c["D"], c["bs"], seed=ci)
    q, kc, vc, bt, sl, qsl, ks, vs, scale = args
    exp = reference.paged_attention(q.float(), kc, vc, bt, sl, qsl, 1, int(sl.max()), scale, k_scale=ks, v_scale=vs)
    group = c["H"] // c["KVH"]
    for tile_n, stages, ns, inplace in ((64, 2, 1, True), (64, 3, 3, True), (128, 2, 1, True), (64, 2, 5, False), (128, 3, 2, True)):
        if c["D"] == 256 and tile_n == 128: continue
        try:
            out = run_g(q, kc, vc, bt, sl, qsl, ks, vs, scale, ns, tile_n, stages, group, inplace)
            torch.cuda.synchronize()
            err = (out.float() - exp).abs().max().item()
            nan = bool(out.isnan().any())
        except Exception as e:
            err, nan = repr(e)[:400], None
            traceback.print_exc()
        res["correct"].append(dict(case=ci, tile_n=tile_n, stages=stages, splits=ns, inplace=inplace, err=err, nan=nan))
        print(res["correct"][-1], flush=True)

# timing: 128 x 8192
from bench_attention import _decode
from triton.testing import do_bench
fp8_in = build_inputs(_decode(128, 8192, "fp8"), "cuda", torch.bfloat16)
bf_in = build_inputs(_decode(128, 8192), "cuda", torch.bfloat16)
exp = reference_output(fp8_in)
def t(fn):
    fn(); torch.cuda.synchronize()
    return do_bench(fn, warmup=50, rep=300, return_mode="median") * 1000
res["timing"].append(dict(what="bf16 portable", us=t(bf_in.run)))
res["timing"].append(dict(what="fp8 portable", us=t(fp8_in.run)))
res["timing"].append(dict(what="bf16 portable again", us=t(bf_in.run)))
print(res["timing"], flush=True)
a = fp8_in.args()
q, kc, vc, bt, sl, qsl = a[:6]
SWEEP = [(64, 2, 1, False, None), (64, 2, 1, True, None), (64, 3, 1, True, None), (64, 4, 1, True, None),
         (64, 2, 1, True, 96), (64, 3, 1, True, 96), (64, 2, 1, True, 80), (128, 2, 1, True, None),
         (64, 3, 1, False, 96), (64, 2, 2, True, None), (64, 3, 1, True, 88)]
for tile_n, stages, ns, inplace, maxnreg in SWEEP:
    fn = lambda: run_g(q, kc, vc, bt, sl, qsl, fp8_in.k_scale, fp8_in.v_scale, fp8_in.scale, ns, tile_n, stages, 4, inplace, maxnreg)
    try:
        out = fn(); torch.cuda.synchronize()
        err = (out.float() - exp).abs().max().item()
        us = t(fn)
    except Exception as e:
        err, us = repr(e)[:300], None
    res["timing"].append(dict(what="gluon", tile_n=tile_n, stages=stages, splits=ns, inplace=inplace, maxnreg=maxnreg, us=us, err=err))
    print(res["timing"][-1], flush=True)
import os
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "g1.json"), "w"), indent=1)
