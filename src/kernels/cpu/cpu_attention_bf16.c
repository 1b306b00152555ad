/*
 * cpu_attention_bf16.c — causal grouped-query attention of the bf16 CPU table (cpu_bf16.c): the
 * blocked algorithm of cpu_attention.c (read its header first) with bf16 q, k, v, out and gradients,
 * and its inner products on the CPU's bf16 units through oneDNN (gt_dnnl_gemm_ld, one product per
 * call on the calling OpenMP thread).
 *
 * Where it rounds, as the CUDA backend's bf16 attention does (docs/precision.md): the scores
 * S = (q k^T) * scale, the softmax, lse, dP and dS are fp32; P~ (after dropout) is rounded to bf16
 * before P~ V and before dV += P~^T dO, dS before dQ = dS K and dK += dS^T Q; dK and dV add up in
 * fp32 over the heads of a group and the query blocks and are rounded once at the end; out and dQ
 * are rounded once from their fp32 sums. The scores of a block come from one function with one
 * primitive per shape, in forward and in a backward that rebuilds them, so the probabilities (hence
 * the gradients) are bit-identical across recompute policies, as in fp32.
 */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

#define NOINLINE __attribute__((noinline))
#define QBLOCK 64
#define SUM_LANES 16

typedef uint16_t bf16;

/* S (nq, kend) fp32 = (q (nq rows, stride qstride) @ k (kend rows, stride kstride)^T) * scale */
static NOINLINE void block_scores(float *S, const bf16 *q, int qstride, const bf16 *k, int kstride, int nq, int kend,
                                  int HD, float scale) {
    gt_dnnl_gemm_ld(nq, kend, HD, q, qstride, 0, k, kstride, 1, S, kend, 1, 0);
    for (size_t i = 0; i < (size_t)nq * kend; i++) S[i] *= scale;
}

static NOINLINE void block_probs(float *P, const float *S, const float *lse, int t0, int nq, int kend) {
    for (int r = 0; r < nq; r++) {
        const float *s = S + (size_t)r * kend;
        float *p = P + (size_t)r * kend;
        const int jend = t0 + r + 1;
        const float l = lse[r];
        for (int j = 0; j < jend; j++) p[j] = gt_cpu_expf(s[j] - l);
        for (int j = jend; j < kend; j++) p[j] = 0.0f;
    }
}

static float row_lse(const float *s, int n) {
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    float acc[SUM_LANES] = {0};
    int j = 0;
    for (; j + SUM_LANES <= n; j += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) acc[l] += gt_cpu_expf(s[j + l] - mx);
    for (int l = 0; j < n; j++, l++) acc[l] += gt_cpu_expf(s[j] - mx);
    float sum = 0.0f;
    for (int l = 0; l < SUM_LANES; l++) sum += acc[l];
    return mx + logf(sum);
}

static float lane_dot(const bf16 *a, const bf16 *b, int n) {
    float acc[SUM_LANES] = {0};
    int j = 0;
    for (; j + SUM_LANES <= n; j += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) acc[l] += gt_bf16_to_f32(a[j + l]) * gt_bf16_to_f32(b[j + l]);
    for (int l = 0; j < n; j++, l++) acc[l] += gt_bf16_to_f32(a[j]) * gt_bf16_to_f32(b[j]);
    float s = 0.0f;
    for (int l = 0; l < SUM_LANES; l++) s += acc[l];
    return s;
}

static void round_rows(bf16 *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = gt_f32_to_bf16(src[i]);
}

