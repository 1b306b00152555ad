/*
 * cuda_pointwise.cu — the pointwise family of ops.h on the GPU, the row- and element-wise layers:
 * token embedding (forward and a deterministic backward), SwiGLU, the residual add with dropout on
 * the branch. gt_cuda_<op><float> and gt_cuda_<op><bf16> for each op of GT_OPS_POINTWISE.
 *
 * All math is fp32, reading and writing the working type through load_f/store_f. Where the CPU
 * backend spells an expression, the same expression is used here, with __fmul_rn/__fadd_rn where a
 * fused multiply-add would change the rounding, so fp32 mode agrees with the CPU closely (a
 * convenience for the tests, not a contract). The kernels move 16 bytes per access (pack16) when
 * their pointers are 16-byte aligned, with a scalar tail or a single-element kernel otherwise. Token
 * ids outside [0, V) raise the backend's fault flag (gt_cuda_fault_flag, take_fault) instead of
 * reading out of bounds.
 *
 * The embedding's dwte never uses atomics: tokens split into EMB_BUCKETS buckets by id, and a block
 * owning (bucket, 256 columns) walks all tokens in order, so each dwte element has one owning thread
 * and a fixed summation order.
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

#define THREADS 256
#define MAX_BLOCKS ((size_t)65535 * 4)

/* ---------------------------------------------------------------- embedding */

/* the fallback for a C that is not a multiple of the 16-byte vector: one element per thread */
template <typename T>
__global__ void embedding_forward_kernel(T *out, const int32_t *tokens, const T *wte, int BT, int C, int V, int *fault) {
    size_t n = (size_t)BT * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / (size_t)C, c = i - row * (size_t)C;
        const int tok = tokens[row];
        if (tok < 0 || tok >= V) {
            if (c == 0) raise_token_fault(fault, (int)row, tok, V, 0);
            store_f(out + i, 0.0f);
            continue;
        }
        out[i] = wte[(size_t)tok * C + c];
    }
}

/* 16-byte copies: C a multiple of the vector width (every model dim in practice), rows aligned */
template <typename T>
__global__ void embedding_forward_vec_kernel(int4 *out, const int32_t *tokens, const int4 *wte, int BT, int C4, int V,
                                            int *fault) {
    const int row = blockIdx.x;
    const int tok = tokens[row];
    int4 *dst = out + (size_t)row * C4;
    if (tok < 0 || tok >= V) {
        if (threadIdx.x == 0) raise_token_fault(fault, row, tok, V, 0);
        for (int c = threadIdx.x; c < C4; c += blockDim.x) dst[c] = make_int4(0, 0, 0, 0);
        return;
    }
    const int4 *src = wte + (size_t)tok * C4;
    for (int c = threadIdx.x; c < C4; c += blockDim.x) dst[c] = src[c];
}

template <typename T>
void gt_cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, int BT, int C, int V) {
    size_t n = (size_t)BT * C;
    if (n == 0) return;
    int *fault = gt_cuda_fault_flag();
    const int per16 = 16 / (int)sizeof(T);
    if (C % per16 == 0 && ((uintptr_t)out % 16) == 0 && ((uintptr_t)wte % 16) == 0) {
        const int C4 = C / per16;
        embedding_forward_vec_kernel<T><<<BT, C4 < THREADS ? ((C4 + 31) / 32) * 32 : THREADS>>>(
            (int4 *)out, tokens, (const int4 *)wte, BT, C4, V, fault);
    } else {
        embedding_forward_kernel<T><<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>((T *)out, tokens, (const T *)wte, BT, C, V,
                                                                                fault);
    }
    CUDA_CHECK_LAUNCH();
}

#define EMB_BUCKETS 128
#define EMB_CHUNK 2048 /* tokens staged in shared memory at a time */

/* grid (ceil(C / 256), EMB_BUCKETS) */
template <typename T>
__global__ void embedding_backward_kernel(float *dwte, const T *dout, const int32_t *tokens, int BT, int C, int V) {
    __shared__ int32_t s_tok[EMB_CHUNK];
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int bucket = blockIdx.y;
    for (int i0 = 0; i0 < BT; i0 += EMB_CHUNK) {
        const int n = min(EMB_CHUNK, BT - i0);
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) s_tok[i] = tokens[i0 + i];
        __syncthreads();
        if (c >= C) continue;
        for (int i = 0; i < n; i++) {
            const int tok = s_tok[i];
            if (tok < 0 || tok >= V || tok % EMB_BUCKETS != bucket) continue;
            float *dst = dwte + (size_t)tok * C + c;
            *dst = *dst + load_f(dout + (size_t)(i0 + i) * C + c);
        }
    }
}

