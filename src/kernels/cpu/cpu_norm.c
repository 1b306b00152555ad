/*
 * cpu_norm.c — the norm family of ops.h on the CPU: RMSNorm as Hugging Face transformers computes it
 * for LLaMA (LlamaRMSNorm). Each kernel is written once over the element type and compiled for fp32
 * and bf16 (cpu_elem.h); rstd and dweight are fp32 in both.
 *
 * RMSNorm: rstd = 1/sqrtf(mean(x^2) + eps), the mean of squares accumulated in double in index
 * order; out = w * (x * rstd), the same expression (rmsnorm_out below) in forward and in apply, so
 * the recompute executor gets the bits forward kept. Backward adds into dinp in fp32 and rounds the
 * sum once.
 */
#ifndef ELEM_F32   /* this part once; cpu_elem.h then includes the file back for the part after #else */
#include <math.h>

#include "cpu_kernels.h"

static inline float rmsnorm_out(float x, float rstd, float w) { return w * (x * rstd); }

/* Column block owned by one thread when summing dweight over rows. */
#define RMSNORM_DW_BLOCK 64

#define GT_CPU_TEMPLATE "cpu_norm.c"
#include "cpu_elem.h"

#else /* ---------------------------------------------------------------- the kernels, once per ELEM */

/* ---------------------------------------------------------------- RMSNorm */

/* out (N, C), rstd (N) ; inp (N, C) ; weight (C). gt_cpu_rmsnorm_forward, gt_cpu_rmsnorm_forward_bf16 */
void ELEM_NAME(gt_cpu_rmsnorm_forward)(void *out_, float *rstd, const void *inp_, const void *weight_, int N,
                                       int C, float eps) {
    ELEM *out = out_;
    const ELEM *inp = inp_, *weight = weight_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const ELEM *x = inp + (size_t)n * C;
        ELEM *o = out + (size_t)n * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) ss += (double)LD(x, i) * (double)LD(x, i);
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        rstd[n] = r;
        for (int i = 0; i < C; i++) o[i] = ST(rmsnorm_out(LD(x, i), r, LD(weight, i)));
    }
}

/* gt_cpu_rmsnorm_apply, gt_cpu_rmsnorm_apply_bf16 */
void ELEM_NAME(gt_cpu_rmsnorm_apply)(void *out_, const float *rstd, const void *inp_, const void *weight_, int N,
                                     int C) {
    ELEM *out = out_;
    const ELEM *inp = inp_, *weight = weight_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const ELEM *x = inp + (size_t)n * C;
        ELEM *o = out + (size_t)n * C;
        float r = rstd[n];
        for (int i = 0; i < C; i++) o[i] = ST(rmsnorm_out(LD(x, i), r, LD(weight, i)));
    }
}

/* out_j = w_j x_j r with r = (mean(x^2)+eps)^(-1/2), dr/dx_j = -r^3 x_j / C, so
 *   dx_j = r w_j dout_j - x_j r^3/C * sum_i dout_i w_i x_i ;  dw_j = sum_rows dout_j x_j r.
 * dinp (N, C) += ; dweight (C) += ; dout, inp (N, C) ; weight (C) ; rstd (N).
 * gt_cpu_rmsnorm_backward, gt_cpu_rmsnorm_backward_bf16 */
void ELEM_NAME(gt_cpu_rmsnorm_backward)(void *dinp_, float *dweight, const void *dout_, const void *inp_,
                                        const void *weight_, const float *rstd, int N, int C) {
    ELEM *dinp = dinp_;
    const ELEM *dout = dout_, *inp = inp_, *weight = weight_;
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const ELEM *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            ELEM *dx = dinp + (size_t)n * C;
            float r = rstd[n];
            double dot = 0.0;
            for (int i = 0; i < C; i++) dot += (double)LD(d, i) * LD(weight, i) * LD(x, i);
            float coef = (float)(dot * r * r * r / C);
            for (int i = 0; i < C; i++) dx[i] = ST(LD(dx, i) + (r * LD(weight, i) * LD(d, i) - LD(x, i) * coef));
        }
    }
    if (dweight) {
        /* each thread owns a block of columns and walks the rows in order: deterministic */
        int nblocks = (C + RMSNORM_DW_BLOCK - 1) / RMSNORM_DW_BLOCK;
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int lo = blk * RMSNORM_DW_BLOCK, hi = lo + RMSNORM_DW_BLOCK < C ? lo + RMSNORM_DW_BLOCK : C;
            float acc[RMSNORM_DW_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const ELEM *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
                float r = rstd[n];
                for (int i = lo; i < hi; i++) acc[i - lo] += LD(d, i) * (LD(x, i) * r);
            }
            for (int i = lo; i < hi; i++) dweight[i] += acc[i - lo];
        }
    }
}

#endif
