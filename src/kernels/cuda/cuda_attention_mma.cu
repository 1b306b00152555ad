/*
 * cuda_attention_mma.cu — an opt-in bf16 flash attention (train.cuda_attention = mma), forward and
 * backward, on sm_80/sm_90 tensor cores through the PTX instructions whose register layouts the PTX
 * ISA documents (mma.sync m16n8k16, ldmatrix, cp.async; cuda_ptx.cuh), so that the accumulators (O in
 * forward; dQ, dK, dV in backward) stay in registers. It takes HD 64 and 128 with 16-byte aligned
 * tensors and leaves every other call to the default kernels (cuda_attention.cu), whose semantics it
 * shares (scale, causal mask, GQA, lse, ops.h's dropout); results differ by rounding only. It has
 * never run on a GPU: docs/gpu.md says how it was checked without one.
 *
 * Forward (FlashAttention-2's schedule): a block is 4 warps and 64 query rows, 16 per warp; tiles of
 * BN keys of K and V stream through shared memory in two cp.async stages; each warp computes S = Q K^T
 * in registers, the online softmax on them (a row's statistics over the 4 lanes that share it),
 * rescales O and adds P V, P re-packed from S's accumulators as A fragments (the m16n8 accumulator
 * layout is the A layout of two neighbouring n-tiles: the derivations are at mma_abt and mma_pv).
 * Backward, without atomics: D = rowsum(dO * O) (gt_cuda_attention_rowdot); a dq kernel per query
 * tile streams K and V; a dk/dv kernel per (key tile, kv head) streams Q, dO, lse and D of the group's
 * query heads from the diagonal on, so each output has one owner and a fixed summation order.
 * BN = 64 at HD 64, 32 at HD 128; shared rows are padded by 16 bytes so each ldmatrix hits 8 banks.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda_attention.cuh"
#include "cuda_ptx.cuh"

namespace {

constexpr int MM_THREADS = 128; /* 4 warps */
constexpr int MM_BM = 64;       /* query rows per block, 16 per warp */


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

/* The two fragment patterns of every kernel below (forward, dq, dk/dv).
 * The notation of the derivations: lane = 4 g + c (g = groupID = lane / 4, c = threadID_in_group =
 * lane % 4); the PTX ISA's m16n8k16 layouts for .bf16 (A: a[0] = (row g, cols 2c, 2c+1), a[1] = (g+8,
 * 2c..), a[2] = (g, 2c+8..), a[3] = (g+8, 2c+8..), the lower column in the low 16 bits; B, k x n
 * "col": b[0] = (k 2c, 2c+1; n g), b[1] = (k 2c+8, 2c+9; n g); C/D fp32: c[0], c[1] = (row g, cols 2c,
 * 2c+1), c[2], c[3] = (row g+8, same cols)); ldmatrix .m8n8.x4 .b16: lanes 8i..8i+7 give the row
 * addresses of matrix i, and register i of lane l holds row l / 4, columns 2 (l % 4), +1 of matrix i
 * (with .trans: row 2 (l % 4) and 2 (l % 4) + 1, column l / 4, i.e. the same of the transposed
 * matrix). */

/* acc (16 x 8 NT, C layout) += A B^T, A = 16 rows of a bf16 tile (As: the warp's first row), B = the
 * 8 NT rows of another (Bs), both HD wide (K = HD): the S = Q K^T product; mma_abt_kblock adds k-block
 * kk (columns 16 kk .. 16 kk + 15) for A's fragment a.
 *   A: ldmatrix.x4 with lane l addressing row l % 16, column 16 kk + 8 (l / 16): matrices (rows 0-7,
 *      k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15), so register i of lane 4g+c holds (g, 2c..),
 *      (g+8, 2c..), (g, 2c+8..), (g+8, 2c+8..) = a[0..3] exactly.
 *   B (k x n) = Bs^T, i.e. B[k][n] = Bs[row n][col k]; b[0] needs (k 2c, 2c+1; n g) = Bs row g,
 *      cols 2c, 2c+1 = register of a plain ldmatrix of the 8 x 8 block (rows n0..n0+7, cols k0..k0+7).
 *      Lane l addresses row 8 nt + (l % 8) + 8 (l / 16), column 16 kk + 8 ((l / 8) % 2): matrices
 *      (n-tile nt, k 0-7), (nt, k 8-15), (nt+1, k 0-7), (nt+1, k 8-15) = b[0], b[1] of nt, of nt+1. */
