/*
 * planner.h — the memory model of DESIGN.md ("Memory model") and the recompute planner.
 *
 * Predicts, per rank, the bytes of model state (working parameters, gradients, optimizer state as
 * sharded), the activation high-water mark of one micro-batch under a plan, and the extra forward
 * FLOPs of the plan. `auto` searches every plan shape (which blocks recompute, in segments of which
 * length, which keep selectively) for the least recompute work that fits memory.budget.
 *
 * The activation figure follows the executor's allocation order in model.c, so the measured
 * act_peak_bytes equals it exactly; tests/test_recompute.c holds the two together.
 */
#ifndef GT_PLANNER_H
#define GT_PLANNER_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "recompute.h"

typedef struct gt_mem_shape {
    gt_model_config model;
    int micro_batch, seq_len;
    int act_bytes;            /* bytes per working element: 4 fp32, 2 bf16 */
    int keep_probs;           /* backend keeps attention probabilities (CPU) */
    int world;                /* data-parallel ranks */
    int shard_optimizer;      /* 1: optimizer state and master weights split over ranks (ZeRO-1) */
    uint64_t library_bytes;   /* device memory libraries hold beside the tracked buffers (0 on the CPU):
                                 gt_plan_library_bytes */
} gt_mem_shape;

typedef struct gt_mem_estimate {
    uint64_t params_bytes;      /* working parameters */
    uint64_t grads_bytes;       /* fp32 gradients */
    uint64_t optim_bytes;       /* fp32 master + exp_avg + exp_avg_sq of this rank's slice */
    uint64_t workspace_bytes;   /* token buffers and the RoPE table */
    uint64_t act_peak_bytes;    /* activation high-water mark of one micro-batch */
    uint64_t library_bytes;     /* cuBLASLt and NCCL workspaces (shape.library_bytes); not in the tracked
                                   mem_peak_bytes, which counts gtrain's own buffers only */
    uint64_t total_bytes;       /* sum of the above */
    double forward_flops;       /* one micro-batch forward, model FLOPs */
    double recompute_flops;     /* extra forward FLOPs the plan spends in backward */
} gt_mem_estimate;

/* Workspaces the CUDA backend's libraries hold outside gtrain's allocation accounting: cuBLASLt's
 * fixed workspace (cuda_matmul.cu), and with more than one rank NCCL's communication buffers, an
 * estimate (per channel and peer a few MiB per protocol; NCCL's own figure depends on the topology).
 * With one rank the trainer uses the local communicator and NCCL holds nothing. */
#define GT_PLAN_CUBLASLT_WORKSPACE ((uint64_t)32 << 20)
#define GT_PLAN_NCCL_BUFFERS ((uint64_t)512 << 20)
uint64_t gt_plan_library_bytes(int cuda, int world);

/* Parameters of the model. */
uint64_t gt_model_param_count(const gt_model_config *model);

/* Predicts memory and FLOPs of `plan` for `shape`. */
void gt_plan_estimate(const gt_mem_shape *shape, const gt_plan *plan, gt_mem_estimate *est);

/* Chooses the plan with the least recompute FLOPs whose total fits `budget_bytes`. Returns 0, or
 * -1 when nothing fits (then *plan is the smallest-memory plan and est its estimate). */
int gt_plan_auto(const gt_mem_shape *shape, uint64_t budget_bytes, gt_plan *plan, gt_mem_estimate *est);

/* The `gtrain --plan` report: model state, every policy's activations, extra FLOPs and fit. */
void gt_plan_report(FILE *out, const gt_config *cfg, const gt_mem_shape *shape);

/* Formats bytes as "1.23 GiB". */
void gt_format_bytes(uint64_t bytes, char *out, size_t out_len);

#endif
