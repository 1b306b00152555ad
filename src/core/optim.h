/*
 * optim.h — the optimizer step after the last micro-batch: one gradient reduction, the global
 * gradient norm and clipping, AdamW on the slice this rank owns, and the new working parameters
 * gathered back to every rank.
 *
 * Sharding (`dist.shard`):
 *   none       all-reduce the gradients; every rank holds the full fp32 master, exp_avg and
 *              exp_avg_sq and runs the full AdamW (replicated state)
 *   optimizer  ZeRO-1: the flat vector is split into W padded slices (src/dist/shard.h); rank r
 *              holds master/exp_avg/exp_avg_sq for slice r only; gradients are reduce-scattered,
 *              the norm comes from per-slice sums of squares, and the updated working parameters
 *              are all-gathered
 *   gradients  ZeRO-2 and parameters ZeRO-3 (src/core/zero.h): the same slices; with
 *              grad_sync = micro the gradient slice arrives reduced (grad_slice), and under ZeRO-3
 *              the new working parameters stay in this rank's shard (param_shard)
 * Weight decay applies to the tensors gt_tensor_info.decay marks (matrices and embeddings, not the
 * norm weights); the learning rate follows warm-up then cosine/linear/constant decay to min_lr.
 */
#ifndef GT_OPTIM_H
#define GT_OPTIM_H

#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "memtrack.h"
#include "model.h"
#include "shard.h"

typedef struct gt_optim {
    const gt_ops *ops;
    gt_mem *mem;
    gt_comm *comm;
    gt_model *model;
    int sharded;            /* 1: ZeRO-1 */
    gt_shard shard;         /* the slice this rank updates (the whole vector when not sharded) */
    float *master;          /* (shard.slice_len) fp32 master weights of the slice */
    float *exp_avg;         /* (shard.slice_len) */
    float *exp_avg_sq;      /* (shard.slice_len) */
    size_t state_len;       /* elements allocated for each of the three */
    gt_shard_piece *pieces; /* the tensors the slice overlaps, for per-tensor weight decay */
    size_t n_pieces;
    int t;                  /* AdamW steps taken (bias correction) */
    /* ZeRO-2/3 (zero.h), set by the caller after gt_optim_init: */
    float *grad_slice;      /* (shard.slice_len) the reduced gradient slice (grad_sync = micro):
                               the step reduces nothing more; NULL: the model's gradient buffer */
    void *param_shard;      /* (shard.slice_len) ZeRO-3 working parameters of the slice: the new
                               values go there and nothing is gathered; NULL: the model's buffer */
    int reduced_in_backward; /* sharded, grad_sync = step with buckets: the caller reduce-scattered
                                the buffer bucket by bucket (zero.h); the step reduces nothing */
    /* ZeRO-1/2 with dist.overlap_param_gather (zero.h): the step writes this rank's new working
     * parameters and calls gather_start, which starts their all-gather unit by unit (the next forward
     * waits per unit); gt_optim_publish_params calls gather_finish first. NULL: one blocking gather. */
    void (*gather_start)(void *ctx);
    void (*gather_finish)(void *ctx);
    void *gather_ctx;
} gt_optim;

/* n_padded: the length of the model's parameter and gradient buffers (>= n_params, a multiple of
 * the world size when sharded). initial_params_host: the full fp32 initial parameters, or NULL to
 * leave the master slice zero for the caller to fill (a checkpoint import, then publish). */
void gt_optim_init(gt_optim *opt, const gt_ops *ops, gt_mem *mem, gt_comm *comm, gt_model *model,
                   int sharded, const float *initial_params_host);
void gt_optim_free(gt_optim *opt);

/* Padded length of parameter/gradient buffers for n parameters on `world` ranks. */
size_t gt_optim_padded_len(size_t n_params, int world, int sharded);

/* Learning rate of optimizer step `step` (1-based) under the config's schedule. */
double gt_lr_at(const gt_config *cfg, int step);

/* What an optimizer step did (the same on every rank). */
typedef enum gt_step_outcome {
    GT_STEP_APPLIED,           /* the update was applied */
    GT_STEP_SKIPPED_NONFINITE, /* a loss or the gradient norm was NaN or infinite: nothing was updated */
    GT_STEP_SKIPPED_SPIKE,     /* the loss or the gradient norm was a spike (train.spike_zscore, spike.h):
                                  nothing was updated */
} gt_step_outcome;

/* Reduces the gradients (one collective), clips, updates, gathers; *grad_norm: the global norm
 * before clipping. A gradient whose global norm is NaN or infinite (GT_STEP_SKIPPED_NONFINITE), or
 * above max_grad_norm when that is above 0 (GT_STEP_SKIPPED_SPIKE), is never applied: the weights,
 * moments and AdamW's t stay as they were (the trainer then stops or skips the step,
 * train.nonfinite). The learning rate of the step is gt_lr_at(cfg, step). */
gt_step_outcome gt_optim_step(gt_optim *opt, const gt_config *cfg, int step, double max_grad_norm,
                              double *grad_norm);

/* Working parameters := to_working(master) of this rank's slice, then all-gathered (with ZeRO-1):
 * the end of every step, and after a state file filled the master weights. Collective. */
void gt_optim_publish_params(gt_optim *opt);

/* Bytes of optimizer state + master weights held by this rank. */
uint64_t gt_optim_bytes(const gt_optim *opt);

#endif
