/*
 * zero.c — ZeRO-2/3 unit gathers and per-unit gradient reductions (see zero.h).
 *
 * Everything here is collective in the executor's order: every rank runs the same plan over the
 * same units, so the all_gather_v / reduce_scatter_v calls line up across ranks.
 */
#include "zero.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gt_zero_stage(const char *shard) {
    if (strcmp(shard, "optimizer") == 0) return 1;
    if (strcmp(shard, "gradients") == 0) return 2;
    if (strcmp(shard, "parameters") == 0) return 3;
    return 0;
}

void gt_zero_init(gt_zero *z, const gt_ops *ops, gt_mem *mem, gt_comm *comm, const gt_layout *layout, int stage,
                  int grad_micro) {
    memset(z, 0, sizeof *z);
    z->ops = ops;
    z->mem = mem;
    z->comm = comm;
    z->stage = stage;
    z->grad_micro = grad_micro;
    z->eb = (size_t)ops->act_bytes;
    int W = gt_comm_size(comm), rank = gt_comm_rank(comm);
    gt_shard_init(&z->shard, layout->n_params, W, rank);
    z->n_units = gt_model_n_units(&layout->cfg);
    z->units = calloc((size_t)z->n_units, sizeof *z->units);
    if (!z->units) abort();
    for (int u = 0; u < z->n_units; u++) {
        gt_zero_unit *U = &z->units[u];
        gt_layout_unit(layout, u, &U->offset, &U->numel);
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

void gt_zero_free(gt_zero *z) {
    if (!z->units) return;
    for (int u = 0; u < z->n_units; u++) free(z->units[u].counts);
    free(z->units);
    if (z->param_shard) gt_mem_free(z->mem, GT_MEM_PARAMS, z->param_shard, z->shard.slice_len * z->eb);
    if (z->grad_slice) gt_mem_free(z->mem, GT_MEM_GRADS, z->grad_slice, z->shard.slice_len * sizeof(float));
    memset(z, 0, sizeof *z);
}

static gt_dtype working_dtype(const gt_zero *z) { return z->eb == 2 ? GT_DTYPE_BF16 : GT_DTYPE_F32; }

/* GTRAIN_TEST_DIE_IN_GATHER=K (tests only): rank 1 kills itself (SIGKILL) as it enters its K-th
 * gather, while the other ranks are inside theirs: the job must end with an error, not hang. */
static void maybe_die_in_gather(gt_zero *z) {
    static long die_at = -1;
    if (die_at < 0) {
        const char *env = getenv("GTRAIN_TEST_DIE_IN_GATHER");
        die_at = env && *env ? atol(env) : 0;
    }
    if (die_at > 0 && gt_comm_rank(z->comm) == 1 && (long)z->gathers + 1 == die_at) {
        fprintf(stderr, "[rank 1] GTRAIN_TEST_DIE_IN_GATHER: dying in gather %ld\n", die_at);
        fflush(stderr);
        raise(SIGKILL);
    }
}

/* ZeRO-3: the unit's working parameters, gathered on first use. */
static void *unit_params(void *ctx, int u) {
    gt_zero *z = ctx;
    gt_zero_unit *U = &z->units[u];
    if (U->refs++ == 0) {
        U->gathered = gt_mem_alloc(z->mem, GT_MEM_PARAMS, U->numel * z->eb);
        if (U->own_count)
            z->ops->copy((char *)U->gathered + U->own_start * z->eb, (char *)z->param_shard + U->own_in_slice * z->eb,
                         U->own_count * z->eb);
        maybe_die_in_gather(z);
        gt_comm_all_gather_v(z->comm, U->gathered, U->counts, working_dtype(z));
        z->gathers++;
    }
    return U->gathered;
}

static void unit_params_done(void *ctx, int u) {
    gt_zero *z = ctx;
    gt_zero_unit *U = &z->units[u];
    if (--U->refs == 0) {
        gt_mem_free(z->mem, GT_MEM_PARAMS, U->gathered, U->numel * z->eb);
        U->gathered = NULL;
    }
}

/* grad_sync = micro: an accumulator for the unit's gradients of this micro-batch. */
static float *unit_grads(void *ctx, int u) {
    gt_zero *z = ctx;
    gt_zero_unit *U = &z->units[u];
    if (U->grad_refs++ == 0) {
        U->acc = gt_mem_alloc(z->mem, GT_MEM_GRADS, U->numel * sizeof(float));
        z->ops->zero(U->acc, U->numel * sizeof(float));
        /* this rank's block starts from what the slice has accumulated so far: the reduction then
         * leaves slice + every rank's gradient there, with device copies only (no add kernel) */
        if (U->own_count)
            z->ops->copy(U->acc + U->own_start, z->grad_slice + U->own_in_slice, U->own_count * sizeof(float));
    }
    return U->acc;
}

/* ... reduce-scattered in place when complete; this rank's block becomes the slice's piece. */
static void unit_grads_done(void *ctx, int u) {
    gt_zero *z = ctx;
    gt_zero_unit *U = &z->units[u];
    if (--U->grad_refs > 0) return;
    float *own = U->acc + U->own_start;
    gt_comm_reduce_scatter_v_sum(z->comm, U->acc, own, U->counts, GT_DTYPE_F32);
    z->reductions++;
    if (U->own_count) z->ops->copy(z->grad_slice + U->own_in_slice, own, U->own_count * sizeof(float));
    gt_mem_free(z->mem, GT_MEM_GRADS, U->acc, U->numel * sizeof(float));
    U->acc = NULL;
}

void gt_zero_hooks(gt_zero *z, gt_unit_hooks *h) {
    memset(h, 0, sizeof *h);
    h->ctx = z;
    if (z->stage == 3) {
        h->params = unit_params;
        h->params_done = unit_params_done;
    }
    if (z->grad_micro) {
        h->grads = unit_grads;
        h->grads_done = unit_grads_done;
    }
}
