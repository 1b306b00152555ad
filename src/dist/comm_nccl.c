/*
 * comm_nccl.c — the NCCL implementation of gt_comm: collectives on DEVICE buffers, one GPU per rank.
 *
 * STATUS: compiled and linked against NCCL 2.28 / CUDA 13 on a machine without a GPU; NEVER RUN ON
 * A GPU yet.
 * tests/test_comm.c exercises it (single rank) when it finds a device; until that has happened on
 * real hardware, treat this file as unverified.
 *
 * How it works:
 *   - Each rank picks GPU local_rank % device_count (local rank from MPI_COMM_TYPE_SHARED) in
 *     gt_cuda_select_device, which also compares the chosen GPUs' UUIDs over the node: NCCL refuses
 *     two ranks on one GPU, so creation returns NULL then. Ranks that each see one GPU of their own
 *     (Slurm --gpus-per-task=1) all pick their device 0, which is fine.
 *   - Whether NCCL can run is agreed over MPI first (every rank must find a GPU), so all ranks get
 *     the same answer: either all build the NCCL communicator or all return NULL with a reason.
 *   - Rank 0 makes the ncclUniqueId, MPI_Bcast hands it out, ncclCommInitRank builds the communicator.
 *   - Collectives run on a dedicated non-blocking stream with ncclSum (ncclFloat / ncclBfloat16,
 *     size_t counts: no chunking). A non-blocking stream does not wait for the legacy default stream
 *     the CUDA backend's kernels run on, so each collective first makes the stream wait (an event) for
 *     everything already queued there: the gradients or parameters it reads are complete. After each
 *     one we wait for the stream while polling ncclCommGetAsyncError, so a peer that died turns into
 *     ncclCommAbort + MPI_Abort, not a hang.
 *   - A peer that hangs (stopped, or stuck in compute) raises no async error: the rank would poll
 *     forever, until the watchdog (watchdog.h) ends the job. Before it exits, its on-fire hook aborts
 *     the communicator here (ncclCommAbort, from the watchdog's thread), so that no NCCL kernel is
 *     left spinning on a peer when the process goes. The training thread makes every NCCL call under
 *     a lock the abort takes (for at most 2 s: a thread blocked inside a call is what the abort is
 *     meant to free); after the abort it makes no NCCL call and prints nothing more: it waits for the
 *     watchdog's exit (76), so the job ends with the watchdog's one line.
 *   - Accounting, argument checks and timing live in comm_mpi.c's public wrappers, shared with MPI.
 * Without CUDA the file only provides gt_comm_create_nccl returning NULL ("built without CUDA").
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agree.h"
#include "comm_internal.h"
#include "watchdog.h"

#ifdef GTRAIN_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

typedef struct {
    ncclComm_t nccl;
    cudaStream_t stream;
    cudaEvent_t compute_done; /* recorded on the legacy default stream before each collective */
    int device;
    pthread_mutex_t lock;     /* held by the training thread around each NCCL call; taken by the abort */
    int aborted;              /* the watchdog aborted the communicator: no NCCL call any more */
} nccl_state;

static nccl_state *state(const gt_comm *c) { return c->impl; }

static char chosen_device_name[256]; /* gt_cuda_device_name */
const char *gt_cuda_device_name(void) { return chosen_device_name; }

/* After the watchdog's abort the training thread only waits for the watchdog's exit. */
static void park_if_aborted(const nccl_state *s) {
    if (!s || !__atomic_load_n(&s->aborted, __ATOMIC_ACQUIRE)) return;
    for (;;) pause();
}

/* The watchdog's on-fire hook: abort the communicator, so that the kernels waiting on a hung peer
 * end. The lock is waited for at most 2 s; a training thread holding it longer is stuck inside an
 * NCCL call, which the abort is meant to free. */
static void nccl_abort_on_hang(void *arg) {
    nccl_state *s = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    int locked = pthread_mutex_timedlock(&s->lock, &until) == 0;
    __atomic_store_n(&s->aborted, 1, __ATOMIC_RELEASE);
    if (s->nccl) ncclCommAbort(s->nccl);
    if (locked) pthread_mutex_unlock(&s->lock);
}

