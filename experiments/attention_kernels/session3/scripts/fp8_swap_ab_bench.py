import json, sys
sys.path.insert(0, "scripts"); sys.path.insert(0, "experiments/attention_kernels/session3/scripts")
import torch, triton
from bench_attention import CASES, _decode, build_inputs, reference_output, work, median_ms
import fp8_swap_ab_kernel as fp8dec

out = {}
for c in (_decode(128, 8192, "fp8"), _decode(32, 8192, "fp8"), _decode(128, 1024, "fp8"), _decode(1, 8192, "fp8")):
    inputs = build_inputs(c, "cuda", torch.bfloat16)
    expected = reference_output(inputs)
    nbytes, _ = work(c, 1)
    base_us = median_ms(inputs.run) * 1e3
    base_err = (inputs.run().float() - expected).abs().max().item()
    v_std = inputs.v_cache
    nb, bs, h, d = v_std.shape
    v_t = torch.empty(nb, h, d, bs, dtype=v_std.dtype, device=v_std.device).permute(0, 3, 1, 2)
    v_t.copy_(v_std)
    rows = [dict(variant="current", us=base_us, err=base_err)]
    print(f"{c.name}: current {base_us:.1f} us err {base_err:.2e}", flush=True)
    for tile, w, st in ((128, 4, 3), (128, 4, 2), (128, 4, 4), (64, 4, 3), (64, 4, 4), (128, 8, 3), (256, 8, 3), (256, 4, 3)):
        for layout, v in (("std", v_std), ("slot", v_t)):
            args = (inputs.q, inputs.k_cache, v, inputs.block_tables, inputs.seq_lens, inputs.scale, inputs.k_scale, inputs.v_scale)
            try:
                o = fp8dec.run(*args, tile_n=tile, warps=w, stages=st)
                err = (o.float() - expected).abs().max().item()
                us = median_ms(lambda: fp8dec.run(*args, tile_n=tile, warps=w, stages=st)) * 1e3
            except Exception as e:
                print(f"  {tile} {w} {st} {layout}: failed {str(e).splitlines()[0][:100]}", flush=True)
                continue
            rows.append(dict(variant=f"swapab_{tile}_{w}_{st}_{layout}", us=us, err=err, tb_s=nbytes / us / 1e6))
            print(f"  {tile} {w} {st} {layout}: {us:.1f} us ({nbytes / us / 1e6:.2f} TB/s) err {err:.2e}", flush=True)
    out[c.name] = rows
    del inputs, expected, v_t, v_std
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
