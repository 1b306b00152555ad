/*
 * zero.h — ZeRO-2 and ZeRO-3: ranks own shards of the gradients and of the working parameters, and
 * the executor (model.c) acquires a unit's parameters or gradient accumulator when it needs them.
 *
 * Stages (`dist.shard`): 0 none, 1 optimizer, 2 gradients, 3 parameters. This module serves 2 and 3;
 * 0 and 1 use the model's flat buffers and gt_optim_step's one reduction as before.
 *
 * Ownership is ZeRO-1's, unchanged: rank r owns the flat slice [r*slice_len, (r+1)*slice_len)
 * clipped to [0, n) (src/dist/shard.h) of fp32 master weights, Adam moments, the fp32 gradient
 * slice (ZeRO-2/3 with grad_sync = micro) and, with ZeRO-3, the working parameters. The state file,
 * the Hugging Face import and resharding therefore see exactly what they see under ZeRO-1.
 * Communication is per unit (model.h: the embedding, each block, the final norm with lm_head):
 * a unit [u0, u1) meets rank r's slice in counts[r] = |[u0, u1) ∩ slice_r| elements, the blocks
 * of a variable-count collective in rank order (comm.h):
 *   gather (ZeRO-3)       the unit's working parameters: all_gather_v of every rank's piece into a
 *                         buffer of u1 - u0 elements (GT_MEM_PARAMS), released when the executor
 *                         is done with it (a reference count: a recomputed block keeps the gather
 *                         of its recompute for its backward, so a block is gathered ONCE per
 *                         backward; the tied embedding is gathered again for the head)
 *   reduce (grad_sync = micro)  the unit's gradient accumulator (u1 - u0 fp32, GT_MEM_GRADS) is
 *                         zero except this rank's block, which starts as the gradient slice's
 *                         piece; backward adds into it, it is reduce-scattered in place, and this
 *                         rank's block (old slice + every rank's gradient) is copied back to the
 *                         slice: micro-batches accumulate there with device copies only. Then
 *                         the accumulator is freed. The tied embedding's accumulator is open
 *                         from the head's backward to the embedding's backward (one reduction).
 * Overlap (both on the executor's hooks, model.h): the executor announces the order of its first
 * acquisitions, and each acquisition starts the gathers of the next `depth` units of that order not
 * yet gathered (dist.prefetch, default 1), so a unit's gather runs while the unit before it
 * computes; in flight they hold their buffers, so gathered memory is at most the units in use plus
 * `depth`. A unit's reduce-scatter is started when its backward ends and waited for when the next
 * unit's ends (or at the end of the micro-batch): at most two accumulators. The executor calls
 * `progress` between kernels, which tests the requests in flight (MPI moves data only inside calls).
 * With grad_sync = step the model keeps the full fp32 gradient buffer (padded) and gt_optim_step
 * reduce-scatters it once, as ZeRO-1 (ZeRO-2 + step IS ZeRO-1; ZeRO-3 + step keeps sharded
 * parameters).
 */
#ifndef GT_ZERO_H
#define GT_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "memtrack.h"
#include "model.h"
#include "shard.h"

typedef struct gt_zero_unit {
    size_t offset, numel;   /* the unit's range of the flat vector */
    size_t *counts;         /* (world) elements of the unit in each rank's slice */
    size_t own_start;       /* this rank's piece: first element relative to the unit ... */
    size_t own_count;       /* ... its length (counts[rank]) ... */
    size_t own_in_slice;    /* ... and where it sits relative to shard.begin */
    void *gathered;         /* ZeRO-3: (numel) working, from the gather's start to the last release */
    gt_comm_request *gather_req;  /* the gather while in flight (prefetched or not yet waited for) */
    int refs;               /* acquisitions not yet released */
    float *acc;             /* grad_sync = micro: (numel) fp32 accumulator, until its reduction ends */
    gt_comm_request *reduce_req;  /* the reduce-scatter while in flight */
    int grad_refs;
} gt_zero_unit;

