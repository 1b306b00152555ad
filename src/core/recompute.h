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

#define GT_MAX_LAYERS 1024 /* blocks a model may have (the recompute plan has a byte per block) */

/* memory.recompute, parsed: the text stays in the config (banners and /config print it as written),
 * because K's range and sqrt's K depend on n_layers; gt_policy_parse reads it (config.c's cross-key
 * check, the planner). */
typedef enum gt_policy_kind {
    GT_POLICY_NONE,
    GT_POLICY_FULL,
    GT_POLICY_UNIFORM,   /* uniform:K */
    GT_POLICY_SQRT,      /* uniform with K = round(sqrt(N)) */
    GT_POLICY_BLOCKS,    /* blocks:K — the first K blocks recompute */
    GT_POLICY_SELECTIVE,
    GT_POLICY_AUTO,      /* planner picks for memory.budget */
} gt_policy_kind;

typedef struct gt_policy {
    gt_policy_kind kind;
    int k;               /* K of uniform:K and blocks:K */
} gt_policy;

/* Parses a policy string for a model of n_layers blocks. 0, or -1 with a message in err that says
 * what was expected (K range included). */
int gt_policy_parse(const char *text, int n_layers, gt_policy *policy, char *err, size_t err_len);

/* What memory.recompute accepts, in words: "none, full, ..., uniform:K or blocks:K". */
const char *gt_policy_expected(void);

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
 * next blocks are RECOMPUTE without seg_start. gt_plan_segment_end: one past the last block of the
 * segment that starts at `first` (forward walks them so); gt_plan_segment_start: the first block of
 * the segment that ends at `last` (backward walks them so, from the last block). A block that is not
 * RECOMPUTE is a segment of its own. */
int gt_plan_segment_end(const gt_plan *plan, int first);
int gt_plan_segment_start(const gt_plan *plan, int last);

/* Block forwards re-run in backward by one micro-batch under this plan. */
int gt_plan_recomputed_blocks(const gt_plan *plan);

/* A short description ("full: 8 segments of 1", "blocks: 3 recompute, 5 keep"). */
void gt_plan_describe(const gt_plan *plan, char *out, size_t out_len);

#endif
