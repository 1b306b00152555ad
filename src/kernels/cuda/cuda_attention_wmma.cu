/*
 * cuda_attention_wmma.cu — an OPTIONAL bf16 tensor-core variant of the causal grouped-query attention
 * of cuda_attention.cu (same contract as ops.h's attention_forward / attention_backward), written with
 * nvcuda::wmma (16x16x16 bf16 fragments, fp32 accumulate).
 *
 *   *** NEVER RUN ON A GPU. Written and compiled (nvcc 13, sm_90) without a device; trust it only once
 *   *** tests/gpu/test_ops_cuda.c has passed on a real GPU.
 *
 * This source does run on the CPU (CTest cuda_kernels_emulated_match_cpu, _reverse_schedule and
 * cuda_kernels_emulated_attention_warp_schedule, trainer_on_emulated_cuda; label unit: tests/gpu/emu):
 * under GT_CUDA_EMULATED nvcuda::wmma comes from tests/gpu/emu/emu_wmma.h (nvcc's build is unchanged:
 * same cubin), its operations warp-collective (all 32 lanes, the same arguments), pointers 32-byte
 * aligned and ldm a multiple of 8 bf16 / 4 floats checked, layouts and ldm honoured, in a fragment
 * layout of the emulation's choosing; the blocks' threads run as fibers with real barriers (and, in
 * the _warp_schedule run, one warp at a time, so a missing barrier before another warp's tile is read
 * shows). out, lse, dq, dk, dv agree with the CPU backend at test_ops_cuda's tolerances and repeat bit
 * for bit there. Not checked there: the tensor cores' accumulation order and rounding, the hardware's
 * fragment layout (the kernels must not depend on it: they never index fragments), registers, races
 * between blocks, speed.
 *
 * Selection. Opt-in: used only when the environment variable GTRAIN_CUDA_ATTENTION=wmma (or =mma, for
 * the calls cuda_attention_mma.cu does not take: HD 32, unaligned tensors) is set (read
 * once, on the first attention call), or when a test forces it (gt_cuda_attention_force_variant), and
 * then only for the bf16 working type with HD in {32, 64, 128} and 16-byte aligned q, k, v (and dout
 * in backward: they are read with 16-byte loads). Everything else keeps using the fp32 CUDA-core
 * kernels of cuda_attention.cu; the hook there (one call at the top of attention_forward and of
 * attention_backward) asks the functions at the bottom of this file, which return 1 when they took
 * the call.
 *
 * Semantics are those of cuda_attention.cu: scale 1/sqrt(HD), causal mask s <= t, GQA head h reads kv
 * head h / (NH/NKV), lse = m + log(l) with l the sum of the pre-dropout probabilities, dropout on the
 * probabilities with the same keep decision (dev_dropout_keep at index ((b*NH + h)*T + t)*T + s, only
 * for p != 0 in forward) and the same 1/(1-p) scaling. Differences are rounding only: scores are
 * bf16 x bf16 products summed in fp32 by the tensor cores (exact products, another summation order),
 * and the matrices fed back into the tensor cores are rounded to bf16: the probabilities P (forward,
 * dv) and dS (dq, dk). The row statistics (m, l, lse, D) stay fp32 and are computed from fp32 values,
 * so lse agrees with the existing kernel to fp32 summation-order noise, and the backward (which
 * recomputes p = exp(s * scale - lse)) could be paired with either forward.
 *
 * Layout. Every kernel runs 128 threads = 4 warps; a warp owns 16 rows of the block's row tile (query
 * rows in forward and dq, key rows in dk/dv) and does all its wmma work on its own rows, so the only
 * block barriers are around the loads of shared tiles. Tiles in shared memory:
 *   bf16 operand tiles (64 rows x HD), rows padded to HD + 8 elements (16 bytes: consecutive rows
 *     start 4 banks apart, and every 16x16 fragment start stays 32-byte aligned as wmma requires);
 *     loaded with 16-byte vector loads, rows past T are zero;
 *   fp32 score tiles (64 x 64), rows padded to 64 + 4 floats; bf16 P / dS tiles rows padded to 64 + 8.
 * Element-wise work on a warp's 16 x 64 score tile: lane pair (2r, 2r+1) owns row r, lane 2r+half the
 * columns c = 2i + half; a row's max / sum is the lane's own fixed-order partial and one xor-1 shuffle
 * (a+b == b+a, so both lanes get the same bits). Nothing uses atomics; every sum has a fixed order, so
 * results repeat bit for bit.
 *
 * Forward (grid: query tiles of 64 rows (longest first) x NH x B). Q (64 x HD) is loaded once and each
 * warp keeps its 16 rows as HD/16 matrix_a fragments in registers. Per key tile of 64 (up to the
 * diagonal): the block loads K and V; each warp with a valid key in the tile computes S = Q K^T (K as a
 * col_major matrix_b straight from the row-major K tile) into its rows of sS, then the online softmax
 * per row: s = S*scale masked to -inf (s > t or t >= T), m_new = max(m, rowmax), corr = exp(m - m_new)
 * (1 while m_new = -inf), p = exp(s - m_new), l = l*corr + sum p (before dropout), P = dropout(p) in
 * bf16 into sP. The O accumulator is NOT kept in fragments (their element-to-row mapping is opaque):
 * it lives in shared memory as fp32 (sO, 64 x HD+4); the lane pair of row r multiplies row r by corr,
 * then the warp does O += P V fragment by fragment (load_matrix_sync of the fp32 accumulator from sO,
 * BN/16 mma_sync, store back). At the end out = O / l (rounded to bf16) and lse = m + log(l).
 * Shared memory: 3*64*(HD+8)*2 + 64*68*4 + 64*72*2 + 64*(HD+4)*4 bytes = 110 KiB at HD 128, 70 KiB at
 * HD 64, 50 KiB at HD 32.
 *
 * Backward, as cuda_attention.cu (dp~ = dout_t . v_s, dp = dp~ * keep/(1-p), D_t = sum_s p dp
 * = dout_t . out_t, ds = p (dp - D_t) * scale), without atomics:
 *   D kernel (cuda_attention.cu's gt_cuda_attention_rowdot): D_t = dout_t . out_t from the forward
 *     output into a (B, NH, T) fp32 scratch buffer, one warp per row;
 *   dq kernel (grid: query tiles of 64 x NH x B): Q and dO tiles stay in shared memory; one pass over
 *     the key tiles computes S = Q K^T and dP~ = dO V^T with wmma into fp32 tiles, writes dS in bf16
 *     and accumulates dQ += dS K in HD/16 fp32 accumulator fragments in registers (no rescaling is
 *     needed in backward). dQ goes out through an fp32 staging tile over the K/V tiles' shared memory.
 *     Shared memory: 4*64*(HD+8)*2 + 2*64*68*4 + 64*72*2 bytes = 111 KiB at HD 128 (79 at 64, 63 at 32).
 *   dk/dv kernel (grid: key tiles of 64 x NKV x B): each block owns 64 keys (16 per warp) of one kv
 *     head and loops, in fixed order, over the group's query heads and the query tiles of 64 from the
 *     diagonal on. Per step: S^T = K Q^T and dP~^T = V dO^T (warp's 16 keys x 64 queries, fp32), the
 *     element-wise step gives P~^T (after dropout) and dS^T in bf16, then dV += P~^T dO and
 *     dK += dS^T Q accumulate in 2*HD/16 fp32 fragments in registers. Staging for the bf16 store reuses
 *     the operand tiles' shared memory. Shared memory: 4*64*(HD+8)*2 + 2*64*68*4 + 2*64*72*2 + 2*64*4
 *     bytes = 120.5 KiB at HD 128 (88.5 at 64, 72.5 at 32).
 * Registers (ptxas, nvcc 13.0, sm_90, no spills): forward 96/96/72 at HD 128/64/32, dq 128/96/72,
 * dk/dv 237/126/72 (its kk loop is kept rolled: unrolled, HD 128 spilled at 255).
 * Like the existing kernels this recomputes the scores twice in backward; the point here is the
 * tensor cores, not the flash-attention-2 schedule (no cp.async pipelining, no wgmma).
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

/* nvcuda::wmma: the toolkit's <mma.h> for nvcc; the CPU emulation (tests/gpu/emu, GT_CUDA_EMULATED,
 * built by the host compiler, which cannot take <mma.h>'s device intrinsics) gets a host one with the
 * same names and signatures from emu_wmma.h. nvcc never defines GT_CUDA_EMULATED, so the device code is
 * unchanged by this. */
