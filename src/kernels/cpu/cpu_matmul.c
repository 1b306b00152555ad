/*
 * cpu_matmul.c — the bias-free linear layer on the CPU: three OpenBLAS sgemm calls.
 *
 * Weights are [out, in] as in Hugging Face, so forward is out = inp @ W^T. OpenBLAS threads a gemm
 * over M/N output tiles, not over the K reduction, so in practice each output element is summed in
 * an order fixed by the problem shape and runs repeat bit for bit; this rests on OpenBLAS's
 * behaviour, not on anything enforced here.
 */
#include <cblas.h>

#include "cpu_kernels.h"

/* out (N, OC) = inp (N, IC) @ weight^T ; weight (OC, IC) */
void gt_cpu_matmul_forward(void *out, const void *inp, const void *weight, int N, int IC, int OC) {
    if (N == 0 || OC == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, (const float *)inp, IC,
                (const float *)weight, IC, 0.0f, (float *)out, OC);
}

/* dinp (N, IC) = (or +=) dout (N, OC) @ weight (OC, IC) ;  dweight (OC, IC) += dout^T @ inp (N, IC).
 * Either output may be NULL when the caller does not need it. */
void gt_cpu_matmul_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                            const void *weight, int N, int IC, int OC, int accumulate_dinp) {
    if (dinp && N > 0 && IC > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, (const float *)dout, OC,
                    (const float *)weight, IC, accumulate_dinp ? 1.0f : 0.0f, (float *)dinp, IC);
    }
    if (dweight && OC > 0 && IC > 0 && N > 0) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, (const float *)dout, OC,
                    (const float *)inp, IC, 1.0f, dweight, IC);
    }
}