/* A gradient bucket (grad_sync = step, dist.bucket_mb > 0): consecutive units [u_lo, u_hi) and the
 * range [b0, b1) of the padded flat gradient buffer they cover (the top bucket also the padding). */
typedef struct gt_zero_bucket {
    int u_lo, u_hi;
    size_t b0, b1;
    size_t *counts;         /* (world) elements of [b0, b1) in each rank's padded slice */
    size_t own_start;       /* this rank's block, relative to b0 */
    int left;               /* units whose gradients are not final yet (armed step) */
    int started;
    gt_comm_request *req;
} gt_zero_bucket;

typedef struct gt_zero {
    const gt_ops *ops;
    gt_mem *mem;
    gt_comm *comm;
    int stage;              /* 2 or 3 */
    int grad_micro;         /* 1: reduce-scatter every micro-batch (no full gradient buffer) */
    int depth;              /* ZeRO-3 prefetch: gathers started ahead of use, at most */
    gt_shard shard;         /* this rank's flat slice (as ZeRO-1, also at world 1) */
    size_t eb;              /* bytes per working element */
    int n_units;
    gt_zero_unit *units;
    void *param_shard;      /* ZeRO-3: (slice_len) working parameters of the slice, GT_MEM_PARAMS */
    float *grad_slice;      /* grad_micro: (slice_len) fp32 gradient slice, GT_MEM_GRADS */
    int *sched, n_sched, cursor;  /* the executor's order of first acquisitions (model.h) */
    int ahead;              /* units gathered ahead of use and not acquired yet */
    int pending;            /* the unit whose reduce-scatter is in flight, or -1 */
    uint64_t gathers, reductions;   /* collectives started since creation (tests) */
    /* gradient buckets (gt_zero_set_buckets): the flat gradient buffer reduced bucket by bucket
     * during the last micro-batch's backward, as each bucket's gradients become final */
    float *flat_grads;
    size_t n_padded;
    int n_buckets, armed, block0_done;
    gt_zero_bucket *buckets;
    int *unit_bucket;       /* (n_units) the bucket of each unit */
    int *bucket_order;      /* (n_units) the buckets in the order started this step ... */
    int n_started, n_waited; /* ... how many started, and how many of those waited for */
    uint64_t bucket_starts, bucket_early;  /* since creation: bucket reductions started, and those
                                              started before block 0's backward ended */
    /* ZeRO-1/2 parameter gathers in the next forward (gt_zero_set_param_gathers) */
    char *flat_params;
    int params_in_flight;   /* gathers of this round not all waited for */
    int params_next;        /* the next unit whose gather is not started yet */
    int params_live, params_live_max; /* started and not waited for: now, and the most at once since
                                         gt_zero_params_reset_max (tests) */
    /* dry run (the planner): no memory, no communication, only the byte counts below */
    int dry;
    uint64_t dry_cur[2], dry_peak[2];  /* [0] gathered parameters, [1] gradient accumulators */
} gt_zero;
/* The stage of dist.shard is its enum value (config.h's gt_shard_stage: 0 none .. 3 parameters). */

/* Sets up units and slices for `layout`; allocates param_shard (stage 3) and grad_slice
 * (grad_micro). depth: prefetch depth (dist.prefetch). */
void gt_zero_init(gt_zero *z, const gt_ops *ops, gt_mem *mem, gt_comm *comm, const gt_layout *layout, int stage,
                  int grad_micro, int depth);

/* A dry run's zero (the planner's): the same state machine with no memory and no communication;
 * dry_peak gets the high-water marks, in bytes, of gathered units (stage 3) and of gradient
 * accumulators (grad_micro) while a dry model (model.h) runs a micro-batch on its hooks. */
void gt_zero_init_dry(gt_zero *z, const gt_layout *layout, int stage, int grad_micro, int depth, int act_bytes);
void gt_zero_free(gt_zero *z);

/* Gradient buckets for grad_sync = step at stages 1-3 (world > 1): the units, from the last (the
 * head) down, are cut into buckets of at least bucket_bytes of fp32 gradients each (consecutive
 * units; a unit is never split). The top bucket also covers the padding up to n_padded, so the
 * buckets tile the padded flat buffer `grads` (what gt_optim_step would reduce-scatter at once).
 * Call before gt_zero_hooks. */
