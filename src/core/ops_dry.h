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

#endif
