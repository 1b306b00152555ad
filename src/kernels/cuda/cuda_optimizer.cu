/*
 * cuda_optimizer.cu — the optimizer family of ops.h on the GPU: the fp32 vector utilities of the
 * optimizer step, sum of squares (for the gradient norm), scale (clipping), fused AdamW
 * (gt_cuda_sumsq, gt_cuda_scale, gt_cuda_adamw), and the master <-> working conversions
 * (gt_cuda_to_working<T>, gt_cuda_to_master<T>: fp32 -> bf16 round-to-nearest-even, or a copy in
 * fp32 mode).
 *
 * sumsq is deterministic: a grid whose size is a function of n alone, each thread summing its
 * grid-stride elements in order in double, fixed-tree block sums into one partial per block, then
 * one block adding the partials the same way. Squares of floats are exact in double, so the result
 * differs from the CPU backend's only by summation order. With a 16-byte aligned x (every tensor the
 * core passes) each thread reads 4 floats per access (its grid-stride packs in order, the 4 of a
 * pack in order), then adds at most one of the n % 4 tail elements; an unaligned x takes the scalar
 * kernel. Either way the order is fixed by n and the pointer's alignment, so a call repeats bit for
 * bit. scale has the same 16-byte path with a scalar tail.
 *
 * AdamW follows torch.optim.AdamW (single-tensor path) exactly as the CPU backend spells it: the step's
 * scalars from ops.h's gt_adamw_step_scalars (the CPU backend's too), the element update in fp32 with
 * explicit round-to-nearest intrinsics so no fused multiply-add changes the rounding.
 */
#include <math.h>

#include "cuda_common.cuh"

#define THREADS 256
#define MAX_BLOCKS ((size_t)65535 * 4)
#define SUMSQ_MAX_BLOCKS 1024
#define SUMSQ_PER_THREAD 16

__global__ void sumsq_partial_kernel(double *partial, const float *x, size_t n) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double v = (double)x[i];
        s += v * v;
    }
    s = block_sum_d(s, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* the same with 16-byte loads: nv = n / 4 packs, then the n % 4 tail (< 4 elements, so at most one
 * per thread: thread i of block 0 adds element nv * 4 + i after its packs) */
__global__ void sumsq_partial_vec_kernel(double *partial, const float4 *x4, size_t nv, const float *x, size_t n) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < nv; p += (size_t)gridDim.x * blockDim.x) {
        const float4 v = x4[p];
        s += (double)v.x * (double)v.x;
        s += (double)v.y * (double)v.y;
        s += (double)v.z * (double)v.z;
        s += (double)v.w * (double)v.w;
    }
    const size_t i = nv * 4 + blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) s += (double)x[i] * (double)x[i];
    s = block_sum_d(s, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_doubles_kernel(double *out, const double *partial, int n) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    s = block_sum_d(s, scratch);
    if (threadIdx.x == 0) *out = s;
}

static double *g_sumsq_scratch; /* SUMSQ_MAX_BLOCKS partials + the total; kept for the run */

double gt_cuda_sumsq(const float *x, size_t n) {
    if (n == 0) return 0.0;
    if (!g_sumsq_scratch) g_sumsq_scratch = (double *)gt_cuda_alloc(sizeof(double) * (SUMSQ_MAX_BLOCKS + 1));
    const unsigned blocks = grid_for(n, THREADS * SUMSQ_PER_THREAD, SUMSQ_MAX_BLOCKS);
    if (aligned16(x))
        sumsq_partial_vec_kernel<<<blocks, THREADS>>>(g_sumsq_scratch, reinterpret_cast<const float4 *>(x), n / 4, x,
                                                      n);
    else
        sumsq_partial_kernel<<<blocks, THREADS>>>(g_sumsq_scratch, x, n);
    CUDA_CHECK_LAUNCH();
    sum_doubles_kernel<<<1, THREADS>>>(g_sumsq_scratch + SUMSQ_MAX_BLOCKS, g_sumsq_scratch, (int)blocks);
    CUDA_CHECK_LAUNCH();
    double total = 0.0;
    CUDA_CHECK(cudaMemcpy(&total, g_sumsq_scratch + SUMSQ_MAX_BLOCKS, sizeof total, cudaMemcpyDeviceToHost));
    return total;
}

