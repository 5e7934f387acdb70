"""launch.py's pure-Python parts: the specialisation helpers and Launcher's ordinary path (CPU)."""

from __future__ import annotations

from tritonllm import platform  # noqa: F401  # isort: skip  (switches on the interpreter before triton loads)

import pytest
import torch
import triton
import triton.language as tl

from tritonllm.kernels.launch import Launcher, aligned, int_spec


@triton.jit
def _scale_shift_kernel(x_ptr, out_ptr, n, scale, shift, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale + shift, mask=mask)


def test_int_spec_marks_one_multiples_of_16_and_32_bit_width() -> None:
    assert int_spec(1) == ((True, False, True),)
    assert int_spec(48, 7, 0) == ((False, True, True), (False, False, True), (False, True, True))
    assert int_spec(2**31 - 1, -(2**31)) == ((False, False, True), (False, True, True))
    assert int_spec(2**31, 2**40 + 16) == ((False, True, False), (False, True, False))
    assert int_spec() == ()


def test_aligned_flags_each_pointer_off_a_16_byte_boundary() -> None:
    base = torch.empty(10, dtype=torch.float32)
    assert aligned(base) == (True,)
    assert aligned(base[1:]) == (False,)  # 4 bytes in
    assert aligned(base[4:]) == (True,)  # 16 bytes in
    assert aligned(base, None, base[2:]) == (True, True, False)  # None (an absent optional pointer) counts as aligned
    # which pointer is off the boundary is part of the key: the two launches need different kernels
    assert aligned(base[2:], base) != aligned(base, base[2:])
    assert aligned() == ()


def test_launcher_on_cpu_launches_every_call_through_the_kernel() -> None:
    launcher = Launcher(_scale_shift_kernel)
    gen = torch.Generator().manual_seed(0)
    n = 37
    for call in range(2):
        x = torch.randn(n, generator=gen) + 3.0
        out = torch.empty_like(x)
        key = (x.dtype, aligned(x, out), int_spec(n), 16)
        launcher(key, (triton.cdiv(n, 16),), (x, out, n, 1.5, float(call)), dict(BLOCK=16), num_warps=1, num_stages=1)
        torch.testing.assert_close(out, x * 1.5 + call)


def test_gluon_sm90_availability_probes_compile_and_warns_when_one_fails(monkeypatch) -> None:
    """The availability check every kernels/*_sm90.py module shares: False off an sm90 CUDA GPU or
    without Gluon; on one, True when every probe compiles, else False with a warning naming the kernel."""
    import warnings

    from tritonllm.kernels.launch import gluon_sm90_available

    def broken() -> None:
        raise RuntimeError("no such Gluon op")

    monkeypatch.setattr(platform, "PLATFORM", "rocm")
    assert not gluon_sm90_available(True, "X", "Y", lambda: None)
    monkeypatch.setattr(platform, "PLATFORM", "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert not gluon_sm90_available(False, "X", "Y", lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gluon_sm90_available(True, "X", "Y", lambda: None, lambda: None)
    with pytest.warns(UserWarning, match="skinny GEMM: the sm90 Gluon kernel does not compile.*portable"):
        assert not gluon_sm90_available(True, "skinny GEMM", "the portable kernels serve it", lambda: None, broken)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not gluon_sm90_available(True, "X", "Y", broken)
