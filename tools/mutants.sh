#!/usr/bin/env bash
# The mutation harness: each curated bug of tests/mutants/*.mutant put into the tree in turn, an
# incremental CPU build in build-mutants/, the tests the mutant names, one table of what caught it.
# Exit 1 on any mutant NOT CAUGHT, STALE (its anchor text moved) or BUILD FAILED.
# Usage: tools/mutants.sh [--only NAME]... [--list]. It edits the source tree while it runs (every file
# is restored, also on Ctrl-C): do not build or edit this checkout meanwhile. docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
py=/opt/gtrain-venv/bin/python
[[ -x $py ]] || py=python3   # the tests labelled hf need the venv; the harness itself only python3
cmake -S . -B build-mutants -DCMAKE_BUILD_TYPE=Release -DGTRAIN_CUDA=OFF -DGTRAIN_HF_PYTHON="$py" >/dev/null
exec python3 tools/mutants.py --build build-mutants "$@"
