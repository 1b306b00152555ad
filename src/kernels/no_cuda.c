/*
 * no_cuda.c — stands in for the CUDA backend when gtrain is built without nvcc, so the core can
 * ask for it and get a clear reason instead of a link error.
 */
#include <stdio.h>

#include "ops.h"

const gt_ops *gt_ops_cuda(int bf16, gt_cuda_attention attention, char *why, size_t why_len) {
    (void)bf16;
    (void)attention;
    snprintf(why, why_len, "this gtrain was built without the CUDA backend (no nvcc at build time)");
    return NULL;
}

void gt_cuda_versions(char *buf, size_t len) { snprintf(buf, len, "CUDA: not built (no nvcc at build time); NCCL: not built"); }
