/*
 * calibrate.c — gtrain --calibrate's measurements (calib.h): each kernel the time model prices, at
 * the shapes of the config's model (attention and the memory-bound kernels at several sizes), on the
 * backend at hand, and the collectives between the ranks of the job. Each measurement repeats its
 * call until about a tenth of a second has passed (at least twice, after one warm-up call) and keeps
 * the median call; the list of them runs in up to five rounds, each figure its fastest round's, so
 * the whole takes seconds on a small model and about a minute on a large one; GEMMs
 * larger than a few GFLOPs per call on the CPU are measured on fewer rows (the rate of a GEMM with
 * thousands of rows hardly depends on their number).
 */
#include "calibrate.h"
#include "agree.h"
#include "comm.h"
#include "model.h"
#include "ops_dry.h"
#include "recompute.h"
#include "timemodel.h"
#include "testhooks.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The ranks of the job measure together (docs/planner.md, "Calibration"): before each measurement
 * every rank waits at a barrier, so that the ranks sharing a host run the same kernel at the same
 * time, as a step's ranks share its memory bandwidth, caches and clocks; the figure kept is the
 * slowest rank's (a step waits at each blocking collective for its slowest rank, and a rank slowed by
 * its neighbours stays the slower one over a run). How far the ranks' figures spread is kept too. */
#define MAX_SPREADS 1024
static struct {
    MPI_Comm world; /* MPI_COMM_NULL: one rank */
    int size;
    int min_ranks;  /* the fewest ranks that reported a figure for one measurement (INT_MAX: none compared) */
    double spread[MAX_SPREADS];
    int n_spread;
} g_ranks = {MPI_COMM_NULL, 1, INT_MAX, {0}, 0};

static void together_begin(void) {
    if (g_ranks.size > 1) MPI_Barrier(g_ranks.world);
}
/* The slowest rank's seconds of this rank's t (every rank calls it for the same measurement) */
static double together_end(double t) {
    if (g_ranks.size <= 1) return t;
    double v[2] = {t, -t};
    int have = t > 0;
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, g_ranks.world);
    MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_SUM, g_ranks.world);
    if (have < g_ranks.min_ranks) g_ranks.min_ranks = have;
    if (-v[1] > 0 && g_ranks.n_spread < MAX_SPREADS) g_ranks.spread[g_ranks.n_spread++] = v[0] / -v[1];
    return v[0];
}

#define MIN_SECONDS 0.1
#define MIN_REPS 2
#define MAX_REPS 200
#define KERNEL_REPS 7 /* the kernels' list: the median of at least 7 calls, so that a few calls that
                         lost their core to another process do not set it */

static double median(double *v, int n);

/* Seconds per call of fn: one warm-up, then calls until MIN_SECONDS (at least MIN_REPS); the median
 * call, so that a burst of load from other processes during a few calls does not set the rate. */
typedef void (*bench_fn)(const gt_ops *ops, void **b, const int *d);
/* Before each call of a kernel that bench_for times, the CPU's caches up to a level are filled with
 * other data (g_flush bytes written, 0: none), as a step's kernels find them: a kernel's inputs were
 * written some kernels before (out of the core's L2 by then), the optimizer's state a step before
 * (out of L3). Repeating a call on the same buffers would time it hot, at the cache's bandwidth. */
static size_t g_flush;
static unsigned char *g_scratch;
static size_t g_scratch_len;
static void flush_caches(void) {
    if (!g_flush) return;
    if (g_scratch_len < g_flush) {
        free(g_scratch);
        g_scratch = malloc(g_flush);
        g_scratch_len = g_scratch ? g_flush : 0;
        if (!g_scratch) return;
    }
    static unsigned char v;
    memset(g_scratch, ++v, g_flush);
}
static size_t cache_bytes(int name, size_t fallback) {
    long v = sysconf(name);
    return v > 0 ? (size_t)v : fallback;
}

/* GTRAIN_TEST_CALIB_SLOW_ROUND: seconds added to each timed call of this round (testhooks.h) */
static double g_test_slow_s;

static double bench_for(const gt_ops *ops, bench_fn fn, void **b, const int *d, double min_seconds, int min_reps) {
    flush_caches();
    fn(ops, b, d);
    ops->synchronize();
    together_begin();
    double times[MAX_REPS], t0 = now_s();
    int reps = 0;
    do {
        flush_caches();
        double s = now_s();
        fn(ops, b, d);
        ops->synchronize();
        if (g_test_slow_s > 0) nanosleep(&(struct timespec){0, (long)(g_test_slow_s * 1e9)}, NULL);
        times[reps++] = now_s() - s;
    } while ((now_s() - t0 < min_seconds || reps < min_reps) && reps < MAX_REPS);
    return together_end(median(times, reps));
}
static double bench(const gt_ops *ops, bench_fn fn, void **b, const int *d) {
    return bench_for(ops, fn, b, d, MIN_SECONDS, MIN_REPS);
}

static void mm_fwd(const gt_ops *o, void **b, const int *d) { o->matmul_forward(b[2], b[0], b[1], d[0], d[1], d[2]); }
static void mm_bwd(const gt_ops *o, void **b, const int *d) {
    o->matmul_backward(b[3], (float *)b[4], b[2], b[0], b[1], d[0], d[1], d[2], 0);
}
static const gt_rng_key no_key = {0, 0};
static void at_fwd(const gt_ops *o, void **b, const int *d) {
    o->attention_forward(b[3], (float *)b[4], NULL, b[0], b[1], b[2], NULL, d[0], d[1], d[2], d[3], d[4], 0.0f, no_key);
}
static void at_bwd(const gt_ops *o, void **b, const int *d) {
    o->attention_backward(b[5], b[6], b[7], b[8], b[3], b[0], b[1], b[2], (float *)b[4], NULL, NULL, d[0], d[1],
                          d[2], d[3], d[4], 0.0f, no_key);
}
static void res_fwd(const gt_ops *o, void **b, const int *d) {
    o->residual_forward(b[0], b[1], b[2], (size_t)d[0], 0.0f, no_key);
}
static void adamw(const gt_ops *o, void **b, const int *d) {
    o->adamw((float *)b[0], (float *)b[1], (float *)b[2], (const float *)b[3], (size_t)d[0], 1e-4f, 0.9f, 0.95f, 1e-8f,
             0.1f, 1);
}

/* The memory-bound kernels, each called as the model calls it. d: rows n, C, F, V, T, NH, HD; b[0..4]
 * activations (and the embedding table), b[5] fp32 rows (rstd, losses), b[6] tokens (all 0: a valid
 * id), b[7] the rope table. rope: n rows as n / T sequences of T (or one of n). */
