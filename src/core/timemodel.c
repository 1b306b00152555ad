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

double gt_time_op_seconds(const gt_calib *c, const gt_op_cost *k) {
    switch (k->kind) {
    case GT_COST_MATMUL: return k->flops / gt_calib_gemm_rate(c, k->n, k->ic, k->oc, k->backward);
    case GT_COST_ATTENTION: { /* its measured batches where the calibration has them, else the one rate */
        double s = gt_calib_kernel_seconds(c, k->op, k->flops);
        return s >= 0 ? s : k->flops / (k->backward ? c->attn_bwd_flops_per_s : c->attn_fwd_flops_per_s);
    }
    case GT_COST_OPTIMIZER: return k->bytes / c->optim_bytes_per_s;
    case GT_COST_MEMORY: break;
    }
    return memory_seconds(c, k->op, k->bytes);
}

double gt_time_collective(const gt_calib *c, int world, char kind, double bytes) {
    if (world <= 1) return 0;
    double f = (kind == 'a' ? 2.0 : 1.0) * (double)(world - 1) / (double)world;
    return c->coll_latency_s + f * bytes / c->coll_bytes_per_s;
}

static double max2(double a, double b) { return a > b ? a : b; }

void gt_time_simulate(const gt_time_trace *tr, const gt_time_step *st, const gt_calib *c, gt_time_estimate *out) {
    memset(out, 0, sizeof *out);
    int W = st->world > 0 ? st->world : 1, A = st->grad_accum > 0 ? st->grad_accum : 1;
    int depth = st->prefetch > 0 ? st->prefetch : 0;
    double t = 0, comm = 0, busy_compute = 0, busy_comm = 0;
    /* the gathers of one micro-batch, in order: their bytes and finish times */
    int n_g = 0;
    for (int i = 0; i < tr->n; i++) n_g += tr->ev[i].kind == GT_TEV_GATHER;
    double *g_bytes = calloc((size_t)n_g + 1, sizeof *g_bytes), *g_done = calloc((size_t)n_g + 1, sizeof *g_done);
    if (!g_bytes || !g_done) abort();
    for (int i = 0, k = 0; i < tr->n; i++)
        if (tr->ev[i].kind == GT_TEV_GATHER) g_bytes[k++] = tr->ev[i].bytes;
    int buckets = !st->grad_micro && st->stage >= 1 && st->bucket_bytes > 0;
    double pending = 0; /* gradient bytes of the bucket being filled */
    /* the ends of the last GT_ZERO_BUCKETS_IN_FLIGHT buckets started: a start waits for the oldest (zero.h) */
    double b_done[GT_ZERO_BUCKETS_IN_FLIGHT] = {0};
    int n_b = 0;
    for (int m = 0; m < A; m++) {
        int issued = 0, next = 0;
        double m_start = t;
        for (int i = 0; i < tr->n; i++) {
            const gt_time_event *e = &tr->ev[i];
            switch (e->kind) {
            case GT_TEV_COMPUTE:
                if (g_span_fn) span(0, e->op ? e->op : "compute", "op", t, t + e->seconds, e->flops, e->bytes, m);
                t += e->seconds;
                busy_compute += e->seconds;
                break;
            case GT_TEV_GATHER: {
                if (st->param_gather && st->stage < 3) { /* the previous step's gathers, issued at 0 */
                    int k = next++;
                    if (m > 0) break;
                    for (; issued <= k && issued < n_g; issued++) {
                        double d = gt_time_collective(c, W, 'g', g_bytes[issued]);
                        comm += d;
                        busy_comm += d;
                        g_done[issued] = comm;
                    }
                    t = max2(t, g_done[k]);
                    break;
                }
                int k = next++;
                for (; issued <= k + depth && issued < n_g; issued++) {
                    double d = gt_time_collective(c, W, 'g', g_bytes[issued]);
                    if (g_span_fn && W > 1)
                        span(1, "all_gather_v", "collective", max2(comm, t), max2(comm, t) + d, 0, g_bytes[issued], m);
                    comm = max2(comm, t) + d;
                    busy_comm += d;
                    g_done[issued] = comm;
                }
                if (g_span_fn && g_done[k] > t) span(0, "wait_all_gather_v", "wait", t, g_done[k], 0, 0, m);
                t = max2(t, g_done[k]);
                break;
            }
            case GT_TEV_GRAD_DONE: {
                if (!st->grad_micro) { /* buckets: the last micro-batch's backward reduces them */
                    if (!buckets || m != A - 1 || (pending += e->bytes) < st->bucket_bytes) break;
                    double d = gt_time_collective(c, W, 'r', pending);
                    t = max2(t, b_done[n_b % GT_ZERO_BUCKETS_IN_FLIGHT]);
                    comm = max2(comm, t) + d;
                    b_done[n_b++ % GT_ZERO_BUCKETS_IN_FLIGHT] = comm;
                    busy_comm += d;
                    pending = 0;
                    break;
                }
                double d = gt_time_collective(c, W, 'r', e->bytes);
                if (g_span_fn && W > 1)
                    span(1, "reduce_scatter_v", "collective", max2(comm, t), max2(comm, t) + d, 0, e->bytes, m);
                comm = max2(comm, t) + d;
                busy_comm += d;
                break;
            }
            case GT_TEV_MICRO_END:
                if (g_span_fn && comm > t) span(0, "wait_reduce_scatter_v", "wait", t, comm, 0, 0, m);
                t = max2(t, comm);
                break;
            }
        }
        if (g_span_fn) span(0, "micro_batch", "micro_batch", m_start, t, 0, 0, m);
    }
    free(g_bytes);
    free(g_done);
    if (buckets && pending > 0) { /* the embedding's bucket, started at the end of the backward */
        double d = gt_time_collective(c, W, 'r', pending);
        t = max2(t, b_done[n_b % GT_ZERO_BUCKETS_IN_FLIGHT]);
        comm = max2(comm, t) + d;
        busy_comm += d;
    }
    /* the step after the last micro-batch, in the code's order, nothing overlapping */
    t = max2(t, comm);
    double e = st->act_bytes > 0 ? st->act_bytes : 4, step_comm = 0;
    double reduce = 0, norm = 0, gather = 0; /* the step's collectives, in the code's order */
    if (W > 1) {
        if (st->stage == 0) reduce = gt_time_collective(c, W, 'a', (double)st->n_pad * 4);
        else if ((st->stage == 1 || !st->grad_micro) && !buckets) reduce = gt_time_collective(c, W, 'r', (double)st->n_pad * 4);
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
        double at = t;
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
    busy_comm += step_comm;
    busy_compute += opt;
    t += step_comm + opt;
    out->step_s = t;
    if (g_span_fn) span(0, "step", "step", 0, t, A * st->model_flops, 0, -1);
    out->compute_s = busy_compute;
    out->comm_s = busy_comm;
    out->exposed_comm_s = t - busy_compute > 0 ? t - busy_compute : 0;
    out->optimizer_s = opt;
    out->tokens_per_s = t > 0 ? (double)W * A * st->tokens_per_micro / t : 0;
    out->mfu = c->peak_flops > 0 && t > 0 ? A * st->model_flops / t / c->peak_flops : 0;
    out->measured = c->measured;
}
