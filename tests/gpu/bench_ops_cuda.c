/*
 * bench_ops_cuda.c — per-op timings of the CUDA backend (bf16) at the 1B and 7B model shapes, each
 * next to its roofline, so the first run on a GPU is also a profile.
 *
 *   bench_ops_cuda [JSONL]     table on stdout; one JSON object per measurement appended to JSONL
 *
 * Exits 77 when no CUDA device is visible. Shapes (one micro-batch of configs/llama1b.ini and
 * configs/llama7b.ini, sequence 2048):
 *   1b  B 4, dim 2048, 32 heads of 64, 8 kv heads, ffn 8192, vocab 32000
 *   7b  B 1, dim 4096, 32 heads of 128, 32 kv heads, ffn 11008, vocab 32000
 * Every op runs through the backend's table on random data (never zeros), once to warm up, then
 * repeatedly with a device synchronisation around each repetition; the median is reported.
 *
 * The floor of an op is max(FLOPs / peak, bytes / bandwidth) with the H200's datasheet numbers
 * (989 TFLOP/s dense bf16, 4.8 TB/s HBM3e): FLOPs are the model's (causal attention counts half the
 * square; backward counts the 5 products of flash attention 2, not what a kernel recomputes), bytes
 * are each input read once and each output written once. "roof%" = floor / measured. The first two
 * lines measure the ceilings actually reached here: a large device-to-device copy (bytes read +
 * written) and an 8192^3 bf16 matmul. Attention is timed with the default kernels and with the
 * opt-in tensor-core variant (train.cuda_attention = mma: cuda_attention_mma.cu's forward and
 * backward), and with cuDNN's fused attention (=cudnn) when libcudnn loads; a cudnn direction cuDNN
 * declined is named "cudnn-fallback" (those are the default kernels' times). The last line per shape adds the ops of one
 * micro-batch's forward and backward (every op measured here; rope and dropout are not) and the
 * optimizer step (adamw, to_working and sumsq per parameter) into a step estimate and its MFU, to set
 * beside the trainer's own.
 *
 * Timings are what they are on the machine it ran on; nothing here asserts a speed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops.h"

#define PEAK_FLOPS 989e12 /* H100/H200 SXM dense bf16, NVIDIA datasheet */
#define PEAK_BYTES 4.8e12 /* H200 HBM3e, NVIDIA datasheet */

void gt_cuda_attention_force_variant(const char *name); /* cuda_attention.cuh, for tests */
long gt_cuda_attention_cudnn_calls(void);            /* cuda_attention_cudnn.cu, for tests */
long gt_cuda_attention_cudnn_version(char *why, size_t n);

static const gt_ops *gpu;
static FILE *jsonl;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- buffers */

static uint64_t rng = 0x9E3779B97F4A7C15ull;

/* n working elements, uniform in [-scale, scale) */
static void *work_buf(size_t n, float scale) {
    float *h = malloc(n * sizeof(float));
    if (!h) abort();
    for (size_t i = 0; i < n; i++) {
        rng = gt_mix64(rng);
        h[i] = ((float)(rng >> 40) * (2.0f / 16777216.0f) - 1.0f) * scale;
    }
    float *tmp = gpu->alloc(n * sizeof(float));
    gpu->copy_to_device(tmp, h, n * sizeof(float));
    void *w = gpu->alloc(n * (size_t)gpu->act_bytes);
    gpu->to_working(w, tmp, n);
    gpu->free(tmp);
    free(h);
    return w;
}

static float *f32_buf(size_t n, float scale, int positive) {
    float *h = malloc(n * sizeof(float));
    if (!h) abort();
    for (size_t i = 0; i < n; i++) {
        rng = gt_mix64(rng);
        float u = (float)(rng >> 40) * (1.0f / 16777216.0f);
        h[i] = positive ? (u + 0.5f) * scale : (2.0f * u - 1.0f) * scale;
    }
    float *d = gpu->alloc(n * sizeof(float));
    gpu->copy_to_device(d, h, n * sizeof(float));
    free(h);
    return d;
}

/* ---------------------------------------------------------------- the ops, as one switch */

