/*
 * cuda_ptx.cuh — private to src/kernels/cuda/: the inline PTX of the backend, one small wrapper per
 * instruction (cp.async, ldmatrix, mma.sync m16n8k16), so that the kernels that use the tensor cores
 * (cuda_attention_mma.cu) contain no asm themselves. The register layouts these instructions give are
 * the PTX ISA's; the kernel that relies on them says which.
 *
 * The CPU emulation of the backend (docs/gpu.md) compiles the kernels with the host compiler, which
 * cannot take PTX: its include path puts a header of the same name with the same functions first, so
 * the kernel sources are the same in both builds and nvcc's is unchanged by it.
 */
#ifndef GT_CUDA_PTX_CUH
#define GT_CUDA_PTX_CUH

#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; src_bytes 0 writes zeros (rows past T) */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
/* 4 bytes global -> shared (cp.async.ca: .cg takes 16-byte copies only); src_bytes 0 writes zero */
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* wait until at most N of this thread's committed groups are still in flight */
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* c (16x8 fp32) += a (16x16 bf16, row) . b (16x8 bf16, col) */
static __device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
