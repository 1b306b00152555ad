/*
 * comm.h — the communicator: the collectives data parallelism needs (all-reduce, reduce-scatter,
 * all-gather, broadcast, barrier, host scalar reductions), behind one opaque handle with two
 * implementations:
 *
 *   gt_comm_create_mpi   MPI on HOST buffers (CPU backend). fp32 and bf16 (bf16 sums through a user
 *                        MPI_Op that adds in float and rounds to nearest-even once per pairwise add).
 *   gt_comm_create_nccl  NCCL on DEVICE buffers (CUDA backend), one GPU per rank; returns NULL and a
 *                        reason when it cannot run (built without CUDA, no GPU, two ranks of a node
 *                        on one GPU) — the same answer on every rank, so callers may fall back to MPI.
 *   gt_comm_create_local one rank only, any buffers: nothing to reduce, so no library is touched;
 *                        reduce-scatter and all-gather copy with the caller's copy function when not in
 *                        place. What a single-GPU run uses, so it never waits on NCCL for collectives
 *                        it does not need.
 *
 * Rules every call follows:
 *   - Every tensor collective is collective: all ranks call it, in the same order, with the same
 *     count, dtype and root. Counts are per rank and equal on all ranks (use gt_shard's padded
 *     slice_len for ZeRO slices; a count of 0 is allowed and moves nothing).
 *   - Counts are size_t: the MPI implementation splits large calls into chunks, so more than 2^31
 *     elements work. NCCL takes size_t counts natively.
 *   - Results are deterministic for a fixed world size and backend (no reordering between runs).
 *     On MPI every reduce-scatter (flat, v, started) sums each element over the ranks in rank order
 *     0..W-1, whatever the counts: reducing a range in one call or in pieces gives the same bits.
 *     NCCL sums in its own order.
 *   - A failed MPI/NCCL/CUDA call prints rank, file:line and the library's error string and aborts
 *     the whole job (MPI_Abort(world, 1)); nothing returns an error code, nothing hangs on an error.
 *   - The communicator works on a duplicate of the MPI_Comm it was given (MPI_ERRORS_RETURN set on the
 *     duplicate only), so its traffic never mixes with the caller's. Destroy it before MPI_Finalize.
 *
 * Accounting (gt_comm_stats) — the contract the metrics (`comm_bytes`) and the tests rely on.
 * With W = world size, elem = bytes per element of the dtype, and integer arithmetic:
 *   all_reduce_sum(count)           bytes_sent += 2*(W-1)*count*elem / W      (ring: reduce-scatter +
 *                                                                  all-gather; rounded down per call)
 *   reduce_scatter_sum(recv_count)  bytes_sent += (W-1)*recv_count*elem
 *   all_gather(send_count)          bytes_sent += (W-1)*send_count*elem
 *   reduce_scatter_v(counts)        bytes_sent += (total - counts[rank])*elem    (total = sum of counts:
 *                                                  a ring rank sends every block's partial sum but
 *                                                  the one it ends up owning)
 *   all_gather_v(counts)            bytes_sent += (total - counts[(rank+1) % W])*elem (a ring rank
 *                                                  forwards every block but its successor's own)
 *                                   (both equal the fixed-count formulas when all counts are equal)
 *   broadcast(bytes, root)          bytes_sent += bytes on the root when W > 1, 0 on the other ranks
 *   scalar reductions, barrier      bytes_sent += 0 (a few bytes, not tensor traffic)
 * All terms are 0 when W == 1. This is a model of what a ring algorithm sends, identical for both
 * backends, not a measurement of what the library chose to do.
 * calls_* count calls (also count-0 calls); calls_scalar counts both scalar reductions.
 * seconds is wall time (MPI_Wtime) spent inside every communicating call: the four tensor
 * collectives, the scalar reductions and the barrier (NCCL calls include the wait for the stream).
 * seconds_exposed is the part of it the calling (compute) thread spent waiting for communication to
 * finish: every blocking call whole, and gt_comm_wait; not the starts of non-blocking requests nor
 * gt_comm_test (they return without waiting). 0 when W == 1: one rank waits on no one. On NCCL the
 * kernels a collective is ordered after are waited for before the clock starts (the host runs
 * ahead of the GPU; their time is compute), in every timed call.
 * So seconds_exposed <= seconds <= seconds_total.
 */
