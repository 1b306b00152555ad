/* The MFU's peak by GPU name (src/core/mfu.c): the names the CUDA runtime reports for the GPUs users
 * have, each to its datasheet's dense peak; variants before their family; unknown names give 0. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "mfu.h"

static void expect(const char *name, int bf16, double tflops, const char *row) {
    char which[64];
    double got = gt_gpu_peak_flops(name, bf16, which, sizeof which);
    CHECK(got == tflops * 1e12, "'%s': %g TFLOP/s", name, got / 1e12);
    CHECK(strcmp(which, row) == 0, "'%s': row '%s'", name, which);
}

static void peaks_by_name(void) {
    expect("NVIDIA H100 80GB HBM3", 1, 989, "H100 SXM");
    expect("NVIDIA H100 80GB HBM3", 0, 67, "H100 SXM");
    expect("NVIDIA H100 PCIe", 1, 756, "H100 PCIe");
    expect("NVIDIA H100 NVL", 1, 835, "H100 NVL");
    expect("NVIDIA H200", 1, 989, "H200 SXM");
    expect("NVIDIA H200 NVL", 1, 835, "H200 NVL");
    expect("NVIDIA GH200 480GB", 1, 989, "GH200");
    expect("NVIDIA A100-SXM4-80GB", 1, 312, "A100");
    expect("NVIDIA A100-PCIE-40GB", 0, 19.5, "A100");
    expect("NVIDIA A100 80GB PCIe", 1, 312, "A100");
    expect("NVIDIA A10", 1, 125, "A10");
    expect("NVIDIA L40S", 1, 362, "L40S");
    expect("NVIDIA L40", 1, 181, "L40");
    expect("NVIDIA L4", 1, 121, "L4");
    expect("NVIDIA GeForce RTX 4090", 1, 165.2, "GeForce RTX 4090");
    expect("NVIDIA B200", 0, 0, "B200"); /* no fp32 figure in the table: no MFU */
}

static void unknown_names(void) {
    expect("NVIDIA A10G", 1, 0, "");      /* not the A10 */
    expect("Tesla V100-SXM2-16GB", 1, 0, "");
    expect("", 1, 0, "");
    CHECK(gt_gpu_peak_flops(NULL, 1, NULL, 0) == 0, "a NULL name");
}

int main(void) {
    peaks_by_name();
    unknown_names();
    if (check_failures) {
        printf("test_mfu: %d FAILURES\n", check_failures);
        return 1;
    }
    printf("test_mfu: every name gives its datasheet's dense peak, unknown names none\n");
    return 0;
}
