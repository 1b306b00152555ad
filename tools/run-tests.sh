#!/usr/bin/env bash
# README command 2: install what is needed, build, and run every test (ctest). Labels: unit, mpi,
# resume, slurm, cluster (Slurm nodes in namespaces, tests/cluster/), gpu (gpu tests skip without
# a GPU). Extra arguments go to ctest, e.g. -L unit.
# Fails when a test fails, and also when a test outside the gpu label skipped (tools/ctest-skipped.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-debian.sh --slurm
# The Python packages the reference tests need (transformers, torch, tokenizers, safetensors, h5py) live
# in a venv outside the clone, made once (tools/setup-venv.sh); no test skips for want of them.
hf_python=$(bash tools/setup-venv.sh | tail -n 1)
bash tools/build.sh -DGTRAIN_HF_PYTHON="$hf_python"
# The ctest output is kept (build/ctest-output.txt) for the summary of skipped tests at the end.
# -j 2: two tests that mostly wait (tests/light_tests.txt) run side by side; every other one alone.
set +e
(cd build && ctest -j 2 --output-on-failure --timeout 1500 "$@") 2>&1 | tee build/ctest-output.txt
rc=${PIPESTATUS[0]}
set -e
skips=0
bash tools/ctest-skipped.sh build/ctest-output.txt build || skips=1
((rc != 0)) || rc=$skips
exit "$rc"
