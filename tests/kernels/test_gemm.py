"""The GEMM family and activation quantization against float32 references of their operands.

Each GEMM gets operands already quantized (by the torch reference), so its output is compared with
dequant(a) @ dequant(b).T computed in float32: the tolerance is that of the accumulation only,
relative to the output's scale. Shapes are ragged (M, N, K not multiples of the tiles); split-K is
forced on to cover the workspace path, which the CPU's one "SM" never picks by itself.
"""

from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn as _randn  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import gemm_dequant, reference
from tritonllm.kernels.quant import fp8_grid, quantize_per_group, quantize_per_token
from tritonllm.kernels.quant_formats import (
    E2M1_VALUES,
    FP4,
    INT4,
    UINT8,
    QuantizedWeight,
    QuantScheme,
    pack_int4,
    unpack_int4,
)
from tritonllm.quantization.quantize import quantize_weight

# on a GPU every test here is also a GPU test (`-m gpu`), in bfloat16
pytestmark = [pytest.mark.gpu] if platform.is_gpu() else []
DEVICE = platform.DEVICE
FP8 = torch.float8_e4m3fn if platform.PLATFORM != "rocm" else torch.float8_e4m3fnuz
MODEL_DTYPE = platform.DEFAULT_DTYPE


SCHEMES = [
    QuantScheme(FP8, "channel", "token"),
    QuantScheme(FP8, "channel", "tensor"),
    QuantScheme(FP8, "channel", "none"),
    QuantScheme(FP8, "block", "group"),
    QuantScheme(FP8, "block", "none"),
    QuantScheme(torch.int8, "channel", "token"),
    QuantScheme(torch.int8, "channel", "tensor"),
    QuantScheme(torch.int8, "channel", "none"),
    QuantScheme(FP8, "mx", "mx"),
]
# (M, N, K): ragged M and N; K a multiple of 128 where block scales need it, else ragged
SHAPES = [(19, 45, 256), (1, 130, 384), (33, 200, 128)]


@pytest.mark.parametrize("m, n, k", [(19, 45, 72), (1, 70, 200), (40, 33, 48)])
@pytest.mark.parametrize("split_k", [1, 3])
def test_float_gemm_matches_float32_matmul(m, n, k, split_k) -> None:
    a, b, bias = _randn(m, k, seed=1, dtype=MODEL_DTYPE), _randn(n, k, seed=2, dtype=MODEL_DTYPE), _randn(n, seed=3)
    got = g.gemm(a, b, bias.to(MODEL_DTYPE), split_k=split_k)
    expected = a.float() @ b.float().T + bias.to(MODEL_DTYPE).float()
    assert_close_to_scale(got, expected, 1e-5 if MODEL_DTYPE == torch.float32 else 1e-2)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.format_name)
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("split_k", [1, 2])
def test_quantized_gemm_matches_its_dequantized_operands(scheme, m, n, k, split_k) -> None:
    x = _randn(m, k, seed=4, dtype=MODEL_DTYPE)
    weight = quantize_weight(_randn(n, k, seed=5), scheme)
    if scheme.act == "tensor":
        weight.input_scale = (x.float().abs().amax() / 100).reshape(1)  # some values saturate, as in use
    bias = _randn(n, seed=6, dtype=MODEL_DTYPE)
    w = reference.dequantize_weight(weight)
    if scheme.act == "none":
        a, a_scale, expected_a = x, None, x.float()
    else:
        a, a_scale = reference.quantize_activation(x, scheme, weight.input_scale)
        expected_a = reference.dequantize_activation(a, a_scale, scheme)
    got = g.gemm(a, weight.data, bias, out_dtype=MODEL_DTYPE, a_scale=a_scale, b_scale=weight.scale, split_k=split_k,
                 **g.scale_args(scheme))  # fmt: skip
    expected = expected_a @ w.T + bias.float()
    assert_close_to_scale(got, expected, 1e-5 if MODEL_DTYPE == torch.float32 else 1e-2)


