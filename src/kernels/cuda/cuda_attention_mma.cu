/*
 * cuda_attention_mma.cu — an OPTIONAL bf16 flash-attention FORWARD written for sm_80/sm_90 tensor cores
 * with the PTX instructions whose register layouts the PTX ISA documents (mma.sync m16n8k16, ldmatrix,
 * cp.async), so that, unlike the WMMA variant, the output accumulator stays in registers.
 *
 *   *** NEVER RUN ON A GPU. Written and compiled (nvcc 13, sm_90) without a device; opt-in with
 *   *** GTRAIN_CUDA_ATTENTION=mma until tests/gpu/test_ops_cuda.c has passed on a real GPU.
 *
 * With GTRAIN_CUDA_ATTENTION=mma the forward runs here and the backward runs the WMMA variant's
 * kernels (cuda_attention_wmma.cu): the backward recomputes the probabilities from q, k and lse and
 * takes D from the output, so any forward with the same lse semantics pairs with it. Used for the bf16
 * working type, HD 64 or 128, 16-byte aligned q, k, v; anything else falls through to the other kernels.
 *
 * Semantics as cuda_attention.cu: scale 1/sqrt(HD), causal s <= t, GQA head h reads kv head
 * h / (NH/NKV), lse = m + log(l) with m the row max of the scaled scores and l the sum of the
 * pre-dropout probabilities, dropout on the probabilities with dev_dropout_keep at index
 * ((b*NH + h)*T + t)*T + s and the 1/(1-p) scale. Differences are rounding only (bf16 products summed
 * in fp32 by the tensor cores; P rounded to bf16 before P V).
 *
 * Schedule (FlashAttention-2's forward): a block is 4 warps and 64 query rows (16 per warp), grid
 * (query tiles, longest first) x NH x B. The Q tile and each BN-key tile of K and V go to shared memory
 * with cp.async, two stages deep: the next K/V tile loads while the tensor cores work on this one.
 * Each warp keeps its Q rows as ldmatrix'd A fragments, computes S = Q K^T (16 x BN, fp32 in
 * registers), the online softmax on those registers (row statistics reduced over the 4 lanes that
 * share a row), rescales its O accumulator (16 x HD fp32, in registers) and adds P V with P re-packed
 * from the S registers as bf16 A fragments (the m16n8 accumulator layout is the m16n8k16 A layout of
 * two neighbouring n-tiles) and V read with ldmatrix.trans. Shared rows are padded by 16 bytes so the
 * 8 rows of each ldmatrix hit distinct banks. BN = 64 keys at HD 64 and 32 at HD 128, so that
 * registers (about 130-160 per thread) and shared memory (46 and 52 KiB) allow 3-4 blocks per SM.
 * No atomics; every sum has a fixed order, so results repeat bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda_common.cuh"

namespace {

constexpr int MM_THREADS = 128; /* 4 warps */
constexpr int MM_BM = 64;       /* query rows per block, 16 per warp */

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, asynchronously; src_bytes 0 writes zeros (rows past T) */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* c (16x8 fp32) += a (16x16 bf16, row) . b (16x8 bf16, col) */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (low half) = lo */
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* rows [row0, row0 + ROWS) of a (T, stride) bf16 view, HD columns, into dst (ROWS x (HD + 8)) with
 * cp.async; rows past T are zero */
template <int HD, int ROWS>
__device__ __forceinline__ void load_tile_async(bf16 *dst, const bf16 *src, size_t stride, int row0, int Tn) {
    constexpr int LD = HD + 8, CH = HD / 8;
    for (int idx = threadIdx.x; idx < ROWS * CH; idx += MM_THREADS) {
        const int r = idx / CH, c = (idx % CH) * 8, t = row0 + r;
        const bf16 *s = t < Tn ? src + (size_t)t * stride + c : src;
        cp_async16(dst + r * LD + c, s, t < Tn ? 16 : 0);
    }
}

