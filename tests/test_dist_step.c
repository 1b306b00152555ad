/*
 * test_dist_step — one optimizer step under data parallelism, run under mpiexec with 1, 2 and 4 ranks.
 *
 * For dist.shard = optimizer (ZeRO-1) and none, with a tiny model whose parameter count is not a
 * multiple of 4 (so 4 ranks need padding):
 *   - grad_accum = 3 micro-batches through gt_model_train_micro call NO collective (gt_comm_stats);
 *   - gt_optim_step calls exactly one gradient reduction (one reduce-scatter + one all-gather when
 *     sharded, one all-reduce for shard = none, nothing tensor-sized with one rank), one scalar
 *     reduction for the sharded grad norm, and bytes_sent is the volume comm.h's model gives for the
 *     padded slice_len (or for n with the all-reduce);
 *   - gt_optim_bytes = 3 * 4 * slice_len (ceil(n/W) when sharded);
 *   - the new working parameters are bitwise identical on every rank, and equal (up to summation
 *     order) to a single-process reference that runs all 3*W micro-batches of the global batch on one
 *     replica (MPI_COMM_SELF communicator, not sharded); the grad norm agrees the same way.
 * Two steps are run so the per-step counters (reset at the start of each step, as train.c does) and
 * the AdamW step count are exercised twice.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "comm.h"
#include "config.h"
#include "memtrack.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "recompute.h"
#include "shard.h"

static int rank, world;
#include "check.h"

enum { B = 2, T = 8, ACCUM = 3, STEPS = 2 };

/* C = 18 (3 heads of 6, 1 kv head), 2 layers: n = 18 * odd, so n % 4 == 2 (4 ranks pad by 2). */
static void make_config(gt_config *cfg) {
    gt_config_defaults(cfg);
    cfg->model.dim = 18;
    cfg->model.n_layers = 2;
    cfg->model.n_heads = 3;
    cfg->model.n_kv_heads = 1;
    cfg->model.vocab_size = 50;
    cfg->model.ffn_dim = 40;
    cfg->model.max_seq_len = T;
    cfg->model.dropout = 0.0f;
    cfg->train.seq_len = T;
    cfg->train.micro_batch = B;
    cfg->train.grad_accum = ACCUM;
    cfg->train.steps = 10;
    cfg->train.lr = 1e-3;
    cfg->train.min_lr = 1e-4;
    cfg->train.warmup_steps = 0;
    cfg->train.weight_decay = 0.1;
    cfg->train.grad_clip = 0.2; /* low enough that the clipping path runs */
    cfg->train.adam_eps = 1e-8;
}

/* Tokens of global micro-batch g of step s: deterministic, independent of the world size. */
static void tokens(int s, int g, int V, int32_t *in, int32_t *tg) {
    uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(s * 1000 + g + 1);
    for (int i = 0; i < B * T; i++) {
        h = gt_mix64(h + (uint64_t)i);
        in[i] = (int32_t)(h % (uint64_t)V);
        tg[i] = (int32_t)((h >> 32) % (uint64_t)V);
    }
    tg[0] = -1; /* an ignored target */
}

typedef struct {
    gt_mem mem;
    gt_model *model;
    gt_optim opt;
    size_t n_padded;
} replica;

static void replica_init(replica *r, const gt_ops *ops, gt_comm *comm, const gt_config *cfg, int sharded,
                         const float *init) {
    gt_mem_init(&r->mem, ops);
    gt_layout layout;
    gt_layout_init(&layout, &cfg->model);
    r->n_padded = gt_optim_padded_len(layout.n_params, gt_comm_size(comm), sharded);
    gt_layout_free(&layout);
    r->model = gt_model_create_padded(ops, &r->mem, &cfg->model, r->n_padded);
    gt_model_set_params(r->model, init);
    gt_optim_init(&r->opt, ops, &r->mem, comm, r->model, sharded, init);
}

static void replica_free(replica *r) {
    gt_optim_free(&r->opt);
    gt_model_destroy(r->model);
}