template <int HD, int NT>
__device__ __forceinline__ void mma_abt_kblock(float (&acc)[NT][4], const uint32_t (&a)[4], const bf16 *Bs, int kk,
                                               int lane) {
    constexpr int LD = HD + 8;
    static_assert(NT % 2 == 0, "n-tiles go in pairs");
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
        uint32_t r[4];
        const int row = nt * 8 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(r, Bs + row * LD + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16(acc[nt], a, r[0], r[1]);
        mma_bf16(acc[nt + 1], a, r[2], r[3]);
    }
}

/* the whole product, A read from shared memory per k-block (the backward; the forward keeps its Q
 * fragments in registers and calls mma_abt_kblock itself) */
template <int HD, int NT>
__device__ __forceinline__ void mma_abt(float (&acc)[NT][4], const bf16 *As, const bf16 *Bs, int lane) {
    constexpr int LD = HD + 8;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[4];
        ldmatrix_x4(a, As + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
        mma_abt_kblock<HD, NT>(acc, a, Bs, kk, lane);
    }
}

/* acc (16 x HD, C layout) += P V, P = 16 x 8 NT in C layout (fp32, rounded to bf16 here), V = the
 * 8 NT x HD row-major bf16 tile Vs (K = 8 NT).
 *   P as A: for k-block j (columns 16j..16j+15), a[0] = (g, 16j + 2c, +1) = p[2j][0..1], a[1] = (g+8,
 *      16j + 2c..) = p[2j][2..3], a[2] = (g, 16j + 8 + 2c..) = p[2j+1][0..1], a[3] = p[2j+1][2..3]:
 *      the accumulators of n-tiles 2j and 2j+1 are the A fragment, packed lower column low.
 *   V as B (k x n = keys x hd, stored row-major): b[0] = (k 2c, 2c+1; n g) = rows 2c, 2c+1 of column g
 *      of the 8 x 8 block, which is what ldmatrix.trans gives lane 4g+c. Lane l addresses row
 *      16 j + (l % 8) + 8 ((l / 8) % 2), column 8 dt + 8 (l / 16): matrices (k 0-7, n-tile dt),
 *      (k 8-15, dt), (k 0-7, dt+1), (k 8-15, dt+1) = b[0], b[1] of dt, of dt+1. */
template <int HD, int NT>
__device__ __forceinline__ void mma_pv(float (&acc)[HD / 8][4], const float (&p)[NT][4], const bf16 *Vs, int lane) {
    constexpr int LD = HD + 8, DT = HD / 8;
#pragma unroll
    for (int j = 0; j < NT / 2; j++) {
        uint32_t pa[4];
        pa[0] = pack_bf16(p[2 * j][0], p[2 * j][1]);
        pa[1] = pack_bf16(p[2 * j][2], p[2 * j][3]);
        pa[2] = pack_bf16(p[2 * j + 1][0], p[2 * j + 1][1]);
        pa[3] = pack_bf16(p[2 * j + 1][2], p[2 * j + 1][3]);
#pragma unroll
        for (int dt = 0; dt < DT; dt += 2) {
            uint32_t r[4];
            const int row = j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            ldmatrix_x4_trans(r, Vs + row * LD + dt * 8 + (lane >> 4) * 8);
            mma_bf16(acc[dt], pa, r[0], r[1]);
            mma_bf16(acc[dt + 1], pa, r[2], r[3]);
        }
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
    const bf16 *qb = head_rows(q, b, Tn, qs, h, HD);
    const bf16 *kb = head_rows(k, b, Tn, ks, g, HD);
    const bf16 *vb = head_rows(v, b, Tn, ks, g, HD);

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
            for (int kk = 0; kk < KD; kk++) mma_abt_kblock<HD, NT>(s, qf[kk], tK, kk, lane);
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
                        p = gt_dropout_keep_at(rng, gt_attention_drop_index(b, h, r, col, NH, Tn), dropout) ? p * keep_scale : 0.0f;
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
            mma_pv<HD, NT>(o, s, tV, lane);
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
                                                                    keep_scale, gt_rng_base(key));
    CUDA_CHECK_LAUNCH();
}

/* ================================================================ backward
 *
 * Shared by both kernels: tiles of Q, dO, K, V in shared memory in rows of HD + 8 bf16 (the forward's
 * padding), all of a warp's tensor-core work on its own 16 rows, and the forward's two fragment
 * patterns (mma_abt, mma_pv above). */

