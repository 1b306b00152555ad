/*
 * test_cudnn_graph.c — the cuDNN graphs of train.cuda_attention = cudnn (cuda_attention_cudnn.cu) are
 * well formed, as far as that can be checked without a device.
 *
 *   test_cudnn_graph                   descriptors and wiring
 *   test_cudnn_graph DEVICE.json       also heuristics and plan compilation for the described device
 *
 * For the forward and the backward graph at several shapes (multi-head and grouped-query, HD 24 to
 * 128, T not a multiple of the tiles), gt_cuda_attention_cudnn_graph_check() builds every tensor and
 * operation descriptor and finalizes each (cuDNN checks there the attribute types, the data types,
 * and that dimensions and strides agree), checks the wiring (every virtual tensor written once and
 * read), and finalizes the operation graph.
 *
 * With a device description (a cuDNN >= 9.8 device-properties JSON; tests/gpu/h200-device.json is an
 * H200 written by hand from its datasheet: sm_90, 132 SMs, 227 KiB of shared memory per block, 50 MiB
 * of L2) it goes on as on a GPU: heuristics mode A (then the fallback list), and the execution plan
 * of each engine config in turn, which is where cuDNN compiles the kernel (NVRTC) for that device.
 * Without a driver (tests/scripts/cudnn_graph_aot.sh gives it the toolkit's stub libcuda) loading the
 * compiled kernel fails; that point counts as success ("compiled for the described device"): an
 * engine took the graph. The numbers are NOT checked here (tests/gpu/test_ops_cuda.c does that on a
 * GPU).
 *
 * Needs libcudnn.so.9 on the library path; exits 77 (skipped) when it cannot be loaded, when gtrain
 * was built without cuDNN's headers, or when this cuDNN refuses the device description.
 */
#include <stdio.h>
#include <string.h>

long gt_cuda_attention_cudnn_calls(void);
int gt_cuda_attention_cudnn_graph_check(int backward, int B, int T, int NH, int NKV, int HD, const char *device_json,
                                        char *why, size_t n);

/* the whole file at path, or NULL */
static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

int main(int argc, char **argv) {
    const char *device = NULL;
    if (argc > 1 && !(device = read_file(argv[1]))) {
        printf("cannot read %s\n", argv[1]);
        return 2;
    }
    static const struct { int B, T, NH, NKV, HD; } shapes[] = {
        {2, 77, 4, 2, 64}, {1, 130, 2, 1, 128}, {2, 128, 4, 4, 128}, {3, 33, 3, 3, 24}, {1, 2048, 32, 8, 64},
    };
    char why[320];
    int failures = 0, checks = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            int ok = gt_cuda_attention_cudnn_graph_check(bwd, shapes[i].B, shapes[i].T, shapes[i].NH, shapes[i].NKV,
                                                         shapes[i].HD, device, why, sizeof why);
            if (!ok && checks == 0 &&
                (strstr(why, "cannot load cuDNN") || strstr(why, "without cuDNN's headers") ||
                 strstr(why, "device description was refused"))) {
                printf("SKIP cudnn graph: %s\n", why);
                return 77;
            }
            const int compiled = !ok && device && strstr(why, "compiled for the described device") != NULL;
            checks++;
            printf("%s %-8s B%d T%d NH%d NKV%d HD%d%s%s\n", ok || compiled ? "ok  " : "FAIL", bwd ? "backward" : "forward",
                   shapes[i].B, shapes[i].T, shapes[i].NH, shapes[i].NKV, shapes[i].HD,
                   ok && device ? ": plan built" : ok ? "" : ": ", ok ? "" : why);
            if (!ok && !compiled) failures++;
        }
    /* building graphs is not running them */
    checks++;
    if (gt_cuda_attention_cudnn_calls() != 0) {
        failures++;
        printf("FAIL a graph check counted as a cuDNN call\n");
    }
    printf("%d of %d checks failed\n", failures, checks);
    return failures ? 1 : 0;
}