#ifdef GT_CUDA_EMULATED
#include "emu_wmma.h"
#else
#include <mma.h>
#endif

using namespace nvcuda;

namespace {

constexpr int WM_THREADS = 128; /* 4 warps, 16 rows each */
constexpr int WM_ROWS = 64;     /* rows per block tile (queries in forward/dq, keys in dk/dv) */
constexpr int WM_COLS = 64;     /* columns per step (keys in forward/dq, queries in dk/dv) */
constexpr int LDS = WM_COLS + 4; /* fp32 score tile row stride */
constexpr int LDP = WM_COLS + 8; /* bf16 P / dS tile row stride */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_acc;

/* byte sizes of the shared tiles; each a multiple of 128 so every region start stays aligned */
template <int HD>
struct Tiles {
    static constexpr int LDH = HD + 8; /* bf16 operand tile row stride */
    static constexpr int LDO = HD + 4; /* fp32 HD-wide tile row stride */
    static constexpr size_t OPER = (size_t)WM_ROWS * LDH * sizeof(bf16);
    static constexpr size_t SCORE = (size_t)WM_ROWS * LDS * sizeof(float);
    static constexpr size_t PTILE = (size_t)WM_ROWS * LDP * sizeof(bf16);
    static constexpr size_t OTILE = (size_t)WM_ROWS * LDO * sizeof(float);
    static constexpr size_t ROWV = (size_t)WM_ROWS * sizeof(float);
    static constexpr size_t FWD = 3 * OPER + SCORE + PTILE + OTILE;
    static constexpr size_t DQ = 4 * OPER + 2 * SCORE + PTILE;
    static constexpr size_t DKDV = 4 * OPER + 2 * SCORE + 2 * PTILE + 2 * ROWV;
    static_assert(OPER % 128 == 0 && SCORE % 128 == 0 && PTILE % 128 == 0 && OTILE % 128 == 0 &&
                      ROWV % 128 == 0,
                  "shared tiles must keep 128-byte alignment");
    static_assert(HD % 16 == 0, "HD must be a multiple of 16");
    /* the fp32 staging tiles at the end of dq and dk/dv fit in the operand tiles they reuse */
    static_assert(OTILE <= 2 * OPER, "dq staging must fit in the K and V tiles");
};

__device__ __forceinline__ uint64_t wm_drop_index(int b, int h, int t, int s, int NH, int Tn) {
    return (((uint64_t)b * (uint64_t)NH + (uint64_t)h) * (uint64_t)Tn + (uint64_t)t) * (uint64_t)Tn + (uint64_t)s;
}

/* rows [row0, row0 + ROWS) of a (T, stride) bf16 view, HD columns, into dst (ROWS x HD+8), 16 bytes per
 * thread and step; rows past T are zero. src + t*stride is 16-byte aligned (checked on the host). */
template <int HD, int ROWS>
__device__ __forceinline__ void load_tile(bf16 *dst, const bf16 *src, size_t stride, int row0, int Tn) {
    constexpr int LDH = HD + 8, CH = HD / 8;
    for (int idx = threadIdx.x; idx < ROWS * CH; idx += WM_THREADS) {
        const int r = idx / CH, c = (idx % CH) * 8, t = row0 + r;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (t < Tn) val = *reinterpret_cast<const uint4 *>(src + (size_t)t * stride + c);
        *reinterpret_cast<uint4 *>(dst + r * LDH + c) = val;
    }
}

/* S (16 x 64) = A_w (16 x HD, rows of a bf16 tile) . B^T where B is a 64 x HD bf16 tile (row-major,
 * read as a col_major matrix_b); stored into sOut (16 rows, stride LDS) */
template <int HD>
__device__ __forceinline__ void warp_scores(float *sOut, const bf16 *A, const bf16 *Bt) {
    constexpr int LDH = HD + 8;
#pragma unroll
    for (int j = 0; j < WM_COLS / 16; j++) {
        frag_acc acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            frag_a a;
            frag_b_col bt;
            wmma::load_matrix_sync(a, A + kk * 16, LDH);
            wmma::load_matrix_sync(bt, Bt + j * 16 * LDH + kk * 16, LDH);
            wmma::mma_sync(acc, a, bt, acc);
        }
        wmma::store_matrix_sync(sOut + j * 16, acc, LDS, wmma::mem_row_major);
    }
}

