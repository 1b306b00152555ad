/*
 * cpu_attention.c — causal grouped-query attention on the CPU, exact (not flash) but laid out so
 * that backward never needs the stored probabilities: each score row's log-sum-exp is kept, and
 * a probability is always produced by the same two compiled functions (attn_scores, attn_probs):
 *   s_j = dot(q_t, k_j) * scale        p_j = expf(s_j - lse_t)
 * Forward calls them, backward calls them again when probs == NULL; both are noinline so the
 * compiler cannot contract or reorder the arithmetic differently at the two call sites, and the
 * probabilities (hence the gradients) are bit-identical with or without stored probs.
 *
 * Dropout on the probabilities follows transformers' attention_dropout: p~_j = p_j * keep_j/(1-p),
 * keep_j = gt_dropout_keep(key, ((b*NH + h)*T + t)*T + j, p).
 *
 * Backward, per row t of head h (kv head g = h / (NH/NKV)):
 *   dp~_j = dout_t . v_j ; dp_j = dp~_j * keep_j/(1-p) ; D = sum_j p_j dp_j = dout_t . out_t
 *   ds_j = p_j (dp_j - D) * scale ; dq_t = sum_j ds_j k_j ; dk_j += ds_j q_t ; dv_j += p~_j dout_t
 * D is taken from the forward output (sum_j p_j dp_j = dout_t . sum_j p~_j v_j = dout_t . out_t, dropout
 * included), one dot product of HD per row, as the GPU backends do.
 * Two passes keep every write owned by one thread in a fixed order:
 *   pass 1, over rows (b, h, t): D_t (into scratch) and dq_t;
 *   pass 2, over (b, g, block of key positions): dk_j, dv_j for the block, looping the group's
 *           query heads then rows t >= j in order, recomputing p_j and dp_j for the block's keys.
 * The scores of a row's own keys are therefore computed twice; in exchange both passes use all
 * cores even when B * NKV is small.
 */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

#define NOINLINE __attribute__((noinline))

/* Keys per pass-2 work item. */
#define KEY_BLOCK 16

/* Dot product with 16 independent partial sums (one or two SIMD registers), added up in a fixed
 * order at the end: the compiler can vectorise it without -ffast-math, and the result depends only
 * on n, never on threads. */
#define DOT_LANES 16
static inline float dot(const float *a, const float *b, int n) {
    float acc[DOT_LANES] = {0};
    int i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int l = 0; l < DOT_LANES; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    float s = 0.0f;
    for (int l = 0; l < DOT_LANES; l++) s += acc[l];
    return s;
}

/* s[j] = dot(q, k_j) * scale for j in [j0, j1); k_j = k + j * kstride */
static NOINLINE void attn_scores(float *s, const float *q, const float *k, size_t kstride, int j0, int j1,
                                 int HD, float scale) {
    for (int j = j0; j < j1; j++) s[j] = dot(q, k + (size_t)j * kstride, HD) * scale;
}

/* p[j] = expf(s[j] - lse) for j in [j0, j1) */
static NOINLINE void attn_probs(float *p, const float *s, float lse, int j0, int j1) {
    for (int j = j0; j < j1; j++) p[j] = expf(s[j] - lse);
}

static inline uint64_t drop_index(int b, int h, int t, int j, int NH, int T) {
    return (((uint64_t)b * NH + h) * T + t) * T + j;
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

#pragma omp parallel
    {
        float *s = GT_CPU_MALLOC((size_t)2 * T * sizeof(float));
        float *p = s + T;
#pragma omp for schedule(static, 1)
        for (long row = 0; row < (long)B * NH * T; row++) {
            int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((long)T * NH));
            int g = h / group;
            const float *qt = q + ((size_t)b * T + t) * qstride + (size_t)h * HD;
            const float *kb = k + (size_t)b * T * kstride + (size_t)g * HD;
            const float *vb = v + (size_t)b * T * kstride + (size_t)g * HD;
            float *ot = out + ((size_t)b * T + t) * qstride + (size_t)h * HD;

            attn_scores(s, qt, kb, kstride, 0, t + 1, HD, scale);
            float mx = -INFINITY;
            for (int j = 0; j <= t; j++) mx = s[j] > mx ? s[j] : mx;
            float sum = 0.0f;
            for (int j = 0; j <= t; j++) sum += expf(s[j] - mx);
            float l = mx + logf(sum);
            lse[row] = l; /* row is exactly ((b*NH + h)*T + t) */
            attn_probs(p, s, l, 0, t + 1);
            if (probs) {
                float *pr = probs + (size_t)row * T;
                memcpy(pr, p, (size_t)(t + 1) * sizeof(float));
                for (int j = t + 1; j < T; j++) pr[j] = 0.0f;
            }
            if (dropout > 0.0f) {
                for (int j = 0; j <= t; j++)
                    p[j] = gt_dropout_keep(key, drop_index(b, h, t, j, NH, T), dropout) ? p[j] * keep_scale
                                                                                         : 0.0f;
            }
            for (int d = 0; d < HD; d++) ot[d] = 0.0f;
            for (int j = 0; j <= t; j++) {
                const float *vj = vb + (size_t)j * kstride;
                float pj = p[j];
                for (int d = 0; d < HD; d++) ot[d] += pj * vj[d];
            }
        }
        free(s);
    }
}

