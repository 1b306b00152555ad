/*
 * cuda_version.cu — the versions `gtrain --version` reports for the CUDA build: the CUDA runtime
 * it links, the driver (if one is installed) and NCCL. Kept apart from the kernels: it needs no
 * GPU and is the one place outside src/dist that includes nccl.h.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>

extern "C" {
#include "ops.h"
}

/* 12040 -> "12.4" (CUDA's encoding: 1000 * major + 10 * minor) */
static void cuda_version_text(int v, char *out, size_t len) {
    if (v <= 0) snprintf(out, len, "none");
    else snprintf(out, len, "%d.%d", v / 1000, (v % 1000) / 10);
}

extern "C" void gt_cuda_versions(char *buf, size_t len) {
    int runtime = 0, driver = 0, nccl = 0;
    char rt[32], dr[32];
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    cuda_version_text(runtime, rt, sizeof rt);
    cuda_version_text(driver, dr, sizeof dr);
    if (ncclGetVersion(&nccl) != ncclSuccess) nccl = 0;
    /* NCCL >= 2.9 encodes 10000 * major + 100 * minor + patch */
    snprintf(buf, len, "CUDA: runtime %s (built with %d.%d), driver %s; NCCL: %d.%d.%d (built with %d.%d.%d)", rt,
             CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10, dr, nccl / 10000, (nccl % 10000) / 100, nccl % 100,
             NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}
