/*
 * progress_bench.c — does a started collective run while the compute thread computes, and what does
 * the progress thread (comm.h gt_comm_progress_start, dist.progress_us) cost the compute?
 *
 * Each repetition starts one reduce-scatter of a gradient-bucket-sized buffer through gtrain's own
 * communicator (gt_comm_reduce_scatter_v_sum_start, as a bucket does), computes a fixed amount of work
 * that makes no MPI call (a dependent multiply-add chain: one long kernel), then waits for the
 * collective. It alternates two communicators of the same ranks, one with the progress thread and one
 * without, so that the load of the machine falls on both alike. Per mode it prints the median compute
 * seconds (the fixed work: its rise with the thread is what the thread costs) and the median wait
 * after the compute (0 when the transfer ran during it; without progress the transfer runs only
 * inside the wait). Not a test: timings are what the machine gives.
 *
 *   mpiexec -n 2 build/progress_bench [PROGRESS_US [MIB [REPS]]]   (defaults 1000, 64, 5)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

static volatile double sink;

/* a dependent chain of multiply-adds, no memory traffic, no MPI call */
static void work(long iters) {
    double x = 1.0;
    for (long i = 0; i < iters; i++) x = x * 1.0000001 + 1e-9;
    sink = x;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    long us = argc > 1 ? atol(argv[1]) : 1000, mib = argc > 2 ? atol(argv[2]) : 64;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (us <= 0 || mib <= 0 || reps <= 0) {
        fprintf(stderr, "usage: progress_bench [PROGRESS_US > 0 [MIB > 0 [REPS > 0]]]\n");
        MPI_Finalize();
        return 2;
    }
    gt_comm *with = gt_comm_create_mpi(MPI_COMM_WORLD), *without = gt_comm_create_mpi(MPI_COMM_WORLD);
    char why[256];
    int rank = gt_comm_rank(with), W = gt_comm_size(with);
    if (!gt_comm_progress_start(with, us, why, sizeof why)) {
        if (rank == 0) fprintf(stderr, "progress_bench: no progress thread: %s\n", why);
        gt_comm_destroy(without);
        gt_comm_destroy(with);
        MPI_Finalize();
        return 1;
    }
    size_t total = (size_t)mib * 1048576 / sizeof(float);
    total -= total % (size_t)W;
    size_t *counts = malloc((size_t)W * sizeof *counts);
    float *buf = calloc(total, sizeof *buf);
    if (!counts || !buf) abort();
    for (int r = 0; r < W; r++) counts[r] = total / (size_t)W;

    /* the fixed work: about 1 s on this rank, alone */
    long iters = 1000000;
    for (;;) {
        double t0 = MPI_Wtime();
        work(iters);
        if (MPI_Wtime() - t0 > 0.25) break;
        iters *= 2;
    }
    iters *= 4;
    double *c[2], *w[2];
    for (int m = 0; m < 2; m++) {
        c[m] = calloc((size_t)reps, sizeof(double));
        w[m] = calloc((size_t)reps, sizeof(double));
        if (!c[m] || !w[m]) abort();
    }
    for (int i = 0; i < reps; i++)
        for (int m = 0; m < 2; m++) {
            gt_comm *comm = m ? without : with;
            gt_comm_barrier(comm);
            size_t own = (size_t)rank * counts[0];
            gt_comm_request *req = gt_comm_reduce_scatter_v_sum_start(comm, buf, buf + own, counts, GT_DTYPE_F32);
            double t0 = MPI_Wtime();
            work(iters);
            double t1 = MPI_Wtime();
            gt_comm_wait(comm, req);
            double t2 = MPI_Wtime();
            c[m][i] = t1 - t0;
            w[m][i] = t2 - t1;
        }
    if (rank == 0) {
        printf("progress_bench: %d ranks, a %ld MiB reduce-scatter started before %ld multiply-adds, %d repetitions\n",
               W, mib, iters, reps);
        for (int m = 0; m < 2; m++)
            printf("  %-28s compute %.3f s (median), wait after it %.3f s (median)\n",
                   m ? "without a progress thread:" : "with the thread:", median(c[m], reps), median(w[m], reps));
        printf("  progress thread: %llu calls into MPI, %.3f s of CPU (progress_us = %ld)\n",
               gt_comm_progress_polls(with), gt_comm_progress_cpu_seconds(with), us);
    }
    for (int m = 0; m < 2; m++) {
        free(c[m]);
        free(w[m]);
    }
    free(buf);
    free(counts);
    gt_comm_destroy(without);
    gt_comm_destroy(with);
    MPI_Finalize();
    return 0;
}
