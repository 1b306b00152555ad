/*
 * test_recompute.c — block-level activation checkpointing (recompute.c, model.c, planner.c).
 *
 * On the CPU backend, for several small shapes (GQA and MHA, different F/C ratios, different
 * B x T, 3..6 blocks) and every plan the policies give (none, full, selective, sqrt, uniform:K,
 * blocks:K, plans `auto` picks at budgets across the feasible range, and a hand-made plan that mixes
 * all three kinds of block with a recompute segment in the middle), it checks that
 *   - losses and gradients are bit-identical to those of "none", with dropout 0.1 (the recomputed
 *     forward must replay the dropout masks exactly);
 *   - the measured activation high-water mark of one micro-batch (gt_mem, GT_MEM_ACT) equals the
 *     planner's prediction (gt_plan_estimate: the executor run dry) to the byte, and the memory
 *     discipline of model.c's header written out here (spec_act_peak), and no activation bytes
 *     stay held;
 *   - measured peaks order as the memory model says (none > selective > full, none > sqrt > full);
 *   - the number of block forwards re-run in backward is the plan's;
 *   - bad policy strings are refused with a message, good ones parse and round-trip;
 *   - `auto` picks the least recompute that fits;
 *   - where the machine has it, the bf16 CPU table (ops_cpu.c) passes the bit-identity and memory
 *     checks too (working tensors of 2 bytes, the planner run with act_bytes 2), and its first
 *     micro-batch's gradients point the way fp32's do (cosine > 0.999 per tensor).
 * The memory checks run twice: with the CPU backend as it is (attention probabilities kept by
 * KEEP_ALL blocks) and with a copy of its ops table that says it cannot keep them (the flash-style
 * path the CUDA backend takes), so both branches of the model are held to the executor.
 *
 * Usage:
 *   test_recompute                       run every check (exit 0 all passed, 1 a failure)
 *   test_recompute --predict CONFIG.ini [section.key=value ...]
 *        print what the planner predicts for one rank on the CPU backend, as train.c builds it:
 *        "act_peak_bytes N", "recomputed_blocks R" (per micro-batch), "n_layers N", "grad_accum A";
 *        tests/recompute_check_run.cmake compares a real run's metrics with it.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "memtrack.h"
#include "model.h"
#include "ops.h"
#include "planner.h"
#include "recompute.h"

#include "check.h"
#include "testhooks.h"

/* ------------------------------------------------------------------ shapes and plans */

typedef struct shape_case {
    const char *name;
    gt_model_config model;
    int B, T;
} shape_case;

static gt_model_config model_cfg(int dim, int n_layers, int n_heads, int n_kv_heads, int vocab, int ffn) {
    gt_model_config m;
    memset(&m, 0, sizeof m);
    m.dim = dim;
    m.n_layers = n_layers;
    m.n_heads = n_heads;
    m.n_kv_heads = n_kv_heads;
    m.vocab_size = vocab;
    m.ffn_dim = ffn;
    m.max_seq_len = 64;
    m.norm_eps = 1e-5f;
    m.rope_theta = 10000.0f;
    m.dropout = 0.1f;
    return m;
}

/* GQA with 2 query heads per kv head and F/C = 2.5 (scratch sized by 2 (BT, F));
 * MHA with F/C = 5.3 and B x T = 3 x 12;
 * GQA 2/1 with F < C, so the backward scratch is sized by (BT, C) + 2 (BT, KVD) and a selective
 * block's largest re-created tensor is xn, not h; 6 blocks, so sqrt = uniform:2 of 3 segments. */
#define N_SHAPES 3
static shape_case g_shapes[N_SHAPES];

static void init_shapes(void) {
    g_shapes[0] = (shape_case){"N=4 C=64 NH=4 NKV=2 F=160 V=67 B=2 T=16", model_cfg(64, 4, 4, 2, 67, 160), 2, 16};
    g_shapes[1] = (shape_case){"N=5 C=48 NH=4 NKV=4 F=256 V=97 B=3 T=12", model_cfg(48, 5, 4, 4, 97, 256), 3, 12};
    g_shapes[2] = (shape_case){"N=6 C=64 NH=2 NKV=1 F=48 V=41 B=1 T=24", model_cfg(64, 6, 2, 1, 41, 48), 1, 24};
}

static gt_mem_shape mem_shape(const gt_ops *ops, const shape_case *sc) {
    gt_mem_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.model = sc->model;
    sh.micro_batch = sc->B;
    sh.seq_len = sc->T;
    sh.act_bytes = ops->act_bytes;
    sh.keep_probs = ops->can_keep_attention_probs;
    sh.world = 1;
    sh.stage = 0;
    return sh;
}

#define MAX_PLANS 48

typedef struct plan_set {
    int n;
    char name[MAX_PLANS][64];
    gt_plan plan[MAX_PLANS];
} plan_set;

static void add_plan(plan_set *ps, const char *name, const gt_plan *plan) {
    if (ps->n >= MAX_PLANS) abort();
    snprintf(ps->name[ps->n], sizeof ps->name[0], "%s", name);
    ps->plan[ps->n] = *plan;
    ps->n++;
}

static int policy_plan(const char *text, int N, gt_plan *plan) {
    gt_policy pol;
    char err[256];
    if (gt_policy_parse(text, N, &pol, err, sizeof err) != 0) {
        CHECK(0, "policy '%s' for %d blocks should parse: %s", text, N, err);
        return -1;
    }
    gt_plan_from_policy(plan, &pol, N);
    return 0;
}

/* The fixed policies under test for N blocks. plan 0 is always "none". */
static void fixed_policy_names(int N, char names[][32], int *count) {
    int n = 0;
    const char *base[] = {"none", "full", "selective", "sqrt", "uniform:2", "uniform:3", "blocks:1"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) snprintf(names[n++], 32, "%s", base[i]);
    snprintf(names[n++], 32, "blocks:%d", N - 1);
    snprintf(names[n++], 32, "blocks:%d", N);
    snprintf(names[n++], 32, "uniform:%d", N);
    snprintf(names[n++], 32, "blocks:0");
    *count = n;
}

/* Every plan checked for one shape: the fixed policies, a hand-made mixed plan, and the plans auto
 * picks at budgets from the smallest plan's total to none's total. */