typedef enum {
    OP_COPY, OP_MATMUL_FWD, OP_MATMUL_BWD, OP_ATTN_FWD, OP_ATTN_BWD, OP_RMS_FWD, OP_RMS_BWD, OP_SWIGLU_FWD,
    OP_SWIGLU_BWD, OP_RESIDUAL, OP_CE_FWD, OP_CE_BWD, OP_EMB_FWD, OP_EMB_BWD, OP_ADAMW, OP_TO_WORKING,
    OP_SUMSQ
} op_id;

typedef struct {
    op_id op;
    int B, T, NH, NKV, HD, N, IC, OC, V;
    size_t n;
    void *a, *b, *c, *d, *e, *f, *g, *h;   /* working buffers, meaning per op */
    float *fa, *fb, *fc, *fd;          /* fp32 buffers */
    int32_t *tok;
} op_ctx;

static const gt_rng_key key = {1, 2};

static void run_op(op_ctx *x) {
    switch (x->op) {
    case OP_COPY: gpu->copy(x->a, x->b, x->n); break;
    case OP_MATMUL_FWD: gpu->matmul_forward(x->c, x->a, x->b, x->N, x->IC, x->OC); break;
    case OP_MATMUL_BWD: gpu->matmul_backward(x->d, x->fa, x->c, x->a, x->b, x->N, x->IC, x->OC, 0); break;
    case OP_ATTN_FWD:
        gpu->attention_forward(x->d, x->fa, NULL, x->a, x->b, x->c, NULL, x->B, x->T, x->NH, x->NKV, x->HD, 0.0f, key);
        break;
    case OP_ATTN_BWD:
        gpu->attention_backward(x->f, x->g, x->h, x->e, x->d, x->a, x->b, x->c, x->fa, NULL, NULL, x->B, x->T, x->NH,
                                x->NKV, x->HD, 0.0f, key);
        break;
    case OP_RMS_FWD: gpu->rmsnorm_forward(x->c, x->fa, x->a, x->b, x->N, x->IC, 1e-5f); break;
    case OP_RMS_BWD: gpu->rmsnorm_backward(x->d, x->fb, x->c, x->a, x->b, x->fa, x->N, x->IC); break;
    case OP_SWIGLU_FWD: gpu->swiglu_forward(x->c, x->a, x->b, x->n); break;
    case OP_SWIGLU_BWD: gpu->swiglu_backward(x->d, x->e, x->c, x->a, x->b, x->n); break;
    case OP_RESIDUAL: gpu->residual_forward(x->c, x->a, x->d, x->n, 0.0f, key); break;
    case OP_CE_FWD: gpu->crossentropy_forward(x->fa, x->fb, x->a, x->tok, x->N, x->V); break;
    case OP_CE_BWD: gpu->crossentropy_backward(x->a, x->fb, x->tok, x->N, x->V, 1e-4f); break;
    case OP_EMB_FWD: gpu->embedding_forward(x->c, x->tok, x->a, x->N, x->IC, x->V); break;
    case OP_EMB_BWD: gpu->embedding_backward(x->fa, x->c, x->tok, x->N, x->IC, x->V); break;
    case OP_ADAMW: gpu->adamw(x->fa, x->fb, x->fc, x->fd, x->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3); break;
    case OP_TO_WORKING: gpu->to_working(x->a, x->fa, x->n); break;
    case OP_SUMSQ: (void)gpu->sumsq(x->fa, x->n); break;
    }
}

