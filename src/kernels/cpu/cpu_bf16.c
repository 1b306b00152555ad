/*
 * cpu_bf16.c — the CPU backend's bf16 table: every working tensor (activations, their gradients,
 * working weights) is bf16, as in the CUDA backend's bf16 table; weight gradients, master weights,
 * moments, norm statistics and losses stay fp32 (ops.h).
 *
 * Each kernel loads bf16, computes in fp32 with the same expressions as the fp32 kernels of this
 * directory, and rounds its output to bf16 once (nearest, ties to even: gt_f32_to_bf16); an output
 * that accumulates (rmsnorm's dinp +=, matmul's accumulate_dinp) adds in fp32 and rounds the sum.
 * The matrix products go to oneDNN (cpu_dnnl.c) on the working weights as they are: the only
 * fp32 -> bf16 conversion of a weight is to_working, once per optimizer update. Attention is
 * cpu_attention_bf16.c: the blocked algorithm of the fp32 kernel, its products through oneDNN too.
 *
 * The optimizer utilities (sumsq, scale, AdamW) and the allocator are the fp32 table's, reused.
 * Determinism: the same rules as the fp32 kernels (one writer per element, static schedules); the
 * products repeat bit for bit at a fixed thread count (cpu_dnnl.c).
 */
#include <string.h>

#include "cpu_kernels.h"

typedef uint16_t bf16;

#define LD(p, i) gt_bf16_to_f32((p)[i])
#define ST(x) gt_f32_to_bf16(x)

/* ---------------------------------------------------------------- conversions */

static void to_f32(float *dst, const bf16 *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = LD(src, i);
}

static void to_bf16(bf16 *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = ST(src[i]);
}

static void bf16_to_working(void *working, const float *master, size_t n) { to_bf16(working, master, n); }
static void bf16_to_master(float *master, const void *working, size_t n) { to_f32(master, working, n); }

/* ---------------------------------------------------------------- embedding */

static void bf16_embedding_forward(void *out_, const int32_t *tokens, const void *wte_, int BT, int C, int V) {
    bf16 *out = out_;
    const bf16 *wte = wte_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        GT_CPU_CHECK(tokens[i] >= 0 && tokens[i] < V, "token id %d at position %d is outside [0, vocab %d)",
                     (int)tokens[i], i, V);
        memcpy(out + (size_t)i * C, wte + (size_t)tokens[i] * C, (size_t)C * sizeof(bf16));
    }
}

#define EMBED_COL_BLOCK 64

static void bf16_embedding_backward(float *dwte, const void *dout_, const int32_t *tokens, int BT, int C, int V) {
    const bf16 *dout = dout_;
    int nblocks = (C + EMBED_COL_BLOCK - 1) / EMBED_COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int lo = blk * EMBED_COL_BLOCK, hi = lo + EMBED_COL_BLOCK < C ? lo + EMBED_COL_BLOCK : C;
        for (int i = 0; i < BT; i++) {
            if (tokens[i] < 0 || tokens[i] >= V) continue;
            float *dst = dwte + (size_t)tokens[i] * C;
            const bf16 *src = dout + (size_t)i * C;
            for (int c = lo; c < hi; c++) dst[c] += LD(src, c);
        }
    }
}

/* ---------------------------------------------------------------- RMSNorm (as cpu_norm_rope.c) */

static void bf16_rmsnorm_forward(void *out_, float *rstd, const void *inp_, const void *weight_, int N, int C,
                                 float eps) {
    bf16 *out = out_;
    const bf16 *inp = inp_, *weight = weight_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const bf16 *x = inp + (size_t)n * C;
        bf16 *o = out + (size_t)n * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) ss += (double)LD(x, i) * (double)LD(x, i);
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        rstd[n] = r;
        for (int i = 0; i < C; i++) o[i] = ST(LD(weight, i) * (LD(x, i) * r));
    }
}

static void bf16_rmsnorm_apply(void *out_, const float *rstd, const void *inp_, const void *weight_, int N, int C) {
    bf16 *out = out_;
    const bf16 *inp = inp_, *weight = weight_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const bf16 *x = inp + (size_t)n * C;
        bf16 *o = out + (size_t)n * C;
        float r = rstd[n];
        for (int i = 0; i < C; i++) o[i] = ST(LD(weight, i) * (LD(x, i) * r));
    }
}

#define RMSNORM_DW_BLOCK 64

