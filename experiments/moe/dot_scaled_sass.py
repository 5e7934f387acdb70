"""sm90 SASS of an MXFP4 GEMV on the tensor cores through Triton's own `tl.dot_scaled` (e2m1 weights with e8m0
scales times a bf16 activation padded to 16 columns): is Triton's Hopper lowering of the scaled dot a shorter
instruction stream than the MoE GEMV's CUDA-core decode (695 instructions a K step, 5.43 a weight)?

It is not (session 33, Triton 3.9): 5.8-6.1 instructions a weight at 64-128 rows x 128-512 K on four warps. The
e2m1 values are decoded through byte permutes (PRMT, 1.8 a weight) and staged through shared memory (LDS/STS)
for the warpgroup MMA; the MMA itself is 0.12 a weight. The hand-laid Gluon MMA GEMM (kernels/gemm_w4_sm90.py,
decoding in the MMA's register layout) is 3.5 a weight.

    python experiments/moe/dot_scaled_sass.py
"""

import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from cross_compile_attention import compile_kernel, disassemble  # noqa: E402
from sass_loop_mix import loop_mix  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402


@triton.jit
def mxfp4_dot_scaled_gemv(w_ptr, s_ptr, x_ptr, out_ptr, N, K, stride_wn, stride_sn, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, T: tl.constexpr):  # fmt: skip
    """out[n] = sum_k w[n, k] x[k]: w e2m1 bytes [N, K / 2] with e8m0 scales [N, K / 32]; x in column 0 of T."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kb = tl.arange(0, BLOCK_K // 2)
    offs_ks = tl.arange(0, BLOCK_K // 32)
    offs_k = tl.arange(0, BLOCK_K)
    first = (tl.arange(0, T) == 0)[None, :]
    acc = tl.zeros((BLOCK_N, T), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        w = tl.load(w_ptr + rn[:, None] * stride_wn + (k // 2 + offs_kb)[None, :])
        s = tl.load(s_ptr + rn[:, None] * stride_sn + (k // 32 + offs_ks)[None, :])
        x = tl.load(x_ptr + (k + offs_k)[:, None] + tl.arange(0, T)[None, :] * 0, mask=first, other=0.0)
        acc = tl.dot_scaled(w, s, "e2m1", x, None, "bf16", acc)
    tl.store(out_ptr + rn[:, None] + tl.arange(0, T)[None, :] * 0, acc, mask=first)


def main() -> None:
    types = {"w_ptr": "*u8", "s_ptr": "*u8", "x_ptr": "*bf16", "out_ptr": "*fp32"}
    for block_n, block_k in [(64, 256), (128, 128), (128, 256), (64, 512)]:
        kernel = compile_kernel(mxfp4_dot_scaled_gemv, GPUTarget("cuda", 90, 32), types,
                                {"BLOCK_N": block_n, "BLOCK_K": block_k, "T": 16}, 4,
                                ("w_ptr", "s_ptr", "x_ptr", "out_ptr", "K", "stride_wn"))  # fmt: skip
        sass = disassemble(kernel)
        mix = loop_mix(sass)
        per_thread = block_n * block_k / 128
        print(f"{block_n} x {block_k}: {sum(mix.values())} instructions a K step, "
              f"{sum(mix.values()) / per_thread:.2f} a weight{' (spills)' if 'LDL' in sass else ''}; "
              f"{dict(mix.most_common(8))}")  # fmt: skip


if __name__ == "__main__":
    main()
