/*
 * cuda_norm.cu — the norm family of ops.h on the GPU: RMSNorm forward, apply and backward
 * (gt_cuda_rmsnorm_forward, gt_cuda_rmsnorm_apply, gt_cuda_rmsnorm_backward, each <float> and <bf16>).
 *
 * All math is fp32 (a row's sums of squares and dot products in double, as the CPU backend does),
 * reading and writing the working type through load_f/store_f, with the CPU backend's expressions
 * (__fmul_rn where a fused multiply-add would change the rounding). Row-wise kernels run one block
 * per row and hold a row in registers for the usual shapes (C <= 1024 vectors, 16-byte accesses), so
 * forward and the fused backward read each row once.
 *
 * dweight never uses atomics: per-chunk partials (rows in order) into scratch, then the chunks added
 * in order.
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

#define THREADS 256
#define MAX_BLOCKS ((size_t)65535 * 4)

/* ---------------------------------------------------------------- RMSNorm */

/* the one expression forward and apply share (bit-identical outputs); as the CPU: w * (x * rstd) */
__device__ __forceinline__ float rmsnorm_out(float x, float rstd, float w) { return __fmul_rn(w, __fmul_rn(x, rstd)); }

/* one block per row */
template <typename T>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const T *weight, int C, float eps) {
    __shared__ double scratch[32];
    const size_t row = blockIdx.x;
    const T *x = inp + row * C;
    T *o = out + row * C;
    double ss = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        double xi = (double)load_f(x + i);
        ss += xi * xi;
    }
    ss = block_sum_d(ss, scratch);
    const float r = 1.0f / sqrtf((float)(ss / C) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int i = threadIdx.x; i < C; i += blockDim.x) store_f(o + i, rmsnorm_out(load_f(x + i), r, load_f(weight + i)));
}

/* the same with 16-byte accesses, the row held in registers between the two passes (x read once);
 * thread t owns the row's 16-byte groups t, t + 256, ... (G of them) */
template <typename T, int G>
__global__ void __launch_bounds__(THREADS)
rmsnorm_forward_vec_kernel(T *out, float *rstd, const T *inp, const T *weight, int C, float eps) {
    constexpr int VEC = pack16<T>::VEC;
    __shared__ double scratch[32];
    const size_t base = (size_t)blockIdx.x * C;
    const int groups = C / VEC;
    pack16<T> x[G];
    double ss = 0.0;
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int grp = threadIdx.x + g * THREADS;
        if (grp >= groups) continue;
        x[g] = load16(inp + base + (size_t)grp * VEC);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const double xi = (double)load_f(&x[g].v[j]);
            ss += xi * xi;
        }
    }
    ss = block_sum_d(ss, scratch);
    const float r = 1.0f / sqrtf((float)(ss / C) + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int grp = threadIdx.x + g * THREADS;
        if (grp >= groups) continue;
        const pack16<T> w = load16(weight + (size_t)grp * VEC);
        pack16<T> o;
#pragma unroll
        for (int j = 0; j < VEC; j++) store_f(&o.v[j], rmsnorm_out(load_f(&x[g].v[j]), r, load_f(&w.v[j])));
        store16(out + base + (size_t)grp * VEC, o);
    }
}

/* one block per row (no index division per element) */
template <typename T>
__global__ void rmsnorm_apply_kernel(T *out, const float *rstd, const T *inp, const T *weight, int C) {
    const size_t row = blockIdx.x;
    const T *x = inp + row * C;
    T *o = out + row * C;
    const float r = rstd[row];
    for (int i = threadIdx.x; i < C; i += blockDim.x) store_f(o + i, rmsnorm_out(load_f(x + i), r, load_f(weight + i)));
}

/* the same with 16-byte accesses (C a multiple of VEC, every pointer 16-byte aligned): the same
 * rmsnorm_out per element, so the same bits as rmsnorm_forward's either path */
template <typename T>
__global__ void rmsnorm_apply_vec_kernel(T *out, const float *rstd, const T *inp, const T *weight, int C) {
    constexpr int VEC = pack16<T>::VEC;
    const size_t base = (size_t)blockIdx.x * C;
    const float r = rstd[blockIdx.x];
    for (int grp = threadIdx.x; grp < C / VEC; grp += blockDim.x) {
        const pack16<T> x = load16(inp + base + (size_t)grp * VEC), w = load16(weight + (size_t)grp * VEC);
        pack16<T> o;
#pragma unroll
        for (int j = 0; j < VEC; j++) store_f(&o.v[j], rmsnorm_out(load_f(&x.v[j]), r, load_f(&w.v[j])));
        store16(out + base + (size_t)grp * VEC, o);
    }
}

