/*
 * cuda_runtime.h — the emulated build's stand-in for the toolkit's header of the same name (this
 * directory comes first on the include path of the emulated sources only). It keeps the toolkit's
 * own C API declarations (cuda_runtime_api.h: types, enums, signatures; tests/gpu/emu/cuda_emu.cpp
 * defines the functions) and replaces the device side with the CPU emulation of cuda_emu.h.
 */
#ifndef GT_EMU_CUDA_RUNTIME_H
#define GT_EMU_CUDA_RUNTIME_H
#include <cuda_runtime_api.h>

#include "cuda_emu.h"
#endif
