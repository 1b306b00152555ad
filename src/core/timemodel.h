/*
 * timemodel.h — the time model (docs/planner.md, "Time model"): the step the executor would run,
 * priced op by op and collective by collective, on two streams.
 *
 * The schedule is the executor's own: the planner runs a micro-batch of the real model on the dry
 * backend (ops_dry.h), as the memory model does, with ZeRO's dry state machine on the unit hooks;
 * every op the executor calls reports its cost (gt_op_cost) and is priced with the calibration
 * (calib.h): FLOPs over the measured rate of its GEMM shape or of attention, bytes over the measured
 * bandwidth of memory-bound kernels. The hooks mark where a ZeRO-3 unit is first needed (a gather)
 * and where a unit's gradients are complete (its reduce-scatter under grad_sync micro). That trace,
 * one micro-batch long, is then played grad_accum times on a compute stream and a communication
 * stream:
 *   - a gather is issued when its unit is needed or, with dist.prefetch = d, when the unit d
 *     acquisitions before it is acquired; the stream runs one collective at a time; compute waits
 *     for the gather of the unit it needs;
 *   - a unit's reduce-scatter starts when its gradients are done (and the stream is free); the end
 *     of a micro-batch waits for them (model.h: micro_end finishes the micro-batch's reductions);
 *   - gradient buckets (grad_sync step, bucket_bytes > 0; zero.h): in the last micro-batch the
 *     units' gradient marks are grouped as zero.c groups them (from the head down, at least
 *     bucket_bytes each), a bucket's reduce-scatter starts when its last unit is done, the rest
 *     (the embedding's bucket) at the end of the backward, and the step waits for them instead of
 *     running its own reduce-scatter;
 *   - the weights' gather in the next forward (ZeRO-1/2, param_gather): the previous step's per-unit
 *     gathers run back to back on the communication stream from the start of the step (the steady
 *     state), and the first micro-batch's forward waits for each unit's at its gather mark; the step
 *     then runs no all-gather of its own;
 *   - after the last micro-batch: the gradient all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1, and
 *     2/3 with grad_sync step, without buckets), the clipping norm's sum of squares and its scalar all-reduce, AdamW
 *     over the rank's slice, the conversion to working parameters, and ZeRO-1/2's all-gather of them;
 *     none of it overlaps anything (the code runs it in order).
 * A collective of S bytes on W ranks takes alpha + f (W-1)/W S / beta (the ring model of comm.h: f = 2
 * for all-reduce, 1 for reduce-scatter and all-gather), 0 on one rank.
 */
#ifndef GT_TIMEMODEL_H
#define GT_TIMEMODEL_H

#include <stdint.h>

#include "calib.h"
#include "ops_dry.h"

typedef enum gt_tev_kind {
    GT_TEV_COMPUTE,    /* seconds of kernels on the compute stream */
    GT_TEV_GATHER,     /* compute needs a unit gathered: bytes of the whole unit (ZeRO-3) */
    GT_TEV_GRAD_DONE,  /* a unit's gradients are complete: bytes of its fp32 gradients (grad_sync micro,
                          and grad_sync step with buckets) */
    GT_TEV_MICRO_END,  /* the micro-batch's reductions are waited for */
} gt_tev_kind;

typedef struct gt_time_event {
    gt_tev_kind kind;
    double seconds; /* GT_TEV_COMPUTE */
    double bytes;   /* GT_TEV_GATHER, GT_TEV_GRAD_DONE; a compute event's bytes while spans are listened to */
    const char *op; /* GT_TEV_COMPUTE while spans are listened to: the op (ops.h); else NULL */
    double flops;   /* ... and its FLOPs */
} gt_time_event;

typedef struct gt_time_trace {
    gt_time_event *ev;
    int n, cap;
    double compute_s; /* sum of the compute events */
    double flops;     /* FLOPs of the ops recorded */
    double kind_s[4]; /* compute seconds by gt_cost_kind (matmul, attention, memory-bound, optimizer) */
} gt_time_trace;

