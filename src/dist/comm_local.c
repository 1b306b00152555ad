/*
 * comm_local.c — the local implementation of gt_comm: one rank, no library, no traffic.
 *
 * A single-GPU run needs no collective at all, so it should not depend on NCCL initialising (or on a
 * CUDA-aware MPI): with one rank the sum over ranks is the buffer itself. All-reduce and broadcast
 * leave the buffer as it is; reduce-scatter and all-gather copy when the caller did not ask for the
 * in-place form, through the copy function it gave (the backend's own, so device buffers stay on the
 * device). Host scalar reductions go through the duplicated MPI communicator of comm_mpi.c's common
 * part as for every backend (with one rank they return their input). Accounting is comm_mpi.c's
 * shared wrappers: every byte term is 0 at W == 1, calls and time are counted as for MPI and NCCL.
 */
#include <stdio.h>
#include <stdlib.h>

#include "comm_internal.h"

typedef struct {
    void (*copy)(void *dst, const void *src, size_t bytes);
} local_state;

static void local_all_reduce_sum(gt_comm *c, void *buf, size_t count, gt_dtype dtype) {
    (void)c, (void)buf, (void)count, (void)dtype;   /* the sum over one rank */
}

/* W == 1: recv (recv_count) = send (recv_count); in place when recv == send */
static void local_reduce_scatter_sum(gt_comm *c, const void *send, void *recv, size_t recv_count,
                                     gt_dtype dtype) {
    local_state *s = c->impl;
    if (recv != send) s->copy(recv, send, recv_count * gt_dtype_bytes(dtype));
}

/* W == 1: recv (send_count) = send (send_count); in place when send == recv */
static void local_all_gather(gt_comm *c, const void *send, void *recv, size_t send_count, gt_dtype dtype) {
    local_state *s = c->impl;
    if (recv != send) s->copy(recv, send, send_count * gt_dtype_bytes(dtype));
}

static void local_broadcast(gt_comm *c, void *buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes, (void)root;   /* the root is this rank */
}

/* The ZeRO-2/3 variable-count forms at W == 1: the one block is the whole buffer. */
static void local_reduce_scatter_v_sum(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                       const size_t *displs, gt_dtype dtype) {
    (void)displs;
    local_state *s = c->impl;
    if (recv != send) s->copy(recv, send, counts[0] * gt_dtype_bytes(dtype));
}

static void local_all_gather_v(gt_comm *c, void *buf, const size_t *counts, const size_t *displs, gt_dtype dtype) {
    (void)c, (void)buf, (void)counts, (void)displs, (void)dtype;   /* in place: already whole */
}

/* Non-blocking forms: done at start (a non-NULL token), nothing left to wait for. */
static void *local_all_gather_v_start(gt_comm *c, void *buf, const size_t *counts, const size_t *displs,
                                      gt_dtype dtype) {
    local_all_gather_v(c, buf, counts, displs, dtype);
    return c;
}

static void *local_reduce_scatter_v_sum_start(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                              const size_t *displs, gt_dtype dtype) {
    local_reduce_scatter_v_sum(c, send, recv, counts, displs, dtype);
    return c;
}

static int local_test(gt_comm *c, void *handle) {
    (void)c, (void)handle;
    return 1;
}

static void local_wait(gt_comm *c, void *handle) { (void)c, (void)handle; }

static void local_destroy(gt_comm *c) {
    free(c->impl);
    c->impl = NULL;
}

static const gt_comm_ops local_ops = {
    .all_reduce_sum = local_all_reduce_sum,
    .reduce_scatter_sum = local_reduce_scatter_sum,
    .all_gather = local_all_gather,
    .broadcast = local_broadcast,
    .reduce_scatter_v_sum = local_reduce_scatter_v_sum,
    .all_gather_v = local_all_gather_v,
    .all_gather_v_start = local_all_gather_v_start,
    .reduce_scatter_v_sum_start = local_reduce_scatter_v_sum_start,
    .test = local_test,
    .wait = local_wait,
    .destroy = local_destroy,
};

gt_comm *gt_comm_create_local(MPI_Comm world, void (*copy)(void *dst, const void *src, size_t bytes), char *why,
                              size_t why_len) {
    int size = 0;
    MPI_Comm_size(world, &size);
    if (size != 1 || !copy) {
        if (why && why_len)
            snprintf(why, why_len, !copy ? "no copy function given"
                                         : "the local communicator is for one rank, this job has %d", size);
        return NULL;
    }
    gt_comm *c = calloc(1, sizeof *c);
    local_state *s = calloc(1, sizeof *s);
    if (!c || !s) {
        fprintf(stderr, "%s:%d: out of memory\n", __FILE__, __LINE__);
        abort();
    }
    gt_comm_init_common(c, world, "local");
    s->copy = copy;
    c->impl = s;
    c->ops = &local_ops;
    if (why && why_len) why[0] = '\0';
    return c;
}
