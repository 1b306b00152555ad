/*
 * planner.h — the memory model (docs/recompute.md, "Memory model") and the recompute planner.
 *
 * Predicts, per rank, the bytes of model state (working parameters, gradients, optimizer state as
 * sharded), the activation high-water mark of one micro-batch under a plan, and the extra forward
 * FLOPs of the plan. `auto` searches every plan shape (which blocks recompute, in segments of which
 * length, which keep selectively) for the fastest predicted step that fits memory.budget, per ZeRO
 * stage, grad_sync, micro-batch and prefetch depth, and ranks those by the time model (gt_plan_time).
 *
 * The activation figure and ZeRO's gather and accumulator peaks are the executor's own: model.c's
 * micro-batch run on a dry backend (ops_dry.h), zero.c's state machine on its hooks, the same byte
 * counters a real run reads, so the measured act_peak_bytes, params_peak_bytes and grads_peak_bytes
 * equal them by construction.
 */
#ifndef GT_PLANNER_H
#define GT_PLANNER_H

#include <stdint.h>
#include <stdio.h>

#include "calib.h"
#include "config.h"
#include "recompute.h"
#include "timemodel.h"

typedef struct gt_mem_shape {
    gt_model_config model;
    int micro_batch, seq_len;
    int act_bytes;            /* bytes per working element: 4 fp32, 2 bf16 */
    int keep_probs;           /* backend keeps attention probabilities (CPU) */
    int world;                /* data-parallel ranks */
    uint64_t library_bytes;   /* device memory libraries hold beside the tracked buffers (0 on the CPU):
                                 gt_plan_library_bytes */
    int stage;                /* ZeRO stage 0..3 (zero.h); >= 1: optimizer state and master weights split
                                 over ranks */
    int grad_micro;           /* stage >= 2: gradients reduce-scattered every micro-batch */
    int grad_accum;           /* micro-batches per step (communication volume); 0 means 1 */
    int prefetch;             /* ZeRO-3 gathers in flight ahead of use (dist.prefetch) */
    int documents;            /* data.document_mask or data.reset_positions: an int32 document start per
                                 token of the micro-batch (model.h gt_model_set_documents) */
    double bucket_mb;         /* grad_sync step: gradient bucket size (dist.bucket_mb; the time model) */
    int overlap_param_gather; /* ZeRO-1/2: the weights' gather in the next forward (the time model) */
    int host_comm;            /* the collectives run on MPI over host memory (the CPU backend): its
                                 reduce-scatters' staging is counted (staging_bytes) */
} gt_mem_shape;

typedef struct gt_mem_estimate {
    uint64_t params_bytes;      /* working parameters */
    uint64_t grads_bytes;       /* fp32 gradients */
    uint64_t optim_bytes;       /* fp32 master + exp_avg + exp_avg_sq of this rank's slice */
    uint64_t workspace_bytes;   /* token buffers and the RoPE table */
    uint64_t act_peak_bytes;    /* activation high-water mark of one micro-batch */
    uint64_t library_bytes;     /* cuBLASLt, NCCL and cuDNN scratch (shape.library_bytes); not in the tracked
                                   mem_peak_bytes, which counts gtrain's own buffers only */
    uint64_t staging_bytes;     /* the MPI reduce-scatters' host staging at its peak (gt_plan_staging_bytes;
                                   the metrics' comm_staging_bytes), not in mem_peak_bytes either */
    uint64_t total_bytes;       /* sum of the above */
    /* ZeRO-2/3 parts of params_bytes and grads_bytes (0 otherwise): */
    uint64_t gather_bytes;      /* high-water mark of gathered units (ZeRO-3) */
    uint64_t grad_buffer_bytes; /* high-water mark of unit gradient accumulators (grad_sync micro) */
    double comm_bytes;          /* bytes a rank sends per optimizer step, ring model (comm.h),
                                   with the v-collectives at their mean (W-1)/W x total */
    double forward_flops;       /* one micro-batch forward, model FLOPs */
    double recompute_flops;     /* extra forward FLOPs the plan spends in backward */
} gt_mem_estimate;

