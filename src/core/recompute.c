/*
 * recompute.c — turning activation-checkpointing policies (parsed with the config, config.h) into plans.
 *
 * The names follow Megatron-LM (recompute-granularity full|selective, recompute-method
 * uniform|block) and Chen et al. 2016 (sqrt(N) segments). The plan says, per block, what forward
 * keeps; model.c executes it and planner.c prices it. `auto` has no fixed plan: planner.c searches.
 */
#include "recompute.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gt_policy_format(const gt_policy *policy, char *out, size_t out_len) {
    switch (policy->kind) {
    case GT_POLICY_NONE: snprintf(out, out_len, "none"); break;
    case GT_POLICY_FULL: snprintf(out, out_len, "full"); break;
    case GT_POLICY_SELECTIVE: snprintf(out, out_len, "selective"); break;
    case GT_POLICY_AUTO: snprintf(out, out_len, "auto"); break;
    case GT_POLICY_SQRT: snprintf(out, out_len, "sqrt"); break;
    case GT_POLICY_UNIFORM: snprintf(out, out_len, "uniform:%d", policy->k); break;
    case GT_POLICY_BLOCKS: snprintf(out, out_len, "blocks:%d", policy->k); break;
    }
}

void gt_plan_from_policy(gt_plan *plan, const gt_policy *policy, int n_blocks) {
    memset(plan, 0, sizeof *plan);
    plan->n_blocks = n_blocks;
    for (int i = 0; i < n_blocks; i++) {
        plan->keep[i] = GT_KEEP_ALL;
        plan->seg_start[i] = 1;
    }
    switch (policy->kind) {
    case GT_POLICY_NONE:
    case GT_POLICY_AUTO: /* auto's plan comes from the planner; none is its safe stand-in */
        break;
    case GT_POLICY_SELECTIVE:
        for (int i = 0; i < n_blocks; i++) plan->keep[i] = GT_KEEP_SELECTIVE;
        break;
    case GT_POLICY_FULL:
    case GT_POLICY_UNIFORM:
    case GT_POLICY_SQRT: {
        int k = policy->k < 1 ? 1 : policy->k;
        for (int i = 0; i < n_blocks; i++) {
            plan->keep[i] = GT_KEEP_RECOMPUTE;
            plan->seg_start[i] = (i % k) == 0;
        }
        break;
    }
    case GT_POLICY_BLOCKS:
        for (int i = 0; i < policy->k && i < n_blocks; i++) plan->keep[i] = GT_KEEP_RECOMPUTE;
        break;
    }
}

int gt_plan_segment_end(const gt_plan *plan, int first) {
    int end = first + 1;
    if (plan->keep[first] != GT_KEEP_RECOMPUTE) return end;
    while (end < plan->n_blocks && plan->keep[end] == GT_KEEP_RECOMPUTE && !plan->seg_start[end]) end++;
    return end;
}

int gt_plan_segment_start(const gt_plan *plan, int last) {
    int a = last;
    while (a > 0 && plan->keep[a] == GT_KEEP_RECOMPUTE && !plan->seg_start[a]) a--;
    return a;
}

int gt_plan_recomputed_blocks(const gt_plan *plan) {
    int n = 0;
    for (int i = 0; i < plan->n_blocks; i++) n += plan->keep[i] == GT_KEEP_RECOMPUTE;
    return n;
}

void gt_plan_describe(const gt_plan *plan, char *out, size_t out_len) {
    int n_keep = 0, n_sel = 0, n_rec = 0, n_seg = 0, longest = 0;
    for (int i = 0; i < plan->n_blocks;) {
        int end = gt_plan_segment_end(plan, i);
        if (plan->keep[i] == GT_KEEP_RECOMPUTE) {
            n_rec += end - i;
            n_seg++;
            if (end - i > longest) longest = end - i;
        } else if (plan->keep[i] == GT_KEEP_SELECTIVE) {
            n_sel++;
        } else {
            n_keep++;
        }
        i = end;
    }
    snprintf(out, out_len, "%d blocks: %d keep all, %d selective, %d recompute in %d segment%s (longest %d)",
             plan->n_blocks, n_keep, n_sel, n_rec, n_seg, n_seg == 1 ? "" : "s", longest);
}