static void nccl_fail(gt_comm *c, const char *what, const char *err, const char *file, int line) {
    park_if_aborted(c->impl); /* the failure is the abort's doing: the watchdog reports and exits */
    fprintf(stderr, "[rank %d] %s:%d: %s failed: %s\n", c->rank, file, line, what, err);
    fflush(stderr);
    nccl_state *s = c->impl;
    if (s && s->nccl) ncclCommAbort(s->nccl);
    MPI_Abort(c->world, 1);
    abort();
}

#define ncclCheck(c, call)                                                          \
    do {                                                                            \
        nccl_state *s_ = (c)->impl;                                                 \
        pthread_mutex_lock(&s_->lock);                                              \
        park_if_aborted(s_);                                                        \
        ncclResult_t r_ = (call);                                                   \
        pthread_mutex_unlock(&s_->lock);                                            \
        if (r_ != ncclSuccess) nccl_fail((c), #call, ncclGetErrorString(r_), __FILE__, __LINE__); \
    } while (0)

#define cudaCheck(c, call)                                                          \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) nccl_fail((c), #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

static ncclDataType_t nccl_type(gt_dtype dtype) {
    return dtype == GT_DTYPE_BF16 ? ncclBfloat16 : ncclFloat;
}

/* Wait for the collective just queued; a NCCL async error (e.g. a peer died) aborts instead of
 * spinning forever. */
static void nccl_wait(gt_comm *c, const char *what) {
    nccl_state *s = state(c);
    for (;;) {
        cudaError_t e = cudaStreamQuery(s->stream);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) nccl_fail(c, what, cudaGetErrorString(e), __FILE__, __LINE__);
        ncclResult_t async = ncclSuccess;
        ncclCheck(c, ncclCommGetAsyncError(s->nccl, &async));
        if (async != ncclSuccess && async != ncclInProgress)
            nccl_fail(c, what, ncclGetErrorString(async), __FILE__, __LINE__);
    }
}

/* Order the collective after the kernels already queued on the legacy default stream (which a
 * non-blocking stream does not synchronise with): they produced the buffers it is about to read. */
static void nccl_after_compute(gt_comm *c) {
    nccl_state *s = state(c);
    cudaCheck(c, cudaEventRecord(s->compute_done, cudaStreamLegacy));
    cudaCheck(c, cudaStreamWaitEvent(s->stream, s->compute_done, 0));
}

static void nccl_all_reduce_sum(gt_comm *c, void *buf, size_t count, gt_dtype dtype) {
    nccl_state *s = state(c);
    nccl_after_compute(c);
    ncclCheck(c, ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, s->nccl, s->stream));
    nccl_wait(c, "ncclAllReduce");
}

/* NCCL's in-place convention matches ours: recv == send + rank*recv_count. */
static void nccl_reduce_scatter_sum(gt_comm *c, const void *send, void *recv, size_t recv_count,
                                    gt_dtype dtype) {
    nccl_state *s = state(c);
    nccl_after_compute(c);
    ncclCheck(c, ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), ncclSum, s->nccl, s->stream));
    nccl_wait(c, "ncclReduceScatter");
}

/* In place: send == recv + rank*send_count, as NCCL expects. */
static void nccl_all_gather(gt_comm *c, const void *send, void *recv, size_t send_count, gt_dtype dtype) {
    nccl_state *s = state(c);
    nccl_after_compute(c);
    ncclCheck(c, ncclAllGather(send, recv, send_count, nccl_type(dtype), s->nccl, s->stream));
    nccl_wait(c, "ncclAllGather");
}

static void nccl_broadcast(gt_comm *c, void *buf, size_t bytes, int root) {
    nccl_state *s = state(c);
    nccl_after_compute(c);
    ncclCheck(c, ncclBroadcast(buf, buf, bytes, ncclInt8, root, s->nccl, s->stream));
    nccl_wait(c, "ncclBroadcast");
}

/* Variable counts: NCCL has no v-collectives, so one grouped ncclReduce / ncclBroadcast per
 * rank's block (rooted at that rank) forms them; non-roots' recvbuff is unused by ncclReduce.
 * These queue the collective on the communicator's stream (after the compute queued so far); the
 * blocking forms then wait for it, the non-blocking ones record an event (nccl_started). */
