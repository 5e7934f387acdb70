"""The 4-bit weight schemes the W4 GEMV tests sweep (int4 with scale groups of 32, 64 and 128 columns, MXFP4), and
their test ids."""

from __future__ import annotations

from tritonllm.kernels.quant_formats import FP4, INT4, QuantScheme

SCHEMES = [
    QuantScheme(INT4, "group", "none", group_size=32),
    QuantScheme(INT4, "group", "none", group_size=64),
    QuantScheme(INT4, "group", "none", group_size=128),
    QuantScheme(FP4, "mx", "none"),
]


def scheme_id(scheme: QuantScheme) -> str:
    """A parametrized test's id for a scheme: "int4-g128", "mxfp4-gNone"."""
    return f"{scheme.format_name}-g{scheme.group_size}"
