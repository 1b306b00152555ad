/*
 * timemodel.c — the two-stream simulation of a step (see timemodel.h).
 */
#include "timemodel.h"

#include <stdlib.h>
#include <string.h>

void gt_time_trace_push(gt_time_trace *tr, gt_tev_kind kind, double seconds, double bytes) {
    if (kind == GT_TEV_COMPUTE) {
        tr->compute_s += seconds;
        if (tr->n && tr->ev[tr->n - 1].kind == GT_TEV_COMPUTE) { /* consecutive kernels: one event */
            tr->ev[tr->n - 1].seconds += seconds;
            return;
        }
    }
    if (tr->n == tr->cap) {
        tr->cap = tr->cap ? 2 * tr->cap : 256;
        tr->ev = realloc(tr->ev, (size_t)tr->cap * sizeof *tr->ev);
        if (!tr->ev) abort();
    }
    tr->ev[tr->n++] = (gt_time_event){kind, seconds, bytes};
}

void gt_time_trace_free(gt_time_trace *tr) {
    free(tr->ev);
    memset(tr, 0, sizeof *tr);
}

double gt_time_op_seconds(const gt_calib *c, const gt_op_cost *k) {
    switch (k->kind) {
    case GT_COST_MATMUL: return k->flops / gt_calib_gemm_rate(c, k->n, k->ic, k->oc, k->backward);
    case GT_COST_ATTENTION: return k->flops / (k->backward ? c->attn_bwd_flops_per_s : c->attn_fwd_flops_per_s);
    case GT_COST_OPTIMIZER: return k->bytes / c->optim_bytes_per_s;
    case GT_COST_MEMORY: break;
    }
    return k->bytes / c->mem_bytes_per_s;
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
    for (int m = 0; m < A; m++) {
        int issued = 0, next = 0;
        for (int i = 0; i < tr->n; i++) {
            const gt_time_event *e = &tr->ev[i];
            switch (e->kind) {
            case GT_TEV_COMPUTE:
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
                    comm = max2(comm, t) + d;
                    busy_comm += d;
                    g_done[issued] = comm;
                }
                t = max2(t, g_done[k]);
                break;
            }
            case GT_TEV_GRAD_DONE: {
                if (!st->grad_micro) { /* buckets: the last micro-batch's backward reduces them */
                    if (!buckets || m != A - 1 || (pending += e->bytes) < st->bucket_bytes) break;
                    double d = gt_time_collective(c, W, 'r', pending);
                    comm = max2(comm, t) + d;
                    busy_comm += d;
                    pending = 0;
                    break;
                }
                double d = gt_time_collective(c, W, 'r', e->bytes);
                comm = max2(comm, t) + d;
                busy_comm += d;
                break;
            }
            case GT_TEV_MICRO_END:
                t = max2(t, comm);
                break;
            }
        }
    }
    free(g_bytes);
    free(g_done);
    if (buckets && pending > 0) { /* the embedding's bucket, started at the end of the backward */
        double d = gt_time_collective(c, W, 'r', pending);
        comm = max2(comm, t) + d;
        busy_comm += d;
    }
    /* the step after the last micro-batch, in the code's order, nothing overlapping */
    t = max2(t, comm);
    double e = st->act_bytes > 0 ? st->act_bytes : 4, step_comm = 0;
    if (W > 1) {
        if (st->stage == 0) step_comm += gt_time_collective(c, W, 'a', (double)st->n_pad * 4);
        else if ((st->stage == 1 || !st->grad_micro) && !buckets)
            step_comm += gt_time_collective(c, W, 'r', (double)st->n_pad * 4);
        step_comm += c->coll_latency_s; /* the clipping norm's scalar all-reduce */
        if ((st->stage == 1 || st->stage == 2) && !st->param_gather)
            step_comm += gt_time_collective(c, W, 'g', (double)st->n_pad * e);
    }
    double opt = (double)st->slice * 4 / c->mem_bytes_per_s          /* sum of squares */
                 + (double)st->slice * 28 / c->optim_bytes_per_s     /* AdamW */
                 + (double)st->slice * (4 + e) / c->mem_bytes_per_s; /* master to working */
    busy_comm += step_comm;
    busy_compute += opt;
    t += step_comm + opt;
    out->step_s = t;
    out->compute_s = busy_compute;
    out->comm_s = busy_comm;
    out->exposed_comm_s = t - busy_compute > 0 ? t - busy_compute : 0;
    out->optimizer_s = opt;
    out->tokens_per_s = t > 0 ? (double)W * A * st->tokens_per_micro / t : 0;
    out->mfu = c->peak_flops > 0 && t > 0 ? A * st->model_flops / t / c->peak_flops : 0;
    out->measured = c->measured;
}
