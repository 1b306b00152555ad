/*
 * cpu_norm_rope.c — RMSNorm and rotary position embedding on the CPU, both as Hugging Face
 * transformers computes them for LLaMA (LlamaRMSNorm, apply_rotary_pos_emb with rotate_half).
 *
 * RMSNorm: rstd = 1/sqrtf(mean(x^2) + eps), the mean of squares accumulated in double in index
 * order; out = w * (x * rstd), the same expression (rmsnorm_out below) in forward and in apply, so
 * the recompute executor gets the bits forward kept.
 *
 * RoPE: pair (i, i + HD/2) of each head rotates by angle t * inv_freq_i. The (cos, sin) table comes
 * from the model (gt_rope_table in model.c, which follows transformers' inv_freq, llama3 scaling
 * included); this file only applies the rotation.
 */
#include <math.h>

#include "cpu_kernels.h"

/* ---------------------------------------------------------------- RMSNorm */

static inline float rmsnorm_out(float x, float rstd, float w) { return w * (x * rstd); }

/* out (N, C), rstd (N) ; inp (N, C) ; weight (C) */
void gt_cpu_rmsnorm_forward(void *out_, float *rstd, const void *inp_, const void *weight_, int N, int C,
                            float eps) {
    float *out = out_;
    const float *inp = inp_, *weight = weight_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) ss += (double)x[i] * (double)x[i];
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        rstd[n] = r;
        for (int i = 0; i < C; i++) o[i] = rmsnorm_out(x[i], r, weight[i]);
    }
}

void gt_cpu_rmsnorm_apply(void *out_, const float *rstd, const void *inp_, const void *weight_, int N,
                          int C) {
    float *out = out_;
    const float *inp = inp_, *weight = weight_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float r = rstd[n];
        for (int i = 0; i < C; i++) o[i] = rmsnorm_out(x[i], r, weight[i]);
    }
}

/* Column block owned by one thread when summing dweight over rows. */
#define RMSNORM_DW_BLOCK 64

/* out_j = w_j x_j r with r = (mean(x^2)+eps)^(-1/2), dr/dx_j = -r^3 x_j / C, so
 *   dx_j = r w_j dout_j - x_j r^3/C * sum_i dout_i w_i x_i ;  dw_j = sum_rows dout_j x_j r.
 * dinp (N, C) += ; dweight (C) += ; dout, inp (N, C) ; weight (C) ; rstd (N) */
void gt_cpu_rmsnorm_backward(void *dinp_, float *dweight, const void *dout_, const void *inp_,
                             const void *weight_, const float *rstd, int N, int C) {
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_, *weight = weight_;
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float r = rstd[n];
            double dot = 0.0;
            for (int i = 0; i < C; i++) dot += (double)d[i] * weight[i] * x[i];
            float coef = (float)(dot * r * r * r / C);
            for (int i = 0; i < C; i++) dx[i] += r * weight[i] * d[i] - x[i] * coef;
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
                const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
                float r = rstd[n];
                for (int i = lo; i < hi; i++) acc[i - lo] += d[i] * (x[i] * r);
            }
            for (int i = lo; i < hi; i++) dweight[i] += acc[i - lo];
        }
    }
}

/* ---------------------------------------------------------------- RoPE */

/* sign = +1: out = x*cos + rotate_half(x)*sin ; sign = -1: the inverse (transpose) rotation.
 * x (B, T, NH, HD); rope (T_max, HD/2, 2); out may alias inp. */
static void rope_rotate(float *out, const float *inp, const float *rope, int B, int T, int NH, int HD,
                        float sign) {
    GT_CPU_CHECK(HD % 2 == 0, "rope needs an even head dim, got %d", HD);
    int half = HD / 2;
#pragma omp parallel for schedule(static)
    for (long row = 0; row < (long)B * T * NH; row++) {
        int t = (int)((row / NH) % T);
        const float *x = inp + (size_t)row * HD;
        float *o = out + (size_t)row * HD;
        const float *cs = rope + (size_t)t * half * 2;
        for (int i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half];
            float c = cs[2 * i], si = sign * cs[2 * i + 1];
            o[i] = x1 * c - x2 * si;
            o[i + half] = x2 * c + x1 * si;
        }
    }
}

void gt_cpu_rope_forward(void *out, const void *inp, const float *rope, int B, int T, int NH, int HD) {
    rope_rotate(out, inp, rope, B, T, NH, HD, 1.0f);
}

void gt_cpu_rope_backward(void *dinp, const void *dout, const float *rope, int B, int T, int NH, int HD) {
    rope_rotate(dinp, dout, rope, B, T, NH, HD, -1.0f);
}
