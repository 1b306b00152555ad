/*
 * ops_cpu.c — the CPU backend's two gt_ops tables (fp32 and bf16 working tensors), their memory
 * functions (host memory, 64-byte aligned), and the fp32 vector utilities of the optimizer step:
 * sum of squares, scale, AdamW, and the fp32 table's master <-> working copies (plain copies).
 *
 * The math of the layers lives in cpu_norm_rope.c, cpu_attention.c and cpu_pointwise.c (each written
 * once, compiled for both tables: cpu_elem.h), the linear layers in cpu_matmul.c (fp32, OpenBLAS)
 * and cpu_bf16.c (bf16, oneDNN through cpu_dnnl.c).
 */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

void *gt_cpu_xmalloc(size_t bytes, const char *file, int line) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "gtrain cpu kernels: %s:%d: out of memory allocating %zu bytes\n", file, line,
                bytes);
        abort();
    }
    return p;
}

/* ---------------------------------------------------------------- memory */

/* The trainer allocates and frees the same activation sizes every micro-batch. Handing large
 * freed blocks straight back to the system (glibc unmaps anything over its mmap threshold) would
 * make every step pay page faults on fresh memory, so freed blocks wait in a small cache for the
 * next request of exactly the same size. The trainer's byte accounting (memtrack) counts what is
 * requested; the cache only keeps the process from re-faulting it. Single-threaded by contract:
 * the core allocates from one thread. */
enum { CPU_CACHE_ENTRIES = 256 };
#define CPU_CACHE_MAX_BYTES ((size_t)2 << 30)

typedef struct cached_block {
    void *ptr;
    size_t bytes;   /* rounded size */
    int in_use;
} cached_block;

static cached_block cache[CPU_CACHE_ENTRIES];
static size_t cache_idle_bytes;

static void *cpu_alloc(size_t bytes) {
    /* aligned_alloc wants a size that is a multiple of the alignment */
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    int empty = -1;
    for (int i = 0; i < CPU_CACHE_ENTRIES; i++) {
        if (cache[i].ptr && !cache[i].in_use && cache[i].bytes == rounded) {
            cache[i].in_use = 1;
            cache_idle_bytes -= rounded;
            return cache[i].ptr;
        }
        if (!cache[i].ptr && empty < 0) empty = i;
    }
    void *p = aligned_alloc(64, rounded);
    GT_CPU_CHECK(p != NULL, "out of memory allocating %zu bytes", bytes);
    if (empty >= 0) cache[empty] = (cached_block){p, rounded, 1};
    return p;
}

static void cpu_free(void *ptr) {
    if (!ptr) return;
    for (int i = 0; i < CPU_CACHE_ENTRIES; i++) {
        if (cache[i].ptr != ptr) continue;
        GT_CPU_CHECK(cache[i].in_use, "double free of %p", ptr);
        if (cache_idle_bytes + cache[i].bytes <= CPU_CACHE_MAX_BYTES) {
            cache[i].in_use = 0;
            cache_idle_bytes += cache[i].bytes;
        } else {
            free(ptr);
            cache[i] = (cached_block){0};
        }
        return;
    }
    free(ptr); /* allocated while the table was full */
}

static void cpu_zero(void *ptr, size_t bytes) {
    if (bytes) memset(ptr, 0, bytes);
}

static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memmove(dst, src, bytes);
}

static void cpu_synchronize(void) {}

/* ---------------------------------------------------------------- vector utilities */

/* Fixed-size chunks, so the summation tree is a function of n alone, never of the thread count:
 * each chunk is summed in double over SUMSQ_LANES interleaved lanes (element i into lane i % 8,
 * which the compiler vectorises), the lanes added in order, then the chunk sums in order. */
#define SUMSQ_CHUNK 8192
#define SUMSQ_LANES 8

static double cpu_sumsq(const float *x, size_t n) {
    if (n == 0) return 0.0;
    size_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *partial = GT_CPU_MALLOC(nchunks * sizeof(double));
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        size_t lo = c * SUMSQ_CHUNK, hi = lo + SUMSQ_CHUNK < n ? lo + SUMSQ_CHUNK : n;
        double acc[SUMSQ_LANES] = {0};
        size_t i = lo;
        for (; i + SUMSQ_LANES <= hi; i += SUMSQ_LANES)
            for (int l = 0; l < SUMSQ_LANES; l++) acc[l] += (double)x[i + l] * (double)x[i + l];
        for (int l = 0; i < hi; i++, l++) acc[l] += (double)x[i] * (double)x[i];
        double s = 0.0;
        for (int l = 0; l < SUMSQ_LANES; l++) s += acc[l];
        partial[c] = s;
    }
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += partial[c];
    free(partial);
    return total;
}