static void bf16_rmsnorm_backward(void *dinp_, float *dweight, const void *dout_, const void *inp_,
                                  const void *weight_, const float *rstd, int N, int C) {
    bf16 *dinp = dinp_;
    const bf16 *dout = dout_, *inp = inp_, *weight = weight_;
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const bf16 *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            bf16 *dx = dinp + (size_t)n * C;
            float r = rstd[n];
            double dot = 0.0;
            for (int i = 0; i < C; i++) dot += (double)LD(d, i) * LD(weight, i) * LD(x, i);
            float coef = (float)(dot * r * r * r / C);
            for (int i = 0; i < C; i++) dx[i] = ST(LD(dx, i) + (r * LD(weight, i) * LD(d, i) - LD(x, i) * coef));
        }
    }
    if (dweight) {
        int nblocks = (C + RMSNORM_DW_BLOCK - 1) / RMSNORM_DW_BLOCK;
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int lo = blk * RMSNORM_DW_BLOCK, hi = lo + RMSNORM_DW_BLOCK < C ? lo + RMSNORM_DW_BLOCK : C;
            float acc[RMSNORM_DW_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const bf16 *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
                float r = rstd[n];
                for (int i = lo; i < hi; i++) acc[i - lo] += LD(d, i) * (LD(x, i) * r);
            }
            for (int i = lo; i < hi; i++) dweight[i] += acc[i - lo];
        }
    }
}

/* ---------------------------------------------------------------- linear layers (oneDNN) */

static void bf16_matmul_forward(void *out, const void *inp, const void *weight, int N, int IC, int OC) {
    gt_dnnl_gemm(N, OC, IC, inp, 0, weight, 1, out, 0, 0);
}

static void bf16_matmul_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                                 int N, int IC, int OC, int accumulate_dinp) {
    if (dinp && N > 0 && IC > 0) gt_dnnl_gemm(N, IC, OC, dout, 0, weight, 0, dinp, 0, accumulate_dinp);
    if (dweight && OC > 0 && IC > 0 && N > 0) gt_dnnl_gemm(OC, IC, N, dout, 1, inp, 0, dweight, 1, 1);
}

/* ---------------------------------------------------------------- RoPE */

static void rope_rotate(bf16 *out, const bf16 *inp, const float *rope, int B, int T, int NH, int HD, float sign) {
    GT_CPU_CHECK(HD % 2 == 0, "rope needs an even head dim, got %d", HD);
    int half = HD / 2;
#pragma omp parallel for schedule(static)
    for (long row = 0; row < (long)B * T * NH; row++) {
        int t = (int)((row / NH) % T);
        const bf16 *x = inp + (size_t)row * HD;
        bf16 *o = out + (size_t)row * HD;
        const float *cs = rope + (size_t)t * half * 2;
        for (int i = 0; i < half; i++) {
            float x1 = LD(x, i), x2 = LD(x, i + half);
            float c = cs[2 * i], si = sign * cs[2 * i + 1];
            o[i] = ST(x1 * c - x2 * si);
            o[i + half] = ST(x2 * c + x1 * si);
        }
    }
}

static void bf16_rope_forward(void *out, const void *inp, const float *rope, int B, int T, int NH, int HD) {
    rope_rotate(out, inp, rope, B, T, NH, HD, 1.0f);
}
static void bf16_rope_backward(void *dinp, const void *dout, const float *rope, int B, int T, int NH, int HD) {
    rope_rotate(dinp, dout, rope, B, T, NH, HD, -1.0f);
}

/* ---------------------------------------------------------------- SwiGLU, residual, dropout */

static inline float silu(float g) { return g / (1.0f + gt_cpu_expf(-g)); }

static void bf16_swiglu_forward(void *out_, const void *gate_, const void *up_, size_t n) {
    bf16 *out = out_;
    const bf16 *gate = gate_, *up = up_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = ST(silu(LD(gate, i)) * LD(up, i));
}

static void bf16_swiglu_backward(void *dgate_, void *dup_, const void *dout_, const void *gate_, const void *up_,
                                 size_t n) {
    bf16 *dgate = dgate_, *dup = dup_;
    const bf16 *dout = dout_, *gate = gate_, *up = up_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = LD(gate, i), u = LD(up, i), d = LD(dout, i);
        float sig = 1.0f / (1.0f + gt_cpu_expf(-g));
        dgate[i] = ST(d * u * sig * (1.0f + g * (1.0f - sig)));
        dup[i] = ST(d * silu(g));
    }
}

static void bf16_residual_forward(void *out_, const void *res_, const void *branch_, size_t n, float dropout,
                                  gt_rng_key key) {
    bf16 *out = out_;
    const bf16 *res = res_, *branch = branch_;
    if (dropout > 0.0f) {
        const float keep_scale = 1.0f / (1.0f - dropout);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            out[i] = ST(LD(res, i) + (gt_dropout_keep(key, i, dropout) ? LD(branch, i) * keep_scale : 0.0f));
    } else {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) out[i] = ST(LD(res, i) + LD(branch, i));
    }
}

