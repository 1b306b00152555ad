# emulate_cu.cmake — cmake -DIN=<src.cu> -DOUT=<copy.cpp> -P emulate_cu.cmake
#
# Copies a CUDA source for the CPU emulation (tests/gpu/emu/cuda_emu.h), rewriting only what host C++
# cannot take, each on its own line so line numbers stay those of the source (a #line directive names
# it, so compiler messages and the emulator's reports point at src/kernels/cuda):
#   k<<<grid, block[, smem[, stream]]>>>(args)  ->  gt_emu_launcher(k, "k", __FILE__, __LINE__, grid, block[, ...])(args)
#   extern __shared__ [__align__(N)] T a[];    ->  T *a = (T *)gt_emu_dynamic_shared();
#   __shared__ T a[N];                         ->  static T a[N]; gt_emu_shared(a, sizeof a);
#   __launch_bounds__(N) k(                    ->  k(   and, at the end, gt_emu_launch_bounds("k", N)
# Any `<<<` or `__shared__` left over is a form this script does not know: it stops rather than
# compile something that would run differently.
file(READ "${IN}" src)

# kernel name, optionally with template arguments (no nested <>), then the launch configuration
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*(<[^<>;]*>)?)<<<([^;]*)>>>\\("
       "gt_emu_launcher(\\1, \"\\1\", __FILE__, __LINE__, \\3)(" src "${src}")
# (an __align__(N) after __shared__ is dropped: the emulation's dynamic shared memory is 16-byte
# aligned, as much as any access in these kernels needs; ldmatrix and cp.async check theirs)
string(REGEX REPLACE "extern __shared__ (__align__\\([0-9]+\\) )?([A-Za-z_][A-Za-z0-9_ ]*) ([A-Za-z_][A-Za-z0-9_]*)\\[\\];"
       "\\2 *\\3 = (\\2 *)gt_emu_dynamic_shared();" src "${src}")
string(REGEX REPLACE "__shared__ ([A-Za-z_][A-Za-z0-9_ ]*) ([A-Za-z_][A-Za-z0-9_]*)(\\[[^];]*\\]);"
       "static \\1 \\2\\3; gt_emu_shared(\\2, sizeof \\2);" src "${src}")

# __launch_bounds__(N[, ...]) before a kernel's name: dropped from the declaration (its line stays),
# and registered at the end of the file, so a launch of that kernel with more than N threads per block
# fails as on the device
set(bounds "")
string(REGEX MATCHALL "__launch_bounds__\\([^()]*\\)[ \n]*[A-Za-z_][A-Za-z0-9_]*\\(" lbs "${src}")
foreach(lb ${lbs})
  string(REGEX REPLACE "__launch_bounds__\\(([^,()]*)[^()]*\\)[ \n]*([A-Za-z_][A-Za-z0-9_]*)\\(" "\\2" lb_name "${lb}")
  string(REGEX REPLACE "__launch_bounds__\\(([^,()]*)[^()]*\\)[ \n]*([A-Za-z_][A-Za-z0-9_]*)\\(" "\\1" lb_n "${lb}")
  string(APPEND bounds "static const int gt_emu_bounds_${lb_name} = gt_emu_launch_bounds(\"${lb_name}\", (${lb_n}));\n")
endforeach()
string(REGEX REPLACE "__launch_bounds__\\([^()]*\\)" "" src "${src}")

string(FIND "${src}" "<<<" left_launch)
string(FIND "${src}" "__shared__" left_shared)
if(NOT left_launch EQUAL -1 OR NOT left_shared EQUAL -1)
  message(FATAL_ERROR "emulate_cu.cmake: ${IN} has a kernel launch or __shared__ declaration the emulation's "
                      "rewrite does not recognise (see tests/gpu/emu/emulate_cu.cmake)")
endif()

file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}${bounds}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
