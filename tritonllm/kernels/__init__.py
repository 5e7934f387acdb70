"""Triton kernels, one op per module, each with a torch reference in `reference.py`.

Layers call them through the engine's `registry.Kernels` (each op's chosen implementation).
"""

from tritonllm import platform  # noqa: F401  (must run before triton is imported)
