/*
 * comm_mpi.c — the public gt_comm entry points (argument checks, accounting, timing, dispatch) and the
 * MPI implementation of the collectives on host memory. See comm.h for the contract.
 *
 * How the MPI backend works:
 *   - MPI takes int counts. Every collective is cut into calls that move at most max_call_elems
 *     elements in total (default 2^26, always <= INT_MAX), so > 2^31 elements work and no library
 *     internal that multiplies count by world size can overflow.
 *       all-reduce      consecutive chunks of buf, MPI_Allreduce(MPI_IN_PLACE).
 *       all-gather      chunk [off, off+len) of every rank's slice in one MPI_Allgather: the receive
 *                       type is `len` elements resized to an extent of send_count elements, so block r
 *                       lands at recv + r*send_count + off with no copies (MPI_IN_PLACE works too).
 *       reduce-scatter  chunk [off, off+len) of every rank's piece in one MPI_Alltoall (a resized send
 *                       type reads the pieces in place) into a staging buffer of W*len elements, then
 *                       summed here in rank order (below). len is the staging chunk: W*len at most
 *                       max_call_elems and at most GT_COMM_MPI_STAGING_BYTES of staging (comm.h), so
 *                       the buffer, kept from the first reduce-scatter to gt_comm_destroy, stays small
 *                       whatever the gradient's size. The v form (blocking) goes in the same chunks of
 *                       every rank's block; a started one stages its whole W x counts[rank] elements
 *                       from its start to its wait (one request, nothing to cut it at).
 *       broadcast       consecutive byte chunks.
 *     Small calls (the common case) are one MPI call on the caller's buffers.
 *   - bf16 travels as MPI_UINT16_T with a user MPI_Op that adds in float and rounds to nearest-even.
 *     The CPU backend trains in fp32; bf16 exists here so the interface is total and a GPU build can
 *     fall back to MPI (slowly) when NCCL is unavailable.
 *   - Determinism: every reduce-scatter (flat, v, started) moves the pieces with MPI_Alltoall(v) and
 *     sums them on the receiving rank in rank order 0..W-1, one add at a time, so each element's sum
 *     depends on the world size alone, never on the counts or the cut into calls: a gradient reduced
 *     in buckets gets the bits of the one flat reduction (MPI's reduce-scatter variants promise no
 *     such thing across counts). The all-reduce (shard none) is Open MPI's: its algorithm follows
 *     (world size, message size, op), fixed for a fixed world size and count.
 *   - Errors: MPI_ERRORS_RETURN on our duplicate communicator; every call is checked and a failure
 *     aborts the job with rank, file:line and the MPI error string.
 *   - Hangs: every public wrapper tells the watchdog (watchdog.h) which collective it is in; a
 *     non-blocking one counts when started and is "in" again while waited for.
 */
#include <limits.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "comm_internal.h"
#include "watchdog.h"

#define gt_comm_abort(c, ...)                                                       \
    do {                                                                            \
        fprintf(stderr, "[rank %d] %s:%d: ", (c)->rank, __FILE__, __LINE__);        \
        fprintf(stderr, __VA_ARGS__);                                               \
        fprintf(stderr, "\n");                                                      \
        fflush(stderr);                                                             \
        MPI_Abort((c)->world, 1);                                                   \
        abort();                                                                    \
    } while (0)

void gt_mpi_fail(MPI_Comm world, int rank, int err, const char *what, const char *file, int line) {
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", err);
    msg[len < 0 ? 0 : (len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len)] = '\0';
    fprintf(stderr, "[rank %d] %s:%d: %s failed: %s\n", rank, file, line, what, msg);
    fflush(stderr);
    MPI_Abort(world, 1);
    abort();
}

size_t gt_dtype_bytes(gt_dtype dtype) {
    switch (dtype) {
    case GT_DTYPE_F32: return 4;
    case GT_DTYPE_BF16: return 2;
    }
    fprintf(stderr, "%s:%d: unknown gt_dtype %d\n", __FILE__, __LINE__, (int)dtype);
    abort();
}

/* ------------------------------------------------------------------ common part */