/* Device memory beside gtrain's tracked buffers, per rank (0 on the CPU), counted in every total:
 *   - cuBLASLt's fixed workspace (GT_CUDA_MATMUL_WORKSPACE_BYTES, ops.h; cuda_matmul.cu);
 *   - NCCL's communication buffers when the run makes an NCCL communicator (gt_plan_uses_nccl, which
 *     train.c's choice of communicator calls: dist.comm = nccl, or auto on more than one rank; one GPU
 *     otherwise gets the local communicator and NCCL holds nothing), an estimate (per channel and peer a few MiB per protocol; NCCL's own figure depends
 *     on the topology);
 *   - with train.cuda_attention = cudnn, the scratch cuDNN's attention backward allocates for its call
 *     (cuda_attention_cudnn.cu): D (B, NH, T) and the fp32 dQ accumulator (B, NH, T, HD); cuDNN's own
 *     workspace beside them is not known before its plan is built and is not counted.
 * comm: the config's dist.comm (auto | nccl | mpi); attention: its train.cuda_attention. */
#define GT_PLAN_NCCL_BUFFERS ((uint64_t)512 << 20)
int gt_plan_uses_nccl(int cuda, int world, gt_comm_choice comm);
uint64_t gt_plan_cudnn_scratch_bytes(const gt_model_config *m, int micro_batch, int seq_len);
uint64_t gt_plan_library_bytes(int cuda, int world, gt_comm_choice comm, gt_cuda_attention attention,
                               const gt_model_config *m, int micro_batch, int seq_len);

/* Predicts memory and FLOPs of `plan` for `shape`. */
/* The asynchronous save's host copy per rank (checkpoint.async = true with a checkpoint.dir; else 0):
 * the fp32 master weights and both AdamW moments of the rank's slice of the flat parameter vector,
 * 12 bytes per element, the largest slice being ceil(P / world) elements at every shard stage
 * (without ZeRO each rank writes the slice it would own: runstate_save.c). Host memory on every backend
 * and not in total_bytes: --plan prints it and the memory check before step 1 counts it
 * (gt_preflight_memory), both from here. */
uint64_t gt_plan_snapshot_bytes(const gt_config *cfg, const gt_mem_shape *shape);

/* The memory snapshots' shared memory per rank (checkpoint.memory_every not 0, with a checkpoint.dir;
 * else 0): 2 slot files of its own (memsnap.h) and, with `copies` (the run spans nodes), 2 copies of
 * its ward's (a partner's on another node): each a 4 KiB header, 12 bytes per element of the range
 * a rank's optimizer owns (ceil(P / world) with ZeRO, all P without) and the config text. Node-local
 * shared memory is host memory: --plan prints it and the memory check before step 1 counts it, both
 * from here. */
uint64_t gt_plan_memsnap_bytes(const gt_config *cfg, const gt_mem_shape *shape, int copies);

/* The host staging of the MPI reduce-scatters (comm.h) of `rank` (-1: the most of any rank) at its peak,
 * when shape->host_comm and world > 1 (else 0; NCCL's buffers are in library_bytes):
 *   - one reduce-scatter of the padded gradient at the step (ZeRO-1, ZeRO-2/3 with grad_sync = step,
 *     no buckets): its chunked staging, W x min(chunk, slice) x 4 bytes, at most
 *     GT_COMM_MPI_STAGING_BYTES, kept from step 1 on (gt_comm_mpi_staging_bytes);
 *   - gradient buckets (dist.bucket_mb): each bucket's W x (its elements in the rank's slice) x 4 from
 *     its start to its wait, at most GT_ZERO_BUCKETS_IN_FLIGHT of them at once
 *     (gt_zero_bucket_staging_peak);
 *   - grad_sync = micro: one unit's reduce-scatter in flight at a time (zero.h), the largest unit's
 *     W x (its elements in the rank's slice) x 4.
 * Every rank's figure is a function of the shape alone; the estimate takes the most of any rank. */
uint64_t gt_plan_staging_bytes(const gt_mem_shape *shape, int rank);

