"""Compile the sampling kernels for NVIDIA sm90 and AMD gfx942 without any GPU, at the GPU launch
configuration (one row per program, 8192-token chunks, 2048 in the window passes, 16 warps, 1024 candidates;
the split kernel as sample_rows launches it: 4096-token chunks, 1024 in the window passes, 8 warps, up to 64
splits) for bfloat16 and float32 logits; and the decode step's input kernels (kernels/step_inputs.py).
Reports spills (local memory in the PTX) on NVIDIA, which would make the passes slow.

    python scripts/cross_compile_sampling.py   # ~1 minute on a laptop CPU
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before tritonllm.platform, which would switch it on without a GPU

# isort: split
import torch
import triton
from cross_compile_attention import compile_kernel  # this folder: sys.path[0] when run as a script
from triton.backends.compiler import GPUTarget

from tritonllm.kernels import sampling, step_inputs

TARGETS = [GPUTarget("cuda", 90, 32), GPUTarget("hip", "gfx942", 64)]
KERNELS = [
    sampling._sample_kernel,
    sampling._sampling_mask_kernel,
    sampling._log_softmax_kernel,
    sampling._sample_split_kernel,
]
TYPES = {
    "mask_ptr": "*i1", "out_ptr": "*i64", "temperature_ptr": "*fp32", "top_k_ptr": "*i32", "top_p_ptr": "*fp32",
    "min_p_ptr": "*fp32", "seeds_ptr": "*i64", "cand_x_ptr": "*fp32", "cand_id_ptr": "*i32", "counter_ptr": "*i32",
}  # fmt: skip


def compile_one(fn: triton.JITFunction, target: GPUTarget, dtype: torch.dtype) -> str | None:
    """None if it compiles without spills, else the first line of the error."""
    key_bits, search_steps, candidate_steps = sampling._search_steps(dtype)
    constexprs = dict(
        KEY_BITS=key_bits, SEARCH_STEPS=search_steps, CANDIDATE_STEPS=candidate_steps, COMPACT=1024, BLOCK_ROWS=1,
        BLOCK_V=8192, BLOCK_W=2048, PDL=target.backend == "cuda",  # ROCm has no programmatic dependent launch
    )  # fmt: skip
    split = fn is sampling._sample_split_kernel
    if split:
        constexprs.update(SPLITS=64, BLOCK_V=sampling.SPLIT_BLOCK_V, BLOCK_W=sampling.SPLIT_BLOCK_V // 4)
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}  # log-softmax: no search
    types = dict(TYPES, logits_ptr="*bf16" if dtype == torch.bfloat16 else "*fp32")
    if fn is sampling._log_softmax_kernel:
        types["out_ptr"] = "*fp32"
    try:
        kernel = compile_kernel(fn, target, types, constexprs, num_warps=8 if split else 16)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return str(error).splitlines()[0][:300]
    if target.backend == "cuda" and "ld.local" in kernel.asm["ptx"]:
        return "spills to local memory"
    return None


# the decode step's input kernels (kernels/step_inputs.py) at the largest decode graph (256 rows) and 1,024
# block-table columns a loop step
STEP_KERNELS = {
    step_inputs.decode_inputs_kernel: (
        {"ids_ptr": "*i64", "prev_src_ptr": "*i64", "last_ptr": "*i64", "ids_out_ptr": "*i64", "rows_ptr": "*i64",
         "table_ptr": "*i32", "tables_out_ptr": "*i32", "entry_rows_ptr": "*i64", "entry_cols_ptr": "*i64",
         "entry_vals_ptr": "*i32"},
        {"BLOCK_E": 256, "BLOCK_B": 1024},
    ),
    step_inputs.sampling_params_kernel: (
        {"rows_ptr": "*i64", "float_ptr": "*fp32", "top_k_ptr": "*i32", "base_seed_ptr": "*i64",
         "num_sampled_ptr": "*i64", "temperature_out_ptr": "*fp32", "top_p_out_ptr": "*fp32", "min_p_out_ptr": "*fp32",
         "top_k_out_ptr": "*i32", "seeds_out_ptr": "*i64"},
        {"ADVANCE": True, "BLOCK": 256},
    ),
}  # fmt: skip


def compile_step_kernel(fn: triton.JITFunction, target: GPUTarget) -> str | None:
    types, constexprs = STEP_KERNELS[fn]
    try:
        kernel = compile_kernel(fn, target, types, {**constexprs, "PDL": target.backend == "cuda"}, num_warps=4)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return str(error).splitlines()[0][:300]
    if target.backend == "cuda" and "ld.local" in kernel.asm["ptx"]:
        return "spills to local memory"
    return None


def main() -> int:
    failures = 0
    for target in TARGETS:
        for fn in KERNELS:
            for dtype in (torch.bfloat16, torch.float32):
                error = compile_one(fn, target, dtype)
                failures += error is not None
                print(f"{target.backend} {target.arch} {fn.__name__} {dtype}: {error or 'ok'}", flush=True)
        for fn in STEP_KERNELS:
            error = compile_step_kernel(fn, target)
            failures += error is not None
            print(f"{target.backend} {target.arch} {fn.__name__}: {error or 'ok'}", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
