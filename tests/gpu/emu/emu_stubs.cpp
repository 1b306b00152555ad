/*
 * emu_stubs.cpp — what the emulated CUDA backend takes from the files the emulation does not compile:
 *
 *   cuda_matmul.cu (cuBLASLt)  -> gt_cuda_matmul_forward / gt_cuda_matmul_backward as reference loops with the
 *       same signatures and semantics: out (N, OC) = inp (N, IC) @ W^T with W (OC, IC), in the working type
 *       (fp32 accumulation, one rounding of the result); dinp (N, IC) = dout @ W, plus the old dinp when
 *       accumulating (beta = 1: the old value, widened, added to the fp32 sum before the one rounding);
 *       dweight (OC, IC) fp32 += inp^T-dout products, always accumulated (beta = 1). An empty inner
 *       dimension leaves a zero output (or the old one, accumulating), as lt_matmul does. The matmul
 *       checks of the emulated test compare this stand-in with the CPU backend, not cuBLASLt.
 *   cuda_attention_cudnn.cu (cuDNN) -> never taken: its entries return 0 ("run the default kernels"),
 *       its call counter stays 0, cuDNN reports itself as not loaded. train.cuda_attention = cudnn (or
 *       forcing "cudnn") therefore runs the default kernels. The variant selection itself is
 *       cuda_attention.cu's own, and cuda_attention_mma.cu IS emulated (its inline PTX through
 *       include/cuda_ptx.cuh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_attention.cuh"

/* ---------------------------------------------------------------- matmul */

/* The loops run over fp32 copies of the operands, ordered so that the innermost loop runs across
 * independent outputs (it vectorises) while each output still sums its products one at a time in the
 * order of the inner dimension: the same operations, in the same order, as the plain dot products
 * (this build never contracts or reassociates), at a fraction of the time the trainer's test needs. */
/* these loops run where cuBLASLt would: on the device side (its memory open to them) */
struct device_side {
    device_side() { gt_emu_device_begin(); }
    ~device_side() { gt_emu_device_end(); }
};

template <typename T>
static std::vector<float> widen(const T *p, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = load_f(p + i);
    return v;
}

template <typename T>
void gt_cuda_matmul_forward(void *out, const void *inp, const void *weight, int N, int IC, int OC) {
    const device_side on_device;
    const std::vector<float> x = widen((const T *)inp, (size_t)N * IC), w = widen((const T *)weight, (size_t)OC * IC);
    std::vector<float> wt((size_t)IC * OC), acc((size_t)OC);
    for (int oc = 0; oc < OC; oc++)
        for (int i = 0; i < IC; i++) wt[(size_t)i * OC + oc] = w[(size_t)oc * IC + i];
    T *o = (T *)out;
    for (int n = 0; n < N; n++) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int i = 0; i < IC; i++) {
            const float xi = x[(size_t)n * IC + i], *wr = &wt[(size_t)i * OC];
            for (int oc = 0; oc < OC; oc++) acc[oc] += xi * wr[oc];
        }
        for (int oc = 0; oc < OC; oc++) store_f(o + (size_t)n * OC + oc, acc[oc]);
    }
}

template <typename T>
void gt_cuda_matmul_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight, int N,
                             int IC, int OC, int accumulate_dinp) {
    const device_side on_device;
    const std::vector<float> d = widen((const T *)dout, (size_t)N * OC);
    std::vector<float> acc((size_t)IC);
    if (dinp) {
        const std::vector<float> w = widen((const T *)weight, (size_t)OC * IC);
        T *di = (T *)dinp;
        for (int n = 0; n < N; n++) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int oc = 0; oc < OC; oc++) {
                const float dn = d[(size_t)n * OC + oc], *wr = &w[(size_t)oc * IC];
                for (int i = 0; i < IC; i++) acc[i] += dn * wr[i];
            }
            for (int i = 0; i < IC; i++) {
                float a = acc[i];
                if (accumulate_dinp) a += load_f(di + (size_t)n * IC + i);
                store_f(di + (size_t)n * IC + i, a);
            }
        }
    }
    if (dweight && N > 0) {
        const std::vector<float> x = widen((const T *)inp, (size_t)N * IC);
        for (int oc = 0; oc < OC; oc++) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int n = 0; n < N; n++) {
                const float dn = d[(size_t)n * OC + oc], *xr = &x[(size_t)n * IC];
                for (int i = 0; i < IC; i++) acc[i] += xr[i] * dn;
            }
            for (int i = 0; i < IC; i++) dweight[(size_t)oc * IC + i] += acc[i];
        }
    }
}

GT_OPS_MATMUL(GT_CUDA_INSTANTIATE)

/* ---------------------------------------------------------------- attention variant: cudnn never taken */

extern "C" long gt_cuda_attention_cudnn_calls(void) { return 0; }

int gt_cuda_attention_cudnn_forward(void *, float *, const void *, const void *, const void *, int, int, int, int, int,
                                    float) {
    return 0;
}
int gt_cuda_attention_cudnn_backward(void *, void *, void *, const void *, const void *, const void *, const void *,
                                     const void *, const float *, int, int, int, int, int, float) {
    return 0;
}

extern "C" long gt_cuda_attention_cudnn_version(char *why, size_t n) {
    if (why && n) snprintf(why, n, "cuDNN is not part of the CPU emulation (tests/gpu/emu)");
    return 0;
}
extern "C" int gt_cuda_attention_cudnn_shape_ok(int, int, int, float) { return 0; }
extern "C" const char *gt_cuda_attention_cudnn_last_fallback(void) { return "cuDNN is not emulated"; }