/* ---------------------------------------------------------------- forward */

template <int HD>
__global__ void __launch_bounds__(WM_THREADS)
wmma_attention_forward_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int Tn, int NH,
                              int NKV, float scale, float dropout, float keep_scale, uint64_t rng) {
    typedef Tiles<HD> TL;
    constexpr int BM = WM_ROWS, BN = WM_COLS, LDH = TL::LDH, LDO = TL::LDO;
    extern __shared__ __align__(128) unsigned char wm_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(wm_smem);                       /* (BM, LDH) */
    bf16 *sK = reinterpret_cast<bf16 *>(wm_smem + TL::OPER);            /* (BN, LDH) */
    bf16 *sV = reinterpret_cast<bf16 *>(wm_smem + 2 * TL::OPER);        /* (BN, LDH) */
    float *sS = reinterpret_cast<float *>(wm_smem + 3 * TL::OPER);      /* (BM, LDS) scores */
    bf16 *sP = reinterpret_cast<bf16 *>(wm_smem + 3 * TL::OPER + TL::SCORE);              /* (BM, LDP) */
    float *sO = reinterpret_cast<float *>(wm_smem + 3 * TL::OPER + TL::SCORE + TL::PTILE); /* (BM, LDO) */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qtile = gridDim.x - 1 - blockIdx.x; /* longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const int q0 = qtile * BM;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const bf16 *qb = head_rows(q, b, Tn, qs, h, HD);
    const bf16 *kb = head_rows(k, b, Tn, ks, g, HD);
    const bf16 *vb = head_rows(v, b, Tn, ks, g, HD);

    load_tile<HD, BM>(sQ, qb, qs, q0, Tn);
    for (int i = threadIdx.x; i < BM * LDO; i += WM_THREADS) sO[i] = 0.0f;
    __syncthreads();

    const int r0 = warp * 16;                     /* this warp's rows */
    const int row = lane >> 1, half = lane & 1;   /* this lane pair's row, this lane's columns 2i+half */
    const int t = q0 + r0 + row;                  /* the row's query position */
    const bool warp_active = q0 + r0 < Tn;
    const int warp_last = min(q0 + r0 + 15, Tn - 1); /* last key any of the warp's rows may see */
    float *srow = sS + (r0 + row) * LDS;
    bf16 *prow = sP + (r0 + row) * LDP;
    float *orow = sO + (r0 + row) * LDO;

    frag_a qf[HD / 16];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) wmma::load_matrix_sync(qf[kk], sQ + r0 * LDH + kk * 16, LDH);

    float m = -INFINITY, l = 0.0f; /* identical in both lanes of the pair */
    const int last = min(q0 + BM, Tn) - 1;
    for (int k0 = 0; k0 <= last; k0 += BN) {
        __syncthreads(); /* every warp is done with the previous sK, sV */
        load_tile<HD, BN>(sK, kb, ks, k0, Tn);
        load_tile<HD, BN>(sV, vb, ks, k0, Tn);
        __syncthreads();
        if (!warp_active || k0 > warp_last) continue; /* no valid score in the warp's rows: state unchanged */

        /* S = Q K^T for the warp's 16 rows */
#pragma unroll
        for (int j = 0; j < BN / 16; j++) {
            frag_acc acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                frag_b_col kt;
                wmma::load_matrix_sync(kt, sK + j * 16 * LDH + kk * 16, LDH);
                wmma::mma_sync(acc, qf[kk], kt, acc);
            }
            wmma::store_matrix_sync(sS + r0 * LDS + j * 16, acc, LDS, wmma::mem_row_major);
        }
        __syncwarp();

        /* online softmax of row `row`, columns 2i + half */
        float mx = -INFINITY;