static void enqueue_reduce_scatter_v_sum(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                         const size_t *displs, gt_dtype dtype) {
    nccl_state *s = state(c);
    size_t elem = gt_dtype_bytes(dtype);
    nccl_after_compute(c);
    ncclCheck(c, ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (!counts[r]) continue;
        const char *src = (const char *)send + displs[r] * elem;
        ncclCheck(c, ncclReduce(src, r == c->rank ? recv : (void *)src, counts[r], nccl_type(dtype), ncclSum, r,
                                s->nccl, s->stream));
    }
    ncclCheck(c, ncclGroupEnd());
}

static void enqueue_all_gather_v(gt_comm *c, void *buf, const size_t *counts, const size_t *displs,
                                 gt_dtype dtype) {
    nccl_state *s = state(c);
    size_t elem = gt_dtype_bytes(dtype);
    nccl_after_compute(c);
    ncclCheck(c, ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (!counts[r]) continue;
        char *block = (char *)buf + displs[r] * elem;
        ncclCheck(c, ncclBroadcast(block, block, counts[r], nccl_type(dtype), r, s->nccl, s->stream));
    }
    ncclCheck(c, ncclGroupEnd());
}

static void nccl_reduce_scatter_v_sum(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                      const size_t *displs, gt_dtype dtype) {
    enqueue_reduce_scatter_v_sum(c, send, recv, counts, displs, dtype);
    nccl_wait(c, "ncclReduce (reduce-scatter-v)");
}

static void nccl_all_gather_v(gt_comm *c, void *buf, const size_t *counts, const size_t *displs, gt_dtype dtype) {
    enqueue_all_gather_v(c, buf, counts, displs, dtype);
    nccl_wait(c, "ncclBroadcast (all-gather-v)");
}

/* Non-blocking: the v-collective is queued on the communicator's stream (after the compute queued
 * so far); an event marks its end. test queries the event (and NCCL's async error), wait polls it
 * the same way nccl_wait polls the stream, so a dead peer aborts instead of hanging. */
typedef struct {
    cudaEvent_t done;
    cudaEvent_t after; /* the compute the collective was queued after (settle_request) */
} nccl_pending;