@pytest.mark.parametrize("m, n, k", [(1, 130, 384), (5, 45, 256), (16, 200, 640)])
@pytest.mark.parametrize("split_k", [1, 2])
def test_per_channel_weights_take_activations_scaled_per_group(m, n, k, split_k) -> None:
    """FP8 per-channel weights with activations quantized per 1 x 128 group (linear's input_quant at decode
    sizes): each K tile's product scaled by its group's scales (A_GROUP), the weight's in the epilogue; reading
    the first group's scale for every group (a per-token GEMM) is caught."""
    from fp8_operands import fp8_operands  # this folder

    q, scale, weight, expected = fp8_operands(m, n, k, seed=9, groups=True)
    args = dict(out_dtype=MODEL_DTYPE, a_scale=scale, b_scale=weight.scale, b_scale_kind=g.B_COLUMN, split_k=split_k)
    got = g.gemm(q, weight.data, None, a_scale_kind=g.A_GROUP, group_k=128, **args)
    assert_close_to_scale(got, expected, 1e-5 if MODEL_DTYPE == torch.float32 else 1e-2)
    per_token = g.gemm(q, weight.data, None, **{**args, "a_scale": scale[:, :1].contiguous()}, a_scale_kind=g.A_ROW)
    with pytest.raises(AssertionError):
        assert_close_to_scale(per_token, expected, 1e-2)


def test_input_quant_asks_fp8_per_channel_layers_for_groups_at_decode_sizes() -> None:
    """linear's input_quant (triton, triton_sm90): 1 x 128 groups for FP8 per-channel / per-token layers whose K
    holds whole groups, up to GROUP_INPUT_MAX_M rows; None (the scheme's own) for anything else."""
    from tritonllm.kernels import linear
    from tritonllm.kernels.quant_formats import OutputQuant

    token = QuantScheme(FP8, "channel", "token")
    w = quantize_weight(_randn(64, 256, seed=10), token)
    assert linear.input_quant(1, w) == linear.input_quant(16, w) == OutputQuant(FP8, None, 128)
    assert linear.input_quant(linear.GROUP_INPUT_MAX_M + 1, w) is None
    assert linear.input_quant(1, quantize_weight(_randn(64, 200, seed=11), token)) is None  # K = 200: a part group
    for other in (QuantScheme(FP8, "block", "group"), QuantScheme(torch.int8, "channel", "token"),
                  QuantScheme(FP8, "channel", "tensor")):  # fmt: skip
        assert linear.input_quant(1, quantize_weight(_randn(64, 256, seed=12), other)) is None


def test_a_gemm_that_drops_the_weight_scale_is_caught() -> None:
    """Negative check: the comparison above fails for a GEMM that skips the column scales."""
    scheme = QuantScheme(FP8, "channel", "token")
    x, weight = _randn(19, 256, seed=7), quantize_weight(_randn(45, 256, seed=8), scheme)
    a, a_scale = reference.quantize_activation(x, scheme)
    got = g.gemm(a, weight.data, None, out_dtype=torch.float32, a_scale=a_scale, a_scale_kind=g.A_ROW)
    expected = reference.dequantize_activation(a, a_scale, scheme) @ reference.dequantize_weight(weight).T
    with pytest.raises(AssertionError):
        assert_close_to_scale(got, expected, 1e-5)


@pytest.mark.parametrize("dtype", [FP8, torch.int8], ids=["fp8", "int8"])
def test_per_token_quantization_matches_the_reference(dtype) -> None:
    x = _randn(13, 300, seed=9) * torch.linspace(0.1, 10, 13, device=DEVICE)[:, None]
    x[3] = 0.0  # an all-zero row
    scheme = QuantScheme(dtype, "channel", "token")
    q, scale = quantize_per_token(x.to(MODEL_DTYPE), dtype)
    ref_q, ref_scale = reference.quantize_activation(x.to(MODEL_DTYPE), scheme)
    torch.testing.assert_close(scale, ref_scale, rtol=1e-6, atol=0)
    # a value on a rounding boundary may round the other way (float division differs by an ulp)
    assert (q.float() != ref_q.float()).float().mean() < 0.01
    assert_close_to_scale(reference.dequantize_activation(q, scale, scheme), x, 0.07 if dtype == FP8 else 0.01)