static void collect_plans(const gt_mem_shape *sh, plan_set *ps) {
    int N = sh->model.n_layers;
    ps->n = 0;
    char names[16][32];
    int n_names;
    fixed_policy_names(N, names, &n_names);
    for (int i = 0; i < n_names; i++) {
        gt_plan plan;
        if (policy_plan(names[i], N, &plan) == 0) add_plan(ps, names[i], &plan);
    }

    /* block 0 keeps all, 1..2 a recompute segment of 2, 3 selective, the rest a segment of 1 each */
    gt_plan mixed;
    memset(&mixed, 0, sizeof mixed);
    mixed.n_blocks = N;
    for (int i = 0; i < N; i++) {
        mixed.keep[i] = i == 0 ? GT_KEEP_ALL : i == 3 ? GT_KEEP_SELECTIVE : GT_KEEP_RECOMPUTE;
        mixed.seg_start[i] = i != 2;
    }
    add_plan(ps, "mixed(keep,rec2,sel,rec1..)", &mixed);

    /* auto: the smallest plan (budget 0 fails and returns it) up to none's total */
    gt_plan small_plan, none_plan;
    gt_mem_estimate small_est, none_est;
    gt_plan_auto(sh, 0, &small_plan, &small_est);
    policy_plan("none", N, &none_plan);
    gt_plan_estimate(sh, &none_plan, &none_est);
    const int steps = 6;
    for (int k = 0; k <= steps; k++) {
        uint64_t budget = small_est.total_bytes + (none_est.total_bytes - small_est.total_bytes) * (uint64_t)k / steps;
        gt_plan plan;
        gt_mem_estimate est;
        if (gt_plan_auto(sh, budget, &plan, &est) != 0) {
            CHECK(0, "auto with budget %llu (>= the smallest plan's %llu) should fit", (unsigned long long)budget,
                  (unsigned long long)small_est.total_bytes);
            continue;
        }
        char name[64];
        snprintf(name, sizeof name, "auto@%d/%d", k, steps);
        add_plan(ps, name, &plan);
    }
}

/* ------------------------------------------------------------------ running one micro-batch */

typedef struct runner {
    const gt_ops *ops;
    gt_mem mem;
    gt_model *model;
    const shape_case *sc;
    size_t n_params;
    int32_t *inputs, *targets;
} runner;

static void runner_init(runner *r, const gt_ops *ops, const shape_case *sc) {
    r->ops = ops;
    r->sc = sc;
    gt_mem_init(&r->mem, ops);
    r->model = gt_model_create(ops, &r->mem, &sc->model);
    const gt_layout *layout = gt_model_layout(r->model);
    r->n_params = layout->n_params;
    float *init = malloc(r->n_params * sizeof *init);
    if (!init) abort();
    gt_layout_init_params(layout, init, 4242);
    gt_model_set_params(r->model, init);
    free(init);
    int BT = sc->B * sc->T;
    r->inputs = malloc((size_t)BT * sizeof *r->inputs);
    r->targets = malloc((size_t)BT * sizeof *r->targets);
    if (!r->inputs || !r->targets) abort();
    uint64_t z = 99;
    for (int i = 0; i < BT; i++) {
        z = gt_mix64(z);
        r->inputs[i] = (int32_t)(z % (uint64_t)sc->model.vocab_size);
        r->targets[i] = (int32_t)((z >> 32) % (uint64_t)sc->model.vocab_size);
    }
    r->targets[3] = -1; /* an ignored position */
}

static void runner_free(runner *r) {
    gt_model_destroy(r->model);
    free(r->inputs);
    free(r->targets);
}

typedef struct micro_result {
    double loss;
    float *grads;            /* host copy, n_params */
    uint64_t act_peak;       /* mem.peak[GT_MEM_ACT] over the micro-batch */
    uint64_t act_after;      /* mem.cur[GT_MEM_ACT] after it */
    int recomputed;
} micro_result;

/* n_micro micro-batches from zeroed gradients (the same tokens, different dropout keys). */
static void run_micro(runner *r, const gt_plan *plan, int n_micro, micro_result *out) {
    const gt_ops *ops = r->ops;
    float *grads = gt_model_grads(r->model);
    ops->zero(grads, r->n_params * sizeof(float));
    gt_mem_reset_peaks(&r->mem);
    out->loss = 0.0;
    out->recomputed = 0;
    float dloss = 1.0f / (float)(r->sc->B * r->sc->T);
    for (int m = 0; m < n_micro; m++) {
        gt_rng_key key = {1337, gt_mix64(0xC0FFEEull + (uint64_t)m)};
        out->loss += gt_model_train_micro(r->model, plan, r->inputs, r->targets, r->sc->B, r->sc->T, dloss, key,
                                          &out->recomputed);
    }
    out->act_peak = r->mem.peak[GT_MEM_ACT];
    out->act_after = r->mem.cur[GT_MEM_ACT];
    out->grads = malloc(r->n_params * sizeof(float));
    if (!out->grads) abort();
    ops->synchronize();
    ops->copy_to_host(out->grads, grads, r->n_params * sizeof(float));
}

/* The CPU ops table as it is (probabilities never kept, as on CUDA) and one that keeps them (the CPU
 * kernels can: a kept block's backward then reads them instead of rebuilding them). */
static gt_ops g_cpu_probs;

static const gt_ops *backend(int variant) {
    if (variant == 0) return gt_ops_cpu();
    if (variant == 2) return gt_ops_cpu_bf16();
    g_cpu_probs = *gt_ops_cpu();
    g_cpu_probs.can_keep_attention_probs = 1;
    return &g_cpu_probs;
}
static const char *backend_name(int variant) {
    return variant == 0 ? "cpu" : variant == 1 ? "cpu(probs kept)" : "cpu bf16";
}

/* The variants the bit-identity and memory checks run on: the bf16 CPU table too, whose matrix
 * products run on oneDNN where this CPU has bf16 units and widened to sgemm where not (one line says
 * which). */
static int n_variants(void) {
    static int said;
    if (!said++) printf("note: the bf16 CPU backend's matrix products: %s\n", gt_cpu_bf16_isa());
    return 3;
}

/* ------------------------------------------------------------------ the memory discipline, written out */

