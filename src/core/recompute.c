/*
 * recompute.c — parsing activation-checkpointing policies and turning them into plans.
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

static int parse_k(const char *text, int *k) {
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0') return -1;
    if (v < -1000000 || v > 1000000) return -1;
    *k = (int)v;
    return 0;
}

int gt_policy_parse(const char *text, int n_layers, gt_policy *policy, char *err, size_t err_len) {
    memset(policy, 0, sizeof *policy);
    static const char *expected = "none, full, selective, sqrt, auto, uniform:K or blocks:K";
    if (strcmp(text, "none") == 0) { policy->kind = GT_POLICY_NONE; return 0; }
    if (strcmp(text, "full") == 0) { policy->kind = GT_POLICY_FULL; policy->k = 1; return 0; }
    if (strcmp(text, "selective") == 0) { policy->kind = GT_POLICY_SELECTIVE; return 0; }
    if (strcmp(text, "auto") == 0) { policy->kind = GT_POLICY_AUTO; return 0; }
    if (strcmp(text, "sqrt") == 0) {
        policy->kind = GT_POLICY_SQRT;
        int k = (int)lround(sqrt((double)n_layers));
        policy->k = k < 1 ? 1 : k;
        return 0;
    }
    const char *colon = strchr(text, ':');
    if (colon) {
        size_t head = (size_t)(colon - text);
        int k;
        int is_uniform = head == 7 && strncmp(text, "uniform", 7) == 0;
        int is_blocks = head == 6 && strncmp(text, "blocks", 6) == 0;
        if (is_uniform || is_blocks) {
            if (parse_k(colon + 1, &k) != 0) {
                snprintf(err, err_len, "'%s': K must be an integer (expected %s)", text, expected);
                return -1;
            }
            if (is_uniform && (k < 1 || k > n_layers)) {
                snprintf(err, err_len, "'%s': K must be in 1..%d (the number of layers)", text, n_layers);
                return -1;
            }
            if (is_blocks && (k < 0 || k > n_layers)) {
                snprintf(err, err_len, "'%s': K must be in 0..%d (the number of layers)", text, n_layers);
                return -1;
            }
            policy->kind = is_uniform ? GT_POLICY_UNIFORM : GT_POLICY_BLOCKS;
            policy->k = k;
            return 0;
        }
    }
    snprintf(err, err_len, "unknown recompute policy '%s' (expected %s)", text, expected);
    return -1;
}

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
