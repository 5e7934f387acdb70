"""Two overheads of Triton's CPU interpreter (triton/runtime/interpreter.py), removed for the test suite
without changing what any kernel computes.

1. Every launch patches triton.language's builtins to interpreted ones (`_patch_lang`), finding them with
   `inspect.getmembers` of four namespaces: the names are listed here once, before anything is patched, and
   each launch patches the same members (those whose value is still a builtin) as the original loop would.
2. Every call of a @triton.jit helper from inside a kernel runs `_patch_lang` again (never restored) while
   the launch's own patch is in force: for a helper that sees the same language modules as the kernel
   (always, in this code base) it finds no builtin left to patch and re-sets the tensor and core helpers to
   equivalent functions, so it is skipped. A helper in a module that imports a language module the kernel's
   does not still gets the original call.

Together they were about a third of the interpreter's time in the engine tests; tokens and logprobs are
bit-identical with and without them.

Also `language_restorer`: Triton's interpreter leaves some of its patches in place (a @triton.jit helper called
from Python, or one whose module names a language module its kernel's does not, is patched and never restored),
and a later compilation for a real GPU in the same process (the tests that build sm90 kernels on the CPU) then
meets interpreted builtins ("'block_argument' object has no attribute 'dtype'"). The restorer puts every
patched namespace back as it was before the first test; conftest runs it after each test.
"""

import inspect
import threading

# isort: skip_file
# tritonllm.platform first: it sets TRITON_INTERPRET on the CPU, which must precede Triton's import (a
# triton.language imported before it keeps compiled @jit functions that the interpreter cannot call)
from tritonllm import platform  # noqa: F401
from triton.runtime import interpreter as _interp

_active = threading.local()


def _langs(fn) -> frozenset[int]:
    """The language modules that `fn`'s globals name (those `_patch_lang(fn)` patches)."""
    return frozenset(id(value) for value in fn.__globals__.values() if value is _interp.tl or value is _interp.tl.core)


_MISSING = object()


def language_restorer():
    """A callable that puts triton.language's namespaces (those the interpreter patches) back to their state now."""
    tl = _interp.tl
    spaces = [tl, tl.core, tl.math, tl.tensor, tl.dtype, tl.core.condition, tl.core.tensor_descriptor_base]
    saved = [(space, dict(vars(space))) for space in spaces]

    def restore() -> None:
        for space, before in saved:
            now = vars(space)
            for name in [n for n in now if n not in before and n != "__annotations__"]:
                delattr(space, name)
            for name, value in before.items():
                if now.get(name, _MISSING) is not value:
                    setattr(space, name, value)

    return restore


def install() -> None:
    if getattr(_interp, "_tritonllm_tests_fast_calls", False):
        return
    original_patch_lang = _interp._patch_lang
    grid_call = _interp.GridExecutor.__call__

    def patched_grid_call(self, *args, **kwargs):
        stack = _active.__dict__.setdefault("stack", [])
        stack.append(_langs(self.fn))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            stack.pop()

    def device_call(self, *args, **kwargs):
        stack = getattr(_active, "stack", None)
        if not stack or not _langs(self.fn) <= stack[-1]:
            original_patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise _interp.InterpreterError(repr(e)) from e

    tl = _interp.tl
    # the names of each patched namespace's builtins, listed once while nothing is patched (inspect.getmembers
    # of triton.language on every launch was a fifth of the interpreter's time); the loop below then patches
    # exactly what the original's getmembers loop would: the members that are still builtins
    builtin_names = {}
    for pkg in (tl, tl.tensor, tl.math, tl.core, tl.core.tensor, tl.core.tensor_descriptor_base):
        builtin_names[id(pkg)] = [name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
    original_patch_builtin = _interp._patch_builtin

    def patch_builtin(pkg, builder, scope):
        names = builtin_names.get(id(pkg))
        if names is None:
            return original_patch_builtin(pkg, builder, scope)
        for name in names:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):
                _interp._patch_attr(pkg, name, member, builder, scope)

    _interp._patch_builtin = patch_builtin
    _interp.GridExecutor.__call__ = patched_grid_call
    _interp.InterpretedFunction.__call__ = device_call
    _interp._tritonllm_tests_fast_calls = True