/* The activation high-water mark model.c's header promises (its "Memory discipline"), in bytes,
 * written here from that text and independently of the executor. The planner's figure is the
 * executor itself run dry, so "measured == predicted" holds by construction; this spec is what
 * catches a change in what the executor allocates or when it frees. */
typedef struct spec_sizes {
    uint64_t x, kv, ff, row, lse, probs, logits;
    uint64_t stash_all, stash_all_probs, stash_sel;
    uint64_t scratch;
} spec_sizes;

static spec_sizes spec_make_sizes(const gt_mem_shape *sh) {
    const gt_model_config *m = &sh->model;
    uint64_t B = (uint64_t)sh->micro_batch, T = (uint64_t)sh->seq_len, BT = B * T;
    uint64_t e = (uint64_t)sh->act_bytes;
    uint64_t HD = (uint64_t)(m->dim / m->n_heads), KVD = (uint64_t)m->n_kv_heads * HD;
    spec_sizes s;
    s.x = BT * (uint64_t)m->dim * e;
    s.kv = BT * KVD * e;
    s.ff = BT * (uint64_t)m->ffn_dim * e;
    s.row = BT * 4;
    s.lse = B * (uint64_t)m->n_heads * T * 4;
    s.probs = B * (uint64_t)m->n_heads * T * T * 4;
    s.logits = (uint64_t)gt_head_rows(m, (int)BT, (int)e) * (uint64_t)m->vocab_size * e;
    /* xn1 q att x2 xn2 (5x), k v, rstd1 rstd2, lse, gate up h */
    s.stash_all = 5 * s.x + 2 * s.kv + 2 * s.row + s.lse + 3 * s.ff;
    s.stash_all_probs = s.stash_all + (sh->keep_probs ? s.probs : 0);
    s.stash_sel = s.stash_all - 2 * s.x - s.ff; /* minus xn1, xn2, h */
    uint64_t big = 2 * s.ff > s.x + 2 * s.kv ? 2 * s.ff : s.x + 2 * s.kv;
    s.scratch = 2 * s.x + big;
    return s;
}

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

static uint64_t spec_act_peak(const gt_mem_shape *sh, const gt_plan *plan) {
    spec_sizes sz = spec_make_sizes(sh);
    const spec_sizes *s = &sz;
    int N = plan->n_blocks;
    uint64_t held = s->x, peak = held; /* x_0, the embedding output */
    /* forward: a block allocates its stash and output, frees its transients and, inside a recompute
     * segment, its input */
    for (int a = 0; a < N;) {
        int b = gt_plan_segment_end(plan, a);
        for (int i = a; i < b; i++) {
            int keep = plan->keep[i];
            uint64_t alloc = keep == GT_KEEP_ALL ? s->stash_all_probs : s->stash_all;
            uint64_t kept = keep == GT_KEEP_ALL ? s->stash_all_probs : keep == GT_KEEP_SELECTIVE ? s->stash_sel : 0;
            peak = max_u64(peak, held + alloc + s->x);
            held += s->x + kept;
            if (keep == GT_KEEP_RECOMPUTE && i > a) held -= s->x;
        }
        a = b;
    }
    /* head: xf, rstdf, losses, lse, dxf and one chunk of logits; then the chunk, losses and lse go,
     * dx comes; dxf, rstdf, xf and x_N are freed, dx stays: held is unchanged; the scratch comes */
    peak = max_u64(peak, held + 2 * s->x + 3 * s->row + s->logits);
    peak = max_u64(peak, held + 3 * s->x + s->row);
    held += s->scratch;
    peak = max_u64(peak, held);
    /* backward, segment by segment from the last: a recompute segment re-creates its blocks' stashes
     * (and outputs but the last's) before walking back; a selective block re-creates h, then xn2, then
     * xn1, one at a time; every block's stash and input go after its backward */
    for (int b = N; b > 0;) {
        int a = gt_plan_segment_start(plan, b - 1);
        if (plan->keep[a] == GT_KEEP_RECOMPUTE) {
            for (int i = a; i < b; i++) {
                held += s->stash_all_probs + (i + 1 < b ? s->x : 0);
                peak = max_u64(peak, held);
            }
            for (int i = b - 1; i >= a; i--) held -= s->stash_all_probs + s->x;
        } else {
            uint64_t transient = plan->keep[a] == GT_KEEP_SELECTIVE ? max_u64(s->ff, s->x) : 0;
            peak = max_u64(peak, held + transient);
            held -= (plan->keep[a] == GT_KEEP_ALL ? s->stash_all_probs : s->stash_sel) + s->x;
        }
        b = a;
    }
    return peak;
}

/* ------------------------------------------------------------------ checks */

static void all_policies_give_bit_identical_losses_and_grads_with_dropout(void) {
    int before = check_failures;
    for (int v = 0; v < n_variants(); v++) {
        for (int s = 0; s < N_SHAPES; s++) {
            const gt_ops *ops = backend(v);
            runner r;
            runner_init(&r, ops, &g_shapes[s]);
            gt_mem_shape sh = mem_shape(ops, &g_shapes[s]);
            plan_set ps;
            collect_plans(&sh, &ps);
            micro_result ref;
            run_micro(&r, &ps.plan[0], 1, &ref); /* none */
            CHECK(isfinite(ref.loss) && ref.loss > 0, "%s: loss %g", g_shapes[s].name, ref.loss);
            double gsum = 0;
            for (size_t i = 0; i < r.n_params; i++) gsum += fabs(ref.grads[i]);
            CHECK(gsum > 0, "%s: the gradient is all zero", g_shapes[s].name);
            for (int p = 1; p < ps.n; p++) {
                micro_result got;
                run_micro(&r, &ps.plan[p], 1, &got);
                CHECK(memcmp(&got.loss, &ref.loss, sizeof ref.loss) == 0,
                      "%s %s, %s: loss %.17g differs from none's %.17g", backend_name(v), g_shapes[s].name,
                      ps.name[p], got.loss, ref.loss);
                if (memcmp(got.grads, ref.grads, r.n_params * sizeof(float)) != 0) {
                    size_t first = 0, count = 0;
                    for (size_t i = 0; i < r.n_params; i++)
                        if (memcmp(&got.grads[i], &ref.grads[i], sizeof(float)) != 0) {
                            if (!count) first = i;
                            count++;
                        }
                    CHECK(0, "%s %s, %s: %zu gradient elements differ from none's (first at %zu: %.9g vs %.9g)",
                          backend_name(v), g_shapes[s].name, ps.name[p], count, first, got.grads[first],
                          ref.grads[first]);
                }
                free(got.grads);
            }
            /* dropout is on: a different key gives a different loss (else the check above is weak) */
            micro_result two;
            run_micro(&r, &ps.plan[0], 2, &two);
            CHECK(two.loss != 2 * ref.loss, "%s: two dropout keys gave the same loss; is dropout on?",
                  g_shapes[s].name);
            free(two.grads);
            free(ref.grads);
            runner_free(&r);
        }
    }
    printf("%s all_policies_give_bit_identical_losses_and_grads_with_dropout\n", check_failures == before ? "ok  " : "FAIL");
}

