/*
 * memtrack.h — every buffer the trainer holds goes through here, so memory figures are measured,
 * not estimated. Each allocation names its kind; the tracker keeps the bytes held now and the
 * high-water mark per kind and in total.
 *
 * Sizes are the bytes requested (no allocator rounding), which is what the planner's memory model
 * predicts. `act_peak_bytes` in the metrics is peak[GT_MEM_ACT] over one optimizer step;
 * `mem_peak_bytes` is the total peak over the same step.
 */
#ifndef GT_MEMTRACK_H
#define GT_MEMTRACK_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"

typedef enum gt_mem_kind {
    GT_MEM_PARAMS,     /* working parameters */
    GT_MEM_GRADS,      /* fp32 gradient buffer */
    GT_MEM_OPTIM,      /* fp32 master slice + AdamW moments */
    GT_MEM_ACT,        /* activations kept for backward, recomputed ones, and their gradients */
    GT_MEM_WORKSPACE,  /* everything else: token buffers, loss scratch */
    GT_MEM_KINDS
} gt_mem_kind;

typedef struct gt_mem {
    const gt_ops *ops;
    uint64_t cur[GT_MEM_KINDS];
    uint64_t peak[GT_MEM_KINDS];
    uint64_t total_cur;
    uint64_t total_peak;
} gt_mem;

void gt_mem_init(gt_mem *mem, const gt_ops *ops);
void *gt_mem_alloc(gt_mem *mem, gt_mem_kind kind, size_t bytes);
void gt_mem_free(gt_mem *mem, gt_mem_kind kind, void *ptr, size_t bytes);
/* Starts a new measuring window: peaks drop to what is held now. */
void gt_mem_reset_peaks(gt_mem *mem);
const char *gt_mem_kind_name(gt_mem_kind kind);

#endif
