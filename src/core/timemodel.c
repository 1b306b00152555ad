/*
 * timemodel.c — the two-stream simulation of a step (see timemodel.h).
 */
#include "timemodel.h"
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void (*g_span_fn)(void *ctx, const gt_time_span *span);
static void *g_span_ctx;

void gt_time_set_span_listener(void (*fn)(void *ctx, const gt_time_span *span), void *ctx) {
    g_span_fn = fn;
    g_span_ctx = ctx;
}

static void span(int stream, const char *name, const char *cat, double start, double end, double flops,
                 double bytes, int micro) {
    gt_time_span s = {stream, micro, name, cat, start, end, flops, bytes};
    g_span_fn(g_span_ctx, &s);
}

void gt_time_trace_push(gt_time_trace *tr, gt_tev_kind kind, double seconds, double bytes) {
    if (kind == GT_TEV_COMPUTE) {
        tr->compute_s += seconds;
        if (!g_span_fn && tr->n && tr->ev[tr->n - 1].kind == GT_TEV_COMPUTE) { /* consecutive kernels: one event */
            tr->ev[tr->n - 1].seconds += seconds;
            return;
        }
    }
    if (tr->n == tr->cap) {
        tr->cap = tr->cap ? 2 * tr->cap : 256;
        tr->ev = realloc(tr->ev, (size_t)tr->cap * sizeof *tr->ev);
        if (!tr->ev) abort();
    }
    tr->ev[tr->n++] = (gt_time_event){kind, seconds, bytes, NULL, 0};
}

void gt_time_trace_push_op(gt_time_trace *tr, const gt_op_cost *cost, double seconds) {
    gt_time_trace_push(tr, GT_TEV_COMPUTE, seconds, 0);
    if (!g_span_fn) return;
    gt_time_event *e = &tr->ev[tr->n - 1];
    e->bytes = cost->bytes;
    e->op = cost->op;
    e->flops = cost->flops;
}

void gt_time_trace_free(gt_time_trace *tr) {
    free(tr->ev);
    memset(tr, 0, sizeof *tr);
}

/* A memory-bound kernel: its own measured sizes where the calibration has them, else its bytes at the
 * residual add's bandwidth */
static double memory_seconds(const gt_calib *c, const char *op, double bytes) {
    double s = gt_calib_kernel_seconds(c, op, bytes);
    return s >= 0 ? s : bytes / c->mem_bytes_per_s;
}

/* A kernel's seconds in a micro-batch: its calibrated seconds alone times the calibration's in-step
 * factor (calib.h; the step's own sum of squares, AdamW and conversion are priced below without it) */
double gt_time_op_seconds_at(const gt_calib *c, const gt_op_cost *k, double in_step) {
    if (!(in_step > 0)) in_step = 1;
    switch (k->kind) {
    case GT_COST_MATMUL: return in_step * k->flops / gt_calib_gemm_rate(c, k->n, k->ic, k->oc, k->backward);
    case GT_COST_ATTENTION: { /* its measured batches where the calibration has them, else the one rate */
        double s = gt_calib_kernel_seconds(c, k->op, k->flops);
        return in_step * (s >= 0 ? s : k->flops / (k->backward ? c->attn_bwd_flops_per_s : c->attn_fwd_flops_per_s));
    }
    case GT_COST_OPTIMIZER: return k->bytes / c->optim_bytes_per_s;
    case GT_COST_MEMORY: break;
    }
    return in_step * memory_seconds(c, k->op, k->bytes);
}

/* The ring model's bytes a rank moves in a collective of `bytes` on `world` ranks */
static double ring_bytes(int world, char kind, double bytes) {
    return (kind == 'a' ? 2.0 : 1.0) * (double)(world - 1) / (double)world * bytes;
}

double gt_time_collective(const gt_calib *c, int world, char kind, double bytes) {
    if (world <= 1) return 0;
    return c->coll_latency_s + ring_bytes(world, kind, bytes) / c->coll_bytes_per_s;
}

static double max2(double a, double b) { return a > b ? a : b; }

/* The simulation's state: the compute stream's time t, the communication stream's comm (the end of its
 * last collective), what each kept busy, and the queues of one micro-batch's gathers and of the
 * gradient buckets in flight */