/* N floats src[row0 .. row0 + N) (a row statistic of one head: lse or D) into dst; past T zero */
template <int N>
__device__ __forceinline__ void load_stat_async(float *dst, const float *src, int row0, int Tn) {
    for (int i = threadIdx.x; i < N; i += MM_THREADS) {
        const int t = row0 + i;
        cp_async4(dst + i, t < Tn ? src + t : src, t < Tn ? 4 : 0);
    }
}

/* 16 rows x HD of an fp32 accumulator (C layout) to bf16 rows row_a (c[0], c[1]) and row_b = row_a + 8
 * (c[2], c[3]) of a (T, stride) view; 4-byte stores (dst is 16-byte aligned, the column 8 dt + 2 quad
 * even) */
template <int HD>
__device__ __forceinline__ void store_rows(bf16 *dst, size_t stride, const float (&acc)[HD / 8][4], int row_a,
                                           int quad, int Tn) {
    if (row_a < Tn) {
        bf16 *o = dst + (size_t)row_a * stride + 2 * quad;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *reinterpret_cast<__nv_bfloat162 *>(o + dt * 8) = __floats2bfloat162_rn(acc[dt][0], acc[dt][1]);
    }
    if (row_a + 8 < Tn) {
        bf16 *o = dst + (size_t)(row_a + 8) * stride + 2 * quad;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *reinterpret_cast<__nv_bfloat162 *>(o + dt * 8) = __floats2bfloat162_rn(acc[dt][2], acc[dt][3]);
    }
}

/* dq, grid (query tiles of 64, longest first) x NH x B: Q and dO tiles (64 rows) stay in shared
 * memory; the K and V tiles of BN keys, from key 0 to the block's last query, stream through two
 * cp.async stages. Per tile a warp computes S = Q K^T and dP~ = dO V^T (16 x BN each, fp32 in
 * registers), then in place dS = P (dP - D) scale with P = exp(S scale - lse) and dP = dP~ after
 * dropout, and dQ += dS K (K read with ldmatrix.trans, as V in the forward). */
