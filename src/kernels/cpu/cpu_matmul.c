/*
 * cpu_matmul.c — the matmul family of ops.h on the CPU, the bias-free linear layer: for fp32 tensors
 * three OpenBLAS sgemm calls (gt_cpu_matmul_forward, gt_cpu_matmul_backward); for bf16 ones oneDNN
 * (or sgemm on widened copies where the CPU has no bf16 units) on the working weights as they are (gt_cpu_matmul_forward_bf16, gt_cpu_matmul_backward_bf16, through
 * cpu_dnnl.c), fp32 accumulation, each output rounded once; the products repeat bit for bit at a
 * fixed thread count (cpu_dnnl.c).
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

/* out (N, OC) = inp (N, IC) @ weight^T, rounded once ; weight (OC, IC) */
void gt_cpu_matmul_forward_bf16(void *out, const void *inp, const void *weight, int N, int IC, int OC) {
    gt_dnnl_gemm(N, OC, IC, inp, 0, weight, 1, out, 0, 0);
}

/* dinp (N, IC) = (or +=, added in fp32 then rounded) dout @ weight ; dweight (OC, IC) fp32 += dout^T @ inp */
void gt_cpu_matmul_backward_bf16(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                                 int N, int IC, int OC, int accumulate_dinp) {
    if (dinp && N > 0 && IC > 0) gt_dnnl_gemm(N, IC, OC, dout, 0, weight, 0, dinp, 0, accumulate_dinp);
    if (dweight && OC > 0 && IC > 0 && N > 0) gt_dnnl_gemm(OC, IC, N, dout, 1, inp, 0, dweight, 1, 1);
}