static void run_mode(const gt_ops *ops, gt_comm *comm, gt_comm *self_comm, int sharded) {
    const char *mode = sharded ? "shard=optimizer" : "shard=none";
    gt_config cfg;
    make_config(&cfg);
    gt_layout layout;
    gt_layout_init(&layout, &cfg.model);
    size_t n = layout.n_params;
    float *init = malloc(n * sizeof *init);
    if (!init) abort();
    gt_layout_init_params(&layout, init, cfg.train.seed);

    replica dp, ref;
    replica_init(&dp, ops, comm, &cfg, sharded, init);
    replica_init(&ref, ops, self_comm, &cfg, 0, init);

    /* layout and optimizer-state arithmetic */
    int zero1 = sharded && world > 1;
    size_t slice_len = zero1 ? (n + (size_t)world - 1) / (size_t)world : n;
    size_t n_pad_expect = zero1 ? slice_len * (size_t)world : n;
    CHECK(dp.n_padded == n_pad_expect, "%s: n_padded %zu, expected %zu (n = %zu)", mode, dp.n_padded,
          n_pad_expect, n);
    CHECK(dp.opt.shard.slice_len == slice_len, "%s: slice_len %zu, expected %zu", mode, dp.opt.shard.slice_len,
          slice_len);
    CHECK(gt_optim_bytes(&dp.opt) == 3ull * 4ull * slice_len, "%s: optim bytes %llu, expected 12*%zu", mode,
          (unsigned long long)gt_optim_bytes(&dp.opt), slice_len);
    if (rank == 0)
        printf("%s, %d rank(s): n = %zu, n_pad = %zu, slice_len = %zu, optim_bytes = %llu\n", mode, world, n,
               dp.n_padded, slice_len, (unsigned long long)gt_optim_bytes(&dp.opt));

    gt_plan plan;
    gt_policy policy;
    char err[256];
    if (gt_policy_parse("none", cfg.model.n_layers, &policy, err, sizeof err) != 0) {
        fprintf(stderr, "policy: %s\n", err);
        abort();
    }
    gt_plan_from_policy(&plan, &policy, cfg.model.n_layers);

    const uint64_t G = (uint64_t)B * ACCUM * world;
    const float dloss = (float)(1.0 / ((double)G * T));
    int32_t in[B * T], tg[B * T];
    float *got = malloc(dp.n_padded * sizeof *got), *want = malloc(n * sizeof *want),
          *root = malloc(n * sizeof *root);
    if (!got || !want || !root) abort();

    for (int step = 1; step <= STEPS; step++) {
        /* ---- the data-parallel replica: this rank's ACCUM micro-batches, then the step */
        gt_comm_stats_reset(comm);
        ops->zero(gt_model_grads(dp.model), dp.n_padded * sizeof(float));
        double loss = 0.0;
        int recomputed = 0;
        for (int m = 0; m < ACCUM; m++) {
            tokens(step, rank * ACCUM + m, cfg.model.vocab_size, in, tg);
            gt_rng_key key = {cfg.train.seed, (uint64_t)(rank * ACCUM + m)};
            loss += gt_model_train_micro(dp.model, &plan, in, tg, B, T, dloss, key, &recomputed);
        }
        gt_comm_stats st;
        gt_comm_stats_get(comm, &st);
        CHECK(st.calls_all_reduce == 0 && st.calls_reduce_scatter == 0 && st.calls_all_gather == 0 &&
                  st.calls_broadcast == 0 && st.calls_scalar == 0 && st.bytes_sent == 0,
              "%s step %d: micro-batches communicated: all_reduce %llu reduce_scatter %llu all_gather %llu "
              "broadcast %llu scalar %llu bytes %llu",
              mode, step, (unsigned long long)st.calls_all_reduce, (unsigned long long)st.calls_reduce_scatter,
              (unsigned long long)st.calls_all_gather, (unsigned long long)st.calls_broadcast,
              (unsigned long long)st.calls_scalar, (unsigned long long)st.bytes_sent);

        double norm = 0, ref_norm = 0;
        gt_step_outcome outcome = gt_optim_step(&dp.opt, &cfg, step, 0, &norm);
        gt_comm_stats_get(comm, &st);
        uint64_t W = (uint64_t)world;
        uint64_t ar = 0, rs = 0, ag = 0, sc = 0, bytes = 0;
        if (world > 1 && zero1) {
            rs = ag = sc = 1;
            bytes = (W - 1) * slice_len * 4 + (W - 1) * slice_len * (uint64_t)ops->act_bytes;
        } else if (world > 1) {
            ar = 1;
            bytes = 2 * (W - 1) * (uint64_t)n * 4 / W;
        }
        CHECK(st.calls_all_reduce == ar && st.calls_reduce_scatter == rs && st.calls_all_gather == ag &&
                  st.calls_broadcast == 0 && st.calls_scalar == sc,
              "%s step %d: calls all_reduce %llu (want %llu) reduce_scatter %llu (want %llu) all_gather %llu "
              "(want %llu) broadcast %llu (want 0) scalar %llu (want %llu)",
              mode, step, (unsigned long long)st.calls_all_reduce, (unsigned long long)ar,
              (unsigned long long)st.calls_reduce_scatter, (unsigned long long)rs,
              (unsigned long long)st.calls_all_gather, (unsigned long long)ag,
              (unsigned long long)st.calls_broadcast, (unsigned long long)st.calls_scalar, (unsigned long long)sc);
        CHECK(st.bytes_sent == bytes, "%s step %d: bytes_sent %llu, expected %llu", mode, step,
              (unsigned long long)st.bytes_sent, (unsigned long long)bytes);
        CHECK(gt_optim_bytes(&dp.opt) == 3ull * 4ull * slice_len, "%s: optim bytes changed", mode);

        /* ---- the reference: all G/B micro-batches of the global batch on one unsharded replica */
        ops->zero(gt_model_grads(ref.model), ref.n_padded * sizeof(float));
        double ref_loss = 0.0;
        for (int g = 0; g < ACCUM * world; g++) {
            tokens(step, g, cfg.model.vocab_size, in, tg);
            gt_rng_key key = {cfg.train.seed, (uint64_t)g};
            ref_loss += gt_model_train_micro(ref.model, &plan, in, tg, B, T, dloss, key, &recomputed);
        }
        gt_step_outcome ref_outcome = gt_optim_step(&ref.opt, &cfg, step, 0, &ref_norm);

        double loss_all = 0.0;
        MPI_Allreduce(&loss, &loss_all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        /* step 1 starts from identical weights (the loss differs only by the order of the sum over
         * ranks); later steps from weights that differ by rounding */
        double loss_tol = step == 1 ? 1e-12 : 1e-6;
        CHECK(fabs(loss_all - ref_loss) <= loss_tol * fabs(ref_loss), "%s step %d: loss %.12g vs reference %.12g",
              mode, step, loss_all, ref_loss);
        CHECK(fabs(norm - ref_norm) <= 1e-5 * ref_norm, "%s step %d: grad norm %.9g vs reference %.9g", mode, step,
              norm, ref_norm);
        CHECK(outcome == GT_STEP_APPLIED && ref_outcome == GT_STEP_APPLIED,
              "%s step %d: the update was not applied (outcome %d, reference %d)", mode, step, (int)outcome,
              (int)ref_outcome);
        if (step == 1)
            CHECK(ref_norm > cfg.train.grad_clip, "grad norm %g does not exercise clipping (clip %g)", ref_norm,
                  cfg.train.grad_clip);

        /* ---- parameters: identical on every rank, equal to the reference up to summation order */
        ops->copy_to_host(got, gt_model_params(dp.model), dp.n_padded * sizeof(float));
        ops->copy_to_host(want, gt_model_params(ref.model), n * sizeof(float));
        memcpy(root, got, n * sizeof(float));
        MPI_Bcast(root, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
        CHECK(memcmp(root, got, n * sizeof(float)) == 0, "%s step %d: parameters differ from rank 0's", mode,
              step);
        for (size_t i = n; i < dp.n_padded; i++)
            CHECK(got[i] == 0.0f, "%s step %d: padding element %zu is %g, not 0", mode, step, i, got[i]);
        double max_diff = 0.0;
        size_t worst = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)got[i] - (double)want[i]);
            if (d > max_diff) {
                max_diff = d;
                worst = i;
            }
        }
        /* A parameter moves by at most ~lr per step; rounding in the gradient sum perturbs the AdamW
         * update relatively by ~1e-6, so 1e-3 * lr is a wide bound that still catches a wrong slice,
         * a missing rank's gradient or a double update (all O(lr)). */
        CHECK(max_diff <= 1e-3 * cfg.train.lr, "%s step %d: parameter %zu is %.9g, reference %.9g (diff %g)", mode,
              step, worst, got[worst], want[worst], max_diff);
        if (rank == 0)
            printf("%s step %d: loss %.6f (ref %.6f), grad_norm %.6f (ref %.6f), max |param - ref| %.3g, "
                   "comm bytes %llu\n",
                   mode, step, loss_all / ((double)G * T), ref_loss / ((double)G * T), norm,
                   ref_norm, max_diff, (unsigned long long)st.bytes_sent);
    }

    free(got);
    free(want);
    free(root);
    replica_free(&ref);
    replica_free(&dp);
    free(init);
    gt_layout_free(&layout);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    check_rank = rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const gt_ops *ops = gt_ops_cpu();
    gt_comm *comm = gt_comm_create_mpi(MPI_COMM_WORLD);
    gt_comm *self_comm = gt_comm_create_mpi(MPI_COMM_SELF);

    run_mode(ops, comm, self_comm, 1);
    run_mode(ops, comm, self_comm, 0);

    gt_comm_destroy(self_comm);
    gt_comm_destroy(comm);
    int total = 0;
    MPI_Allreduce(&check_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("test_dist_step (%d ranks): %s (%d check_failures)\n", world, total ? "FAIL" : "ok", total);
    MPI_Finalize();
    return total ? 1 : 0;
}