template <int HD, int BN>
__global__ void __launch_bounds__(MM_THREADS, 2)
mma_attention_backward_dq_kernel(bf16 *dq, const float *Dbuf, const bf16 *dout, const bf16 *q, const bf16 *k,
                                 const bf16 *v, const float *lse, int Tn, int NH, int NKV, float scale, float dropout,
                                 float keep_scale, uint64_t rng) {
    constexpr int LD = HD + 8, NT = BN / 8, DT = HD / 8;
    extern __shared__ __align__(128) unsigned char mm_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(mm_smem); /* (64, LD) */
    bf16 *sdO = sQ + MM_BM * LD;                   /* (64, LD) */
    bf16 *sK = sdO + MM_BM * LD;                   /* 2 stages of (BN, LD) */
    bf16 *sV = sK + 2 * BN * LD;                   /* 2 stages of (BN, LD) */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qtile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const int q0 = qtile * MM_BM;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const bf16 *qb = head_rows(q, b, Tn, qs, h, HD);
    const bf16 *ob = head_rows(dout, b, Tn, qs, h, HD);
    const bf16 *kb = head_rows(k, b, Tn, ks, g, HD);
    const bf16 *vb = head_rows(v, b, Tn, ks, g, HD);

    const int last = min(q0 + MM_BM, Tn) - 1;
    const int ntiles = last / BN + 1;
    load_tile_async<HD, MM_BM>(sQ, qb, qs, q0, Tn);
    load_tile_async<HD, MM_BM>(sdO, ob, qs, q0, Tn);
    load_tile_async<HD, BN>(sK, kb, ks, 0, Tn);
    load_tile_async<HD, BN>(sV, vb, ks, 0, Tn);
    cp_async_commit();

    /* this lane's two query rows (C layout: g and g + 8 of the warp's 16) and their statistics */
    const int quad = lane & 3;
    const int w0 = q0 + warp * 16;
    const int row_a = w0 + (lane >> 2), row_b = row_a + 8;
    const bool warp_active = w0 < Tn;
    const int warp_last = min(w0 + 15, Tn - 1);
    const size_t bh = (size_t)b * NH + h;
    const float lse_a = row_a < Tn ? lse[bh * Tn + row_a] : 0.0f, lse_b = row_b < Tn ? lse[bh * Tn + row_b] : 0.0f;
    const float D_a = row_a < Tn ? Dbuf[bh * Tn + row_a] : 0.0f, D_b = row_b < Tn ? Dbuf[bh * Tn + row_b] : 0.0f;

    float acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    for (int tile = 0; tile < ntiles; tile++) {
        const int k0 = tile * BN, stage = tile & 1;
        if (tile + 1 < ntiles) {
            /* the other stage was last read in iteration tile - 1, which ended with a barrier */
            load_tile_async<HD, BN>(sK + (stage ^ 1) * BN * LD, kb, ks, k0 + BN, Tn);
            load_tile_async<HD, BN>(sV + (stage ^ 1) * BN * LD, vb, ks, k0 + BN, Tn);
            cp_async_commit();
            cp_async_wait<1>(); /* everything but the newest group: Q, dO and this tile */
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *tK = sK + stage * BN * LD, *tV = sV + stage * BN * LD;
        if (warp_active && k0 <= warp_last) { /* causal: a tile past the warp's last row adds nothing */
            float s[NT][4], dp[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
            mma_abt<HD, NT>(s, sQ + warp * 16 * LD, tK, lane);
            mma_abt<HD, NT>(dp, sdO + warp * 16 * LD, tV, lane);
            /* element (row r, key col) of the C layout: r = row_a for e < 2, row_b else; col = k0 +
             * 8 nt + 2 quad + (e & 1). dS replaces S in place. */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e < 2 ? row_a : row_b, col = k0 + nt * 8 + 2 * quad + (e & 1);
                    float ds = 0.0f;
                    if (col <= r && r < Tn) {
                        const float p = expf(s[nt][e] * scale - (e < 2 ? lse_a : lse_b));
                        float d = dp[nt][e];
                        if (dropout > 0.0f)
                            d = gt_dropout_keep_at(rng, gt_attention_drop_index(b, h, r, col, NH, Tn), dropout) ? d * keep_scale
                                                                                                   : 0.0f;
                        ds = p * (d - (e < 2 ? D_a : D_b)) * scale;
                    }
                    s[nt][e] = ds;
                }
            mma_pv<HD, NT>(acc, s, tK, lane); /* dQ += dS K */
        }
        __syncthreads(); /* every warp is done with this stage before it is loaded again */
    }
    if (warp_active) store_rows<HD>(head_rows(dq, b, Tn, qs, h, HD), qs, acc, row_a, quad, Tn);
}

/* dk and dv, grid (key tiles of 64, the first (most queries) first) x NKV x B: the block's K and V
 * rows stay in shared memory; the steps (query head of the group in order, query tile of BQ rows from
 * the block's diagonal on) stream Q, dO, lse and D through two cp.async stages. Per step a warp
 * computes S^T = K Q^T and dP~^T = V dO^T (its 16 keys x BQ queries, fp32 in registers), then P~^T
 * (after dropout) in place of S^T and dS^T in place of dP~^T, and dV += P~^T dO, dK += dS^T Q (dO and
 * Q read with ldmatrix.trans). The group's heads are summed in a fixed order (the step order) in the
 * same registers, so there is no atomic and no cross-block sum. */
template <int HD, int BQ>
__global__ void __launch_bounds__(MM_THREADS, 2)
mma_attention_backward_dkdv_kernel(bf16 *dk, bf16 *dv, const float *Dbuf, const bf16 *dout, const bf16 *q,
                                   const bf16 *k, const bf16 *v, const float *lse, int Tn, int NH, int NKV,
                                   float scale, float dropout, float keep_scale, uint64_t rng) {
    constexpr int LD = HD + 8, NT = BQ / 8, DT = HD / 8;
    static_assert(MM_BM % BQ == 0, "the first query tile of a key tile starts at its first key");
    extern __shared__ __align__(128) unsigned char mm_smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(mm_smem);                   /* (64, LD) the block's keys */
    bf16 *sV = sK + MM_BM * LD;                                      /* (64, LD) */
    bf16 *sQ = sV + MM_BM * LD;                                      /* 2 stages of (BQ, LD) */
    bf16 *sdO = sQ + 2 * BQ * LD;                                    /* 2 stages of (BQ, LD) */
    float *sL = reinterpret_cast<float *>(sdO + 2 * BQ * LD);        /* 2 stages of BQ lse */
    float *sD = sL + 2 * BQ;                                         /* 2 stages of BQ D */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int ktile = blockIdx.x; /* key tile 0 sees every query: the longest block starts first */
    const int g = blockIdx.y, b = blockIdx.z, group = NH / NKV;
    const int k0 = ktile * MM_BM;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const bf16 *kb = head_rows(k, b, Tn, ks, g, HD);
    const bf16 *vb = head_rows(v, b, Tn, ks, g, HD);

    /* steps it = 0 .. group * nq - 1: head g * group + it / nq, query tile qt0 + it % nq; queries
     * before k0 never see the block's keys (causal), so the first tile is the one holding k0 */
    const int qt0 = k0 / BQ, nq = (Tn + BQ - 1) / BQ - qt0, nsteps = group * nq;
    load_tile_async<HD, MM_BM>(sK, kb, ks, k0, Tn);
    load_tile_async<HD, MM_BM>(sV, vb, ks, k0, Tn);
    {
        const int h = g * group, q0 = qt0 * BQ;
        const size_t bh = (size_t)b * NH + h;
        load_tile_async<HD, BQ>(sQ, head_rows(q, b, Tn, qs, h, HD), qs, q0, Tn);
        load_tile_async<HD, BQ>(sdO, head_rows(dout, b, Tn, qs, h, HD), qs, q0, Tn);
        load_stat_async<BQ>(sL, lse + bh * Tn, q0, Tn);
        load_stat_async<BQ>(sD, Dbuf + bh * Tn, q0, Tn);
    }
    cp_async_commit();

    /* this lane's two key rows (C layout: g and g + 8 of the warp's 16 keys) */
    const int quad = lane & 3;
    const int w0 = k0 + warp * 16;
    const int row_a = w0 + (lane >> 2), row_b = row_a + 8;
    const bool warp_active = w0 < Tn;

    float dk_acc[DT][4], dv_acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk_acc[i][e] = dv_acc[i][e] = 0.0f;

    for (int it = 0; it < nsteps; it++) {
        const int stage = it & 1;
        const int h = g * group + it / nq, q0 = (qt0 + it % nq) * BQ;
        if (it + 1 < nsteps) {
            /* the other stage was last read in step it - 1, which ended with a barrier */
            const int hn = g * group + (it + 1) / nq, qn = (qt0 + (it + 1) % nq) * BQ;
            const size_t bhn = (size_t)b * NH + hn;
            load_tile_async<HD, BQ>(sQ + (stage ^ 1) * BQ * LD, head_rows(q, b, Tn, qs, hn, HD), qs, qn, Tn);
            load_tile_async<HD, BQ>(sdO + (stage ^ 1) * BQ * LD, head_rows(dout, b, Tn, qs, hn, HD), qs, qn, Tn);
            load_stat_async<BQ>(sL + (stage ^ 1) * BQ, lse + bhn * Tn, qn, Tn);
            load_stat_async<BQ>(sD + (stage ^ 1) * BQ, Dbuf + bhn * Tn, qn, Tn);
            cp_async_commit();
            cp_async_wait<1>(); /* everything but the newest group: K, V and this step */
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *tQ = sQ + stage * BQ * LD, *tdO = sdO + stage * BQ * LD;
        const float *tL = sL + stage * BQ, *tD = sD + stage * BQ;
        /* causal: nothing to add when every query of the tile precedes the warp's first key */
        if (warp_active && q0 + BQ - 1 >= w0) {
            float s[NT][4], dp[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
            mma_abt<HD, NT>(s, sK + warp * 16 * LD, tQ, lane);   /* S^T: keys x queries */
            mma_abt<HD, NT>(dp, sV + warp * 16 * LD, tdO, lane); /* dP~^T */
            /* element (key row sk, query col c of the tile) of the C layout: sk = row_a for e < 2,
             * row_b else; c = 8 nt + 2 quad + (e & 1) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int sk = e < 2 ? row_a : row_b, c = nt * 8 + 2 * quad + (e & 1), tq = q0 + c;
                    float pt = 0.0f, ds = 0.0f;
                    if (tq < Tn && sk <= tq) {
                        const float p = expf(s[nt][e] * scale - tL[c]);
                        float d = dp[nt][e];
                        pt = p;
                        if (dropout > 0.0f) {
                            const bool keep = gt_dropout_keep_at(rng, gt_attention_drop_index(b, h, tq, sk, NH, Tn), dropout);
                            d = keep ? d * keep_scale : 0.0f;
                            pt = keep ? p * keep_scale : 0.0f;
                        }
                        ds = p * (d - tD[c]) * scale;
                    }
                    s[nt][e] = pt;
                    dp[nt][e] = ds;
                }
            mma_pv<HD, NT>(dv_acc, s, tdO, lane); /* dV += P~^T dO */
            mma_pv<HD, NT>(dk_acc, dp, tQ, lane); /* dK += dS^T Q */
        }
        __syncthreads(); /* every warp is done with this stage before it is loaded again */
    }
    if (warp_active) {
        store_rows<HD>(head_rows(dk, b, Tn, ks, g, HD), ks, dk_acc, row_a, quad, Tn);
        store_rows<HD>(head_rows(dv, b, Tn, ks, g, HD), ks, dv_acc, row_a, quad, Tn);
    }
}

/* shared memory of the backward kernels: the 64-row tiles, two stages of the BN (BQ) row tiles, and in
 * dk/dv two stages of lse and D */
template <int HD, int BN>
constexpr size_t bwd_dq_smem() { return sizeof(bf16) * (size_t)(HD + 8) * (2 * MM_BM + 4 * BN); }
template <int HD, int BN>
constexpr size_t bwd_dkdv_smem() { return bwd_dq_smem<HD, BN>() + sizeof(float) * 4 * BN; }

template <int HD, int BN>
void backward_hd(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out, const bf16 *q, const bf16 *k,
                 const bf16 *v, const float *lse, int B, int Tn, int NH, int NKV, float dropout, gt_rng_key key) {
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const uint64_t rng = gt_rng_base(key);
    float *Dbuf = (float *)gt_cuda_alloc(sizeof(float) * (size_t)B * NH * Tn); /* (B, NH, T) */
    gt_cuda_attention_rowdot(Dbuf, dout, out, B, Tn, NH, HD, 1);

    const size_t smem_dq = bwd_dq_smem<HD, BN>(), smem_kv = bwd_dkdv_smem<HD, BN>();
    static int smem_set;
    if (!smem_set) {
        CUDA_CHECK(cudaFuncSetAttribute(mma_attention_backward_dq_kernel<HD, BN>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dq));
        CUDA_CHECK(cudaFuncSetAttribute(mma_attention_backward_dkdv_kernel<HD, BN>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
        smem_set = 1;
    }
    const unsigned tiles = (unsigned)((Tn + MM_BM - 1) / MM_BM);
    mma_attention_backward_dq_kernel<HD, BN><<<dim3(tiles, (unsigned)NH, (unsigned)B), MM_THREADS, smem_dq>>>(
        dq, Dbuf, dout, q, k, v, lse, Tn, NH, NKV, scale, dropout, keep_scale, rng);
    CUDA_CHECK_LAUNCH();
    mma_attention_backward_dkdv_kernel<HD, BN><<<dim3(tiles, (unsigned)NKV, (unsigned)B), MM_THREADS, smem_kv>>>(
        dk, dv, Dbuf, dout, q, k, v, lse, Tn, NH, NKV, scale, dropout, keep_scale, rng);
    CUDA_CHECK_LAUNCH();
    gt_cuda_free(Dbuf); /* stream-ordered: a later user of this block runs after the kernels */
}

long g_mma_calls = 0;

} /* namespace */

/* Tests: how many calls (forward or backward) these kernels have taken so far. */
extern "C" long gt_cuda_attention_mma_calls(void) { return g_mma_calls; }

/* Called by cuda_attention.cu's attention_forward for the bf16 working type when the selected
 * variant is GT_CUDA_ATTENTION_MMA; returns 1 when it ran the call. */
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

/* Called by cuda_attention.cu's attention_backward for the bf16 working type when the selected variant
 * is GT_CUDA_ATTENTION_MMA; returns 1 when it ran the call, 0 to leave it to the default kernels. Inputs
 * read with cp.async (q, k, v, dout) and outputs written with 4-byte stores (dq, dk, dv) must be
 * 16-byte aligned. */
int gt_cuda_attention_mma_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *q,
                                   const void *k, const void *v, const float *lse, int B, int Tn, int NH, int NKV,
                                   int HD, float dropout, gt_rng_key key) {
    if (HD != 64 && HD != 128) return 0;
    if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(dout)) return 0;
    if (!aligned16(dq) || !aligned16(dk) || !aligned16(dv)) return 0;
    bf16 *a = (bf16 *)dq, *bk = (bf16 *)dk, *bv = (bf16 *)dv;
    const bf16 *o = (const bf16 *)dout, *ou = (const bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    if (HD == 64) backward_hd<64, 64>(a, bk, bv, o, ou, qq, kk, vv, lse, B, Tn, NH, NKV, dropout, key);
    else backward_hd<128, 32>(a, bk, bv, o, ou, qq, kk, vv, lse, B, Tn, NH, NKV, dropout, key);
    g_mma_calls++;
    return 1;
}
