/*
 * zero.c — ZeRO-2/3 unit gathers and per-unit gradient reductions, and the gradient buckets of
 * grad_sync = step (see zero.h).
 *
 * Everything here is collective in the executor's order: every rank runs the same plan over the
 * same units, so the all_gather_v / reduce_scatter_v calls line up across ranks.
 */
#include "zero.h"

#include "testhooks.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void finish_gather(gt_zero *z, int u);
static gt_dtype working_dtype(const gt_zero *z);

/* What a real and a dry zero share: the settings and the units' ranges of the flat vector. */
static void setup(gt_zero *z, const gt_layout *layout, int stage, int grad_micro, int depth, int act_bytes) {
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->grad_micro = grad_micro;
    z->depth = depth;
    z->pending = -1;
    z->eb = (size_t)act_bytes;
    z->n_units = gt_model_n_units(&layout->cfg);
    z->units = calloc((size_t)z->n_units, sizeof *z->units);
    z->sched = malloc((2 * (size_t)z->n_units + 1) * sizeof *z->sched);
    if (!z->units || !z->sched) abort();
    for (int u = 0; u < z->n_units; u++) gt_layout_unit(layout, u, &z->units[u].offset, &z->units[u].numel);
}

void gt_zero_init(gt_zero *z, const gt_ops *ops, gt_mem *mem, gt_comm *comm, const gt_layout *layout, int stage,
                  int grad_micro, int depth) {
    setup(z, layout, stage, grad_micro, depth, ops->act_bytes);
    z->ops = ops;
    z->mem = mem;
    z->comm = comm;
    int W = gt_comm_size(comm), rank = gt_comm_rank(comm);
    gt_shard_init(&z->shard, layout->n_params, W, rank);
    for (int u = 0; u < z->n_units; u++) {
        gt_zero_unit *U = &z->units[u];
        U->counts = calloc((size_t)W, sizeof *U->counts);
        if (!U->counts) abort();
        for (int r = 0; r < W; r++) {
            gt_shard sr;
            gt_shard_init(&sr, layout->n_params, W, r);
            size_t start, count;
            gt_shard_intersect(&sr, U->offset, U->numel, &start, &count);
            U->counts[r] = count;
            if (r == rank) {
                U->own_count = count;
                U->own_start = start;
                U->own_in_slice = count ? U->offset + start - sr.begin : 0;
            }
        }
    }
    if (stage == 3) {
        z->param_shard = gt_mem_alloc(mem, GT_MEM_PARAMS, z->shard.slice_len * z->eb);
        ops->zero(z->param_shard, z->shard.slice_len * z->eb);
    }
    if (grad_micro) {
        z->grad_slice = gt_mem_alloc(mem, GT_MEM_GRADS, z->shard.slice_len * sizeof(float));
        ops->zero(z->grad_slice, z->shard.slice_len * sizeof(float));
    }
}

int gt_zero_bucket_cut(const size_t *numel, int n_units, size_t bucket_bytes, int *u_lo) {
    int n = 0;
    for (int hi = n_units; hi > 0;) { /* from the head down: the order backward finishes them */
        int lo = hi - 1;
        size_t bytes = numel[lo] * sizeof(float);
        while (lo > 0 && bytes < bucket_bytes) bytes += numel[--lo] * sizeof(float);
        u_lo[n++] = lo;
        hi = lo;
    }
    return n;
}

uint64_t gt_zero_bucket_staging_peak(const size_t *numel, int n_units, size_t n_padded, int world, int rank,
                                     size_t bucket_bytes) {
    if (world < 2 || n_units < 1) return 0;
    int *lo = malloc((size_t)n_units * sizeof *lo);
    size_t *off = malloc(((size_t)n_units + 1) * sizeof *off);
    if (!lo || !off) abort();
    int n = gt_zero_bucket_cut(numel, n_units, bucket_bytes, lo);
    off[0] = 0; /* the units back to back */
    for (int u = 0; u < n_units; u++) off[u + 1] = off[u] + numel[u];
    size_t L = n_padded / (size_t)world;
    uint64_t most = 0;
    for (int r = rank >= 0 ? rank : 0; r < (rank >= 0 ? rank + 1 : world); r++) {
        size_t s0 = (size_t)r * L, s1 = s0 + L;
        uint64_t window[GT_ZERO_BUCKETS_IN_FLIGHT] = {0}, held = 0;
        for (int i = 0; i < n; i++) { /* started in this order; the top bucket also covers the padding */
            size_t a0 = off[lo[i]], a1 = i == 0 ? n_padded : off[lo[i - 1]];
            size_t a = a0 > s0 ? a0 : s0, e = a1 < s1 ? a1 : s1;
            uint64_t bytes = (uint64_t)world * (e > a ? e - a : 0) * sizeof(float);
            held = held - window[i % GT_ZERO_BUCKETS_IN_FLIGHT] + bytes; /* the oldest waited for first */
            window[i % GT_ZERO_BUCKETS_IN_FLIGHT] = bytes;
            if (held > most) most = held;
        }
    }
    free(lo);
    free(off);
    return most;
}