static void *nccl_started(gt_comm *c) {
    nccl_state *s = state(c);
    nccl_pending *p = calloc(1, sizeof *p);
    if (!p) nccl_fail(c, "calloc", "out of memory", __FILE__, __LINE__);
    cudaCheck(c, cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
    cudaCheck(c, cudaEventRecord(p->done, s->stream));
    cudaCheck(c, cudaEventCreateWithFlags(&p->after, cudaEventDisableTiming));
    cudaCheck(c, cudaEventRecord(p->after, cudaStreamLegacy)); /* at the point nccl_after_compute marked */
    return p;
}

/* comm_exposed_ms: the host runs ahead of the GPU, so a wait entered while the kernels the collective
 * is ordered after still run would count their time as communication. Waiting for them first costs
 * nothing: the collective, and so the wait, cannot end before they do. */
static void nccl_settle(gt_comm *c) {
    nccl_state *s = state(c);
    cudaCheck(c, cudaEventRecord(s->compute_done, cudaStreamLegacy));
    cudaCheck(c, cudaEventSynchronize(s->compute_done));
}

static void nccl_settle_request(gt_comm *c, void *handle) {
    nccl_pending *p = handle;
    cudaCheck(c, cudaEventSynchronize(p->after));
}

static void *nccl_all_gather_v_start(gt_comm *c, void *buf, const size_t *counts, const size_t *displs,
                                     gt_dtype dtype) {
    enqueue_all_gather_v(c, buf, counts, displs, dtype);
    return nccl_started(c);
}

static void *nccl_reduce_scatter_v_sum_start(gt_comm *c, const void *send, void *recv, const size_t *counts,
                                             const size_t *displs, gt_dtype dtype) {
    enqueue_reduce_scatter_v_sum(c, send, recv, counts, displs, dtype);
    return nccl_started(c);
}

static int nccl_test(gt_comm *c, void *handle) {
    nccl_state *s = state(c);
    nccl_pending *p = handle;
    cudaError_t e = cudaEventQuery(p->done);
    if (e == cudaSuccess) return 1;
    if (e != cudaErrorNotReady) nccl_fail(c, "cudaEventQuery", cudaGetErrorString(e), __FILE__, __LINE__);
    ncclResult_t async = ncclSuccess;
    ncclCheck(c, ncclCommGetAsyncError(s->nccl, &async));
    if (async != ncclSuccess && async != ncclInProgress)
        nccl_fail(c, "NCCL request", ncclGetErrorString(async), __FILE__, __LINE__);
    return 0;
}

static void nccl_wait_request(gt_comm *c, void *handle) {
    nccl_pending *p = handle;
    while (!nccl_test(c, handle)) {
    }
    cudaCheck(c, cudaEventDestroy(p->done));
    cudaCheck(c, cudaEventDestroy(p->after));
    free(p);
}

static void nccl_destroy(gt_comm *c) {
    nccl_state *s = state(c);
    if (!s) return;
    gt_watchdog_on_fire(NULL, NULL);
    cudaCheck(c, cudaSetDevice(s->device));
    cudaCheck(c, cudaStreamSynchronize(s->stream));
    ncclCheck(c, ncclCommDestroy(s->nccl));
    s->nccl = NULL;
    cudaCheck(c, cudaStreamDestroy(s->stream));
    cudaCheck(c, cudaEventDestroy(s->compute_done));
    pthread_mutex_destroy(&s->lock);
    free(s);
    c->impl = NULL;
}

static const gt_comm_ops nccl_ops = {
    .all_reduce_sum = nccl_all_reduce_sum,
    .reduce_scatter_sum = nccl_reduce_scatter_sum,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .reduce_scatter_v_sum = nccl_reduce_scatter_v_sum,
    .all_gather_v = nccl_all_gather_v,
    .all_gather_v_start = nccl_all_gather_v_start,
    .reduce_scatter_v_sum_start = nccl_reduce_scatter_v_sum_start,
    .test = nccl_test,
    .wait = nccl_wait_request,
    .settle = nccl_settle,
    .settle_request = nccl_settle_request,
    .destroy = nccl_destroy,
};

/* One rank's choice as the other ranks of its node see it: the GPU's identity is its UUID, or where a
 * virtualised device reports none (all zero) its PCI domain, bus and device; known = 0 when neither
 * is available, and then no sharing is claimed. */
typedef struct {
    int world_rank, device;        /* device -1: none */
    int known;
    unsigned char uuid[16];
} gpu_choice;

static void format_uuid(const unsigned char *u, char *out, size_t len) {
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

int gt_cuda_select_device(MPI_Comm world, char *why, size_t why_len) {
    int rank = 0, local_rank = 0, local_size = 1;
    MPI_Comm_rank(world, &rank);
    MPI_Comm node;
    gt_node_comm(world, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);

    char reason[512] = "";
    gpu_choice mine;
    memset(&mine, 0, sizeof mine);
    mine.world_rank = rank;
    mine.device = -1;
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
        snprintf(reason, sizeof reason, "rank %d: no CUDA device is visible (%s)", rank,
                 e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        (void)cudaGetLastError();
    } else {
        int device = local_rank % devices;
        struct cudaDeviceProp prop;
        e = cudaSetDevice(device);
        if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, device);
        if (e != cudaSuccess) {
            snprintf(reason, sizeof reason, "rank %d: CUDA device %d of %d cannot be used (%s)", rank, device,
                     devices, cudaGetErrorString(e));
            (void)cudaGetLastError();
        } else {
            mine.device = device;
            snprintf(chosen_device_name, sizeof chosen_device_name, "%s", prop.name);
            memcpy(mine.uuid, prop.uuid.bytes, sizeof mine.uuid);
            static const unsigned char zero[16];
            mine.known = memcmp(mine.uuid, zero, sizeof zero) != 0;
            if (!mine.known && (prop.pciBusID || prop.pciDeviceID || prop.pciDomainID)) {
                int pci[3] = {prop.pciDomainID, prop.pciBusID, prop.pciDeviceID};
                memcpy(mine.uuid, pci, sizeof pci); /* the PCI address in the UUID's place */
                mine.uuid[15] = 0xFF;                /* never equal to a real UUID's bytes by chance */
                mine.known = 1;
            }
        }
    }

    /* the node's choices: two ranks with one UUID share a GPU */
    gpu_choice *all = calloc((size_t)local_size, sizeof *all);
    if (!all) {
        fprintf(stderr, "%s:%d: out of memory\n", __FILE__, __LINE__);
        abort();
    }
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, node);
    char share[512] = "";
    for (int a = 0; a < local_size && !share[0]; a++)
        for (int b = a + 1; b < local_size && !share[0]; b++)
            if (all[a].known && all[b].known && memcmp(all[a].uuid, all[b].uuid, 16) == 0) {
                char id[64];
                format_uuid(all[a].uuid, id, sizeof id);
                snprintf(share, sizeof share,
                         "ranks %d and %d (local ranks %d and %d of %d on one node) would share GPU %s: each "
                         "rank sees %d GPU(s) (expected one GPU per rank: at most as many ranks per node as "
                         "GPUs, or srun --gpus-per-task=1)",
                         all[a].world_rank, all[b].world_rank, a, b, local_size, id, devices);
            }
    free(all);
    MPI_Comm_free(&node);

    /* a shared GPU anywhere is refused everywhere, with the first such node's words */
    int shared = share[0] != '\0', any = 0;
    MPI_Allreduce(&shared, &any, 1, MPI_INT, MPI_MAX, world);
    if (any) {
        int size = 1, first = 0;
        MPI_Comm_size(world, &size);
        int cand = shared ? rank : size;
        MPI_Allreduce(&cand, &first, 1, MPI_INT, MPI_MIN, world);
        MPI_Bcast(share, (int)sizeof share, MPI_CHAR, first, world);
        if (why && why_len) snprintf(why, why_len, "%s", share);
        return GT_CUDA_SHARED_GPU;
    }
    if (mine.device < 0) {
        if (why && why_len) snprintf(why, why_len, "%s", reason);
        return -1;
    }
    if (why && why_len) why[0] = '\0';
    return mine.device;
}