__global__ void scale_kernel(float *x, size_t n, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

/* 16-byte accesses: nv = n / 4 packs, then the n % 4 tail singly */
__global__ void scale_vec_kernel(float4 *x4, float *x, size_t nv, size_t n, float s) {
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < nv; p += (size_t)gridDim.x * blockDim.x) {
        float4 v = x4[p];
        v.x = __fmul_rn(v.x, s), v.y = __fmul_rn(v.y, s), v.z = __fmul_rn(v.z, s), v.w = __fmul_rn(v.w, s);
        x4[p] = v;
    }
    for (size_t i = nv * 4 + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

void gt_cuda_scale(float *x, size_t n, float s) {
    if (n == 0) return;
    const size_t nv = n / 4;
    if (aligned16(x))
        scale_vec_kernel<<<grid_for(nv ? nv : 1, THREADS, MAX_BLOCKS), THREADS>>>(reinterpret_cast<float4 *>(x), x, nv,
                                                                                  n, s);
    else
        scale_kernel<<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>(x, n, s);
    CUDA_CHECK_LAUNCH();
}

__global__ void adamw_kernel(float *param, float *exp_avg, float *exp_avg_sq, const float *grad, size_t n, float decay,
                             float w1, float beta2, float w2, float step_size, float bc2_sqrt, float eps) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = grad[i], m0 = exp_avg[i], v0 = exp_avg_sq[i];
        float p = __fmul_rn(param[i], decay);
        const float m = __fadd_rn(m0, __fmul_rn(w1, __fsub_rn(g, m0)));           /* lerp, weight < 0.5 */
        const float v = __fadd_rn(__fmul_rn(v0, beta2), __fmul_rn(__fmul_rn(w2, g), g));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bc2_sqrt), eps);
        p = __fadd_rn(p, __fdiv_rn(__fmul_rn(-step_size, m), denom));
        param[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

/* torch.optim.AdamW (see the CPU backend's comment for the step-by-step torch source); t counts from 1 */
/* the same step on float4s: 16-byte loads of the four inputs and stores of the three outputs */
__device__ __forceinline__ void adamw_one(float &p, float &m, float &v, float g, float decay, float w1, float beta2,
                                          float w2, float step_size, float bc2_sqrt, float eps) {
    p = __fmul_rn(p, decay);
    m = __fadd_rn(m, __fmul_rn(w1, __fsub_rn(g, m)));
    v = __fadd_rn(__fmul_rn(v, beta2), __fmul_rn(__fmul_rn(w2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bc2_sqrt), eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(-step_size, m), denom));
}

__global__ void adamw_vec_kernel(float4 *param, float4 *exp_avg, float4 *exp_avg_sq, const float4 *grad, size_t nv,
                                 float decay, float w1, float beta2, float w2, float step_size, float bc2_sqrt, float eps) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += (size_t)gridDim.x * blockDim.x) {
        float4 p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
        const float4 g = grad[i];
        adamw_one(p.x, m.x, v.x, g.x, decay, w1, beta2, w2, step_size, bc2_sqrt, eps);
        adamw_one(p.y, m.y, v.y, g.y, decay, w1, beta2, w2, step_size, bc2_sqrt, eps);
        adamw_one(p.z, m.z, v.z, g.z, decay, w1, beta2, w2, step_size, bc2_sqrt, eps);
        adamw_one(p.w, m.w, v.w, g.w, decay, w1, beta2, w2, step_size, bc2_sqrt, eps);
        param[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

void gt_cuda_adamw(float *param, float *exp_avg, float *exp_avg_sq, const float *grad, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int t) {
    if (t < 1) GT_CUDA_FAIL("adamw step count t=%d must start at 1", t);
    if (n == 0) return;
    const gt_adamw_scalars k = gt_adamw_step_scalars(lr, beta1, beta2, weight_decay, t);
    const float decay = k.decay, w1 = k.w1, w2 = k.w2, step_size = k.step_size, bc2_sqrt = k.bc2_sqrt;
    const size_t nv = n / 4, done = nv * 4;
    if (nv && aligned16(param) && aligned16(exp_avg) && aligned16(exp_avg_sq) && aligned16(grad)) {
        adamw_vec_kernel<<<grid_for(nv, THREADS, MAX_BLOCKS), THREADS>>>((float4 *)param, (float4 *)exp_avg,
                                                                         (float4 *)exp_avg_sq, (const float4 *)grad, nv,
                                                                         decay, w1, beta2, w2, step_size, bc2_sqrt, eps);
        CUDA_CHECK_LAUNCH();
        if (done == n) return;
        param += done, exp_avg += done, exp_avg_sq += done, grad += done, n -= done;
    }
    adamw_kernel<<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>(param, exp_avg, exp_avg_sq, grad, n, decay, w1, beta2, w2,
                                                               step_size, bc2_sqrt, eps);
    CUDA_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- master <-> working */

__global__ void to_bf16_kernel(bf16 *out, const float *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]); /* round to nearest even */
}

__global__ void from_bf16_kernel(float *out, const bf16 *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

/* 8 floats (two 16-byte loads) to 8 bf16 (one 16-byte store), and back */
__global__ void to_bf16_vec_kernel(pack16<bf16> *out, const float4 *in, size_t nv) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += (size_t)gridDim.x * blockDim.x) {
        const float4 a = in[2 * i], b = in[2 * i + 1];
        pack16<bf16> o;
        o.v[0] = __float2bfloat16(a.x), o.v[1] = __float2bfloat16(a.y), o.v[2] = __float2bfloat16(a.z);
        o.v[3] = __float2bfloat16(a.w), o.v[4] = __float2bfloat16(b.x), o.v[5] = __float2bfloat16(b.y);
        o.v[6] = __float2bfloat16(b.z), o.v[7] = __float2bfloat16(b.w);
        out[i] = o;
    }
}