void gt_time_trace_push(gt_time_trace *tr, gt_tev_kind kind, double seconds, double bytes);
/* One op's compute event: merged into the last compute event unless spans are listened to, when
 * each op stays an event with its name, FLOPs and bytes. */
void gt_time_trace_push_op(gt_time_trace *tr, const gt_op_cost *cost, double seconds);
void gt_time_trace_free(gt_time_trace *tr);

/* The step around the micro-batch trace. */
typedef struct gt_time_step {
    int world, stage, grad_micro, grad_accum, prefetch, act_bytes;
    uint64_t n_pad;            /* parameters, padded to a multiple of world when sharded */
    uint64_t slice;            /* this rank's slice of them (n_pad at ZeRO-0) */
    double tokens_per_micro;   /* micro_batch x seq_len on one rank */
    double model_flops;        /* one micro-batch's model FLOPs, forward and backward (3 x forward) */
    double bucket_bytes;       /* grad_sync step, sharded: dist.bucket_mb in bytes (0: one reduction after
                                  the micro-batches) */
    int param_gather;          /* ZeRO-1/2 with dist.overlap_param_gather: the trace's gather marks are
                                  the forward's first use of each unit */
} gt_time_step;

typedef struct gt_time_estimate {
    double step_s;             /* one optimizer step */
    double compute_s;          /* compute stream busy (micro-batches and the step's own kernels) */
    double comm_s;             /* communication stream busy */
    double exposed_comm_s;     /* step_s - compute_s: communication nothing hid */
    double optimizer_s;        /* clipping's sum of squares, AdamW, the conversion to working */
    double recompute_s;        /* the plan's recompute, grad_accum micro-batches (the planner fills it) */
    double tokens_per_s;       /* world x grad_accum x tokens_per_micro / step_s */
    double mfu;                /* model FLOPs / step_s / peak_flops; 0 when the peak is unknown */
    int measured;              /* the calibration was measured (1) or the defaults (0) */
    double kind_s[4];          /* the micro-batches' compute by gt_cost_kind (the planner fills it) */
} gt_time_estimate;

/* Seconds one op call takes at the calibration's rates, a micro-batch's kernels at the in-step factor
 * given (a plan's micro-batch size's: gt_calib_in_step_at; <= 0: 1; the step's own sum of squares,
 * AdamW and conversion without it). */
double gt_time_op_seconds_at(const gt_calib *c, const gt_op_cost *cost, double in_step);

/* Seconds of one collective: kind 'a' all-reduce, 'r' reduce-scatter, 'g' all-gather, of `bytes`
 * (the whole buffer) over `world` ranks. */
double gt_time_collective(const gt_calib *c, int world, char kind, double bytes);

/* A picture of the simulated step (trace.h, `gtrain --plan --trace`): while a listener is set, every
 * op, collective and wait of gt_time_simulate is reported with its start and end, in seconds from the
 * step's start. stream 0 is compute, 1 communication. name: an op of ops.h, a collective as comm.h
 * names its call (all_gather_v, reduce_scatter_v, all_reduce, reduce_scatter, all_gather,
 * all_reduce_scalar), a wait of the compute stream ("wait_" and the collective's name), "micro_batch"
 * (index in `micro`) or "step". cat: "op", "collective", "wait", "micro_batch", "step". Not
 * thread-safe, as the planner is not: set it around one simulation (NULL: none, the default). */
typedef struct gt_time_span {
    int stream, micro;       /* micro: the micro-batch, -1 after the last */
    const char *name, *cat;
    double start_s, end_s, flops, bytes;
} gt_time_span;
void gt_time_set_span_listener(void (*fn)(void *ctx, const gt_time_span *span), void *ctx);

/* Plays `tr` (one micro-batch) grad_accum times and the step after it (see the top). */
void gt_time_simulate(const gt_time_trace *tr, const gt_time_step *st, const gt_calib *c, gt_time_estimate *out);

#endif
