/* mfu.c — the GPU peaks of model FLOPs utilisation (mfu.h). */
#include "mfu.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* Dense (no sparsity) peaks in TFLOP/s from NVIDIA's product datasheets: bf16 on the tensor cores,
 * fp32 on the CUDA cores. A row matches when its pattern appears in the upper-cased device name as
 * whole words (not inside a longer name: "A10" is not "A100", "H200" is not "GH200", "L40" is not
 * "L40S"); the first matching row wins, so the variants come before their family. 0: not known. */
static const struct {
    const char *pattern, *name;
    double bf16, fp32;
} peaks[] = {
    {"H100 PCIE", "H100 PCIe", 756.0, 51.0},
    {"H100 NVL", "H100 NVL", 835.0, 60.0},
    {"H100", "H100 SXM", 989.0, 67.0},
    {"H800 PCIE", "H800 PCIe", 756.0, 51.0},
    {"H800", "H800 SXM", 989.0, 67.0},
    {"H200 NVL", "H200 NVL", 835.0, 60.0},
    {"H200", "H200 SXM", 989.0, 67.0},
    {"GH200", "GH200", 989.0, 67.0},
    {"B200", "B200", 2250.0, 0.0},
    {"A100", "A100", 312.0, 19.5},
    {"A800", "A800", 312.0, 19.5},
    {"A30", "A30", 165.0, 10.3},
    {"A40", "A40", 149.7, 37.4},
    {"A10", "A10", 125.0, 31.2},
    {"L40S", "L40S", 362.0, 91.6},
    {"L40", "L40", 181.0, 90.5},
    {"L4", "L4", 121.0, 30.3},
    {"RTX A6000", "RTX A6000", 154.8, 38.7},
    {"RTX 4090", "GeForce RTX 4090", 165.2, 82.6},
};

static int word_char(int c) { return isalnum((unsigned char)c); }

/* PATTERN in TEXT, not preceded or followed by a letter or digit. */
static int has_words(const char *text, const char *pattern) {
    size_t n = strlen(pattern);
    for (const char *p = strstr(text, pattern); p; p = strstr(p + 1, pattern)) {
        if ((p == text || !word_char(p[-1])) && !word_char(p[n])) return 1;
    }
    return 0;
}

double gt_gpu_peak_flops(const char *device_name, int bf16, char *which, size_t which_len) {
    char up[256];
    size_t i = 0;
    for (; device_name && device_name[i] && i + 1 < sizeof up; i++) up[i] = (char)toupper((unsigned char)device_name[i]);
    up[i] = '\0';
    /* "A100-SXM4-80GB": the dashes of some names separate words as spaces do */
    for (char *p = up; *p; p++)
        if (*p == '-' || *p == '_') *p = ' ';
    for (size_t k = 0; k < sizeof peaks / sizeof peaks[0]; k++) {
        if (!has_words(up, peaks[k].pattern)) continue;
        if (which) snprintf(which, which_len, "%s", peaks[k].name);
        return 1e12 * (bf16 ? peaks[k].bf16 : peaks[k].fp32);
    }
    if (which && which_len) which[0] = '\0';
    return 0.0;
}