#pragma unroll 4
        for (int i = 0; i < BN / 2; i++) {
            const int c = 2 * i + half, sk = k0 + c;
            const float sv = (t < Tn && sk <= t) ? srow[c] * scale : -INFINITY;
            srow[c] = sv;
            mx = fmaxf(mx, sv);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_new = fmaxf(m, mx);
        /* m_new == -inf: no valid key yet (only rows past T); keep everything at zero */
        const float corr = m_new == -INFINITY ? 1.0f : expf(m - m_new);
        float row_sum = 0.0f;
#pragma unroll 4
        for (int i = 0; i < BN / 2; i++) {
            const int c = 2 * i + half, sk = k0 + c;
            const float sv = srow[c];
            float p = sv == -INFINITY ? 0.0f : expf(sv - m_new);
            row_sum += p;
            if (dropout > 0.0f && p != 0.0f)
                p = dev_dropout_keep(rng, wm_drop_index(b, h, t, sk, NH, Tn), dropout) ? p * keep_scale : 0.0f;
            prow[c] = __float2bfloat16(p);
        }
        row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
        l = l * corr + row_sum;
        m = m_new;
        if (corr != 1.0f) {
#pragma unroll 4
            for (int i = 0; i < HD / 2; i++) orow[2 * i + half] *= corr;
        }
        __syncwarp();

        /* O += P V, the fp32 accumulator round-tripping through sO */
        frag_a pf[BN / 16];
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) wmma::load_matrix_sync(pf[kk], sP + r0 * LDP + kk * 16, LDP);
#pragma unroll
        for (int jd = 0; jd < HD / 16; jd++) {
            frag_acc of;
            wmma::load_matrix_sync(of, sO + r0 * LDO + jd * 16, LDO, wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                frag_b_row vf;
                wmma::load_matrix_sync(vf, sV + kk * 16 * LDH + jd * 16, LDH);
                wmma::mma_sync(of, pf[kk], vf, of);
            }
            wmma::store_matrix_sync(sO + r0 * LDO + jd * 16, of, LDO, wmma::mem_row_major);
        }
        __syncwarp();
    }

    if (warp_active && t < Tn) { /* t < T: key 0 was valid, so l > 0 */
        if (half == 0) lse[((size_t)b * NH + h) * Tn + t] = m + logf(l);
        const float inv = 1.0f / l;
        bf16 *ot = out + ((size_t)b * Tn + t) * qs + (size_t)h * HD;
#pragma unroll 4
        for (int i = 0; i < HD / 2; i++) {
            const int d = 2 * i + half;
            ot[d] = __float2bfloat16(orow[d] * inv);
        }
    }
}

/* ---------------------------------------------------------------- backward: dq and D */

