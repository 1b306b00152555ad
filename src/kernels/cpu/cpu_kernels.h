/*
 * cpu_kernels.h — private to the CPU backend: the functions each cpu_*.c file defines and ops_cpu.c
 * gathers into the gt_ops table, plus the two small helpers they share. Nothing outside
 * src/kernels/cpu/ includes this; the rest of gtrain sees only gt_ops_cpu() from ops.h.
 *
 * Every working tensor is fp32 here, so the `void *` of the interface is cast to `float *` at entry.
 * Determinism rule followed by every file: each output element is written by exactly one OpenMP
 * thread, in a loop order that does not depend on the number of threads (static schedules, no
 * `reduction` clauses), so results are bit-identical for any OMP_NUM_THREADS.
 */
#ifndef GT_CPU_KERNELS_H
#define GT_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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

/* cpu_matmul.c */
void gt_cpu_matmul_forward(void *out, const void *inp, const void *weight, int N, int IC, int OC);
void gt_cpu_matmul_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                            const void *weight, int N, int IC, int OC, int accumulate_dinp);

/* cpu_norm_rope.c */
void gt_cpu_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C,
                            float eps);
void gt_cpu_rmsnorm_apply(void *out, const float *rstd, const void *inp, const void *weight, int N,
                          int C);
void gt_cpu_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                             const void *weight, const float *rstd, int N, int C);
void gt_cpu_rope_forward(void *out, const void *inp, const float *rope, int B, int T, int NH, int HD);
void gt_cpu_rope_backward(void *dinp, const void *dout, const float *rope, int B, int T, int NH, int HD);

/* cpu_attention.c */
void gt_cpu_attention_forward(void *out, float *lse, float *probs, const void *q, const void *k,
                              const void *v, int B, int T, int NH, int NKV, int HD, float dropout,
                              gt_rng_key key);
void gt_cpu_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *out,
                               const void *q, const void *k, const void *v, const float *lse,
                               const float *probs, int B, int T, int NH, int NKV, int HD, float dropout,
                               gt_rng_key key);

/* cpu_pointwise.c: embedding, SwiGLU, residual dropout, cross-entropy */
void gt_cpu_embedding_forward(void *out, const int32_t *tokens, const void *wte, int BT, int C, int V);
void gt_cpu_embedding_backward(float *dwte, const void *dout, const int32_t *tokens, int BT, int C, int V);
void gt_cpu_swiglu_forward(void *out, const void *gate, const void *up, size_t n);
void gt_cpu_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                            size_t n);
void gt_cpu_residual_forward(void *out, const void *res, const void *branch, size_t n, float dropout,
                             gt_rng_key key);
void gt_cpu_dropout_backward(void *dbranch, const void *dout, size_t n, float dropout, gt_rng_key key);
void gt_cpu_crossentropy_forward(float *losses, float *lse, const void *logits, const int32_t *targets,
                                 int BT, int V);
void gt_cpu_crossentropy_backward(void *logits, const float *lse, const int32_t *targets, int BT, int V,
                                  float dloss);

#endif