#ifndef GT_COMM_H
#define GT_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

typedef enum { GT_DTYPE_F32, GT_DTYPE_BF16 } gt_dtype;

size_t gt_dtype_bytes(gt_dtype dtype);   /* 4 or 2 */

typedef struct gt_comm gt_comm;

gt_comm *gt_comm_create_mpi(MPI_Comm world);
gt_comm *gt_comm_create_nccl(MPI_Comm world, char *why, size_t why_len);
/* NULL with a reason when world has more than one rank. `copy` moves bytes within the buffers' memory
 * (the backend's device-to-device copy, or memcpy for host buffers). */
gt_comm *gt_comm_create_local(MPI_Comm world, void (*copy)(void *dst, const void *src, size_t bytes), char *why,
                              size_t why_len);

/* The GPU of this rank: device = local rank (among the ranks sharing this node) modulo the devices this
 * process sees, made current with cudaSetDevice. So 8 ranks on an 8-GPU node take one each, and ranks
 * that each see one GPU (Slurm --gpus-per-task=1, one container per rank) take device 0, their own.
 * The ranks of a node compare the UUIDs of the GPUs they chose; two ranks on one GPU is refused on
 * every rank with the same reason (NCCL cannot run that way, and it would halve each rank's memory).
 * Collective over world. Returns the device index, GT_CUDA_SHARED_GPU and the reason (the same on every
 * rank), or -1 and this rank's own reason: no CUDA device visible here, or a build without CUDA (the
 * caller agrees over ranks). */
#define GT_CUDA_SHARED_GPU (-2)
int gt_cuda_select_device(MPI_Comm world, char *why, size_t why_len);
/* The name the CUDA runtime gives the device gt_cuda_select_device chose ("NVIDIA H100 80GB HBM3");
 * "" before that, without a device, or in a build without CUDA. */
const char *gt_cuda_device_name(void);
void gt_comm_destroy(gt_comm *comm);      /* collective; NULL is a no-op */

int gt_comm_rank(const gt_comm *comm);
int gt_comm_size(const gt_comm *comm);
int gt_comm_local_rank(const gt_comm *comm);   /* rank among the ranks sharing this node's memory */
int gt_comm_local_size(const gt_comm *comm);
const char *gt_comm_name(const gt_comm *comm); /* "mpi" or "nccl" */

/* buf (count) := elementwise sum of every rank's buf, in place. */
void gt_comm_all_reduce_sum(gt_comm *comm, void *buf, size_t count, gt_dtype dtype);

/* send (W*recv_count) is W slices of recv_count; rank r receives into recv (recv_count) the sum over
 * ranks of slice r. In place allowed: recv == send + rank*recv_count (send is then overwritten in
 * unspecified ways outside recv). Otherwise send and recv must not overlap. */
void gt_comm_reduce_scatter_sum(gt_comm *comm, const void *send, void *recv, size_t recv_count,
                                gt_dtype dtype);

/* recv (W*send_count) := concatenation of every rank's send (send_count), in rank order.
 * In place allowed: send == recv + rank*send_count. Otherwise they must not overlap. */
void gt_comm_all_gather(gt_comm *comm, const void *send, void *recv, size_t send_count,
                        gt_dtype dtype);