void gt_cpu_attention_forward_bf16(void *out_, float *lse, float *probs, const void *q_, const void *k_,
                                   const void *v_, int B, int T, int NH, int NKV, int HD, float dropout,
                                   gt_rng_key key) {
    GT_CPU_CHECK(NKV > 0 && NH % NKV == 0, "NH=%d is not a multiple of NKV=%d", NH, NKV);
    bf16 *out = out_;
    const bf16 *q = q_, *k = k_, *v = v_;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const int qstride = NH * HD, kstride = NKV * HD;
    const int nqb = (T + QBLOCK - 1) / QBLOCK;
    gt_dnnl_init();

#pragma omp parallel
    {
        float *S = GT_CPU_MALLOC((size_t)2 * QBLOCK * T * sizeof(float));
        float *P = S + (size_t)QBLOCK * T;
        bf16 *Pb = GT_CPU_MALLOC((size_t)QBLOCK * T * sizeof(bf16));
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < (long)B * NH * nqb; item++) {
            int qb = nqb - 1 - (int)(item % nqb), h = (int)((item / nqb) % NH), b = (int)(item / ((long)nqb * NH));
            int g = h / group;
            int t0 = qb * QBLOCK, t1 = t0 + QBLOCK < T ? t0 + QBLOCK : T, nq = t1 - t0, kend = t1;
            const bf16 *qb_ = q + ((size_t)b * T + t0) * qstride + (size_t)h * HD;
            const bf16 *kb = k + (size_t)b * T * kstride + (size_t)g * HD;
            const bf16 *vb = v + (size_t)b * T * kstride + (size_t)g * HD;
            float *lrow = lse + ((size_t)b * NH + h) * T + t0;

            block_scores(S, qb_, qstride, kb, kstride, nq, kend, HD, scale);
            for (int r = 0; r < nq; r++) lrow[r] = row_lse(S + (size_t)r * kend, t0 + r + 1);
            block_probs(P, S, lrow, t0, nq, kend);
            if (probs) {
                for (int r = 0; r < nq; r++) {
                    float *pr = probs + (((size_t)b * NH + h) * T + t0 + r) * T;
                    memcpy(pr, P + (size_t)r * kend, (size_t)kend * sizeof(float));
                    memset(pr + kend, 0, (size_t)(T - kend) * sizeof(float));
                }
            }
            if (dropout > 0.0f) {
                for (int r = 0; r < nq; r++) {
                    float *p = P + (size_t)r * kend;
                    for (int j = 0; j <= t0 + r; j++)
                        p[j] = gt_dropout_keep(key, gt_attention_drop_index(b, h, t0 + r, j, NH, T), dropout)
                                   ? p[j] * keep_scale
                                   : 0.0f;
                }
            }
            round_rows(Pb, P, (size_t)nq * kend);
            /* out_blk (nq, HD) = P~ (nq, kend) @ v (kend, HD) */
            gt_dnnl_gemm_ld(nq, HD, kend, Pb, kend, 0, vb, kstride, 0, out + ((size_t)b * T + t0) * qstride + (size_t)h * HD,
                            qstride, 0, 0);
        }
        free(S);
        free(Pb);
    }
}

