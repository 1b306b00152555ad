/*
 * cpu_optimizer.c — the optimizer family of ops.h on the CPU: the fp32 vector utilities of the
 * optimizer step (sum of squares, scale, AdamW), which both tables share, and the master <-> working
 * conversions of each table (plain copies for fp32, round to nearest even for bf16).
 */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

/* ---------------------------------------------------------------- fp32 vector utilities */

/* Fixed-size chunks, so the summation tree is a function of n alone, never of the thread count:
 * each chunk is summed in double over SUMSQ_LANES interleaved lanes (element i into lane i % 8,
 * which the compiler vectorises), the lanes added in order, then the chunk sums in order. */
#define SUMSQ_CHUNK 8192
#define SUMSQ_LANES 8

double gt_cpu_sumsq(const float *x, size_t n) {
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

void gt_cpu_scale(float *x, size_t n, float s) {
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
void gt_cpu_adamw(float *param, float *exp_avg, float *exp_avg_sq, const float *grad, size_t n,
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

/* ---------------------------------------------------------------- master <-> working */

/* fp32 working tensors: plain copies */
void gt_cpu_to_working(void *working, const float *master, size_t n) {
    if (n && working != master) memmove(working, master, n * sizeof(float));
}

void gt_cpu_to_master(float *master, const void *working, size_t n) {
    if (n && master != working) memmove(master, working, n * sizeof(float));
}

/* bf16 working tensors: the only fp32 -> bf16 conversion of a weight is to_working, once per
 * optimizer update (round to nearest, ties to even: cpu_kernels.h) */
void gt_cpu_to_working_bf16(void *working_, const float *master, size_t n) {
    uint16_t *working = working_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) working[i] = gt_f32_to_bf16(master[i]);
}

void gt_cpu_to_master_bf16(float *master, const void *working_, size_t n) {
    const uint16_t *working = working_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) master[i] = gt_bf16_to_f32(working[i]);
}