typedef struct sim {
    const gt_time_trace *tr;
    const gt_time_step *st;
    const gt_calib *c;
    int W, A, depth, buckets;
    double t, comm, busy_compute, busy_comm;
    int n_g;                 /* the gathers of one micro-batch, in order: their bytes and finish times */
    double *g_bytes, *g_done;
    int issued, next;        /* this micro-batch's gathers issued, and the next one needed */
    double pending;          /* gradient bytes of the bucket being filled */
    /* the ends of the last GT_ZERO_BUCKETS_IN_FLIGHT buckets started: a start waits for the oldest (zero.h) */
    double b_done[GT_ZERO_BUCKETS_IN_FLIGHT];
    int n_b;
} sim;

static void sim_init(sim *s, const gt_time_trace *tr, const gt_time_step *st, const gt_calib *c) {
    memset(s, 0, sizeof *s);
    s->tr = tr, s->st = st, s->c = c;
    s->W = st->world > 0 ? st->world : 1;
    s->A = st->grad_accum > 0 ? st->grad_accum : 1;
    s->depth = st->prefetch > 0 ? st->prefetch : 0;
    s->buckets = !st->grad_micro && st->stage >= 1 && st->bucket_bytes > 0;
    for (int i = 0; i < tr->n; i++) s->n_g += tr->ev[i].kind == GT_TEV_GATHER;
    s->g_bytes = calloc((size_t)s->n_g + 1, sizeof *s->g_bytes);
    s->g_done = calloc((size_t)s->n_g + 1, sizeof *s->g_done);
    if (!s->g_bytes || !s->g_done) abort();
    for (int i = 0, k = 0; i < tr->n; i++)
        if (tr->ev[i].kind == GT_TEV_GATHER) s->g_bytes[k++] = tr->ev[i].bytes;
}

/* A collective that runs beside the compute (a gather, a per-unit reduce-scatter, a bucket): its time
 * at the calibration's bandwidth beside compute, and in *lost the compute's seconds it costs (calib.h,
 * overlap_*), which the caller adds to the compute stream once the collective is placed (as if the
 * compute ran throughout it: one exposed while the compute waits costs less than that) */
static double sim_overlapped(const sim *s, char kind, double bytes, double *lost) {
    const gt_calib *c = s->c;
    *lost = 0;
    if (s->W <= 1) return 0;
    double moved = ring_bytes(s->W, kind, bytes);
    *lost = c->overlap_compute_s_per_byte * moved;
    return c->coll_latency_s + moved / (c->overlap_bytes_per_s > 0 ? c->overlap_bytes_per_s : c->coll_bytes_per_s);
}
static void sim_lose(sim *s, double lost) {
    s->t += lost;
    s->busy_compute += lost;
}

/* Gather number `i` of the micro-batch issued on the communication stream at time `at` */
static void sim_issue_gather(sim *s, int i, double at, int m) {
    double lost, d = sim_overlapped(s, 'g', s->g_bytes[i], &lost);
    double from = max2(s->comm, at);
    if (g_span_fn && s->W > 1) span(1, "all_gather_v", "collective", from, from + d, 0, s->g_bytes[i], m);
    s->comm = from + d;
    s->busy_comm += d;
    s->g_done[i] = s->comm;
    sim_lose(s, lost);
}

/* A unit needed by micro-batch m: its gather (and with prefetch the next depth ones) issued on the
 * communication stream, compute waits for it. The previous step's gathers of the working weights
 * (overlap_param_gather below ZeRO-3) as zero.c runs them: the first GT_ZERO_PARAM_GATHERS_IN_FLIGHT
 * issued at 0, each wait in the first forward issuing the next */