void gt_comm_init_common(gt_comm *c, MPI_Comm world, const char *name) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        fprintf(stderr, "%s:%d: gt_comm created before MPI_Init\n", __FILE__, __LINE__);
        abort();
    }
    c->name = name;
    c->world = world;   /* for error messages until the duplicate exists */
    MPI_Comm_rank(world, &c->rank);
    gt_mpi_check(c, MPI_Comm_dup(world, &c->world));
    gt_mpi_check(c, MPI_Comm_set_errhandler(c->world, MPI_ERRORS_RETURN));
    gt_mpi_check(c, MPI_Comm_rank(c->world, &c->rank));
    gt_mpi_check(c, MPI_Comm_size(c->world, &c->size));
    gt_mpi_check(c, gt_node_ranks(c->world, &c->local_rank, &c->local_size));
    memset(&c->stats, 0, sizeof c->stats);
    c->max_call_elems = GT_COMM_MPI_MAX_CALL_ELEMS;
    c->op_bf16_sum = MPI_OP_NULL;
    c->staging = NULL;
    c->staging_bytes = 0;
    c->staging_held = c->staging_peak = 0;
}

void gt_comm_free_common(gt_comm *c) {
    free(c->staging);
    c->staging = NULL;
    c->staging_held -= c->staging_bytes;
    c->staging_bytes = 0;
    gt_mpi_check(c, MPI_Comm_free(&c->world));
}

/* ------------------------------------------------------------------ MPI backend */

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {   /* round to nearest, ties to even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void bf16_sum_op(void *in, void *inout, int *len, MPI_Datatype *type) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static MPI_Datatype mpi_type(gt_dtype dtype) {
    return dtype == GT_DTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT;
}

static MPI_Op mpi_sum_op(const gt_comm *c, gt_dtype dtype) {
    return dtype == GT_DTYPE_BF16 ? c->op_bf16_sum : MPI_SUM;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Per-rank chunk for reduce-scatter / all-gather: W*chunk <= max_call_elems, at least 1. */
static size_t per_rank_chunk(const gt_comm *c) {
    size_t chunk = c->max_call_elems / (size_t)c->size;
    return chunk ? chunk : 1;
}

/* Per-rank chunk of a blocking reduce-scatter: also W*chunk*elem <= GT_COMM_MPI_STAGING_BYTES (the
 * staging it receives into), at least 1. */
static size_t staging_chunk(size_t max_call_elems, size_t W, size_t elem) {
    size_t limit = GT_COMM_MPI_STAGING_BYTES / elem;
    if (max_call_elems < limit) limit = max_call_elems;
    size_t chunk = limit / W;
    return chunk ? chunk : 1;
}

size_t gt_comm_mpi_staging_bytes(int world, size_t recv_count, size_t elem) {
    if (world < 2 || recv_count == 0) return 0;
    size_t chunk = staging_chunk(GT_COMM_MPI_MAX_CALL_ELEMS, (size_t)world, elem);
    return (size_t)world * (chunk < recv_count ? chunk : recv_count) * elem;
}

/* Staging held (bytes requested) and its high-water mark: gt_comm_staging_peak_bytes. */
static void staging_count(gt_comm *c, size_t add, size_t sub) {
    c->staging_held += add;
    c->staging_held -= sub;
    if (c->staging_held > c->staging_peak) c->staging_peak = c->staging_held;
}

static void mpi_all_reduce_sum(gt_comm *c, void *buf, size_t count, gt_dtype dtype) {
    size_t elem = gt_dtype_bytes(dtype);
    for (size_t off = 0; off < count; off += c->max_call_elems) {
        size_t len = min_size(c->max_call_elems, count - off);
        gt_mpi_check(c, MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)len, mpi_type(dtype),
                                      mpi_sum_op(c, dtype), c->world));
    }
}

/* staging of at least `bytes`, grown on demand (reduce-scatter receives) */
static char *staging(gt_comm *c, size_t bytes) {
    if (c->staging_bytes < bytes) {
        free(c->staging);
        staging_count(c, 0, c->staging_bytes);
        c->staging = malloc(bytes ? bytes : 1);
        if (!c->staging) gt_comm_abort(c, "out of memory for %zu bytes of reduce-scatter staging", bytes);
        c->staging_bytes = bytes;
        staging_count(c, bytes, 0);
    }
    return c->staging;
}

/* The fixed-order sum of every reduce-scatter on MPI: staging holds W blocks of len elements, block r
 * rank r's contribution; dst (len) := ((block 0 + block 1) + block 2) + ... in rank order, one add
 * at a time (bf16: rounded after each add). The order depends on nothing but the rank, so a range
 * reduced in one call or in several (gradient buckets) gets the same bits. dst must not overlap staging. */
static void sum_rank_order(void *dst, const void *stage, size_t W, size_t len, gt_dtype dtype) {
    if (dtype == GT_DTYPE_F32) {
        const float *s = stage;
        float *d = dst;
        memcpy(d, s, len * sizeof *d);
        for (size_t r = 1; r < W; r++)
            for (size_t i = 0; i < len; i++) d[i] += s[r * len + i];
    } else {
        const uint16_t *s = stage;
        uint16_t *d = dst;
        memcpy(d, s, len * sizeof *d);
        for (size_t r = 1; r < W; r++)
            for (size_t i = 0; i < len; i++) d[i] = f32_to_bf16(bf16_to_f32(d[i]) + bf16_to_f32(s[r * len + i]));
    }
}