void gt_plan_estimate(const gt_mem_shape *shape, const gt_plan *plan, gt_mem_estimate *est);

/* The last recompute segment would be re-run in backward right after the forward made it. When
 * keeping its blocks' activations (the tail of the plan becomes keep-all) raises neither the
 * activation peak nor the total (the head's own buffers or the backward's scratch already set the
 * peak), the plan keeps them and saves that recompute. Returns 1 when it changed the plan; *est (may
 * be NULL) gets the estimate of the plan it leaves. */
int gt_plan_keep_tail(gt_plan *plan, const gt_mem_shape *shape, gt_mem_estimate *est);

/* The plan the trainer runs for a fixed (not auto) policy: gt_plan_from_policy, then
 * gt_plan_keep_tail; *est its estimate. */
void gt_plan_for_policy(gt_plan *plan, const gt_policy *policy, const gt_mem_shape *shape, gt_mem_estimate *est);

/* Chooses the plan with the least recompute FLOPs whose total fits `budget_bytes` (tails kept as
 * gt_plan_keep_tail says). Returns 0, or
 * -1 when nothing fits (then *plan is the smallest-memory plan and est its estimate). */
int gt_plan_auto(const gt_mem_shape *shape, uint64_t budget_bytes, gt_plan *plan, gt_mem_estimate *est);

/* One plan auto weighed: the shape (stage, grad_sync, micro-batch, grad_accum, prefetch), the recompute
 * plan, its memory and its predicted step. */
typedef struct gt_plan_option {
    gt_mem_shape shape;
    gt_plan plan;
    gt_mem_estimate est;
    gt_time_estimate time;
} gt_plan_option;

#define GT_PLAN_TOP 5 /* the fastest plans that fit, as `gtrain --plan` lists them */

/* What auto searches; a field not auto is fixed at the base shape's value. */
typedef struct gt_plan_search {
    int stage;               /* ZeRO stage 0..3, or -1: any */
    int grad_micro;          /* stage >= 2: 0 step, 1 micro, or -1: either */
    const gt_policy *policy; /* NULL or auto: the least recompute that fits, per shape; else this policy */
    int per_rank;            /* > 0: the micro-batch is any divisor of this many sequences per rank and step,
                                grad_accum the quotient (train.global_batch / world); 0: the base shape's */
    int prefetch;            /* ZeRO-3 gathers ahead, or -1: 0, 1 or 2 */
    uint64_t budget;         /* bytes per rank; 0: everything fits */
    const gt_calib *calib;   /* the time model's rates */
    int cudnn;               /* train.cuda_attention = cudnn: its scratch scales with the micro-batch */
    int bucket_auto;         /* dist.bucket_mb = auto: each option where buckets apply takes the size of
                                gt_plan_bucket_sizes with the fastest step (0 on a tie) */
} gt_plan_search;

/* dist.bucket_mb = auto: the sizes (MiB) the search tries where gradient buckets apply (grad_sync
 * step, ZeRO-1 and above, more than one rank): 0 (one reduction after the backward) first, then 1, 4,
 * 16, 64 MiB and one, two and four blocks' fp32 gradients, ascending, each once, at most 1024. Returns
 * how many (at most GT_PLAN_BUCKET_SIZES). */
#define GT_PLAN_BUCKET_SIZES 8
int gt_plan_bucket_sizes(const gt_model_config *m, double *mib);

/* `auto`: among every (micro-batch, prefetch, stage, grad_sync, recompute plan) the search allows,
 * those that fit `budget` (memory first: the time model prices only what fits), ranked by the time
 * model's predicted step (gt_plan_time; ties to the least memory). Within one (micro-batch, prefetch,
 * stage, grad_sync) the recompute plans that fit are ranked by their recompute time at the search's
 * rates (each block kind's compute on the dry schedule: a recomputed block, a selective one, a
 * segment's saved down-projection), and the 4 least costly are priced in full (gt_plan_time, with
 * the communication recompute can expose) and the fastest kept; with recompute auto on 16 blocks or
 * more that search runs first in strides of N/8 blocks, and the GT_PLAN_TOP fastest of that pass are
 * searched again in full (keeping the faster of the two plans) and ranked again.
 * *best gets the fastest and top (may be NULL) the fastest GT_PLAN_TOP in order, *n_top how many.
 * Returns 0, or -1 when nothing fits (then *best is the smallest, *n_top 0). */