void gt_zero_set_buckets(gt_zero *z, float *grads, size_t n_padded, size_t bucket_bytes);

/* The cut of gt_zero_set_buckets from the units' sizes (numel, n_units): u_lo[i] (n_units room) the
 * first unit of bucket i, the buckets from the head down (bucket i ends where bucket i-1 starts, the
 * first at the top). Returns the number of buckets. */
int gt_zero_bucket_cut(const size_t *numel, int n_units, size_t bucket_bytes, int *u_lo);

/* Buckets in flight at once: starting another waits for the oldest first (in the order started), so
 * the MPI staging of the in-flight reduce-scatters (comm.h: W x a bucket's elements in the rank's
 * slice, each) stays that of two buckets instead of growing to the whole gradient's over the backward.
 * Bucket i's transfer still has the backward of bucket i+1's units to hide behind. */
#define GT_ZERO_BUCKETS_IN_FLIGHT 2

/* The most staging bytes `rank`'s bucket reduce-scatters hold at once on MPI (rank -1: the most of any
 * rank), for units of these sizes back to back on `world` ranks (n_padded: the padded flat length):
 * the window of the GT_ZERO_BUCKETS_IN_FLIGHT started last, W x 4 bytes per element of their buckets in
 * the rank's padded slice. The planner's staging_bytes (planner.h); the metrics' comm_staging_bytes. */
uint64_t gt_zero_bucket_staging_peak(const size_t *numel, int n_units, size_t n_padded, int world, int rank,
                                     size_t bucket_bytes);
/* Before the step's last micro-batch: its backward starts each bucket's reduce-scatter (in place,
 * gt_comm_reduce_scatter_v_sum_start) once the gradients of all its units are final; the bucket
 * holding the embedding (the last to become final) waits for gt_zero_buckets_finish, which starts
 * what is left and waits for every bucket, in the order started (at most GT_ZERO_BUCKETS_IN_FLIGHT
 * in flight: a start waits for the oldest first). Afterwards this rank's padded
 * slice of `grads` holds the summed gradient: on MPI bit for bit what the flat reduce-scatter gives
 * (comm.h: rank-order sums). */
void gt_zero_buckets_arm(gt_zero *z);
void gt_zero_buckets_finish(gt_zero *z);

/* ZeRO-1/2 (dist.overlap_param_gather, world > 1): the all-gather of the new working parameters runs
 * unit by unit in forward order (in place on the flat buffer `params`: each rank's piece of each
 * unit, the v-form) and each unit's is waited for when the executor first needs the unit's
 * parameters (the next forward, or an evaluation), so the gather overlaps the next step's forward,
 * as Megatron-LM's --overlap-param-gather does. At most GT_ZERO_PARAM_GATHERS_IN_FLIGHT are in
 * flight: gt_zero_params_start starts the first ones, and each wait starts the next. Started all at
 * once, MPI interleaves them on the link, so the first unit's arrives only with the last: the first
 * forward would wait for the whole gather. gt_zero_params_finish waits for whatever is left (before
 * any other write of the buffer, and at gt_zero_free). Call before gt_zero_hooks. */
#define GT_ZERO_PARAM_GATHERS_IN_FLIGHT 2
void gt_zero_set_param_gathers(gt_zero *z, void *params);
void gt_zero_params_start(void *z);
void gt_zero_params_finish(void *z);
void gt_zero_params_reset_max(gt_zero *z); /* params_live_max = the gathers in flight now */

/* The hooks model.c calls (gt_model_set_unit_hooks): parameters only for stage 3, gradients with
 * grad_micro (accumulators) or buckets (the flat buffer, counted while armed); ZeRO-1/2 parameters
 * with the parameter gathers (the flat buffer, once its unit's gather is waited for). */
void gt_zero_hooks(gt_zero *z, gt_unit_hooks *hooks);

#endif
