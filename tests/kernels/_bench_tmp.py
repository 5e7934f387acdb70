import torch, triton, sys
from tritonllm.kernels import rmsnorm, rotary, activation, sampling, reference as ref
dev = "cuda"; bf = torch.bfloat16
def bench(name, fn, nbytes):
    ms = triton.testing.do_bench(fn, warmup=5, rep=50)
    print(f"{name:50s} {ms*1e3:9.1f} us  {nbytes/ms/1e6:8.1f} GB/s", flush=True)
x = torch.randn(4096, 4096, device=dev, dtype=bf); r = torch.randn_like(x); w = torch.randn(4096, device=dev, dtype=bf)
bench("rms_norm 4096x4096", lambda: rmsnorm.rms_norm(x, w, 1e-6), 2*x.numel()*2)
bench("torch ref rms_norm 4096x4096", lambda: ref.rms_norm(x, w, 1e-6), 2*x.numel()*2)
bench("fused_add_rms_norm 4096x4096", lambda: rmsnorm.fused_add_rms_norm(x, r, w, 1e-6), 4*x.numel()*2)
x1 = x[:8]; r1 = r[:8]
bench("fused_add_rms_norm 8x4096", lambda: rmsnorm.fused_add_rms_norm(x1, r1, w, 1e-6), 4*x1.numel()*2)
qkv = torch.randn(8192, 48*128, device=dev, dtype=bf); q = qkv[:, :4096].view(8192, 32, 128); wh = torch.randn(128, device=dev, dtype=bf)
bench("head rms_norm 8192x32x128 strided", lambda: rmsnorm.rms_norm(q, wh, 1e-6), 2*q.numel()*2)
inv = 1.0 / 500000 ** (torch.arange(0, 128, 2, device=dev).float() / 128); f = torch.outer(torch.arange(32768, device=dev).float(), inv)
cache = torch.cat([f.cos(), f.sin()], -1); pos = torch.randint(0, 32768, (8192,), device=dev)
k = qkv[:, 4096:5120]; qq = qkv[:, :4096]
bench("rotary 8192 tok 32/8 heads 128", lambda: rotary.rotary_embedding(pos, qq, k, cache, 128, True), 2*(qq.numel()+k.numel())*2)
bench("rotary gptj 8192 tok", lambda: rotary.rotary_embedding(pos, qq, k, cache, 128, False), 2*(qq.numel()+k.numel())*2)
bench("rotary 64 tok", lambda: rotary.rotary_embedding(pos[:64], qq[:64], k[:64], cache, 128, True), 2*64*5120*2)
g = torch.randn(8192, 2*14336, device=dev, dtype=bf)
bench("silu_and_mul 8192x14336", lambda: activation.silu_and_mul(g), g.numel()*2*1.5)
bench("torch ref silu_and_mul", lambda: ref.silu_and_mul(g), g.numel()*2*1.5)
V = 151936
for R in (1, 64, 256):
    lg = 3*torch.randn(R, V, device=dev, dtype=bf)
    bench(f"log_softmax {R}x{V}", lambda: sampling.log_softmax(lg), lg.numel()*6)
    seeds = torch.arange(R, device=dev)
    def mk(t, k_, p, m):
        return dict(temperature=torch.full((R,), t, device=dev), top_k=torch.full((R,), k_, device=dev, dtype=torch.int32), top_p=torch.full((R,), p, device=dev), min_p=torch.full((R,), m, device=dev))
    for name, prm in [("greedy", mk(0., 0, 1., 0.)), ("temp", mk(0.8, 0, 1., 0.)), ("top_k", mk(0.8, 50, 1., 0.)), ("top_p", mk(0.8, 0, 0.9, 0.)), ("all", mk(0.8, 50, 0.9, 0.05))]:
        bench(f"sample {name} {R}x{V}", lambda: sampling.sample(lg, **prm, seeds=seeds), lg.numel()*2)
    bench(f"torch ref sampling_mask all {R}x{V}", lambda: ref.sampling_mask(lg, **prm), lg.numel()*2)