static void sim_gather(sim *s, int m) {
    int k = s->next++;
    if (s->st->param_gather && s->st->stage < 3) {
        if (m > 0) return;
        if (k == 0)
            for (; s->issued < GT_ZERO_PARAM_GATHERS_IN_FLIGHT && s->issued < s->n_g; s->issued++)
                sim_issue_gather(s, s->issued, 0, m);
        for (; s->issued <= k && s->issued < s->n_g; s->issued++) sim_issue_gather(s, s->issued, s->t, m);
        if (g_span_fn && s->g_done[k] > s->t) span(0, "wait_all_gather_v", "wait", s->t, s->g_done[k], 0, 0, m);
        s->t = max2(s->t, s->g_done[k]);
        for (; s->issued < k + 1 + GT_ZERO_PARAM_GATHERS_IN_FLIGHT && s->issued < s->n_g; s->issued++)
            sim_issue_gather(s, s->issued, s->t, m);
        return;
    }
    for (; s->issued <= k + s->depth && s->issued < s->n_g; s->issued++) sim_issue_gather(s, s->issued, s->t, m);
    if (g_span_fn && s->g_done[k] > s->t) span(0, "wait_all_gather_v", "wait", s->t, s->g_done[k], 0, 0, m);
    s->t = max2(s->t, s->g_done[k]);
}

/* A unit's gradients complete in micro-batch m: its reduce-scatter under grad_sync = micro; with
 * buckets, in the last micro-batch, its share of the bucket being filled (started when full, after the
 * end of the bucket started GT_ZERO_BUCKETS_IN_FLIGHT before it) */
static void sim_grad_done(sim *s, const gt_time_event *e, int m) {
    int W = s->W;
    if (!s->st->grad_micro) { /* buckets: the last micro-batch's backward reduces them */
        if (!s->buckets || m != s->A - 1 || (s->pending += e->bytes) < s->st->bucket_bytes) return;
        double lost, d = sim_overlapped(s, 'r', s->pending, &lost);
        s->t = max2(s->t, s->b_done[s->n_b % GT_ZERO_BUCKETS_IN_FLIGHT]);
        s->comm = max2(s->comm, s->t) + d;
        s->b_done[s->n_b++ % GT_ZERO_BUCKETS_IN_FLIGHT] = s->comm;
        s->busy_comm += d;
        s->pending = 0;
        sim_lose(s, lost);
        return;
    }
    double lost, d = sim_overlapped(s, 'r', e->bytes, &lost);
    if (g_span_fn && W > 1)
        span(1, "reduce_scatter_v", "collective", max2(s->comm, s->t), max2(s->comm, s->t) + d, 0, e->bytes, m);
    s->comm = max2(s->comm, s->t) + d;
    s->busy_comm += d;
    sim_lose(s, lost);
}

/* Micro-batch m: the trace's events in order on the two streams */
static void sim_micro_batch(sim *s, int m) {
    s->issued = 0, s->next = 0;
    double m_start = s->t;
    for (int i = 0; i < s->tr->n; i++) {
        const gt_time_event *e = &s->tr->ev[i];
        switch (e->kind) {
        case GT_TEV_COMPUTE:
            if (g_span_fn) span(0, e->op ? e->op : "compute", "op", s->t, s->t + e->seconds, e->flops, e->bytes, m);
            s->t += e->seconds;
            s->busy_compute += e->seconds;
            break;
        case GT_TEV_GATHER: sim_gather(s, m); break;
        case GT_TEV_GRAD_DONE: sim_grad_done(s, e, m); break;
        case GT_TEV_MICRO_END: /* the micro-batch's reduce-scatters done */
            if (g_span_fn && s->comm > s->t) span(0, "wait_reduce_scatter_v", "wait", s->t, s->comm, 0, 0, m);
            s->t = max2(s->t, s->comm);
            break;
        }
    }
    if (g_span_fn) span(0, "micro_batch", "micro_batch", m_start, s->t, 0, 0, m);
}

/* The step after the last micro-batch, in the code's order, nothing overlapping: the embedding's
 * bucket (started at the end of the backward), the wait for the communication stream, the gradients'
 * reduction, the clipping norm (sum of squares, scalar all-reduce), AdamW, the conversion to working
 * parameters, ZeRO-1/2's gather of them. Returns the optimizer's compute (*opt) too. */
