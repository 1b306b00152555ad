#!/usr/bin/env bash
# test_cudnn_graph with a device description (tests/gpu/h200-device.json), without a GPU: cuDNN's
# heuristics and plan compilation for an H200 must take the cudnn attention graphs up to the point
# where loading the compiled kernel needs a driver. cuDNN's runtime compiler wants libcuda.so.1 to be
# loadable, so without a driver the toolkit's stub stands in for it (every driver call then fails,
# which is the expected end point); with a driver present the real one is used and the plans build.
# Skipped (77) without libcudnn (>= 9.8), without the stub and a driver, or when libnvrtc is missing.
#   cudnn_graph_aot.sh TEST_BINARY DEVICE_JSON CUDA_LIB_DIR WORKDIR
set -uo pipefail
bin=$1 json=$2 cudalib=$3 work=$4
rm -rf "$work" && mkdir -p "$work" || exit 1
if ! ldconfig -p 2> /dev/null | grep -q 'libcuda\.so\.1 '; then
    stub="$cudalib/stubs/libcuda.so"
    [[ -e $stub ]] || { echo "SKIP: no driver and no stub libcuda at $stub"; exit 77; }
    ln -s "$stub" "$work/libcuda.so.1"
    export LD_LIBRARY_PATH="$work${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
out=$("$bin" "$json" 2>&1)
rc=$?
echo "$out"
# the runtime compiler itself missing (no libnvrtc): not what this test is about
if [[ $rc != 0 ]] && grep -q "no engine config" <<< "$out" && ! grep -q "compiled for" <<< "$out"; then
    echo "SKIP: cuDNN offered no engine (libnvrtc missing?)"
    exit 77
fi
exit $rc