template <typename T>
void gt_cuda_embedding_backward(float *dwte, const void *dout, const int32_t *tokens, int BT, int C, int V) {
    if (BT <= 0 || C <= 0 || !dwte) return;
    dim3 grid((unsigned)((C + THREADS - 1) / THREADS), EMB_BUCKETS);
    embedding_backward_kernel<T><<<grid, THREADS>>>(dwte, (const T *)dout, tokens, BT, C, V);
    CUDA_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- SwiGLU */

__device__ __forceinline__ float silu(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

template <typename T>
__global__ void swiglu_forward_kernel(T *out, const T *gate, const T *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        store_f(out + i, __fmul_rn(silu(load_f(gate + i)), load_f(up + i)));
}

/* d silu(g)/dg = sig (1 + g (1 - sig)); dgate/dup may alias gate/up (each element read before written) */
template <typename T>
__global__ void swiglu_backward_kernel(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = load_f(gate + i), u = load_f(up + i), d = load_f(dout + i);
        const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
        /* the CPU's association: ((d * u) * sig) * (1 + g (1 - sig)) */
        const float dsilu_rest = __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sig)));
        store_f(dgate + i, __fmul_rn(__fmul_rn(__fmul_rn(d, u), sig), dsilu_rest));
        store_f(dup + i, __fmul_rn(d, silu(g)));
    }
}

/* the same arithmetic with 16-byte accesses: nv = n / VEC packs, then the n % VEC tail singly */
template <typename T>
__global__ void swiglu_forward_vec_kernel(T *out, const T *gate, const T *up, size_t nv, size_t n) {
    constexpr int VEC = pack16<T>::VEC;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < nv; p += (size_t)gridDim.x * blockDim.x) {
        const pack16<T> g = load16(gate + p * VEC), u = load16(up + p * VEC);
        pack16<T> o;
#pragma unroll
        for (int j = 0; j < VEC; j++) store_f(&o.v[j], __fmul_rn(silu(load_f(&g.v[j])), load_f(&u.v[j])));
        store16(out + p * VEC, o);
    }
    for (size_t i = nv * VEC + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        store_f(out + i, __fmul_rn(silu(load_f(gate + i)), load_f(up + i)));
}

__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float *dg, float *du) {
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    const float dsilu_rest = __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sig)));
    *dg = __fmul_rn(__fmul_rn(__fmul_rn(d, u), sig), dsilu_rest);
    *du = __fmul_rn(d, silu(g));
}

template <typename T>
__global__ void swiglu_backward_vec_kernel(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t nv,
                                           size_t n) {
    constexpr int VEC = pack16<T>::VEC;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < nv; p += (size_t)gridDim.x * blockDim.x) {
        const pack16<T> g = load16(gate + p * VEC), u = load16(up + p * VEC), d = load16(dout + p * VEC);
        pack16<T> dg, du;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float a, b;
            swiglu_grad(load_f(&g.v[j]), load_f(&u.v[j]), load_f(&d.v[j]), &a, &b);
            store_f(&dg.v[j], a);
            store_f(&du.v[j], b);
        }
        store16(dgate + p * VEC, dg);
        store16(dup + p * VEC, du);
    }
    for (size_t i = nv * VEC + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float a, b;
        swiglu_grad(load_f(gate + i), load_f(up + i), load_f(dout + i), &a, &b);
        store_f(dgate + i, a);
        store_f(dup + i, b);
    }
}

template <typename T>
void gt_cuda_swiglu_forward(void *out, const void *gate, const void *up, size_t n) {
    if (n == 0) return;
    const size_t nv = n / pack16<T>::VEC;
    if (aligned16(out) && aligned16(gate) && aligned16(up))
        swiglu_forward_vec_kernel<T><<<grid_for(nv ? nv : 1, THREADS, MAX_BLOCKS), THREADS>>>((T *)out, (const T *)gate,
                                                                                         (const T *)up, nv, n);
    else
        swiglu_forward_kernel<T><<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>((T *)out, (const T *)gate, (const T *)up, n);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
void gt_cuda_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    if (n == 0) return;
    const size_t nv = n / pack16<T>::VEC;
    if (aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) && aligned16(up))
        swiglu_backward_vec_kernel<T><<<grid_for(nv ? nv : 1, THREADS, MAX_BLOCKS), THREADS>>>(
            (T *)dgate, (T *)dup, (const T *)dout, (const T *)gate, (const T *)up, nv, n);
    else
        swiglu_backward_kernel<T><<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>((T *)dgate, (T *)dup, (const T *)dout,
                                                                                 (const T *)gate, (const T *)up, n);
    CUDA_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- residual + dropout */

/* out = res + (keep ? branch * keep_scale : 0), element index i is the RNG index; out may alias res */
template <typename T>
__global__ void residual_forward_kernel(T *out, const T *res, const T *branch, size_t n, float dropout,
                                        float keep_scale, uint64_t rng) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float b = load_f(branch + i);
        if (dropout > 0.0f) b = gt_dropout_keep_at(rng, (uint64_t)i, dropout) ? __fmul_rn(b, keep_scale) : 0.0f;
        store_f(out + i, __fadd_rn(load_f(res + i), b));
    }
}