/* Documents inside a window (data.document_mask, reset_positions): the model's one int32 per token for
 * the document starts is workspace the planner counts, and the activation peak does not change. The
 * planner's workspace is the token ids and a RoPE table of max_seq_len rows (the model's holds T rows),
 * so the check is on what the documents add: measured and predicted alike, B*T*4 bytes. */
static void documents_workspace_is_predicted(void) {
    int before = check_failures;
    for (int s = 0; s < N_SHAPES; s++) {
        const gt_ops *ops = backend(0);
        uint64_t ws[2], est_ws[2], act[2], est_act[2];
        for (int docs = 0; docs < 2; docs++) {
            runner r;
            runner_init(&r, ops, &g_shapes[s]);
            gt_model_set_documents(r.model, docs, docs, r.inputs[5], 0); /* some token as the separator */
            gt_mem_shape sh = mem_shape(ops, &g_shapes[s]);
            sh.documents = docs;
            gt_plan plan;
            gt_policy pol;
            char err[128];
            CHECK(gt_policy_parse("selective", g_shapes[s].model.n_layers, &pol, err, sizeof err) == 0, "%s", err);
            gt_plan_from_policy(&plan, &pol, g_shapes[s].model.n_layers);
            gt_mem_estimate est;
            gt_plan_estimate(&sh, &plan, &est);
            micro_result got;
            run_micro(&r, &plan, 1, &got);
            ws[docs] = r.mem.cur[GT_MEM_WORKSPACE];
            est_ws[docs] = est.workspace_bytes;
            act[docs] = got.act_peak;
            est_act[docs] = est.act_peak_bytes;
            CHECK(ws[docs] <= est_ws[docs], "%s, documents %d: workspace %llu bytes held, above the %llu predicted",
                  g_shapes[s].name, docs, (unsigned long long)ws[docs], (unsigned long long)est_ws[docs]);
            CHECK(act[docs] == est_act[docs], "%s, documents %d: activation peak %llu, predicted %llu",
                  g_shapes[s].name, docs, (unsigned long long)act[docs], (unsigned long long)est_act[docs]);
            free(got.grads);
            runner_free(&r);
        }
        const uint64_t doc_bytes = (uint64_t)g_shapes[s].B * g_shapes[s].T * 4;
        printf("  %s: documents add %llu workspace bytes (predicted %llu, B*T*4 = %llu)\n", g_shapes[s].name,
               (unsigned long long)(ws[1] - ws[0]), (unsigned long long)(est_ws[1] - est_ws[0]),
               (unsigned long long)doc_bytes);
        CHECK(ws[1] - ws[0] == doc_bytes && est_ws[1] - est_ws[0] == doc_bytes,
              "%s: documents add %llu workspace bytes, the planner %llu, expected B*T*4 = %llu", g_shapes[s].name,
              (unsigned long long)(ws[1] - ws[0]), (unsigned long long)(est_ws[1] - est_ws[0]),
              (unsigned long long)doc_bytes);
        CHECK(act[1] == act[0], "%s: documents change the activation peak (%llu vs %llu)", g_shapes[s].name,
              (unsigned long long)act[1], (unsigned long long)act[0]);
    }
    printf("%s documents_workspace_is_predicted\n", check_failures == before ? "ok  " : "FAIL");
}

static void measured_activation_peak_equals_prediction(void) {
    int before = check_failures;
    for (int v = 0; v < n_variants(); v++) {
        for (int s = 0; s < N_SHAPES; s++) {
            const gt_ops *ops = backend(v);
            runner r;
            runner_init(&r, ops, &g_shapes[s]);
            gt_mem_shape sh = mem_shape(ops, &g_shapes[s]);
            plan_set ps;
            collect_plans(&sh, &ps);
            printf("  %s, %s:\n", backend_name(v), g_shapes[s].name);
            for (int p = 0; p < ps.n; p++) {
                gt_mem_estimate est;
                gt_plan_estimate(&sh, &ps.plan[p], &est);
                micro_result got;
                run_micro(&r, &ps.plan[p], 1, &got);
                uint64_t spec = spec_act_peak(&sh, &ps.plan[p]);
                printf("    %-28s measured %10llu  predicted %10llu  spec %10llu%s\n", ps.name[p],
                       (unsigned long long)got.act_peak, (unsigned long long)est.act_peak_bytes,
                       (unsigned long long)spec,
                       got.act_peak == est.act_peak_bytes && got.act_peak == spec ? "" : "  <-- differs");
                CHECK(got.act_peak == spec,
                      "%s %s, %s: measured activation peak %llu bytes, the memory discipline says %llu (%+lld)",
                      backend_name(v), g_shapes[s].name, ps.name[p], (unsigned long long)got.act_peak,
                      (unsigned long long)spec, (long long)got.act_peak - (long long)spec);
                CHECK(got.act_peak == est.act_peak_bytes,
                      "%s %s, %s: measured activation peak %llu bytes, predicted %llu (%+lld)", backend_name(v),
                      g_shapes[s].name, ps.name[p], (unsigned long long)got.act_peak,
                      (unsigned long long)est.act_peak_bytes, (long long)got.act_peak - (long long)est.act_peak_bytes);
                CHECK(got.act_after == 0, "%s %s, %s: %llu activation bytes still held after the micro-batch",
                      backend_name(v), g_shapes[s].name, ps.name[p], (unsigned long long)got.act_after);
                /* the model state the planner predicts is what the model allocated */
                CHECK(r.mem.cur[GT_MEM_PARAMS] == est.params_bytes && r.mem.cur[GT_MEM_GRADS] == est.grads_bytes,
                      "%s: params %llu / grads %llu bytes held, predicted %llu / %llu", g_shapes[s].name,
                      (unsigned long long)r.mem.cur[GT_MEM_PARAMS], (unsigned long long)r.mem.cur[GT_MEM_GRADS],
                      (unsigned long long)est.params_bytes, (unsigned long long)est.grads_bytes);
                free(got.grads);
            }
            runner_free(&r);
        }
    }
    printf("%s measured_activation_peak_equals_prediction\n", check_failures == before ? "ok  " : "FAIL");
}

