/*
 * cuda_kernels.cu — the row- and element-wise layers on the GPU: token embedding (forward and a
 * deterministic backward), RMSNorm (forward, apply, backward), rotary embedding, SwiGLU, the residual
 * add with dropout on the branch, and the fused softmax + cross-entropy of the LM head.
 *
 * All math is fp32 (a row's sums of squares and dot products in double, as the CPU backend does),
 * reading and writing the working type through load_f/store_f. Where the CPU backend spells an
 * expression, the same expression is used here, with __fmul_rn/__fadd_rn where a fused multiply-add
 * would change the rounding, so fp32 mode agrees with the CPU closely (a convenience for the tests,
 * not a contract). The kernels move 16 bytes per access (pack16) when their pointers are 16-byte
 * aligned, with a scalar tail or a single-element kernel otherwise; row-wise kernels run one block per
 * row, and RMSNorm holds a row in registers for the usual shapes (C <= 1024 vectors), so forward and
 * the fused backward read each row once. Token ids outside [0, V) raise a device flag (take_fault)
 * instead of reading out of bounds.
 *
 * Reductions that feed gradients never use atomics: RMSNorm's dweight sums per-chunk partials (rows
 * in order) into scratch, then adds the chunks in order; the embedding's dwte splits tokens into
 * EMB_BUCKETS buckets by id, and a block owning (bucket, 256 columns) walks all tokens in order, so
 * each dwte element has one owning thread and a fixed summation order.
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

#define THREADS 256
#define MAX_BLOCKS ((size_t)65535 * 4)

/* ---------------------------------------------------------------- bad token ids */

/* The first token id or target outside [0, V) any kernel met since the last take_fault: {raised,
 * position, id, V, site}. Kernels never read through such an id (a zero row, a zero loss), so the
 * step finishes with finite numbers and the core stops the run with the message at the step's end. */
__device__ int g_token_fault[5];

__device__ __forceinline__ void raise_token_fault(int position, int id, int V, int site) {
    if (atomicCAS(&g_token_fault[0], 0, 1) == 0) {
        g_token_fault[1] = position;
        g_token_fault[2] = id;
        g_token_fault[3] = V;
        g_token_fault[4] = site;
    }
}

static int take_fault(char *msg, size_t msg_len) {
    int f[5];
    CUDA_CHECK(cudaMemcpyFromSymbol(f, g_token_fault, sizeof f)); /* waits for the kernels before it */
    if (!f[0]) return 0;
    static const int zero[5] = {0, 0, 0, 0, 0};
    CUDA_CHECK(cudaMemcpyToSymbol(g_token_fault, zero, sizeof zero));
    if (msg && msg_len)
        snprintf(msg, msg_len, "%s %d is outside [model] vocab_size = %d (position %d of a micro-batch, found on the GPU)",
                 f[4] == 0 ? "token id" : "target token id", f[2], f[3], f[1]);
    return 1;
}

/* ---------------------------------------------------------------- embedding */

/* the fallback for a C that is not a multiple of the 16-byte vector: one element per thread */
template <typename T>
__global__ void embedding_forward_kernel(T *out, const int32_t *tokens, const T *wte, int BT, int C, int V) {
    size_t n = (size_t)BT * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / (size_t)C, c = i - row * (size_t)C;
        const int tok = tokens[row];
        if (tok < 0 || tok >= V) {
            if (c == 0) raise_token_fault((int)row, tok, V, 0);
            store_f(out + i, 0.0f);
            continue;
        }
        out[i] = wte[(size_t)tok * C + c];
    }
}

/* 16-byte copies: C a multiple of the vector width (every model dim in practice), rows aligned */
template <typename T>
__global__ void embedding_forward_vec_kernel(int4 *out, const int32_t *tokens, const int4 *wte, int BT, int C4, int V) {
    const int row = blockIdx.x;
    const int tok = tokens[row];
    int4 *dst = out + (size_t)row * C4;
    if (tok < 0 || tok >= V) {
        if (threadIdx.x == 0) raise_token_fault(row, tok, V, 0);
        for (int c = threadIdx.x; c < C4; c += blockDim.x) dst[c] = make_int4(0, 0, 0, 0);
        return;
    }
    const int4 *src = wte + (size_t)tok * C4;
    for (int c = threadIdx.x; c < C4; c += blockDim.x) dst[c] = src[c];
}