def test_static_per_tensor_quantization_saturates() -> None:
    x = _randn(5, 64, seed=10).to(MODEL_DTYPE)
    static = torch.tensor([0.001], device=DEVICE)
    q, scale = quantize_per_token(x, FP8, static)
    assert scale is static
    assert q.float().abs().max() == torch.finfo(FP8).max


@pytest.mark.parametrize("mx", [False, True], ids=["group128", "mx32"])
def test_group_quantization_matches_the_reference(mx) -> None:
    k = 320 if mx else 384
    x = _randn(7, k, seed=11).to(MODEL_DTYPE)
    scheme = QuantScheme(FP8, "mx", "mx") if mx else QuantScheme(FP8, "block", "group")
    q, scale = quantize_per_group(x, FP8, 32 if mx else 128, mx=mx)
    ref_q, ref_scale = reference.quantize_activation(x, scheme)
    assert scale.dtype == ref_scale.dtype and scale.shape == ref_scale.shape
    if mx:
        assert torch.equal(scale, ref_scale)  # exponents: exact
    else:
        torch.testing.assert_close(scale, ref_scale, rtol=1e-6, atol=0)
    assert (q.float() != ref_q.float()).float().mean() < 0.01
    assert_close_to_scale(reference.dequantize_activation(q, scale, scheme), x.float(), 0.07)


@pytest.mark.parametrize("family", ["hopper", "ampere", "cdna"])
def test_every_table_entry_fits_shared_memory_for_every_operand_width(family) -> None:
    """float32 operands need twice the bytes the tables were written for (an H200 refused 288 KiB)."""
    for kind, buckets in g.GEMM_TABLES[family].items():
        for _, tiles in buckets:
            for a_bytes, b_bytes in ((4, 4), (2, 2), (1, 1), (2, 1)):
                fitted = g.fit_shared_memory(tiles, a_bytes, b_bytes, family)
                need = fitted.num_stages * fitted.block_k * (fitted.block_m * a_bytes + fitted.block_n * b_bytes)
                assert need <= g.SHARED_MEMORY_BYTES[family], (family, kind, tiles, fitted)
                assert fitted.block_k >= 32 and fitted.num_stages >= 2 or fitted == tiles


