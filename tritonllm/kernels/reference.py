"""Torch references of every kernel, with the launchers' exact signatures.

They define what each kernel computes (tests compare the two on random ragged inputs) and serve
as the `torch_ref` backend for ablations. Written for clarity, computed in float32.
"""

from __future__ import annotations

import torch

# ---- norms, rotary embedding, activation ---------------------------------------------------

# ---- KV cache write and paged attention ----------------------------------------------------

# ---- sampling ------------------------------------------------------------------------------
