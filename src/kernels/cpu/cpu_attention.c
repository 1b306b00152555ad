/*
 * cpu_attention.c — the attention family of ops.h on the CPU: causal grouped-query attention, exact,
 * blocked over the queries so that every inner product is one matrix product on the calling OpenMP
 * thread and the keys after a query block's last row are never touched (causal blocks skipped). The
 * algorithm is written once over the element type and compiled for fp32 and bf16 (cpu_elem.h); only
 * the products differ:
 * fp32 multiplies with OpenBLAS sgemm (single-threaded: it runs inside our OpenMP loop), bf16 with
 * oneDNN on the CPU's bf16 units, else sgemm on widened copies (gt_dnnl_gemm_ld, fp32 accumulation).
 *
 * A query block is QBLOCK consecutive rows [t0, t1) of one head h (kv head g = h / (NH/NKV)); it
 * sees keys [k0, t1), k0 = 0, or with document masking (doc, ops.h) k0 = doc[t0], the first key of
 * the block's first row's document: the keys before it are masked for every row of the block (doc
 * never decreases), so they are skipped, and short documents make attention cheaper. Row t sees keys
 * [a_t, t], a_t = doc[t] (0 without masking). Block columns are keys from k0 (c = j - k0, kn = t1 - k0).
 * Its scores and probabilities always come from the same two compiled functions:
 *   block_scores: S (nq, kn) = scale * q[t0:t1] @ k[k0:t1]^T     (one product)
 *   block_probs:  P[t][j] = exp(S[t][j] - lse_t) for a_t <= j <= t, 0 elsewhere
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
 * (five products per block, scores recomputed or read from probs). B * NKV items share the threads.
 * dK and dV of the item add up in an fp32 (T, HD) buffer and are stored once at its end.
 *
 * Where bf16 rounds, as the CUDA backend's bf16 attention does (docs/precision.md): the scores
 * S = (q k^T) * scale, the softmax, lse, dP and dS are fp32; P~ (after dropout) is rounded to bf16
 * before P~ V and before dV += P~^T dO, dS before dQ = dS K and dK += dS^T Q (block_operand); dK and
 * dV are rounded once when stored; out and dQ are rounded once from their fp32 sums.
 */
#ifndef ELEM_F32   /* this part once; cpu_elem.h then includes the file back for the part after #else */
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

/* ---- the two product back-ends, one per element type; each runs on the calling thread ----
 * product: C (M, N) = (or += with accumulate) A (M, K) @ B (K, N), A stored as (K, M) when a_trans,
 * B as (N, K) when b_trans, row-major with leading dimensions; C fp32 when c_f32, else the element
 * type. block_scores: S (nq, kend) fp32 = scale * q (nq rows) @ k (kend rows)^T. block_operand: a
 * fp32 block as a product's A operand (fp32: itself; bf16: rounded into buf). */

static void product(int M, int N, int K, const void *A, int lda, int a_trans, const void *B, int ldb, int b_trans,
                    void *C, int ldc, int c_f32, int accumulate) {
    (void)c_f32;   /* C is fp32 either way */
    cblas_sgemm(CblasRowMajor, a_trans ? CblasTrans : CblasNoTrans, b_trans ? CblasTrans : CblasNoTrans, M, N, K,
                1.0f, A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc);
}

static void product_bf16(int M, int N, int K, const void *A, int lda, int a_trans, const void *B, int ldb,
                         int b_trans, void *C, int ldc, int c_f32, int accumulate) {
    gt_dnnl_gemm_ld(M, N, K, A, lda, a_trans, B, ldb, b_trans, C, ldc, c_f32, accumulate);
}

static NOINLINE void block_scores(float *S, const float *q, int qstride, const float *k, int kstride, int nq,
                                  int kend, int HD, float scale) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, kend, HD, scale, q, qstride, k, kstride, 0.0f, S,
                kend);
}

/* gt_dnnl_gemm_ld has no alpha: the scale is a separate fp32 multiply (sgemm's alpha above is kept,
 * it is part of the fp32 bits) */
static NOINLINE void block_scores_bf16(float *S, const uint16_t *q, int qstride, const uint16_t *k, int kstride,
                                       int nq, int kend, int HD, float scale) {
    gt_dnnl_gemm_ld(nq, kend, HD, q, qstride, 0, k, kstride, 1, S, kend, 1, 0);
    for (size_t i = 0; i < (size_t)nq * kend; i++) S[i] *= scale;
}