#define ROWS_B(d) ((d)[0] >= (d)[4] ? (d)[0] / (d)[4] : 1)
#define ROWS_T(d) ((d)[0] >= (d)[4] ? (d)[4] : (d)[0])
static void k_emb_fwd(const gt_ops *o, void **b, const int *d) { o->embedding_forward(b[0], b[6], b[1], d[0], d[1], d[3]); }
static void k_emb_bwd(const gt_ops *o, void **b, const int *d) {
    o->embedding_backward(b[1], b[0], b[6], d[0], d[1], d[3]);
}
static void k_norm_fwd(const gt_ops *o, void **b, const int *d) {
    o->rmsnorm_forward(b[0], b[5], b[1], b[2], d[0], d[1], 1e-5f);
}
static void k_norm_apply(const gt_ops *o, void **b, const int *d) { o->rmsnorm_apply(b[0], b[5], b[1], b[2], d[0], d[1]); }
static void k_norm_bwd(const gt_ops *o, void **b, const int *d) {
    o->rmsnorm_backward(b[0], b[3], b[1], b[2], b[4], b[5], d[0], d[1]);
}
static void k_rope_fwd(const gt_ops *o, void **b, const int *d) {
    o->rope_forward(b[0], b[1], b[7], NULL, ROWS_B(d), ROWS_T(d), d[5], d[6]);
}
static void k_rope_bwd(const gt_ops *o, void **b, const int *d) {
    o->rope_backward(b[0], b[1], b[7], NULL, ROWS_B(d), ROWS_T(d), d[5], d[6]);
}
static void k_swiglu_fwd(const gt_ops *o, void **b, const int *d) { o->swiglu_forward(b[0], b[1], b[2], (size_t)d[0] * d[2]); }
static void k_swiglu_bwd(const gt_ops *o, void **b, const int *d) {
    o->swiglu_backward(b[0], b[3], b[4], b[1], b[2], (size_t)d[0] * d[2]);
}
static void k_residual(const gt_ops *o, void **b, const int *d) {
    o->residual_forward(b[0], b[1], b[2], (size_t)d[0] * d[1], 0.0f, no_key);
}
static void k_dropout_bwd(const gt_ops *o, void **b, const int *d) {
    o->dropout_backward(b[0], b[1], (size_t)d[0] * d[1], 0.0f, no_key);
}
static void k_ce_fwd(const gt_ops *o, void **b, const int *d) { o->crossentropy_forward(b[5], b[3], b[0], b[6], d[0], d[3]); }
static void k_ce_bwd(const gt_ops *o, void **b, const int *d) {
    o->crossentropy_backward(b[0], b[3], b[6], d[0], d[3], 1.0f / (float)d[0]);
}
/* the step's own: d[0] elements of the rank's slice */
static void k_sumsq(const gt_ops *o, void **b, const int *d) { (void)o->sumsq(b[0], (size_t)d[0]); }
static void k_to_working(const gt_ops *o, void **b, const int *d) { o->to_working(b[1], b[0], (size_t)d[0]); }

/* The bytes the dry backend counts for one call (ops_dry.c, the formulas the time model prices with) */
static double g_dry_amount; /* bytes, or FLOPs for attention (calib.h gt_calib_kernel) */
static void keep_amount(void *ctx, const gt_op_cost *cost) {
    (void)ctx;
    g_dry_amount = cost->kind == GT_COST_ATTENTION ? cost->flops : cost->bytes;
}

/* A call of more bytes or FLOPs is not faster than a smaller call of the same kernel: each of the
 * entries first..n_kernel-1 takes the least seconds of it and the larger ones of its op, so
 * that a small call slowed by another process's load does not price the sizes around it. */
static void monotone(gt_calib *c, int first) {
    for (int i = first; i < c->n_kernel; i++)
        for (int j = first; j < c->n_kernel; j++)
            if (strcmp(c->kernel[j].op, c->kernel[i].op) == 0 && c->kernel[j].amount >= c->kernel[i].amount &&
                c->kernel[j].seconds < c->kernel[i].seconds)
                c->kernel[i].seconds = c->kernel[j].seconds;
}

/* One entry of the kernels' list: fn measured on `ops`, its amount counted on the dry table `dry` */
static void add_kernel(gt_calib *c, const char *op, const gt_ops *ops, const gt_ops *dry, bench_fn fn, void **b,
                       const int *d, double min_seconds, int min_reps) {
    double t = bench_for(ops, fn, b, d, min_seconds, min_reps);
    g_dry_amount = 0;
    fn(dry, b, d); /* the dry table reads no buffer */
    if (c->n_kernel >= GT_CALIB_MAX_KERNELS || g_dry_amount <= 0 || t <= 0) return;
    gt_calib_kernel *e = &c->kernel[c->n_kernel++];
    snprintf(e->op, sizeof e->op, "%s", op);
    e->amount = g_dry_amount;
    e->seconds = t;
}

