/*
 * comm_internal.h — what comm_mpi.c and comm_nccl.c share and callers must not see: the gt_comm
 * struct, the table of backend operations, and the MPI error check. Public wrappers in comm_mpi.c
 * validate arguments, keep the accounting (gt_comm_stats) and time each call, then dispatch through
 * `ops`, so both backends count bytes by the same formulas.
 */
#ifndef GT_COMM_INTERNAL_H
#define GT_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "comm.h"

typedef struct {
    void (*all_reduce_sum)(gt_comm *c, void *buf, size_t count, gt_dtype dtype);
    void (*reduce_scatter_sum)(gt_comm *c, const void *send, void *recv, size_t recv_count,
                               gt_dtype dtype);
    void (*all_gather)(gt_comm *c, const void *send, void *recv, size_t send_count, gt_dtype dtype);
    void (*broadcast)(gt_comm *c, void *buf, size_t bytes, int root);
    /* counts/displs: W entries each, total elements fit an int (checked by the wrapper) */
    void (*reduce_scatter_v_sum)(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                 const size_t *displs, gt_dtype dtype);
    void (*all_gather_v)(gt_comm *c, void *buf, const size_t *counts, const size_t *displs, gt_dtype dtype);
    /* non-blocking: start returns the backend's handle; test (1 = complete) and wait on it; wait
     * frees the handle */
    void *(*all_gather_v_start)(gt_comm *c, void *buf, const size_t *counts, const size_t *displs, gt_dtype dtype);
    void *(*reduce_scatter_v_sum_start)(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                        const size_t *displs, gt_dtype dtype);
    int (*test)(gt_comm *c, void *handle);
    void (*wait)(gt_comm *c, void *handle);
    /* optional (NULL: nothing to do): wait, outside the timed window, for the compute the collective
     * about to run (settle) or the started request (settle_request) is ordered after, so that the
     * time then spent inside the call is communication alone (comm_exposed_ms). NCCL: the kernels
     * queued on the compute stream before it; the MPI and local backends compute on the calling
     * thread, so they have nothing queued. */
    void (*settle)(gt_comm *c);
    void (*settle_request)(gt_comm *c, void *handle);
    void (*destroy)(gt_comm *c);   /* frees c->impl; the common part is freed by the caller */
} gt_comm_ops;

struct gt_comm {
    const char *name;
    const gt_comm_ops *ops;
    void *impl;                /* backend state */
    MPI_Comm world;            /* our duplicate of the caller's communicator, MPI_ERRORS_RETURN */
    int rank, size, local_rank, local_size;
    gt_comm_stats stats;
    gt_comm_span_fn *span_fn;  /* gt_comm_set_span_fn, NULL = none */
    void *span_ctx;
    /* MPI backend */
    size_t max_call_elems;     /* chunking limit, see gt_comm_set_max_call_elems */
    MPI_Op op_bf16_sum;        /* user op on MPI_UINT16_T holding bf16 bits */
    void *staging;             /* blocking reduce-scatters' receive buffer, grown on demand */
    size_t staging_bytes;
    uint64_t staging_held;     /* staging held now: that buffer and the started reduce-scatters' own */
    uint64_t staging_peak;     /* its high-water mark since gt_comm_stats_reset */
    /* progress thread (gt_comm_progress_start): drives MPI's progress engine while requests are in flight */
    atomic_int in_flight;      /* started requests not yet waited for */
    atomic_int progress_stop;
    atomic_ullong progress_polls;
    atomic_ullong progress_cpu_ns; /* the thread's own CPU time so far (CLOCK_THREAD_CPUTIME_ID) */
    int progress_on;
    long progress_us;
    pthread_t progress_thread;
    MPI_Comm progress_comm;    /* a duplicate of world no message is ever sent on */
};

/* Print "[rank R] file:line: what failed: <MPI error string>" and MPI_Abort(world, 1). */
void gt_mpi_fail(MPI_Comm world, int rank, int err, const char *what, const char *file, int line);
#define gt_mpi_check(c, call)                                                    \
    do {                                                                         \
        int gt_err_ = (call);                                                    \
        if (gt_err_ != MPI_SUCCESS)                                              \
            gt_mpi_fail((c)->world, (c)->rank, gt_err_, #call, __FILE__, __LINE__); \
    } while (0)

/* Fill the common part (duplicate world, ranks, local ranks). Collective over `world`. */
void gt_comm_init_common(gt_comm *c, MPI_Comm world, const char *name);
void gt_comm_free_common(gt_comm *c);

#endif
