#!/usr/bin/env bash
# tools/bundle-runtime.sh — builds gtrain with CUDA (sm_90) and packs a portable runtime for a bare GPU
# machine: one that has a CUDA driver, the CUDA 13 and NCCL libraries (and maybe PyTorch) but no
# Open MPI, HDF5, OpenBLAS or inih.
#
#   bash tools/bundle-runtime.sh [--no-build] [--check] [OUT.tar.gz]    (default .bundle/gtrain-runtime.tar.gz)
#
# What goes in (all from this machine; nothing outside the repository is read but the system's own
# libraries):
#   bin/    gtrain, gtrain-prep, gtrain-sample            } `cmake --install build-gpu --component
#   tests/  test_ops_cuda, test_comm, bench_ops_cuda      }  runtime`: CMake's runtime dependency
#   lib/    every shared library they need                }  set puts the libraries in lib/
#   usr/    Open MPI's plugins (mca_*.so), help files and launchers (orted, orterun, mpirun), and
#           PMIx's plugins, in the layout of the system's installation, so that OPAL_PREFIX=$D/usr
#           relocates Open MPI onto them; the plugins' own dependencies go to lib/
#   env.sh  sets PATH, LD_LIBRARY_PATH (the bundle's lib/, then wherever libcudart.so.13,
#           libcublasLt.so.13 and libnccl.so.2 are on that machine), OPAL_PREFIX, PMIx's prefix, the
#           MCA choices of Debian's /etc/openmpi (which does not travel) and root permission for mpirun
# Left out on purpose: glibc (the target's must be as new or newer: Debian 12 builds need 2.36) and the
# CUDA/NCCL libraries, which belong with that machine's driver.
#
# On the GPU machine (with .bundle/ copied along with the checkout), from the repository root:
#   bash tests/gpu/run.sh        (finds .bundle/gtrain-runtime.tar.gz, unpacks it, sources env.sh)
# or by hand: mkdir -p /tmp/rt && tar -xzf .bundle/gtrain-runtime.tar.gz -C /tmp/rt && . /tmp/rt/env.sh
#
# --check unpacks the result into a fresh folder and, in a private mount namespace where the system's
# Open MPI, PMIx, HDF5, OpenBLAS and inih (and every other library the bundle carries) are hidden,
# checks that ldd resolves every bundled program into the bundle (or glibc/CUDA) and trains
# configs/tiny.ini for a few steps on the CPU with the bundled gtrain, as a singleton MPI process
# (writing a parallel-HDF5 state file), runs test_comm's MPI and local checks, and starts a 2-rank
# job with the bundled mpirun (its orted and plugins found through OPAL_PREFIX).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
build=1 check=0 out=.bundle/gtrain-runtime.tar.gz
for a in "$@"; do
    case "$a" in
    --no-build) build=0 ;;
    --check) check=1 ;;
    -*) echo "bundle-runtime: unknown option $a" >&2; exit 2 ;;
    *) out=$a ;;
    esac
done
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
BUILD="build-gpu"

if [ $build = 1 ]; then
    mkdir -p $BUILD
    cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DGTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DBUILD_TESTING=ON > $BUILD/configure.log 2>&1 || { cat $BUILD/configure.log >&2; exit 1; }
    cmake --build $BUILD -j "$(nproc)" --target gtrain gtrain-prep gtrain-sample test_ops_cuda test_comm \
        bench_ops_cuda
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/gtrain-bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
cmake --install $BUILD --prefix "$stage" --component runtime > /dev/null

# The libraries the runtime dependency set leaves to the target machine, as in CMakeLists.txt.
skip='^(ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libmvec|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia|libcudnn|libnvrtc)[.-]'
copy_deps() { # FILE: its libraries (as ldd resolves them here) into lib/, unless carried already
    ldd "$1" 2> /dev/null | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
        local b
        b=$(basename "$lib")
        [[ $b =~ $skip ]] && continue
        [ -e "$stage/lib/$b" ] || cp -L "$lib" "$stage/lib/$b"
    done
}

# Open MPI: its tree under the prefix it was configured with, so OPAL_PREFIX relocates it
prefix=$(ompi_info --path prefix 2> /dev/null | awk '{print $2}')
pkglibdir=$(ompi_info --path pkglibdir 2> /dev/null | awk '{print $2}')
pkgdatadir=$(ompi_info --path pkgdatadir 2> /dev/null | awk '{print $2}')
if [ -z "$prefix" ] || [ ! -d "$pkglibdir" ]; then echo "bundle-runtime: ompi_info not found or odd" >&2; exit 1; fi
case "$pkglibdir" in "$prefix"/*) ;; *) echo "bundle-runtime: $pkglibdir is not under $prefix" >&2; exit 1 ;; esac
rel() { echo "${1#"$prefix"/}"; }
mkdir -p "$stage/usr/$(dirname "$(rel "$pkglibdir")")" "$stage/usr/$(dirname "$(rel "$pkgdatadir")")" "$stage/usr/bin"
cp -a "$pkglibdir" "$stage/usr/$(rel "$pkglibdir")"
cp -a "$pkgdatadir" "$stage/usr/$(rel "$pkgdatadir")"
for t in orted orterun mpirun mpiexec; do
    p=$(command -v $t || true)
    [ -n "$p" ] && cp -L "$p" "$stage/usr/bin/$t"
done
# PMIx (Open MPI 4 on Debian uses the system's): its few plugins and its help files
pmixlib=$(ldd "$pkglibdir"/mca_pmix_ext*.so 2> /dev/null | awk '/libpmix/ {print $3; exit}')
pmixdir=""
if [ -n "$pmixlib" ]; then
    for d in /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/x86_64-linux-gnu/pmix /usr/lib/pmix; do
        [ -d "$d/lib/pmix" ] && pmixdir=$d && break
    done
fi
if [ -n "$pmixdir" ]; then
    mkdir -p "$stage/usr/$(rel "$pmixdir")/lib"
    cp -a "$pmixdir/lib/pmix" "$stage/usr/$(rel "$pmixdir")/lib/"
    [ -d "$pmixdir/share" ] && cp -a "$pmixdir/share" "$stage/usr/$(rel "$pmixdir")/"
fi
for f in "$stage/usr/$(rel "$pkglibdir")"/*.so "$stage"/usr/bin/* "$stage"/usr/lib/*/pmix*/lib/pmix/*.so; do
    [ -f "$f" ] && copy_deps "$f"
done

cat > "$stage/env.sh" << 'ENV'
# env.sh of a gtrain runtime bundle (tools/bundle-runtime.sh): source it, then run bin/gtrain etc.
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cudalibs=$(for n in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
    find /usr/local/cuda*/ /usr/local/lib /usr/lib /opt -name "$n" 2> /dev/null | head -n 1
done | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export PATH="$D/bin:$D/usr/bin:$PATH"
export LD_LIBRARY_PATH="$D/lib:${cudalibs}${LD_LIBRARY_PATH:-}"
export OPAL_PREFIX="$D/usr"
# PMIx finds its plugins (and through them its help files) only when told where they went
for p in "$D"/usr/lib/*/pmix*; do
    [ -d "$p/lib/pmix" ] && export PMIX_PREFIX="$p" PMIX_MCA_mca_base_component_path="$p/lib/pmix"
done
# Debian's /etc/openmpi/openmpi-mca-params.conf, which does not travel (sysconfdir is outside the prefix)
export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_mtl='^ofi' OMPI_MCA_btl='^uct,openib,ofi'
export OMPI_MCA_pml='^ucx' OMPI_MCA_osc='^ucx,pt2pt'
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ENV

tar -C "$stage" -czf "$out" .
echo "$out: $(du -h "$out" | cut -f1), $(find "$stage/lib" -type f | wc -l) library files; glibc and CUDA/NCCL left to the target"

[ $check = 1 ] || exit 0

# ---------------------------------------------------------------- --check: hide the system, run from the bundle
fresh=$(mktemp -d "${TMPDIR:-/tmp}/gtrain-bundle-check.XXXXXX")
trap 'rm -rf "$stage" "$fresh"' EXIT
tar -xzf "$out" -C "$fresh"
cat > "$fresh/check.sh" << 'CHECK'
set -eu
fresh=$1 root=$2
# hide every system copy of what the bundle carries, and the Open MPI, PMIx and OpenBLAS trees
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/share/openmpi /etc/openmpi /usr/lib/x86_64-linux-gnu/pmix2 \
         /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/x86_64-linux-gnu/openblas-pthread \
         /usr/lib/x86_64-linux-gnu/hdf5; do
    [ -d "$d" ] && mount -t tmpfs none "$d"
done
for f in "$fresh"/lib/*; do
    b=$(basename "$f")
    for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/local/lib; do
        [ -e "$d/$b" ] && mount --bind /dev/null "$d/$b"
    done
done
for t in ompi_info orted orterun mpirun mpiexec; do
    p=$(command -v $t 2> /dev/null) && [ -e "$p" ] && mount --bind /dev/null "$(readlink -f "$p")"
done
. "$fresh/env.sh"
bad=0
for p in "$fresh"/bin/* "$fresh"/tests/*; do
    while read -r line; do
        case "$line" in
        *"not found"*) echo "unresolved in $(basename "$p"): $line"; bad=1 ;;
        *"=> $fresh/"* | *libc.so* | *libm.so* | *ld-linux* | *libdl.so* | *libpthread.so* | *librt.so* | *libresolv.so* | *linux-vdso* | *libcuda* | *libcublas* | *libnccl*) ;;
        *"=>"*) echo "resolved outside the bundle by $(basename "$p"): $line"; bad=1 ;;
        esac
    done < <(ldd "$p")
done
[ $bad = 0 ] && echo "ldd: every bundled program resolves into the bundle (or glibc, CUDA, NCCL)"
cd "$fresh"
gtrain-prep --val-fraction 0.1 -o corpus /usr/share/common-licenses/GPL-3 > /dev/null
gtrain "$root/configs/tiny.ini" train.device=cpu train.steps=3 train.warmup_steps=1 data.train=corpus.train.bin \
    data.val=corpus.val.bin data.val_every=0 checkpoint.dir=ckpt checkpoint.every=3 log.metrics=m.jsonl
ls ckpt/*.h5 > /dev/null && echo "gtrain from the bundle trained 3 steps and wrote $(ls ckpt/*.h5) with parallel HDF5"
"$fresh/tests/test_comm" | grep -E "^(ok|FAIL) +(mpi|local)|test_comm:"
mpirun -np 2 gtrain "$root/configs/tiny.ini" train.device=cpu train.steps=2 train.warmup_steps=1 \
    data.train=corpus.train.bin data.val= checkpoint.dir= | grep -E "^gtrain: .*2 ranks|^step 2/2"
echo "mpirun -np 2 from the bundle: done"
exit $bad
CHECK
unshare -m bash "$fresh/check.sh" "$fresh" "$ROOT"
