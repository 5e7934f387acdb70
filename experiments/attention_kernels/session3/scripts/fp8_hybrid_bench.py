import json, sys
sys.path.insert(0, "scripts"); sys.path.insert(0, "experiments/attention_kernels/session3/scripts")
import torch
from bench_attention import _decode, build_inputs, reference_output, work, median_ms
import fp8_swap_ab_kernel as fp8dec
out = {}
for c in (_decode(128, 8192, "fp8"), _decode(32, 8192, "fp8")):
    inputs = build_inputs(c, "cuda", torch.bfloat16)
    expected = reference_output(inputs)
    nbytes, _ = work(c, 1)
    base_us = median_ms(inputs.run) * 1e3
    rows = [dict(variant="current", us=base_us, err=(inputs.run().float() - expected).abs().max().item())]
    print(f"{c.name}: current {base_us:.1f} us err {rows[0]['err']:.2e}", flush=True)
    args = (inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_tables, inputs.seq_lens, inputs.scale, inputs.k_scale, inputs.v_scale)
    for tile, w, st, reg in ((128, 4, 3, None), (128, 4, 3, 168), (64, 4, 3, None), (64, 4, 4, None), (64, 4, 3, 128), (128, 4, 2, None), (64, 4, 2, None)):
        try:
            o = fp8dec.run_hybrid(*args, tile_n=tile, warps=w, stages=st, maxnreg=reg)
            err = (o.float() - expected).abs().max().item()
            us = median_ms(lambda: fp8dec.run_hybrid(*args, tile_n=tile, warps=w, stages=st, maxnreg=reg)) * 1e3
        except Exception as e:
            print(f"  {tile} {w} {st} {reg}: failed {str(e).splitlines()[0][:100]}", flush=True)
            continue
        rows.append(dict(variant=f"hybrid_{tile}_{w}_{st}_{reg}", us=us, err=err, tb_s=nbytes / us / 1e6))
        print(f"  hybrid {tile} {w} {st} maxnreg={reg}: {us:.1f} us ({nbytes / us / 1e6:.2f} TB/s) err {err:.2e}", flush=True)
    out[c.name] = rows
    del inputs, expected
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
