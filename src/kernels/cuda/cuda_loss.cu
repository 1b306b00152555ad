/*
 * cuda_loss.cu — the loss family of ops.h on the GPU: the fused softmax + cross-entropy of the LM
 * head (gt_cuda_crossentropy_forward, gt_cuda_crossentropy_backward, each <float> and <bf16>). One
 * block per row; fp32 exps, the row's sum in double over a fixed tree; a target outside [0, V)
 * raises the backend's fault flag (gt_cuda_fault_flag, take_fault) and is never read through.
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

#define THREADS 256
#define MAX_BLOCKS ((size_t)65535 * 4)

/* ---------------------------------------------------------------- cross-entropy */

#define CE_THREADS 512

/* one block per row: each thread keeps an online (max, sum) over its strided logits; the block then
 * takes the max of maxima and sums the rescaled partial sums in double (fixed tree) */
/* VEC16: each thread reads 16-byte groups of VEC logits (V a multiple of VEC, logits 16-byte
 * aligned) and folds a group into its (max, sum) at once: the group's max first, then one rescale and
 * VEC exps; otherwise single logits, strided */
template <typename T, bool VEC16>
__global__ void __launch_bounds__(CE_THREADS)
crossentropy_forward_kernel(float *losses, float *lse, const T *logits, const int32_t *targets, int V, int *fault) {
    __shared__ float fscratch[32];
    __shared__ double dscratch[32];
    const size_t row = blockIdx.x;
    const T *l = logits + row * V;
    float m = -INFINITY, s = 0.0f;
    if (VEC16) {
        constexpr int VEC = pack16<T>::VEC;
        for (int grp = threadIdx.x; grp < V / VEC; grp += blockDim.x) {
            const pack16<T> p = load16(l + (size_t)grp * VEC);
            float x[VEC], gm = -INFINITY;
#pragma unroll
            for (int e = 0; e < VEC; e++) x[e] = load_f(&p.v[e]), gm = fmaxf(gm, x[e]);
            if (gm > m) {
                s = m == -INFINITY ? 0.0f : s * expf(m - gm);
                m = gm;
            }
            if (m == -INFINITY) continue; /* all -inf so far: nothing to add */
#pragma unroll
            for (int e = 0; e < VEC; e++) s += expf(x[e] - m);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float x = load_f(l + j);
            if (x > m) {
                s = s * expf(m - x) + 1.0f;
                m = x;
            } else {
                s += expf(x - m);
            }
        }
    }
    /* block max */
    float mx = warp_max(m);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) fscratch[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = (threadIdx.x & 31) < (blockDim.x >> 5) ? fscratch[threadIdx.x & 31] : -INFINITY;
    mx = warp_max(mx);
    const double part = m == -INFINITY ? 0.0 : (double)s * exp((double)(m - mx));
    const double sum = block_sum_d(part, dscratch);
    if (threadIdx.x == 0) {
        const float row_lse = (float)((double)mx + log(sum));
        lse[row] = row_lse;
        const int tgt = targets[row];
        if (tgt >= V) raise_token_fault(fault, (int)row, tgt, V, 1); /* never read past the row */
        losses[row] = tgt < 0 || tgt >= V ? 0.0f : row_lse - load_f(l + tgt);
    }
}

__device__ __forceinline__ float ce_grad(float x, float row_lse, bool is_tgt, float dloss) {
    return __fmul_rn(__fsub_rn(expf(__fsub_rn(x, row_lse)), is_tgt ? 1.0f : 0.0f), dloss);
}

/* VEC16 as in forward: 16-byte groups (V a multiple of VEC, aligned), the same per-logit arithmetic */
template <typename T, bool VEC16>
__global__ void crossentropy_backward_kernel(T *logits, const float *lse, const int32_t *targets, int V, float dloss) {
    const size_t row = blockIdx.x;
    T *l = logits + row * V;
    const int tgt = targets[row];
    const float row_lse = lse[row];
    const bool valid = tgt >= 0 && tgt < V;
    if (VEC16) {
        constexpr int VEC = pack16<T>::VEC;
        for (int grp = threadIdx.x; grp < V / VEC; grp += blockDim.x) {
            pack16<T> p = load16(l + (size_t)grp * VEC);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                store_f(&p.v[e], valid ? ce_grad(load_f(&p.v[e]), row_lse, grp * VEC + e == tgt, dloss) : 0.0f);
            store16(l + (size_t)grp * VEC, p);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) store_f(l + j, valid ? ce_grad(load_f(l + j), row_lse, j == tgt, dloss) : 0.0f);
    }
}

template <typename T>
void gt_cuda_crossentropy_forward(float *losses, float *lse, const void *logits, const int32_t *targets, int BT, int V) {
    if (BT <= 0) return;
    int *fault = gt_cuda_fault_flag();
    if (V % pack16<T>::VEC == 0 && aligned16(logits))
        crossentropy_forward_kernel<T, true><<<BT, CE_THREADS>>>(losses, lse, (const T *)logits, targets, V, fault);
    else
        crossentropy_forward_kernel<T, false><<<BT, CE_THREADS>>>(losses, lse, (const T *)logits, targets, V, fault);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
void gt_cuda_crossentropy_backward(void *logits, const float *lse, const int32_t *targets, int BT, int V, float dloss) {
    if (BT <= 0) return;
    if (V % pack16<T>::VEC == 0 && aligned16(logits))
        crossentropy_backward_kernel<T, true><<<BT, CE_THREADS>>>((T *)logits, lse, targets, V, dloss);
    else
        crossentropy_backward_kernel<T, false><<<BT, CE_THREADS>>>((T *)logits, lse, targets, V, dloss);
    CUDA_CHECK_LAUNCH();
}

GT_OPS_LOSS(GT_CUDA_INSTANTIATE)