template <int HD>
__global__ void __launch_bounds__(WM_THREADS)
wmma_attention_backward_dq_kernel(bf16 *dq, const float *Dbuf, const bf16 *dout, const bf16 *q, const bf16 *k,
                                  const bf16 *v, const float *lse, int Tn, int NH, int NKV, float scale,
                                  float dropout, float keep_scale, uint64_t rng) {
    typedef Tiles<HD> TL;
    constexpr int BM = WM_ROWS, BN = WM_COLS, LDH = TL::LDH, LDO = TL::LDO;
    extern __shared__ __align__(128) unsigned char wm_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(wm_smem);                   /* (BM, LDH) */
    bf16 *sdO = reinterpret_cast<bf16 *>(wm_smem + TL::OPER);       /* (BM, LDH) */
    bf16 *sK = reinterpret_cast<bf16 *>(wm_smem + 2 * TL::OPER);    /* (BN, LDH) */
    bf16 *sV = reinterpret_cast<bf16 *>(wm_smem + 3 * TL::OPER);    /* (BN, LDH) */
    float *sS = reinterpret_cast<float *>(wm_smem + 4 * TL::OPER);  /* (BM, LDS) scores */
    float *sDP = reinterpret_cast<float *>(wm_smem + 4 * TL::OPER + TL::SCORE);     /* (BM, LDS) dp~ */
    bf16 *sdS = reinterpret_cast<bf16 *>(wm_smem + 4 * TL::OPER + 2 * TL::SCORE);   /* (BM, LDP) ds */
    float *sStage = reinterpret_cast<float *>(wm_smem + 2 * TL::OPER); /* (BM, LDO) after the loops, over sK/sV */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qtile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const int q0 = qtile * BM;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const bf16 *qb = head_rows(q, b, Tn, qs, h, HD);
    const bf16 *ob = head_rows(dout, b, Tn, qs, h, HD);
    const bf16 *kb = head_rows(k, b, Tn, ks, g, HD);
    const bf16 *vb = head_rows(v, b, Tn, ks, g, HD);
    const float *lse_bh = lse + ((size_t)b * NH + h) * Tn;

    load_tile<HD, BM>(sQ, qb, qs, q0, Tn);
    load_tile<HD, BM>(sdO, ob, qs, q0, Tn);

    const int r0 = warp * 16;
    const int row = lane >> 1, half = lane & 1;
    const int t = q0 + r0 + row;
    const bool warp_active = q0 + r0 < Tn;
    const int warp_last = min(q0 + r0 + 15, Tn - 1);
    const float row_lse = t < Tn ? lse_bh[t] : 0.0f;
    const float *srow = sS + (r0 + row) * LDS;
    const float *dprow = sDP + (r0 + row) * LDS;
    bf16 *dsrow = sdS + (r0 + row) * LDP;
    const int last = min(q0 + BM, Tn) - 1;

    /* D_t = dout_t . out_t, made by gt_cuda_attention_rowdot */
    const float Dt = t < Tn ? Dbuf[((size_t)b * NH + h) * Tn + t] : 0.0f;

    /* dq_t = sum_s ds k_s, accumulated in fragments */
    frag_acc acc[HD / 16];
#pragma unroll
    for (int jd = 0; jd < HD / 16; jd++) wmma::fill_fragment(acc[jd], 0.0f);
    for (int k0 = 0; k0 <= last; k0 += BN) {
        __syncthreads();
        load_tile<HD, BN>(sK, kb, ks, k0, Tn);
        load_tile<HD, BN>(sV, vb, ks, k0, Tn);
        __syncthreads();
        if (!warp_active || k0 > warp_last) continue;
        warp_scores<HD>(sS + r0 * LDS, sQ + r0 * LDH, sK);
        warp_scores<HD>(sDP + r0 * LDS, sdO + r0 * LDH, sV);
        __syncwarp();
#pragma unroll 4
        for (int i = 0; i < BN / 2; i++) {
            const int c = 2 * i + half, sk = k0 + c;
            float ds = 0.0f;
            if (t < Tn && sk <= t) {
                const float p = expf(srow[c] * scale - row_lse);
                float d = dprow[c];
                if (dropout > 0.0f)
                    d = dev_dropout_keep(rng, wm_drop_index(b, h, t, sk, NH, Tn), dropout) ? d * keep_scale : 0.0f;
                ds = p * (d - Dt) * scale;
            }
            dsrow[c] = __float2bfloat16(ds);
        }
        __syncwarp();
#pragma unroll 1
        for (int kk = 0; kk < BN / 16; kk++) {
            frag_a dsf;
            wmma::load_matrix_sync(dsf, sdS + r0 * LDP + kk * 16, LDP);
#pragma unroll
            for (int jd = 0; jd < HD / 16; jd++) {
                frag_b_row kf;
                wmma::load_matrix_sync(kf, sK + kk * 16 * LDH + jd * 16, LDH);
                wmma::mma_sync(acc[jd], dsf, kf, acc[jd]);
            }
        }
        __syncwarp();
    }

    __syncthreads(); /* every warp is done with sK/sV: they become the fp32 staging tile */
#pragma unroll
    for (int jd = 0; jd < HD / 16; jd++)
        wmma::store_matrix_sync(sStage + r0 * LDO + jd * 16, acc[jd], LDO, wmma::mem_row_major);
    __syncwarp();
    if (warp_active && t < Tn) {
        const float *strow = sStage + (r0 + row) * LDO;
        bf16 *dqt = dq + ((size_t)b * Tn + t) * qs + (size_t)h * HD;
#pragma unroll 4
        for (int i = 0; i < HD / 2; i++) {
            const int d = 2 * i + half;
            dqt[d] = __float2bfloat16(strow[d]);
        }
    }
}

/* ---------------------------------------------------------------- backward: dk and dv */

