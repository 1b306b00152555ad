/*
 * cpu_norm_rope.c — RMSNorm and rotary position embedding on the CPU, both as Hugging Face
 * transformers computes them for LLaMA (LlamaRMSNorm, apply_rotary_pos_emb with rotate_half).
 * Each kernel is written once over the element type and compiled for fp32 and bf16 (cpu_elem.h);
 * rstd, the rope table and dweight are fp32 in both.
 *
 * RMSNorm: rstd = 1/sqrtf(mean(x^2) + eps), the mean of squares accumulated in double in index
 * order; out = w * (x * rstd), the same expression (rmsnorm_out below) in forward and in apply, so
 * the recompute executor gets the bits forward kept. Backward adds into dinp in fp32 and rounds the
 * sum once.
 *
 * RoPE: pair (i, i + HD/2) of each head rotates by angle t * inv_freq_i. The (cos, sin) table comes
 * from the model (gt_rope_table in model.c, which follows transformers' inv_freq, llama3 scaling
 * included); this file only applies the rotation.
 */
#ifndef ELEM_F32   /* this part once; cpu_elem.h then includes the file back for the part after #else */
#include <math.h>

#include "cpu_kernels.h"

static inline float rmsnorm_out(float x, float rstd, float w) { return w * (x * rstd); }

/* Column block owned by one thread when summing dweight over rows. */
#define RMSNORM_DW_BLOCK 64

#define GT_CPU_TEMPLATE "cpu_norm_rope.c"
#include "cpu_elem.h"

#else /* ---------------------------------------------------------------- the kernels, once per ELEM */

/* ---------------------------------------------------------------- RMSNorm */

/* out (N, C), rstd (N) ; inp (N, C) ; weight (C) */
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
 * dinp (N, C) += ; dweight (C) += ; dout, inp (N, C) ; weight (C) ; rstd (N) */
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

/* ---------------------------------------------------------------- RoPE */

/* sign = +1: out = x*cos + rotate_half(x)*sin ; sign = -1: the inverse (transpose) rotation.
 * x (B, T, NH, HD); rope (T_max, HD/2, 2); out may alias inp. */
static void ELEM_NAME(rope_rotate)(ELEM *out, const ELEM *inp, const float *rope, int B, int T, int NH, int HD,
                                   float sign) {
    GT_CPU_CHECK(HD % 2 == 0, "rope needs an even head dim, got %d", HD);
    int half = HD / 2;
#pragma omp parallel for schedule(static)
    for (long row = 0; row < (long)B * T * NH; row++) {
        int t = (int)((row / NH) % T);
        const ELEM *x = inp + (size_t)row * HD;
        ELEM *o = out + (size_t)row * HD;
        const float *cs = rope + (size_t)t * half * 2;
        for (int i = 0; i < half; i++) {
            float x1 = LD(x, i), x2 = LD(x, i + half);
            float c = cs[2 * i], si = sign * cs[2 * i + 1];
            o[i] = ST(x1 * c - x2 * si);
            o[i + half] = ST(x2 * c + x1 * si);
        }
    }
}

void ELEM_NAME(gt_cpu_rope_forward)(void *out, const void *inp, const float *rope, int B, int T, int NH, int HD) {
    ELEM_NAME(rope_rotate)(out, inp, rope, B, T, NH, HD, 1.0f);
}

void ELEM_NAME(gt_cpu_rope_backward)(void *dinp, const void *dout, const float *rope, int B, int T, int NH,
                                     int HD) {
    ELEM_NAME(rope_rotate)(dinp, dout, rope, B, T, NH, HD, -1.0f);
}

#endif