void gt_zero_set_buckets(gt_zero *z, float *grads, size_t n_padded, size_t bucket_bytes) {
    int W = gt_comm_size(z->comm), rank = gt_comm_rank(z->comm);
    size_t L = n_padded / (size_t)W;
    z->flat_grads = grads;
    z->n_padded = n_padded;
    z->buckets = calloc((size_t)z->n_units, sizeof *z->buckets);
    z->unit_bucket = calloc((size_t)z->n_units, sizeof *z->unit_bucket);
    z->bucket_order = calloc((size_t)z->n_units, sizeof *z->bucket_order);
    size_t *numel = malloc((size_t)z->n_units * sizeof *numel);
    int *cut = malloc((size_t)z->n_units * sizeof *cut);
    if (!z->buckets || !z->unit_bucket || !z->bucket_order || !numel || !cut) abort();
    for (int u = 0; u < z->n_units; u++) numel[u] = z->units[u].numel;
    int n_cut = gt_zero_bucket_cut(numel, z->n_units, bucket_bytes, cut);
    z->n_buckets = 0;
    for (int hi = z->n_units; z->n_buckets < n_cut;) {
        int lo = cut[z->n_buckets];
        gt_zero_bucket *b = &z->buckets[z->n_buckets];
        b->u_lo = lo;
        b->u_hi = hi;
        b->b0 = z->units[lo].offset;
        b->b1 = hi == z->n_units ? n_padded : z->units[hi - 1].offset + z->units[hi - 1].numel;
        b->counts = calloc((size_t)W, sizeof *b->counts);
        if (!b->counts) abort();
        for (int r = 0; r < W; r++) {
            size_t s0 = (size_t)r * L, s1 = s0 + L;
            size_t a = b->b0 > s0 ? b->b0 : s0, e = b->b1 < s1 ? b->b1 : s1;
            b->counts[r] = e > a ? e - a : 0;
            if (r < rank) b->own_start += b->counts[r];
        }
        for (int u = lo; u < hi; u++) z->unit_bucket[u] = z->n_buckets;
        z->n_buckets++;
        hi = lo;
    }
    free(numel);
    free(cut);
}

/* The oldest bucket in flight: waited for (its staging freed), in the order started. */
static void wait_oldest_bucket(gt_zero *z) {
    gt_zero_bucket *b = &z->buckets[z->bucket_order[z->n_waited++]];
    gt_comm_wait(z->comm, b->req);
    b->req = NULL;
}

/* At most GT_ZERO_BUCKETS_IN_FLIGHT buckets in flight: the oldest is waited for before another starts. */
static void start_bucket(gt_zero *z, gt_zero_bucket *b) {
    while (z->n_started - z->n_waited >= GT_ZERO_BUCKETS_IN_FLIGHT) wait_oldest_bucket(z);
    z->bucket_order[z->n_started++] = (int)(b - z->buckets);
    b->started = 1;
    z->bucket_starts++;
    if (!z->block0_done) z->bucket_early++;
    float *send = z->flat_grads + b->b0;
    b->req = gt_comm_reduce_scatter_v_sum_start(z->comm, send, send + b->own_start, b->counts, GT_DTYPE_F32);
}