static void *buf(const gt_ops *o, size_t bytes) {
    void *p = o->alloc(bytes ? bytes : 1);
    o->zero(p, bytes ? bytes : 1);
    return p;
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

/* The collectives of one communicator: a one-element all-reduce gives the latency (the median of 20),
 * a 16 MiB (CPU) or 256 MiB (GPU) reduce-scatter and all-gather the bandwidth (the fastest of 5), in
 * the ring model's terms (timemodel.h). All its ranks take part; the figures are its rank 0's. */
static void bench_comm(gt_comm *comm, const gt_ops *ops, int gpu, double *latency_s, double *bytes_per_s) {
    int W = gt_comm_size(comm);
    size_t n = gpu ? (size_t)64 << 20 : (size_t)4 << 20;
    void *b = buf(ops, n * 4);
    double small[20], big[5];
    gt_comm_barrier(comm);
    for (int r = 0; r < 20; r++) {
        double t0 = now_s();
        gt_comm_all_reduce_sum(comm, b, 1, GT_DTYPE_F32);
        small[r] = now_s() - t0;
    }
    for (int r = 0; r < 5; r++) { /* an all-reduce as ZeRO's reduction runs it: a reduce-scatter, an all-gather */
        gt_comm_barrier(comm);
        double t0 = now_s();
        size_t part = n / (size_t)W;
        float *mine = (float *)b + (size_t)gt_comm_rank(comm) * part;
        gt_comm_reduce_scatter_sum(comm, b, mine, part, GT_DTYPE_F32);
        gt_comm_all_gather(comm, mine, b, part, GT_DTYPE_F32);
        big[r] = now_s() - t0;
    }
    /* the latency the median call's; the bandwidth the fastest transfer's (a transfer is only ever
     * slowed, by other traffic or a core taken: on the 2-node test cluster one calibration in three
     * had its median at 0.07 GB/s on a link whose transfers ran at 0.11) */
    double best_small = median(small, 20), best_big = big[0];
    for (int r = 1; r < 5; r++)
        if (big[r] < best_big) best_big = big[r];
    ops->free(b);
    *latency_s = best_small;
    double moved = 2.0 * (W - 1) / W * (double)n * 4;
    *bytes_per_s = moved / (best_big - best_small > 1e-9 ? best_big - best_small : best_big);
}

/* What the measurements of one calibration share: the config's shapes, the backend, the file's rates
 * being filled, the log, and the dry table that counts each kernel as the time model does */
typedef struct calib_run {
    const gt_config *cfg;
    const gt_model_config *m;
    const gt_ops *ops;
    gt_ops dry;
    int gpu;
    int B, T, C, F, V, NH, NKV, HD, N; /* micro-batch (1 under auto: the rows of 1, 2, 4, 8 below), sequence,
                                          widths, heads, rows of the micro-batch */
    size_t e;                          /* bytes per activation element */
    gt_calib *c;
    FILE *log;
} calib_run;

/* The model's GEMM shapes (model.c): q and o (C, C), k and v (C, KVD), gate and up (C, F), down (F,
 * C), the head (C, V); at the rows of the config's micro-batch and of the micro-batches of 1, 2, 4 and
 * 8 sequences (a GEMM's rate depends on its rows where they are few: the planner may price other
 * micro-batch sizes). The shape-free rate: the median of the forward rates.
 *
 * Before any is timed, every product of the list runs once, forward and backward, in the model's
 * order: a step runs them all, so each of its GEMMs follows the others, and the BLAS's speed at a shape
 * depends on what ran before it in the process. With Debian 12's OpenBLAS (0.3.21, its Zen kernels,
 * fp32, one thread) a product of at most ~320 output columns (q, o, k, v at dim 256) ran 3.5x slower
 * (9.5 against 34 GFLOP/s of CPU time) for as long as the process had not yet run one of 352 or more
 * output columns on 256 or more rows (gate, up); a step runs those every micro-batch, so the
 * calibration that timed (C, C) and (C, KVD) first priced them 2 to 3.5x too slow. */
typedef struct gemm_case {
    int n, ic, oc;
} gemm_case;

static void gemm_buffers(calib_run *r, const gemm_case *g, void *b[5]) {
    size_t e = r->e;
    b[0] = buf(r->ops, (size_t)g->n * g->ic * e);
    b[1] = buf(r->ops, (size_t)g->oc * g->ic * e);
    b[2] = buf(r->ops, (size_t)g->n * g->oc * e);
    b[3] = buf(r->ops, (size_t)g->n * g->ic * e);
    b[4] = buf(r->ops, (size_t)g->oc * g->ic * 4);
}

static void measure_gemms(calib_run *r) {
    gt_calib *c = r->c;
    const gt_ops *ops = r->ops;
    int C = r->C, T = r->T, N = r->N;
    int shapes[5][2] = {{C, C}, {C, r->NKV * r->HD}, {C, r->F}, {r->F, C}, {C, r->V}};
    int rows[5] = {N, T, 2 * T, 4 * T, 8 * T};
    gemm_case cases[GT_CALIB_MAX_GEMMS];
    int n_cases = 0;
    for (int s = 0; s < 5; s++) {
        int IC = shapes[s][0], OC = shapes[s][1];
        for (int ri = 0; ri < 5 && n_cases < GT_CALIB_MAX_GEMMS; ri++) {
            int n = rows[ri];
            double cap = r->gpu ? 1e12 : 2e9;
            if (2.0 * n * IC * OC > cap) n = (int)(cap / (2.0 * IC * OC));
            if (n < 16) n = 16;
            int dup = 0;
            for (int k = 0; k < n_cases; k++) dup |= cases[k].ic == IC && cases[k].oc == OC && cases[k].n == n;
            if (!dup) cases[n_cases++] = (gemm_case){n, IC, OC};
        }
    }
    for (int k = 0; k < n_cases; k++) { /* the warm pass: each product once, as a step has run them */
        void *b[5];
        int d[3] = {cases[k].n, cases[k].ic, cases[k].oc};
        gemm_buffers(r, &cases[k], b);
        mm_fwd(ops, b, d);
        mm_bwd(ops, b, d);
        ops->synchronize();
        for (int j = 0; j < 5; j++) ops->free(b[j]);
    }
    double fwd_rates[GT_CALIB_MAX_GEMMS];
    c->n_gemm = 0;
    for (int k = 0; k < n_cases; k++) {
        int n = cases[k].n, IC = cases[k].ic, OC = cases[k].oc;
        void *b[5];
        gemm_buffers(r, &cases[k], b);
        int d[3] = {n, IC, OC};
        double tf = bench(ops, mm_fwd, b, d), tb = bench(ops, mm_bwd, b, d);
        for (int j = 0; j < 5; j++) ops->free(b[j]);
        gt_calib_gemm *g = &c->gemm[c->n_gemm];
        *g = (gt_calib_gemm){n, IC, OC, 2.0 * n * IC * OC / tf, 4.0 * n * IC * OC / tb};
        fwd_rates[c->n_gemm++] = g->fwd_flops_per_s;
    }
    c->matmul_flops_per_s = median(fwd_rates, c->n_gemm);
}

/* Attention at the micro-batch's shape (the single rates), and into the kernels' list at batches of
 * 1, 2, 4 and 8 sequences too, where a call is at most 2 GFLOPs on the CPU (a batch's rate depends on
 * it where it is small: the planner prices other micro-batch sizes) */
static void measure_attention(calib_run *r) {
    gt_calib *c = r->c;
    const gt_ops *ops = r->ops;
    int T = r->T, NH = r->NH, NKV = r->NKV, HD = r->HD;
    size_t e = r->e;
    int first_attention = c->n_kernel;
    int batches[5] = {r->B, 1, 2, 4, 8}, done[5], n_done = 0;
    for (int bi = 0; bi < 5; bi++) {
        int Bb = batches[bi], dup = 0;
        for (int j = 0; j < n_done; j++) dup |= done[j] == Bb;
        double fl = 4.0 * Bb * NH * HD * ((double)T * (T + 1) / 2);
        if (dup || (bi > 0 && !r->gpu && fl > 2e9)) continue;
        done[n_done++] = Bb;
        size_t q = (size_t)Bb * T * NH * HD * e, kv = (size_t)Bb * T * NKV * HD * e;
        void *b[9] = {buf(ops, q), buf(ops, kv), buf(ops, kv), buf(ops, q), buf(ops, (size_t)Bb * NH * T * 4),
                      buf(ops, q), buf(ops, kv), buf(ops, kv), buf(ops, q)};
        int d[5] = {Bb, T, NH, NKV, HD};
        int before = c->n_kernel;
        /* the config's batch as before (a large model's call can take seconds on the CPU), the others
         * as the kernels' list */
        int reps = bi == 0 ? MIN_REPS : KERNEL_REPS;
        double secs = bi == 0 ? MIN_SECONDS : MIN_SECONDS / 5;
        add_kernel(c, "attention_forward", ops, &r->dry, at_fwd, b, d, secs, reps);
        add_kernel(c, "attention_backward", ops, &r->dry, at_bwd, b, d, secs, reps);
        for (int k = 0; k < 9; k++) ops->free(b[k]);
        if (c->n_kernel != before + 2) continue;
        double rf = c->kernel[before].amount / c->kernel[before].seconds,
               rb = c->kernel[before + 1].amount / c->kernel[before + 1].seconds;
        if (bi == 0) {
            c->attn_fwd_flops_per_s = rf;
            c->attn_bwd_flops_per_s = rb;
        }
    }
    monotone(c, first_attention);
}

/* The residual add over one micro-batch's residual stream, the size the model's elementwise kernels
 * run at (in cache where the model's tensors fit in it): the rate of a memory-bound kernel not in the
 * list */
static void measure_residual(calib_run *r) {
    const gt_ops *ops = r->ops;
    size_t e = r->e;
    int n = r->N * r->C > 4096 ? r->N * r->C : 4096;
    void *b[3] = {buf(ops, (size_t)n * e), buf(ops, (size_t)n * e), buf(ops, (size_t)n * e)};
    int d[1] = {n};
    double t = bench(ops, res_fwd, b, d);
    for (int k = 0; k < 3; k++) ops->free(b[k]);
    r->c->mem_bytes_per_s = 3.0 * n * (double)e / t;
}

/* Each memory-bound kernel at the rows of the micro-batch and of micro-batches of 1, 2, 4 and 8
 * sequences (capped at 16 M elements per tensor on the CPU, 64 M on the GPU), and the step's sum of
 * squares and conversion to working parameters over the slices of 1, 2, 4 and 8 ranks */
static void measure_kernels(calib_run *r) {
    static const struct { const char *op; int width; bench_fn fn; } ks[] = {
        {"embedding_forward", 0, k_emb_fwd}, {"embedding_backward", 0, k_emb_bwd},
        {"rmsnorm_forward", 0, k_norm_fwd},  {"rmsnorm_apply", 0, k_norm_apply},
        {"rmsnorm_backward", 0, k_norm_bwd}, {"rope_forward", 1, k_rope_fwd},
        {"rope_backward", 1, k_rope_bwd},    {"swiglu_forward", 2, k_swiglu_fwd},
        {"swiglu_backward", 2, k_swiglu_bwd}, {"residual_forward", 0, k_residual},
        {"dropout_backward", 0, k_dropout_bwd}, {"crossentropy_forward", 3, k_ce_fwd},
        {"crossentropy_backward", 3, k_ce_bwd}, {"sumsq", 4, k_sumsq},
        {"to_working", 4, k_to_working}};
    gt_calib *c = r->c;
    const gt_ops *ops = r->ops;
    int C = r->C, F = r->F, V = r->V, T = r->T, NH = r->NH, HD = r->HD, N = r->N;
    uint64_t P = gt_model_param_count(r->m);
    size_t cap = r->gpu ? (size_t)64 << 20 : (size_t)16 << 20;
    g_flush = r->gpu ? 0 : 2 * cache_bytes(_SC_LEVEL2_CACHE_SIZE, (size_t)1 << 20); /* the GPU: its tensors */
    int Pc = P > ((uint64_t)64 << 20) ? 64 << 20 : (int)P;
    /* the sizes of each kernel's calls: n rows (elements for the step's), at most cap elements per
     * tensor; one set of buffers for them all, of the largest */
    int rows[sizeof ks / sizeof ks[0]][5], n_rows[sizeof ks / sizeof ks[0]];
    size_t el_max = 1;
    for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
        int widths[5] = {C, NH * HD, F, V, 1};
        int W = widths[ks[k].width];
        int sizes[5] = {N, T, 2 * T, 4 * T, 8 * T};
        if (ks[k].width == 4) {
            int slices[5] = {Pc, Pc / 2, Pc / 4, Pc / 8, Pc};
            memcpy(sizes, slices, sizeof sizes);
        }
        n_rows[k] = 0;
        for (int si = 0; si < 5; si++) {
            int n = sizes[si];
            if ((size_t)n * W > cap) n = (int)(cap / W);
            if (n < 1) n = 1;
            int dup = 0;
            for (int j = 0; j < n_rows[k]; j++) dup |= rows[k][j] == n;
            if (dup) continue;
            rows[k][n_rows[k]++] = n;
            if ((size_t)n * W > el_max) el_max = (size_t)n * W;
        }
    }
    void *b[8];
    for (int j = 0; j < 6; j++) b[j] = buf(ops, el_max * 4);
    b[6] = buf(ops, el_max * 4); /* tokens: at most el_max rows */
    b[7] = buf(ops, (size_t)T * HD * 4);
    for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
        int first = c->n_kernel;
        for (int si = 0; si < n_rows[k]; si++) {
            int n = rows[k][si];
            /* the embedding's table: as many rows as tokens at most (all tokens are id 0; its cost is
             * the rows gathered, not the vocabulary), so it fits the buffers of n x C */
            int Vt = strncmp(ks[k].op, "embedding", 9) == 0 && n < V ? n : V;
            int d[7] = {n, C, F, Vt, T, NH, HD};
            add_kernel(c, ks[k].op, ops, &r->dry, ks[k].fn, b, d, MIN_SECONDS / 5, KERNEL_REPS);
        }
        monotone(c, first);
    }
    for (int j = 0; j < 8; j++) ops->free(b[j]);
    g_flush = 0;
}