static void cpu_scale(float *x, size_t n, float s) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* torch.optim.AdamW, single-tensor path (torch/optim/adamw.py, _single_tensor_adamw), step by step:
 *   param.mul_(1 - lr*wd)
 *   exp_avg.lerp_(grad, 1 - beta1)              -> m + (1-b1)*(g - m)   (torch's lerp for weight < 0.5)
 *   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1-beta2)
 *   step_size = lr / (1 - beta1^t) ; bc2_sqrt = sqrt(1 - beta2^t)      (python doubles)
 *   denom = exp_avg_sq.sqrt() / bc2_sqrt + eps
 *   param.addcdiv_(exp_avg, denom, value=-step_size)
 * The scalars come from gt_adamw_step_scalars (ops.h), shared with the CUDA backend. */
static void cpu_adamw(float *param, float *exp_avg, float *exp_avg_sq, const float *grad, size_t n,
                      float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
    GT_CPU_CHECK(t >= 1, "adamw step count t=%d must start at 1", t);
    const gt_adamw_scalars k = gt_adamw_step_scalars(lr, beta1, beta2, weight_decay, t);
    const float decay = k.decay, w1 = k.w1, w2 = k.w2, step_size = k.step_size, bc2_sqrt = k.bc2_sqrt;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float p = param[i] * decay;
        float m = exp_avg[i] + w1 * (g - exp_avg[i]);
        float v = exp_avg_sq[i] * beta2 + w2 * g * g;
        float denom = sqrtf(v) / bc2_sqrt + eps;
        p = p + (-step_size) * m / denom;
        param[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

static void cpu_to_working(void *working, const float *master, size_t n) {
    cpu_copy(working, master, n * sizeof(float));
}

static void cpu_to_master(float *master, const void *working, size_t n) {
    cpu_copy(master, working, n * sizeof(float));
}

/* ---------------------------------------------------------------- the tables */

/* What both tables share: the memory functions and the fp32 optimizer utilities. The kernels can
 * store the (B, NH, T, T) attention probabilities for backward (tests use that path), but the blocked
 * attention rebuilds them from q, k and lse with one product per query block for less than the
 * traffic of storing and reading them: llama100m's no-recompute step took the same CPU seconds either
 * way (docs/cpu-speed.md) and keeps 576 MiB less. */
#define CPU_COMMON_ENTRIES                                                                  \
    .name = "cpu", .can_keep_attention_probs = 0,                                           \
    .alloc = cpu_alloc, .free = cpu_free, .zero = cpu_zero, .copy_to_device = cpu_copy,     \
    .copy_to_host = cpu_copy, .copy = cpu_copy, .synchronize = cpu_synchronize,             \
    .sumsq = cpu_sumsq, .scale = cpu_scale, .adamw = cpu_adamw

static const gt_ops cpu_ops = {
    CPU_COMMON_ENTRIES,
    .act_bytes = 4,
    GT_CPU_LAYER_ENTRIES(),
    .matmul_forward = gt_cpu_matmul_forward,
    .matmul_backward = gt_cpu_matmul_backward,
    .to_working = cpu_to_working,
    .to_master = cpu_to_master,
};

/* The same layers on bf16 working tensors; the linear layers go to oneDNN (cpu_bf16.c). */
static const gt_ops cpu_bf16_ops = {
    CPU_COMMON_ENTRIES,
    .act_bytes = 2,
    GT_CPU_LAYER_ENTRIES(_bf16),
    .matmul_forward = gt_cpu_matmul_forward_bf16,
    .matmul_backward = gt_cpu_matmul_backward_bf16,
    .to_working = gt_cpu_to_working_bf16,
    .to_master = gt_cpu_to_master_bf16,
};

const gt_ops *gt_ops_cpu(void) { return &cpu_ops; }

const gt_ops *gt_ops_cpu_bf16(char *why, size_t why_len) {
    return gt_dnnl_available(why, why_len) ? &cpu_bf16_ops : NULL;
}
