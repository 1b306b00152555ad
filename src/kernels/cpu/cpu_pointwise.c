/*
 * cpu_pointwise.c — the pointwise family of ops.h on the CPU, the row- and element-wise layers: token
 * embedding, SwiGLU, the residual add with dropout on the branch.
 * Each kernel is written once over the element type and compiled for fp32 and bf16 (cpu_elem.h):
 * loads become fp32, the math is fp32 (sums in double where noted), each output is rounded once.
 *
 * Dropout masks come from the counter-based gt_dropout_keep of ops.h with the flat element index,
 * so the same (key, index) gives the same mask in forward, in a recomputed forward and in backward.
 * A dropout of 0 never calls the RNG.
 */
#ifndef ELEM_F32   /* this part once; cpu_elem.h then includes the file back for the part after #else */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

/* Columns per work item of embedding_backward. */
#define EMBED_COL_BLOCK 64

static inline float silu(float g) { return g / (1.0f + gt_cpu_expf(-g)); }

#define GT_CPU_TEMPLATE "cpu_pointwise.c"
#include "cpu_elem.h"

#else /* ---------------------------------------------------------------- the kernels, once per ELEM */

/* ---------------------------------------------------------------- embedding */

/* out (BT, C) = wte[tokens] ; wte (V, C)
 * gt_cpu_embedding_forward, gt_cpu_embedding_forward_bf16 */
void ELEM_NAME(gt_cpu_embedding_forward)(void *out_, const int32_t *tokens, const void *wte_, int BT, int C,
                                         int V) {
    ELEM *out = out_;
    const ELEM *wte = wte_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        GT_CPU_CHECK(tokens[i] >= 0 && tokens[i] < V, "token id %d at position %d is outside [0, vocab %d)",
                     (int)tokens[i], i, V);
        memcpy(out + (size_t)i * C, wte + (size_t)tokens[i] * C, (size_t)C * sizeof(ELEM));
    }
}

/* dwte (V, C) += scatter of dout (BT, C). Each thread owns a block of columns and walks the tokens
 * in order, so repeated tokens add up in the same order for any thread count.
 * gt_cpu_embedding_backward, gt_cpu_embedding_backward_bf16 */
void ELEM_NAME(gt_cpu_embedding_backward)(float *dwte, const void *dout_, const int32_t *tokens, int BT, int C,
                                          int V) {
    const ELEM *dout = dout_;
    int nblocks = (C + EMBED_COL_BLOCK - 1) / EMBED_COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int lo = blk * EMBED_COL_BLOCK, hi = lo + EMBED_COL_BLOCK < C ? lo + EMBED_COL_BLOCK : C;
        for (int i = 0; i < BT; i++) {
            if (tokens[i] < 0 || tokens[i] >= V) continue;   /* forward refused it already */
            float *dst = dwte + (size_t)tokens[i] * C;
            const ELEM *src = dout + (size_t)i * C;
            for (int c = lo; c < hi; c++) dst[c] += LD(src, c);
        }
    }
}

/* ---------------------------------------------------------------- SwiGLU */

/* out (n) = silu(gate) * up
 * gt_cpu_swiglu_forward, gt_cpu_swiglu_forward_bf16 */
void ELEM_NAME(gt_cpu_swiglu_forward)(void *out_, const void *gate_, const void *up_, size_t n) {
    ELEM *out = out_;
    const ELEM *gate = gate_, *up = up_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = ST(silu(LD(gate, i)) * LD(up, i));
}

/* d silu(g)/dg = sig * (1 + g (1 - sig)). dgate/dup may alias gate/up (elementwise).
 * gt_cpu_swiglu_backward, gt_cpu_swiglu_backward_bf16 */
void ELEM_NAME(gt_cpu_swiglu_backward)(void *dgate_, void *dup_, const void *dout_, const void *gate_,
                                       const void *up_, size_t n) {
    ELEM *dgate = dgate_, *dup = dup_;
    const ELEM *dout = dout_, *gate = gate_, *up = up_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = LD(gate, i), u = LD(up, i), d = LD(dout, i);
        float sig = 1.0f / (1.0f + gt_cpu_expf(-g));
        dgate[i] = ST(d * u * sig * (1.0f + g * (1.0f - sig)));
        dup[i] = ST(d * silu(g));
    }
}

/* ---------------------------------------------------------------- residual + dropout */

/* out (n) = res + dropout(branch) ; out may alias res
 * gt_cpu_residual_forward, gt_cpu_residual_forward_bf16 */
void ELEM_NAME(gt_cpu_residual_forward)(void *out_, const void *res_, const void *branch_, size_t n,
                                        float dropout, gt_rng_key key) {
    ELEM *out = out_;
    const ELEM *res = res_, *branch = branch_;
    if (dropout > 0.0f) {
        const float keep_scale = 1.0f / (1.0f - dropout);
        /* fmaf spelled out: left to itself GCC fused res + branch * scale in the fp32 pass only, so
         * the bf16 table was not the fp32 math rounded once (test_ops_cpu compares them) */
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            out[i] = ST(fmaf(gt_dropout_keep(key, i, dropout) ? LD(branch, i) : 0.0f, keep_scale, LD(res, i)));
    } else {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) out[i] = ST(LD(res, i) + LD(branch, i));
    }
}

/* dbranch (n) = mask * dout / (1-p) ; may alias dout
 * gt_cpu_dropout_backward, gt_cpu_dropout_backward_bf16 */
void ELEM_NAME(gt_cpu_dropout_backward)(void *dbranch_, const void *dout_, size_t n, float dropout,
                                        gt_rng_key key) {
    ELEM *dbranch = dbranch_;
    const ELEM *dout = dout_;
    if (dropout > 0.0f) {
        const float keep_scale = 1.0f / (1.0f - dropout);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            dbranch[i] = ST(gt_dropout_keep(key, i, dropout) ? LD(dout, i) * keep_scale : 0.0f);
    } else if (dbranch != dout) {
        memcpy(dbranch, dout, n * sizeof(ELEM));
    }
}

#endif
