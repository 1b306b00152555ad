/*
 * ops_dry.h — the kernels interface with nothing behind it: the backend of a dry run.
 *
 * Every kernel returns at once; alloc hands out a token that is never dereferenced (nothing reads
 * or writes device memory in a dry run) and free takes it back; copy_to_host zero-fills its host
 * buffer, so the executor's host-side sums read defined bytes. Run on this table, the executor
 * (model.c) makes exactly the allocations and unit-hook calls of a real micro-batch, in the same
 * order, at the cost of the calls alone: gt_mem then counts what a real run would hold. The planner
 * predicts memory this way, and the model records the order in which it acquires units.
 */
#ifndef GT_OPS_DRY_H
#define GT_OPS_DRY_H

#include "ops.h"

/* Fills *ops with the dry table. act_bytes and keep_probs are those of the backend being
 * predicted (ops.h: act_bytes, can_keep_attention_probs): the executor sizes tensors and decides
 * what a block keeps from them. */
void gt_ops_dry_init(gt_ops *ops, int act_bytes, int keep_probs);

/* What one op call of a dry run costs, for the time model (timemodel.h): matrix products and
 * attention by their FLOPs (2 per multiply-add; causal attention over the T(T+1)/2 pairs kept, its
 * backward 2.5 x the forward: five products against two), the others by the bytes they read and
 * write. */
typedef enum gt_cost_kind { GT_COST_MATMUL, GT_COST_ATTENTION, GT_COST_MEMORY, GT_COST_OPTIMIZER } gt_cost_kind;
typedef struct gt_op_cost {
    const char *op;       /* the op's name in ops.h */
    gt_cost_kind kind;
    int backward;         /* matmul_backward, attention_backward */
    double flops, bytes;
    int n, ic, oc;        /* a matmul's shape */
} gt_op_cost;

/* Every op of every dry table calls fn(ctx, cost) from now on (fn NULL: none, the default). Not
 * thread-safe: the planner runs on one thread. */
void gt_ops_dry_set_cost(void (*fn)(void *ctx, const gt_op_cost *cost), void *ctx);

#endif
