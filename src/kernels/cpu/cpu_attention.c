/*
 * cpu_attention.c — causal grouped-query attention on the CPU, exact, blocked over the queries so
 * that every inner product is an OpenBLAS sgemm (single-threaded: it runs inside our OpenMP loop)
 * and the keys after a query block's last row are never touched (causal blocks skipped).
 *
 * A query block is QBLOCK consecutive rows [t0, t1) of one head h (kv head g = h / (NH/NKV)); it
 * sees keys [0, t1). Its scores and probabilities always come from the same two compiled functions:
 *   block_scores: S (nq, t1) = scale * q[t0:t1] @ k[0:t1]^T     (one sgemm)
 *   block_probs:  P[t][j] = exp(S[t][j] - lse_t) for j <= t, 0 above the diagonal
 * Forward calls them, backward calls them again with the same arguments when probs == NULL; both
 * are noinline, and the exp is gt_cpu_expf (a fixed polynomial, no libm), so the probabilities
 * (hence the gradients) are bit-identical with or without stored probs and across recompute
 * policies. lse_t = max_t + log(sum_j exp(S_tj - max_t)), the sum over fixed lanes in index order.
 *
 * Dropout on the probabilities follows transformers' attention_dropout: p~_j = p_j * keep_j/(1-p),
 * keep_j = gt_dropout_keep(key, gt_attention_drop_index(b, h, t, j, NH, T), p) (ops.h: the index is
 * ((b*NH + h)*T + t)*T + j, the same in every backend).
 *
 * Backward, per row t of head h:
 *   dp~_j = dout_t . v_j ; dp_j = dp~_j * keep_j/(1-p) ; D_t = sum_j p_j dp_j = dout_t . out_t
 *   ds_j = p_j (dp_j - D_t) * scale ; dq_t = sum_j ds_j k_j ; dk_j += ds_j q_t ; dv_j += p~_j dout_t
 * D_t is taken from the forward output (sum_j p_j dp_j = dout_t . sum_j p~_j v_j = dout_t . out_t,
 * dropout included), one dot product of HD per row, as the GPU backends do.
 * One work item is one (b, kv head g): it owns dk and dv of g and dq of the group's query heads, and
 * walks heads then query blocks in order, so every sum has one order whatever the thread count:
 *   dP~ = dout_blk @ v^T ; dS ; dq_blk = dS @ k ; dk += dS^T @ q_blk ; dv += P~^T @ dout_blk
 * (five sgemms per block, scores recomputed or read from probs). B * NKV items share the threads.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

#define NOINLINE __attribute__((noinline))

/* Query rows per block: the scores of a block are QBLOCK x T floats (128 KiB at T = 512). */
#define QBLOCK 64

/* Lanes of the row sums: independent partial sums added in lane order at the end, so the compiler
 * can vectorise without -ffast-math and the result depends only on n. */
#define SUM_LANES 16

/* S (nq, kend) = scale * q (nq rows, stride qstride) @ k (kend rows, stride kstride)^T */
static NOINLINE void block_scores(float *S, const float *q, size_t qstride, const float *k, size_t kstride,
                                  int nq, int kend, int HD, float scale) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, kend, HD, scale, q, (int)qstride, k,
                (int)kstride, 0.0f, S, kend);
}

/* P (nq, kend): row r (position t0 + r) = exp(S - lse) on j <= t0 + r, 0 after */
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

/* max over s[0..n) and then log-sum-exp, lanes in a fixed order */
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

/* sum of a[j] * b[j] over j < n, lanes in a fixed order */
static float lane_dot(const float *a, const float *b, int n) {
    float acc[SUM_LANES] = {0};
    int j = 0;
    for (; j + SUM_LANES <= n; j += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) acc[l] += a[j + l] * b[j + l];
    for (int l = 0; j < n; j++, l++) acc[l] += a[j] * b[j];
    float s = 0.0f;
    for (int l = 0; l < SUM_LANES; l++) s += acc[l];
    return s;
}