template <int HD>
__global__ void __launch_bounds__(WM_THREADS)
wmma_attention_backward_dkdv_kernel(bf16 *dk, bf16 *dv, const float *Dbuf, const bf16 *dout, const bf16 *q,
                                    const bf16 *k, const bf16 *v, const float *lse, int Tn, int NH, int NKV,
                                    float scale, float dropout, float keep_scale, uint64_t rng) {
    typedef Tiles<HD> TL;
    constexpr int BN = WM_ROWS, BQ = WM_COLS, LDH = TL::LDH, LDO = TL::LDO;
    extern __shared__ __align__(128) unsigned char wm_smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(wm_smem);                   /* (BN, LDH) this block's keys */
    bf16 *sV = reinterpret_cast<bf16 *>(wm_smem + TL::OPER);        /* (BN, LDH) */
    bf16 *sQ = reinterpret_cast<bf16 *>(wm_smem + 2 * TL::OPER);    /* (BQ, LDH) the current query tile */
    bf16 *sdO = reinterpret_cast<bf16 *>(wm_smem + 3 * TL::OPER);   /* (BQ, LDH) its dout rows */
    unsigned char *after = wm_smem + 4 * TL::OPER;
    float *sS = reinterpret_cast<float *>(after);                    /* (BN, LDS) S^T: keys x queries */
    float *sDP = reinterpret_cast<float *>(after + TL::SCORE);       /* (BN, LDS) dP~^T */
    bf16 *sPt = reinterpret_cast<bf16 *>(after + 2 * TL::SCORE);     /* (BN, LDP) P~^T (after dropout) */
    bf16 *sdS = reinterpret_cast<bf16 *>(after + 2 * TL::SCORE + TL::PTILE);          /* (BN, LDP) dS^T */
    float *sL = reinterpret_cast<float *>(after + 2 * TL::SCORE + 2 * TL::PTILE);     /* (BQ) lse */
    float *sD = reinterpret_cast<float *>(after + 2 * TL::SCORE + 2 * TL::PTILE + TL::ROWV); /* (BQ) D */
    /* after the loops: fp32 staging of dK and dV over the operand tiles (2 * OTILE <= 4 * OPER) */
    float *sdK = reinterpret_cast<float *>(wm_smem);
    float *sdV = reinterpret_cast<float *>(wm_smem + TL::OTILE);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int ktile = blockIdx.x; /* key tile 0 sees the most queries: start it first (low indices go first) */
    const int g = blockIdx.y, b = blockIdx.z, group = NH / NKV;
    const int k0 = ktile * BN;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const bf16 *kb = head_rows(k, b, Tn, ks, g, HD);
    const bf16 *vb = head_rows(v, b, Tn, ks, g, HD);

    load_tile<HD, BN>(sK, kb, ks, k0, Tn);
    load_tile<HD, BN>(sV, vb, ks, k0, Tn);

    const int r0 = warp * 16;                   /* this warp's keys k0 + r0 .. + 15 */
    const int row = lane >> 1, half = lane & 1; /* this lane pair's key row; query columns 2i + half */
    const int sk = k0 + r0 + row;
    const bool warp_active = k0 + r0 < Tn;
    const float *srow = sS + (r0 + row) * LDS;
    const float *dprow = sDP + (r0 + row) * LDS;
    bf16 *ptrow = sPt + (r0 + row) * LDP;
    bf16 *dsrow = sdS + (r0 + row) * LDP;

    frag_acc dk_acc[HD / 16], dv_acc[HD / 16];
#pragma unroll
    for (int jd = 0; jd < HD / 16; jd++) {
        wmma::fill_fragment(dk_acc[jd], 0.0f);
        wmma::fill_fragment(dv_acc[jd], 0.0f);
    }

    for (int h = g * group; h < (g + 1) * group; h++) {
        const bf16 *qb = head_rows(q, b, Tn, qs, h, HD);
        const bf16 *ob = head_rows(dout, b, Tn, qs, h, HD);
        const float *lse_bh = lse + ((size_t)b * NH + h) * Tn;
        const float *D_bh = Dbuf + ((size_t)b * NH + h) * Tn;
        for (int q0 = (k0 / BQ) * BQ; q0 < Tn; q0 += BQ) {
            __syncthreads(); /* previous sQ, sdO, sL, sD reads are done */
            load_tile<HD, BQ>(sQ, qb, qs, q0, Tn);
            load_tile<HD, BQ>(sdO, ob, qs, q0, Tn);
            for (int r = threadIdx.x; r < BQ; r += WM_THREADS) {
                const int tq = q0 + r;
                sL[r] = tq < Tn ? lse_bh[tq] : 0.0f;
                sD[r] = tq < Tn ? D_bh[tq] : 0.0f;
            }
            __syncthreads();
            /* nothing to add when the warp has no key in range or every query of the tile precedes its keys */
            if (!warp_active || q0 + BQ - 1 < k0 + r0) continue;

            /* S^T = K Q^T and dP~^T = V dO^T for the warp's 16 keys */
            warp_scores<HD>(sS + r0 * LDS, sK + r0 * LDH, sQ);
            warp_scores<HD>(sDP + r0 * LDS, sV + r0 * LDH, sdO);
            __syncwarp();
#pragma unroll 4
            for (int i = 0; i < BQ / 2; i++) {
                const int c = 2 * i + half, tq = q0 + c;
                float pt = 0.0f, ds = 0.0f;
                if (tq < Tn && sk <= tq) {
                    const float p = expf(srow[c] * scale - sL[c]);
                    float d = dprow[c];
                    pt = p;
                    if (dropout > 0.0f) {
                        const bool keep = dev_dropout_keep(rng, wm_drop_index(b, h, tq, sk, NH, Tn), dropout);
                        d = keep ? d * keep_scale : 0.0f;
                        pt = keep ? p * keep_scale : 0.0f;
                    }
                    ds = p * (d - sD[c]) * scale;
                }
                ptrow[c] = __float2bfloat16(pt);
                dsrow[c] = __float2bfloat16(ds);
            }
            __syncwarp();

            /* dV += P~^T dO ; dK += dS^T Q (kk not unrolled: the 2*HD/16 accumulators already take
             * 128 registers at HD 128, and an unrolled kk spilled) */
#pragma unroll 1
            for (int kk = 0; kk < BQ / 16; kk++) {
                frag_a pa, sa;
                wmma::load_matrix_sync(pa, sPt + r0 * LDP + kk * 16, LDP);
                wmma::load_matrix_sync(sa, sdS + r0 * LDP + kk * 16, LDP);
#pragma unroll
                for (int jd = 0; jd < HD / 16; jd++) {
                    frag_b_row ob_f, qb_f;
                    wmma::load_matrix_sync(ob_f, sdO + kk * 16 * LDH + jd * 16, LDH);
                    wmma::mma_sync(dv_acc[jd], pa, ob_f, dv_acc[jd]);
                    wmma::load_matrix_sync(qb_f, sQ + kk * 16 * LDH + jd * 16, LDH);
                    wmma::mma_sync(dk_acc[jd], sa, qb_f, dk_acc[jd]);
                }
            }
            __syncwarp();
        }
    }

    __syncthreads(); /* every warp is done with the operand tiles: they become the staging tiles */
#pragma unroll
    for (int jd = 0; jd < HD / 16; jd++) {
        wmma::store_matrix_sync(sdK + r0 * LDO + jd * 16, dk_acc[jd], LDO, wmma::mem_row_major);
        wmma::store_matrix_sync(sdV + r0 * LDO + jd * 16, dv_acc[jd], LDO, wmma::mem_row_major);
    }
    __syncwarp();
    if (warp_active && sk < Tn) {
        const float *krow = sdK + (r0 + row) * LDO, *vrow = sdV + (r0 + row) * LDO;
        bf16 *dkt = dk + ((size_t)b * Tn + sk) * ks + (size_t)g * HD;
        bf16 *dvt = dv + ((size_t)b * Tn + sk) * ks + (size_t)g * HD;
#pragma unroll 4
        for (int i = 0; i < HD / 2; i++) {
            const int d = 2 * i + half;
            dkt[d] = __float2bfloat16(krow[d]);
            dvt[d] = __float2bfloat16(vrow[d]);
        }
    }
}