/* dx_j += r w_j d_j - x_j * (r^3 / C * sum_i d_i w_i x_i) ; one block per row */
template <typename T>
__global__ void rmsnorm_backward_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight, const float *rstd,
                                             int C) {
    __shared__ double scratch[32];
    const size_t row = blockIdx.x;
    const T *x = inp + row * C, *d = dout + row * C;
    T *dx = dinp + row * C;
    const float r = rstd[row];
    double dot = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        dot += (double)load_f(d + i) * (double)load_f(weight + i) * (double)load_f(x + i);
    dot = block_sum_d(dot, scratch);
    const float coef = (float)(dot * r * r * r / C);
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float g = __fmul_rn(__fmul_rn(r, load_f(weight + i)), load_f(d + i));
        float v = __fsub_rn(g, __fmul_rn(load_f(x + i), coef));
        store_f(dx + i, __fadd_rn(load_f(dx + i), v));
    }
}

#define RMS_DW_ROWS 32

/* partial (nchunks, C): partial[chunk][j] = sum over the chunk's `rows` rows, in order, of d_j * (x_j * r);
 * grid (ceil(C / 256), nchunks) */
template <typename T>
__global__ void rmsnorm_dweight_partial_kernel(float *partial, const T *dout, const T *inp, const float *rstd, int N,
                                               int C, int rows) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= C) return;
    const int n0 = blockIdx.y * rows, n1 = min(n0 + rows, N);
    float acc = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t i = (size_t)n * C + j;
        acc = __fadd_rn(acc, __fmul_rn(load_f(dout + i), __fmul_rn(load_f(inp + i), rstd[n])));
    }
    partial[(size_t)blockIdx.y * C + j] = acc;
}

/* dweight[j] += sum over chunks, in order */
__global__ void sum_partials_kernel(float *dweight, const float *partial, int nchunks, int C) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= C) return;
    float acc = 0.0f;
    for (int c = 0; c < nchunks; c++) acc += partial[(size_t)c * C + j];
    dweight[j] += acc;
}

/* The fused backward: one block per chunk of `rows` rows (the dweight chunks above), 16-byte loads.
 * Thread t owns the 16-byte groups t, t + 256, ... (G of them) of every row, so it reads each row's
 * x and dout once into registers, takes its part of the row's dot product, writes its dx, and adds
 * d_j * (x_j * r) into its columns' dweight partials in row order — the same expression and order as
 * rmsnorm_dweight_partial_kernel, so the partials (and dweight) have the same bits. */
template <typename T, int G>
__global__ void __launch_bounds__(THREADS)
rmsnorm_backward_fused_kernel(T *dinp, float *partial, const T *dout, const T *inp, const T *weight, const float *rstd,
                              int N, int C, int rows) {
    constexpr int VEC = pack16<T>::VEC;
    __shared__ double scratch[32];
    const int groups = C / VEC;
    const int n0 = blockIdx.x * rows, n1 = min(n0 + rows, N);
    float w[G][VEC], acc[G][VEC];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int grp = threadIdx.x + g * THREADS;
        pack16<T> wp;
        if (grp < groups) wp = load16(weight + (size_t)grp * VEC);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            w[g][j] = grp < groups ? load_f(&wp.v[j]) : 0.0f;
            acc[g][j] = 0.0f;
        }
    }
    for (int n = n0; n < n1; n++) {
        const size_t base = (size_t)n * C;
        const float r = rstd[n];
        float x[G][VEC], d[G][VEC];
        double dot = 0.0;
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int grp = threadIdx.x + g * THREADS;
            if (grp >= groups) continue;
            const pack16<T> xp = load16(inp + base + (size_t)grp * VEC), dp = load16(dout + base + (size_t)grp * VEC);
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                x[g][j] = load_f(&xp.v[j]);
                d[g][j] = load_f(&dp.v[j]);
                dot += (double)d[g][j] * (double)w[g][j] * (double)x[g][j];
            }
        }
        dot = block_sum_d(dot, scratch);
        const float coef = (float)(dot * r * r * r / C);
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int grp = threadIdx.x + g * THREADS;
            if (grp >= groups) continue;
            T *dxp = dinp + base + (size_t)grp * VEC;
            pack16<T> out = load16(dxp);
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                const float gr = __fmul_rn(__fmul_rn(r, w[g][j]), d[g][j]);
                const float v = __fsub_rn(gr, __fmul_rn(x[g][j], coef));
                store_f(&out.v[j], __fadd_rn(load_f(&out.v[j]), v));
                acc[g][j] = __fadd_rn(acc[g][j], __fmul_rn(d[g][j], __fmul_rn(x[g][j], r)));
            }
            store16(dxp, out);
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int grp = threadIdx.x + g * THREADS;
        if (grp >= groups) continue;
        float *pp = partial + (size_t)blockIdx.x * C + (size_t)grp * VEC;
