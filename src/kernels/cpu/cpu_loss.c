/*
 * cpu_loss.c — the loss family of ops.h on the CPU: the fused softmax + cross-entropy of the LM head.
 * Each kernel is written once over the element type and compiled for fp32 and bf16 (cpu_elem.h):
 * logits load as fp32, the math is fp32 (the exp-sum in double), the gradient is rounded once; lse
 * and the losses are fp32 in both.
 */
#ifndef ELEM_F32   /* this part once; cpu_elem.h then includes the file back for the part after #else */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

/* Lanes of the cross-entropy exp-sum (doubles): a fixed tree, so the compiler can vectorise it. */
#define CE_LANES 8

#define GT_CPU_TEMPLATE "cpu_loss.c"
#include "cpu_elem.h"

#else /* ---------------------------------------------------------------- the kernels, once per ELEM */

/* ---------------------------------------------------------------- cross-entropy */

/* losses (BT) = lse - logit[target] ; lse (BT) ; logits (BT, V). After subtracting the row max,
 * exp in fp32 (gt_cpu_expf, vectorised), summed in double over CE_LANES lanes added in order.
 * gt_cpu_crossentropy_forward, gt_cpu_crossentropy_forward_bf16 */
void ELEM_NAME(gt_cpu_crossentropy_forward)(float *losses, float *lse, const void *logits_,
                                            const int32_t *targets, int BT, int V) {
    const ELEM *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const ELEM *l = logits + (size_t)i * V;
        /* the max is the same whatever the order: lanes let the compiler vectorise it */
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

/* logits (BT, V) become (softmax - onehot) * dloss in place ; rows with target < 0 become 0
 * gt_cpu_crossentropy_backward, gt_cpu_crossentropy_backward_bf16 */
void ELEM_NAME(gt_cpu_crossentropy_backward)(void *logits_, const float *lse, const int32_t *targets, int BT,
                                             int V, float dloss) {
    ELEM *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        ELEM *l = logits + (size_t)i * V;
        int tgt = targets[i];
        if (tgt < 0) {
            memset(l, 0, (size_t)V * sizeof(ELEM));
            continue;
        }
        float row_lse = lse[i];
        const float lt = LD(l, tgt);
        for (int j = 0; j < V; j++) l[j] = ST(gt_cpu_expf(LD(l, j) - row_lse) * dloss); /* no branch: vectorised */
        l[tgt] = ST((gt_cpu_expf(lt - row_lse) - 1.0f) * dloss);
    }
}

#endif
