#!/usr/bin/env bash
# Prepares the one GPU check for a bare GPU machine (CUDA driver and libraries, maybe PyTorch, but no
# Open MPI, HDF5, OpenBLAS or inih): builds with CUDA for sm_90 into build-gpu/, then packs the
# binaries and their runtime (../shared/tools/bundle-runtime.sh, DESIGN.md's last section) into the
# git-ignored folder .bundle/. On the GPU machine, from the repository root:
#   mkdir -p /tmp/rt && tar -xJf .bundle/rt.tar.xz -C /tmp/rt && \
#     GTRAIN_ENV=/tmp/rt/env.sh BUILD_DIR=.bundle/build bash tests/gpu/run.sh
# (with the device tool: carry [".bundle"]; results land in $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DGTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-gpu -j "$(nproc)" --target gtrain gtrain-prep test_ops_cuda
rm -rf .bundle && mkdir -p .bundle/build/tests
cp build-gpu/gtrain build-gpu/gtrain-prep .bundle/build/
cp build-gpu/tests/test_ops_cuda .bundle/build/tests/
bundle=../shared/tools/bundle-runtime.sh
[[ -x $bundle || -f $bundle ]] || { echo "gpu-prepare: $bundle not found" >&2; exit 1; }
bash "$bundle" .bundle/rt.tar.xz build-gpu/gtrain build-gpu/gtrain-prep build-gpu/tests/test_ops_cuda
du -sh .bundle
