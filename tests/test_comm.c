/*
 * test_comm — every gt_comm collective against arithmetic truth, run under mpiexec with 1..4 ranks.
 *
 * Values are small integers, so fp32 and bf16 sums are exact and the check is equality. Covered per
 * dtype (fp32, bf16) and count (0, 1, uneven sizes): all-reduce, reduce-scatter (also in place),
 * all-gather (also in place), broadcast from every root; then the same again with tiny MPI chunk
 * limits (1, 3, 7, 64 elements per call) so the chunked path for > 2^31 elements runs without 8 GiB
 * buffers; then the accounting contract of comm.h (call counts, bytes_sent formulas) and the scalar
 * reductions; the variable-count collectives of ZeRO-2/3 (uneven and zero counts, in place, their
 * bytes_sent). If gt_comm_create_nccl gives a communicator (a GPU build on a GPU, one rank per GPU),
 * the same checks run on device buffers; otherwise its reason is printed. The local communicator
 * (one rank, no library) runs the same checks on one rank, on host buffers and, with a GPU, on device
 * buffers; on more ranks it must refuse with a reason.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "comm.h"

#ifdef GTRAIN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static int rank, world;
#include "check.h"

/* ------------------------------------------------------------------ memory: host or device */

typedef struct {
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    void (*upload)(void *dst, const void *host, size_t bytes);
    void (*download)(void *host, const void *src, size_t bytes);
} mem_ops;

static void *host_alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }
static void host_release(void *p) { free(p); }
static void host_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static const mem_ops host_mem = {host_alloc, host_release, host_copy, host_copy};