template <int HD, int BN>
__global__ void __launch_bounds__(MM_THREADS, 3)
mma_attention_forward_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int Tn, int NH,
                             int NKV, float scale, float dropout, float keep_scale, uint64_t rng) {
    constexpr int LD = HD + 8, KD = HD / 16, NT = BN / 8, DT = HD / 8;
    extern __shared__ __align__(128) unsigned char mm_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(mm_smem);   /* (64, LD) */
    bf16 *sK = sQ + MM_BM * LD;                      /* 2 stages of (BN, LD) */
    bf16 *sV = sK + 2 * BN * LD;                     /* 2 stages of (BN, LD) */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qtile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const int q0 = qtile * MM_BM;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const bf16 *qb = q + (size_t)b * Tn * qs + (size_t)h * HD;
    const bf16 *kb = k + (size_t)b * Tn * ks + (size_t)g * HD;
    const bf16 *vb = v + (size_t)b * Tn * ks + (size_t)g * HD;

    const int last = min(q0 + MM_BM, Tn) - 1;
    const int ntiles = last / BN + 1;
    load_tile_async<HD, MM_BM>(sQ, qb, qs, q0, Tn);
    load_tile_async<HD, BN>(sK, kb, ks, 0, Tn);
    load_tile_async<HD, BN>(sV, vb, ks, 0, Tn);
    cp_async_commit();

    /* this lane's two rows (m16n8 accumulator layout: rows lane/4 and lane/4 + 8 of the warp's 16) */
    const int quad = lane & 3;
    const int w0 = q0 + warp * 16;
    const int row_a = w0 + (lane >> 2), row_b = row_a + 8;
    const bool warp_active = w0 < Tn;
    const int warp_last = min(w0 + 15, Tn - 1);

    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
    uint32_t qf[KD][4];

    for (int tile = 0; tile < ntiles; tile++) {
        const int k0 = tile * BN, stage = tile & 1;
        if (tile + 1 < ntiles) {
            /* the other stage was last read in iteration tile - 1, which ended with a barrier */
            load_tile_async<HD, BN>(sK + (stage ^ 1) * BN * LD, kb, ks, k0 + BN, Tn);
            load_tile_async<HD, BN>(sV + (stage ^ 1) * BN * LD, vb, ks, k0 + BN, Tn);
            cp_async_commit();
            cp_async_wait<1>(); /* everything but the newest group: Q and this tile */
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *tK = sK + stage * BN * LD, *tV = sV + stage * BN * LD;
        if (tile == 0) {
            /* A fragments of the warp's 16 Q rows: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15),
             * (8-15, 8-15); lane l addresses row l % 16, column block l / 16 */
#pragma unroll
            for (int kk = 0; kk < KD; kk++)
                ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
        }
        if (warp_active && k0 <= warp_last) {
            /* S (16 x BN) = Q K^T; ldmatrix of K rows gives the col-major B fragments of K^T: matrices
             * (keys n..n+7, k 0-7), (n..n+7, k 8-15), (n+8.., k 0-7), (n+8.., k 8-15) */
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KD; kk++)
#pragma unroll
                for (int nt = 0; nt < NT; nt += 2) {
                    uint32_t r[4];
                    const int key = nt * 8 + (lane & 7) + ((lane >> 4) << 3);
                    ldmatrix_x4(r, tK + key * LD + kk * 16 + ((lane >> 3) & 1) * 8);
                    mma_bf16(s[nt], qf[kk], r[0], r[1]);
                    mma_bf16(s[nt + 1], qf[kk], r[2], r[3]);
                }
            /* scale and causal mask; the row max over the tile (4 lanes share a row) */
            float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e < 2 ? row_a : row_b, col = k0 + nt * 8 + 2 * quad + (e & 1);
                    const float x = (col <= r && r < Tn) ? s[nt][e] * scale : -INFINITY;
                    s[nt][e] = x;
                    if (e < 2) mx_a = fmaxf(mx_a, x);
                    else mx_b = fmaxf(mx_b, x);
                }
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
            const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
            const float corr_a = mn_a == -INFINITY ? 1.0f : expf(m_a - mn_a);
            const float corr_b = mn_b == -INFINITY ? 1.0f : expf(m_b - mn_b);
            m_a = mn_a, m_b = mn_b;
            /* p = exp(s - m); l sums p before dropout (this lane's part; the 4 lanes add up at the end) */
            float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float mm = e < 2 ? mn_a : mn_b;
                    float p = s[nt][e] == -INFINITY ? 0.0f : expf(s[nt][e] - mm);
                    if (e < 2) sum_a += p;
                    else sum_b += p;
                    if (dropout > 0.0f && p != 0.0f) {
                        const int r = e < 2 ? row_a : row_b, col = k0 + nt * 8 + 2 * quad + (e & 1);
                        const uint64_t idx =
                            (((uint64_t)b * (uint64_t)NH + (uint64_t)h) * (uint64_t)Tn + (uint64_t)r) * (uint64_t)Tn +
                            (uint64_t)col;
                        p = dev_dropout_keep(rng, idx, dropout) ? p * keep_scale : 0.0f;
                    }
                    s[nt][e] = p;
                }
            l_a = l_a * corr_a + sum_a;
            l_b = l_b * corr_b + sum_b;
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                o[dt][0] *= corr_a, o[dt][1] *= corr_a;
                o[dt][2] *= corr_b, o[dt][3] *= corr_b;
            }
            /* O += P V: P's A fragment for keys 16j..16j+15 is the accumulators of n-tiles 2j and 2j+1;
             * V (keys x HD, row-major) gives B fragments through ldmatrix.trans: matrices (keys 0-7,
             * hd n..n+7), (keys 8-15, n..), (keys 0-7, n+8..), (keys 8-15, n+8..) */
