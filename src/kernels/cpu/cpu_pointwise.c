/*
 * cpu_pointwise.c — the row- and element-wise layers on the CPU: token embedding, SwiGLU, the
 * residual add with dropout on the branch, and the fused softmax + cross-entropy of the LM head.
 *
 * Dropout masks come from the counter-based gt_dropout_keep of ops.h with the flat element index,
 * so the same (key, index) gives the same mask in forward, in a recomputed forward and in backward.
 * A dropout of 0 never calls the RNG.
 */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

/* ---------------------------------------------------------------- embedding */

/* out (BT, C) = wte[tokens] ; wte (V, C) */
void gt_cpu_embedding_forward(void *out_, const int32_t *tokens, const void *wte_, int BT, int C, int V) {
    float *out = out_;
    const float *wte = wte_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        GT_CPU_CHECK(tokens[i] >= 0 && tokens[i] < V, "token id %d at position %d is outside [0, vocab %d)",
                     (int)tokens[i], i, V);
        memcpy(out + (size_t)i * C, wte + (size_t)tokens[i] * C, (size_t)C * sizeof(float));
    }
}

/* Columns per work item of embedding_backward. */
#define EMBED_COL_BLOCK 64

/* dwte (V, C) += scatter of dout (BT, C). Each thread owns a block of columns and walks the tokens
 * in order, so repeated tokens add up in the same order for any thread count. */
void gt_cpu_embedding_backward(float *dwte, const void *dout_, const int32_t *tokens, int BT, int C, int V) {
    const float *dout = dout_;
    int nblocks = (C + EMBED_COL_BLOCK - 1) / EMBED_COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int lo = blk * EMBED_COL_BLOCK, hi = lo + EMBED_COL_BLOCK < C ? lo + EMBED_COL_BLOCK : C;
        for (int i = 0; i < BT; i++) {
            if (tokens[i] < 0 || tokens[i] >= V) continue;   /* forward refused it already */
            float *dst = dwte + (size_t)tokens[i] * C;
            const float *src = dout + (size_t)i * C;
            for (int c = lo; c < hi; c++) dst[c] += src[c];
        }
    }
}

/* ---------------------------------------------------------------- SwiGLU */

static inline float silu(float g) { return g / (1.0f + gt_cpu_expf(-g)); }

/* out (n) = silu(gate) * up */
void gt_cpu_swiglu_forward(void *out_, const void *gate_, const void *up_, size_t n) {
    float *out = out_;
    const float *gate = gate_, *up = up_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = silu(gate[i]) * up[i];
}

/* d silu(g)/dg = sig * (1 + g (1 - sig)). dgate/dup may alias gate/up (elementwise). */
void gt_cpu_swiglu_backward(void *dgate_, void *dup_, const void *dout_, const void *gate_,
                            const void *up_, size_t n) {
    float *dgate = dgate_, *dup = dup_;
    const float *dout = dout_, *gate = gate_, *up = up_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i], d = dout[i];
        float sig = 1.0f / (1.0f + gt_cpu_expf(-g));
        dgate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
        dup[i] = d * silu(g);
    }
}

/* ---------------------------------------------------------------- residual + dropout */

/* out (n) = res + dropout(branch) ; out may alias res */
void gt_cpu_residual_forward(void *out_, const void *res_, const void *branch_, size_t n, float dropout,
                             gt_rng_key key) {
    float *out = out_;
    const float *res = res_, *branch = branch_;
    if (dropout > 0.0f) {
        const float keep_scale = 1.0f / (1.0f - dropout);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            out[i] = res[i] + (gt_dropout_keep(key, i, dropout) ? branch[i] * keep_scale : 0.0f);
    } else {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) out[i] = res[i] + branch[i];
    }
}

/* dbranch (n) = mask * dout / (1-p) ; may alias dout */
void gt_cpu_dropout_backward(void *dbranch_, const void *dout_, size_t n, float dropout, gt_rng_key key) {
    float *dbranch = dbranch_;
    const float *dout = dout_;
    if (dropout > 0.0f) {
        const float keep_scale = 1.0f / (1.0f - dropout);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            dbranch[i] = gt_dropout_keep(key, i, dropout) ? dout[i] * keep_scale : 0.0f;
    } else if (dbranch != dout) {
        memcpy(dbranch, dout, n * sizeof(float));
    }
}

/* ---------------------------------------------------------------- cross-entropy */

/* Lanes of the cross-entropy exp-sum (doubles): a fixed tree, so the compiler can vectorise it. */
#define CE_LANES 8

/* losses (BT) = lse - logit[target] ; lse (BT) ; logits (BT, V). After subtracting the row max,
 * exp in fp32 (gt_cpu_expf, vectorised), summed in double over CE_LANES lanes added in order. */
void gt_cpu_crossentropy_forward(float *losses, float *lse, const void *logits_, const int32_t *targets,
                                 int BT, int V) {
    const float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const float *l = logits + (size_t)i * V;
        /* the max is the same whatever the order: lanes let the compiler vectorise it */
        float mxl[CE_LANES];
        for (int k = 0; k < CE_LANES; k++) mxl[k] = -INFINITY;
        int j = 0;
        for (; j + CE_LANES <= V; j += CE_LANES)
            for (int k = 0; k < CE_LANES; k++) mxl[k] = l[j + k] > mxl[k] ? l[j + k] : mxl[k];
        for (int k = 0; j < V; j++, k++) mxl[k] = l[j] > mxl[k] ? l[j] : mxl[k];
        float mx = -INFINITY;
        for (int k = 0; k < CE_LANES; k++) mx = mxl[k] > mx ? mxl[k] : mx;
        double acc[CE_LANES] = {0};
        j = 0;
        for (; j + CE_LANES <= V; j += CE_LANES)
            for (int k = 0; k < CE_LANES; k++) acc[k] += (double)gt_cpu_expf(l[j + k] - mx);
        for (int k = 0; j < V; j++, k++) acc[k] += (double)gt_cpu_expf(l[j] - mx);
        double sum = 0.0;
        for (int k = 0; k < CE_LANES; k++) sum += acc[k];
        float row_lse = (float)((double)mx + log(sum));
        lse[i] = row_lse;
        int tgt = targets[i];
        GT_CPU_CHECK(tgt < V, "target %d out of range (vocab %d) at position %d", tgt, V, i);
        losses[i] = tgt < 0 ? 0.0f : row_lse - l[tgt];
    }
}

/* logits (BT, V) become (softmax - onehot) * dloss in place ; rows with target < 0 become 0 */
void gt_cpu_crossentropy_backward(void *logits_, const float *lse, const int32_t *targets, int BT, int V,
                                  float dloss) {
    float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        float *l = logits + (size_t)i * V;
        int tgt = targets[i];
        if (tgt < 0) {
            memset(l, 0, (size_t)V * sizeof(float));
            continue;
        }
        float row_lse = lse[i];
        const float lt = l[tgt];
        for (int j = 0; j < V; j++) l[j] = gt_cpu_expf(l[j] - row_lse) * dloss; /* no branch: vectorised */
        l[tgt] = (gt_cpu_expf(lt - row_lse) - 1.0f) * dloss;
    }
}