/* Probabilities p[j0..j1) of row (b, h, t): from probs when kept, else recomputed bit-identically. */
static inline void row_probs(float *p, float *s, const float *probs, size_t row, const float *qt,
                             const float *kb, size_t kstride, int j0, int j1, int HD, float scale,
                             float lse, int T) {
    if (probs) {
        memcpy(p + j0, probs + row * T + j0, (size_t)(j1 - j0) * sizeof(float));
    } else {
        attn_scores(s, qt, kb, kstride, j0, j1, HD, scale);
        attn_probs(p, s, lse, j0, j1);
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
    float *D = GT_CPU_MALLOC((size_t)B * NH * T * sizeof(float)); /* (B, NH, T) */

    /* pass 1: dq and D, one row per work item */
#pragma omp parallel
    {
        float *s = GT_CPU_MALLOC((size_t)3 * T * sizeof(float));
        float *p = s + T, *dp = s + 2 * (size_t)T;
#pragma omp for schedule(static, 1)
        for (long row = 0; row < (long)B * NH * T; row++) {
            int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((long)T * NH));
            int g = h / group;
            const float *qt = q + ((size_t)b * T + t) * qstride + (size_t)h * HD;
            const float *dot_ = dout + ((size_t)b * T + t) * qstride + (size_t)h * HD;
            const float *kb = k + (size_t)b * T * kstride + (size_t)g * HD;
            const float *vb = v + (size_t)b * T * kstride + (size_t)g * HD;
            const float *ot = out + ((size_t)b * T + t) * qstride + (size_t)h * HD;
            float *dqt = dq + ((size_t)b * T + t) * qstride + (size_t)h * HD;

            row_probs(p, s, probs, (size_t)row, qt, kb, kstride, 0, t + 1, HD, scale, lse[row], T);
            const float Dsum = dot(dot_, ot, HD);
            D[row] = Dsum;
            for (int j = 0; j <= t; j++) {
                float d = dot(dot_, vb + (size_t)j * kstride, HD);
                if (dropout > 0.0f)
                    d = gt_dropout_keep(key, drop_index(b, h, t, j, NH, T), dropout) ? d * keep_scale : 0.0f;
                dp[j] = d;
            }
            for (int d = 0; d < HD; d++) dqt[d] = 0.0f;
            for (int j = 0; j <= t; j++) {
                float ds = p[j] * (dp[j] - Dsum) * scale;
                const float *kj = kb + (size_t)j * kstride;
                for (int d = 0; d < HD; d++) dqt[d] += ds * kj[d];
            }
        }
        free(s);
    }

    /* pass 2: dk and dv, one (b, kv head, key block) per work item */
    const int nblocks = (T + KEY_BLOCK - 1) / KEY_BLOCK;
#pragma omp parallel
    {
        float *s = GT_CPU_MALLOC((size_t)2 * T * sizeof(float));
        float *p = s + T;
#pragma omp for schedule(static, 1)
        for (long item = 0; item < (long)B * NKV * nblocks; item++) {
            int blk = (int)(item % nblocks), g = (int)((item / nblocks) % NKV);
            int b = (int)(item / ((long)nblocks * NKV));
            int j0 = blk * KEY_BLOCK, j1 = j0 + KEY_BLOCK < T ? j0 + KEY_BLOCK : T;
            const float *kb = k + (size_t)b * T * kstride + (size_t)g * HD;
            const float *vb = v + (size_t)b * T * kstride + (size_t)g * HD;
            float *dkb = dk + (size_t)b * T * kstride + (size_t)g * HD;
            float *dvb = dv + (size_t)b * T * kstride + (size_t)g * HD;
            for (int j = j0; j < j1; j++) {
                memset(dkb + (size_t)j * kstride, 0, (size_t)HD * sizeof(float));
                memset(dvb + (size_t)j * kstride, 0, (size_t)HD * sizeof(float));
            }
            for (int h = g * group; h < (g + 1) * group; h++) {
                for (int t = j0; t < T; t++) {
                    size_t row = ((size_t)b * NH + h) * T + t;
                    int jend = t + 1 < j1 ? t + 1 : j1; /* causal: keys j <= t */
                    const float *qt = q + ((size_t)b * T + t) * qstride + (size_t)h * HD;
                    const float *dot_ = dout + ((size_t)b * T + t) * qstride + (size_t)h * HD;
                    row_probs(p, s, probs, row, qt, kb, kstride, j0, jend, HD, scale, lse[row], T);
                    float Dt = D[row];
                    for (int j = j0; j < jend; j++) {
                        const float *vj = vb + (size_t)j * kstride;
                        float d = dot(dot_, vj, HD);
                        float pt = p[j]; /* p~_j, the probability after dropout */
                        if (dropout > 0.0f) {
                            int keep = gt_dropout_keep(key, drop_index(b, h, t, j, NH, T), dropout);
                            d = keep ? d * keep_scale : 0.0f;
                            pt = keep ? p[j] * keep_scale : 0.0f;
                        }
                        float ds = p[j] * (d - Dt) * scale;
                        float *dkj = dkb + (size_t)j * kstride, *dvj = dvb + (size_t)j * kstride;
                        for (int e = 0; e < HD; e++) {
                            dkj[e] += ds * qt[e];
                            dvj[e] += pt * dot_[e];
                        }
                    }
                }
            }
        }
        free(s);
    }
    free(D);
}