/* AdamW over the model's parameters (at most 64 M elements: the rate of a longer vector is the same) */
static void measure_adamw(calib_run *r) {
    const gt_ops *ops = r->ops;
    uint64_t P = gt_model_param_count(r->m);
    int n = P > ((uint64_t)64 << 20) ? 64 << 20 : (int)P;
    void *b[4] = {buf(ops, (size_t)n * 4), buf(ops, (size_t)n * 4), buf(ops, (size_t)n * 4), buf(ops, (size_t)n * 4)};
    int d[1] = {n};
    g_flush = r->gpu ? 0 : 2 * cache_bytes(_SC_LEVEL3_CACHE_SIZE, (size_t)32 << 20); /* the state of a step ago */
    double t = bench(ops, adamw, b, d);
    g_flush = 0;
    for (int k = 0; k < 4; k++) ops->free(b[k]);
    r->c->optim_bytes_per_s = 28.0 * n / t;
}

/* Collectives beside compute (calib.h, overlap_*): the model's gate product (C -> F at the
 * micro-batch's rows) timed alone for about 0.3 s, then run again while all-gathers of 4 MiB a rank
 * (64 MiB on the GPU) go back to back on the path the trainer's overlapped collectives take (its
 * started requests, with the MPI progress thread it starts: dist.progress_us), each started when the
 * one before it is seen complete, tested between the products. The compute's seconds beyond its calls
 * alone, over the bytes moved (ring-model bytes), and the bytes moved over the time they took. The
 * gathers' count is rank 0's (a collective: every rank starts the same ones); each figure is the
 * slowest rank's. */
static void bench_overlap(calib_run *r, gt_comm *comm) {
    const gt_ops *ops = r->ops;
    gt_calib *c = r->c;
    int W = gt_comm_size(comm);
    gemm_case g = {r->N, r->C, r->F};
    void *b[5];
    gemm_buffers(r, &g, b);
    int d[3] = {g.n, g.ic, g.oc};
    size_t count = (r->gpu ? (size_t)16 << 20 : (size_t)1 << 20), *counts = malloc((size_t)W * sizeof *counts);
    void *gb = buf(ops, count * (size_t)W * 4);
    if (!counts) abort();
    for (int i = 0; i < W; i++) counts[i] = count;
    double moved = (double)(W - 1) * (double)count * 4; /* one gather's ring-model bytes: f x the whole */
    mm_fwd(ops, b, d);
    ops->synchronize();
    gt_comm_barrier(comm);
    int calls = 0;
    double t0 = now_s();
    do {
        mm_fwd(ops, b, d);
        ops->synchronize();
        calls++;
    } while (now_s() - t0 < 0.3 || calls < 5);
    double per_call = (now_s() - t0) / calls;
    /* as many gathers as take about 0.4 s alone, at least 3 */
    int n_ag = (int)(0.4 / (c->coll_latency_s + moved / c->coll_bytes_per_s));
    if (n_ag < 3) n_ag = 3;
    if (n_ag > 200) n_ag = 200;
    gt_comm_broadcast(comm, &n_ag, sizeof n_ag, 0);
    gt_comm_barrier(comm);
    int started = 0, during = 0;
    gt_comm_request *req = NULL;
    double start = now_s(), comm_end = start;
    while (started < n_ag || req) {
        if (!req && started < n_ag) {
            req = gt_comm_all_gather_v_start(comm, gb, counts, GT_DTYPE_F32);
            started++;
        }
        mm_fwd(ops, b, d);
        ops->synchronize();
        during++;
        if (gt_comm_test(comm, req)) {
            gt_comm_wait(comm, req); /* complete: frees it */
            req = NULL;
            comm_end = now_s();
        }
    }
    double wall = now_s() - start;
    double v[2] = {(wall - during * per_call) / (n_ag * moved), -(n_ag * moved / (comm_end - start))};
    if (v[0] < 0) v[0] = 0;
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, g_ranks.world); /* the slowest rank's */
    c->overlap_compute_s_per_byte = v[0];
    c->overlap_bytes_per_s = -v[1];
    ops->free(gb);
    free(counts);
    for (int j = 0; j < 5; j++) ops->free(b[j]);
}

