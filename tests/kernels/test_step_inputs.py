"""A decode step's input kernels (kernels/step_inputs.py) against the torch operations they replace."""

from __future__ import annotations

import pytest
import torch

from tritonllm.kernels.step_inputs import decode_inputs, sampling_params
from tritonllm.worker.input_batch import step_seeds


def _decode_case(seed: int):
    gen = torch.Generator().manual_seed(seed)
    table = torch.randint(0, 1000, (9, 37), generator=gen, dtype=torch.int32)  # 8 rows + the dummy row (8)
    rows = torch.tensor([3, 7, 1, 0, 5, 8], dtype=torch.int64)  # the last: a padding row
    # entry 0 for row 1 (read by program 2, after program 0 wrote it), entry 2 for row 3 (read by program 0,
    # before program 2 writes it: patched in), entry 3 for row 0 at its last column; the rest padding
    entry_rows = torch.tensor([1, 8, 3, 0, 8, 8], dtype=torch.int64)
    entry_cols = torch.tensor([4, 0, 36, 36, 0, 0], dtype=torch.int64)
    entry_vals = torch.tensor([11, 0, 22, 33, 0, 0], dtype=torch.int32)
    ids = torch.randint(0, 500, (6,), generator=gen)
    prev_src = torch.tensor([2, -1, 0, -1, 1, -1], dtype=torch.int64)
    last = torch.tensor([901, 902, 903, 904], dtype=torch.int64)
    return table, rows, entry_rows, entry_cols, entry_vals, ids, prev_src, last


def test_decode_inputs_are_the_torch_gathers_with_the_entries_applied() -> None:
    table, rows, e_rows, e_cols, e_vals, ids, prev_src, last = _decode_case(0)
    expected_table = table.clone()
    expected_table.index_put_((e_rows, e_cols), e_vals)
    got_ids, got_tables = decode_inputs(ids, prev_src, last, rows, table, e_rows, e_cols, e_vals)
    assert torch.equal(table, expected_table)  # the persistent table has the entries
    assert torch.equal(got_tables, expected_table[rows])
    assert got_tables[0, 36] == 22 and got_tables[2, 4] == 11 and got_tables[3, 36] == 33
    assert torch.equal(got_ids, torch.where(prev_src >= 0, last[prev_src.clamp(min=0)], ids))
    assert got_ids.tolist()[:3] == [903, ids[1].item(), 901]


def test_decode_inputs_refuse_more_entries_than_rows() -> None:
    table, rows, e_rows, e_cols, e_vals, ids, prev_src, last = _decode_case(1)
    many = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="at most one a row"):
        decode_inputs(ids, prev_src, last, rows, table, many, many, many.int())


@pytest.mark.parametrize("advance", [True, False])
def test_sampling_params_are_the_gathers_and_the_seeds_of_step_seeds(advance: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    floats = torch.rand(3, 12, generator=gen)
    top_k = torch.randint(-1, 50, (12,), generator=gen, dtype=torch.int32)
    base = torch.randint(0, 2**62, (12,), generator=gen, dtype=torch.int64)
    counts = torch.randint(1, 1000, (12,), generator=gen, dtype=torch.int64)
    rows = torch.tensor([5, 0, 11, 3, 7], dtype=torch.int64)
    before = counts.clone()
    temperature, top_p, min_p, k, seeds = sampling_params(rows, floats, top_k, base, counts, advance)
    assert torch.equal(temperature, floats[0, rows]) and torch.equal(top_p, floats[1, rows])
    assert torch.equal(min_p, floats[2, rows]) and torch.equal(k, top_k[rows])
    steps = before[rows] if advance else before[rows] - 1
    assert torch.equal(seeds, step_seeds(base[rows], steps))
    expected = before.clone()
    if advance:
        expected[rows] += 1
    assert torch.equal(counts, expected)
