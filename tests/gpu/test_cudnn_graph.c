/*
 * test_cudnn_graph.c — the cuDNN graphs of GTRAIN_CUDA_ATTENTION=cudnn (cuda_attention_cudnn.cu) are
 * well formed, as far as that can be checked without a device.
 *
 * For the forward and the backward graph at several shapes (multi-head and grouped-query, HD 24 to
 * 128, T not a multiple of the tiles), gt_cuda_attention_cudnn_graph_check() builds every tensor and
 * operation descriptor and finalizes each: cuDNN checks there the attribute types, the data types,
 * and that dimensions and strides agree (matmul shapes, reductions, broadcasts, transposed views).
 * What needs a device is NOT checked here: the operation graph, whether an engine takes the graph,
 * and the numbers (tests/gpu/test_ops_cuda.c does those on a GPU).
 *
 * Needs libcudnn.so.9 on the library path (for instance the lib/ folder of PyTorch's nvidia-cudnn
 * pip package); exits 77 (skipped) when it cannot be loaded or gtrain was built without cuDNN's
 * headers.
 */
#include <stdio.h>
#include <string.h>

long gt_cuda_attention_cudnn_calls(void);
int gt_cuda_attention_cudnn_graph_check(int backward, int B, int T, int NH, int NKV, int HD, char *why, size_t n);

int main(void) {
    static const struct { int B, T, NH, NKV, HD; } shapes[] = {
        {2, 77, 4, 2, 64}, {1, 130, 2, 1, 128}, {2, 128, 4, 4, 128}, {3, 33, 3, 3, 24}, {1, 2048, 32, 8, 64},
    };
    char why[320];
    int failures = 0, checks = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            const int ok = gt_cuda_attention_cudnn_graph_check(bwd, shapes[i].B, shapes[i].T, shapes[i].NH,
                                                               shapes[i].NKV, shapes[i].HD, why, sizeof why);
            if (!ok && checks == 0 && (strstr(why, "cannot load cuDNN") || strstr(why, "without cuDNN's headers"))) {
                printf("SKIP cudnn graph: %s\n", why);
                return 77;
            }
            checks++;
            printf("%s %-8s B%d T%d NH%d NKV%d HD%d%s%s\n", ok ? "ok  " : "FAIL", bwd ? "backward" : "forward",
                   shapes[i].B, shapes[i].T, shapes[i].NH, shapes[i].NKV, shapes[i].HD, ok ? "" : ": ", ok ? "" : why);
            if (!ok) failures++;
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
