/*
 * cuda_ptx.cuh — the CPU emulation's stand-in for src/kernels/cuda/cuda_ptx.cuh, the backend's inline
 * PTX wrappers (this directory comes first on the include path of the emulated sources only, as for
 * cuda_runtime.h; nvcc never sees this file). Same names and signatures, so every call site, index and
 * pointer expression of the kernels runs as written; the instructions themselves are cuda_emu.cpp's
 * gt_emu_ldmatrix_x4, gt_emu_mma_m16n8k16_bf16 and gt_emu_cp_async* (cuda_emu.h says what they model
 * and check).
 */
#ifndef GT_EMU_CUDA_PTX_CUH
#define GT_EMU_CUDA_PTX_CUH

#include <stdint.h>

#include "cuda_emu.h"

/* cp.async.cg.shared.global [dst], [src], 16, src_bytes */
static inline void cp_async16(void *dst, const void *src, int src_bytes) { gt_emu_cp_async(dst, src, 16, src_bytes); }
/* cp.async.ca.shared.global [dst], [src], 4, src_bytes */
static inline void cp_async4(void *dst, const void *src, int src_bytes) { gt_emu_cp_async(dst, src, 4, src_bytes); }
/* cp.async.commit_group */
static inline void cp_async_commit() { gt_emu_cp_async_commit(); }
/* cp.async.wait_group N */
template <int N>
static inline void cp_async_wait() {
    gt_emu_cp_async_wait(N);
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 {r0..r3}, [p] */
static inline void ldmatrix_x4(uint32_t (&r)[4], const void *p) { gt_emu_ldmatrix_x4(r, p, 0); }
static inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p) { gt_emu_ldmatrix_x4(r, p, 1); }

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {c}, {a}, {b0, b1}, {c} */
static inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    gt_emu_mma_m16n8k16_bf16(c, a, b0, b1);
}

#endif
