/*
 * emu_ptx.h — the CPU emulation's definitions of cuda_attention_mma.cu's inline-PTX wrappers (that file
 * includes this in place of its own under GT_CUDA_EMULATED; nvcc never sees it). Same names and
 * signatures, so every call site, index and pointer expression of the kernels runs as written; the
 * instructions themselves are cuda_emu.cpp's gt_emu_ldmatrix_x4, gt_emu_mma_m16n8k16_bf16 and
 * gt_emu_cp_async* (cuda_emu.h says what they model and check). Included inside the kernel file's
 * anonymous namespace, after cuda_common.cuh (so after cuda_emu.h).
 */
#ifndef GT_EMU_PTX_H
#define GT_EMU_PTX_H

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
