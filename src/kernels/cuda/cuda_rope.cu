/*
 * cuda_rope.cu — the rope family of ops.h on the GPU: the rotary embedding and its inverse
 * (gt_cuda_rope_forward, gt_cuda_rope_backward, each <float> and <bf16>), fp32 arithmetic on the
 * model's (cos, sin) table, as the CPU backend computes it.
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

#define THREADS 256
#define MAX_BLOCKS ((size_t)65535 * 4)

/* ---------------------------------------------------------------- RoPE */

/* The (cos, sin) table (T_max, HD/2, 2) fp32 is the model's (gt_rope_table, already on the device),
 * the same numbers the CPU backend uses. One thread per rotated pair (i, i + HD/2); sign +1 forward,
 * -1 the inverse rotation; in place ok.
 * Grid: x over the NH * HD/2 pairs of one (b, t) row of heads, y over t, z over b (y and z
 * grid-stride, for T or B past the 65535 limit of those grid dimensions), so the position t and the
 * batch b come from the block index: the only per-element division is j / half in 32-bit unsigned
 * arithmetic (j < NH * HD/2, checked on the host to fit in 32 bits), never a 64-bit one. */
template <typename T>
__global__ void rope_kernel(T *out, const T *inp, const float *rope, const int32_t *doc, int Tn, int B, int NH,
                            int HD, float sign) {
    const unsigned half = (unsigned)HD / 2u, pairs = (unsigned)NH * half;
    const unsigned j = blockIdx.x * blockDim.x + threadIdx.x; /* (h, i) within the row of heads */
    if (j >= pairs) return;
    const unsigned h = j / half, i = j - h * half;
    for (int b = blockIdx.z; b < B; b += gridDim.z)
        for (int t = blockIdx.y; t < Tn; t += gridDim.y) {
            const size_t base = (((size_t)b * Tn + t) * NH + h) * HD; /* row (b, t, h) */
            const float x1 = load_f(inp + base + i), x2 = load_f(inp + base + i + half);
            const int pos = doc ? t - doc[(size_t)b * Tn + t] : t; /* restarts at each document */
            const float *cs = rope + ((size_t)pos * half + i) * 2;
            const float c = cs[0], si = sign * cs[1];
            store_f(out + base + i, __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, si)));
            store_f(out + base + i + half, __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, si)));
        }
}

/* The same with 16-byte accesses: thread j rotates the VEC consecutive pairs (i .. i + VEC-1, each with
 * its partner i + HD/2) of group j of the row of heads, reading their (cos, sin) as 2 VEC floats
 * (float4 loads). Taken when HD/2 is a multiple of VEC and the pointers are 16-byte aligned (then
 * every row, both halves and the table's group are too). Same per-pair arithmetic, same bits. */
template <typename T>
__global__ void rope_vec_kernel(T *out, const T *inp, const float *rope, const int32_t *doc, int Tn, int B, int NH,
                            int HD, float sign) {
    constexpr int VEC = pack16<T>::VEC;
    const unsigned half = (unsigned)HD / 2u, hgroups = half / (unsigned)VEC, groups = (unsigned)NH * hgroups;
    const unsigned j = blockIdx.x * blockDim.x + threadIdx.x; /* (h, group) within the row of heads */
    if (j >= groups) return;
    const unsigned h = j / hgroups, i = (j - h * hgroups) * (unsigned)VEC;
    for (int b = blockIdx.z; b < B; b += gridDim.z)
        for (int t = blockIdx.y; t < Tn; t += gridDim.y) {
            const size_t base = (((size_t)b * Tn + t) * NH + h) * HD; /* row (b, t, h) */
            const pack16<T> x1 = load16(inp + base + i), x2 = load16(inp + base + i + half);
            const int pos = doc ? t - doc[(size_t)b * Tn + t] : t; /* restarts at each document */
            const float4 *cs4 = reinterpret_cast<const float4 *>(rope + ((size_t)pos * half + i) * 2);
            float cs[2 * VEC];
#pragma unroll
            for (int q = 0; q < VEC / 2; q++) {
                const float4 f = cs4[q];
                cs[4 * q] = f.x, cs[4 * q + 1] = f.y, cs[4 * q + 2] = f.z, cs[4 * q + 3] = f.w;
            }
            pack16<T> o1, o2;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float a = load_f(&x1.v[e]), c2 = load_f(&x2.v[e]);
                const float c = cs[2 * e], si = sign * cs[2 * e + 1];
                store_f(&o1.v[e], __fsub_rn(__fmul_rn(a, c), __fmul_rn(c2, si)));
                store_f(&o2.v[e], __fadd_rn(__fmul_rn(c2, c), __fmul_rn(a, si)));
            }
            store16(out + base + i, o1);
            store16(out + base + i + half, o2);
        }
}

template <typename T>
static void rope_rotate(void *out, const void *inp, const float *rope, const int32_t *doc, int B, int Tn, int NH, int HD, float sign) {
    if (HD % 2 != 0) GT_CUDA_FAIL("rope needs an even head dim, got %d", HD);
    if (B <= 0 || Tn <= 0 || NH <= 0 || HD <= 0) return;
    /* the kernel's 32-bit pair index j < NH * HD/2 (and the grid's x blocks) must not overflow */
    const uint64_t pairs = (uint64_t)NH * (uint64_t)(HD / 2);
    if (pairs > (uint64_t)INT32_MAX) GT_CUDA_FAIL("rope: NH=%d x HD/2=%d pairs per row do not fit 32 bits", NH, HD / 2);
    constexpr int VEC = pack16<T>::VEC;
    const bool vec = (HD / 2) % VEC == 0 && aligned16(out) && aligned16(inp) && aligned16(rope);
    const uint64_t items = vec ? pairs / VEC : pairs; /* threads per row of heads */
    const unsigned threads = items < THREADS ? (unsigned)((items + 31) / 32 * 32) : THREADS; /* small heads */
    dim3 grid((unsigned)((items + threads - 1) / threads), (unsigned)(Tn < 65535 ? Tn : 65535),
              (unsigned)(B < 65535 ? B : 65535));
    if (vec) rope_vec_kernel<T><<<grid, threads>>>((T *)out, (const T *)inp, rope, doc, Tn, B, NH, HD, sign);
    else rope_kernel<T><<<grid, threads>>>((T *)out, (const T *)inp, rope, doc, Tn, B, NH, HD, sign);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
void gt_cuda_rope_forward(void *out, const void *inp, const float *rope, const int32_t *doc, int B, int Tn, int NH, int HD) {
    rope_rotate<T>(out, inp, rope, doc, B, Tn, NH, HD, 1.0f);
}

template <typename T>
void gt_cuda_rope_backward(void *dinp, const void *dout, const float *rope, const int32_t *doc, int B, int Tn, int NH, int HD) {
    rope_rotate<T>(dinp, dout, rope, doc, B, Tn, NH, HD, -1.0f);
}

GT_OPS_ROPE(GT_CUDA_INSTANTIATE)