/* Variable counts (ZeRO-2/3 units: a unit's range of the flat vector cut by the ranks' flat slices,
 * src/core/zero.h). counts (W entries, identical on every rank) may be 0; total = their sum, and
 * block r starts at the sum of counts[0..r). Each count and the total must fit an int (MPI; the
 * call aborts otherwise, naming the sizes): a unit is at most one block or the embedding.
 * reduce_scatter_v: send (total) from every rank; recv (counts[rank]) := the sum over ranks of
 *   block `rank`. In place allowed: recv == send + (start of block `rank`); otherwise recv must
 *   not overlap send.
 * all_gather_v: in place: on entry buf (total) holds this rank's block at its place; on return
 *   every block. */
void gt_comm_reduce_scatter_v_sum(gt_comm *comm, const void *send, void *recv, const size_t *counts,
                                  gt_dtype dtype);
void gt_comm_all_gather_v(gt_comm *comm, void *buf, const size_t *counts, gt_dtype dtype);

/* Non-blocking forms of the two (ZeRO-3 prefetch, reduce-scatters waited for later): the same
 * arguments and results, which are defined once gt_comm_wait returns. Every started request is
 * waited for exactly once (that frees it), in any order; the buffers must stay untouched until then.
 * Collective like the blocking forms: every rank starts the same requests in the same order.
 * gt_comm_test makes progress (MPI: MPI_Test; NCCL: a stream query) and says whether the request is
 * complete, without freeing it; call it while computing so transfers advance (MPI on the CPU moves
 * data only inside MPI calls). Accounting: calls and bytes_sent at start; seconds counts the time
 * spent inside start, test and wait, seconds_exposed that inside wait, seconds_total from start to the completion
 * first observed (by test or wait). MPI: MPI_Iallgatherv / MPI_Ialltoallv (the pieces summed in rank
 * order at the wait); NCCL: queued on
 * the communicator's stream after the compute already queued (an event), completion by stream query. */
typedef struct gt_comm_request gt_comm_request;
gt_comm_request *gt_comm_all_gather_v_start(gt_comm *comm, void *buf, const size_t *counts, gt_dtype dtype);
gt_comm_request *gt_comm_reduce_scatter_v_sum_start(gt_comm *comm, const void *send, void *recv,
                                                    const size_t *counts, gt_dtype dtype);
int gt_comm_test(gt_comm *comm, gt_comm_request *req);
void gt_comm_wait(gt_comm *comm, gt_comm_request *req);

/* Progress for started requests on MPI (the CPU backend): MPI moves a non-blocking collective's data
 * only inside MPI calls, and the compute thread makes them only between kernels (gt_comm_test), which
 * can be a long matrix product apart. This starts a thread that, while any request is in flight,
 * calls MPI_Iprobe on a communicator of its own every interval_us microseconds (sleeping between
 * calls, so it costs no core while idle): the library's progress engine then runs the transfers
 * while the compute thread computes. Needs MPI initialised with MPI_THREAD_MULTIPLE. Collective
 * (it duplicates the communicator). Returns 1 when the thread runs; 0 and a reason when it cannot
 * (not MPI, one rank, the thread level, interval_us <= 0). Stopped by gt_comm_destroy. */
int gt_comm_progress_start(gt_comm *comm, long interval_us, char *why, size_t why_len);
/* MPI_Iprobe calls the progress thread has made, and its CPU time so far (on a loaded machine: what it
 * took from the compute; the transfers' copies it ran are in it). 0 without the thread. */
unsigned long long gt_comm_progress_polls(const gt_comm *comm);
double gt_comm_progress_cpu_seconds(const gt_comm *comm);

/* buf (bytes) := root's buf. */
void gt_comm_broadcast(gt_comm *comm, void *buf, size_t bytes, int root);

void gt_comm_barrier(gt_comm *comm);

/* Host scalars, always over MPI (also on an NCCL communicator): loss, grad norm, signal agreement. */
double gt_comm_all_reduce_scalar_sum(gt_comm *comm, double x);
int gt_comm_all_reduce_int_max(gt_comm *comm, int x);

