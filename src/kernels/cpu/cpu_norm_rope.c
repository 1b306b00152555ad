/*
 * cpu_norm_rope.c — RMSNorm and rotary position embedding on the CPU, both as Hugging Face
 * transformers computes them for LLaMA (LlamaRMSNorm, apply_rotary_pos_emb with rotate_half).
 *
 * RMSNorm: rstd = 1/sqrtf(mean(x^2) + eps), the mean of squares accumulated in double in index
 * order; out = w * (x * rstd), the same expression (rmsnorm_out below) in forward and in apply, so
 * the recompute executor gets the bits forward kept.
 *
 * RoPE: pair (i, i + HD/2) of each head rotates by angle t * inv_freq_i. transformers computes
 * inv_freq = 1 / theta^(2i/HD) in fp32 and the angle as an fp32 product pos * inv_freq, then cos/sin
 * in fp32; we form inv_freq and the angle the same way in float, then take cos/sin of that float
 * angle in double and round, so the tables agree with transformers' to about 1 ulp.
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

/* cos/sin tables (T, HD/2) for positions 0..T-1; the caller frees them (one allocation). */
static float *rope_tables(int T, int HD, float theta, float **sin_out) {
    int half = HD / 2;
    float *tab = GT_CPU_MALLOC((size_t)2 * T * half * sizeof(float));
    float *cos_t = tab, *sin_t = tab + (size_t)T * half;
    for (int i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)HD);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq;
            cos_t[(size_t)t * half + i] = (float)cos((double)angle);
            sin_t[(size_t)t * half + i] = (float)sin((double)angle);
        }
    }
    *sin_out = sin_t;
    return cos_t;
}

/* sign = +1: out = x*cos + rotate_half(x)*sin ; sign = -1: the inverse (transpose) rotation.
 * x (B, T, NH, HD); out may alias inp. */
static void rope_rotate(float *out, const float *inp, int B, int T, int NH, int HD, float theta,
                        float sign) {
    GT_CPU_CHECK(HD % 2 == 0, "rope needs an even head dim, got %d", HD);
    int half = HD / 2;
    float *sin_t;
    float *cos_t = rope_tables(T, HD, theta, &sin_t);
#pragma omp parallel for schedule(static)
    for (long row = 0; row < (long)B * T * NH; row++) {
        int t = (int)((row / NH) % T);
        const float *x = inp + (size_t)row * HD;
        float *o = out + (size_t)row * HD;
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half];
            float si = sign * s[i];
            o[i] = x1 * c[i] - x2 * si;
            o[i + half] = x2 * c[i] + x1 * si;
        }
    }
    free(cos_t);
}

void gt_cpu_rope_forward(void *out, const void *inp, int B, int T, int NH, int HD, float theta) {
    rope_rotate(out, inp, B, T, NH, HD, theta, 1.0f);
}

void gt_cpu_rope_backward(void *dinp, const void *dout, int B, int T, int NH, int HD, float theta) {
    rope_rotate(dinp, dout, B, T, NH, HD, theta, -1.0f);
}