void gt_zero_buckets_arm(gt_zero *z) {
    for (int i = 0; i < z->n_buckets; i++) {
        gt_zero_bucket *b = &z->buckets[i];
        b->left = b->u_hi - b->u_lo;
        b->started = 0;
        b->req = NULL;
    }
    for (int u = 0; u < z->n_units; u++) z->units[u].grad_refs = 0;
    z->block0_done = 0;
    z->n_started = z->n_waited = 0;
    z->armed = z->n_buckets > 0;
}

void gt_zero_buckets_finish(gt_zero *z) {
    if (!z->armed) return;
    for (int i = 0; i < z->n_buckets; i++) /* the embedding's bucket (the last), or any not complete */
        if (!z->buckets[i].started) start_bucket(z, &z->buckets[i]);
    while (z->n_waited < z->n_started) wait_oldest_bucket(z); /* in the order started, on every rank */
    z->armed = 0;
}

/* Buckets: the flat buffer's view of the unit; while armed, its final release counts down its bucket,
 * which starts when none is left (but the embedding's bucket: gt_zero_buckets_finish). */
static float *bucket_grads(void *ctx, int u) {
    gt_zero *z = ctx;
    if (z->armed) z->units[u].grad_refs++;
    return z->flat_grads + z->units[u].offset;
}

static void bucket_grads_done(void *ctx, int u) {
    gt_zero *z = ctx;
    if (!z->armed || --z->units[u].grad_refs > 0) return;
    if (u == 1) z->block0_done = 1; /* block 0's backward has ended: its bucket's start is not early */
    gt_zero_bucket *b = &z->buckets[z->unit_bucket[u]];
    if (--b->left == 0 && b->u_lo > 0) start_bucket(z, b);
}

void gt_zero_set_param_gathers(gt_zero *z, void *params) { z->flat_params = params; }

static void params_gather_start(gt_zero *z, int u) {
    gt_zero_unit *U = &z->units[u];
    U->gather_req = gt_comm_all_gather_v_start(z->comm, z->flat_params + U->offset * z->eb, U->counts,
                                               working_dtype(z));
    if (++z->params_live > z->params_live_max) z->params_live_max = z->params_live;
}

/* Unit u's gather waited for (the ones before it started first, in order on every rank), then the
 * next ones started, up to GT_ZERO_PARAM_GATHERS_IN_FLIGHT in flight. */
static void params_gather_wait(gt_zero *z, int u) {
    if (!z->params_in_flight) return;
    while (z->params_next <= u) params_gather_start(z, z->params_next++);
    if (z->units[u].gather_req) {
        finish_gather(z, u);
        z->params_live--;
    }
    while (z->params_next < z->n_units && z->params_live < GT_ZERO_PARAM_GATHERS_IN_FLIGHT)
        params_gather_start(z, z->params_next++);
}

void gt_zero_params_start(void *ctx) {
    gt_zero *z = ctx;
    gt_zero_params_finish(z); /* a step skipped its forward (never in train.c): the old ones first */
    z->params_in_flight = 1;
    z->params_next = 0; /* forward order: the embedding first */
    while (z->params_next < z->n_units && z->params_live < GT_ZERO_PARAM_GATHERS_IN_FLIGHT)
        params_gather_start(z, z->params_next++);
}

void gt_zero_params_finish(void *ctx) {
    gt_zero *z = ctx;
    if (!z->params_in_flight) return;
    for (int u = 0; u < z->n_units; u++) params_gather_wait(z, u); /* in the order started */
    z->params_in_flight = 0;
}

void gt_zero_params_reset_max(gt_zero *z) { z->params_live_max = z->params_live; }

/* ZeRO-1/2 parameter gathers: the flat buffer's view of the unit, once its gather has arrived. */
static void *flat_unit_params(void *ctx, int u) {
    gt_zero *z = ctx;
    params_gather_wait(z, u);
    return z->flat_params + z->units[u].offset * z->eb;
}

void gt_zero_free(gt_zero *z) {
    if (!z->units) return;
    if (!z->dry) gt_zero_params_finish(z);
    for (int i = 0; i < z->n_buckets; i++) free(z->buckets[i].counts);
    free(z->buckets);
    free(z->unit_bucket);
    free(z->bucket_order);
    for (int u = 0; u < z->n_units; u++) free(z->units[u].counts);
    free(z->units);
    free(z->sched);
    if (z->param_shard) gt_mem_free(z->mem, GT_MEM_PARAMS, z->param_shard, z->shard.slice_len * z->eb);
    if (z->grad_slice) gt_mem_free(z->mem, GT_MEM_GRADS, z->grad_slice, z->shard.slice_len * sizeof(float));
    memset(z, 0, sizeof *z);
}