/* ---------------------------------------------------------------- host side */

/* -1: follow the environment; 0: the default kernels; 1: this variant; 3: cuDNN; 2: the mma forward and
 * backward (cuda_attention_mma.cu; this variant where it declines) (tests force them) */
int g_forced_variant = -1;
int g_env_variant = -1; /* -1: GTRAIN_CUDA_ATTENTION not read yet */
long g_wmma_calls = 0;

int wmma_selected(void) {
    if (g_forced_variant >= 0) return g_forced_variant;
    if (g_env_variant < 0) {
        const char *e = getenv("GTRAIN_CUDA_ATTENTION");
        g_env_variant = 0;
        if (e && strcmp(e, "wmma") == 0) {
            g_env_variant = 1;
        } else if (e && strcmp(e, "mma") == 0) {
            g_env_variant = 2;
        } else if (e && strcmp(e, "cudnn") == 0) {
            g_env_variant = 3; /* cuda_attention_cudnn.cu */
        } else if (e && *e && strcmp(e, "default") != 0) {
            fprintf(stderr, "gtrain: GTRAIN_CUDA_ATTENTION=%s is not known (wmma, mma, cudnn or default); using the "
                            "default attention kernels\n", e);
        }
    }
    return g_env_variant;
}


/* the shapes and pointers this variant takes: the tensors read with 16-byte loads (q, k, v and, in
 * backward, dout) must be 16-byte aligned; outputs are written element by element */
bool wmma_takes(int HD, const void *q, const void *k, const void *v, const void *dout) {
    if (wmma_selected() != 1 && wmma_selected() != 2) return false; /* 3 (cudnn) falls back to the default */
    if (HD != 32 && HD != 64 && HD != 128) return false;
    return aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout);
}

template <typename K>
void allow_smem_once(K kernel, size_t bytes, int *done) {
    if (*done) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *done = 1;
}