#pragma unroll
            for (int j = 0; j < BN / 16; j++) {
                uint32_t pa[4];
                pa[0] = pack_bf16(s[2 * j][0], s[2 * j][1]);
                pa[1] = pack_bf16(s[2 * j][2], s[2 * j][3]);
                pa[2] = pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]);
                pa[3] = pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
                for (int dt = 0; dt < DT; dt += 2) {
                    uint32_t r[4];
                    const int key = j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                    ldmatrix_x4_trans(r, tV + key * LD + dt * 8 + (lane >> 4) * 8);
                    mma_bf16(o[dt], pa, r[0], r[1]);
                    mma_bf16(o[dt + 1], pa, r[2], r[3]);
                }
            }
        }
        __syncthreads(); /* every warp is done with this stage before it is loaded again */
    }

    /* l over the 4 lanes of each row (fixed xor tree: the same bits on all 4), then out = O / l */
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    if (!warp_active) return;
    const float inv_a = 1.0f / l_a, inv_b = 1.0f / l_b;
    float *lse_bh = lse + ((size_t)b * NH + h) * Tn;
    if (row_a < Tn) {
        bf16 *ot = out + ((size_t)b * Tn + row_a) * qs + (size_t)h * HD;
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            *reinterpret_cast<__nv_bfloat162 *>(ot + dt * 8 + 2 * quad) =
                __floats2bfloat162_rn(o[dt][0] * inv_a, o[dt][1] * inv_a);
        if (quad == 0) lse_bh[row_a] = m_a + logf(l_a);
    }
    if (row_b < Tn) {
        bf16 *ot = out + ((size_t)b * Tn + row_b) * qs + (size_t)h * HD;
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            *reinterpret_cast<__nv_bfloat162 *>(ot + dt * 8 + 2 * quad) =
                __floats2bfloat162_rn(o[dt][2] * inv_b, o[dt][3] * inv_b);
        if (quad == 0) lse_bh[row_b] = m_b + logf(l_b);
    }
}

template <int HD, int BN>
void forward_hd(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int Tn, int NH, int NKV,
                float dropout, gt_rng_key key) {
    const size_t smem = sizeof(bf16) * (size_t)(HD + 8) * (MM_BM + 4 * BN);
    static int smem_set;
    if (!smem_set) {
        CUDA_CHECK(cudaFuncSetAttribute(mma_attention_forward_kernel<HD, BN>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = 1;
    }
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    dim3 grid((unsigned)((Tn + MM_BM - 1) / MM_BM), (unsigned)NH, (unsigned)B);
    mma_attention_forward_kernel<HD, BN><<<grid, MM_THREADS, smem>>>(out, lse, q, k, v, Tn, NH, NKV, scale, dropout,
                                                                    keep_scale, rng_base(key));
    CUDA_CHECK_LAUNCH();
}

long g_mma_calls = 0;

} /* namespace */

/* Tests: how many forward calls this kernel has taken so far. */
extern "C" long gt_cuda_attention_mma_calls(void) { return g_mma_calls; }

/* Called by cuda_attention.cu's attention_forward for the bf16 working type when the selected
 * variant is "mma" (gt_cuda_attention_variant() == 2); returns 1 when it ran the call. */
int gt_cuda_attention_mma_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int Tn,
                                  int NH, int NKV, int HD, float dropout, gt_rng_key key) {
    if (HD != 64 && HD != 128) return 0;
    if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out)) return 0;
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    if (HD == 64) forward_hd<64, 64>(o, lse, qq, kk, vv, B, Tn, NH, NKV, dropout, key);
    else forward_hd<128, 32>(o, lse, qq, kk, vv, B, Tn, NH, NKV, dropout, key);
    g_mma_calls++;
    return 1;
}