static const void *block_operand(void *buf, const float *src, size_t n) {
    (void)buf, (void)n;
    return src;
}

static const void *block_operand_bf16(void *buf, const float *src, size_t n) {
    uint16_t *dst = buf;
    for (size_t i = 0; i < n; i++) dst[i] = gt_f32_to_bf16(src[i]);
    return buf;
}

/* ---- float-only steps, shared by both element types ---- */

/* the first key row t of sequence b sees (ops.h's doc; 0 without document masking) */
static inline int row_start(const int32_t *doc, int b, int T, int t) { return doc ? doc[(size_t)b * T + t] : 0; }

/* P (nq, kn), columns keys k0 .. k0 + kn - 1: row r (position t0 + r) = exp(S - lse) on
 * a_t <= j <= t0 + r, 0 elsewhere */
static NOINLINE void block_probs(float *P, const float *S, const float *lse, const int32_t *doc, int b, int T, int t0,
                                 int k0, int nq, int kn) {
    for (int r = 0; r < nq; r++) {
        const float *s = S + (size_t)r * kn;
        float *p = P + (size_t)r * kn;
        const int cbeg = row_start(doc, b, T, t0 + r) - k0, cend = t0 + r + 1 - k0;
        const float l = lse[r];
        for (int c = 0; c < cbeg; c++) p[c] = 0.0f;
        for (int c = cbeg; c < cend; c++) p[c] = gt_cpu_expf(s[c] - l);
        for (int c = cend; c < kn; c++) p[c] = 0.0f;
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

/* the dropout of one row of probabilities (or of their gradient), in place: p[j - k0] for keys
 * jbeg <= j < jend */
static void drop_row(float *p, int k0, int jbeg, int jend, int b, int h, int t, int NH, int T, float dropout,
                     float keep_scale, gt_rng_key key) {
    for (int j = jbeg; j < jend; j++)
        p[j - k0] = gt_dropout_keep(key, gt_attention_drop_index(b, h, t, j, NH, T), dropout) ? p[j - k0] * keep_scale
                                                                                              : 0.0f;
}

#define GT_CPU_TEMPLATE "cpu_attention.c"
#include "cpu_elem.h"

#else /* ---------------------------------------------------------------- the kernels, once per ELEM */

/* sum of a[j] * b[j] over j < n, lanes in a fixed order. lane_dot, lane_dot_bf16 */
static float ELEM_NAME(lane_dot)(const ELEM *a, const ELEM *b, int n) {
    float acc[SUM_LANES] = {0};
    int j = 0;
    for (; j + SUM_LANES <= n; j += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) acc[l] += LD(a, j + l) * LD(b, j + l);
    for (int l = 0; j < n; j++, l++) acc[l] += LD(a, j) * LD(b, j);
    float s = 0.0f;
    for (int l = 0; l < SUM_LANES; l++) s += acc[l];
    return s;
}

/* out (B,T,NH,HD) ; lse (B,NH,T) ; probs (B,NH,T,T) or NULL ; q (B,T,NH,HD) ; k, v (B,T,NKV,HD).
 * gt_cpu_attention_forward, gt_cpu_attention_forward_bf16 */
void ELEM_NAME(gt_cpu_attention_forward)(void *out_, float *lse, float *probs, const void *q_, const void *k_,
                                         const void *v_, const int32_t *doc, int B, int T, int NH, int NKV, int HD,
                                         float dropout, gt_rng_key key) {
    GT_CPU_CHECK(NKV > 0 && NH % NKV == 0, "NH=%d is not a multiple of NKV=%d", NH, NKV);
    ELEM *out = out_;
    const ELEM *q = q_, *k = k_, *v = v_;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const size_t qstride = (size_t)NH * HD, kstride = (size_t)NKV * HD;
    const int nqb = (T + QBLOCK - 1) / QBLOCK;
    if (!ELEM_F32) gt_dnnl_init();   /* once outside the parallel region, before per-thread products */

#pragma omp parallel
    {
        float *S = GT_CPU_MALLOC((size_t)2 * QBLOCK * T * sizeof(float));
        float *P = S + (size_t)QBLOCK * T;
        ELEM *Pb = ELEM_F32 ? NULL : GT_CPU_MALLOC((size_t)QBLOCK * T * sizeof(ELEM));
        /* the last query blocks see the most keys: hand them out first; dynamic is safe, an item
         * writes only its own rows and its products run on one thread */
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < (long)B * NH * nqb; item++) {
            int qb = nqb - 1 - (int)(item % nqb), h = (int)((item / nqb) % NH), b = (int)(item / ((long)nqb * NH));
            int g = h / group;
            int t0 = qb * QBLOCK, t1 = t0 + QBLOCK < T ? t0 + QBLOCK : T, nq = t1 - t0;
            const int k0 = row_start(doc, b, T, t0), kn = t1 - k0;   /* the keys the block can see */
            const ELEM *qb_ = q + ((size_t)b * T + t0) * qstride + (size_t)h * HD;
            const ELEM *kb = k + ((size_t)b * T + k0) * kstride + (size_t)g * HD;
            const ELEM *vb = v + ((size_t)b * T + k0) * kstride + (size_t)g * HD;
            float *lrow = lse + ((size_t)b * NH + h) * T + t0;

            ELEM_NAME(block_scores)(S, qb_, (int)qstride, kb, (int)kstride, nq, kn, HD, scale);
            for (int r = 0; r < nq; r++) {
                const int a = row_start(doc, b, T, t0 + r);
                lrow[r] = row_lse(S + (size_t)r * kn + (a - k0), t0 + r + 1 - a);
            }
            block_probs(P, S, lrow, doc, b, T, t0, k0, nq, kn);
            if (probs) {
                for (int r = 0; r < nq; r++) {
                    float *pr = probs + (((size_t)b * NH + h) * T + t0 + r) * T;
                    memset(pr, 0, (size_t)k0 * sizeof(float));
                    memcpy(pr + k0, P + (size_t)r * kn, (size_t)kn * sizeof(float));
                    memset(pr + t1, 0, (size_t)(T - t1) * sizeof(float));
                }
            }
            if (dropout > 0.0f) {
                for (int r = 0; r < nq; r++)
                    drop_row(P + (size_t)r * kn, k0, row_start(doc, b, T, t0 + r), t0 + r + 1, b, h, t0 + r, NH, T,
                             dropout, keep_scale, key);
            }
            /* out_blk (nq, HD) = P~ (nq, kn) @ v[k0:t1] (kn, HD) */
            ELEM_NAME(product)(nq, HD, kn, ELEM_NAME(block_operand)(Pb, P, (size_t)nq * kn), kn, 0, vb,
                               (int)kstride, 0, out + ((size_t)b * T + t0) * qstride + (size_t)h * HD,
                               (int)qstride, 0, 0);
        }
        free(S);
        free(Pb);
    }
}

/* gt_cpu_attention_backward, gt_cpu_attention_backward_bf16 */
void ELEM_NAME(gt_cpu_attention_backward)(void *dq_, void *dk_, void *dv_, const void *dout_, const void *out_,
                                          const void *q_, const void *k_, const void *v_, const float *lse,
                                          const float *probs, const int32_t *doc, int B, int T, int NH, int NKV,
                                          int HD, float dropout, gt_rng_key key) {
    GT_CPU_CHECK(NKV > 0 && NH % NKV == 0, "NH=%d is not a multiple of NKV=%d", NH, NKV);
    ELEM *dq = dq_, *dk = dk_, *dv = dv_;
    const ELEM *dout = dout_, *out = out_, *q = q_, *k = k_, *v = v_;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const size_t qstride = (size_t)NH * HD, kstride = (size_t)NKV * HD;
    const int nqb = (T + QBLOCK - 1) / QBLOCK;
    if (!ELEM_F32) gt_dnnl_init();

#pragma omp parallel
    {
        float *S = GT_CPU_MALLOC((size_t)3 * QBLOCK * T * sizeof(float));
        float *P = S + (size_t)QBLOCK * T, *dP = P + (size_t)QBLOCK * T;
        ELEM *Pb = ELEM_F32 ? NULL : GT_CPU_MALLOC((size_t)2 * QBLOCK * T * sizeof(ELEM));
        ELEM *dSb = ELEM_F32 ? NULL : Pb + (size_t)QBLOCK * T;
        /* dk and dv of the item's kv head, (T, HD) fp32: the sums over heads and blocks, stored once */
        float *dkf = GT_CPU_MALLOC((size_t)2 * T * HD * sizeof(float)), *dvf = dkf + (size_t)T * HD;
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < (long)B * NKV; item++) {
            int g = (int)(item % NKV), b = (int)(item / NKV);
            const ELEM *kb = k + (size_t)b * T * kstride + (size_t)g * HD;
            const ELEM *vb = v + (size_t)b * T * kstride + (size_t)g * HD;
            memset(dkf, 0, (size_t)2 * T * HD * sizeof(float));
            for (int h = g * group; h < (g + 1) * group; h++) {
                for (int qb = 0; qb < nqb; qb++) {
                    int t0 = qb * QBLOCK, t1 = t0 + QBLOCK < T ? t0 + QBLOCK : T, nq = t1 - t0;
                    const int k0 = row_start(doc, b, T, t0), kn = t1 - k0; /* the keys the block can see */
                    size_t off = ((size_t)b * T + t0) * qstride + (size_t)h * HD;
                    const ELEM *qb_ = q + off, *dob = dout + off, *ob = out + off;
                    const ELEM *kbk = kb + (size_t)k0 * kstride, *vbk = vb + (size_t)k0 * kstride;
                    const float *lrow = lse + ((size_t)b * NH + h) * T + t0;

                    if (probs) {
                        for (int r = 0; r < nq; r++)
                            memcpy(P + (size_t)r * kn, probs + (((size_t)b * NH + h) * T + t0 + r) * T + k0,
                                   (size_t)kn * sizeof(float));
                    } else {
                        ELEM_NAME(block_scores)(S, qb_, (int)qstride, kbk, (int)kstride, nq, kn, HD, scale);
                        block_probs(P, S, lrow, doc, b, T, t0, k0, nq, kn);
                    }
                    /* dP~ (nq, kn) = dout_blk @ v[k0:t1]^T */
                    ELEM_NAME(product)(nq, kn, HD, dob, (int)qstride, 0, vbk, (int)kstride, 1, dP, kn, 1, 0);
                    for (int r = 0; r < nq; r++) {
                        const int t = t0 + r, a = row_start(doc, b, T, t), cbeg = a - k0, cend = t + 1 - k0;
                        float *p = P + (size_t)r * kn, *dp = dP + (size_t)r * kn;
                        float *ds = S + (size_t)r * kn; /* the scores are no longer needed */
                        /* dp := dp~ * keep/(1-p); p keeps the probabilities, turned into p~ below */
                        if (dropout > 0.0f) drop_row(dp, k0, a, t + 1, b, h, t, NH, T, dropout, keep_scale, key);
                        const float D = ELEM_NAME(lane_dot)(dob + (size_t)r * qstride, ob + (size_t)r * qstride, HD);
                        for (int c = 0; c < cbeg; c++) ds[c] = 0.0f;
                        for (int c = cbeg; c < cend; c++) ds[c] = p[c] * (dp[c] - D) * scale;
                        for (int c = cend; c < kn; c++) ds[c] = 0.0f;
                        if (dropout > 0.0f) drop_row(p, k0, a, t + 1, b, h, t, NH, T, dropout, keep_scale, key);
                    }
                    const void *dSo = ELEM_NAME(block_operand)(dSb, S, (size_t)nq * kn);
                    const void *Po = ELEM_NAME(block_operand)(Pb, P, (size_t)nq * kn);
                    /* dq_blk (nq, HD) = dS @ k ; dk[k0:t1] (kn, HD) += dS^T @ q_blk ; dv[k0:t1] += P~^T @ dout_blk */
                    ELEM_NAME(product)(nq, HD, kn, dSo, kn, 0, kbk, (int)kstride, 0, dq + off, (int)qstride, 0, 0);
                    ELEM_NAME(product)(kn, HD, nq, dSo, kn, 1, qb_, (int)qstride, 0, dkf + (size_t)k0 * HD, HD, 1, 1);
                    ELEM_NAME(product)(kn, HD, nq, Po, kn, 1, dob, (int)qstride, 0, dvf + (size_t)k0 * HD, HD, 1, 1);
                }
            }
            for (int j = 0; j < T; j++) {
                ELEM *dkr = dk + ((size_t)b * T + j) * kstride + (size_t)g * HD;
                ELEM *dvr = dv + ((size_t)b * T + j) * kstride + (size_t)g * HD;
                for (int i = 0; i < HD; i++) dkr[i] = ST(dkf[(size_t)j * HD + i]);
                for (int i = 0; i < HD; i++) dvr[i] = ST(dvf[(size_t)j * HD + i]);
            }
        }
        free(S);
        free(Pb);
        free(dkf);
    }
}

#endif
