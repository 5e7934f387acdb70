"""CPU (interpreter) check of the prototype kernels against the dequantized float32 reference."""
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernels import VARIANTS, w4_gemv_proto

from tritonllm.kernels.quant_formats import E2M1_VALUES


def make(n, k, fp4, group, gen):
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    if fp4:
        e = torch.randint(118, 130, (n, k // 32), generator=gen, dtype=torch.uint8)
        w = torch.tensor(E2M1_VALUES)[q.long()] * torch.exp2(e.float() - 127).repeat_interleave(32, 1)
        return packed, e, None, w
    s = (torch.rand(n, k // group, generator=gen) * 0.02 + 0.001).half()
    z = torch.randint(0, 16, (n, k // group), generator=gen).half()
    w = (q.float() - z.float().repeat_interleave(group, 1)) * s.float().repeat_interleave(group, 1)
    return packed, s, z, w


def run(split_act, a, packed, s, z, n, k, fp4, group, bn, bw, split, pf=False):
    out = torch.zeros(n, dtype=torch.float32, device=a.device)
    words = packed.view(torch.int32)
    w4_gemv_proto[(triton_cdiv(n, bn), split)](a, words, s, z if z is not None else s, out, n, k, k // split,
                                     words.stride(0), s.stride(0), FP4=fp4, GROUP=group, BLOCK_N=bn, BLOCK_W=bw, SPLIT_ACT=split_act, PREFETCH=pf)
    return out


def triton_cdiv(a, b):
    return (a + b - 1) // b


if __name__ == "__main__":
    gen = torch.Generator().manual_seed(0)
    for fp4, group in ((False, 128), (True, 32)):
        n, k = 40, 512
        packed, s, z, w = make(n, k, fp4, group, gen)
        a = torch.randn(k, generator=gen).to(torch.float16)
        ref = w @ a.float()
        for name, split_act in VARIANTS.items():
            for bn, bw, split in ((16, 16, 1), (32, 32, 2), (8, 64, 1), (16, 16, 4)):
                got = run(split_act, a, packed, s, z, n, k, fp4, group, bn, bw, split, pf=split > 1)
                err = float((got - ref).abs().max() / ref.abs().max())
                print("fp4" if fp4 else "int4", name, bn, bw, split, f"rel err {err:.2e}")
                assert err < 1e-5, err
    print("ok")