/* A gt_comm over `sub` (this rank's part of a split; MPI_COMM_NULL: none) on the backend of the job's */
static gt_comm *sub_comm(MPI_Comm sub, int gpu) {
    if (sub == MPI_COMM_NULL) return NULL;
    char why[256];
    return gpu ? gt_comm_create_nccl(sub, why, sizeof why) : gt_comm_create_mpi(sub);
}

/* One link kind's pair (bench_comm) on the communicators `mine` of this rank (NULL: this rank takes no
 * part; several measure at once, as the nodes' own ranks do in a step), the slowest one's kept: the
 * largest latency, the smallest bandwidth. 0 when no rank measured. Collective over the job. */
static void bench_link(gt_comm *mine, const gt_ops *ops, int gpu, MPI_Comm world, double *latency_s,
                       double *bytes_per_s) {
    double v[2] = {0, -1e300}; /* latency, -bandwidth */
    if (mine && gt_comm_size(mine) > 1) {
        double lat, bw;
        bench_comm(mine, ops, gpu, &lat, &bw);
        v[0] = lat, v[1] = -bw;
        if (gt_comm_rank(mine) != 0) v[0] = 0, v[1] = -1e300; /* its rank 0's */
    }
    /* waited for asleep: a rank that takes no part must not spin on a core the measuring ranks need
     * (Open MPI's blocking collectives poll; on the 2-node test cluster the idle ranks' polling halved
     * the between-nodes bandwidth measured) */
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, world, &req);
    for (int done = 0; MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done;) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    *latency_s = v[1] > -1e300 ? v[0] : 0;
    *bytes_per_s = v[1] > -1e300 ? -v[1] : 0;
}

/* The collectives between the job's ranks, per link kind: among each node's ranks (all nodes with two
 * or more at once), then between nodes (the first rank of each); then beside compute over the whole
 * job (bench_overlap). GTRAIN_TEST_RANK_IS_NODE makes every rank a node. On one rank the defaults
 * stay. */
static void measure_collectives(calib_run *r, gt_comm *comm) {
    gt_calib *c = r->c;
    if (comm && gt_comm_size(comm) > 1) {
        MPI_Comm world = g_ranks.world, node = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
        int rank = 0;
        MPI_Comm_rank(world, &rank);
        if (gt_test_hooks_get()->rank_is_node) MPI_Comm_split(world, rank, 0, &node);
        else gt_node_comm(world, &node);
        int local = 0, sizes[2];
        MPI_Comm_rank(node, &local);
        MPI_Comm_size(node, &sizes[0]);
        sizes[1] = local == 0; /* nodes */
        MPI_Allreduce(MPI_IN_PLACE, &sizes[0], 1, MPI_INT, MPI_MAX, world);
        MPI_Allreduce(MPI_IN_PLACE, &sizes[1], 1, MPI_INT, MPI_SUM, world);
        MPI_Comm_split(world, local == 0 ? 0 : MPI_UNDEFINED, rank, &leaders);
        gt_comm *on_node = sizes[0] > 1 ? sub_comm(node, r->gpu) : NULL;
        gt_comm *between = sizes[1] > 1 ? sub_comm(leaders, r->gpu) : NULL;
        bench_link(on_node, r->ops, r->gpu, world, &c->node_latency_s, &c->node_bytes_per_s);
        bench_link(between, r->ops, r->gpu, world, &c->net_latency_s, &c->net_bytes_per_s);
        if (on_node) gt_comm_destroy(on_node);
        if (between) gt_comm_destroy(between);
        MPI_Comm_free(&node);
        if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
        int net = sizes[1] > 1;
        gt_calib_price_widest(c);
        c->overlap_between_nodes = net;
        /* the collectives beside compute take the path the trainer's do (train.c): on MPI, with the
         * progress thread of dist.progress_us, started only now (it stays until the end: the
         * collectives alone above were measured without it) */
        char why[256];
        if (!r->gpu && r->cfg->dist.progress_us > 0 &&
            !gt_comm_progress_start(comm, r->cfg->dist.progress_us, why, sizeof why) && r->log)
            fprintf(r->log, "  (no progress thread: %s; the collectives beside compute advance between products only)\n", why);
        bench_overlap(r, comm);
        if (r->log) {
            if (sizes[0] > 1)
                fprintf(r->log, "  collectives within a node (up to %d ranks, %s): latency %.1f us, bandwidth %.2f GB/s\n",
                        sizes[0], gt_comm_name(comm), c->node_latency_s * 1e6, c->node_bytes_per_s / 1e9);
            if (net)
                fprintf(r->log, "  collectives between nodes (%d nodes, one rank each, %s): latency %.1f us, bandwidth "
                                "%.2f GB/s\n",
                        sizes[1], gt_comm_name(comm), c->net_latency_s * 1e6, c->net_bytes_per_s / 1e9);
            fprintf(r->log, "  collectives over %d ranks (%s): latency %.1f us, bandwidth %.2f GB/s; beside compute "
                            "%.2f GB/s, the compute losing %.2f ms per MB moved\n",
                    gt_comm_size(comm), gt_comm_name(comm), c->coll_latency_s * 1e6, c->coll_bytes_per_s / 1e9,
                    c->overlap_bytes_per_s / 1e9, c->overlap_compute_s_per_byte * 1e9);
        }
        return;
    }
    gt_calib d = *c;
    gt_calib_defaults(&d, r->gpu, r->ops->act_bytes == 2);
    c->coll_latency_s = d.coll_latency_s;
    c->coll_bytes_per_s = d.coll_bytes_per_s;
    c->node_latency_s = c->node_bytes_per_s = c->net_latency_s = c->net_bytes_per_s = 0; /* not measured */
    c->overlap_bytes_per_s = 0, c->overlap_compute_s_per_byte = 0, c->overlap_between_nodes = 0;
    if (r->log) fprintf(r->log, "  collectives: one rank, not measured (the defaults stay: run under mpirun to measure)\n");
}

