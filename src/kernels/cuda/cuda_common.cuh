/*
 * cuda_common.cuh — private to src/kernels/cuda/: what every CUDA source of the backend shares.
 *
 *   - CUDA_CHECK / CUDA_CHECK_LAUNCH: abort with file:line on any failed CUDA call (never continue);
 *   - the working type: `float` (fp32 mode) or `bf16` (bf16 mode). Kernels are templates over it and
 *     do all arithmetic in fp32: load_f() widens, store_f() rounds (round-to-nearest-even);
 *   - ops.h (its dropout RNG and index are callable on the device too);
 *   - deterministic warp/block reductions (fixed trees, no atomics);
 *   - the allocator entry points (cuda_ops.cu) that other files use for scratch buffers, and the
 *     fault flag kernels raise on a bad token id;
 *   - the ops, declared from ops.h's list: each family's file (ops.h's table) defines its ops and
 *     instantiates them with GT_CUDA_INSTANTIATE; cuda_ops.cu builds the table from the same list.
 *
 * Everything runs on the legacy default stream (stream 0), so host copies (cudaMemcpy) and the
 * caching allocator's reuse of a freed block are ordered after every earlier kernel.
 */
#ifndef GT_CUDA_COMMON_CUH
#define GT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "ops.h"
}

typedef __nv_bfloat16 bf16;

/* Fault reporting. Kernels run asynchronously, so a fault inside one surfaces at some later CUDA
 * call. With GTRAIN_CUDA_SYNC=1 in the environment (read once) the backend synchronises after every
 * kernel launch and after every op of the table (cuBLASLt calls included), and names the op and its
 * shapes in the message: slow, for finding the op that faults. gt_cuda_current_op() is the op being
 * run in that mode ("" otherwise). */
int gt_cuda_sync_enabled(void);
const char *gt_cuda_current_op(void);
void gt_cuda_fail_at(cudaError_t err, const char *what, const char *file, int line);
void gt_cuda_check_launch_at(const char *file, int line);

#define CUDA_CHECK(call)                                                                         \
    do {                                                                                         \
        cudaError_t cuda_check_err_ = (call);                                                    \
        if (cuda_check_err_ != cudaSuccess) gt_cuda_fail_at(cuda_check_err_, #call, __FILE__, __LINE__); \
    } while (0)

/* after every kernel launch: catches bad launch configurations at the call site, and with
 * GTRAIN_CUDA_SYNC=1 faults of the kernel itself */
#define CUDA_CHECK_LAUNCH() gt_cuda_check_launch_at(__FILE__, __LINE__)

#define GT_CUDA_FAIL(...)                                                                        \
    do {                                                                                         \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                          \
        fprintf(stderr, __VA_ARGS__);                                                            \
        fputc('\n', stderr);                                                                     \
        abort();                                                                                 \
    } while (0)

/* ---------------------------------------------------------------- working type */

__device__ __forceinline__ float load_f(const float *p) { return *p; }
__device__ __forceinline__ float load_f(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_f(float *p, float v) { *p = v; }
/* __float2bfloat16 rounds to nearest even */
__device__ __forceinline__ void store_f(bf16 *p, float v) { *p = __float2bfloat16(v); }

/* ---------------------------------------------------------------- attention tensors */

/* row 0 of head h of batch b of a (B, T, heads, HD) tensor, seen as T rows of `stride` = heads * HD
 * elements (the attention kernels' q, k, v, out and gradients) */
template <typename T>
__device__ __forceinline__ T *head_rows(T *x, int b, int Tn, size_t stride, int h, int HD) {
    return x + (size_t)b * Tn * stride + (size_t)h * HD;
}

/* ---------------------------------------------------------------- 16-byte accesses */

/* VEC elements of the working type in one 16-byte (128-bit) load or store: 8 bf16 or 4 float. The
 * elementwise kernels take this path when every pointer is 16-byte aligned (cudaMalloc blocks are,
 * and so are offsets that are multiples of 16 bytes) and finish a tail of n % VEC elements singly. */
template <typename T>
struct __align__(16) pack16 {
    static constexpr int VEC = 16 / (int)sizeof(T);
    T v[16 / sizeof(T)];
};

template <typename T>
__device__ __forceinline__ pack16<T> load16(const T *p) {
    pack16<T> r;
    *reinterpret_cast<int4 *>(&r) = *reinterpret_cast<const int4 *>(p);
    return r;
}

template <typename T>
__device__ __forceinline__ void store16(T *p, const pack16<T> &r) {
    *reinterpret_cast<int4 *>(p) = *reinterpret_cast<const int4 *>(&r);
}

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ---------------------------------------------------------------- deterministic reductions */

/* xor butterfly: every lane ends with the same bits (a+b == b+a exactly) */
__device__ __forceinline__ float warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * `scratch` holds 32 floats of shared memory; the block must not be reusing it concurrently. */
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* protects scratch from a previous use */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ double block_sum_d(double v, double *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0;
    return warp_sum_d(v);
}

/* ---------------------------------------------------------------- shared helpers */

static inline unsigned grid_for(size_t n, int threads, size_t max_blocks) {
    size_t blocks = (n + (size_t)threads - 1) / (size_t)threads;
    if (blocks < 1) blocks = 1;
    if (blocks > max_blocks) blocks = max_blocks;
    return (unsigned)blocks;
}

/* the caching allocator (cuda_ops.cu), also used for kernels' scratch buffers */
void *gt_cuda_alloc(size_t bytes);
void gt_cuda_free(void *ptr);

/* The backend's fault flag (cuda_ops.cu, which take_fault reads and clears): {raised, position, id,
 * V, site} in device memory, the first token id (site 0) or target (site 1) outside [0, V) that any
 * kernel met since the last take_fault. Kernels never read through such an id (a zero row, a zero
 * loss), so the step finishes with finite numbers and the core stops the run with the message at the
 * step's end. Allocated on the first call. */
int *gt_cuda_fault_flag(void);

__device__ __forceinline__ void raise_token_fault(int *flag, int position, int id, int V, int site) {
    if (atomicCAS(&flag[0], 0, 1) == 0) {
        flag[1] = position;
        flag[2] = id;
        flag[3] = V;
        flag[4] = site;
    }
}

/* ---------------------------------------------------------------- the ops */

/* From ops.h's list: for a W entry the template gt_cuda_<op><E>, E = float or bf16 the working type
 * (gt_cuda_rmsnorm_forward<bf16>, ...); for an F entry the function gt_cuda_<op> (gt_cuda_sumsq, ...).
 * A family's file ends with GT_OPS_<FAMILY>(GT_CUDA_INSTANTIATE), which instantiates its templates
 * for both working types. */
#define GT_CUDA_DECLARE(kind, op, ret, params, args, shapes) GT_CUDA_DECLARE_##kind(op, ret, params)
#define GT_CUDA_DECLARE_W(op, ret, params) template <typename E> ret gt_cuda_##op params;
#define GT_CUDA_DECLARE_F(op, ret, params) ret gt_cuda_##op params;
GT_OPS(GT_CUDA_DECLARE)

#define GT_CUDA_INSTANTIATE(kind, op, ret, params, args, shapes) GT_CUDA_INSTANTIATE_##kind(op, ret, params)
#define GT_CUDA_INSTANTIATE_W(op, ret, params) template ret gt_cuda_##op<float> params; template ret gt_cuda_##op<bf16> params;
#define GT_CUDA_INSTANTIATE_F(op, ret, params)

/* The attention kernels gt_ops_cuda was asked for (cuda_attention.cu). */
void gt_cuda_attention_select(gt_cuda_attention attention);

#endif