template <typename T>
static void embedding_forward(void *out, const int32_t *tokens, const void *wte, int BT, int C, int V) {
    size_t n = (size_t)BT * C;
    if (n == 0) return;
    const int per16 = 16 / (int)sizeof(T);
    if (C % per16 == 0 && ((uintptr_t)out % 16) == 0 && ((uintptr_t)wte % 16) == 0) {
        const int C4 = C / per16;
        embedding_forward_vec_kernel<T><<<BT, C4 < THREADS ? ((C4 + 31) / 32) * 32 : THREADS>>>(
            (int4 *)out, tokens, (const int4 *)wte, BT, C4, V);
    } else {
        embedding_forward_kernel<T><<<grid_for(n, THREADS, MAX_BLOCKS), THREADS>>>((T *)out, tokens, (const T *)wte, BT, C, V);
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
static void embedding_backward(float *dwte, const void *dout, const int32_t *tokens, int BT, int C, int V) {
    if (BT <= 0 || C <= 0 || !dwte) return;
    dim3 grid((unsigned)((C + THREADS - 1) / THREADS), EMB_BUCKETS);
    embedding_backward_kernel<T><<<grid, THREADS>>>(dwte, (const T *)dout, tokens, BT, C, V);
    CUDA_CHECK_LAUNCH();
}

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
static void rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps) {
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
static void rmsnorm_apply(void *out, const float *rstd, const void *inp, const void *weight, int N, int C) {
    size_t n = (size_t)N * C;
    if (n == 0) return;
    if (C % pack16<T>::VEC == 0 && aligned16(out) && aligned16(inp) && aligned16(weight))
        rmsnorm_apply_vec_kernel<T><<<N, THREADS>>>((T *)out, rstd, (const T *)inp, (const T *)weight, C);
    else
        rmsnorm_apply_kernel<T><<<N, THREADS>>>((T *)out, rstd, (const T *)inp, (const T *)weight, C);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
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

/* ---------------------------------------------------------------- RoPE */

/* The (cos, sin) table (T_max, HD/2, 2) fp32 is the model's (gt_rope_table, already on the device),
 * the same numbers the CPU backend uses. One thread per rotated pair (i, i + HD/2); sign +1 forward,
 * -1 the inverse rotation; in place ok.
 * Grid: x over the NH * HD/2 pairs of one (b, t) row of heads, y over t, z over b (y and z
 * grid-stride, for T or B past the 65535 limit of those grid dimensions), so the position t and the
 * batch b come from the block index: the only per-element division is j / half in 32-bit unsigned
 * arithmetic (j < NH * HD/2, checked on the host to fit in 32 bits), never a 64-bit one. */
template <typename T>
__global__ void rope_kernel(T *out, const T *inp, const float *rope, int Tn, int B, int NH, int HD, float sign) {
    const unsigned half = (unsigned)HD / 2u, pairs = (unsigned)NH * half;
    const unsigned j = blockIdx.x * blockDim.x + threadIdx.x; /* (h, i) within the row of heads */
    if (j >= pairs) return;
    const unsigned h = j / half, i = j - h * half;
    for (int b = blockIdx.z; b < B; b += gridDim.z)
        for (int t = blockIdx.y; t < Tn; t += gridDim.y) {
            const size_t base = (((size_t)b * Tn + t) * NH + h) * HD; /* row (b, t, h) */
            const float x1 = load_f(inp + base + i), x2 = load_f(inp + base + i + half);
            const float *cs = rope + ((size_t)t * half + i) * 2;
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
__global__ void rope_vec_kernel(T *out, const T *inp, const float *rope, int Tn, int B, int NH, int HD, float sign) {
    constexpr int VEC = pack16<T>::VEC;
    const unsigned half = (unsigned)HD / 2u, hgroups = half / (unsigned)VEC, groups = (unsigned)NH * hgroups;
    const unsigned j = blockIdx.x * blockDim.x + threadIdx.x; /* (h, group) within the row of heads */
    if (j >= groups) return;
    const unsigned h = j / hgroups, i = (j - h * hgroups) * (unsigned)VEC;
    for (int b = blockIdx.z; b < B; b += gridDim.z)
        for (int t = blockIdx.y; t < Tn; t += gridDim.y) {
            const size_t base = (((size_t)b * Tn + t) * NH + h) * HD; /* row (b, t, h) */
            const pack16<T> x1 = load16(inp + base + i), x2 = load16(inp + base + i + half);
            const float4 *cs4 = reinterpret_cast<const float4 *>(rope + ((size_t)t * half + i) * 2);
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
static void rope_rotate(void *out, const void *inp, const float *rope, int B, int Tn, int NH, int HD, float sign) {
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
    if (vec) rope_vec_kernel<T><<<grid, threads>>>((T *)out, (const T *)inp, rope, Tn, B, NH, HD, sign);
    else rope_kernel<T><<<grid, threads>>>((T *)out, (const T *)inp, rope, Tn, B, NH, HD, sign);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void rope_forward(void *out, const void *inp, const float *rope, int B, int Tn, int NH, int HD) {
    rope_rotate<T>(out, inp, rope, B, Tn, NH, HD, 1.0f);
}

template <typename T>
static void rope_backward(void *dinp, const void *dout, const float *rope, int B, int Tn, int NH, int HD) {
    rope_rotate<T>(dinp, dout, rope, B, Tn, NH, HD, -1.0f);
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
static void swiglu_forward(void *out, const void *gate, const void *up, size_t n) {
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
static void swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
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
static void residual_forward(void *out, const void *res, const void *branch, size_t n, float dropout, gt_rng_key key) {
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
static void dropout_backward(void *dbranch, const void *dout, size_t n, float dropout, gt_rng_key key) {
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

/* ---------------------------------------------------------------- cross-entropy */

#define CE_THREADS 512

/* one block per row: each thread keeps an online (max, sum) over its strided logits; the block then
 * takes the max of maxima and sums the rescaled partial sums in double (fixed tree) */
/* VEC16: each thread reads 16-byte groups of VEC logits (V a multiple of VEC, logits 16-byte
 * aligned) and folds a group into its (max, sum) at once: the group's max first, then one rescale and
 * VEC exps; otherwise single logits, strided */
template <typename T, bool VEC16>
__global__ void __launch_bounds__(CE_THREADS)
crossentropy_forward_kernel(float *losses, float *lse, const T *logits, const int32_t *targets, int V) {
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
        if (tgt >= V) raise_token_fault((int)row, tgt, V, 1); /* never read past the row */
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
static void crossentropy_forward(float *losses, float *lse, const void *logits, const int32_t *targets, int BT, int V) {
    if (BT <= 0) return;
    if (V % pack16<T>::VEC == 0 && aligned16(logits))
        crossentropy_forward_kernel<T, true><<<BT, CE_THREADS>>>(losses, lse, (const T *)logits, targets, V);
    else
        crossentropy_forward_kernel<T, false><<<BT, CE_THREADS>>>(losses, lse, (const T *)logits, targets, V);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void crossentropy_backward(void *logits, const float *lse, const int32_t *targets, int BT, int V, float dloss) {
    if (BT <= 0) return;
    if (V % pack16<T>::VEC == 0 && aligned16(logits))
        crossentropy_backward_kernel<T, true><<<BT, CE_THREADS>>>((T *)logits, lse, targets, V, dloss);
    else
        crossentropy_backward_kernel<T, false><<<BT, CE_THREADS>>>((T *)logits, lse, targets, V, dloss);
    CUDA_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- the table */

template <typename T>
static void fill(gt_ops *ops) {
    ops->embedding_forward = embedding_forward<T>;
    ops->embedding_backward = embedding_backward<T>;
    ops->rmsnorm_forward = rmsnorm_forward<T>;
    ops->rmsnorm_apply = rmsnorm_apply<T>;
    ops->rmsnorm_backward = rmsnorm_backward<T>;
    ops->rope_forward = rope_forward<T>;
    ops->rope_backward = rope_backward<T>;
    ops->swiglu_forward = swiglu_forward<T>;
    ops->swiglu_backward = swiglu_backward<T>;
    ops->residual_forward = residual_forward<T>;
    ops->dropout_backward = dropout_backward<T>;
    ops->crossentropy_forward = crossentropy_forward<T>;
    ops->crossentropy_backward = crossentropy_backward<T>;
    ops->take_fault = take_fault;
}

void gt_cuda_fill_kernels(gt_ops *ops, int use_bf16) {
    if (use_bf16) fill<bf16>(ops);
    else fill<float>(ops);
}