template <int HD>
void forward_hd(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int Tn, int NH, int NKV,
                float dropout, gt_rng_key key) {
    const size_t smem = Tiles<HD>::FWD;
    static int smem_set;
    allow_smem_once(wmma_attention_forward_kernel<HD>, smem, &smem_set);
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    dim3 grid((unsigned)((Tn + WM_ROWS - 1) / WM_ROWS), (unsigned)NH, (unsigned)B);
    wmma_attention_forward_kernel<HD><<<grid, WM_THREADS, smem>>>(out, lse, q, k, v, Tn, NH, NKV, scale, dropout,
                                                                 keep_scale, rng_base(key));
    CUDA_CHECK_LAUNCH();
}

template <int HD>
void backward_hd(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out, const bf16 *q, const bf16 *k,
                 const bf16 *v, const float *lse, int B, int Tn, int NH, int NKV, float dropout, gt_rng_key key) {
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const uint64_t rng = rng_base(key);
    float *Dbuf = (float *)gt_cuda_alloc(sizeof(float) * (size_t)B * NH * Tn); /* (B, NH, T) */
    gt_cuda_attention_rowdot(Dbuf, dout, out, B, Tn, NH, HD, 1);

    const size_t smem_dq = Tiles<HD>::DQ;
    static int dq_set;
    allow_smem_once(wmma_attention_backward_dq_kernel<HD>, smem_dq, &dq_set);
    dim3 grid_dq((unsigned)((Tn + WM_ROWS - 1) / WM_ROWS), (unsigned)NH, (unsigned)B);
    wmma_attention_backward_dq_kernel<HD><<<grid_dq, WM_THREADS, smem_dq>>>(dq, Dbuf, dout, q, k, v, lse, Tn, NH,
                                                                           NKV, scale, dropout, keep_scale, rng);
    CUDA_CHECK_LAUNCH();

    const size_t smem_kv = Tiles<HD>::DKDV;
    static int kv_set;
    allow_smem_once(wmma_attention_backward_dkdv_kernel<HD>, smem_kv, &kv_set);
    dim3 grid_kv((unsigned)((Tn + WM_ROWS - 1) / WM_ROWS), (unsigned)NKV, (unsigned)B);
    wmma_attention_backward_dkdv_kernel<HD><<<grid_kv, WM_THREADS, smem_kv>>>(
        dk, dv, Dbuf, dout, q, k, v, lse, Tn, NH, NKV, scale, dropout, keep_scale, rng);
    CUDA_CHECK_LAUNCH();
    gt_cuda_free(Dbuf); /* stream-ordered: a later user of this block runs after the kernels */
}

} /* namespace */

/* ---------------------------------------------------------------- entry points */

/* Tests: 1 forces this variant (where it applies), 2 the mma one, 3 cuDNN's (cuda_attention_cudnn.cu),
 * 0 forces the default kernels, -1 returns to what GTRAIN_CUDA_ATTENTION says. */
extern "C" void gt_cuda_attention_force_variant(int variant) {
    g_forced_variant = variant < 0 ? -1 : variant > 3 ? 0 : variant;
}

/* 0 default, 1 wmma, 2 mma, 3 cudnn: what GTRAIN_CUDA_ATTENTION (or a test) chose */
int gt_cuda_attention_variant(void) { return wmma_selected(); }

/* Tests: how many attention calls (forward or backward) this variant has taken so far. */
extern "C" long gt_cuda_attention_wmma_calls(void) { return g_wmma_calls; }

/* Called by cuda_attention.cu for the bf16 working type after its shape checks (NH % NKV == 0,
 * B > 0, T > 0); returns 1 when this variant ran the call, 0 to use the default kernels. */
int gt_cuda_attention_wmma_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                   int Tn, int NH, int NKV, int HD, float dropout, gt_rng_key key) {
    if (!wmma_takes(HD, q, k, v, q)) return 0;
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    if (HD == 32) forward_hd<32>(o, lse, qq, kk, vv, B, Tn, NH, NKV, dropout, key);
    else if (HD == 64) forward_hd<64>(o, lse, qq, kk, vv, B, Tn, NH, NKV, dropout, key);
    else forward_hd<128>(o, lse, qq, kk, vv, B, Tn, NH, NKV, dropout, key);
    g_wmma_calls++;
    return 1;
}

int gt_cuda_attention_wmma_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *q,
                                    const void *k, const void *v, const float *lse, int B, int Tn, int NH, int NKV,
                                    int HD, float dropout, gt_rng_key key) {
    if (!wmma_takes(HD, q, k, v, dout)) return 0;
    bf16 *a = (bf16 *)dq, *bk = (bf16 *)dk, *bv = (bf16 *)dv;
    const bf16 *o = (const bf16 *)dout, *ou = (const bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    if (HD == 32) backward_hd<32>(a, bk, bv, o, ou, qq, kk, vv, lse, B, Tn, NH, NKV, dropout, key);
    else if (HD == 64) backward_hd<64>(a, bk, bv, o, ou, qq, kk, vv, lse, B, Tn, NH, NKV, dropout, key);
    else backward_hd<128>(a, bk, bv, o, ou, qq, kk, vv, lse, B, Tn, NH, NKV, dropout, key);
    g_wmma_calls++;
    return 1;
}