/* The rounds (docs/planner.md, "Calibration"): the whole list of measurements runs up to
 * MAX_ROUNDS times, one after the other, and each figure kept is its fastest round's. A burst of load
 * from another process, a clock that has not ramped up, a BLAS that has not yet run a large shape, or
 * a virtual machine's host giving its second core elsewhere for seconds at a time (seen here: the
 * same two-thread list 1.4-1.6x slower in whole rounds, in one calibration of two) only ever slows a
 * measurement: the fastest round is the one least disturbed, and a median keeps the slow figures as
 * soon as half the rounds were slowed. A round after the first runs only while the rounds so far
 * leave ROUNDS_SECONDS for one more (a large model's round can take most of a minute on the CPU). */
#define MAX_ROUNDS 5
#define BUSY_ROUND_SPREAD 1.25 /* the median largest / smallest round above which --calibrate warns */
#define ROUNDS_SECONDS 60.0

/* The fastest of v[0..n-1]: the largest of rates (faster = 1), the smallest of seconds (faster = 0) */
static double fastest_of(const double *v, int n, int rate) {
    double f = v[0];
    for (int i = 1; i < n; i++)
        if (rate ? v[i] > f : v[i] < f) f = v[i];
    return f;
}
/* The largest / smallest of v[0..n-1] (1 when one) */
static double spread_of(const double *v, int n) {
    double lo = v[0], hi = v[0];
    for (int i = 1; i < n; i++) {
        if (v[i] < lo) lo = v[i];
        if (v[i] > hi) hi = v[i];
    }
    return lo > 0 ? hi / lo : 1;
}

/* Into out (a copy of round[0]), each figure's fastest over the n rounds, which measured the same list
 * in the same order (an entry one round lacks, or that lies elsewhere in it, keeps round 0's figure);
 * *spread gets the median over the figures of their largest / smallest round */
static void combine_rounds(gt_calib *out, gt_calib *const *round, int n, double *spread) {
    static double spreads[2 * GT_CALIB_MAX_GEMMS + GT_CALIB_MAX_KERNELS + 8];
    int ns = 0;
    double v[MAX_ROUNDS];
#define COMBINE(field, rate, same)                                                                             \
    do {                                                                                                       \
        int k = 0;                                                                                             \
        for (int q = 0; q < n; q++)                                                                            \
            if (same) v[k++] = round[q]->field;                                                                \
        if (k == n && v[0] > 0) {                                                                              \
            out->field = fastest_of(v, k, rate);                                                               \
            spreads[ns++] = spread_of(v, k);                                                                   \
        }                                                                                                      \
    } while (0)
    *out = *round[0];
    for (int i = 0; i < out->n_gemm; i++) {
#define SAME_GEMM (i < round[q]->n_gemm && round[q]->gemm[i].n == out->gemm[i].n && \
                   round[q]->gemm[i].ic == out->gemm[i].ic && round[q]->gemm[i].oc == out->gemm[i].oc)
        COMBINE(gemm[i].fwd_flops_per_s, 1, SAME_GEMM);
        COMBINE(gemm[i].bwd_flops_per_s, 1, SAME_GEMM);
#undef SAME_GEMM
    }
    for (int i = 0; i < out->n_kernel; i++) {
        COMBINE(kernel[i].seconds, 0, i < round[q]->n_kernel && strcmp(round[q]->kernel[i].op, out->kernel[i].op) == 0 &&
                                       round[q]->kernel[i].amount == out->kernel[i].amount);
    }
    COMBINE(attn_fwd_flops_per_s, 1, 1);
    COMBINE(attn_bwd_flops_per_s, 1, 1);
    COMBINE(mem_bytes_per_s, 1, 1);
    COMBINE(optim_bytes_per_s, 1, 1);
#undef COMBINE
    double fwd[GT_CALIB_MAX_GEMMS];
    for (int i = 0; i < out->n_gemm; i++) fwd[i] = out->gemm[i].fwd_flops_per_s;
    if (out->n_gemm) out->matmul_flops_per_s = median(fwd, out->n_gemm);
    monotone(out, 0); /* each op's larger calls not faster than its smaller ones, over the figures kept */
    *spread = ns ? median(spreads, ns) : 1;
}

/* One line per measurement, from the figures kept */
static void print_calib(const calib_run *r, const gt_calib *c, FILE *log) {
    for (int i = 0; i < c->n_gemm; i++)
        fprintf(log, "  matmul n %d x %d -> %d: forward %.2f, backward %.2f GFLOP/s\n", c->gemm[i].n, c->gemm[i].ic,
                c->gemm[i].oc, c->gemm[i].fwd_flops_per_s / 1e9, c->gemm[i].bwd_flops_per_s / 1e9);
    double per_seq = 4.0 * r->NH * r->HD * ((double)r->T * (r->T + 1) / 2); /* attention's forward FLOPs a sequence */
    for (int i = 0; i < c->n_kernel; i++) {
        if (strcmp(c->kernel[i].op, "attention_forward") != 0 || i + 1 >= c->n_kernel ||
            strcmp(c->kernel[i + 1].op, "attention_backward") != 0)
            continue;
        fprintf(log, "  attention B %.0f T %d heads %d/%d HD %d: forward %.2f, backward %.2f GFLOP/s\n",
                c->kernel[i].amount / per_seq, r->T, r->NH, r->NKV, r->HD,
                c->kernel[i].amount / c->kernel[i].seconds / 1e9, c->kernel[i + 1].amount / c->kernel[i + 1].seconds / 1e9);
    }
    fprintf(log, "  memory-bound (residual add): %.2f GB/s\n", c->mem_bytes_per_s / 1e9);
    for (int i = 0; i < c->n_kernel; i++) {
        if (strncmp(c->kernel[i].op, "attention", 9) == 0) continue;
        if (i == 0 || strcmp(c->kernel[i - 1].op, c->kernel[i].op) != 0) fprintf(log, "  %s:", c->kernel[i].op);
        else fprintf(log, ";");
        fprintf(log, " %.0f KiB %.1f us", c->kernel[i].amount / 1024, c->kernel[i].seconds * 1e6);
        if (i + 1 == c->n_kernel || strcmp(c->kernel[i + 1].op, c->kernel[i].op) != 0) fprintf(log, "\n");
    }
    fprintf(log, "  AdamW: %.2f GB/s\n", c->optim_bytes_per_s / 1e9);
}

/* The in-step factor (calib.h): a micro-batch of the config's model, forward and backward without
 * recompute, run whole on the backend in each round (the median of at least 3 calls, 0.15 s), and the
 * fastest round's against the sum of its kernels' seconds from the figures kept (each its fastest
 * round's too; in_step_priced, at factor 1). At each micro-batch size the time model prices: the
 * config's and 1, 2, 4 and 8 sequences (the GEMMs' rows above), since the factor grows with the size.
 * Its blocks: every one of the model's, or as many as keep the largest size within the cap below
 * (gt_calibrate_in_step_blocks) and a round's runs within IN_STEP_ROUND_SECONDS (in_step_create), at
 * least 2. A deeper model's weights and stash lie further from the cores: on an Intel Xeon the factor
 * of a 4-block model of dim 128 came out 1-3% above that of its first 2 blocks, 3-4% for 6 blocks of
 * dim 256 against 2. A size whose model would take more than 2 GiB on the CPU, 8 GiB on the GPU, is
 * not run; with none run the factor stays 1 and a line says so. */
