/*
 * cpu_kernels.h — private to the CPU backend: the functions each cpu_*.c file defines and ops_cpu.c
 * gathers into its two gt_ops tables (fp32 and bf16 working tensors), both declared from ops.h's op
 * list, plus the small helpers they share. Nothing outside src/kernels/cpu/ includes this; the rest
 * of gtrain sees only gt_ops_cpu() and gt_ops_cpu_bf16() from ops.h.
 *
 * A kernel casts the `void *` of the interface to its element type at entry (float, or uint16_t
 * holding bf16 bits); the layers are written once for both types (cpu_elem.h).
 * Determinism rule followed by every file: each output element is written by exactly one OpenMP
 * thread, in a loop order that does not depend on the number of threads (static schedules, no
 * `reduction` clauses), so results are bit-identical for any OMP_NUM_THREADS.
 */
#ifndef GT_CPU_KERNELS_H
#define GT_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>

#include "ops.h"

/* A broken invariant (out of memory, a token out of range): print file:line and abort. */
#define GT_CPU_CHECK(cond, ...)                                                  \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "gtrain cpu kernels: %s:%d: ", __FILE__, __LINE__);  \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
            abort();                                                             \
        }                                                                        \
    } while (0)

void *gt_cpu_xmalloc(size_t bytes, const char *file, int line);
#define GT_CPU_MALLOC(bytes) gt_cpu_xmalloc((bytes), __FILE__, __LINE__)

/* exp(x) in fp32 without libm, for loops the compiler vectorises (softmax, cross-entropy, SiLU):
 * Cephes' expf (round x/ln2 to n, reduce with ln2 split in two, degree-6 polynomial, scale by 2^n),
 * within 2 ulp of the exact value over its range; 0 below -87.34, +inf above 88.72. Every step is an
 * explicit fmaf or a plain operation, so the bits do not depend on where the compiler inlines it.
 * With FMA in the target (the default -march=x86-64-v3), fmaf is one instruction. */
static inline float gt_cpu_expf(float x) {
    const float xc = x < -87.33654f ? -87.33654f : (x > 88.72283f ? 88.72283f : x);
    /* n = round(xc / ln2): the 1.5 * 2^23 trick rounds to nearest in the default rounding mode */
    float n = fmaf(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float y = fmaf(p * r, r, r) + 1.0f;
    /* n can reach 128 (x near 88.7, where y < 1): scale by 2^127 and fold the last 2 into y */
    y = n > 127.5f ? y * 2.0f : y;
    n = n > 127.5f ? 127.0f : n;
    union { uint32_t u; float f; } sc = {.u = (uint32_t)((int32_t)n + 127) << 23};
    float res = y * sc.f;
    res = x < -87.33654f ? 0.0f : res;
    return x > 88.72283f ? INFINITY : res;
}

/* bf16 <-> fp32, as CUDA's __bfloat162float and __float2bfloat16 (round to nearest, ties to even;
 * a NaN stays a NaN): the one conversion of the bf16 CPU table (cpu_elem.h's LD and ST,
 * cpu_optimizer.c's to_working and to_master, cpu_attention.c's bf16 operands). */
static inline float gt_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
static inline uint16_t gt_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* cpu_dnnl.c: C (M, N) = A (M, K) @ B (K, N), or += with accumulate; A, B bf16, stored transposed
 * when a_trans / b_trans (A as (K, M), B as (N, K), row-major); C row-major, fp32 when c_f32 else
 * bf16 rounded once from the fp32 sum. Through oneDNN on the CPU's bf16 units, else widened to fp32
 * for OpenBLAS sgemm. gt_dnnl_native: 1 when oneDNN runs on bf16 units, or 0 and why (no library, no
 * bf16 instructions); gt_dnnl_isa: the instruction set oneDNN runs on, for logs. */
int gt_dnnl_native(char *why, size_t why_len);
const char *gt_dnnl_isa(void);
void gt_dnnl_gemm(int M, int N, int K, const void *A, int a_trans, const void *B, int b_trans, void *C,
                  int c_f32, int accumulate);
/* The same with leading dimensions (row strides in elements of each stored matrix), callable from
 * inside an OpenMP parallel region (it then runs on the calling thread); gt_dnnl_init must have run
 * once outside any parallel region first. */
void gt_dnnl_gemm_ld(int M, int N, int K, const void *A, int lda, int a_trans, const void *B, int ldb, int b_trans,
                     void *C, int ldc, int c_f32, int accumulate);
void gt_dnnl_init(void);

/* The ops of ops.h's list, declared from it: for a W entry gt_cpu_<op> (fp32 tensors) and
 * gt_cpu_<op>_bf16 (bf16 ones; weight gradients, rstd, lse, probs, losses fp32 in both); for an F
 * entry gt_cpu_<op>, which both tables share. Each family's functions are in its file (ops.h's
 * table of families: cpu_pointwise.c, cpu_norm.c, cpu_rope.c, cpu_attention.c, cpu_matmul.c,
 * cpu_loss.c, cpu_optimizer.c); the layers are written once over the element type and compiled for
 * both (cpu_elem.h), so their names are built by ELEM_NAME: grep for the plain name. */
#define GT_CPU_DECLARE(kind, op, ret, params, args, shapes) GT_CPU_DECLARE_##kind(op, ret, params)
#define GT_CPU_DECLARE_W(op, ret, params) ret gt_cpu_##op params; ret gt_cpu_##op##_bf16 params;
#define GT_CPU_DECLARE_F(op, ret, params) ret gt_cpu_##op params;
GT_OPS(GT_CPU_DECLARE)

#endif