int gt_plan_auto_all(const gt_mem_shape *base, const gt_plan_search *search, gt_plan_option *best,
                     gt_plan_option *top, int *n_top);

/* The shape of a run of cfg on `world` ranks of a backend (cuda: 1 for the GPU; act_bytes 2 or 4;
 * keep_probs: the backend keeps attention probabilities), with the stage and grad_sync as configured
 * (auto: stage 0 and step, micro_batch and prefetch 1, until gt_plan_resolve chooses). */
gt_mem_shape gt_plan_shape(const gt_config *cfg, int cuda, int act_bytes, int keep_probs, int world);

/* What a run trains with once dist.shard, dist.grad_sync, memory.recompute, train.micro_batch (with
 * train.global_batch, grad_accum), dist.prefetch and dist.bucket_mb are settled: `auto` is resolved here, once, for
 * the trainer, `gtrain --plan` and its report alike. */
typedef struct gt_plan_choice {
    gt_mem_shape shape;        /* the shape trained: stage, grad_micro, micro_batch, grad_accum, prefetch */
    gt_policy policy;          /* memory.recompute as configured (auto stays auto) */
    gt_plan plan;              /* the recompute plan the executor runs */
    gt_mem_estimate predicted; /* the plan's estimate for shape */
    int stage;                 /* ZeRO stage 0..3 */
    int grad_micro;            /* stage >= 2 and gradients reduce-scattered every micro-batch */
    int chosen_by_auto;        /* one of the settings was auto (gt_plan_auto_all chose) */
    int fits;                  /* 0: auto found nothing within memory.budget; the smallest choice is given */
    gt_time_estimate time;     /* chosen_by_auto: the choice's predicted step */
    gt_plan_option top[GT_PLAN_TOP]; /* chosen_by_auto: the fastest plans that fit, fastest first */
    int n_top;
    int bucket_auto;           /* dist.bucket_mb = auto: shape.bucket_mb is the search's choice */
    char memsnap_off[1024];    /* checkpoint.memory_every = auto and the slots do not fit here: why (the
                                * report shows none); empty otherwise. gtrain --plan sets it. */
} gt_plan_choice;

/* Resolves cfg's settings for `base` (gt_plan_shape), auto ranked at the rates of `calib`. With
 * train.global_batch set, grad_accum follows from it on base->world ranks. Returns 0, or -1 (err: one
 * line naming the file, line and key) when memory.recompute does not parse (gt_config_load has checked
 * it already), or when global_batch is not a multiple of micro_batch x world, or disagrees with a
 * grad_accum set beside it. */
int gt_plan_resolve(const gt_config *cfg, const gt_mem_shape *base, const gt_calib *calib, gt_plan_choice *choice,
                    char *err, size_t err_len);

/* The `gtrain --plan` report of a resolved choice: model state, every stage and policy's memory,
 * extra FLOPs and fit, and what auto chose. */
void gt_plan_report(FILE *out, const gt_config *cfg, const gt_plan_choice *choice);

/* The predicted step of `plan` for `shape` at the rates of `calib` (timemodel.h): the executor's
 * micro-batch run dry, priced op by op, played grad_accum times on a compute and a communication
 * stream, and the step after it. recompute_s: the plan's compute beyond the same schedule with
 * recompute none. */
void gt_plan_time(const gt_mem_shape *shape, const gt_plan *plan, const gt_calib *calib, gt_time_estimate *t);

/* The lines `gtrain --plan` prints after the memory report: the predicted step of the choice,
 * tokens/s, MFU, exposed communication and recompute's share, where the rates come from
 * (calib_note, gt_calib_for_run), and when auto chose, the fastest plans that fit. */
void gt_plan_report_time(FILE *out, const gt_plan_choice *choice, const gt_calib *calib, const char *calib_note);

#endif
