"""Triton kernels, one op per module, each with a torch reference in `reference.py`.

Call ops through `tritonllm.kernels.ops` so that the configured backend serves them.
"""

from tritonllm import platform  # noqa: F401  (must run before triton is imported)