/* Every rank sends piece r of each chunk to rank r (one MPI_Alltoall: the send type is `len` elements
 * resized to an extent of recv_count, so block r is read at send + r*recv_count + off in place), and
 * sums what it received in rank order (sum_rank_order). MPI's own reduce-scatter promises no
 * per-element order across counts; this does. In place: our chunk `off` was sent before it is
 * overwritten, and later chunks read other offsets. */
static void mpi_reduce_scatter_sum(gt_comm *c, const void *send, void *recv, size_t recv_count,
                                   gt_dtype dtype) {
    size_t elem = gt_dtype_bytes(dtype), W = (size_t)c->size;
    const char *s = send;
    if (W == 1) { /* our own piece is the sum: no staging */
        if (recv != send) memmove(recv, send, recv_count * elem);
        return;
    }
    MPI_Datatype type = mpi_type(dtype);
    size_t chunk = staging_chunk(c->max_call_elems, W, elem);
    char *stage = staging(c, W * min_size(chunk, recv_count) * elem);
    for (size_t off = 0; off < recv_count; off += chunk) {
        size_t len = min_size(chunk, recv_count - off);
        MPI_Datatype piece, strided;
        gt_mpi_check(c, MPI_Type_contiguous((int)len, type, &piece));
        gt_mpi_check(c, MPI_Type_create_resized(piece, 0, (MPI_Aint)(recv_count * elem), &strided));
        gt_mpi_check(c, MPI_Type_commit(&strided));
        gt_mpi_check(c, MPI_Alltoall(s + off * elem, 1, strided, stage, (int)len, type, c->world));
        gt_mpi_check(c, MPI_Type_free(&strided));
        gt_mpi_check(c, MPI_Type_free(&piece));
        sum_rank_order((char *)recv + off * elem, stage, W, len, dtype);
    }
}

static void mpi_all_gather(gt_comm *c, const void *send, void *recv, size_t send_count, gt_dtype dtype) {
    size_t elem = gt_dtype_bytes(dtype);
    char *r = recv;
    int in_place = (const char *)send == r + (size_t)c->rank * send_count * elem;
    MPI_Datatype type = mpi_type(dtype);
    size_t chunk = per_rank_chunk(c);

    if (send_count <= chunk) {
        gt_mpi_check(c, MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)send_count, type, recv,
                                      (int)send_count, type, c->world));
        return;
    }
    for (size_t off = 0; off < send_count; off += chunk) {
        size_t len = min_size(chunk, send_count - off);
        MPI_Datatype piece, block;   /* block: len elements, then a stride of send_count elements */
        gt_mpi_check(c, MPI_Type_contiguous((int)len, type, &piece));
        gt_mpi_check(c, MPI_Type_create_resized(piece, 0, (MPI_Aint)(send_count * elem), &block));
        gt_mpi_check(c, MPI_Type_commit(&block));
        gt_mpi_check(c, MPI_Type_free(&piece));
        /* With MPI_IN_PLACE our input is our own block of recvbuf: r + off + rank*send_count. */
        const void *sbuf = in_place ? MPI_IN_PLACE : (const void *)((const char *)send + off * elem);
        gt_mpi_check(c, MPI_Allgather(sbuf, (int)len, type, r + off * elem, 1, block, c->world));
        gt_mpi_check(c, MPI_Type_free(&block));
    }
}

/* int counts and displacements for the v-collectives (the wrapper checked they fit). */
static void int_counts(const gt_comm *c, const size_t *counts, const size_t *displs, int *ic, int *id) {
    for (int r = 0; r < c->size; r++) {
        ic[r] = (int)counts[r];
        if (id) id[r] = (int)displs[r];
    }
}

/* The alltoallv arguments of a v reduce-scatter: block r of send (counts[r] at displs[r]) goes to rank
 * r; from every rank we receive our block's counts[rank] elements, rank r's at r*counts[rank]. */
static void v_alltoall_ints(const gt_comm *c, const size_t *counts, const size_t *displs, int *ic) {
    int W = c->size, own = (int)counts[c->rank];
    for (int r = 0; r < W; r++) {
        ic[r] = (int)counts[r];
        ic[W + r] = (int)displs[r];
        ic[2 * W + r] = own;
        ic[3 * W + r] = r * own;
    }
}