static void activation_peaks_order_as_the_model_says(void) {
    int before = check_failures;
    for (int v = 0; v < 2; v++) {
        for (int s = 0; s < N_SHAPES; s++) {
            const gt_ops *ops = backend(v);
            runner r;
            runner_init(&r, ops, &g_shapes[s]);
            int N = g_shapes[s].model.n_layers;
            const char *names[] = {"none", "selective", "sqrt", "full"};
            uint64_t peak[4];
            for (int i = 0; i < 4; i++) {
                gt_plan plan;
                policy_plan(names[i], N, &plan);
                micro_result got;
                run_micro(&r, &plan, 1, &got);
                peak[i] = got.act_peak;
                free(got.grads);
            }
            printf("  %s, %s: none %llu > selective %llu > full %llu; none > sqrt %llu > full\n", backend_name(v),
                   g_shapes[s].name, (unsigned long long)peak[0], (unsigned long long)peak[1],
                   (unsigned long long)peak[3], (unsigned long long)peak[2]);
            CHECK(peak[0] > peak[1] && peak[1] > peak[3], "%s %s: expected none %llu > selective %llu > full %llu",
                  backend_name(v), g_shapes[s].name, (unsigned long long)peak[0], (unsigned long long)peak[1],
                  (unsigned long long)peak[3]);
            CHECK(peak[0] > peak[2] && peak[2] > peak[3], "%s %s: expected none %llu > sqrt %llu > full %llu",
                  backend_name(v), g_shapes[s].name, (unsigned long long)peak[0], (unsigned long long)peak[2],
                  (unsigned long long)peak[3]);
            runner_free(&r);
        }
    }
    printf("%s activation_peaks_order_as_the_model_says\n", check_failures == before ? "ok  " : "FAIL");
}

static int expected_recomputed(const char *policy, int N) {
    if (!strcmp(policy, "none") || !strcmp(policy, "selective")) return 0;
    if (!strcmp(policy, "full") || !strcmp(policy, "sqrt") || !strncmp(policy, "uniform:", 8)) return N;
    if (!strncmp(policy, "blocks:", 7)) return atoi(policy + 7);
    return -1;
}

static void recomputed_blocks_match_the_plan(void) {
    int before = check_failures;
    for (int s = 0; s < N_SHAPES; s++) {
        const gt_ops *ops = backend(0);
        runner r;
        runner_init(&r, ops, &g_shapes[s]);
        int N = g_shapes[s].model.n_layers;
        char names[16][32];
        int n_names;
        fixed_policy_names(N, names, &n_names);
        for (int i = 0; i < n_names; i++) {
            gt_plan plan;
            if (policy_plan(names[i], N, &plan) != 0) continue;
            int want = expected_recomputed(names[i], N);
            CHECK(gt_plan_recomputed_blocks(&plan) == want, "%s, %s: the plan says %d recomputed blocks, expected %d",
                  g_shapes[s].name, names[i], gt_plan_recomputed_blocks(&plan), want);
            for (int micro = 1; micro <= 2; micro++) {
                micro_result got;
                run_micro(&r, &plan, micro, &got);
                CHECK(got.recomputed == micro * want, "%s, %s: %d micro-batch(es) re-ran %d block forwards, expected %d",
                      g_shapes[s].name, names[i], micro, got.recomputed, micro * want);
                free(got.grads);
            }
        }
        runner_free(&r);
    }
    printf("%s recomputed_blocks_match_the_plan\n", check_failures == before ? "ok  " : "FAIL");
}

static void bad_policy_strings_are_rejected(void) {
    int before = check_failures;
    const int N = 6;
    char too_many[32], blocks_too_many[32];
    snprintf(too_many, sizeof too_many, "uniform:%d", N + 1);
    snprintf(blocks_too_many, sizeof blocks_too_many, "blocks:%d", N + 1);
    const char *bad[] = {"uniform:0", too_many, "blocks:-1", blocks_too_many, "blocks:x", "fulll", "", "uniform",
                         "blocks", "uniform:", "uniform:2x", "uniform:-3", "sqrt:2", "none:1", "full ", "auto:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gt_policy pol;
        char err[256] = "";
        int rc = gt_policy_parse(bad[i], N, &pol, err, sizeof err);
        CHECK(rc == -1, "'%s' should be rejected (rc %d)", bad[i], rc);
        CHECK(err[0] != '\0', "'%s' rejected without a message", bad[i]);
        if (bad[i][0]) CHECK(strstr(err, bad[i]) != NULL, "the message for '%s' does not quote it: %s", bad[i], err);
        printf("  '%s' -> %s\n", bad[i], err);
    }
    /* a K out of range names the range */
    {
        gt_policy pol;
        char err[256] = "";
        gt_policy_parse(too_many, N, &pol, err, sizeof err);
        CHECK(strstr(err, "1..6") != NULL, "'%s': the message should name the range 1..6: %s", too_many, err);
        gt_policy_parse("blocks:-1", N, &pol, err, sizeof err);
        CHECK(strstr(err, "0..6") != NULL, "'blocks:-1': the message should name the range 0..6: %s", err);
    }
    const char *good[] = {"none", "full", "selective", "sqrt", "auto", "uniform:1", "uniform:6", "uniform:4",
                          "blocks:0", "blocks:6", "blocks:3"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        gt_policy pol, again;
        char err[256] = "", text[64];
        int rc = gt_policy_parse(good[i], N, &pol, err, sizeof err);
        CHECK(rc == 0, "'%s' should parse: %s", good[i], err);
        gt_policy_format(&pol, text, sizeof text);
        CHECK(strcmp(text, good[i]) == 0, "'%s' formats as '%s'", good[i], text);
        rc = gt_policy_parse(text, N, &again, err, sizeof err);
        CHECK(rc == 0 && again.kind == pol.kind && again.k == pol.k, "'%s' does not round-trip", good[i]);
    }
    printf("%s bad_policy_strings_are_rejected\n", check_failures == before ? "ok  " : "FAIL");
}

