"""Tile sweep for the fused MoE (kernels/moe.py), on the GPU: writes kernels/tuned/moe_<GPU>.json.

    python scripts/tune_moe.py OUT.json [--shapes qwen3 mixtral] [--kinds bfloat16 fp8_block mxfp4]
        [--tokens 1 4 16 64 256 1024 4096 8192] [--block-ms 1 16 ...] [--jobs 16] [--rep 20]
    python scripts/tune_moe.py OUT.json --write-tuned tritonllm/kernels/tuned/moe_NVIDIA_H200.json [--update]

For each (shape, kind, tokens), every BLOCK_M that the expected rows per expert can fill, and for
each of the two GEMM launches (w13 with the activation; w2 with the weights, timed with the sum
over the top-k slots that follows it) every (BLOCK_N, BLOCK_K, warps, stages) candidate, timed
alone on the real alignment (triton.testing.do_bench medians, L2 flushed); a launch's output is
checked against float32 of the same operands. Each launch also times its variants (MoeTiles'
flags): the GEMV's (BLOCK_M 1, kernels/moe_gemv.py) w13 with gate and up rows in one pass
("w13_joint") and w2 summing each token's slots in registers ("w2_slots"); the grouped GEMM's B
through a tensor descriptor ("w13_tma", "w2_tma"; float and FP8 experts), w2 on the intermediate in
the alignment's order ("w2_sorted", with B's descriptor "w2_sorted_tma"). The table records which
variant of each launch won (VARIANT_FLAGS). The case's winner is the BLOCK_M whose best w13 plus
best w2 is fastest. Compilation is the slow part: a pool
of worker processes first runs every distinct kernel once on small stand-in weights (filling
Triton's on-disk cache), then the timing process loads compiled kernels. One shape and kind takes a
few minutes (`--block-ms 1`: the GEMV's alone, for decode buckets); OUT.json is rewritten after each
launch, so a sweep cut off by a time limit keeps what it timed; run them one at a time (`--shapes qwen3 --kinds bfloat16`) and merge the files with
`--write-tuned ... --update` (each run's (kind, shape, tokens) entries replace the file's, the rest stay).
No run-time autotuning: fused_moe reads the written table (kernels/moe_tiles.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_moe import (  # noqa: E402
    DEVICE,
    DTYPE,
    SCHEMES,
    SHAPES,
    add_problem_args,
    device_name,
    layer_operands,
    make_experts,
    median_ms,
)

# isort: split
import triton  # noqa: E402  (after tritonllm.platform, via bench_moe: it switches on the interpreter without a GPU)

from tritonllm.kernels import moe  # noqa: E402
from tritonllm.kernels.gemm import GemmTiles  # noqa: E402
from tritonllm.kernels.moe_align import moe_align  # noqa: E402
from tritonllm.kernels.moe_tiles import MoeTiles, fit_moe_tiles  # noqa: E402
from tritonllm.kernels.quant import quantize_per_group  # noqa: E402
from tritonllm.kernels.quant_formats import BLOCK  # noqa: E402


def block_ms(tokens: int, e: int, top_k: int) -> list[int]:
    """BLOCK_M candidates: 16 up to twice the expected rows per expert (at most 128); 1 stands for the
    GEMV (kernels/moe_gemv.py) while the pairs per expert stay few."""
    rows = tokens * top_k / e
    return [bm for bm in (1, 16, 32, 64, 128) if (bm == 1 and rows <= 2) or bm == 16 or 1 < bm <= 2 * rows]


def candidates(kind: str, block_m: int) -> list[GemmTiles]:
    """(BLOCK_N, BLOCK_K, warps, stages) for one BLOCK_M; FP8 blocks keep BLOCK_K within a 128 group."""
    if block_m == 1:  # the GEMV: weight rows straight into registers, wide K tiles
        block_ks = {"fp8_block": (64, 128), "mxfp4": (256, 512, 1024)}.get(kind, (128, 256, 512))
        return [GemmTiles(1, bn, bk, warps, 2, 1, gemv=True)  # w2_slots: block_n shared by the slots
                for bn, bk, warps in itertools.product((8, 16, 32, 64, 128), block_ks, (2, 4, 8))]  # fmt: skip
    block_ks = (64, 128) if kind == "fp8_block" else (64, 128, 256)
    out = []
    for bn, bk, warps, stages in itertools.product((32, 64, 128, 256), block_ks, (4, 8), (3, 4)):
        # 128 x 256 only as the dense GEMM's large-M tile (x 64, eight warps; w2's: w13's gate and up
        # accumulators would double it)
        big = bn == 256 and block_m > 64 and not (bk == 64 and warps == 8)
        if big or block_m * bn * bk > 128 * 256 * 64 or (warps == 8 and block_m * bn < 64 * 128):
            continue
        out.append(GemmTiles(block_m, bn, bk, warps, stages, 8))
    return out


class Case:
    """One (shape, kind, tokens): its operands, and each launch timed for given tiles."""

    def __init__(self, name: str, kind: str, tokens: int, experts: dict) -> None:
        e, self.top_k, h, i = SHAPES[name]
        self.e, self.h, self.i, self.kind = e, h, i, kind
        self.x, _, self.weights, self.ids, gen = layer_operands(name, tokens)
        self.flat_weights = self.weights.reshape(-1)
        self.w13, self.w2 = experts["w13"], experts["w2"]
        fp8 = kind == "fp8_block"
        self.a1, self.s1 = quantize_per_group(self.x, torch.float8_e4m3fn, BLOCK) if fp8 else (self.x, None)
        self.inter = torch.randn(tokens * self.top_k, i, device=DEVICE, generator=gen).to(DTYPE)
        self.a2, self.s2 = quantize_per_group(self.inter, torch.float8_e4m3fn, BLOCK) if fp8 else (self.inter, None)
        self.out1 = torch.empty_like(self.inter)
        self.out2 = torch.empty(tokens * self.top_k, h, device=DEVICE, dtype=DTYPE)
        self.out = torch.empty(tokens, h, device=DEVICE, dtype=DTYPE)
        self._aligned: dict = {}

    def align(self, block_m: int):
        if block_m not in self._aligned:
            self._aligned[block_m] = moe_align(self.ids, self.e, block_m)
        return self._aligned[block_m]

    def sorted_inputs(self, block_m: int) -> tuple:
        """w2's input in the alignment's order (sorted_w2): row p holds the intermediate row of the pair at
        position p (padding: row 0), so each pair's result is the unsorted launch's; FP8-quantized as w2 takes it."""
        key = ("sorted", block_m)
        if key not in self._aligned:
            ids = self.align(block_m).sorted_ids.long()
            inter = self.inter[torch.where(ids < self.inter.shape[0], ids, 0)]
            fp8 = self.kind == "fp8_block"
            self._aligned[key] = quantize_per_group(inter, torch.float8_e4m3fn, BLOCK) if fp8 else (inter, None)
        return self._aligned[key]

    def run(self, which: str, tiles: GemmTiles) -> torch.Tensor:
        """One launch (WHICH), as fused_moe makes it: w13 / w13_joint -> the intermediate [T * k, I];
        w2 -> the per-slot rows [T * k, H], then their sum over the slots (timed with it); w2_slots ->
        the summed out [T, H] (its slots a power of two >= top_k); w2_tma, w2_sorted, w2_sorted_tma: as
        w2, B through a descriptor, A in the alignment's order (read through a descriptor), both."""
        fitted = fit_moe_tiles(MoeTiles(tiles, tiles), self.kind, 2, 2 if SCHEMES[self.kind] is None else 1)
        route = self.ids if tiles.gemv else self.align(tiles.block_m)
        if which.startswith("w13"):
            moe._launch(self.a1, self.s1, self.w13, self.out1, None, None, route, fitted.w13, n=self.i, k=self.h,
                        a_row_div=self.top_k, gated=True, joint=which == "w13_joint", tma=which == "w13_tma")  # fmt: skip
            return self.out1
        if which == "w2_slots":
            moe._launch(self.a2, self.s2, self.w2, self.out, None, self.flat_weights, route, fitted.w2, n=self.h,
                        k=self.i, a_row_div=1, gated=False, slots=triton.next_power_of_2(self.top_k))  # fmt: skip
            return self.out
        in_order = which.startswith("w2_sorted")
        a2, s2 = self.sorted_inputs(tiles.block_m) if in_order else (self.a2, self.s2)
        moe._launch(a2, s2, self.w2, self.out2, None, self.flat_weights, route, fitted.w2, n=self.h, k=self.i,
                    a_row_div=1, gated=False, tma=which.endswith("_tma"), sorted_a=in_order)  # fmt: skip
        if self.top_k > 1:
            torch.sum(self.out2.view(-1, self.top_k, self.h), dim=1, out=self.out)
        return self.out2


