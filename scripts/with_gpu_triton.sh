#!/usr/bin/env bash
# Run a command (from the repository root) against another Triton than the venv's: the lent GPU image's
# (3.6.0 in December 2026; its env.txt from scripts/gpu_check.sh names it), put in /tmp/triton-$VERSION
# from the package index once. The sm90 builds (tests named *compiles*, scripts/cross_compile_*.py) then
# catch what only the GPU's Triton rejects (a Gluon jit function returning a layout; a tile spilling)
# before a GPU session is spent on it. The interpreter tests are not meant for it (old Triton, new numpy).
#   bash scripts/with_gpu_triton.sh [VERSION] -- python -m pytest -q -k compil tests/kernels
set -euo pipefail
VERSION=3.6.0
if [ "${1:-}" != "--" ]; then VERSION=$1; shift; fi
[ "${1:-}" = "--" ] && shift
DIR=/tmp/triton-$VERSION
if [ ! -d "$DIR/triton" ]; then
  python -m pip download -q --no-deps "triton==$VERSION" -d "$DIR.whl"
  python -m pip install -q --no-deps --target "$DIR" "$DIR.whl"/triton-*.whl
fi
TRITON_INTERPRET=0 PYTHONPATH="$DIR${PYTHONPATH:+:$PYTHONPATH}" exec "$@"
