/*
 * bf16_gemm.c — the matrix products of one training step at its shapes, timed two ways on the threads
 * OpenMP gives (OMP_NUM_THREADS): OpenBLAS sgemm in fp32 (the CPU backend's fp32 path,
 * cpu_matmul.c) and oneDNN bf16 with fp32 accumulation through gt_dnnl_gemm (the bf16 path, the
 * same cached primitives the trainer uses). Each shape runs in its three layouts: forward
 * out = x W^T, the input gradient dx = dy W, and the weight gradient dW += dy^T x (fp32 output).
 * Prints one row per shape and layout with GFLOP/s of each, then the whole step's products (every
 * layer, forward and backward) as seconds: the GEMM ceiling bench/cpu_vs_torch.sh compares a step to.
 *
 *   bf16_gemm TOKENS DIM FFN VOCAB LAYERS KV_DIM [REPS [bf16]]   (llama100m: 2048 768 2048 32000 12 256)
 * No arguments: llama100m's shapes; a last argument bf16 times the bf16 products only (fp32 shows 0).
 * The last line is machine-readable: "ceiling FP32_S BF16_S BF16_CPU_S" (CPU seconds of all threads).
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }

static void *fill(size_t n, int bf16) {
    void *p = GT_CPU_MALLOC(n * (bf16 ? 2 : 4));
    for (size_t i = 0; i < n; i++) {
        float v = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        if (bf16) ((uint16_t *)p)[i] = gt_f32_to_bf16(v);
        else ((float *)p)[i] = v;
    }
    return p;
}

/* layout 0: C(M=T,N=OC) = x(T,IC) W^T ; 1: dx(T,IC) = dy(T,OC) W(OC,IC) ; 2: dW(OC,IC) += dy^T x */
/* the fastest of reps calls (after one that creates the primitive); *cpu: that call's CPU seconds */
static double run(int layout, int bf16, int T, int IC, int OC, int reps, double *cpu) {
    void *x = fill((size_t)T * IC, bf16), *w = fill((size_t)OC * IC, bf16), *dy = fill((size_t)T * OC, bf16);
    float *dw = fill((size_t)OC * IC, 0);
    void *out = fill((size_t)T * (OC > IC ? OC : IC), bf16);
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        if (!bf16) {
            if (layout == 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, OC, IC, 1, x, IC, w, IC, 0, out, OC);
            else if (layout == 1)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, IC, OC, 1, dy, OC, w, IC, 0, out, IC);
            else
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, T, 1, dy, OC, x, IC, 1, dw, IC);
        } else {
            if (layout == 0) gt_dnnl_gemm(T, OC, IC, x, 0, w, 1, out, 0, 0);
            else if (layout == 1) gt_dnnl_gemm(T, IC, OC, dy, 0, w, 0, out, 0, 0);
            else gt_dnnl_gemm(OC, IC, T, dy, 1, x, 0, dw, 1, 1);
        }
        double dt = now() - t0, dc = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (r > 0 && dt < best) best = dt, *cpu = dc;   /* the first call creates the primitive */
    }
    free(x), free(w), free(dy), free(dw), free(out);
    return best;
}

int main(int argc, char **argv) {
    int T = 2048, C = 768, F = 2048, V = 32000, L = 12, KV = 256, reps = 3;
    if (argc >= 7) T = atoi(argv[1]), C = atoi(argv[2]), F = atoi(argv[3]), V = atoi(argv[4]), L = atoi(argv[5]),
                   KV = atoi(argv[6]);
    if (argc >= 8) reps = atoi(argv[7]);
    int only_bf16 = argc >= 9 && strcmp(argv[8], "bf16") == 0;
    char why[256] = "";
    int have = 1;   /* the bf16 column is oneDNN on bf16 units, or sgemm on widened copies without them */
    int native = gt_dnnl_native(why, sizeof why);
    printf("threads %d; bf16: %s%s%s\n", omp_get_max_threads(), native ? "oneDNN on " : "widened to sgemm; ",
           native ? gt_dnnl_isa() : "", native ? "" : why);
    /* (IC, OC, count per step) of each linear layer */
    struct { const char *name; int ic, oc, count; } sh[] = {
        {"q,o", C, C, 2 * L}, {"k,v", C, KV, 2 * L}, {"gate,up", C, F, 2 * L}, {"down", F, C, L}, {"head", C, V, 1}};
    const char *lay[] = {"fwd  y=xW^T", "bwd dx=dyW", "bwd dW+=dy^Tx"};
    double step[2] = {0, 0}, step_cpu = 0;
    printf("%-8s %-14s %6s %6s %6s %12s %12s %7s\n", "layer", "layout", "M", "N", "K", "fp32 GF/s", "bf16 GF/s", "ratio");
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        for (int l = 0; l < 3; l++) {
            double flops = 2.0 * T * sh[s].ic * sh[s].oc, t[2], cpu = 0;
            for (int b = 0; b < 2; b++) {
                t[b] = (b && !have) || (!b && only_bf16) ? 0 : run(l, b, T, sh[s].ic, sh[s].oc, reps, &cpu);
                step[b] += t[b] * sh[s].count;
            }
            step_cpu += have ? cpu * sh[s].count : 0;
            int M = l == 2 ? sh[s].oc : T, N = l == 1 ? sh[s].ic : (l == 2 ? sh[s].ic : sh[s].oc);
            int K = l == 0 ? sh[s].ic : (l == 1 ? sh[s].oc : T);
            printf("%-8s %-14s %6d %6d %6d %12.0f %12.0f %7.2f\n", sh[s].name, lay[l], M, N, K,
                   t[0] > 0 ? flops / t[0] / 1e9 : 0, have ? flops / t[1] / 1e9 : 0, have ? t[0] / t[1] : 0);
        }
    printf("step's products (linear layers only): fp32 %.3f s, bf16 %.3f s\n", step[0], step[1]);
    printf("ceiling %.4f %.4f %.4f\n", step[0], step[1], step_cpu);
    return 0;
}
