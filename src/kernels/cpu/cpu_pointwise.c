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

static inline float silu(float g) { return g / (1.0f + expf(-g)); }

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
        float sig = 1.0f / (1.0f + expf(-g));
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

/* losses (BT) = lse - logit[target] ; lse (BT) ; logits (BT, V). The exp-sum runs in double, in
 * index order, after subtracting the row max. */
void gt_cpu_crossentropy_forward(float *losses, float *lse, const void *logits_, const int32_t *targets,
                                 int BT, int V) {
    const float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const float *l = logits + (size_t)i * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += exp((double)(l[j] - mx));
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
        for (int j = 0; j < V; j++) l[j] = (expf(l[j] - row_lse) - (j == tgt ? 1.0f : 0.0f)) * dloss;
    }
}