#define IN_STEP_SIZES 5
typedef struct in_step_run {
    gt_model_config mc;
    gt_plan plan;
    gt_mem mem;
    gt_model *model;
    int32_t *tok;
    int n_sizes;                 /* the sizes that fit, ascending */
    int B[IN_STEP_SIZES];
    double whole[IN_STEP_SIZES][MAX_ROUNDS];
    int n_whole[IN_STEP_SIZES];
    double smallest_bytes;       /* what the smallest size would take, for the line when none fits */
    int created;                 /* the model made (or tried), at the first round */
    int memory_blocks;           /* the blocks the cap allows; mc.n_layers: those the time allows too */
} in_step_run;
static double g_dry_seconds;
static const gt_calib *g_dry_calib;
static void sum_seconds(void *ctx, const gt_op_cost *cost) {
    (void)ctx;
    g_dry_seconds += gt_time_op_seconds_at(g_dry_calib, cost, 1);
}
/* n blocks, each a segment of its own kept whole (no recompute) */
static void whole_plan(gt_plan *plan, int n) {
    memset(plan, 0, sizeof *plan);
    plan->n_blocks = n;
    for (int i = 0; i < n; i++) plan->seg_start[i] = 1;
}
/* What a micro-batch of B sequences of mc (whole_plan) costs by c's figures at in-step factor 1: the
 * time model's sum of its kernels one by one. */
static double in_step_priced(const calib_run *r, const gt_calib *c, const gt_model_config *mc, int B) {
    gt_plan plan;
    whole_plan(&plan, mc->n_layers);
    gt_model *dry = gt_model_create_dry(mc, r->ops->act_bytes, r->ops->can_keep_attention_probs);
    if (!dry) return 0;
    g_dry_calib = c;
    g_dry_seconds = 0;
    gt_ops_dry_set_cost(sum_seconds, NULL);
    gt_model_dry_train_micro(dry, &plan, B, r->T);
    gt_ops_dry_set_cost(NULL, NULL);
    gt_model_destroy(dry);
    return g_dry_seconds;
}
/* what the model of mc's blocks would take at B sequences of T tokens, e bytes an activation: its
 * weights, gradients and a rough stash; and the most it may take */
static double in_step_bytes(const gt_model_config *mc, size_t e, int T, int B) {
    return (double)gt_model_param_count(mc) * (e + 4) + 24.0 * B * T * ((double)mc->dim + mc->ffn_dim) * e;
}
static double in_step_cap(int gpu) { return (gpu ? 8.0 : 2.0) * (1u << 30); }
int gt_calibrate_in_step_blocks(const gt_model_config *m, size_t act_bytes, int seq_len, int micro_batch, int gpu) {
    gt_model_config mc = *m;
    int Bmax = micro_batch > 8 ? micro_batch : 8;
    while (mc.n_layers > 2 && in_step_bytes(&mc, act_bytes, seq_len, Bmax) > in_step_cap(gpu)) mc.n_layers--;
    return mc.n_layers;
}
static void in_step_begin(calib_run *r, in_step_run *w) {
    memset(w, 0, sizeof *w);
    w->mc = *r->m;
    w->mc.n_layers = w->memory_blocks = gt_calibrate_in_step_blocks(r->m, r->e, r->T, r->B, r->gpu);
    int want[IN_STEP_SIZES] = {r->B, 1, 2, 4, 8};
    w->smallest_bytes = in_step_bytes(&w->mc, r->e, r->T, 1);
    for (int i = 0; i < IN_STEP_SIZES; i++) {
        int B = want[i], k = w->n_sizes, dup = 0;
        for (int j = 0; j < w->n_sizes; j++) dup |= w->B[j] == B;
        if (dup || in_step_bytes(&w->mc, r->e, r->T, B) > in_step_cap(r->gpu)) continue;
        for (; k > 0 && w->B[k - 1] > B; k--) w->B[k] = w->B[k - 1];
        w->B[k] = B;
        w->n_sizes++;
    }
}
/* At the first round, its other figures measured: fewer blocks than the cap allows where the runs of a
 * round (at least 3 calls of each size) would take more than IN_STEP_ROUND_SECONDS by those figures
 * (the kernels' seconds grow by the block: priced at 1 and 2 blocks), at least 2; then the model. Every
 * rank alike (the fewest blocks of any). */
#define IN_STEP_ROUND_SECONDS 3.0
static void in_step_create(calib_run *r, in_step_run *w) {
    w->created = 1;
    if (!w->n_sizes) return;
    if (w->memory_blocks > 2) {
        gt_model_config one = w->mc, two = w->mc;
        one.n_layers = 1, two.n_layers = 2;
        double fixed = 0, per_block = 0;
        for (int i = 0; i < w->n_sizes; i++) {
            double p1 = in_step_priced(r, r->c, &one, w->B[i]), p2 = in_step_priced(r, r->c, &two, w->B[i]);
            per_block += 3 * (p2 - p1);
            fixed += 3 * (2 * p1 - p2);
        }
        int k = w->memory_blocks;
        while (k > 2 && fixed + k * per_block > IN_STEP_ROUND_SECONDS) k--;
        if (g_ranks.size > 1) MPI_Allreduce(MPI_IN_PLACE, &k, 1, MPI_INT, MPI_MIN, g_ranks.world);
        w->mc.n_layers = k;
    }
    int Bmax = w->B[w->n_sizes - 1];
    uint64_t P = gt_model_param_count(&w->mc);
    whole_plan(&w->plan, w->mc.n_layers);
    gt_mem_init(&w->mem, r->ops);
    w->model = gt_model_create(r->ops, &w->mem, &w->mc);
    float *host = malloc((size_t)P * sizeof *host);
    w->tok = malloc((size_t)Bmax * r->T * 2 * sizeof *w->tok);
    if (w->model && host && w->tok) {
        gt_layout_init_params(gt_model_layout(w->model), host, 1);
        gt_model_set_params(w->model, host);
        for (int i = 0; i < 2 * Bmax * r->T; i++) w->tok[i] = (int32_t)((i * 7919u) % (unsigned)w->mc.vocab_size);
    } else if (w->model) {
        gt_model_destroy(w->model);
        w->model = NULL;
    }
    free(host);
}
/* One round's figures: a micro-batch of each size run whole (every rank at once, the slowest's) */
static void in_step_round(calib_run *r, in_step_run *w) {
    if (!w->created) in_step_create(r, w);
    for (int i = 0; i < w->n_sizes; i++) { /* every rank alike: the sizes depend on the config alone */
        int B = w->B[i], N = B * r->T;
        double t = 0;
        int recomputed = 0;
        float dloss = 1.0f / (float)N;
        if (w->model) {
            gt_model_train_micro(w->model, &w->plan, w->tok, w->tok + N, B, r->T, dloss, no_key, &recomputed);
            r->ops->synchronize(); /* a warm-up call */
        }
        together_begin();
        if (w->model) {
            double times[MAX_REPS], t0 = now_s();
            int reps = 0;
            do {
                double s = now_s();
                gt_model_train_micro(w->model, &w->plan, w->tok, w->tok + N, B, r->T, dloss, no_key, &recomputed);
                r->ops->synchronize();
                if (g_test_slow_s > 0) nanosleep(&(struct timespec){0, (long)(g_test_slow_s * 1e9)}, NULL);
                times[reps++] = now_s() - s;
            } while ((now_s() - t0 < MIN_SECONDS * 1.5 || reps < 3) && reps < MAX_REPS);
            t = median(times, reps);
        }
        t = together_end(t);
        if (t > 0) w->whole[i][w->n_whole[i]++] = t;
    }
}
/* The factors into c (its figures combined), a log line per size; frees the model. c->in_step_factor:
 * the config's size's. */