gt_comm *gt_comm_create_nccl(MPI_Comm world, char *why, size_t why_len) {
    gt_comm *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "%s:%d: out of memory\n", __FILE__, __LINE__);
        abort();
    }
    gt_comm_init_common(c, world, "nccl");
    c->ops = &nccl_ops;

    /* Can this rank run NCCL? Agree before any rank enters ncclCommInitRank. */
    char local_why[512] = "";
    int device = gt_cuda_select_device(c->world, local_why, sizeof local_why);
    int ok = device >= 0, all_ok = 0;
    gt_mpi_check(c, MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, c->world));
    if (!all_ok) {
        /* Report the first failing rank's reason on every rank. */
        int first_bad = ok ? c->size : c->rank, bad = 0;
        gt_mpi_check(c, MPI_Allreduce(&first_bad, &bad, 1, MPI_INT, MPI_MIN, c->world));
        gt_mpi_check(c, MPI_Bcast(local_why, (int)sizeof local_why, MPI_CHAR, bad, c->world));
        if (why && why_len) snprintf(why, why_len, "%s", local_why);
        gt_comm_free_common(c);
        free(c);
        return NULL;
    }

    nccl_state *s = calloc(1, sizeof *s);
    if (!s) {
        fprintf(stderr, "%s:%d: out of memory\n", __FILE__, __LINE__);
        abort();
    }
    c->impl = s;
    s->device = device;   /* made current by gt_cuda_select_device */
    pthread_mutex_init(&s->lock, NULL);
    ncclUniqueId id;
    if (c->rank == 0) ncclCheck(c, ncclGetUniqueId(&id));
    gt_mpi_check(c, MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->world));
    ncclCheck(c, ncclCommInitRank(&s->nccl, c->size, id, c->rank));
    cudaCheck(c, cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    cudaCheck(c, cudaEventCreateWithFlags(&s->compute_done, cudaEventDisableTiming));
    gt_watchdog_on_fire(nccl_abort_on_hang, s);
    if (why && why_len) why[0] = '\0';
    return c;
}

#else /* !GTRAIN_HAVE_CUDA */

gt_comm *gt_comm_create_nccl(MPI_Comm world, char *why, size_t why_len) {
    (void)world;
    if (why && why_len) snprintf(why, why_len, "gtrain was built without CUDA, so without NCCL");
    return NULL;
}

int gt_cuda_select_device(MPI_Comm world, char *why, size_t why_len) {
    (void)world;
    if (why && why_len) snprintf(why, why_len, "gtrain was built without CUDA");
    return -1;
}

const char *gt_cuda_device_name(void) { return ""; }

#endif