_CASES: dict = {}


def _compile(task) -> int:
    """Worker: run one candidate once (compiles into Triton's on-disk cache) on stand-in weights with
    the shape's strides (E: 16 if the real count is a multiple of 16, else 2: the same specialisation)."""
    name, kind, tokens, which, tiles = task
    if (name, kind, tokens) not in _CASES:
        _CASES.clear()
        e, top_k, h, i = SHAPES[name]
        small = 16 if e % 16 == 0 else 2
        original = SHAPES[name]
        SHAPES[name] = (small, min(top_k, small), h, i)
        try:
            _CASES[name, kind, tokens] = Case(name, kind, tokens, make_experts(kind, small, h, i))
        finally:
            SHAPES[name] = original
    try:
        _CASES[name, kind, tokens].run(which, tiles)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        return 0
    except Exception:  # noqa: BLE001 - a candidate that does not build is reported when timed
        return 1


def _expected(case: Case, which: str) -> torch.Tensor:
    """float32 of one launch's operands (kernels/reference.py): silu(gate) * up of x's rows (no bias),
    or the intermediate's rows through w2 times the pairs' weights; row = pair."""
    from tritonllm.kernels import reference

    gated = which.startswith("w13")
    w, a = (case.w13, case.x) if gated else (case.w2, case.inter)
    flat = case.ids.reshape(-1)
    out = torch.empty(flat.numel(), case.i if gated else case.h, device=DEVICE)
    for e in flat.unique().tolist():
        pairs = (flat == e).nonzero().squeeze(1)
        rows = a[pairs // case.top_k if gated else pairs]
        weight = reference.expert_weight(w, e)
        if isinstance(weight, torch.Tensor):
            y = rows.float() @ weight.float().T
        else:
            y = reference.quantized_linear(rows, weight, None).float()
        out[pairs] = reference.moe_activation(y, "silu") if gated else y * case.flat_weights[pairs, None]
    return out.view(-1, case.top_k, case.h).sum(1) if which == "w2_slots" else out


# a launch's variant -> the MoeTiles flag it sets when it wins
VARIANT_FLAGS = {
    "w13_joint": ("joint",), "w2_slots": ("sum_slots",), "w13_tma": ("tma_w13",), "w2_tma": ("tma_w2",),
    "w2_sorted": ("sorted_w2",), "w2_sorted_tma": ("sorted_w2", "tma_w2"),
}  # fmt: skip


def launches(block_m: int, top_k: int, kind: str = "bfloat16") -> tuple[str, ...]:
    """The launches a BLOCK_M times, with their variants: the GEMV's (w2_slots where there are slots to
    sum), the grouped GEMM's descriptor reads (B: not for MXFP4, decoded from bytes) and w2 on the
    intermediate in the alignment's order."""
    if block_m != 1:
        tma = ("w13_tma", "w2_tma", "w2_sorted_tma") if kind != "mxfp4" else ()
        return ("w13", "w2", "w2_sorted") + tma
    return ("w13", "w13_joint", "w2") + (("w2_slots",) if top_k > 1 else ())


def sweep(name: str, kind: str, tokens: int, experts: dict, rep: int, only: tuple[int, ...] = (),
          save=lambda rows: None) -> list[dict]:  # fmt: skip
    """Every candidate of every launch of the case's BLOCK_Ms (those in `only`, when given); `save`
    gets the rows so far after each launch, so a sweep cut off by a time limit keeps what it timed."""
    case = Case(name, kind, tokens, experts)
    rows: list[dict] = []
    for block_m in block_ms(tokens, case.e, case.top_k):
        if only and block_m not in only:
            continue
        for which in launches(block_m, case.top_k, kind):
            expected = _expected(case, which)
            for tiles in candidates(kind, block_m):
                base = dict(shape=name, kind=kind, tokens=tokens, gemm=which, tiles=asdict(tiles))
                try:
                    got = case.run(which, tiles).float()
                    err = float((got - expected).abs().max() / expected.abs().max())
                    ms = median_ms(lambda: case.run(which, tiles), rep)  # noqa: B023
                except Exception as error:  # noqa: BLE001
                    rows.append(dict(base, error=str(error)[:200]))
                    continue
                rows.append(dict(base, us=ms * 1e3, rel_error=err))
            save(rows)
    return rows


def tuned_table(rows: list[dict]) -> dict:
    """{kind: {"E,H,I": {tokens: {"w13": tiles, "w2": tiles, "us": total, variant flags}}}}: per case,
    the BLOCK_M whose best w13 and best w2 (each within 2e-2 of float32, each the fastest of its
    variants) sum to the least time; the flags of that BLOCK_M's variants, True where one won."""
    best: dict = {}
    for r in rows:
        if "us" not in r or r["rel_error"] > 2e-2:
            continue
        launch = r["gemm"].split("_")[0]  # w13 / w2, whichever variant
        key = (r["kind"], r["shape"], r["tokens"], r["tiles"]["block_m"], launch)
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    table: dict = {}
    for (kind, shape, tokens, block_m, which), r in sorted(best.items()):
        if which != "w13" or (kind, shape, tokens, block_m, "w2") not in best:
            continue
        w2 = best[kind, shape, tokens, block_m, "w2"]
        total = r["us"] + w2["us"]
        e, _, h, i = SHAPES[shape]
        entries = table.setdefault(kind, {}).setdefault(f"{e},{h},{i}", {})
        if str(tokens) not in entries or total < entries[str(tokens)]["us"]:
            entry = dict(w13=r["tiles"], w2=w2["tiles"], us=round(total, 2))
            # the flags of the variants this BLOCK_M and kind timed (the others take moe_tiles.default_variants'),
            # each True where a winning launch's variant sets it
            flags = {f for name in launches(block_m, 2, kind) for f in VARIANT_FLAGS.get(name, ())}
            won = set(VARIANT_FLAGS.get(r["gemm"], ())) | set(VARIANT_FLAGS.get(w2["gemm"], ()))
            entry.update({flag: flag in won for flag in sorted(flags)})
            entries[str(tokens)] = entry
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    add_problem_args(parser)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--rep", type=int, default=20, help="ms of runs per timing")
    parser.add_argument("--block-ms", nargs="+", type=int, default=[], help="only these BLOCK_Ms (1: the GEMV)")
    parser.add_argument("--write-tuned", type=Path, help="write OUT.json's winners here; no sweep")
    parser.add_argument("--update", action="store_true", help="with --write-tuned: keep the file's other entries")
    args = parser.parse_args()
    if args.write_tuned:
        sweep_file = json.loads(args.out.read_text())
        table = tuned_table(sweep_file["rows"])
        if args.update and args.write_tuned.exists():
            old = json.loads(args.write_tuned.read_text())
            for kind, shapes in table.items():  # this sweep's token buckets replace the file's, the rest stay
                for shape, buckets in shapes.items():
                    old.setdefault(kind, {}).setdefault(shape, {}).update(buckets)
            table = old
        table.update(device=sweep_file["device"], torch=sweep_file["torch"], triton=sweep_file["triton"])
        args.write_tuned.parent.mkdir(parents=True, exist_ok=True)
        args.write_tuned.write_text(json.dumps(table, indent=1) + "\n")
        return
    todo = [(n, k, t) for n in args.shapes for k in args.kinds for t in args.tokens]
    if args.jobs > 1:
        tasks, seen = [], set()
        for name, kind, tokens in todo:
            e, top_k, _, _ = SHAPES[name]
            for block_m in block_ms(tokens, e, top_k):
                if args.block_ms and block_m not in args.block_ms:
                    continue
                for which, tiles in itertools.product(launches(block_m, top_k, kind), candidates(kind, block_m)):
                    if (name, kind, which, tiles) not in seen:
                        seen.add((name, kind, which, tiles))
                        tasks.append((name, kind, tokens, which, tiles))
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            failed = sum(pool.map(_compile, tasks, chunksize=4))
        print(f"{len(tasks)} kernels compiled by {args.jobs} processes, {failed} failed", flush=True)
    rows: list[dict] = []

    def save(more: list[dict]) -> None:
        args.out.write_text(json.dumps(dict(device=device_name(), torch=torch.__version__, triton=triton.__version__,
                                            rows=rows + more), indent=0))  # fmt: skip

    for name in args.shapes:
        e, _, h, i = SHAPES[name]
        for kind in args.kinds:
            experts = make_experts(kind, e, h, i)
            for tokens in args.tokens:
                rows += sweep(name, kind, tokens, experts, args.rep, tuple(args.block_ms), save)
                entry = tuned_table(rows).get(kind, {}).get(f"{e},{h},{i}", {}).get(str(tokens))
                if entry:
                    desc = lambda t: (
                        f"{t['block_m']}x{t['block_n']}x{t['block_k']} w{t['num_warps']} s{t['num_stages']}"
                    )  # noqa: E731
                    variants = " ".join(
                        f for f in ("joint", "sum_slots", "tma_w13", "tma_w2", "sorted_w2") if entry.get(f)
                    )
                    print(f"{name:8s} {kind:9s} T={tokens:5d}: {entry['us']:.1f} us  w13 {desc(entry['w13'])}  "
                          f"w2 {desc(entry['w2'])} {variants}", flush=True)  # fmt: skip
                save([])
            del experts
            if DEVICE.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