static gt_dtype working_dtype(const gt_zero *z) { return z->eb == 2 ? GT_DTYPE_BF16 : GT_DTYPE_F32; }

/* Buffers go through gt_mem, or, in a dry run, only through the byte counters. */
static void *zalloc(gt_zero *z, int which, size_t bytes) {
    if (z->dry) {
        z->dry_cur[which] += bytes;
        if (z->dry_cur[which] > z->dry_peak[which]) z->dry_peak[which] = z->dry_cur[which];
        return (void *)z; /* a non-NULL token */
    }
    return gt_mem_alloc(z->mem, which ? GT_MEM_GRADS : GT_MEM_PARAMS, bytes);
}

static void zfree(gt_zero *z, int which, void *p, size_t bytes) {
    if (z->dry) z->dry_cur[which] -= bytes;
    else gt_mem_free(z->mem, which ? GT_MEM_GRADS : GT_MEM_PARAMS, p, bytes);
}

/* GTRAIN_TEST_DIE_IN_GATHER (testhooks.h): the job must end with an error, not hang. */
static void maybe_die_in_gather(gt_zero *z, int started) {
    const gt_test_hooks *h = gt_test_hooks_get();
    if (h->die_in_gather.at > 0 && gt_comm_rank(z->comm) == h->die_in_gather.rank &&
        (long)z->gathers == h->die_in_gather.at && started == h->die_in_gather.started) {
        fprintf(stderr, "[rank %ld] GTRAIN_TEST_DIE_IN_GATHER: dying in gather %ld%s\n", h->die_in_gather.rank,
                h->die_in_gather.at, started ? " (started, in flight)" : "");
        fflush(stderr);
        raise(SIGKILL);
    }
}

/* Starts unit u's gather into a new buffer: this rank's piece copied in, the others' arriving. */
static void start_gather(gt_zero *z, int u) {
    gt_zero_unit *U = &z->units[u];
    U->gathered = zalloc(z, 0, U->numel * z->eb);
    z->gathers++;
    if (z->dry) return;
    if (U->own_count)
        z->ops->copy((char *)U->gathered + U->own_start * z->eb, (char *)z->param_shard + U->own_in_slice * z->eb,
                     U->own_count * z->eb);
    maybe_die_in_gather(z, 0);
    U->gather_req = gt_comm_all_gather_v_start(z->comm, U->gathered, U->counts, working_dtype(z));
    maybe_die_in_gather(z, 1);
}

static void finish_gather(gt_zero *z, int u) {
    gt_zero_unit *U = &z->units[u];
    if (U->gather_req) gt_comm_wait(z->comm, U->gather_req);
    U->gather_req = NULL;
}

/* Start the gathers of the next units of the schedule, up to `depth` ahead. */
static void prefetch(gt_zero *z) {
    for (int j = z->cursor; j < z->n_sched && z->ahead < z->depth; j++) {
        int v = z->sched[j];
        if (z->units[v].gathered) continue;
        start_gather(z, v);
        z->ahead++;
    }
}

static void hook_schedule(void *ctx, const int *units, int n) {
    gt_zero *z = ctx;
    /* anything prefetched for an order that did not happen is dropped (never the case in model.c) */
    for (int u = 0; u < z->n_units; u++) {
        gt_zero_unit *U = &z->units[u];
        if (U->gathered && !U->refs) {
            finish_gather(z, u);
            zfree(z, 0, U->gathered, U->numel * z->eb);
            U->gathered = NULL;
        }
    }
    z->ahead = 0;
    memcpy(z->sched, units, (size_t)n * sizeof *units);
    z->n_sched = n;
    z->cursor = 0;
}

/* ZeRO-3: the unit's working parameters: waited for (started now unless prefetched), and the next
 * units' gathers started. */