/* As mpi_reduce_scatter_sum: the pieces travel (MPI_Alltoallv) and are summed in rank order here, in
 * the chunks of the flat form: call k moves elements [k*chunk, (k+1)*chunk) of every rank's block (as
 * many calls on every rank: the largest block's), so the staging is W x min(chunk, own) elements. In
 * place as there: our block's chunk k was sent before it is overwritten. */
static void mpi_reduce_scatter_v_sum(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                     const size_t *displs, gt_dtype dtype) {
    size_t elem = gt_dtype_bytes(dtype), W = (size_t)c->size, own = counts[c->rank], most = 0;
    if (W == 1) { /* our own block is the sum: no staging */
        memmove(recv, (const char *)send + displs[0] * elem, own * elem);
        return;
    }
    int *ic = malloc(4 * W * sizeof *ic);
    if (!ic) gt_comm_abort(c, "out of memory");
    for (size_t r = 0; r < W; r++) most = counts[r] > most ? counts[r] : most;
    size_t chunk = staging_chunk(c->max_call_elems, W, elem);
    char *stage = staging(c, W * min_size(chunk, own) * elem);
    MPI_Datatype type = mpi_type(dtype);
    for (size_t off = 0; off < most; off += chunk) {
        size_t len = own > off ? min_size(chunk, own - off) : 0;
        for (size_t r = 0; r < W; r++) {
            ic[r] = (int)(counts[r] > off ? min_size(chunk, counts[r] - off) : 0);
            ic[W + r] = (int)(displs[r] + (counts[r] > off ? off : 0));
            ic[2 * W + r] = (int)len;
            ic[3 * W + r] = (int)(r * len);
        }
        gt_mpi_check(c, MPI_Alltoallv(send, ic, ic + W, type, stage, ic + 2 * W, ic + 3 * W, type, c->world));
        if (len) sum_rank_order((char *)recv + off * elem, stage, W, len, dtype);
    }
    free(ic);
}

static void mpi_all_gather_v(gt_comm *c, void *buf, const size_t *counts, const size_t *displs, gt_dtype dtype) {
    int *ic = malloc(2 * (size_t)c->size * sizeof *ic);
    if (!ic) gt_comm_abort(c, "out of memory");
    int_counts(c, counts, displs, ic, ic + c->size);
    MPI_Datatype type = mpi_type(dtype);
    gt_mpi_check(c, MPI_Allgatherv(MPI_IN_PLACE, 0, type, buf, ic, ic + c->size, type, c->world));
    free(ic);
}

/* A started MPI v-collective: its int arrays live until the wait; a reduce-scatter's received pieces
 * (stage, W x len) are summed into sum_to in rank order once complete. */
typedef struct {
    MPI_Request req;
    int *ints;
    char *stage, *sum_to;
    size_t W, len;
    gt_dtype dtype;
} mpi_pending;

static void *mpi_all_gather_v_start(gt_comm *c, void *buf, const size_t *counts, const size_t *displs,
                                    gt_dtype dtype) {
    mpi_pending *p = calloc(1, sizeof *p);
    int *ic = malloc(2 * (size_t)c->size * sizeof *ic);
    if (!p || !ic) gt_comm_abort(c, "out of memory");
    int_counts(c, counts, displs, ic, ic + c->size);
    p->ints = ic;
    MPI_Datatype type = mpi_type(dtype);
    gt_mpi_check(c, MPI_Iallgatherv(MPI_IN_PLACE, 0, type, buf, ic, ic + c->size, type, c->world, &p->req));
    return p;
}

static void *mpi_reduce_scatter_v_sum_start(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                            const size_t *displs, gt_dtype dtype) {
    size_t elem = gt_dtype_bytes(dtype), W = (size_t)c->size, own = counts[c->rank];
    if (W == 1) { /* our own block is the sum, complete at once: no staging, nothing in flight */
        mpi_pending *p = calloc(1, sizeof *p);
        if (!p) gt_comm_abort(c, "out of memory");
        memmove(recv, (const char *)send + displs[0] * elem, own * elem);
        p->req = MPI_REQUEST_NULL;
        return p;
    }
    mpi_pending *p = calloc(1, sizeof *p);
    int *ic = malloc(4 * (size_t)c->size * sizeof *ic);
    size_t stage_bytes = W * own * elem;
    char *stage = malloc(stage_bytes > 0 ? stage_bytes : 1);
    if (!p || !ic || !stage) gt_comm_abort(c, "out of memory");
    v_alltoall_ints(c, counts, displs, ic);
    p->ints = ic;
    p->stage = stage;
    p->sum_to = recv;
    p->W = W;
    p->len = own;
    p->dtype = dtype;
    staging_count(c, stage_bytes, 0); /* held to the wait */
    MPI_Datatype type = mpi_type(dtype);
    gt_mpi_check(c, MPI_Ialltoallv(send, ic, ic + W, type, stage, ic + 2 * W, ic + 3 * W, type, c->world, &p->req));
    return p;
}