typedef struct {
    uint64_t calls_all_reduce, calls_reduce_scatter, calls_all_gather, calls_broadcast, calls_scalar;
    uint64_t calls_reduce_scatter_v, calls_all_gather_v;
    uint64_t bytes_sent;   /* see the model above */
    double seconds;        /* wall time inside communicating calls (blocking ones, starts, waits, tests) */
    double seconds_exposed; /* the waits alone: blocking calls and gt_comm_wait (0 when W == 1) */
    double seconds_total;  /* the collectives' whole time: blocking calls as in seconds, started
                              requests from start to completion (seconds_total - seconds is hidden) */
} gt_comm_stats;

/* A timeline of the calls (log.trace, src/core/trace.h): fn(ctx, kind, name, t0, t1, bytes) after every
 * communicating call, times in MPI_Wtime seconds. GT_COMM_SPAN_BLOCKING: a blocking call, which the
 * calling thread waited from t0 to t1; GT_COMM_SPAN_STARTED: a non-blocking collective, from its
 * start to the completion first observed (by gt_comm_test or gt_comm_wait); GT_COMM_SPAN_WAIT: the
 * calling thread in gt_comm_wait (name "wait_" and the collective's). name as the watchdog hears it
 * (all_reduce, reduce_scatter, all_gather, reduce_scatter_v, all_gather_v, broadcast, barrier,
 * all_reduce_scalar, all_reduce_int_max). fn NULL: none (the default; one test per call). */
enum { GT_COMM_SPAN_BLOCKING, GT_COMM_SPAN_STARTED, GT_COMM_SPAN_WAIT };
typedef void gt_comm_span_fn(void *ctx, int kind, const char *name, double t0, double t1, uint64_t bytes);
void gt_comm_set_span_fn(gt_comm *comm, gt_comm_span_fn *fn, void *ctx);

void gt_comm_stats_get(const gt_comm *comm, gt_comm_stats *out);
/* Also starts a new window of the staging's high-water mark (below): it drops to what is held now. */
void gt_comm_stats_reset(gt_comm *comm);

/* The host staging of the MPI reduce-scatters (comm_mpi.c): each receives the W pieces of its block
 * (rank r's contribution to this rank's elements) into a staging buffer and sums them there in rank
 * order. A blocking one (flat or v) goes in chunks of at most GT_COMM_MPI_STAGING_BYTES of staging,
 * W x min(per-rank chunk, this rank's count) elements, in one buffer kept from its first use to
 * gt_comm_destroy (gt_comm_mpi_staging_bytes: its size); a started one holds its own W x counts[rank]
 * elements from its start to its wait. Host memory outside gtrain's tracked buffers (memtrack.h): the
 * planner predicts it (staging_bytes, planner.h) and the metrics report the peak (comm_staging_bytes).
 * Bytes requested, held now and the most held since gt_comm_stats_reset; 0 on NCCL and the local
 * communicator (NCCL keeps buffers of its own on the device). */
#define GT_COMM_MPI_STAGING_BYTES ((size_t)16 << 20)
uint64_t gt_comm_staging_held_bytes(const gt_comm *comm);
uint64_t gt_comm_staging_peak_bytes(const gt_comm *comm);
/* The buffer a blocking MPI reduce-scatter of recv_count elements of elem bytes per rank stages into on
 * `world` ranks (default chunking); 0 on one rank or for 0 elements. */
size_t gt_comm_mpi_staging_bytes(int world, size_t recv_count, size_t elem);

/* For tests: the most elements one MPI call may move in total (all-reduce: count; reduce-scatter and
 * all-gather: W times the per-rank chunk; broadcast: bytes). Default GT_COMM_MPI_MAX_CALL_ELEMS;
 * a small value exercises the chunked path without 8 GiB buffers. Call on all ranks with the same
 * value. No effect on NCCL. */
#define GT_COMM_MPI_MAX_CALL_ELEMS ((size_t)1 << 26)
void gt_comm_set_max_call_elems(gt_comm *comm, size_t max_call_elems);

#endif