/* median seconds of one call: a warm-up call, then up to 50 repetitions or ~0.25 s */
static double time_op(op_ctx *x) {
    run_op(x);
    gpu->synchronize();
    double t0 = now();
    run_op(x);
    gpu->synchronize();
    double once = now() - t0;
    int reps = once > 0.0 ? (int)(0.25 / once) : 50;
    if (reps < 3) reps = 3;
    if (reps > 50) reps = 50;
    double t[50];
    for (int r = 0; r < reps; r++) {
        t0 = now();
        run_op(x);
        gpu->synchronize();
        t[r] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

/* one table row and one JSON line; returns the measured seconds */
static double report(const char *shape, const char *op, const char *dims, double sec, double flops, double bytes) {
    double floor_s = fmax(flops / PEAK_FLOPS, bytes / PEAK_BYTES);
    const char *bound = flops / PEAK_FLOPS >= bytes / PEAK_BYTES ? "flops" : "bytes";
    printf("%-3s %-26s %-28s %9.3f ms  floor %8.3f ms (%s)  roof %5.1f%%  %7.1f TFLOP/s  %7.1f GB/s\n", shape, op,
           dims, sec * 1e3, floor_s * 1e3, bound, 100.0 * floor_s / sec, flops / sec / 1e12, bytes / sec / 1e9);
    fflush(stdout);
    if (jsonl) {
        fprintf(jsonl,
                "{\"shape\":\"%s\",\"op\":\"%s\",\"dims\":\"%s\",\"ms\":%.6g,\"floor_ms\":%.6g,\"bound\":\"%s\","
                "\"roofline_fraction\":%.4g,\"tflops\":%.4g,\"gbps\":%.4g}\n",
                shape, op, dims, sec * 1e3, floor_s * 1e3, bound, floor_s / sec, flops / sec / 1e12, bytes / sec / 1e9);
        fflush(jsonl);
    }
    return sec;
}

/* ---------------------------------------------------------------- measured ceilings */

static void ceilings(void) {
    size_t bytes = (size_t)512 << 20;
    op_ctx x = {0};
    x.op = OP_COPY;
    x.n = bytes;
    x.a = gpu->alloc(bytes);
    x.b = work_buf(bytes / (size_t)gpu->act_bytes, 1.0f);
    report("-", "copy (device to device)", "512 MiB", time_op(&x), 0.0, 2.0 * (double)bytes);
    gpu->free(x.a), gpu->free(x.b);

    const int M = 8192;
    memset(&x, 0, sizeof x);
    x.op = OP_MATMUL_FWD;
    x.N = x.IC = x.OC = M;
    x.a = work_buf((size_t)M * M, 1.0f);
    x.b = work_buf((size_t)M * M, 0.02f);
    x.c = gpu->alloc((size_t)M * M * (size_t)gpu->act_bytes);
    report("-", "matmul 8192^3 (cuBLASLt)", "N=IC=OC=8192", time_op(&x), 2.0 * M * M * (double)M,
           3.0 * M * (double)M * gpu->act_bytes);
    gpu->free(x.a), gpu->free(x.b), gpu->free(x.c);
}

/* the optimizer step's ops over a 2^28-element slice; seconds per parameter for the step estimates */
static double g_opt_per_elem;

static void bench_optimizer(void) {
    op_ctx x = {0};
    char dims[64];
    x.n = (size_t)1 << 28;
    x.fa = f32_buf(x.n, 1.0f, 0), x.fb = f32_buf(x.n, 0.1f, 0), x.fc = f32_buf(x.n, 0.01f, 1);
    x.fd = f32_buf(x.n, 0.5f, 0);
    x.a = gpu->alloc(x.n * (size_t)gpu->act_bytes);
    snprintf(dims, sizeof dims, "n=%zu", x.n);
    x.op = OP_ADAMW;
    double t = report("-", "adamw", dims, time_op(&x), 0.0, 28.0 * (double)x.n);
    x.op = OP_TO_WORKING;
    t += report("-", "to_working", dims, time_op(&x), 0.0, (4.0 + gpu->act_bytes) * (double)x.n);
    x.op = OP_SUMSQ;
    t += report("-", "sumsq", dims, time_op(&x), 0.0, 4.0 * (double)x.n);
    gpu->free(x.a), gpu->free(x.fa), gpu->free(x.fb), gpu->free(x.fc), gpu->free(x.fd);
    g_opt_per_elem = t / (double)x.n;
}

/* ---------------------------------------------------------------- one model shape */

typedef struct {
    const char *name;
    int B, T, C, NH, NKV, F, V, L;
} model_shape;

/* a matmul pair (forward, backward) of one linear layer: returns forward + backward seconds */
static double bench_linear(const model_shape *m, const char *what, int IC, int OC) {
    const int N = m->B * m->T;
    const double eb = gpu->act_bytes;
    char op[64], dims[64];
    op_ctx x = {0};
    x.N = N, x.IC = IC, x.OC = OC;
    x.a = work_buf((size_t)N * IC, 1.0f);
    x.b = work_buf((size_t)OC * IC, 0.02f);
    x.c = work_buf((size_t)N * OC, 1.0f);
    x.d = gpu->alloc((size_t)N * IC * (size_t)gpu->act_bytes);
    x.fa = f32_buf((size_t)OC * IC, 0.0f, 0);
    snprintf(dims, sizeof dims, "N=%d IC=%d OC=%d", N, IC, OC);
    x.op = OP_MATMUL_FWD;
    snprintf(op, sizeof op, "matmul_forward %s", what);
    double f = report(m->name, op, dims, time_op(&x), 2.0 * N * (double)IC * OC,
                      eb * ((double)N * IC + (double)OC * IC + (double)N * OC));
    x.op = OP_MATMUL_BWD;
    snprintf(op, sizeof op, "matmul_backward %s", what);
    double b = report(m->name, op, dims, time_op(&x), 4.0 * N * (double)IC * OC,
                      eb * (2.0 * N * OC + (double)OC * IC + 2.0 * N * IC) + 8.0 * OC * (double)IC);
    gpu->free(x.a), gpu->free(x.b), gpu->free(x.c), gpu->free(x.d), gpu->free(x.fa);
    return f + b;
}

/* attention forward + backward with the variant asked for ("default", "mma", "cudnn"); returns their
 * sum, or -1 when the variant is cudnn and libcudnn does not load */
static double bench_attention(const model_shape *m, const char *variant) {
    const int cudnn = strcmp(variant, "cudnn") == 0;
    const int HD = m->C / m->NH, KVD = m->NKV * HD, N = m->B * m->T;
    const double eb = gpu->act_bytes;
    char dims[64], op[64], why[320];
    if (cudnn && !gt_cuda_attention_cudnn_version(why, sizeof why)) {
        printf("%-3s attention cudnn skipped: %s\n", m->name, why);
        return -1.0;
    }
    gt_cuda_attention_force_variant(variant);
    op_ctx x = {0};
    x.B = m->B, x.T = m->T, x.NH = m->NH, x.NKV = m->NKV, x.HD = HD;
    x.a = work_buf((size_t)N * m->C, 1.0f); /* q */
    x.b = work_buf((size_t)N * KVD, 1.0f);  /* k */
    x.c = work_buf((size_t)N * KVD, 1.0f);  /* v */
    x.d = gpu->alloc((size_t)N * m->C * (size_t)gpu->act_bytes);          /* out */
    x.e = work_buf((size_t)N * m->C, 1.0f);                               /* dout */
    x.f = gpu->alloc((size_t)N * m->C * (size_t)gpu->act_bytes);          /* dq */
    x.g = gpu->alloc((size_t)N * KVD * (size_t)gpu->act_bytes);           /* dk */
    x.h = gpu->alloc((size_t)N * KVD * (size_t)gpu->act_bytes);           /* dv */
    x.fa = gpu->alloc((size_t)m->B * m->NH * m->T * sizeof(float));     /* lse */
    snprintf(dims, sizeof dims, "B=%d T=%d NH=%d NKV=%d HD=%d", m->B, m->T, m->NH, m->NKV, HD);
    const double causal = (double)m->B * m->NH * (double)m->T * m->T * HD; /* T^2/2 pairs x 2 flops */
    const double io = eb * (2.0 * N * m->C + 2.0 * N * KVD);                /* q, k, v, out */
    x.op = OP_ATTN_FWD;
    /* cudnn only: whether cuDNN itself ran the timed calls, or declined them to the default kernels */
    long c0 = gt_cuda_attention_cudnn_calls();
    double t = time_op(&x);
    snprintf(op, sizeof op, "attention_forward %s%s", variant,
             cudnn && gt_cuda_attention_cudnn_calls() == c0 ? "-fallback" : "");
    double f = report(m->name, op, dims, t, 2.0 * causal, io);
    x.op = OP_ATTN_BWD; /* reads q, k, v, out, dout, lse; writes dq, dk, dv */
    c0 = gt_cuda_attention_cudnn_calls();
    t = time_op(&x);
    snprintf(op, sizeof op, "attention_backward %s%s", variant,
             cudnn && gt_cuda_attention_cudnn_calls() == c0 ? "-fallback" : "");
    double b = report(m->name, op, dims, t, 5.0 * causal, io + eb * (2.0 * N * m->C + 2.0 * N * KVD));
    gpu->free(x.a), gpu->free(x.b), gpu->free(x.c), gpu->free(x.d), gpu->free(x.e), gpu->free(x.f);
    gpu->free(x.g), gpu->free(x.h), gpu->free(x.fa);
    gt_cuda_attention_force_variant(NULL);
    return f + b;
}

static void bench_shape(const model_shape *m) {
    const int N = m->B * m->T, C = m->C, HD = C / m->NH, KVD = m->NKV * HD, F = m->F, V = m->V;
    const double eb = gpu->act_bytes;
    char dims[64];
    printf("\n%s: B %d, T %d, dim %d, %d heads of %d (%d kv), ffn %d, vocab %d, %d blocks\n", m->name, m->B, m->T, C,
           m->NH, HD, m->NKV, F, V, m->L);

    /* one block, forward + backward, op by op */
    double block = 0.0;
    block += bench_linear(m, "q/o (C->C)", C, C) * 2.0;
    block += bench_linear(m, "k/v (C->KVD)", C, KVD) * 2.0;
    block += bench_linear(m, "gate/up (C->F)", C, F) * 2.0;
    block += bench_linear(m, "down (F->C)", F, C);
    double attn_default = bench_attention(m, "default");
    double attn_mma = bench_attention(m, "mma");
    double attn_cudnn = bench_attention(m, "cudnn"); /* -1: libcudnn did not load */
    block += attn_default;

    op_ctx x = {0};
    x.N = N, x.IC = C, x.n = (size_t)N * C;
    x.a = work_buf((size_t)N * C, 1.0f);
    x.b = work_buf((size_t)C, 1.0f);
    x.c = work_buf((size_t)N * C, 1.0f);
    x.d = work_buf((size_t)N * C, 1.0f);
    x.fa = f32_buf((size_t)N, 1.0f, 1);
    x.fb = f32_buf((size_t)C, 0.0f, 0);
    snprintf(dims, sizeof dims, "N=%d C=%d", N, C);
    x.op = OP_RMS_FWD;
    block += 2.0 * report(m->name, "rmsnorm_forward", dims, time_op(&x), 0.0, eb * 2.0 * N * C + 4.0 * N);
    x.op = OP_RMS_BWD;
    block += 2.0 * report(m->name, "rmsnorm_backward", dims, time_op(&x), 0.0, eb * 4.0 * N * C + 8.0 * C);
    x.op = OP_RESIDUAL;
    snprintf(dims, sizeof dims, "n=%zu", x.n);
    block += 2.0 * report(m->name, "residual_forward", dims, time_op(&x), 0.0, eb * 3.0 * x.n);
    gpu->free(x.a), gpu->free(x.b), gpu->free(x.c), gpu->free(x.d), gpu->free(x.fa), gpu->free(x.fb);

    memset(&x, 0, sizeof x);
    x.n = (size_t)N * F;
    x.a = work_buf(x.n, 2.0f), x.b = work_buf(x.n, 2.0f), x.c = work_buf(x.n, 1.0f);
    x.d = gpu->alloc(x.n * (size_t)gpu->act_bytes), x.e = gpu->alloc(x.n * (size_t)gpu->act_bytes);
    snprintf(dims, sizeof dims, "n=%zu", x.n);
    x.op = OP_SWIGLU_FWD;
    block += report(m->name, "swiglu_forward", dims, time_op(&x), 0.0, eb * 3.0 * x.n);
    x.op = OP_SWIGLU_BWD;
    block += report(m->name, "swiglu_backward", dims, time_op(&x), 0.0, eb * 5.0 * x.n);
    gpu->free(x.a), gpu->free(x.b), gpu->free(x.c), gpu->free(x.d), gpu->free(x.e);

    /* head: embedding, final norm (counted with the blocks' norms), LM head, cross-entropy */
    double head = bench_linear(m, "lm_head (C->V)", C, V);
    memset(&x, 0, sizeof x);
    x.N = N, x.V = V, x.IC = C;
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((gt_mix64((uint64_t)i) >> 33) % (uint64_t)V);
    x.tok = gpu->alloc((size_t)N * sizeof *tok);
    gpu->copy_to_device(x.tok, tok, (size_t)N * sizeof *tok);
    free(tok);
    x.a = work_buf((size_t)N * V, 4.0f);
    x.fa = gpu->alloc((size_t)N * sizeof(float)), x.fb = gpu->alloc((size_t)N * sizeof(float));
    snprintf(dims, sizeof dims, "BT=%d V=%d", N, V);
    x.op = OP_CE_FWD;
    head += report(m->name, "crossentropy_forward", dims, time_op(&x), 0.0, eb * (double)N * V);
    x.op = OP_CE_BWD;
    head += report(m->name, "crossentropy_backward", dims, time_op(&x), 0.0, eb * 2.0 * N * (double)V);
    gpu->free(x.a), gpu->free(x.fa), gpu->free(x.fb);
    x.a = work_buf((size_t)V * C, 0.02f);
    x.c = work_buf((size_t)N * C, 1.0f);
    x.fa = f32_buf((size_t)V * C, 0.0f, 0);
    snprintf(dims, sizeof dims, "BT=%d C=%d V=%d", N, C, V);
    x.op = OP_EMB_FWD;
    head += report(m->name, "embedding_forward", dims, time_op(&x), 0.0, eb * 2.0 * N * C);
    x.op = OP_EMB_BWD;
    head += report(m->name, "embedding_backward", dims, time_op(&x), 0.0, eb * N * C + 8.0 * N * C);
    gpu->free(x.a), gpu->free(x.c), gpu->free(x.fa), gpu->free(x.tok);

    /* the micro-batch estimate: L blocks + head; the optimizer step per parameter, once per step */
    double P = (double)m->L * (2.0 * C * (double)C + 2.0 * C * (double)KVD + 3.0 * C * (double)F + 2.0 * C) +
               2.0 * V * (double)C + C;
    double opt = g_opt_per_elem * P;
    double micro = m->L * block + head;
    double flops = 6.0 * P * N + 3.0 * 2.0 * m->L * (double)m->B * m->NH * (double)m->T * m->T * HD;
    printf("%-3s step estimate from the ops: %.1f ms per micro-batch (blocks %.1f, head %.1f) + optimizer %.1f ms;"
           " model FLOPs %.3g -> MFU %.1f%% at one micro-batch per step (attention mma instead: %.1f ms,"
           " cudnn: %.1f ms)\n",
           m->name, micro * 1e3, m->L * block * 1e3, head * 1e3, opt * 1e3, flops,
           100.0 * flops / (micro + opt) / PEAK_FLOPS, (micro + m->L * (attn_mma - attn_default)) * 1e3,
           attn_cudnn < 0.0 ? -1.0 : (micro + m->L * (attn_cudnn - attn_default)) * 1e3);
    if (jsonl)
        fprintf(jsonl,
                "{\"shape\":\"%s\",\"op\":\"step_estimate\",\"micro_batch_ms\":%.6g,\"optimizer_ms\":%.6g,"
                "\"model_flops\":%.6g,\"mfu\":%.4g,"
                "\"micro_batch_ms_mma_attention\":%.6g,\"micro_batch_ms_cudnn_attention\":%.6g}\n",
                m->name, micro * 1e3, opt * 1e3, flops, flops / (micro + opt) / PEAK_FLOPS,
                (micro + m->L * (attn_mma - attn_default)) * 1e3,
                attn_cudnn < 0.0 ? -1.0 : (micro + m->L * (attn_cudnn - attn_default)) * 1e3);
}

int main(int argc, char **argv) {
    char why[256] = "";
    gpu = gt_ops_cuda(1, GT_CUDA_ATTENTION_DEFAULT, why, sizeof why);
    if (!gpu) {
        printf("skipped: %s\n", why);
        return 77;
    }
    if (argc > 1) {
        jsonl = fopen(argv[1], "a");
        if (!jsonl) {
            fprintf(stderr, "bench_ops_cuda: cannot write %s\n", argv[1]);
            return 2;
        }
    }
    printf("bf16 ops; floor = max(FLOPs / %.0f TFLOP/s, bytes / %.1f TB/s); roof%% = floor / measured\n",
           PEAK_FLOPS / 1e12, PEAK_BYTES / 1e12);
    ceilings();
    bench_optimizer();
    const model_shape shapes[2] = {
        {"1b", 4, 2048, 2048, 32, 8, 8192, 32000, 16},
        {"7b", 1, 2048, 4096, 32, 32, 11008, 32000, 32},
    };
    for (int i = 0; i < 2; i++) bench_shape(&shapes[i]);
    if (jsonl) fclose(jsonl);
    return 0;
}