static int mpi_test(gt_comm *c, void *handle) {
    mpi_pending *p = handle;
    int done = 0;
    if (p->req == MPI_REQUEST_NULL) return 1;
    gt_mpi_check(c, MPI_Test(&p->req, &done, MPI_STATUS_IGNORE));
    return done;
}

static void mpi_wait(gt_comm *c, void *handle) {
    mpi_pending *p = handle;
    if (p->req != MPI_REQUEST_NULL) gt_mpi_check(c, MPI_Wait(&p->req, MPI_STATUS_IGNORE));
    if (p->len) sum_rank_order(p->sum_to, p->stage, p->W, p->len, p->dtype);
    if (p->stage) staging_count(c, 0, p->W * p->len * gt_dtype_bytes(p->dtype));
    free(p->stage);
    free(p->ints);
    free(p);
}

static void mpi_broadcast(gt_comm *c, void *buf, size_t bytes, int root) {
    for (size_t off = 0; off < bytes; off += c->max_call_elems) {
        size_t len = min_size(c->max_call_elems, bytes - off);
        gt_mpi_check(c, MPI_Bcast((char *)buf + off, (int)len, MPI_BYTE, root, c->world));
    }
}

static void mpi_destroy(gt_comm *c) {
    if (c->op_bf16_sum != MPI_OP_NULL) gt_mpi_check(c, MPI_Op_free(&c->op_bf16_sum));
}

static const gt_comm_ops mpi_ops = {
    .all_reduce_sum = mpi_all_reduce_sum,
    .reduce_scatter_sum = mpi_reduce_scatter_sum,
    .all_gather = mpi_all_gather,
    .broadcast = mpi_broadcast,
    .reduce_scatter_v_sum = mpi_reduce_scatter_v_sum,
    .all_gather_v = mpi_all_gather_v,
    .all_gather_v_start = mpi_all_gather_v_start,
    .reduce_scatter_v_sum_start = mpi_reduce_scatter_v_sum_start,
    .test = mpi_test,
    .wait = mpi_wait,
    .destroy = mpi_destroy,
};

gt_comm *gt_comm_create_mpi(MPI_Comm world) {
    gt_comm *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "%s:%d: out of memory\n", __FILE__, __LINE__);
        abort();
    }
    gt_comm_init_common(c, world, "mpi");
    c->ops = &mpi_ops;
    gt_mpi_check(c, MPI_Op_create(bf16_sum_op, 1, &c->op_bf16_sum));
    return c;
}

void gt_comm_set_max_call_elems(gt_comm *c, size_t max_call_elems) {
    if (max_call_elems == 0) max_call_elems = 1;
    if (max_call_elems > INT_MAX) max_call_elems = INT_MAX;
    c->max_call_elems = max_call_elems;
}

/* ------------------------------------------------------------------ public wrappers */

int gt_comm_rank(const gt_comm *c) { return c->rank; }
int gt_comm_size(const gt_comm *c) { return c->size; }
int gt_comm_local_rank(const gt_comm *c) { return c->local_rank; }
int gt_comm_local_size(const gt_comm *c) { return c->local_size; }
const char *gt_comm_name(const gt_comm *c) { return c->name; }

/* The progress thread: between sleeps, while a request is in flight, one MPI_Iprobe on a communicator
 * nothing is sent on; Open MPI runs its progress engine (the started collectives' schedules and the
 * transports' copies) inside it. */