void gt_cpu_attention_backward_bf16(void *dq_, void *dk_, void *dv_, const void *dout_, const void *out_,
                                    const void *q_, const void *k_, const void *v_, const float *lse,
                                    const float *probs, int B, int T, int NH, int NKV, int HD, float dropout,
                                    gt_rng_key key) {
    GT_CPU_CHECK(NKV > 0 && NH % NKV == 0, "NH=%d is not a multiple of NKV=%d", NH, NKV);
    bf16 *dq = dq_, *dk = dk_, *dv = dv_;
    const bf16 *dout = dout_, *out = out_, *q = q_, *k = k_, *v = v_;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const int qstride = NH * HD, kstride = NKV * HD;
    const int nqb = (T + QBLOCK - 1) / QBLOCK;
    gt_dnnl_init();

#pragma omp parallel
    {
        float *S = GT_CPU_MALLOC((size_t)3 * QBLOCK * T * sizeof(float));
        float *P = S + (size_t)QBLOCK * T, *dP = P + (size_t)QBLOCK * T;
        bf16 *Pb = GT_CPU_MALLOC((size_t)2 * QBLOCK * T * sizeof(bf16)), *dSb = Pb + (size_t)QBLOCK * T;
        float *dkf = GT_CPU_MALLOC((size_t)2 * T * HD * sizeof(float)), *dvf = dkf + (size_t)T * HD;
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < (long)B * NKV; item++) {
            int g = (int)(item % NKV), b = (int)(item / NKV);
            const bf16 *kb = k + (size_t)b * T * kstride + (size_t)g * HD;
            const bf16 *vb = v + (size_t)b * T * kstride + (size_t)g * HD;
            memset(dkf, 0, (size_t)2 * T * HD * sizeof(float));
            for (int h = g * group; h < (g + 1) * group; h++) {
                for (int qb = 0; qb < nqb; qb++) {
                    int t0 = qb * QBLOCK, t1 = t0 + QBLOCK < T ? t0 + QBLOCK : T, nq = t1 - t0, kend = t1;
                    size_t off = ((size_t)b * T + t0) * qstride + (size_t)h * HD;
                    const bf16 *qb_ = q + off, *dob = dout + off, *ob = out + off;
                    const float *lrow = lse + ((size_t)b * NH + h) * T + t0;

                    if (probs) {
                        for (int r = 0; r < nq; r++)
                            memcpy(P + (size_t)r * kend, probs + (((size_t)b * NH + h) * T + t0 + r) * T,
                                   (size_t)kend * sizeof(float));
                    } else {
                        block_scores(S, qb_, qstride, kb, kstride, nq, kend, HD, scale);
                        block_probs(P, S, lrow, t0, nq, kend);
                    }
                    /* dP~ (nq, kend) = dout_blk @ v^T */
                    gt_dnnl_gemm_ld(nq, kend, HD, dob, qstride, 0, vb, kstride, 1, dP, kend, 1, 0);
                    for (int r = 0; r < nq; r++) {
                        const int t = t0 + r, jend = t + 1;
                        float *p = P + (size_t)r * kend, *dp = dP + (size_t)r * kend;
                        float *ds = S + (size_t)r * kend;
                        if (dropout > 0.0f) {
                            for (int j = 0; j < jend; j++)
                                dp[j] = gt_dropout_keep(key, gt_attention_drop_index(b, h, t, j, NH, T), dropout)
                                            ? dp[j] * keep_scale
                                            : 0.0f;
                        }
                        const float D = lane_dot(dob + (size_t)r * qstride, ob + (size_t)r * qstride, HD);
                        for (int j = 0; j < jend; j++) ds[j] = p[j] * (dp[j] - D) * scale;
                        for (int j = jend; j < kend; j++) ds[j] = 0.0f;
                        if (dropout > 0.0f) {
                            for (int j = 0; j < jend; j++)
                                p[j] = gt_dropout_keep(key, gt_attention_drop_index(b, h, t, j, NH, T), dropout)
                                           ? p[j] * keep_scale
                                           : 0.0f;
                        }
                    }
                    round_rows(dSb, S, (size_t)nq * kend);
                    round_rows(Pb, P, (size_t)nq * kend);
                    /* dq_blk (nq, HD) = dS @ k ; dk (kend, HD) += dS^T @ q_blk ; dv += P~^T @ dout_blk */
                    gt_dnnl_gemm_ld(nq, HD, kend, dSb, kend, 0, kb, kstride, 0, dq + off, qstride, 0, 0);
                    gt_dnnl_gemm_ld(kend, HD, nq, dSb, kend, 1, qb_, qstride, 0, dkf, HD, 1, 1);
                    gt_dnnl_gemm_ld(kend, HD, nq, Pb, kend, 1, dob, qstride, 0, dvf, HD, 1, 1);
                }
            }
            for (int j = 0; j < T; j++) {
                round_rows(dk + ((size_t)b * T + j) * kstride + (size_t)g * HD, dkf + (size_t)j * HD, (size_t)HD);
                round_rows(dv + ((size_t)b * T + j) * kstride + (size_t)g * HD, dvf + (size_t)j * HD, (size_t)HD);
            }
        }
        free(S);
        free(Pb);
        free(dkf);
    }
}