static void *unit_params(void *ctx, int u) {
    gt_zero *z = ctx;
    gt_zero_unit *U = &z->units[u];
    if (U->refs++ > 0) return U->gathered;
    if (!U->gathered) start_gather(z, u);
    else z->ahead--; /* prefetched */
    for (int j = z->cursor; j < z->n_sched; j++)
        if (z->sched[j] == u) {
            z->cursor = j + 1;
            break;
        }
    prefetch(z); /* before waiting: the next unit's transfer overlaps this one's rest and its compute */
    finish_gather(z, u);
    return U->gathered;
}

static void unit_params_done(void *ctx, int u) {
    gt_zero *z = ctx;
    gt_zero_unit *U = &z->units[u];
    if (--U->refs == 0) {
        zfree(z, 0, U->gathered, U->numel * z->eb);
        U->gathered = NULL;
    }
}

/* The pending reduce-scatter ends: this rank's block becomes the slice's piece, the accumulator goes. */
static void finish_reduction(gt_zero *z) {
    if (z->pending < 0) return;
    gt_zero_unit *U = &z->units[z->pending];
    if (!z->dry) {
        gt_comm_wait(z->comm, U->reduce_req);
        if (U->own_count)
            z->ops->copy(z->grad_slice + U->own_in_slice, U->acc + U->own_start, U->own_count * sizeof(float));
    }
    U->reduce_req = NULL;
    zfree(z, 1, U->acc, U->numel * sizeof(float));
    U->acc = NULL;
    z->pending = -1;
}

/* grad_sync = micro: an accumulator for the unit's gradients of this micro-batch. */
static float *unit_grads(void *ctx, int u) {
    gt_zero *z = ctx;
    gt_zero_unit *U = &z->units[u];
    if (U->grad_refs++ == 0) {
        U->acc = zalloc(z, 1, U->numel * sizeof(float));
        if (!z->dry) {
            z->ops->zero(U->acc, U->numel * sizeof(float));
            /* this rank's block starts from what the slice has accumulated so far: the reduction then
             * leaves slice + every rank's gradient there, with device copies only (no add kernel) */
            if (U->own_count)
                z->ops->copy(U->acc + U->own_start, z->grad_slice + U->own_in_slice, U->own_count * sizeof(float));
        }
    }
    return U->acc;
}

/* ... reduce-scattered in place when complete (started now, waited for when the next unit's
 * gradients are complete or at the end of the micro-batch). */
static void unit_grads_done(void *ctx, int u) {
    gt_zero *z = ctx;
    gt_zero_unit *U = &z->units[u];
    if (--U->grad_refs > 0) return;
    finish_reduction(z);
    z->reductions++;
    if (!z->dry) U->reduce_req = gt_comm_reduce_scatter_v_sum_start(z->comm, U->acc, U->acc + U->own_start,
                                                                      U->counts, GT_DTYPE_F32);
    z->pending = u;
}

static void hook_micro_end(void *ctx) { finish_reduction(ctx); }

static void hook_progress(void *ctx) {
    gt_zero *z = ctx;
    for (int u = 0; u < z->n_units; u++) {
        if (z->units[u].gather_req) gt_comm_test(z->comm, z->units[u].gather_req);
        if (z->units[u].reduce_req) gt_comm_test(z->comm, z->units[u].reduce_req);
    }
    for (int i = 0; i < z->n_buckets; i++)
        if (z->buckets[i].req) gt_comm_test(z->comm, z->buckets[i].req);
}

void gt_zero_hooks(gt_zero *z, gt_unit_hooks *h) {
    memset(h, 0, sizeof *h);
    h->ctx = z;
    if (z->stage == 3) {
        h->params = unit_params;
        h->params_done = unit_params_done;
        h->schedule = hook_schedule;
    }
    if (z->grad_micro) {
        h->grads = unit_grads;
        h->grads_done = unit_grads_done;
        h->micro_end = hook_micro_end;
    }
    if (z->stage < 3 && z->flat_params) h->params = flat_unit_params;
    if (z->n_buckets) {
        h->grads = bucket_grads;
        h->grads_done = bucket_grads_done;
    }
    if ((z->stage == 3 || z->grad_micro || z->n_buckets || z->flat_params) && !z->dry)
        h->progress = hook_progress; /* dry: nothing in flight */
}

void gt_zero_init_dry(gt_zero *z, const gt_layout *layout, int stage, int grad_micro, int depth, int act_bytes) {
    setup(z, layout, stage, grad_micro, depth, act_bytes);
    z->dry = 1;
}