#pragma unroll
        for (int j = 0; j < VEC; j++) pp[j] = acc[g][j];
    }
}

template <typename T>
void gt_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    constexpr int VEC = pack16<T>::VEC;
    const int groups = C % VEC == 0 ? C / VEC : 0, G = (groups + THREADS - 1) / THREADS;
    T *o = (T *)out;
    const T *x = (const T *)inp, *w = (const T *)weight;
    if (groups && G <= 4 && aligned16(out) && aligned16(inp) && aligned16(weight)) {
        if (G == 1) rmsnorm_forward_vec_kernel<T, 1><<<N, THREADS>>>(o, rstd, x, w, C, eps);
        else if (G == 2) rmsnorm_forward_vec_kernel<T, 2><<<N, THREADS>>>(o, rstd, x, w, C, eps);
        else rmsnorm_forward_vec_kernel<T, 4><<<N, THREADS>>>(o, rstd, x, w, C, eps);
    } else {
        rmsnorm_forward_kernel<T><<<N, THREADS>>>(o, rstd, x, w, C, eps);
    }
    CUDA_CHECK_LAUNCH();
}

template <typename T>
void gt_cuda_rmsnorm_apply(void *out, const float *rstd, const void *inp, const void *weight, int N, int C) {
    size_t n = (size_t)N * C;
    if (n == 0) return;
    if (C % pack16<T>::VEC == 0 && aligned16(out) && aligned16(inp) && aligned16(weight))
        rmsnorm_apply_vec_kernel<T><<<N, THREADS>>>((T *)out, rstd, (const T *)inp, (const T *)weight, C);
    else
        rmsnorm_apply_kernel<T><<<N, THREADS>>>((T *)out, rstd, (const T *)inp, (const T *)weight, C);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
void gt_cuda_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                             const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    /* rows per chunk: a function of N alone (determinism), at least RMS_DW_ROWS, and few enough
     * chunks for gridDim.y */
    const int rows = N / RMS_DW_ROWS < 65535 ? RMS_DW_ROWS : (N + 65534) / 65535;
    const int nchunks = (N + rows - 1) / rows;
    const unsigned cblocks = (unsigned)((C + THREADS - 1) / THREADS);
    constexpr int VEC = pack16<T>::VEC;
    const int groups = C % VEC == 0 ? C / VEC : 0, G = (groups + THREADS - 1) / THREADS;
    if (dinp && dweight && groups && G <= 4 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
        aligned16(weight)) {
        /* the fused kernel: x and dout read once for both gradients */
        float *partial = (float *)gt_cuda_alloc(sizeof(float) * (size_t)nchunks * C);
        T *di = (T *)dinp;
        const T *d = (const T *)dout, *x = (const T *)inp, *w = (const T *)weight;
        if (G == 1) rmsnorm_backward_fused_kernel<T, 1><<<nchunks, THREADS>>>(di, partial, d, x, w, rstd, N, C, rows);
        else if (G == 2) rmsnorm_backward_fused_kernel<T, 2><<<nchunks, THREADS>>>(di, partial, d, x, w, rstd, N, C, rows);
        else rmsnorm_backward_fused_kernel<T, 4><<<nchunks, THREADS>>>(di, partial, d, x, w, rstd, N, C, rows);
        CUDA_CHECK_LAUNCH();
        sum_partials_kernel<<<cblocks, THREADS>>>(dweight, partial, nchunks, C);
        CUDA_CHECK_LAUNCH();
        gt_cuda_free(partial);
        return;
    }
    if (dinp) {
        rmsnorm_backward_dinp_kernel<T><<<N, THREADS>>>((T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight,
                                                        rstd, C);
        CUDA_CHECK_LAUNCH();
    }
    if (dweight) {
        float *partial = (float *)gt_cuda_alloc(sizeof(float) * (size_t)nchunks * C);
        rmsnorm_dweight_partial_kernel<T><<<dim3(cblocks, (unsigned)nchunks), THREADS>>>(
            partial, (const T *)dout, (const T *)inp, rstd, N, C, rows);
        CUDA_CHECK_LAUNCH();
        sum_partials_kernel<<<cblocks, THREADS>>>(dweight, partial, nchunks, C);
        CUDA_CHECK_LAUNCH();
        gt_cuda_free(partial);
    }
}

GT_OPS_NORM(GT_CUDA_INSTANTIATE)