static void auto_picks_least_recompute_that_fits(void) {
    int before = check_failures;
    for (int v = 0; v < 2; v++) {
        for (int s = 0; s < N_SHAPES; s++) {
            const gt_ops *ops = backend(v);
            gt_mem_shape sh = mem_shape(ops, &g_shapes[s]);
            int N = sh.model.n_layers;
            gt_plan none_plan, full_plan, plan;
            gt_mem_estimate none_est, full_est, est;
            policy_plan("none", N, &none_plan);
            policy_plan("full", N, &full_plan);
            gt_plan_estimate(&sh, &none_plan, &none_est);
            gt_plan_estimate(&sh, &full_plan, &full_est);

            /* budget = none's total: the none plan */
            int rc = gt_plan_auto(&sh, none_est.total_bytes, &plan, &est);
            CHECK(rc == 0, "%s: auto at none's total should fit", g_shapes[s].name);
            CHECK(est.recompute_flops == 0.0, "%s: auto at none's total recomputes %g FLOPs", g_shapes[s].name,
                  est.recompute_flops);
            CHECK(plan.n_blocks == N, "%s: auto's plan has %d blocks", g_shapes[s].name, plan.n_blocks);
            for (int i = 0; i < N; i++)
                CHECK(plan.keep[i] == GT_KEEP_ALL, "%s: auto at none's total: block %d is not KEEP_ALL",
                      g_shapes[s].name, i);
            CHECK(est.total_bytes == none_est.total_bytes, "%s: auto's estimate differs from none's",
                  g_shapes[s].name);

            /* below every plan: -1, and the smallest plan, which is no larger than full */
            gt_plan smallest;
            gt_mem_estimate smallest_est;
            rc = gt_plan_auto(&sh, 0, &smallest, &smallest_est);
            CHECK(rc == -1, "%s: auto with budget 0 should fail", g_shapes[s].name);
            CHECK(smallest_est.total_bytes <= full_est.total_bytes, "%s: auto's smallest plan %llu > full's %llu",
                  g_shapes[s].name, (unsigned long long)smallest_est.total_bytes,
                  (unsigned long long)full_est.total_bytes);
            rc = gt_plan_auto(&sh, smallest_est.total_bytes - 1, &plan, &est);
            CHECK(rc == -1, "%s: a budget 1 byte below the smallest plan should fail", g_shapes[s].name);
            if (smallest_est.total_bytes == full_est.total_bytes) {
                rc = gt_plan_auto(&sh, full_est.total_bytes - 1, &plan, &est);
                CHECK(rc == -1, "%s: a budget below full's total (the smallest) should fail", g_shapes[s].name);
            }

            /* in between: fits, its estimate is gt_plan_estimate's, and no fixed policy that fits
             * recomputes less */
            char names[64][32];
            int n_names = 0;
            snprintf(names[n_names++], 32, "none");
            snprintf(names[n_names++], 32, "full");
            snprintf(names[n_names++], 32, "selective");
            snprintf(names[n_names++], 32, "sqrt");
            for (int k = 1; k <= N; k++) snprintf(names[n_names++], 32, "uniform:%d", k);
            for (int k = 0; k <= N; k++) snprintf(names[n_names++], 32, "blocks:%d", k);
            const int steps = 20;
            for (int k = 0; k <= steps; k++) {
                uint64_t budget = smallest_est.total_bytes +
                                  (none_est.total_bytes - smallest_est.total_bytes) * (uint64_t)k / steps;
                rc = gt_plan_auto(&sh, budget, &plan, &est);
                CHECK(rc == 0, "%s: budget %llu should fit", g_shapes[s].name, (unsigned long long)budget);
                if (rc != 0) continue;
                CHECK(est.total_bytes <= budget, "%s: auto's plan needs %llu > budget %llu", g_shapes[s].name,
                      (unsigned long long)est.total_bytes, (unsigned long long)budget);
                gt_mem_estimate again;
                gt_plan_estimate(&sh, &plan, &again);
                CHECK(memcmp(&again, &est, sizeof est) == 0, "%s: auto's estimate is not gt_plan_estimate's",
                      g_shapes[s].name);
                for (int i = 0; i < n_names; i++) {
                    gt_plan fixed;
                    gt_mem_estimate fe;
                    if (policy_plan(names[i], N, &fixed) != 0) continue;
                    gt_plan_estimate(&sh, &fixed, &fe);
                    if (fe.total_bytes > budget) continue;
                    CHECK(fe.recompute_flops >= est.recompute_flops,
                          "%s %s, budget %llu: %s fits (%llu bytes) with %g recompute FLOPs < auto's %g",
                          backend_name(v), g_shapes[s].name, (unsigned long long)budget, names[i],
                          (unsigned long long)fe.total_bytes, fe.recompute_flops, est.recompute_flops);
                }
            }
        }
    }
    printf("%s auto_picks_least_recompute_that_fits\n", check_failures == before ? "ok  " : "FAIL");
}

/* The planner remembers each plan's dry run for the shape; a run with the loss head in other chunks
 * is another shape. With a vocabulary 64 times the model width the whole head (chunk limit lifted)
 * sets the activation peak, the default chunks do not: the same plan priced both ways must follow. */
