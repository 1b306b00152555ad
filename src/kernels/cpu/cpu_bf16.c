/*
 * cpu_bf16.c — what only the bf16 table of the CPU backend has: its linear layers, which go to
 * oneDNN (cpu_dnnl.c) on the working weights as they are, and the master <-> working conversions
 * (the only fp32 -> bf16 conversion of a weight is to_working, once per optimizer update). The bf16
 * table itself is in ops_cpu.c beside the fp32 one; its other layers are the fp32 kernels compiled
 * for bf16 (cpu_elem.h), the optimizer utilities and the allocator are the fp32 table's.
 *
 * In that table every working tensor (activations, their gradients, working weights) is bf16, as in
 * the CUDA backend's bf16 table; weight gradients, master weights, moments, norm statistics and
 * losses stay fp32 (ops.h). The products repeat bit for bit at a fixed thread count (cpu_dnnl.c).
 */
#include "cpu_kernels.h"

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

const char *gt_cpu_bf16_isa(void) { return gt_dnnl_isa(); }
