/*
 * recompute.h — activation-checkpointing policies and the plan they turn into.
 *
 * A policy (`memory.recompute`) is what the user writes; a plan is what the executor runs: for each
 * block, what its forward keeps for backward, and where segments of recomputed blocks start.
 *
 *   GT_KEEP_ALL        the block keeps everything its backward needs (no recompute)
 *   GT_KEEP_SELECTIVE  keeps its input and the outputs of its large matmuls; the norms' outputs,
 *                      attention probabilities and SwiGLU product are recomputed in backward
 *   GT_KEEP_RECOMPUTE  keeps nothing of its own; its segment's first block keeps the segment input,
 *                      and backward re-runs the whole segment's forward before walking back through it
 *
 * This module only describes plans; model.c executes them and planner.c prices them.
 */
#ifndef GT_RECOMPUTE_H
#define GT_RECOMPUTE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* gt_policy (what memory.recompute says) and gt_policy_parse: config.h, which parses the setting. */

typedef enum gt_block_keep {
    GT_KEEP_ALL = 0,
    GT_KEEP_SELECTIVE = 1,
    GT_KEEP_RECOMPUTE = 2,
} gt_block_keep;

typedef struct gt_plan {
    int n_blocks;
    uint8_t keep[GT_MAX_LAYERS];        /* gt_block_keep per block */
    uint8_t seg_start[GT_MAX_LAYERS];   /* 1: this block's input is kept (always 1 unless RECOMPUTE
                                           and not first of its segment) */
} gt_plan;

/* Writes the canonical text of a policy ("uniform:4"). */
void gt_policy_format(const gt_policy *policy, char *out, size_t out_len);

/* The plan of a fixed policy (not auto). */
void gt_plan_from_policy(gt_plan *plan, const gt_policy *policy, int n_blocks);

/* Segments of recomputed blocks: a RECOMPUTE block with seg_start begins one that runs while the
 * next blocks are RECOMPUTE without seg_start. Returns one past the segment's last block. */
int gt_plan_segment_end(const gt_plan *plan, int first);

/* Block forwards re-run in backward by one micro-batch under this plan. */
int gt_plan_recomputed_blocks(const gt_plan *plan);

/* Rows of the loss head's chunks in training. The LM head, the cross-entropy and their backward run
 * over this many token rows at a time, so the (rows, V) logits buffer is at most what a block's
 * backward needs beside its stash anyway (its output gradient and scratch: (BT, C) + max(2 (BT, F),
 * (BT, C) + 2 (BT, KVD)) elements, model.c's scratch) instead of (BT, V), and the head does not set
 * the activation peak of a recompute plan. It depends on the shapes alone, so every recompute policy
 * runs the same chunks and the gradients keep the same bits across policies. A multiple of 64 rows
 * when it is 64 or more, of 8 when 8 or more; BT when the whole batch fits. gt_head_chunk_bytes, when not 0, replaces the
 * limit (tests lower it to get several chunks). */
extern uint64_t gt_head_chunk_bytes;
int gt_head_rows(const gt_model_config *model, int BT, int elem_bytes);

/* A short description ("full: 8 segments of 1", "blocks: 3 recompute, 5 keep"). */
void gt_plan_describe(const gt_plan *plan, char *out, size_t out_len);

#endif