static void *progress_main(void *arg) {
    gt_comm *c = arg;
    struct timespec ts = {c->progress_us / 1000000, (c->progress_us % 1000000) * 1000};
    while (!atomic_load_explicit(&c->progress_stop, memory_order_relaxed)) {
        if (atomic_load_explicit(&c->in_flight, memory_order_relaxed) > 0) {
            int flag = 0;
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c->progress_comm, &flag, MPI_STATUS_IGNORE);
            atomic_fetch_add_explicit(&c->progress_polls, 1, memory_order_relaxed);
            struct timespec cpu;
            if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
                atomic_store_explicit(&c->progress_cpu_ns, (unsigned long long)cpu.tv_sec * 1000000000ull +
                                      (unsigned long long)cpu.tv_nsec, memory_order_relaxed);
        }
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int gt_comm_progress_start(gt_comm *c, long interval_us, char *why, size_t why_len) {
    int level = MPI_THREAD_SINGLE;
    const char *no = NULL;
    if (c->ops != &mpi_ops) no = "not the MPI backend (NCCL progresses on the GPU; one rank has nothing in flight)";
    else if (c->size < 2) no = "one rank: nothing is ever in flight";
    else if (interval_us <= 0) no = "off";
    else if (MPI_Query_thread(&level) != MPI_SUCCESS || level < MPI_THREAD_MULTIPLE)
        no = "MPI was not initialised with MPI_THREAD_MULTIPLE";
    if (no || c->progress_on) {
        if (why && why_len) snprintf(why, why_len, "%s", no ? no : "already running");
        return c->progress_on;
    }
    gt_mpi_check(c, MPI_Comm_dup(c->world, &c->progress_comm));
    c->progress_us = interval_us;
    atomic_store(&c->progress_stop, 0);
    if (pthread_create(&c->progress_thread, NULL, progress_main, c) != 0) {
        gt_mpi_check(c, MPI_Comm_free(&c->progress_comm));
        if (why && why_len) snprintf(why, why_len, "pthread_create failed");
        return 0;
    }
    c->progress_on = 1;
    if (why && why_len) why[0] = '\0';
    return 1;
}

unsigned long long gt_comm_progress_polls(const gt_comm *c) { return atomic_load(&c->progress_polls); }
double gt_comm_progress_cpu_seconds(const gt_comm *c) { return (double)atomic_load(&c->progress_cpu_ns) * 1e-9; }

void gt_comm_destroy(gt_comm *c) {
    if (!c) return;
    if (c->progress_on) {
        atomic_store(&c->progress_stop, 1);
        pthread_join(c->progress_thread, NULL);
        gt_mpi_check(c, MPI_Comm_free(&c->progress_comm));
        c->progress_on = 0;
    }
    c->ops->destroy(c);
    gt_comm_free_common(c);
    free(c);
}

/* The compute the call is ordered after, waited for before the clock starts (comm_internal.h). */
static void settle(gt_comm *c) {
    if (c->ops->settle) c->ops->settle(c);
}

/* A blocking call's time: the compute thread waited all of it (seconds, seconds_exposed) and it is the
 * collective's whole time (seconds_total). One rank waits on no one: its exposed time stays 0. */
static void account_blocking(gt_comm *c, double dt) {
    c->stats.seconds += dt;
    c->stats.seconds_total += dt;
    if (c->size > 1) c->stats.seconds_exposed += dt;
}

static void span(gt_comm *c, int kind, const char *name, double t0, double t1, uint64_t bytes) {
    if (c->span_fn) c->span_fn(c->span_ctx, kind, name, t0, t1, bytes);
}

/* A blocking call from t0 to now: accounted, and drawn when a timeline listens. */
static void blocking_done(gt_comm *c, const char *name, double t0, uint64_t bytes) {
    double t1 = MPI_Wtime();
    account_blocking(c, t1 - t0);
    span(c, GT_COMM_SPAN_BLOCKING, name, t0, t1, bytes);
}

void gt_comm_set_span_fn(gt_comm *c, gt_comm_span_fn *fn, void *ctx) {
    c->span_fn = fn;
    c->span_ctx = ctx;
}

/* Ring model of comm.h; every term is 0 for W == 1. */
static uint64_t ring_bytes(const gt_comm *c, uint64_t per_step_bytes) {
    return (uint64_t)(c->size - 1) * per_step_bytes;
}

void gt_comm_all_reduce_sum(gt_comm *c, void *buf, size_t count, gt_dtype dtype) {
    uint64_t bytes = (uint64_t)count * gt_dtype_bytes(dtype);
    gt_watchdog_enter("all_reduce", bytes);
    settle(c);
    double t0 = MPI_Wtime();
    if (count > 0) c->ops->all_reduce_sum(c, buf, count, dtype);
    blocking_done(c, "all_reduce", t0, bytes);
    gt_watchdog_leave();
    c->stats.calls_all_reduce++;
    c->stats.bytes_sent += 2 * ring_bytes(c, bytes) / (uint64_t)c->size;
}

void gt_comm_reduce_scatter_sum(gt_comm *c, const void *send, void *recv, size_t recv_count,
                                gt_dtype dtype) {
    uint64_t bytes = (uint64_t)recv_count * gt_dtype_bytes(dtype);
    gt_watchdog_enter("reduce_scatter", bytes);
    settle(c);
    double t0 = MPI_Wtime();
    if (recv_count > 0) c->ops->reduce_scatter_sum(c, send, recv, recv_count, dtype);
    blocking_done(c, "reduce_scatter", t0, bytes);
    gt_watchdog_leave();
    c->stats.calls_reduce_scatter++;
    c->stats.bytes_sent += ring_bytes(c, bytes);
}

void gt_comm_all_gather(gt_comm *c, const void *send, void *recv, size_t send_count, gt_dtype dtype) {
    uint64_t bytes = (uint64_t)send_count * gt_dtype_bytes(dtype);
    gt_watchdog_enter("all_gather", bytes);
    settle(c);
    double t0 = MPI_Wtime();
    if (send_count > 0) c->ops->all_gather(c, send, recv, send_count, dtype);
    blocking_done(c, "all_gather", t0, bytes);
    gt_watchdog_leave();
    c->stats.calls_all_gather++;
    c->stats.bytes_sent += ring_bytes(c, bytes);
}

/* Displacements of the v-collectives, and the total; aborts when MPI's int cannot carry them. */
static size_t v_layout(gt_comm *c, const size_t *counts, size_t *displs) {
    size_t total = 0;
    for (int r = 0; r < c->size; r++) {
        displs[r] = total;
        total += counts[r];
    }
    if (total > INT_MAX)
        gt_comm_abort(c, "variable-count collective of %zu elements: more than an int carries", total);
    return total;
}

void gt_comm_reduce_scatter_v_sum(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                  gt_dtype dtype) {
    size_t *displs = malloc((size_t)c->size * sizeof *displs);
    if (!displs) gt_comm_abort(c, "out of memory");
    size_t total = v_layout(c, counts, displs), elem = gt_dtype_bytes(dtype);
    gt_watchdog_enter("reduce_scatter_v", total * elem);
    settle(c);
    double t0 = MPI_Wtime();
    if (total > 0) c->ops->reduce_scatter_v_sum(c, send, recv, counts, displs, dtype);
    blocking_done(c, "reduce_scatter_v", t0, total * elem);
    gt_watchdog_leave();
    c->stats.calls_reduce_scatter_v++;
    c->stats.bytes_sent += (uint64_t)(total - counts[c->rank]) * elem;
    free(displs);
}

void gt_comm_all_gather_v(gt_comm *c, void *buf, const size_t *counts, gt_dtype dtype) {
    size_t *displs = malloc((size_t)c->size * sizeof *displs);
    if (!displs) gt_comm_abort(c, "out of memory");
    size_t total = v_layout(c, counts, displs), elem = gt_dtype_bytes(dtype);
    gt_watchdog_enter("all_gather_v", total * elem);
    settle(c);
    double t0 = MPI_Wtime();
    if (total > 0) c->ops->all_gather_v(c, buf, counts, displs, dtype);
    blocking_done(c, "all_gather_v", t0, total * elem);
    gt_watchdog_leave();
    c->stats.calls_all_gather_v++;
    c->stats.bytes_sent += (uint64_t)(total - counts[(c->rank + 1) % c->size]) * elem;
    free(displs);
}

struct gt_comm_request {
    void *handle;       /* the backend's, NULL for a request that moved nothing */
    double t_start;
    int done;           /* completion observed (seconds_total counted) */
    const char *op;     /* what a wait waits for, for the watchdog: "wait_" and the collective */
    uint64_t seq;
    uint64_t bytes;     /* for a timeline (gt_comm_set_span_fn) */
};

static gt_comm_request *request_new(void) {
    gt_comm_request *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "%s:%d: out of memory\n", __FILE__, __LINE__);
        abort();
    }
    r->t_start = MPI_Wtime();
    return r;
}