static void in_step_end(calib_run *r, in_step_run *w, FILE *log) {
    gt_calib *c = r->c;
    c->in_step_factor = 1;
    c->n_in_step = 0;
    if (w->model) gt_model_destroy(w->model);
    free(w->tok);
    if (!w->n_sizes) {
        if (log) fprintf(log, "  in-step factor: not measured (a micro-batch of %d block%s would take %.1f GiB): 1\n",
                         w->mc.n_layers, w->mc.n_layers == 1 ? "" : "s", w->smallest_bytes / (1u << 30));
        return;
    }
    double config_factor = 1;
    for (int i = 0; i < w->n_sizes; i++) {
        int B = w->B[i];
        double predicted = in_step_priced(r, c, &w->mc, B), t = w->n_whole[i] ? fastest_of(w->whole[i], w->n_whole[i], 0) : 0, f = 1;
        if (t > 0 && predicted > 0 && c->n_in_step < GT_CALIB_MAX_IN_STEP) {
            f = t / predicted;
            c->in_step[c->n_in_step++] = (gt_calib_in_step){r->C, r->F, r->NH, r->V, r->T, f, B};
            if (B == r->B) config_factor = f;
        }
        if (log)
            fprintf(log, "  in-step factor: a micro-batch (%d x %d tokens, %d block%s) run whole %.2f ms, its kernels one "
                         "by one %.2f ms: %.3f\n", B, r->T, w->mc.n_layers, w->mc.n_layers == 1 ? "" : "s", t * 1e3,
                    predicted * 1e3, f);
    }
    c->in_step_factor = config_factor;
}

void gt_calib_note_in_step(gt_calib *c, const gt_config *cfg, char *note, size_t note_len) {
    const gt_model_config *m = &cfg->model;
    char words[160];
    gt_calib_select_in_step(c, m->dim, m->ffn_dim, m->n_heads, m->vocab_size, cfg->train.seq_len, cfg->train.micro_batch,
                            words, sizeof words);
    size_t n = strlen(note);
    if (c->measured && n + 2 < note_len) snprintf(note + n, note_len - n, "; %s", words);
}

/* One round: every compute measurement once, into c */
static void measure_round(calib_run *r) {
    measure_gemms(r);
    gt_ops_dry_init(&r->dry, r->ops->act_bytes, 0); /* counts what each kernel measured below does */
    gt_ops_dry_set_cost(keep_amount, NULL);
    r->c->n_kernel = 0;
    measure_attention(r);
    measure_residual(r);
    measure_kernels(r);
    gt_ops_dry_set_cost(NULL, NULL);
    measure_adamw(r);
}

int gt_calibrate(const gt_config *cfg, const gt_ops *ops, int gpu, gt_comm *comm, MPI_Comm world, gt_calib *c,
                 FILE *log) {
    const gt_model_config *m = &cfg->model;
    calib_run r = {.cfg = cfg, .m = m, .ops = ops, .gpu = gpu, .c = c, .log = log};
    r.B = cfg->train.micro_batch > 0 ? cfg->train.micro_batch : 1; /* auto: the rows of 1, 2, 4, 8 */
    r.T = cfg->train.seq_len;
    r.C = m->dim, r.F = m->ffn_dim, r.V = m->vocab_size, r.NH = m->n_heads, r.NKV = m->n_kv_heads;
    r.HD = r.C / r.NH;
    r.N = r.B * r.T;
    r.e = (size_t)ops->act_bytes;
    g_ranks.world = world;
    g_ranks.size = 1;
    if (world != MPI_COMM_NULL) MPI_Comm_size(world, &g_ranks.size);
    g_ranks.min_ranks = INT_MAX;
    g_ranks.n_spread = 0;
    double t_start = now_s();
    gt_calib *round[MAX_ROUNDS] = {0};
    in_step_run whole;
    in_step_begin(&r, &whole);
    int n_rounds = 0;
    while (n_rounds < MAX_ROUNDS) {
        round[n_rounds] = malloc(sizeof *c);
        if (!round[n_rounds]) break;
        *round[n_rounds] = *c;
        r.c = round[n_rounds];
        const gt_test_hooks *hooks = gt_test_hooks_get();
        g_test_slow_s = hooks->calib_slow_round.rounds >> n_rounds & 1u ? hooks->calib_slow_round.ms / 1e3 : 0;
        measure_round(&r);
        in_step_round(&r, &whole);
        g_test_slow_s = 0;
        n_rounds++;
        /* another round while one more fits in ROUNDS_SECONDS (every rank decides alike: the slowest's time) */
        double spent = now_s() - t_start;
        if (g_ranks.size > 1) MPI_Allreduce(MPI_IN_PLACE, &spent, 1, MPI_DOUBLE, MPI_MAX, g_ranks.world);
        if (spent / n_rounds * (n_rounds + 1) > ROUNDS_SECONDS) break;
        if (hooks->calib_rounds > 0 && n_rounds >= hooks->calib_rounds) break;
    }
    double round_spread = 1;
    if (n_rounds > 0) combine_rounds(c, round, n_rounds, &round_spread);
    for (int q = 0; q < n_rounds; q++) free(round[q]);
    r.c = c;
    if (log) print_calib(&r, c, log);
    in_step_end(&r, &whole, log);
    c->ranks_measured = g_ranks.min_ranks == INT_MAX ? 1 : g_ranks.min_ranks; /* none compared: this rank's */
    c->rank_spread = g_ranks.n_spread ? median(g_ranks.spread, g_ranks.n_spread) : 1;
    if (log) {
        fprintf(log, "  each figure the fastest of %d round%s of the list (largest / smallest round: median %.3f)\n",
                n_rounds, n_rounds == 1 ? "" : "s", round_spread);
        /* a figure's rounds differ by more than a quiet machine's few per cent: others' load came and
         * went while it measured (1.3-1.8 on this machine's busy hours, 1.07-1.2 on its quiet ones) */
        if (round_spread > BUSY_ROUND_SPREAD)
            fprintf(log, "  warning: the rounds differed by %.2fx: the machine was busy while it measured. Each figure "
                         "is its fastest round's, so a run in a busier moment will be slower than predicted; "
                         "calibrate again when it is quiet\n",
                    round_spread);
    }
    if (log && g_ranks.size > 1)
        fprintf(log, "  compute measured on %d ranks at once, each figure the slowest rank's (slowest / fastest: "
                     "median %.3f)\n", c->ranks_measured, c->rank_spread);
    measure_collectives(&r, comm);
    if (log) fprintf(log, "  (%.1f s)\n", now_s() - t_start);
    free(g_scratch);
    g_scratch = NULL;
    g_scratch_len = 0;
    g_ranks.world = MPI_COMM_NULL;
    g_ranks.size = 1;
    c->measured = 1;
    return 0;
}
