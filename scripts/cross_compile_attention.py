"""Compile the paged-attention kernels for NVIDIA sm90 / sm80 and AMD gfx942 without any GPU.

Checks that one kernel source builds for every target (no CUDA-only construct), for bf16 and FP8
caches (e4m3fn on NVIDIA, e4m3fnuz on MI300) with both FP8 dot paths. sm80 has no FP8 conversions:
its FP8 variants are expected to fail (platform.fp8_e4m3_dtype refuses FP8 caches there). Then the
NVIDIA-only Gluon FP8 decode kernel (attention_fp8_decode_sm90.py) for sm90, at every tile, head
layout and output variant the engine can pick; its PTX must hold wgmma and no local memory. And
the rotary kernel (kernels/rotary.py) alone and with the KV-cache write fused (bf16 and FP8 caches).

    python scripts/cross_compile_attention.py            # ~2 minutes on a laptop CPU
    python scripts/cross_compile_attention.py --gluon    # only the sm90 Gluon kernel (~20 s)
    python scripts/cross_compile_attention.py --rope     # only the rotary kernel (~15 s)
    python scripts/cross_compile_attention.py --portable # only the unified and split-KV kernels
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # before tritonllm.platform, which would switch it on without a GPU

# isort: split
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tritonllm.kernels import attention_fp8_decode_sm90, attention_split, attention_unified, rotary

TARGETS = [GPUTarget("cuda", 90, 32), GPUTarget("cuda", 80, 32), GPUTarget("hip", "gfx942", 64)]
POINTERS = {
    "out_ptr": "*bf16", "q_ptr": "*bf16", "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32",
    "query_start_loc_ptr": "*i32", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "qk_scale": "fp32",
    "partial_out_ptr": "*fp32", "partial_max_ptr": "*fp32", "partial_sum_ptr": "*fp32", "counter_ptr": "*i32",
    "sinks_ptr": "*fp32", "q_scale_ptr": "*fp32", "pos_ptr": "*i64", "cos_sin_ptr": "*fp32", "k_new_ptr": "*bf16",
    "v_new_ptr": "*bf16", "slot_ptr": "*i64", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16", "norm_eps": "fp32",
}  # fmt: skip


def compile_kernel(
    fn: triton.JITFunction,
    target: GPUTarget,
    types: dict,
    constexprs: dict,
    num_warps: int,
    divisible=(),
    num_stages: int | None = None,
):
    """Compile fn for target: its constexprs bound, every other argument typed from `types` (i32 when
    absent), those named in `divisible` known to be multiples of 16 (as Triton specialises pointers
    and integers at launch: what lets it vectorise loads), at `num_stages` (default: the backend's
    default pipelining depth). Raises what the compiler raises."""
    defaults = {  # constexpr parameters left at their defaults (MERGE, QUANT, ...) are bound to them
        p.name: p.default for p in inspect.signature(fn.fn).parameters.values()
        if p.default is not inspect.Parameter.empty and "constexpr" in str(p.annotation)
    }  # fmt: skip
    constexprs = {**defaults, **constexprs}
    signature = {n: ("constexpr" if n in constexprs else types.get(n, "i32")) for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    source = ASTSource(
        fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
        attrs=attrs,
    )  # fmt: skip
    stages = num_stages or (2 if target.backend == "hip" else 3)
    return triton.compile(source, target=target, options={"num_warps": num_warps, "num_stages": stages})


def disassemble(kernel) -> str:
    """The SASS of a kernel compiled for NVIDIA (its cubin through Triton's bundled nvdisasm)."""
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        return subprocess.run([nvdisasm, "-c", cubin.name], capture_output=True, text=True, check=True).stdout


def registers(kernel) -> int:
    """Registers a thread of a kernel compiled for NVIDIA (its cubin's resource usage, Triton's bundled cuobjdump):
    an SM holds 65,536 / (128 x this) programs of four warps."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", cubin.name], capture_output=True, text=True,
                               check=True).stdout  # fmt: skip
    return int(re.search(r"REG:(\d+)", usage).group(1))


def compile_one(fn: triton.JITFunction, target: GPUTarget, kv: str, constexprs: dict) -> str | None:
    """None if it compiles, else the first line of the error."""
    desc = f"tensordesc<bf16[{constexprs['TILE_N']}, {constexprs['HEAD_DIM']}]>"
    descs = dict(k_new_desc=desc, v_new_desc=desc) if constexprs.get("NEW_KV_DESC") else {}
    if "NEW_KV_DESC" in constexprs and not descs:
        constexprs = dict(constexprs, k_new_desc=None, v_new_desc=None)
    constexprs = dict(constexprs)
    quantized = constexprs.pop("q_out_type", None)  # the quantizing launches' output type (the target's FP8)
    types = dict(POINTERS, k_cache_ptr=f"*{kv}", v_cache_ptr=f"*{kv}", **descs)
    if quantized:
        types["q_out_ptr"] = f"*{quantized}"
    try:
        compile_kernel(fn, target, types, constexprs, num_warps=4)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return str(error).splitlines()[0][:200]
    return None


# (head_dim, group, block_size, tile_n, stages, inplace_v, direct): the Hopper config first
GLUON_VARIANTS = [
    (128, 4, 16, 128, 2, True, True),
    (128, 4, 16, 128, 2, True, False),
    (128, 4, 16, 64, 3, False, True),
    (64, 2, 32, 128, 2, True, True),
    (256, 8, 16, 64, 2, True, False),
    (128, 7, 8, 64, 2, True, True),
    (128, 16, 16, 128, 2, True, True),
]


def compile_gluon() -> int:
    """The sm90 Gluon FP8 decode kernel at GLUON_VARIANTS; returns the number of failures."""
    if not attention_fp8_decode_sm90.HAVE_GLUON:
        print("cuda 90 fp8_decode_sm90_kernel: skipped (this Triton has no Gluon)")
        return 0
    failures = 0
    for head_dim, group, block_size, tile_n, stages, inplace_v, direct in GLUON_VARIANTS:
        name = f"head_dim {head_dim} group {group} block {block_size} tile_n {tile_n} stages {stages}"
        name += f"{' inplace_v' if inplace_v else ''}{' direct' if direct else ' partials'}"
        try:
            kernel = attention_fp8_decode_sm90.compile_sm90(
                head_dim, group, block_size, tile_n, stages, inplace_v, direct
            )
            ptx = kernel.asm["ptx"]
            error = None if "wgmma.mma_async" in ptx and "ld.local" not in ptx else "no wgmma, or local memory"
        except Exception as failure:  # noqa: BLE001 - reported, not raised
            error = str(failure).splitlines()[0][:200]
        failures += error is not None
        print(f"cuda 90 fp8_decode_sm90_kernel {name}: {'ok' if error is None else 'FAILED: ' + error}")
    return failures


def compile_rope() -> int:
    """The rotary kernel for sm90 and gfx942: RoPE alone (the cache pointers None), and with the KV-cache
    write into a bf16 and an FP8 cache, the latter also with Qwen3's q/k RMSNorm; returns the number of
    failures."""
    failures = 0
    for target in (TARGETS[0], TARGETS[2]):
        fp8 = "fp8e4nv" if target.backend == "cuda" else "fp8e4b8"
        for kv, qk_norm in ((None, False), ("bf16", False), (fp8, False), (fp8, True)):
            types = dict(positions_ptr="*i64", q_ptr="*bf16", k_ptr="*bf16", q_out_ptr="*bf16", k_out_ptr="*bf16",
                         cache_ptr="*fp32")  # fmt: skip
            quantize = kv == fp8
            constexprs = dict(
                HEAD_DIM=128, ROT_DIM=128, IS_NEOX=True, BLOCK_T=1, BLOCK_HEADS=32, BLOCK_D=128, PDL=False,
                WRITE_CACHE=kv is not None, CACHE_BLOCK_SIZE=16, QUANTIZE_FP8=quantize, FP8_MAX=448.0 if quantize else 0.0,
                MANTISSA_BITS=3 if quantize else 0, MIN_NORMAL_EXP=-6 if quantize else 0, QK_NORM=qk_norm,
            )  # fmt: skip
            if qk_norm:
                types.update(q_norm_weight_ptr="*bf16", k_norm_weight_ptr="*bf16", norm_eps="fp32")
            else:
                constexprs.update(q_norm_weight_ptr=None, k_norm_weight_ptr=None)
            if kv is None:
                constexprs.update(dict.fromkeys(("v_ptr", "k_cache_ptr", "v_cache_ptr", "slot_mapping_ptr"), None))
            else:
                types.update(v_ptr="*bf16", k_cache_ptr=f"*{kv}", v_cache_ptr=f"*{kv}", slot_mapping_ptr="*i64")
            if quantize:
                types.update(k_scale_ptr="*fp32", v_scale_ptr="*fp32")
            else:
                constexprs.update(k_scale_ptr=None, v_scale_ptr=None)
            try:
                compile_kernel(rotary._rotary_kernel, target, types, constexprs, num_warps=4)
                error = None
            except Exception as failure:  # noqa: BLE001 - reported, not raised
                error = str(failure).splitlines()[0][:200]
            failures += error is not None
            what = "rotary only" if kv is None else f"with the KV write into a {kv} cache"
            what += " and q/k RMSNorm" if qk_norm else ""
            print(
                f"{target.backend} {target.arch} _rotary_kernel {what}: {'ok' if error is None else 'FAILED: ' + error}"
            )
    return failures


def main() -> None:
    if "--rope" in sys.argv[1:]:
        raise SystemExit(1 if compile_rope() else 0)
    portable_only = "--portable" in sys.argv[1:]  # only the unified and split attention kernels
    failures = 0 if portable_only else compile_gluon()
    if "--gluon" in sys.argv[1:]:
        raise SystemExit(1 if failures else 0)
    failures += 0 if portable_only else compile_rope()
    for target in TARGETS:
        fp8 = "fp8e4nv" if target.backend == "cuda" else "fp8e4b8"
        for kv, fp8_qk in (("bf16", False), (fp8, False), (fp8, True)):
            scaled = kv != "bf16"
            common = dict(GROUP=4, BLOCK_SIZE=16, HEAD_DIM=128, BLOCK_M=16, TILE_N=64, KV_SCALED=scaled,
                          FP8_DOT_F16=scaled, FP8_QK=fp8_qk, FP8_MAX=448.0, SLIDING=False, SOFTCAP=False)  # fmt: skip
            variants = [
                (
                    attention_unified.unified_attention_kernel,
                    dict(common, NUM_KV_HEADS=8, BLOCK_Q=4, NEW_KV_DESC=False, SINKS=False),
                ),
                (attention_split.split_kv_decode_kernel, common),
                # the engine's decode launch: the splits merged in the kernel (the last arrival of a KV head)
                (
                    attention_split.split_kv_decode_kernel,
                    dict(common, MERGE=True, GROUP_PAD=4, SPLITS_PAD=64, CHUNK=8, SINKS=False, QUANT=False),
                ),
            ]
            if kv == "bf16":  # the opt-in early keys (TRITONLLM_ATTN_EARLY_KV=1)
                variants.append((attention_split.split_kv_decode_kernel, dict(variants[-1][1], EARLY_KV=True)))
            if kv == "bf16" and target.arch != 80:  # o_proj's FP8 input quantized by the mergers (no FP8 on sm80):
                # per token, and per head (1 x 128 groups)
                quant = dict(variants[2][1], QUANT=True, ROW_PAD=4096, STATIC=False, QMAX=448.0, IS_INT=False,
                             MIN_EXP=-6, q_out_type=fp8)  # fmt: skip
                variants += [(attention_split.split_kv_decode_kernel, dict(quant, QGROUP=q)) for q in (0, 128)]
            # RoPE and the K/V write folded in (attention_rope.py): NeoX over the whole head; GPT-J over half of it
            # after the per-head norms (Qwen3's)
            fold = dict(ROPE=1, ROT_DIM=128, MANTISSA_BITS=3 if scaled else 0, MIN_NORMAL_EXP=-6 if scaled else 0)
            variants.append((attention_split.split_kv_decode_kernel, dict(variants[2][1], **fold)))
            variants.append((attention_split.split_kv_decode_kernel,
                             dict(variants[2][1], **{**fold, "ROPE": 2, "ROT_DIM": 64, "QK_NORM": True})))  # fmt: skip
            if kv == "bf16":  # the prefill path with the new K/V through tensor descriptors
                prefill = dict(common, NUM_KV_HEADS=8, BLOCK_M=64, BLOCK_Q=16, NEW_KV_DESC=True, SINKS=False)
                variants.append((attention_unified.unified_attention_kernel, prefill))
            for fn, constexprs in variants:
                error = compile_one(fn, target, kv, constexprs)
                expected_failure = scaled and target.arch == 80
                failures += error is not None and not expected_failure
                status = "ok" if error is None else ("expected failure" if expected_failure else "FAILED")
                desc = " new_kv_desc" if constexprs.get("NEW_KV_DESC") else " merge" if constexprs.get("MERGE") else ""
                desc += " early_kv" if constexprs.get("EARLY_KV") else ""
                desc += f" quant (group {constexprs['QGROUP']})" if constexprs.get("QUANT") else ""
                desc += f" rope {constexprs['ROPE']}{' qk_norm' if constexprs.get('QK_NORM') else ''}" if constexprs.get(
                    "ROPE") else ""  # fmt: skip
                print(f"{target.backend} {target.arch} {fn.__name__} {kv}{' fp8_qk' if fp8_qk else ''}{desc}: {status}")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