gt_comm_request *gt_comm_all_gather_v_start(gt_comm *c, void *buf, const size_t *counts, gt_dtype dtype) {
    size_t *displs = malloc((size_t)c->size * sizeof *displs);
    if (!displs) gt_comm_abort(c, "out of memory");
    size_t total = v_layout(c, counts, displs), elem = gt_dtype_bytes(dtype);
    gt_comm_request *r = request_new();
    r->op = "wait_all_gather_v";
    r->seq = gt_watchdog_started("all_gather_v", total * elem);
    r->bytes = total * elem;
    double t0 = MPI_Wtime();
    if (total > 0) r->handle = c->ops->all_gather_v_start(c, buf, counts, displs, dtype);
    if (r->handle) atomic_fetch_add(&c->in_flight, 1);
    c->stats.seconds += MPI_Wtime() - t0; /* seconds_total counts from r->t_start at completion */
    c->stats.calls_all_gather_v++;
    c->stats.bytes_sent += (uint64_t)(total - counts[(c->rank + 1) % c->size]) * elem;
    free(displs);
    return r;
}

gt_comm_request *gt_comm_reduce_scatter_v_sum_start(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                                    gt_dtype dtype) {
    size_t *displs = malloc((size_t)c->size * sizeof *displs);
    if (!displs) gt_comm_abort(c, "out of memory");
    size_t total = v_layout(c, counts, displs), elem = gt_dtype_bytes(dtype);
    gt_comm_request *r = request_new();
    r->op = "wait_reduce_scatter_v";
    r->seq = gt_watchdog_started("reduce_scatter_v", total * elem);
    r->bytes = total * elem;
    double t0 = MPI_Wtime();
    if (total > 0) r->handle = c->ops->reduce_scatter_v_sum_start(c, send, recv, counts, displs, dtype);
    if (r->handle) atomic_fetch_add(&c->in_flight, 1);
    c->stats.seconds += MPI_Wtime() - t0;
    c->stats.calls_reduce_scatter_v++;
    c->stats.bytes_sent += (uint64_t)(total - counts[c->rank]) * elem;
    free(displs);
    return r;
}