static void bf16_dropout_backward(void *dbranch_, const void *dout_, size_t n, float dropout, gt_rng_key key) {
    bf16 *dbranch = dbranch_;
    const bf16 *dout = dout_;
    if (dropout > 0.0f) {
        const float keep_scale = 1.0f / (1.0f - dropout);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            dbranch[i] = gt_dropout_keep(key, i, dropout) ? ST(LD(dout, i) * keep_scale) : 0;
    } else if (dbranch != dout) {
        memcpy(dbranch, dout, n * sizeof(bf16));
    }
}

/* ---------------------------------------------------------------- cross-entropy (fp32 math) */

#define CE_LANES 8

static void bf16_crossentropy_forward(float *losses, float *lse, const void *logits_, const int32_t *targets,
                                      int BT, int V) {
    const bf16 *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const bf16 *l = logits + (size_t)i * V;
        float mxl[CE_LANES];
        for (int k = 0; k < CE_LANES; k++) mxl[k] = -INFINITY;
        int j = 0;
        for (; j + CE_LANES <= V; j += CE_LANES)
            for (int k = 0; k < CE_LANES; k++) mxl[k] = LD(l, j + k) > mxl[k] ? LD(l, j + k) : mxl[k];
        for (int k = 0; j < V; j++, k++) mxl[k] = LD(l, j) > mxl[k] ? LD(l, j) : mxl[k];
        float mx = -INFINITY;
        for (int k = 0; k < CE_LANES; k++) mx = mxl[k] > mx ? mxl[k] : mx;
        double acc[CE_LANES] = {0};
        j = 0;
        for (; j + CE_LANES <= V; j += CE_LANES)
            for (int k = 0; k < CE_LANES; k++) acc[k] += (double)gt_cpu_expf(LD(l, j + k) - mx);
        for (int k = 0; j < V; j++, k++) acc[k] += (double)gt_cpu_expf(LD(l, j) - mx);
        double sum = 0.0;
        for (int k = 0; k < CE_LANES; k++) sum += acc[k];
        float row_lse = (float)((double)mx + log(sum));
        lse[i] = row_lse;
        int tgt = targets[i];
        GT_CPU_CHECK(tgt < V, "target %d out of range (vocab %d) at position %d", tgt, V, i);
        losses[i] = tgt < 0 ? 0.0f : row_lse - LD(l, tgt);
    }
}

static void bf16_crossentropy_backward(void *logits_, const float *lse, const int32_t *targets, int BT, int V,
                                       float dloss) {
    bf16 *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        bf16 *l = logits + (size_t)i * V;
        int tgt = targets[i];
        if (tgt < 0) {
            memset(l, 0, (size_t)V * sizeof(bf16));
            continue;
        }
        float row_lse = lse[i];
        const float lt = LD(l, tgt);
        for (int j = 0; j < V; j++) l[j] = ST(gt_cpu_expf(LD(l, j) - row_lse) * dloss);
        l[tgt] = ST((gt_cpu_expf(lt - row_lse) - 1.0f) * dloss);
    }
}

/* ---------------------------------------------------------------- the table */

const gt_ops *gt_ops_cpu_bf16(char *why, size_t why_len) {
    static gt_ops t;
    if (!gt_dnnl_available(why, why_len)) return NULL;
    if (t.name) return &t;
    t = *gt_ops_cpu();   /* memory, sumsq, scale, adamw: fp32 and shared */
    t.name = "cpu";
    t.act_bytes = 2;
    t.embedding_forward = bf16_embedding_forward;
    t.embedding_backward = bf16_embedding_backward;
    t.rmsnorm_forward = bf16_rmsnorm_forward;
    t.rmsnorm_apply = bf16_rmsnorm_apply;
    t.rmsnorm_backward = bf16_rmsnorm_backward;
    t.matmul_forward = bf16_matmul_forward;
    t.matmul_backward = bf16_matmul_backward;
    t.rope_forward = bf16_rope_forward;
    t.rope_backward = bf16_rope_backward;
    t.attention_forward = gt_cpu_attention_forward_bf16;
    t.attention_backward = gt_cpu_attention_backward_bf16;
    t.swiglu_forward = bf16_swiglu_forward;
    t.swiglu_backward = bf16_swiglu_backward;
    t.residual_forward = bf16_residual_forward;
    t.dropout_backward = bf16_dropout_backward;
    t.crossentropy_forward = bf16_crossentropy_forward;
    t.crossentropy_backward = bf16_crossentropy_backward;
    t.to_working = bf16_to_working;
    t.to_master = bf16_to_master;
    return &t;
}

const char *gt_cpu_bf16_isa(void) { return gt_dnnl_isa(); }