/* out (B,T,NH,HD) ; lse (B,NH,T) ; probs (B,NH,T,T) or NULL ; q (B,T,NH,HD) ; k, v (B,T,NKV,HD) */
void gt_cpu_attention_forward(void *out_, float *lse, float *probs, const void *q_, const void *k_,
                              const void *v_, int B, int T, int NH, int NKV, int HD, float dropout,
                              gt_rng_key key) {
    GT_CPU_CHECK(NKV > 0 && NH % NKV == 0, "NH=%d is not a multiple of NKV=%d", NH, NKV);
    float *out = out_;
    const float *q = q_, *k = k_, *v = v_;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const size_t qstride = (size_t)NH * HD, kstride = (size_t)NKV * HD;
    const int nqb = (T + QBLOCK - 1) / QBLOCK;

#pragma omp parallel
    {
        float *S = GT_CPU_MALLOC((size_t)2 * QBLOCK * T * sizeof(float));
        float *P = S + (size_t)QBLOCK * T;
        /* the last query blocks see the most keys: hand them out first; dynamic is safe, an item
         * writes only its own rows and its sgemms run on one thread */
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < (long)B * NH * nqb; item++) {
            int qb = nqb - 1 - (int)(item % nqb), h = (int)((item / nqb) % NH), b = (int)(item / ((long)nqb * NH));
            int g = h / group;
            int t0 = qb * QBLOCK, t1 = t0 + QBLOCK < T ? t0 + QBLOCK : T, nq = t1 - t0, kend = t1;
            const float *qb_ = q + ((size_t)b * T + t0) * qstride + (size_t)h * HD;
            const float *kb = k + (size_t)b * T * kstride + (size_t)g * HD;
            const float *vb = v + (size_t)b * T * kstride + (size_t)g * HD;
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
                        p[j] = gt_dropout_keep(key, gt_attention_drop_index(b, h, t0 + r, j, NH, T), dropout) ? p[j] * keep_scale
                                                                                                  : 0.0f;
                }
            }
            /* out_blk (nq, HD) = P~ (nq, kend) @ v (kend, HD) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, HD, kend, 1.0f, P, kend, vb, (int)kstride,
                        0.0f, out + ((size_t)b * T + t0) * qstride + (size_t)h * HD, (int)qstride);
        }
        free(S);
    }
}

void gt_cpu_attention_backward(void *dq_, void *dk_, void *dv_, const void *dout_, const void *out_,
                               const void *q_, const void *k_, const void *v_, const float *lse,
                               const float *probs, int B, int T, int NH, int NKV, int HD, float dropout,
                               gt_rng_key key) {
    GT_CPU_CHECK(NKV > 0 && NH % NKV == 0, "NH=%d is not a multiple of NKV=%d", NH, NKV);
    float *dq = dq_, *dk = dk_, *dv = dv_;
    const float *dout = dout_, *out = out_, *q = q_, *k = k_, *v = v_;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const size_t qstride = (size_t)NH * HD, kstride = (size_t)NKV * HD;
    const int nqb = (T + QBLOCK - 1) / QBLOCK;

#pragma omp parallel
    {
        float *S = GT_CPU_MALLOC((size_t)3 * QBLOCK * T * sizeof(float));
        float *P = S + (size_t)QBLOCK * T, *dP = P + (size_t)QBLOCK * T;
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < (long)B * NKV; item++) {
            int g = (int)(item % NKV), b = (int)(item / NKV);
            const float *kb = k + (size_t)b * T * kstride + (size_t)g * HD;
            const float *vb = v + (size_t)b * T * kstride + (size_t)g * HD;
            float *dkb = dk + (size_t)b * T * kstride + (size_t)g * HD;
            float *dvb = dv + (size_t)b * T * kstride + (size_t)g * HD;
            for (int j = 0; j < T; j++) {
                memset(dkb + (size_t)j * kstride, 0, (size_t)HD * sizeof(float));
                memset(dvb + (size_t)j * kstride, 0, (size_t)HD * sizeof(float));
            }
            for (int h = g * group; h < (g + 1) * group; h++) {
                for (int qb = 0; qb < nqb; qb++) {
                    int t0 = qb * QBLOCK, t1 = t0 + QBLOCK < T ? t0 + QBLOCK : T, nq = t1 - t0, kend = t1;
                    size_t off = ((size_t)b * T + t0) * qstride + (size_t)h * HD;
                    const float *qb_ = q + off, *dob = dout + off, *ob = out + off;
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
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, kend, HD, 1.0f, dob, (int)qstride, vb,
                                (int)kstride, 0.0f, dP, kend);
                    for (int r = 0; r < nq; r++) {
                        const int t = t0 + r, jend = t + 1;
                        float *p = P + (size_t)r * kend, *dp = dP + (size_t)r * kend;
                        float *ds = S + (size_t)r * kend; /* the scores are no longer needed */
                        if (dropout > 0.0f) {
                            /* dp := dp~ * keep/(1-p); p keeps the probabilities, turned into p~ below */
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
                                p[j] = gt_dropout_keep(key, gt_attention_drop_index(b, h, t, j, NH, T), dropout) ? p[j] * keep_scale
                                                                                                     : 0.0f;
                        }
                    }
                    /* dq_blk (nq, HD) = dS @ k ; dk (kend, HD) += dS^T @ q_blk ; dv += P~^T @ dout_blk */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, HD, kend, 1.0f, S, kend, kb,
                                (int)kstride, 0.0f, dq + off, (int)qstride);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kend, HD, nq, 1.0f, S, kend, qb_,
                                (int)qstride, 1.0f, dkb, (int)kstride);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kend, HD, nq, 1.0f, P, kend, dob,
                                (int)qstride, 1.0f, dvb, (int)kstride);
                }
            }
        }
        free(S);
    }
}