static void sim_step_tail(sim *s, double *opt_out) {
    const gt_time_step *st = s->st;
    const gt_calib *c = s->c;
    int W = s->W;
    if (s->buckets && s->pending > 0) { /* the embedding's bucket, started at the end of the backward */
        double d = gt_time_collective(c, W, 'r', s->pending);
        s->t = max2(s->t, s->b_done[s->n_b % GT_ZERO_BUCKETS_IN_FLIGHT]);
        s->comm = max2(s->comm, s->t) + d;
        s->busy_comm += d;
    }
    s->t = max2(s->t, s->comm);
    double e = st->act_bytes > 0 ? st->act_bytes : 4, step_comm = 0;
    double reduce = 0, norm = 0, gather = 0; /* the step's collectives, in the code's order */
    if (W > 1) {
        if (st->stage == 0) reduce = gt_time_collective(c, W, 'a', (double)st->n_pad * 4);
        else if ((st->stage == 1 || !st->grad_micro) && !s->buckets) reduce = gt_time_collective(c, W, 'r', (double)st->n_pad * 4);
        norm = c->coll_latency_s; /* the clipping norm's scalar all-reduce */
        if ((st->stage == 1 || st->stage == 2) && !st->param_gather) gather = gt_time_collective(c, W, 'g', (double)st->n_pad * e);
        step_comm += reduce;
        step_comm += norm;
        step_comm += gather;
    }
    double sumsq = memory_seconds(c, "sumsq", (double)st->slice * 4),
           adamw = (double)st->slice * 28 / c->optim_bytes_per_s,
           to_working = memory_seconds(c, "to_working", (double)st->slice * (4 + e)); /* master to working */
    double opt = sumsq + adamw + to_working;
    if (g_span_fn) {
        double at = s->t;
        /* bytes as comm.h's calls count them: all-reduce the buffer, reduce-scatter and all-gather a slice */
        const char *red = st->stage == 0 ? "all_reduce" : "reduce_scatter";
        double red_bytes = (double)st->n_pad * 4 / (st->stage == 0 ? 1 : W);
        const struct { const char *name; int comm; double s, bytes; } tail[] = {
            {red, 1, reduce, red_bytes}, {"sumsq", 0, sumsq, (double)st->slice * 4},
            {"all_reduce_scalar", 1, norm, 8}, {"adamw", 0, adamw, (double)st->slice * 28},
            {"to_working", 0, to_working, (double)st->slice * (4 + e)},
            {"all_gather", 1, gather, (double)st->n_pad * e / W}};
        for (int i = 0; i < 6; i++) {
            if (tail[i].comm && tail[i].s <= 0) continue; /* no such collective in this plan */
            if (tail[i].comm) {
                char wait[64];
                snprintf(wait, sizeof wait, "wait_%s", tail[i].name);
                span(1, tail[i].name, "collective", at, at + tail[i].s, 0, tail[i].bytes, -1);
                span(0, wait, "wait", at, at + tail[i].s, 0, 0, -1);
            } else {
                span(0, tail[i].name, "op", at, at + tail[i].s, 0, tail[i].bytes, -1);
            }
            at += tail[i].s;
        }
    }
    s->busy_comm += step_comm;
    s->busy_compute += opt;
    s->t += step_comm + opt;
    *opt_out = opt;
}

void gt_time_simulate(const gt_time_trace *tr, const gt_time_step *st, const gt_calib *c, gt_time_estimate *out) {
    memset(out, 0, sizeof *out);
    sim s;
    sim_init(&s, tr, st, c);
    for (int m = 0; m < s.A; m++) sim_micro_batch(&s, m);
    free(s.g_bytes);
    free(s.g_done);
    double opt = 0;
    sim_step_tail(&s, &opt);
    double t = s.t;
    int W = s.W, A = s.A;
    out->step_s = t;
    if (g_span_fn) span(0, "step", "step", 0, t, A * st->model_flops, 0, -1);
    out->compute_s = s.busy_compute;
    out->comm_s = s.busy_comm;
    out->exposed_comm_s = t - s.busy_compute > 0 ? t - s.busy_compute : 0;
    out->optimizer_s = opt;
    out->tokens_per_s = t > 0 ? (double)W * A * st->tokens_per_micro / t : 0;
    out->mfu = c->peak_flops > 0 && t > 0 ? A * st->model_flops / t / c->peak_flops : 0;
    out->measured = c->measured;
}