int gt_comm_test(gt_comm *c, gt_comm_request *r) {
    if (r->done) return 1;
    double t0 = MPI_Wtime();
    int done = !r->handle || c->ops->test(c, r->handle);
    double t1 = MPI_Wtime();
    c->stats.seconds += t1 - t0;
    if (done) {
        r->done = 1;
        c->stats.seconds_total += t1 - r->t_start;
        span(c, GT_COMM_SPAN_STARTED, r->op + 5, r->t_start, t1, r->bytes);
    }
    return done;
}

void gt_comm_wait(gt_comm *c, gt_comm_request *r) {
    gt_watchdog_enter_wait(r->op, r->seq);
    if (r->handle && c->ops->settle_request) c->ops->settle_request(c, r->handle);
    double t0 = MPI_Wtime();
    if (r->handle) c->ops->wait(c, r->handle);
    double t1 = MPI_Wtime();
    if (r->handle) atomic_fetch_sub(&c->in_flight, 1);
    /* the compute thread waits here; a request seen complete by a test adds only this call's time to
     * the total, so that seconds_exposed <= seconds <= seconds_total holds */
    if (r->done) account_blocking(c, t1 - t0);
    else {
        c->stats.seconds += t1 - t0;
        if (c->size > 1) c->stats.seconds_exposed += t1 - t0;
        c->stats.seconds_total += t1 - r->t_start;
        span(c, GT_COMM_SPAN_STARTED, r->op + 5, r->t_start, t1, r->bytes);
    }
    span(c, GT_COMM_SPAN_WAIT, r->op, t0, t1, r->bytes);
    gt_watchdog_leave();
    free(r);
}

void gt_comm_broadcast(gt_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) gt_comm_abort(c, "broadcast root %d outside [0, %d)", root, c->size);
    gt_watchdog_enter("broadcast", bytes);
    settle(c);
    double t0 = MPI_Wtime();
    if (bytes > 0) c->ops->broadcast(c, buf, bytes, root);
    blocking_done(c, "broadcast", t0, bytes);
    gt_watchdog_leave();
    c->stats.calls_broadcast++;
    if (c->rank == root && c->size > 1) c->stats.bytes_sent += bytes;
}

void gt_comm_barrier(gt_comm *c) {
    gt_watchdog_enter("barrier", 0);
    double t0 = MPI_Wtime();
    gt_mpi_check(c, MPI_Barrier(c->world));
    blocking_done(c, "barrier", t0, 0);
    gt_watchdog_leave();
}

double gt_comm_all_reduce_scalar_sum(gt_comm *c, double x) {
    gt_watchdog_enter("all_reduce_scalar", sizeof x);
    double y = 0.0, t0 = MPI_Wtime();
    gt_mpi_check(c, MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, c->world));
    blocking_done(c, "all_reduce_scalar", t0, sizeof x);
    gt_watchdog_leave();
    c->stats.calls_scalar++;
    return y;
}

int gt_comm_all_reduce_int_max(gt_comm *c, int x) {
    int y = 0;
    gt_watchdog_enter("all_reduce_int_max", sizeof x);
    double t0 = MPI_Wtime();
    gt_mpi_check(c, MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_MAX, c->world));
    blocking_done(c, "all_reduce_int_max", t0, sizeof x);
    gt_watchdog_leave();
    c->stats.calls_scalar++;
    return y;
}

void gt_comm_stats_get(const gt_comm *c, gt_comm_stats *out) { *out = c->stats; }
void gt_comm_stats_reset(gt_comm *c) {
    memset(&c->stats, 0, sizeof c->stats);
    c->staging_peak = c->staging_held;
}
uint64_t gt_comm_staging_held_bytes(const gt_comm *c) { return c->staging_held; }
uint64_t gt_comm_staging_peak_bytes(const gt_comm *c) { return c->staging_peak; }