/* dbranch = keep ? dout * keep_scale : 0 ; may alias dout */
template <typename T>
__global__ void dropout_backward_kernel(T *dbranch, const T *dout, size_t n, float dropout, float keep_scale,
                                        uint64_t rng) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float d = load_f(dout + i);
        store_f(dbranch + i, gt_dropout_keep_at(rng, (uint64_t)i, dropout) ? __fmul_rn(d, keep_scale) : 0.0f);
    }
}

/* the same with 16-byte accesses (element index p * VEC + j keeps the RNG index), then the tail */
template <typename T>
__global__ void residual_forward_vec_kernel(T *out, const T *res, const T *branch, size_t nv, size_t n, float dropout,
                                            float keep_scale, uint64_t rng) {
    constexpr int VEC = pack16<T>::VEC;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < nv; p += (size_t)gridDim.x * blockDim.x) {
        const pack16<T> r = load16(res + p * VEC), b = load16(branch + p * VEC);
        pack16<T> o;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float bj = load_f(&b.v[j]);
            if (dropout > 0.0f) bj = gt_dropout_keep_at(rng, (uint64_t)(p * VEC + j), dropout) ? __fmul_rn(bj, keep_scale) : 0.0f;
            store_f(&o.v[j], __fadd_rn(load_f(&r.v[j]), bj));
        }
        store16(out + p * VEC, o);
    }
    for (size_t i = nv * VEC + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float b = load_f(branch + i);
        if (dropout > 0.0f) b = gt_dropout_keep_at(rng, (uint64_t)i, dropout) ? __fmul_rn(b, keep_scale) : 0.0f;
        store_f(out + i, __fadd_rn(load_f(res + i), b));
    }
}

/* dropout_backward with 16-byte accesses: element index p * VEC + j keeps the RNG index, then the
 * n % VEC tail singly; may alias dout (each pack read before written, by the same thread) */
template <typename T>
__global__ void dropout_backward_vec_kernel(T *dbranch, const T *dout, size_t nv, size_t n, float dropout,
                                            float keep_scale, uint64_t rng) {
    constexpr int VEC = pack16<T>::VEC;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < nv; p += (size_t)gridDim.x * blockDim.x) {
        const pack16<T> d = load16(dout + p * VEC);
        pack16<T> o;
#pragma unroll
        for (int j = 0; j < VEC; j++)
            store_f(&o.v[j], gt_dropout_keep_at(rng, (uint64_t)(p * VEC + j), dropout)
                                 ? __fmul_rn(load_f(&d.v[j]), keep_scale) : 0.0f);
        store16(dbranch + p * VEC, o);
    }
    for (size_t i = nv * VEC + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        store_f(dbranch + i, gt_dropout_keep_at(rng, (uint64_t)i, dropout) ? __fmul_rn(load_f(dout + i), keep_scale) : 0.0f);
}

template <typename T>
void gt_cuda_residual_forward(void *out, const void *res, const void *branch, size_t n, float dropout, gt_rng_key key) {
    if (n == 0) return;
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const uint64_t rng = dropout > 0.0f ? gt_rng_base(key) : 0;
    const size_t nv = n / pack16<T>::VEC;
    if (aligned16(out) && aligned16(res) && aligned16(branch))
        residual_forward_vec_kernel<T><<<grid_for(nv ? nv : 1, THREADS, MAX_BLOCKS), THREADS>>>(
            (T *)out, (const T *)res, (const T *)branch, nv, n, dropout, keep_scale, rng);
    else
        residual_forward_kernel<T><<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>(
            (T *)out, (const T *)res, (const T *)branch, n, dropout, keep_scale, rng);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
void gt_cuda_dropout_backward(void *dbranch, const void *dout, size_t n, float dropout, gt_rng_key key) {
    if (n == 0) return;
    if (dropout <= 0.0f) {
        if (dbranch != dout) CUDA_CHECK(cudaMemcpyAsync(dbranch, dout, n * sizeof(T), cudaMemcpyDeviceToDevice, 0));
        return;
    }
    const float keep_scale = 1.0f / (1.0f - dropout);
    const size_t nv = n / pack16<T>::VEC;
    if (aligned16(dbranch) && aligned16(dout))
        dropout_backward_vec_kernel<T><<<grid_for(nv ? nv : 1, THREADS, MAX_BLOCKS), THREADS>>>(
            (T *)dbranch, (const T *)dout, nv, n, dropout, keep_scale, gt_rng_base(key));
    else
        dropout_backward_kernel<T><<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>((T *)dbranch, (const T *)dout, n,
                                                                                  dropout, keep_scale, gt_rng_base(key));
    CUDA_CHECK_LAUNCH();
}

GT_OPS_POINTWISE(GT_CUDA_INSTANTIATE)
