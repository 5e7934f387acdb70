"""sm90 builds from a test that runs under the interpreter: the builds need TRITON_INTERPRET unset, so they
run in a subprocess that prints one JSON line last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sm90_build_report(code: str) -> dict:
    """Run `code` (sm90 builds that print one JSON line last) in a subprocess without the interpreter, from the
    repository root, and return that line's object."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