__global__ void from_bf16_vec_kernel(float4 *out, const pack16<bf16> *in, size_t nv) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += (size_t)gridDim.x * blockDim.x) {
        const pack16<bf16> x = in[i];
        out[2 * i] = make_float4(__bfloat162float(x.v[0]), __bfloat162float(x.v[1]), __bfloat162float(x.v[2]),
                                 __bfloat162float(x.v[3]));
        out[2 * i + 1] = make_float4(__bfloat162float(x.v[4]), __bfloat162float(x.v[5]), __bfloat162float(x.v[6]),
                                     __bfloat162float(x.v[7]));
    }
}

static void to_working_bf16(void *working, const float *master, size_t n) {
    if (n == 0) return;
    const size_t nv = n / 8, done = nv * 8;
    if (nv && aligned16(working) && aligned16(master)) {
        to_bf16_vec_kernel<<<grid_for(nv, THREADS, MAX_BLOCKS), THREADS>>>((pack16<bf16> *)working,
                                                                           (const float4 *)master, nv);
        CUDA_CHECK_LAUNCH();
        if (done == n) return;
        working = (bf16 *)working + done, master += done, n -= done;
    }
    to_bf16_kernel<<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>((bf16 *)working, master, n);
    CUDA_CHECK_LAUNCH();
}

static void to_master_bf16(float *master, const void *working, size_t n) {
    if (n == 0) return;
    const size_t nv = n / 8, done = nv * 8;
    if (nv && aligned16(working) && aligned16(master)) {
        from_bf16_vec_kernel<<<grid_for(nv, THREADS, MAX_BLOCKS), THREADS>>>((float4 *)master,
                                                                             (const pack16<bf16> *)working, nv);
        CUDA_CHECK_LAUNCH();
        if (done == n) return;
        working = (const bf16 *)working + done, master += done, n -= done;
    }
    from_bf16_kernel<<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>(master, (const bf16 *)working, n);
    CUDA_CHECK_LAUNCH();
}

static void copy_fp32(void *dst, const void *src, size_t n) {
    if (n == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
}

/* bf16 working tensors: round to nearest even, and back; fp32 ones: copies */
template <typename T>
void gt_cuda_to_working(void *working, const float *master, size_t n) {
    if (sizeof(T) == sizeof(bf16)) to_working_bf16(working, master, n);
    else copy_fp32(working, master, n);
}

template <typename T>
void gt_cuda_to_master(float *master, const void *working, size_t n) {
    if (sizeof(T) == sizeof(bf16)) to_master_bf16(master, working, n);
    else copy_fp32(master, working, n);
}

GT_OPS_OPTIMIZER(GT_CUDA_INSTANTIATE)
