"""A decode step's small input work, each in one launch: what torch did in about seventeen.

A captured decode step starts by gathering its inputs from the runner's persistent batch
(worker/input_batch.py) and ends by gathering its rows' sampling parameters. In torch that was a
block-table `index_put_`, a compare, a clamp, a gather and a `where` for the tokens still in flight, a
gather of the block tables, then five gathers, an `index_copy_` and the seed arithmetic for sampling:
about seventeen launches of a microsecond or two each, on the critical path of every step and outside
programmatic dependent launch (gpt-oss-20b at batch 1 on an H200: 28 us of a 1.9 ms step, session 33's
step timeline). Here:

- `decode_inputs`: one program a row. It applies this step's block-table entries to the persistent
  table (row i's program writes entry i), takes each row's input token (the previous step's sample where
  `prev_src` points at it), and gathers the row's block table with this step's entry for that row (at
  most one) patched in, so that no program waits for another's write.
- `sampling_params`: one program for every row. It gathers temperature, top-p, min-p and top-k by row,
  advances each row's sampled count (or reads it back, `advance=False`) and derives the step's Philox seed
  as `input_batch.step_seeds` does (int64 arithmetic wrapping mod 2^64).

Both are capturable (no host synchronisation) and PDL-aware. `ENABLED` (TRITONLLM_STEP_INPUT_KERNELS=0 turns it
off, for A/B runs) leaves the torch operations in place.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)
from tritonllm.kernels.launch import DEFAULT_NUM_STAGES, Launcher, pdl_wait

ENABLED = os.environ.get("TRITONLLM_STEP_INPUT_KERNELS", "1") == "1"
# a row's step seed mixes its base seed and its sampled count with these (worker/input_batch.py step_seed, defined
# once here for both); the kernel takes the multipliers as two's-complement int64
SEED_MUL = 0x9E3779B97F4A7C15
STEP_MUL = 0xBF58476D1CE4E5B9
SEED_MASK = (1 << 62) - 1
_SEED_MUL = tl.constexpr(SEED_MUL - (1 << 64))
_STEP_MUL = tl.constexpr(STEP_MUL - (1 << 64))
_SEED_MASK = tl.constexpr(SEED_MASK)


@triton.jit
def decode_inputs_kernel(
    ids_ptr,  # [num_rows] int64: the staged input tokens
    prev_src_ptr,  # [num_rows] int64: index into last_ptr of the row's token still in flight, -1: ids_ptr's
    last_ptr,  # int64: the previous step's sampled tokens
    ids_out_ptr,  # [num_rows] int64
    rows_ptr,  # [num_rows] int64: each row's row of the persistent batch
    table_ptr,  # [batch rows, max_blocks] int32: the persistent block tables (entries written here)
    tables_out_ptr,  # [num_rows, max_blocks] int32, contiguous
    entry_rows_ptr,  # [num_entries] int64: block-table entries of this step (padding: the dummy row)
    entry_cols_ptr,  # [num_entries] int64
    entry_vals_ptr,  # [num_entries] int32
    num_entries,
    max_blocks,
    stride_table,
    BLOCK_E: tl.constexpr,  # a power of two >= num_entries
    BLOCK_B: tl.constexpr,  # block-table columns a loop step
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    i = tl.program_id(0)
    # this program's entry into the persistent table (the rows read below patch in every entry of theirs)
    if i < num_entries:
        tl.store(table_ptr + tl.load(entry_rows_ptr + i) * stride_table + tl.load(entry_cols_ptr + i),
                 tl.load(entry_vals_ptr + i))  # fmt: skip
    src = tl.load(prev_src_ptr + i)
    token = tl.load(ids_ptr + i)
    if src >= 0:
        token = tl.load(last_ptr + src)
    tl.store(ids_out_ptr + i, token)
    row = tl.load(rows_ptr + i)
    # this row's entry (at most one a row: the runner's check), -1 where it has none
    offs_e = tl.arange(0, BLOCK_E)
    in_entries = offs_e < num_entries
    mine = in_entries & (tl.load(entry_rows_ptr + offs_e, mask=in_entries, other=-1) == row)
    col = tl.max(tl.where(mine, tl.load(entry_cols_ptr + offs_e, mask=in_entries, other=-1), -1), axis=0)
    val = tl.max(tl.where(mine, tl.load(entry_vals_ptr + offs_e, mask=in_entries, other=0), -(2**31)), axis=0)
    for start in range(0, max_blocks, BLOCK_B):
        cols = start + tl.arange(0, BLOCK_B)
        valid = cols < max_blocks
        blocks = tl.load(table_ptr + row * stride_table + cols, mask=valid, other=0)
        blocks = tl.where(cols == col, val, blocks)
        tl.store(tables_out_ptr + i.to(tl.int64) * max_blocks + cols, blocks, mask=valid)


@triton.jit
def sampling_params_kernel(
    rows_ptr,  # [num_rows] int64
    float_ptr,  # [3, batch rows] float32: temperature, top_p, min_p
    stride_float,
    top_k_ptr,  # [batch rows] int32
    base_seed_ptr,  # [batch rows] int64
    num_sampled_ptr,  # [batch rows] int64: tokens each row has sampled (advanced here when ADVANCE)
    temperature_out_ptr,
    top_p_out_ptr,
    min_p_out_ptr,
    top_k_out_ptr,
    seeds_out_ptr,
    num_rows,
    ADVANCE: tl.constexpr,
    BLOCK: tl.constexpr,  # a power of two >= num_rows
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    offs = tl.arange(0, BLOCK)
    valid = offs < num_rows
    rows = tl.load(rows_ptr + offs, mask=valid, other=0)
    tl.store(temperature_out_ptr + offs, tl.load(float_ptr + rows, mask=valid), mask=valid)
    tl.store(top_p_out_ptr + offs, tl.load(float_ptr + stride_float + rows, mask=valid), mask=valid)
    tl.store(min_p_out_ptr + offs, tl.load(float_ptr + 2 * stride_float + rows, mask=valid), mask=valid)
    tl.store(top_k_out_ptr + offs, tl.load(top_k_ptr + rows, mask=valid), mask=valid)
    steps = tl.load(num_sampled_ptr + rows, mask=valid, other=0)
    if ADVANCE:
        tl.store(num_sampled_ptr + rows, steps + 1, mask=valid)
    else:
        steps = steps - 1
    base = tl.load(base_seed_ptr + rows, mask=valid, other=0)
    seeds = (base * _SEED_MUL + (steps + 1) * _STEP_MUL) & _SEED_MASK
    tl.store(seeds_out_ptr + offs, seeds, mask=valid)


_DECODE_INPUTS = Launcher(decode_inputs_kernel)
_SAMPLING_PARAMS = Launcher(sampling_params_kernel)


def decode_inputs(
    input_ids: torch.Tensor,
    prev_src: torch.Tensor,
    last_sampled: torch.Tensor,
    rows: torch.Tensor,
    block_table: torch.Tensor,
    entry_rows: torch.Tensor,
    entry_cols: torch.Tensor,
    entry_vals: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input tokens, block tables [num_rows, max_blocks]) of a decode step, after writing its block-table
    entries into `block_table`: at most one entry a row (a decode step gains at most one block a row; the
    padding's entries all write column 0 of the dummy row with 0)."""
    n, max_blocks = rows.numel(), block_table.shape[1]
    ids = torch.empty_like(input_ids)
    tables = torch.empty((n, max_blocks), dtype=block_table.dtype, device=block_table.device)
    if n == 0:
        return ids, tables
    num_entries = entry_rows.numel()
    if num_entries > n:
        raise ValueError(f"decode_inputs: {num_entries} block-table entries for {n} rows: at most one a row")
    block_b = min(triton.next_power_of_2(max_blocks), 1024 if not platform.is_interpreter() else 128)
    args = (input_ids, prev_src, last_sampled, ids, rows, block_table, tables, entry_rows, entry_cols, entry_vals,
            num_entries, max_blocks, block_table.stride(0))  # fmt: skip
    constexprs = {"BLOCK_E": triton.next_power_of_2(max(num_entries, 1)), "BLOCK_B": block_b}
    _DECODE_INPUTS(None, (n,), args, constexprs, num_warps=4, num_stages=DEFAULT_NUM_STAGES,
                   device_index=rows.device.index or 0)  # fmt: skip
    return ids, tables


def sampling_params(
    rows: torch.Tensor,
    float_params: torch.Tensor,
    top_k: torch.Tensor,
    base_seed: torch.Tensor,
    num_sampled: torch.Tensor,
    advance: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(temperature, top_p, min_p, top_k, seeds) of `rows`, as InputBatch.sampling_tensors defines them; advances
    the rows' sampled counts when `advance`."""
    n = rows.numel()
    device = rows.device
    outs = (
        torch.empty(n, dtype=float_params.dtype, device=device), torch.empty(n, dtype=float_params.dtype, device=device),
        torch.empty(n, dtype=float_params.dtype, device=device), torch.empty(n, dtype=top_k.dtype, device=device),
        torch.empty(n, dtype=torch.int64, device=device),
    )  # fmt: skip
    if n:
        args = (rows, float_params, float_params.stride(0), top_k, base_seed, num_sampled, *outs, n)
        _SAMPLING_PARAMS(None, (1,), args, {"ADVANCE": advance, "BLOCK": triton.next_power_of_2(n)}, num_warps=4,
                         num_stages=DEFAULT_NUM_STAGES, device_index=device.index or 0)  # fmt: skip
    return outs
