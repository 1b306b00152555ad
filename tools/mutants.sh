#!/usr/bin/env bash
# The mutation harness: each curated bug of tests/mutants/*.mutant put in turn into a copy of the tree
# (build-mutants/tree-K), an incremental CPU build of that copy, the tests the mutant names, one table
# of what caught it. Two copies take the mutants side by side (a mutant whose tests need the whole
# machine, a test cluster or Slurm runs alone at the end). Exit 1 on any mutant NOT CAUGHT, STALE (its
# anchor text moved) or BUILD FAILED. The checkout itself is never edited.
# Usage: tools/mutants.sh [--only NAME]... [--list] [--jobs N]. docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
py=/opt/gtrain-venv/bin/python
[[ -x $py ]] || py=python3   # the tests labelled hf need the venv; the harness itself only python3
exec python3 tools/mutants.py --build build-mutants --jobs 2 \
  --configure "-DCMAKE_BUILD_TYPE=Release -DGTRAIN_CUDA=OFF -DGTRAIN_HF_PYTHON=$py" "$@"
