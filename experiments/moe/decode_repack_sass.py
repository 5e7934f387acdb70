"""sm90 SASS of the MoE GEMV's K loop (gpt-oss's tuned w13 joint and w2 slots tiles) with a repacked MXFP4 bit
layout's decode swapped in for _pair_fp4 (the values are meaningless: an instruction count, not a kernel).

Repacked, pairs 0..2 of each word keep each nibble's sign 9 bits above its magnitude's lowest bit (bits 6..8 /
15, 3..5 / 12, 0..2 / 9 and 16 higher), so one shift and one mask place them; pair 3 takes the bits left (10, 11,
13, 14). Under Triton 3.6 (scripts/with_gpu_triton.sh): w13 695 -> 631, w2 715 -> 652 instructions a K step.

    bash scripts/with_gpu_triton.sh -- python experiments/moe/decode_repack_sass.py [repacked]
"""

import os
import re
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tritonllm.kernels import gemv_w4  # noqa: E402


@triton.jit
def _pair_repacked(words, J: tl.constexpr, MAG=0, SIGN=0):
    if J == 0:
        pair = words & -2118090304  # 0x81C081C0
    elif J == 1:
        pair = (words << 3) & -2118090304
    elif J == 2:
        pair = (words << 6) & -2118090304
    else:  # m at 10, e0 at 11, e1 at 13, sign at 14 (and + 16)
        pair = ((words >> 4) & 0x00C000C0) | ((words >> 5) & 0x01000100) | ((words << 1) & (-(2**31) | 0x8000))
    lo = (pair << 16).to(tl.float32, bitcast=True)
    hi = (pair & -65536).to(tl.float32, bitcast=True)
    return lo, hi


if len(sys.argv) > 1 and sys.argv[1] == "repacked":
    gemv_w4._pair_fp4 = _pair_repacked
    gemv_w4._word_dot.fn.__globals__["_pair_fp4"] = _pair_repacked
from cross_compile_attention import disassemble  # noqa: E402
from cross_compile_moe import DIVISIBLE, compile_moe  # noqa: E402

from tritonllm.kernels.gemm import GemmTiles  # noqa: E402

for launch, bn in (("w13-joint", 8), ("w2-slots", 16)):
    variant = dict(joint=launch == "w13-joint", slots=4 if launch == "w2-slots" else 0, loads=1, even_k=False)
    kernel = compile_moe(
        "mxfp4", launch.startswith("w13"), GemmTiles(1, bn, 1024, 4, 3, 1, gemv=True), variant, divisible=DIVISIBLE
    )
    lines = disassemble(kernel).splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"(\.L_x_\d+):", line))}
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s.*?(\.L_x_\d+)", line)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)] : i + 1]
            break
    n = sum(1 for b in body if re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?[A-Z]", b))
    print(sys.argv[1:] or ["current"], launch, n, "instructions a K step, %.2f a weight" % (n / 128))