static void remembered_predictions_follow_the_head_chunks(void) {
    int before = check_failures;
    shape_case wide = {"N=2 C=64 NH=4 NKV=2 F=160 V=4096 B=2 T=16", model_cfg(64, 2, 4, 2, 4096, 160), 2, 16};
    const gt_ops *ops = backend(0);
    runner r;
    runner_init(&r, ops, &wide);
    gt_mem_shape sh = mem_shape(ops, &wide);
    gt_plan plan;
    policy_plan("none", wide.model.n_layers, &plan);
    uint64_t measured[2], predicted[2];
    const uint64_t limits[2] = {0, UINT64_MAX};
    for (int i = 0; i < 2; i++) {
        gt_test_hooks_for_tests()->head_chunk_bytes = limits[i];
        gt_mem_estimate est;
        gt_plan_estimate(&sh, &plan, &est);
        micro_result got;
        run_micro(&r, &plan, 1, &got);
        free(got.grads);
        measured[i] = got.act_peak;
        predicted[i] = est.act_peak_bytes;
        CHECK(measured[i] == predicted[i], "%s, head %s: measured activation peak %llu bytes, predicted %llu",
              wide.name, i ? "whole" : "in chunks", (unsigned long long)measured[i],
              (unsigned long long)predicted[i]);
    }
    gt_test_hooks_for_tests()->head_chunk_bytes = 0;
    CHECK(measured[1] > measured[0], "%s: the whole head (%llu bytes) should set a higher peak than chunks (%llu)",
          wide.name, (unsigned long long)measured[1], (unsigned long long)measured[0]);
    runner_free(&r);
    printf("%s remembered_predictions_follow_the_head_chunks\n", check_failures == before ? "ok  " : "FAIL");
}

/* ------------------------------------------------------------------ --predict */

static int predict(int argc, char **argv) {
    if (argc < 1) {
        fprintf(stderr, "usage: test_recompute --predict CONFIG.ini [section.key=value ...]\n");
        return 2;
    }
    gt_config cfg;
    char err[2048];
    if (gt_config_load(&cfg, argv[0], argc - 1, argv + 1, err, sizeof err) != 0) {
        fprintf(stderr, "test_recompute: %s\n", err);
        return 2;
    }
    const gt_ops *ops = gt_ops_cpu();
    gt_mem_shape sh = {.model = cfg.model, .micro_batch = cfg.train.micro_batch, .seq_len = cfg.train.seq_len,
                       .act_bytes = ops->act_bytes, .keep_probs = ops->can_keep_attention_probs, .world = 1,
                       .stage = cfg.dist.shard == GT_SHARD_OPTIMIZER};
    gt_policy pol;
    gt_plan plan;
    if (gt_policy_parse(cfg.memory.recompute, cfg.model.n_layers, &pol, err, sizeof err) != 0) {
        fprintf(stderr, "test_recompute: %s\n", err);
        return 2;
    }
    gt_mem_estimate est;
    if (pol.kind == GT_POLICY_AUTO) {
        if (gt_plan_auto(&sh, cfg.memory.budget, &plan, &est) != 0) {
            fprintf(stderr, "test_recompute: nothing fits the budget\n");
            return 2;
        }
    } else {
        gt_plan_for_policy(&plan, &pol, &sh, &est); /* as the trainer does */
    }
    printf("act_peak_bytes %llu\n", (unsigned long long)est.act_peak_bytes);
    printf("recomputed_blocks %d\n", gt_plan_recomputed_blocks(&plan));
    printf("n_layers %d\n", cfg.model.n_layers);
    printf("grad_accum %d\n", cfg.train.grad_accum);
    printf("state_bytes %llu\n", (unsigned long long)(est.params_bytes + est.grads_bytes + est.optim_bytes));
    printf("total_bytes %llu\n", (unsigned long long)est.total_bytes);
    return 0;
}

/* The GPU libraries' bytes in every plan total: cuBLASLt always; NCCL's buffers exactly when train.c makes
 * an NCCL communicator (dist.comm = nccl, or auto on more than one rank); cuDNN's attention-backward
 * scratch (D and the fp32 dQ accumulator) only with train.cuda_attention = cudnn; nothing on the CPU. */
static void library_bytes_follow_the_communicator_and_attention(void) {
    int before = check_failures;
    gt_model_config m = g_shapes[0].model;
    m.dim = 2048, m.n_heads = 32; /* HD 64 */
    const uint64_t L = GT_CUDA_MATMUL_WORKSPACE_BYTES, N = GT_PLAN_NCCL_BUFFERS;
    const uint64_t cudnn = 4ull * 4 * 32 * 2048 * (64 + 1); /* B 4, NH 32, T 2048 */
    CHECK(gt_plan_cudnn_scratch_bytes(&m, 4, 2048) == cudnn, "cuDNN scratch %llu, expected %llu",
          (unsigned long long)gt_plan_cudnn_scratch_bytes(&m, 4, 2048), (unsigned long long)cudnn);
    const struct {
        int cuda, world;
        gt_comm_choice comm;
        uint64_t want;
    } cases[] = {{0, 1, GT_COMM_AUTO, 0}, {0, 4, GT_COMM_NCCL, 0}, {1, 1, GT_COMM_AUTO, L},     {1, 1, GT_COMM_MPI, L},
                 {1, 1, GT_COMM_NCCL, L + N}, {1, 2, GT_COMM_AUTO, L + N}, {1, 8, GT_COMM_MPI, L}, {1, 8, GT_COMM_NCCL, L + N}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t got = gt_plan_library_bytes(cases[i].cuda, cases[i].world, cases[i].comm, GT_CUDA_ATTENTION_DEFAULT, &m,
                                             4, 2048);
        CHECK(got == cases[i].want, "cuda %d, world %d, comm %s: %llu library bytes, expected %llu", cases[i].cuda,
              cases[i].world, gt_comm_choice_name(cases[i].comm), (unsigned long long)got, (unsigned long long)cases[i].want);
    }
    CHECK(gt_plan_library_bytes(1, 1, GT_COMM_AUTO, GT_CUDA_ATTENTION_CUDNN, &m, 4, 2048) == L + cudnn,
          "cudnn asked: scratch not counted");
    CHECK(gt_plan_library_bytes(0, 1, GT_COMM_AUTO, GT_CUDA_ATTENTION_CUDNN, &m, 4, 2048) == 0,
          "cudnn asked on the CPU: counted");
    CHECK(gt_plan_library_bytes(1, 1, GT_COMM_AUTO, GT_CUDA_ATTENTION_MMA, &m, 4, 2048) == L,
          "mma asked: cuDNN scratch counted");
    printf("%s library_bytes_follow_the_communicator_and_attention\n", check_failures == before ? "ok  " : "FAIL");
}

