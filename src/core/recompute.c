/*
 * recompute.c — activation-checkpointing policies: their names (memory.recompute), parsing, and the
 * plans they turn into.
 *
 * The names follow Megatron-LM (recompute-granularity full|selective, recompute-method
 * uniform|block), Korthikanti et al. 2022 (selective recompute) and Chen et al. 2016 (sqrt(N)
 * segments). The plan says, per block, what forward
 * keeps; model.c executes it and planner.c prices it. `auto` has no fixed plan: planner.c searches.
 */
#include "recompute.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The one table of memory.recompute's names: parsing, formatting and the expected-values text read
 * it. With has_k the name takes ":K". */
static const struct {
    const char *name;
    gt_policy_kind kind;
    int has_k;
} g_policies[] = {
    {"none", GT_POLICY_NONE, 0},      {"full", GT_POLICY_FULL, 0},       {"selective", GT_POLICY_SELECTIVE, 0},
    {"sqrt", GT_POLICY_SQRT, 0},      {"auto", GT_POLICY_AUTO, 0},       {"uniform", GT_POLICY_UNIFORM, 1},
    {"blocks", GT_POLICY_BLOCKS, 1},
};
#define N_POLICIES (int)(sizeof g_policies / sizeof g_policies[0])

const char *gt_policy_expected(void) {
    static char text[160];
    if (!text[0])
        for (int i = 0; i < N_POLICIES; i++) {
            size_t at = strlen(text);
            snprintf(text + at, sizeof text - at, "%s%s%s", i == 0 ? "" : i == N_POLICIES - 1 ? " or " : ", ",
                     g_policies[i].name, g_policies[i].has_k ? ":K" : "");
        }
    return text;
}

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
    const char *colon = strchr(text, ':');
    size_t head = colon ? (size_t)(colon - text) : strlen(text);
    for (int i = 0; i < N_POLICIES; i++) {
        if (strlen(g_policies[i].name) != head || strncmp(text, g_policies[i].name, head) != 0) continue;
        if (!colon != !g_policies[i].has_k) break; /* "full:2", "uniform" */
        policy->kind = g_policies[i].kind;
        if (policy->kind == GT_POLICY_FULL) policy->k = 1; /* segments of one block */
        if (policy->kind == GT_POLICY_SQRT) {
            int k = (int)lround(sqrt((double)n_layers));
            policy->k = k < 1 ? 1 : k;
        }
        if (!g_policies[i].has_k) return 0;
        int k;
        if (parse_k(colon + 1, &k) != 0) {
            snprintf(err, err_len, "'%s': K must be an integer (expected %s)", text, gt_policy_expected());
            return -1;
        }
        int lo = policy->kind == GT_POLICY_UNIFORM ? 1 : 0; /* blocks:0 recomputes nothing */
        if (k < lo || k > n_layers) {
            snprintf(err, err_len, "'%s': K must be in %d..%d (the number of layers)", text, lo, n_layers);
            return -1;
        }
        policy->k = k;
        return 0;
    }
    memset(policy, 0, sizeof *policy);
    snprintf(err, err_len, "unknown recompute policy '%s' (expected %s)", text, gt_policy_expected());
    return -1;
}

void gt_policy_format(const gt_policy *policy, char *out, size_t out_len) {
    for (int i = 0; i < N_POLICIES; i++) {
        if (g_policies[i].kind != policy->kind) continue;
        if (g_policies[i].has_k) snprintf(out, out_len, "%s:%d", g_policies[i].name, policy->k);
        else snprintf(out, out_len, "%s", g_policies[i].name);
        return;
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