#ifdef GTRAIN_HAVE_CUDA
static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "[rank %d] %s: %s\n", rank, what, cudaGetErrorString(e));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}
static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    cuda_ok(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return p;
}
static void dev_release(void *p) { cuda_ok(cudaFree(p), "cudaFree"); }
static void dev_upload(void *dst, const void *host, size_t bytes) {
    cuda_ok(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
static void dev_download(void *host, const void *src, size_t bytes) {
    cuda_ok(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
static void dev_copy(void *dst, const void *src, size_t bytes) {
    cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
}
static const mem_ops dev_mem = {dev_alloc, dev_release, dev_upload, dev_download};
#endif

/* ------------------------------------------------------------------ values */

/* Element i of rank r's input: small integers, distinct per rank, exact in bf16 (< 256) when summed
 * over 4 ranks. */
static float value(gt_dtype dt, int r, size_t i) {
    return dt == GT_DTYPE_BF16 ? (float)(r + 1) + (float)(i % 7) : (float)(r + 1) * 1000.0f + (float)(i % 997);
}

static void put(void *buf, gt_dtype dt, size_t i, float v) {
    if (dt == GT_DTYPE_F32) {
        ((float *)buf)[i] = v;
    } else {
        uint32_t u;
        memcpy(&u, &v, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);   /* exact for our small integers */
    }
}

static float get(const void *buf, gt_dtype dt, size_t i) {
    if (dt == GT_DTYPE_F32) return ((const float *)buf)[i];
    uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static float sum_over_ranks(gt_dtype dt, size_t i) {
    float s = 0.0f;
    for (int r = 0; r < world; r++) s += value(dt, r, i);
    return s;
}

static const char *dtname(gt_dtype dt) { return dt == GT_DTYPE_F32 ? "f32" : "bf16"; }

/* ------------------------------------------------------------------ collective checks */

static void check_all_reduce(gt_comm *c, const mem_ops *m, gt_dtype dt, size_t count) {
    size_t elem = gt_dtype_bytes(dt);
    char *h = malloc(count * elem + 1);
    void *d = m->alloc(count * elem);
    for (size_t i = 0; i < count; i++) put(h, dt, i, value(dt, rank, i));
    m->upload(d, h, count * elem);
    gt_comm_all_reduce_sum(c, d, count, dt);
    m->download(h, d, count * elem);
    for (size_t i = 0; i < count; i++)
        CHECK(get(h, dt, i) == sum_over_ranks(dt, i), "all_reduce %s count %zu [%zu] = %g want %g", dtname(dt),
              count, i, get(h, dt, i), sum_over_ranks(dt, i));
    m->release(d);
    free(h);
}

static void check_reduce_scatter(gt_comm *c, const mem_ops *m, gt_dtype dt, size_t rc, int in_place) {
    size_t elem = gt_dtype_bytes(dt), n = rc * (size_t)world;
    char *h = malloc(n * elem + 1);
    void *send = m->alloc(n * elem);
    void *recv = in_place ? (char *)send + (size_t)rank * rc * elem : m->alloc(rc * elem);
    for (size_t i = 0; i < n; i++) put(h, dt, i, value(dt, rank, i));
    m->upload(send, h, n * elem);
    gt_comm_reduce_scatter_sum(c, send, recv, rc, dt);
    m->download(h, recv, rc * elem);
    for (size_t i = 0; i < rc; i++) {
        float want = sum_over_ranks(dt, (size_t)rank * rc + i);
        CHECK(get(h, dt, i) == want, "reduce_scatter %s%s rc %zu [%zu] = %g want %g", dtname(dt),
              in_place ? " in place" : "", rc, i, get(h, dt, i), want);
    }
    if (!in_place) m->release(recv);
    m->release(send);
    free(h);
}

static void check_all_gather(gt_comm *c, const mem_ops *m, gt_dtype dt, size_t sc, int in_place) {
    size_t elem = gt_dtype_bytes(dt), n = sc * (size_t)world;
    char *h = malloc(n * elem + 1);
    void *recv = m->alloc(n * elem);
    void *send = in_place ? (char *)recv + (size_t)rank * sc * elem : m->alloc(sc * elem);
    for (size_t i = 0; i < n; i++) put(h, dt, i, -1.0f);   /* garbage outside our own block */
    for (size_t i = 0; i < sc; i++) put(h, dt, in_place ? (size_t)rank * sc + i : i, value(dt, rank, i));
    if (in_place) {
        m->upload(recv, h, n * elem);
    } else {
        m->upload(send, h, sc * elem);
        for (size_t i = 0; i < n; i++) put(h, dt, i, -1.0f);
        m->upload(recv, h, n * elem);
    }
    gt_comm_all_gather(c, send, recv, sc, dt);
    m->download(h, recv, n * elem);
    for (int r = 0; r < world; r++)
        for (size_t i = 0; i < sc; i++)
            CHECK(get(h, dt, (size_t)r * sc + i) == value(dt, r, i), "all_gather %s%s sc %zu block %d [%zu] = %g want %g",
                  dtname(dt), in_place ? " in place" : "", sc, r, i, get(h, dt, (size_t)r * sc + i), value(dt, r, i));
    if (!in_place) m->release(send);
    m->release(recv);
    free(h);
}

static unsigned char byte_of(int r, size_t b, int root) { return (unsigned char)(r * 31 + b * 7 + (size_t)root); }

static void check_broadcast(gt_comm *c, const mem_ops *m, size_t bytes, int root) {
    unsigned char *h = malloc(bytes + 1);
    void *d = m->alloc(bytes);
    for (size_t b = 0; b < bytes; b++) h[b] = byte_of(rank, b, root);
    m->upload(d, h, bytes);
    gt_comm_broadcast(c, d, bytes, root);
    m->download(h, d, bytes);
    for (size_t b = 0; b < bytes; b++)
        CHECK(h[b] == byte_of(root, b, root), "broadcast %zu bytes root %d [%zu]", bytes, root, b);
    m->release(d);
    free(h);
}

static const size_t counts[] = {0, 1, 2, 5, 17, 1000, 4099};
#define N_COUNTS (sizeof counts / sizeof counts[0])

/* Variable counts (ZeRO-2/3 units): counts[r] = base + r*step, possibly 0 for some ranks. */
static void v_counts(size_t base, size_t step, size_t *counts, size_t *displs, size_t *total) {
    *total = 0;
    for (int r = 0; r < world; r++) {
        counts[r] = (base + (size_t)r * step) % 23;
        displs[r] = *total;
        *total += counts[r];
    }
}

static void check_reduce_scatter_v(gt_comm *c, const mem_ops *m, gt_dtype dt, size_t base, size_t step,
                                   int in_place) {
    size_t counts[64], displs[64], n, elem = gt_dtype_bytes(dt);
    v_counts(base, step, counts, displs, &n);
    char *h = malloc(n * elem + 1);
    void *send = m->alloc(n * elem);
    void *recv = in_place ? (char *)send + displs[rank] * elem : m->alloc(counts[rank] * elem);
    for (size_t i = 0; i < n; i++) put(h, dt, i, value(dt, rank, i));
    m->upload(send, h, n * elem);
    gt_comm_reduce_scatter_v_sum(c, send, recv, counts, dt);
    m->download(h, recv, counts[rank] * elem);
    for (size_t i = 0; i < counts[rank]; i++) {
        float want = sum_over_ranks(dt, displs[rank] + i);
        CHECK(get(h, dt, i) == want, "reduce_scatter_v %s%s base %zu step %zu [%zu] = %g want %g", dtname(dt),
              in_place ? " in place" : "", base, step, i, get(h, dt, i), want);
    }
    if (!in_place) m->release(recv);
    m->release(send);
    free(h);
}

static void check_all_gather_v(gt_comm *c, const mem_ops *m, gt_dtype dt, size_t base, size_t step) {
    size_t counts[64], displs[64], n, elem = gt_dtype_bytes(dt);
    v_counts(base, step, counts, displs, &n);
    char *h = malloc(n * elem + 1);
    void *buf = m->alloc(n * elem);
    for (size_t i = 0; i < n; i++) put(h, dt, i, -1.0f); /* others' blocks: garbage until gathered */
    for (size_t i = 0; i < counts[rank]; i++) put(h, dt, displs[rank] + i, value(dt, rank, i));
    m->upload(buf, h, n * elem);
    gt_comm_all_gather_v(c, buf, counts, dt);
    m->download(h, buf, n * elem);
    for (int r = 0; r < world; r++)
        for (size_t i = 0; i < counts[r]; i++)
            CHECK(get(h, dt, displs[r] + i) == value(dt, r, i), "all_gather_v %s base %zu step %zu block %d [%zu] = %g",
                  dtname(dt), base, step, r, i, get(h, dt, displs[r] + i));
    m->release(buf);
    free(h);
}

static void check_v_collectives(gt_comm *c, const mem_ops *m) {
    gt_dtype dts[2] = {GT_DTYPE_F32, GT_DTYPE_BF16};
    size_t shapes[][2] = {{0, 0}, {1, 0}, {5, 3}, {0, 7}, {22, 1}, {4, 0}};
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            check_reduce_scatter_v(c, m, dts[d], shapes[k][0], shapes[k][1], 0);
            check_reduce_scatter_v(c, m, dts[d], shapes[k][0], shapes[k][1], 1);
            check_all_gather_v(c, m, dts[d], shapes[k][0], shapes[k][1]);
        }
    /* accounting: (total - counts[rank]) and (total - counts[(rank+1) % W]) elements */
    size_t counts[64], displs[64], n;
    v_counts(5, 3, counts, displs, &n);
    void *buf = m->alloc(n * 4 + 4);
    char *h = calloc(n + 1, 4);
    m->upload(buf, h, n * 4);
    gt_comm_stats st;
    gt_comm_stats_reset(c);
    gt_comm_reduce_scatter_v_sum(c, buf, (char *)buf + displs[rank] * 4, counts, GT_DTYPE_F32);
    gt_comm_all_gather_v(c, buf, counts, GT_DTYPE_BF16);
    gt_comm_stats_get(c, &st);
    uint64_t want = (n - counts[rank]) * 4 + (n - counts[(rank + 1) % world]) * 2;
    CHECK(st.calls_reduce_scatter_v == 1 && st.calls_all_gather_v == 1, "v calls %llu %llu",
          (unsigned long long)st.calls_reduce_scatter_v, (unsigned long long)st.calls_all_gather_v);
    CHECK(st.bytes_sent == want, "v bytes_sent %llu want %llu", (unsigned long long)st.bytes_sent,
          (unsigned long long)want);
    m->release(buf);
    free(h);
}

/* The MPI reduce-scatters' host staging (comm.h), on a communicator of its own (nothing staged yet):
 * a blocking one stages W x min(chunk, count) elements, the chunk at most GT_COMM_MPI_STAGING_BYTES of
 * staging, kept; a started one W x counts[rank] more from its start to its wait; the peak since
 * gt_comm_stats_reset. A reduction longer than one chunk sums right. 0 everywhere on one rank. */
static void check_staging(void) {
    gt_comm *c = gt_comm_create_mpi(MPI_COMM_WORLD);
    size_t W = (size_t)world, chunk = GT_COMM_MPI_STAGING_BYTES / 4 / W, n = chunk + 3;
    CHECK(gt_comm_staging_held_bytes(c) == 0 && gt_comm_staging_peak_bytes(c) == 0, "staging before any call");
    float *send = malloc(W * n * sizeof *send), *recv = malloc(n * sizeof *recv);
    if (!send || !recv) abort();
    for (size_t i = 0; i < W * n; i++) send[i] = (float)(rank + 1) * (float)(i % 7 + 1);
    gt_comm_reduce_scatter_sum(c, send, recv, 4, GT_DTYPE_F32);
    uint64_t small = W > 1 ? W * 4 * 4 : 0;
    CHECK(gt_comm_staging_held_bytes(c) == small && gt_comm_mpi_staging_bytes(world, 4, 4) == small,
          "staging of a 4-element reduce-scatter: held %llu, predicted %zu, want %llu",
          (unsigned long long)gt_comm_staging_held_bytes(c), gt_comm_mpi_staging_bytes(world, 4, 4),
          (unsigned long long)small);
    gt_comm_reduce_scatter_sum(c, send, recv, n, GT_DTYPE_F32);
    uint64_t big = W > 1 ? W * chunk * 4 : 0;
    CHECK(gt_comm_staging_held_bytes(c) == big && gt_comm_staging_peak_bytes(c) == big &&
              gt_comm_mpi_staging_bytes(world, n, 4) == big && big <= GT_COMM_MPI_STAGING_BYTES,
          "staging of a %zu-element reduce-scatter: held %llu, peak %llu, predicted %zu, want %llu (<= %zu)", n,
          (unsigned long long)gt_comm_staging_held_bytes(c), (unsigned long long)gt_comm_staging_peak_bytes(c),
          gt_comm_mpi_staging_bytes(world, n, 4), (unsigned long long)big, (size_t)GT_COMM_MPI_STAGING_BYTES);
    int bad = 0;
    for (size_t i = 0; i < n; i++) { /* element rank*n + i of every rank's send: (r+1) x v, summed */
        float v = (float)(((size_t)rank * n + i) % 7 + 1), want = 0;
        for (size_t r = 0; r < W; r++) want += (float)(r + 1) * v;
        bad += recv[i] != want;
    }
    CHECK(!bad, "%d of %zu elements wrong after a reduce-scatter longer than one staging chunk", bad, n);
    size_t counts[64];
    for (size_t r = 0; r < W && r < 64; r++) counts[r] = 5 + r;
    gt_comm_stats_reset(c);
    gt_comm_request *q = gt_comm_reduce_scatter_v_sum_start(c, send, recv, counts, GT_DTYPE_F32);
    uint64_t own = W > 1 ? W * counts[rank] * 4 : 0;
    CHECK(gt_comm_staging_held_bytes(c) == big + own, "staging while a v reduce-scatter is in flight: %llu, want %llu",
          (unsigned long long)gt_comm_staging_held_bytes(c), (unsigned long long)(big + own));
    gt_comm_wait(c, q);
    CHECK(gt_comm_staging_held_bytes(c) == big && gt_comm_staging_peak_bytes(c) == big + own,
          "staging after the wait: held %llu, peak %llu; want %llu, %llu", (unsigned long long)gt_comm_staging_held_bytes(c),
          (unsigned long long)gt_comm_staging_peak_bytes(c), (unsigned long long)big, (unsigned long long)(big + own));
    gt_comm_stats_reset(c);
    CHECK(gt_comm_staging_peak_bytes(c) == big, "the peak after a reset: %llu, want the held %llu",
          (unsigned long long)gt_comm_staging_peak_bytes(c), (unsigned long long)big);
    free(send);
    free(recv);
    gt_comm_destroy(c);
}

static void check_collectives(gt_comm *c, const mem_ops *m, size_t max_count) {
    gt_dtype dts[2] = {GT_DTYPE_F32, GT_DTYPE_BF16};
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < N_COUNTS && counts[k] <= max_count; k++) {
            check_all_reduce(c, m, dts[d], counts[k]);
            check_reduce_scatter(c, m, dts[d], counts[k], 0);
            check_reduce_scatter(c, m, dts[d], counts[k], 1);
            check_all_gather(c, m, dts[d], counts[k], 0);
            check_all_gather(c, m, dts[d], counts[k], 1);
        }
    for (int root = 0; root < world; root++)
        for (size_t k = 0; k < N_COUNTS && counts[k] <= max_count; k++) check_broadcast(c, m, counts[k] * 3, root);
}

/* ------------------------------------------------------------------ accounting and scalars */

static void check_stats_and_scalars(gt_comm *c, const mem_ops *m) {
    uint64_t W = (uint64_t)world;
    gt_comm_stats st;
    gt_comm_stats_reset(c);
    gt_comm_stats_get(c, &st);
    CHECK(st.calls_all_reduce == 0 && st.bytes_sent == 0 && st.seconds == 0.0, "reset clears the stats");

    void *buf = m->alloc(4 * 1000 * W);
    char *h = calloc(4 * 1000 * W, 1);
    m->upload(buf, h, 4 * 1000 * W);
    uint64_t want = 0;
    gt_comm_all_reduce_sum(c, buf, 1000, GT_DTYPE_F32);            want += 2 * (W - 1) * 4000 / W;
    gt_comm_all_reduce_sum(c, buf, 10, GT_DTYPE_BF16);             want += 2 * (W - 1) * 20 / W;   /* 2(W-1)*20/W, rounded down per call */
    gt_comm_reduce_scatter_sum(c, buf, (char *)buf + rank * 4 * 10, 10, GT_DTYPE_F32); want += (W - 1) * 40;
    gt_comm_all_gather(c, (char *)buf + rank * 2 * 7, buf, 7, GT_DTYPE_BF16);      want += (W - 1) * 14;
    gt_comm_all_gather(c, buf, buf, 0, GT_DTYPE_F32);              /* count 0 counts as a call, 0 bytes */
    gt_comm_broadcast(c, buf, 100, 0);                             if (rank == 0 && W > 1) want += 100;
    gt_comm_broadcast(c, buf, 50, world - 1);                      if (rank == world - 1 && W > 1) want += 50;
    double s = gt_comm_all_reduce_scalar_sum(c, rank + 0.5);
    int mx = gt_comm_all_reduce_int_max(c, rank == world / 2 ? 7 : -3);
    gt_comm_barrier(c);
    gt_comm_stats_get(c, &st);
    CHECK(st.calls_all_reduce == 2, "calls_all_reduce %llu", (unsigned long long)st.calls_all_reduce);
    CHECK(st.calls_reduce_scatter == 1, "calls_reduce_scatter %llu", (unsigned long long)st.calls_reduce_scatter);
    CHECK(st.calls_all_gather == 2, "calls_all_gather %llu", (unsigned long long)st.calls_all_gather);
    CHECK(st.calls_broadcast == 2, "calls_broadcast %llu", (unsigned long long)st.calls_broadcast);
    CHECK(st.calls_scalar == 2, "calls_scalar %llu", (unsigned long long)st.calls_scalar);
    CHECK(st.bytes_sent == want, "bytes_sent %llu want %llu", (unsigned long long)st.bytes_sent,
          (unsigned long long)want);
    CHECK(st.seconds > 0.0, "seconds %g", st.seconds);
    /* every call above blocks: the compute thread waited all of their time, unless alone */
    if (W > 1) CHECK(st.seconds_exposed == st.seconds && st.seconds_exposed > 0.0, "blocking calls: exposed %g, seconds %g",
                     st.seconds_exposed, st.seconds);
    else CHECK(st.seconds_exposed == 0.0, "one rank: exposed %g, want 0", st.seconds_exposed);
    CHECK(st.seconds_total >= st.seconds, "seconds_total %g < seconds %g", st.seconds_total, st.seconds);
    CHECK(s == world * (world - 1) / 2.0 + 0.5 * world, "scalar sum %g", s);
    CHECK(mx == 7, "int max %d", mx);
    if (world == 3) CHECK(st.bytes_sent == (uint64_t)(5333 + 26 + 80 + 28 + (rank == 0 ? 100 : 0) + (rank == 2 ? 50 : 0)),
                          "bytes_sent W=3 worked example %llu", (unsigned long long)st.bytes_sent);
    /* a started request: its start and tests wait for nothing, its wait is exposed */
    {
        size_t *counts = malloc((size_t)world * sizeof *counts);
        for (int r = 0; r < world; r++) counts[r] = 100 + (size_t)r;
        gt_comm_stats_reset(c);
        gt_comm_request *req = gt_comm_all_gather_v_start(c, buf, counts, GT_DTYPE_F32);
        for (int k = 0; k < 3; k++) (void)gt_comm_test(c, req);
        gt_comm_stats_get(c, &st);
        CHECK(st.seconds_exposed == 0.0, "start and test counted as exposed: %g", st.seconds_exposed);
        gt_comm_wait(c, req);
        gt_comm_stats_get(c, &st);
        CHECK(st.seconds_exposed <= st.seconds && st.seconds <= st.seconds_total,
              "request: exposed %g <= seconds %g <= total %g", st.seconds_exposed, st.seconds, st.seconds_total);
        if (W == 1) CHECK(st.seconds_exposed == 0.0, "one rank: wait exposed %g", st.seconds_exposed);
        free(counts);
    }
    m->release(buf);
    free(h);
}

/* ------------------------------------------------------------------ main */

static void report(const char *what, int failures_before) {
    int bad = check_failures - failures_before, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("%-4s %s\n", any ? "FAIL" : "ok", what);
    fflush(stdout);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    check_rank = rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank == 0) printf("test_comm: %d rank(s)\n", world);

    gt_comm *c = gt_comm_create_mpi(MPI_COMM_WORLD);
    int f0 = check_failures;
    CHECK(strcmp(gt_comm_name(c), "mpi") == 0, "name %s", gt_comm_name(c));
    CHECK(gt_comm_rank(c) == rank && gt_comm_size(c) == world, "rank/size");
    CHECK(gt_comm_local_rank(c) >= 0 && gt_comm_local_rank(c) < gt_comm_local_size(c) &&
              gt_comm_local_size(c) <= world, "local rank %d of %d", gt_comm_local_rank(c), gt_comm_local_size(c));
    if (gt_comm_local_size(c) == world) CHECK(gt_comm_local_rank(c) == rank, "one node: local rank == rank");
    report("mpi: name, rank, size, local rank", f0);

    f0 = check_failures;
    check_collectives(c, &host_mem, (size_t)-1);
    report("mpi: all_reduce / reduce_scatter (+in place) / all_gather (+in place), f32 and bf16, "
           "counts 0 1 2 5 17 1000 4099; broadcast from every root", f0);

    size_t limits[] = {1, 3, 7, 64};
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        gt_comm_set_max_call_elems(c, limits[k]);
        f0 = check_failures;
        check_collectives(c, &host_mem, limits[k] == 1 ? 1000 : (size_t)-1);
        check_v_collectives(c, &host_mem);
        char what[160];
        snprintf(what, sizeof what, "mpi: the same and the v forms with at most %zu element(s) per MPI call (chunked "
                 "path)", limits[k]);
        report(what, f0);
    }
    gt_comm_set_max_call_elems(c, GT_COMM_MPI_MAX_CALL_ELEMS);

    f0 = check_failures;
    check_v_collectives(c, &host_mem);
    report("mpi: reduce_scatter_v (+in place) / all_gather_v, f32 and bf16, uneven and zero counts; their "
           "bytes_sent", f0);

    f0 = check_failures;
    check_staging();
    report("mpi: reduce-scatter staging: chunks of at most GT_COMM_MPI_STAGING_BYTES, kept; a started one's until "
           "its wait; the peak since a reset", f0);

    f0 = check_failures;
    check_stats_and_scalars(c, &host_mem);
    report("mpi: stats (calls, bytes_sent ring model, seconds, exposed), scalar sum, int max", f0);

    /* local: one rank only; the same arithmetic truth (W = 1), on host and device buffers */
    char why_local[256] = "";
    gt_comm *l = gt_comm_create_local(MPI_COMM_WORLD, host_copy, why_local, sizeof why_local);
    f0 = check_failures;
    if (world == 1) {
        CHECK(l != NULL, "local communicator refused at world size 1: %s", why_local);
        if (l) {
            CHECK(strcmp(gt_comm_name(l), "local") == 0, "name %s", gt_comm_name(l));
            check_collectives(l, &host_mem, (size_t)-1);
            check_stats_and_scalars(l, &host_mem);
            check_v_collectives(l, &host_mem);
        }
        report("local: every collective on host buffers, f32 and bf16; stats (all bytes 0); scalars", f0);
#ifdef GTRAIN_HAVE_CUDA
        int ndev = 0;
        if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) {
            gt_comm *ld = gt_comm_create_local(MPI_COMM_WORLD, dev_copy, NULL, 0);
            f0 = check_failures;
            check_collectives(ld, &dev_mem, (size_t)-1);
            check_stats_and_scalars(ld, &dev_mem);
            check_v_collectives(ld, &dev_mem);
            report("local: every collective on device buffers (cudaMemcpy device to device)", f0);
            gt_comm_destroy(ld);
        }
        (void)cudaGetLastError();
#endif
    } else {
        CHECK(l == NULL && why_local[0] != '\0', "local communicator on %d ranks: expected NULL and a reason", world);
        report("local: refused on more than one rank, with a reason", f0);
    }
    gt_comm_destroy(l);

    /* NCCL: a communicator only with CUDA, a GPU and one rank per GPU; otherwise a reason on every rank. */
    char why[256] = "";
    gt_comm *g = gt_comm_create_nccl(MPI_COMM_WORLD, why, sizeof why);
    f0 = check_failures;
    if (!g) {
        CHECK(why[0] != '\0', "NULL without a reason");
        if (rank == 0) printf("     nccl: unavailable (%s); device checks skipped\n", why);
        report("nccl: creation refused consistently with a reason", f0);
    } else {
#ifdef GTRAIN_HAVE_CUDA
        CHECK(strcmp(gt_comm_name(g), "nccl") == 0, "name %s", gt_comm_name(g));
        check_collectives(g, &dev_mem, (size_t)-1);
        check_stats_and_scalars(g, &dev_mem);
        check_v_collectives(g, &dev_mem);
        report("nccl: every collective on device buffers, f32 and bf16; stats; scalars", f0);
#endif
        gt_comm_destroy(g);
    }

    gt_comm_destroy(c);
    int any = 0;
    MPI_Allreduce(&check_failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("test_comm: %s\n", any ? "FAILED" : "all passed");
    MPI_Finalize();
    return any ? 1 : 0;
}