def test_e4m3fn_bytes_decode_to_their_values_for_gpus_without_fp8() -> None:
    """Weight-only FP8 on GPUs without FP8 conversions (NVIDIA before sm89): the kernel decodes the
    bytes with integer arithmetic; every finite e4m3fn value, through a GEMM with the identity."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)  # all but NaN
    values = codes.view(torch.float8_e4m3fn).float()
    n = codes.numel()  # 254 weight rows, one code each, against K = 32 identity-like activations
    weight = torch.zeros(n, 32, dtype=torch.uint8)
    weight[:, 0] = codes
    x = torch.zeros(1, 32, dtype=MODEL_DTYPE)
    x[0, 0] = 1.0
    got = g.gemm(x.to(DEVICE), weight.to(DEVICE), None, out_dtype=torch.float32)
    torch.testing.assert_close(got[0].cpu(), values, rtol=0, atol=0)
    # and through the weight-only scheme with per-channel scales, against the dequantized weight
    scheme = QuantScheme(FP8, "channel", "none")
    q = quantize_weight(_randn(45, 256, seed=12), scheme)
    xs = _randn(19, 256, seed=13, dtype=MODEL_DTYPE)
    out = g.gemm(xs, q.data.view(torch.uint8), None, b_scale=q.scale, b_scale_kind=g.B_COLUMN)
    assert_close_to_scale(
        out, xs.float() @ reference.dequantize_weight(q).T, 1e-5 if MODEL_DTYPE == torch.float32 else 1e-2
    )


@pytest.mark.parametrize(
    "scheme",
    [
        None,
        QuantScheme(FP8, "channel", "token"),
        QuantScheme(torch.int8, "channel", "tensor"),
        QuantScheme(FP8, "block", "group"),
    ],
    ids=["float", "fp8", "int8-static", "fp8-block"],
)
def test_the_persistent_descriptor_kernel_matches_its_operands(scheme, monkeypatch) -> None:
    """GemmTiles(persistent=True): tiles walked by one program per SM through tensor descriptors;
    ragged M and N (the descriptors read zeros and clip stores at the edges)."""
    launched = []
    launch = g._launch_persistent
    monkeypatch.setattr(g, "_launch_persistent", lambda *args: launched.append(1) or launch(*args))
    block = scheme is not None and scheme.weight_scale == "block"
    # block-FP8: one 128-deep K tile per scale group, 200 columns = two whole 128-row groups and a ragged one
    tiles = g.GemmTiles(32, 64, 128 if block else 32, 4, 3, 4, 1, persistent=True)
    m, n, k = (37, 200, 384) if block else (37, 72, 96)
    x, bias = _randn(m, k, seed=14, dtype=MODEL_DTYPE), _randn(n, seed=15, dtype=MODEL_DTYPE)
    if scheme is None:
        w = _randn(n, k, seed=16, dtype=MODEL_DTYPE)
        got = g.gemm(x, w, bias, tiles=tiles)
        expected = x.float() @ w.float().T + bias.float()
    else:
        weight = quantize_weight(_randn(n, k, seed=16), scheme)
        if scheme.act == "tensor":
            weight.input_scale = (x.float().abs().amax() / 100).reshape(1)
        a, a_scale = reference.quantize_activation(x, scheme, weight.input_scale)
        got = g.gemm(a, weight.data, bias, out_dtype=MODEL_DTYPE, a_scale=a_scale, b_scale=weight.scale,
                     tiles=tiles, **g.scale_args(scheme))  # fmt: skip
        expected = reference.dequantize_activation(a, a_scale, scheme) @ reference.dequantize_weight(weight).T
        expected = expected + bias.float()
    assert_close_to_scale(got, expected, 1e-5 if MODEL_DTYPE == torch.float32 else 1e-2)
    assert launched, "the persistent kernel did not run"


def test_tuned_tiles_come_from_the_gpus_file_by_shape_and_m_bucket() -> None:
    """kernels/tuned/NVIDIA_H200.json: M takes the winner of the smallest tuned M >= M (the skinny suite's 1, 4,
    16, 64 and the mid suite's 128, 256, 512); larger M, untuned shapes and GPUs without a file take the M-bucket
    tables."""
    tuned = json.loads((g.TUNED_DIR / "NVIDIA_H200.json").read_text())
    shape = "4096,14336"
    assert sorted(map(int, tuned["float"][shape])) == [1, 4, 16, 64, 128, 256, 512]
    for m, bucket in [(1, "1"), (2, "4"), (4, "4"), (5, "16"), (16, "16"), (17, "64"), (64, "64"), (65, "128"),
                      (300, "512"), (512, "512")]:  # fmt: skip
        tiles, split = g.tuned_tiles("float", m, 4096, 14336, "NVIDIA H200")
        entry = tuned["float"][shape][bucket]
        assert (tiles.block_m, tiles.block_n, tiles.block_k, split) == (
            entry["block_m"], entry["block_n"], entry["block_k"], entry["split"]
        )  # fmt: skip
    assert g.tuned_tiles("float", g.TUNED_MAX_M + 1, 4096, 14336, "NVIDIA H200") is None
    assert g.tuned_tiles("float", 1, 4096, 1234, "NVIDIA H200") is None
    assert g.tuned_tiles("float", 1, 4096, 14336, "Some Other GPU") is None


def test_tuned_tiles_do_not_reach_below_the_swept_ms(monkeypatch) -> None:
    """A file whose shape holds only the prefill buckets (the H100's FP8 mid sweep) serves M down to half its
    smallest tuned M (65-128 -> 128), and leaves decode-sized M to the tables."""
    entry = {"block_m": 64, "block_n": 128, "block_k": 256, "num_warps": 4, "num_stages": 3, "group_m": 8,
             "max_split_k": 1, "persistent": False, "gemv": False, "dequant": False, "split": 1}  # fmt: skip
    tuned = {"w8a8": {"6144,4096": {"128": entry, "512": {**entry, "block_m": 128}}}}
    monkeypatch.setattr(g, "_tuned_file", lambda name: tuned)
    assert g.tuned_tiles("w8a8", 65, 6144, 4096, "GPU")[0].block_m == 64
    assert g.tuned_tiles("w8a8", 300, 6144, 4096, "GPU")[0].block_m == 128
    for m in (1, 16, 64):
        assert g.tuned_tiles("w8a8", m, 6144, 4096, "GPU") is None


@pytest.mark.parametrize(
    "scheme, m, n, k",
    [
        (scheme, *shape)
        for scheme in [None, *SCHEMES[:-1]]
        for shape in [(1, 130, 384), (3, 45, 256), (2, 33, 200)]
        if not (scheme is not None and scheme.weight_scale == "block" and shape[2] % 128)  # 128-groups need it
    ],
    ids=lambda v: (v.format_name if v is not None else "float") if not isinstance(v, int) else str(v),
)
@pytest.mark.parametrize("split_k", [1, 2])
def test_the_gemv_kernel_matches_its_operands(scheme, m, n, k, split_k, monkeypatch) -> None:
    """GemmTiles(gemv=True) at decode-sized M: one program per (activation row, weight tile), the
    weight tile in registers; every scheme but MX (whose operand scales keep the tile kernel), ragged
    N, K not a multiple of the K tile where no 128-group needs it, with and without K splits."""
    spy = LaunchSpy.install(monkeypatch, g, "gemv_kernel")
    tiles = g.GemmTiles(1, 32, 64, 4, 2, 1, 1, gemv=True)
    x, bias = _randn(m, k, seed=17, dtype=MODEL_DTYPE), _randn(n, seed=18, dtype=MODEL_DTYPE)
    if scheme is None:
        w = _randn(n, k, seed=19, dtype=MODEL_DTYPE)
        got = g.gemm(x, w, bias, tiles=tiles, split_k=split_k)
        expected = x.float() @ w.float().T + bias.float()
    else:
        weight = quantize_weight(_randn(n, k, seed=19), scheme)
        if scheme.act == "tensor":
            weight.input_scale = (x.float().abs().amax() / 100).reshape(1)
        if scheme.act == "none":
            a, a_scale, expected_a = x, None, x.float()
        else:
            a, a_scale = reference.quantize_activation(x, scheme, weight.input_scale)
            expected_a = reference.dequantize_activation(a, a_scale, scheme)
        got = g.gemm(a, weight.data, bias, out_dtype=MODEL_DTYPE, a_scale=a_scale, b_scale=weight.scale,
                     tiles=tiles, split_k=split_k, **g.scale_args(scheme))  # fmt: skip
        expected = expected_a @ reference.dequantize_weight(weight).T + bias.float()
    assert_close_to_scale(got, expected, 1e-5 if MODEL_DTYPE == torch.float32 else 1e-2)
    assert spy.launches == 1, "the GEMV kernel did not run"


INT4_SCHEMES = [QuantScheme(INT4, "group", "none", group_size=gs) for gs in (32, 128)]
# weights decoded in the kernel: 4-bit pairs and 8-bit values with group scales and zero points (groups
# narrower than BLOCK_K, 64 here: several per tile, each scale broadcast; and wider: one per tile), MXFP4
DECODED_SCHEMES = [
    *INT4_SCHEMES,
    QuantScheme(UINT8, "group", "none", group_size=16),
    QuantScheme(UINT8, "group", "none", group_size=128),
    QuantScheme(FP4, "mx", "none"),
]


@pytest.mark.parametrize("scheme", DECODED_SCHEMES, ids=lambda s: f"{s.format_name}-g{s.group_size}")
@pytest.mark.parametrize("m, n, k", [(1, 130, 384), (19, 45, 256)])
# dequantize-then-GEMM runs the float GEMM, whose K splits the float tests cover
@pytest.mark.parametrize("kernel, split_k", [("tile", 1), ("tile", 2), ("gemv", 1), ("gemv", 2), ("dequant", 1)])
def test_decoded_weight_gemm_matches_its_dequantized_weight(scheme, m, n, k, kernel, split_k) -> None:
    """Weights decoded in registers (int4 pairs, 8-bit values, per-group scales and zero points;
    MXFP4 e2m1 pairs with e8m0 scales): the tile kernel, the GEMV and dequantize-then-GEMM, ragged N,
    with and without K splits, against x @ dequant(w).T."""
    x, bias = _randn(m, k, seed=20, dtype=MODEL_DTYPE), _randn(n, seed=21, dtype=MODEL_DTYPE)
    weight = quantize_weight(_randn(n, k, seed=22), scheme)
    tiles = {
        "gemv": g.GemmTiles(1, 32, 64, 4, 2, 1, 1, gemv=True),
        "tile": g.GemmTiles(16, 32, 64, 4, 2, 4, 1),
        "dequant": g.GemmTiles(16, 32, 64, 4, 2, 4, 1, dequant=True),
    }[kernel]
    got = g.gemm(x, weight.data, bias, b_scale=weight.scale, b_zero=weight.zeros, tiles=tiles, split_k=split_k,
                 **g.scale_args(scheme))  # fmt: skip
    expected = x.float() @ reference.dequantize_weight(weight).T + bias.float()
    assert_close_to_scale(got, expected, 1e-5 if MODEL_DTYPE == torch.float32 else 1e-2)


@pytest.mark.parametrize("scheme", [*INT4_SCHEMES, QuantScheme(FP4, "mx", "none")],
                         ids=lambda s: f"{s.format_name}-g{s.group_size}")  # fmt: skip
@pytest.mark.parametrize("tiles", [gemm_dequant.TILES, (32, 128, 4), (16, 64, 2), (128, 512, 8)], ids=str)
def test_the_dequantize_pass_at_any_tile_matches_the_reference(scheme, tiles, monkeypatch) -> None:
    """gemm_dequant.dequantize (the 4-bit prefill's pass) at its default tile and at the ones its sweep times
    (experiments/quant4/dequant): tiles inside a group, of several groups, past K (384) and N (45)."""
    monkeypatch.setattr(gemm_dequant, "TILES", tiles)
    weight = quantize_weight(_randn(45, 384, seed=23), scheme)
    args = g.scale_args(scheme)
    got = gemm_dequant.dequantize(weight.data, weight.scale, weight.zeros, 384, args["b_decode"], args["group_k"],
                                  torch.float32)  # fmt: skip
    torch.testing.assert_close(got.cpu(), reference.dequantize_weight(weight).cpu(), rtol=1e-6, atol=1e-6)


def test_mxfp4_codes_decode_to_the_e2m1_values_times_their_scale() -> None:
    """Every e2m1 code under several e8m0 scales, through the kernel (x = identity picks out each
    weight column) and the reference; values already on the MXFP4 grid quantize back exactly."""
    codes = torch.arange(16, dtype=torch.uint8).repeat(6, 4)  # [6, 64]: two 32-groups a row
    exps = torch.tensor([[127, 120], [130, 127], [104, 150], [127, 127], [100, 140], [127, 126]], dtype=torch.uint8)
    weight = QuantizedWeight(QuantScheme(FP4, "mx", "none"), pack_int4(codes).to(DEVICE), exps.to(DEVICE))
    values = torch.tensor(E2M1_VALUES).repeat(6, 4) * torch.exp2(exps.float() - 127).repeat_interleave(32, 1)
    assert torch.equal(reference.dequantize_weight(weight).cpu(), values)
    eye = torch.eye(64, device=DEVICE)
    got = g.gemm(eye, weight.data, b_scale=weight.scale, **g.scale_args(weight.scheme)).T.cpu()
    assert torch.equal(got, values)
    grid = values[3:4].to(DEVICE)  # scale 1: the values themselves
    assert torch.equal(reference.dequantize_weight(quantize_weight(grid, weight.scheme)), grid)


def test_int4_quantization_round_trips_within_half_a_step() -> None:
    """quantize_weight's int4: every value within half a quantization step of the float weight, the
    nibble order as pack_int4 writes it, and a kernel that dropped the zero points is caught."""
    scheme = INT4_SCHEMES[1]
    w = _randn(40, 256, seed=23)
    q = quantize_weight(w, scheme)
    step = q.scale.repeat_interleave(128, 1)
    assert ((reference.dequantize_weight(q) - w.float()).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(
        unpack_int4(pack_int4(torch.arange(16).repeat(3, 2))), torch.arange(16).repeat(3, 2).to(torch.uint8)
    )
    x = _randn(5, 256, seed=24, dtype=MODEL_DTYPE)
    no_zeros = g.gemm(x, q.data, b_scale=q.scale, b_zero=torch.zeros_like(q.zeros), **g.scale_args(scheme))
    expected = x.float() @ reference.dequantize_weight(q).T
    with pytest.raises(AssertionError):
        assert_close_to_scale(no_zeros, expected, 1e-2)


@triton.jit
def _fp8_conversions(v_ptr, hw_ptr, grid_ptr, N: tl.constexpr):
    v = tl.load(v_ptr + tl.arange(0, N))
    tl.store(hw_ptr + tl.arange(0, N), v.to(hw_ptr.dtype.element_ty))
    tl.store(grid_ptr + tl.arange(0, N), fp8_grid(v, -6).to(grid_ptr.dtype.element_ty))


@pytest.mark.gpu
@pytest.mark.skipif(not (platform.is_gpu() and platform.has_fp8()), reason="hardware FP8 conversion")
def test_hardware_fp8_conversion_equals_the_grid_rounding() -> None:
    """quant.round_and_store converts with the hardware on FP8 GPUs (HW_FP8_CVT) and rounds onto e4m3's
    grid first elsewhere: the two agree bit for bit on every e4m3 value, every midpoint between two
    neighbours (ties to even), values just beside them, subnormals and random values within +-448."""
    grid = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = grid[grid.isfinite()].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    v = torch.cat([grid, mids, mids.nextafter(grid[1:]), mids.nextafter(grid[:-1]), _randn(4096, seed=12).cpu() * 100])
    v = v.clamp(-448, 448)
    v = torch.cat([v, torch.zeros(8192 - v.numel())]).to(DEVICE)
    hw, by_grid = torch.empty(8192, dtype=FP8, device=DEVICE), torch.empty(8192, dtype=FP8, device=DEVICE)
    _fp8_conversions[(1,)](v, hw, by_grid, N=8192)
    differ = (hw.view(torch.uint8) != by_grid.view(torch.uint8)).nonzero().flatten()[:8].cpu()
    assert differ.numel() == 0, [(v[i].item(), hw[i].item(), by_grid[i].item(), v[i].to(FP8).item()) for i in differ]
    assert torch.equal(hw.float(), v.to(FP8).float())  # torch's conversion too


@pytest.mark.parametrize("path", sorted(p.name for p in g.TUNED_DIR.glob("NVIDIA_*.json")))
def test_every_committed_tuned_file_reads_as_tiles(path: str) -> None:
    """Each kernels/tuned/<GPU>.json names its GPU, holds only kinds the GEMMs look up, and every entry (at a tuned
    M within TUNED_MAX_M) reads back as GemmTiles with a K split (the tuner ran each as stored, so no refit)."""
    tuned = json.loads((g.TUNED_DIR / path).read_text())
    assert tuned["device"].replace(" ", "_") + ".json" == path
    kinds = [kind for kind in tuned if isinstance(tuned[kind], dict)]
    assert kinds and set(kinds) <= {"float", "w8a8", "block", "w4a16"}, kinds
    for kind in kinds:
        for shape, buckets in tuned[kind].items():
            n, k = map(int, shape.split(","))
            for m in map(int, buckets):
                assert 1 <= m <= g.TUNED_MAX_M
                tiles, split = g.tuned_tiles(kind, m, n, k, tuned["device"])
                assert split >= 1 and tiles.block_m * tiles.block_n * tiles.block_k > 0