/* Each policy makes the plan docs/recompute.md describes, block by block: full recomputes every block in
 * segments of one (activations N x + I), uniform:K in segments of K, sqrt is uniform:round(sqrt N) (3 for 7),
 * blocks:K recomputes the first K blocks one by one, selective keeps the matmul outputs of every block,
 * none keeps everything. The peaks above are measured on these plans, so only this says that the plans
 * are the documented ones. */
static void policies_make_the_documented_plans(void) {
    int before = check_failures;
    const int N = 7;
    const char *policy[] = {"none", "full", "selective", "sqrt", "uniform:2", "blocks:2"};
    /* per block: keep (A all, S selective, R recompute), then 1 where a segment starts */
    const char *keep[] = {"AAAAAAA", "RRRRRRR", "SSSSSSS", "RRRRRRR", "RRRRRRR", "RRAAAAA"};
    const char *start[] = {"1111111", "1111111", "1111111", "1001001", "1010101", "1111111"};
    for (size_t p = 0; p < sizeof policy / sizeof policy[0]; p++) {
        gt_plan plan;
        if (policy_plan(policy[p], N, &plan) != 0) continue;
        char got_keep[GT_MAX_LAYERS + 1] = "", got_start[GT_MAX_LAYERS + 1] = "";
        for (int i = 0; i < N; i++) {
            got_keep[i] = plan.keep[i] == GT_KEEP_ALL ? 'A' : plan.keep[i] == GT_KEEP_SELECTIVE ? 'S' : 'R';
            got_start[i] = plan.seg_start[i] ? '1' : '0';
        }
        CHECK(plan.n_blocks == N, "%s: %d blocks, expected %d", policy[p], plan.n_blocks, N);
        CHECK(strcmp(got_keep, keep[p]) == 0, "%s: keeps %s, expected %s", policy[p], got_keep, keep[p]);
        CHECK(strcmp(got_start, start[p]) == 0, "%s: segments start at %s, expected %s", policy[p], got_start,
              start[p]);
    }
    printf("%s policies_make_the_documented_plans\n", check_failures == before ? "ok  " : "FAIL");
}

/* bf16 against fp32 on the CPU, one micro-batch of every shape from the same fp32 weights (dropout 0.1,
 * the same masks): the gradient of every tensor points the same way (cosine > 0.999) and the loss is
 * within 1%. bf16 rounds the working weights and every activation to 8 bits of mantissa (relative error
 * 2^-9 per rounding), so the gradients differ in their last few bits per element, not in direction;
 * a kernel that drops a term or accumulates wrongly turns a whole tensor's gradient. */
static void bf16_gradients_track_fp32(void) {
    int before = check_failures;
    if (n_variants() < 3) return;
    for (int s = 0; s < N_SHAPES; s++) {
        runner f, b;
        runner_init(&f, backend(0), &g_shapes[s]);
        runner_init(&b, backend(2), &g_shapes[s]);
        gt_plan none;
        policy_plan("none", g_shapes[s].model.n_layers, &none);
        micro_result rf, rb;
        run_micro(&f, &none, 1, &rf);
        run_micro(&b, &none, 1, &rb);
        const gt_layout *layout = gt_model_layout(f.model);
        double worst = 1.0;
        const char *worst_name = "";
        for (int t = 0; t < layout->n_tensors; t++) {
            const gt_tensor_info *ti = &layout->tensors[t];
            double dot = 0, nf = 0, nb = 0;
            for (size_t i = ti->offset; i < ti->offset + ti->numel; i++) {
                dot += (double)rf.grads[i] * rb.grads[i];
                nf += (double)rf.grads[i] * rf.grads[i];
                nb += (double)rb.grads[i] * rb.grads[i];
            }
            double cosine = nf == 0 && nb == 0 ? 1.0 : dot / sqrt(nf * nb);
            if (cosine < worst) worst = cosine, worst_name = ti->name;
            CHECK(cosine > 0.999, "%s: gradient of %s: cosine bf16 vs fp32 %.6f (expected > 0.999)", g_shapes[s].name,
                  ti->name, cosine);
        }
        double rel = fabs(rb.loss - rf.loss) / fabs(rf.loss);
        CHECK(rel < 1e-2, "%s: loss bf16 %.7f vs fp32 %.7f (relative %.3g, expected < 1e-2)", g_shapes[s].name,
              rb.loss, rf.loss, rel);
        printf("  %s: loss fp32 %.6f bf16 %.6f; lowest gradient cosine %.6f (%s)\n", g_shapes[s].name, rf.loss,
               rb.loss, worst, worst_name);
        free(rf.grads);
        free(rb.grads);
        runner_free(&f);
        runner_free(&b);
    }
    printf("%s bf16_gradients_track_fp32\n", check_failures == before ? "ok  " : "FAIL");
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--predict") == 0) return predict(argc - 2, argv + 2);
    init_shapes();
    all_policies_give_bit_identical_losses_and_grads_with_dropout();
    measured_activation_peak_equals_prediction();
    /* again with the loss head in chunks of 7, 5 and 8 rows (shapes 0, 1, 2: 32, 36 and 24 rows; the
     * first two end on a partial chunk); above, each shape's head was one chunk */
    gt_test_hooks_for_tests()->head_chunk_bytes = 5 * 97 * 4;
    printf("loss head in chunks of %d, %d and %d rows:\n", gt_head_rows(&g_shapes[0].model, 32, 4),
           gt_head_rows(&g_shapes[1].model, 36, 4), gt_head_rows(&g_shapes[2].model, 24, 4));
    all_policies_give_bit_identical_losses_and_grads_with_dropout();
    measured_activation_peak_equals_prediction();
    gt_test_hooks_for_tests()->head_chunk_bytes = 0;
    documents_workspace_is_predicted();
    remembered_predictions_follow_the_head_chunks();
    activation_peaks_order_as_the_model_says();
    recomputed_blocks_match_the_plan();
    bad_policy_strings_are_rejected();
    policies_make_the_documented_plans();
    auto_picks_least_recompute_that_fits();
    library_bytes_follow_the_communicator_and_attention();
    bf16_gradients_track_fp32();
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("all recompute checks passed\n");
    return 0;
}
