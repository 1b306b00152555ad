/*
 * cuda_attention.cu — the attention family of ops.h on the GPU: causal grouped-query attention
 * (gt_cuda_attention_forward, gt_cuda_attention_backward, each <float> and <bf16>): the default
 * kernels, flash style (the (T, T) scores never exist in device memory), fp32 arithmetic on CUDA
 * cores, deterministic; and the choice of an opt-in variant (train.cuda_attention;
 * cuda_attention.cuh says how the variants meet).
 *
 * Forward, one block of 256 threads per (query tile, head, batch): key tiles up to the diagonal with
 * an online softmax (running max m and sum l, the output rescaled by expf(m_old - m_new)); dropout
 * (ops.h's index) multiplies the probability that enters the output by keep/(1-p); lse = m + logf(l)
 * is kept for backward. Backward recomputes p = expf(s - lse) tile by tile, without atomics: D_t =
 * dout_t . out_t from the forward output (attention_rowdot_kernel, shared with the mma variant); a dq
 * kernel per query tile; a dk/dv kernel per (key tile, kv head) that loops over the group's query
 * heads and the query tiles from the diagonal on, so every output element has one owning thread
 * summing in a fixed order. Tiles sit in shared memory in fp32, rows padded to HDM + 1 floats (the
 * column-strided reads hit 16 banks); a thread of the 16 x 16 grid owns rows ty + 16 i and columns
 * tx + 16 j, so a score row lives in one half-warp and its max and sum are xor-shuffles over 16 lanes.
 * HDM (16, 32, 64, 128) is HD rounded up, a template argument so the accumulators stay in registers.
 * Document masking (doc non-NULL, ops.h): query t sees keys doc[t] .. t; the forward and dq kernels
 * start at the key tile that holds doc[q0] (the tile's first row's document start: doc never
 * decreases, so every earlier key tile is masked for the whole query tile and is skipped), and the
 * dk/dv kernel stops at the first query tile whose first row starts its document after the key tile.
 */
#include <math.h>

#include <string.h>

#include "cuda_attention.cuh"

#define ATTN_THREADS 256

/* forward tiles: 64 queries x 32 keys; backward tiles: 32 x 32 (more accumulators per thread) */
#define FWD_BM 64
#define FWD_BN 32
#define BWD_BM 32
#define BWD_BN 32

/* rows [row0, row0 + R) of a (T, stride) view, columns [0, HD), into s (R x LD) as fp32; rows past T
 * and columns past HD (up to LD - 1) are zero */
template <typename T>
__device__ __forceinline__ void load_rows(float *s, const T *base, size_t stride, int row0, int Tn, int R,
                                          int HD, int HDM, int LD) {
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    for (int r = ty; r < R; r += 16) {
        int t = row0 + r;
        const T *src = base + (size_t)t * stride;
        for (int d = tx; d < HDM; d += 16) s[r * LD + d] = (t < Tn && d < HD) ? load_f(src + d) : 0.0f;
    }
}

/* s[i][j] = A[ty+16i] . B[tx+16j] over d < HD, for two products at once (a2/b2 may be unused) */
template <int RM, int RN, bool TWO>
__device__ __forceinline__ void tile_dots(float (&s)[RM][RN], float (&s2)[RM][RN], const float *A, const float *B,
                                          const float *A2, const float *B2, int HD, int LD) {
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
        for (int j = 0; j < RN; j++) {
            s[i][j] = 0.0f;
            s2[i][j] = 0.0f;
        }
    for (int d = 0; d < HD; d++) {
        float a[RM], b[RN];
#pragma unroll
        for (int i = 0; i < RM; i++) a[i] = A[(ty + 16 * i) * LD + d];
#pragma unroll
        for (int j = 0; j < RN; j++) b[j] = B[(tx + 16 * j) * LD + d];
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < RN; j++) s[i][j] += a[i] * b[j];
        if (TWO) {
#pragma unroll
            for (int i = 0; i < RM; i++) a[i] = A2[(ty + 16 * i) * LD + d];
#pragma unroll
            for (int j = 0; j < RN; j++) b[j] = B2[(tx + 16 * j) * LD + d];
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int j = 0; j < RN; j++) s2[i][j] += a[i] * b[j];
        }
    }
}

__device__ __forceinline__ float half_warp_max(float v) {
    for (int m = 8; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}
__device__ __forceinline__ float half_warp_sum(float v) {
    for (int m = 8; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

/* ---------------------------------------------------------------- forward */

template <typename T, int BM, int BN, int HDM>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_forward_kernel(T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc, int Tn, int NH,
                         int NKV, int HD, float scale, float dropout, float keep_scale, uint64_t rng) {
    constexpr int RM = BM / 16, RN = BN / 16, DJ = HDM / 16, LD = HDM + 1, LP = BN + 1;
    extern __shared__ float smem[];
    float *sQ = smem;          /* (BM, LD) */
    float *sK = sQ + BM * LD;  /* (BN, LD) */
    float *sV = sK + BN * LD;  /* (BN, LD) */
    float *sP = sV + BN * LD;  /* (BM, LP) probabilities after dropout */
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int qtile = gridDim.x - 1 - blockIdx.x; /* longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const int q0 = qtile * BM;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const T *qb = q + (size_t)b * Tn * qs + (size_t)h * HD;
    const T *kb = k + (size_t)b * Tn * ks + (size_t)g * HD;
    const T *vb = v + (size_t)b * Tn * ks + (size_t)g * HD;

    load_rows(sQ, qb, qs, q0, Tn, BM, HD, HDM, LD);
    float m[RM], l[RM], o[RM][DJ];
    int first[RM]; /* the first key each row sees */
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int t = q0 + ty + 16 * i;
        first[i] = doc && t < Tn ? doc[(size_t)b * Tn + t] : 0;
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int jd = 0; jd < DJ; jd++) o[i][jd] = 0.0f;
    }
    const int last = min(q0 + BM, Tn) - 1; /* last query row of the tile; causal: keys <= last */
    const int kfirst = doc ? doc[(size_t)b * Tn + q0] / BN * BN : 0; /* earlier key tiles: all masked */
    for (int k0 = kfirst; k0 <= last; k0 += BN) {
        __syncthreads(); /* the previous tile's sK, sV, sP are no longer read */
        load_rows(sK, kb, ks, k0, Tn, BN, HD, HDM, LD);
        load_rows(sV, vb, ks, k0, Tn, BN, HD, HDM, LD);
        __syncthreads();
        float s[RM][RN], unused[RM][RN];
        tile_dots<RM, RN, false>(s, unused, sQ, sK, nullptr, nullptr, HD, LD);
#pragma unroll
        for (int i = 0; i < RM; i++) {
            const int t = q0 + ty + 16 * i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < RN; j++) {
                const int sk = k0 + tx + 16 * j;
                s[i][j] = (t < Tn && sk <= t && sk >= first[i]) ? s[i][j] * scale : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            mx = half_warp_max(mx);
            const float m_new = fmaxf(m[i], mx);
            /* m_new == -inf: no valid key yet (only rows past T); keep everything at zero */
            const float corr = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
            float row_sum = 0.0f;
#pragma unroll
            for (int j = 0; j < RN; j++) {
                const int sk = k0 + tx + 16 * j;
                float p = s[i][j] == -INFINITY ? 0.0f : expf(s[i][j] - m_new);
                row_sum += p;
                if (dropout > 0.0f && p != 0.0f)
                    p = gt_dropout_keep_at(rng, gt_attention_drop_index(b, h, t, sk, NH, Tn), dropout) ? p * keep_scale : 0.0f;
                sP[(ty + 16 * i) * LP + tx + 16 * j] = p;
            }
            row_sum = half_warp_sum(row_sum);
            l[i] = l[i] * corr + row_sum;
            m[i] = m_new;
#pragma unroll
            for (int jd = 0; jd < DJ; jd++) o[i][jd] *= corr;
        }
        __syncthreads();
        for (int c = 0; c < BN; c++) {
            float vv[DJ];
#pragma unroll
            for (int jd = 0; jd < DJ; jd++) vv[jd] = sV[c * LD + tx + 16 * jd];
#pragma unroll
            for (int i = 0; i < RM; i++) {
                const float p = sP[(ty + 16 * i) * LP + c];
#pragma unroll
                for (int jd = 0; jd < DJ; jd++) o[i][jd] += p * vv[jd];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int t = q0 + ty + 16 * i;
        if (t >= Tn) continue;
        if (tx == 0) lse[((size_t)b * NH + h) * Tn + t] = m[i] + logf(l[i]);
        const float inv = 1.0f / l[i];
        T *ot = out + ((size_t)b * Tn + t) * qs + (size_t)h * HD;
#pragma unroll
        for (int jd = 0; jd < DJ; jd++) {
            const int d = tx + 16 * jd;
            if (d < HD) store_f(ot + d, o[i][jd] * inv);
        }
    }
}

/* ---------------------------------------------------------------- backward: D from the output */

/* D (B, NH, T) fp32: D[(b*NH + h)*T + t] = dout_t . out_t over HD, rows of (B, T, NH, HD). One warp per
 * (b, t, h) row, lanes strided over HD, one xor-butterfly sum: fixed order, the same bits every run. */
template <typename T>
__global__ void attention_rowdot_kernel(float *D, const T *dout, const T *out, int Tn, int NH, int HD, size_t rows) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T *a = dout + row * HD, *o = out + row * HD;
    float acc = 0.0f;
    for (int d = lane; d < HD; d += 32) acc += load_f(a + d) * load_f(o + d);
    acc = warp_sum(acc);
    if (lane == 0) {
        /* row = (b*T + t)*NH + h -> (b*NH + h)*T + t */
        const size_t h = row % (size_t)NH, bt = row / (size_t)NH, t = bt % (size_t)Tn, b = bt / (size_t)Tn;
        D[(b * NH + h) * Tn + t] = acc;
    }
}

void gt_cuda_attention_rowdot(float *D, const void *dout, const void *out, int B, int Tn, int NH, int HD, int bf16_io) {
    const size_t rows = (size_t)B * Tn * NH;
    if (rows == 0) return;
    const int warps = 8;
    const unsigned blocks = (unsigned)((rows + warps - 1) / warps);
    if (bf16_io)
        attention_rowdot_kernel<bf16><<<blocks, 32 * warps>>>(D, (const bf16 *)dout, (const bf16 *)out, Tn, NH, HD, rows);
    else
        attention_rowdot_kernel<float><<<blocks, 32 * warps>>>(D, (const float *)dout, (const float *)out, Tn, NH, HD, rows);
    CUDA_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- backward: dq */

template <typename T, int BM, int BN, int HDM>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_backward_dq_kernel(T *dq, const float *Dbuf, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                             const int32_t *doc, int Tn, int NH, int NKV, int HD, float scale, float dropout,
                             float keep_scale, uint64_t rng) {
    constexpr int RM = BM / 16, RN = BN / 16, DJ = HDM / 16, LD = HDM + 1, LP = BN + 1;
    extern __shared__ float smem[];
    float *sQ = smem;           /* (BM, LD) */
    float *sO = sQ + BM * LD;   /* (BM, LD) dout rows */
    float *sK = sO + BM * LD;   /* (BN, LD) */
    float *sV = sK + BN * LD;   /* (BN, LD) */
    float *sS = sV + BN * LD;   /* (BM, LP) ds */
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int qtile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const int q0 = qtile * BM;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const T *qb = q + (size_t)b * Tn * qs + (size_t)h * HD;
    const T *ob = dout + (size_t)b * Tn * qs + (size_t)h * HD;
    const T *kb = k + (size_t)b * Tn * ks + (size_t)g * HD;
    const T *vb = v + (size_t)b * Tn * ks + (size_t)g * HD;
    const float *lse_bh = lse + ((size_t)b * NH + h) * Tn;

    load_rows(sQ, qb, qs, q0, Tn, BM, HD, HDM, LD);
    load_rows(sO, ob, qs, q0, Tn, BM, HD, HDM, LD);
    float row_lse[RM], Dt[RM];
    int first[RM]; /* the first key each row sees */
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int t = q0 + ty + 16 * i;
        first[i] = doc && t < Tn ? doc[(size_t)b * Tn + t] : 0;
        row_lse[i] = t < Tn ? lse_bh[t] : 0.0f;
        Dt[i] = t < Tn ? Dbuf[((size_t)b * NH + h) * Tn + t] : 0.0f;
    }
    const int last = min(q0 + BM, Tn) - 1;

    /* dq_t = sum_s ds k_s */
    float acc[RM][DJ];
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
        for (int jd = 0; jd < DJ; jd++) acc[i][jd] = 0.0f;
    const int kfirst = doc ? doc[(size_t)b * Tn + q0] / BN * BN : 0; /* earlier key tiles: all masked */
    for (int k0 = kfirst; k0 <= last; k0 += BN) {
        __syncthreads();
        load_rows(sK, kb, ks, k0, Tn, BN, HD, HDM, LD);
        load_rows(sV, vb, ks, k0, Tn, BN, HD, HDM, LD);
        __syncthreads();
        float s[RM][RN], dp[RM][RN];
        tile_dots<RM, RN, true>(s, dp, sQ, sK, sO, sV, HD, LD);
#pragma unroll
        for (int i = 0; i < RM; i++) {
            const int t = q0 + ty + 16 * i;
#pragma unroll
            for (int j = 0; j < RN; j++) {
                const int sk = k0 + tx + 16 * j;
                float ds = 0.0f;
                if (t < Tn && sk <= t && sk >= first[i]) {
                    const float p = expf(s[i][j] * scale - row_lse[i]);
                    float d = dp[i][j];
                    if (dropout > 0.0f)
                        d = gt_dropout_keep_at(rng, gt_attention_drop_index(b, h, t, sk, NH, Tn), dropout) ? d * keep_scale : 0.0f;
                    ds = p * (d - Dt[i]) * scale;
                }
                sS[(ty + 16 * i) * LP + tx + 16 * j] = ds;
            }
        }
        __syncthreads();
        for (int c = 0; c < BN; c++) {
            float kv[DJ];
#pragma unroll
            for (int jd = 0; jd < DJ; jd++) kv[jd] = sK[c * LD + tx + 16 * jd];
#pragma unroll
            for (int i = 0; i < RM; i++) {
                const float ds = sS[(ty + 16 * i) * LP + c];
#pragma unroll
                for (int jd = 0; jd < DJ; jd++) acc[i][jd] += ds * kv[jd];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int t = q0 + ty + 16 * i;
        if (t >= Tn) continue;
        T *dqt = dq + ((size_t)b * Tn + t) * qs + (size_t)h * HD;
#pragma unroll
        for (int jd = 0; jd < DJ; jd++) {
            const int d = tx + 16 * jd;
            if (d < HD) store_f(dqt + d, acc[i][jd]);
        }
    }
}

/* ---------------------------------------------------------------- backward: dk and dv */

template <typename T, int BM, int BN, int HDM>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_backward_dkdv_kernel(T *dk, T *dv, const float *Dbuf, const T *dout, const T *q, const T *k, const T *v,
                               const float *lse, const int32_t *doc, int Tn, int NH, int NKV, int HD, float scale,
                               float dropout, float keep_scale, uint64_t rng) {
    constexpr int RM = BM / 16, RN = BN / 16, RK = BN / 16, DJ = HDM / 16, LD = HDM + 1, LP = BN + 1;
    extern __shared__ float smem[];
    float *sK = smem;              /* (BN, LD) this block's keys */
    float *sV = sK + BN * LD;      /* (BN, LD) */
    float *sQ = sV + BN * LD;      /* (BM, LD) the current query tile */
    float *sO = sQ + BM * LD;      /* (BM, LD) its dout rows */
    float *sP = sO + BM * LD;      /* (BM, LP) p~ (after dropout) */
    float *sS = sP + BM * LP;      /* (BM, LP) ds */
    float *sL = sS + BM * LP;      /* (BM) lse */
    float *sD = sL + BM;           /* (BM) D */
    int *sF = (int *)(sD + BM);    /* (BM) the first key of each query row (document masking) */
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int ktile = gridDim.x - 1 - blockIdx.x; /* key tile 0 sees the most queries: start the long ones first */
    const int g = blockIdx.y, b = blockIdx.z, group = NH / NKV;
    const int k0 = ktile * BN;
    const size_t qs = (size_t)NH * HD, ks = (size_t)NKV * HD;
    const T *kb = k + (size_t)b * Tn * ks + (size_t)g * HD;
    const T *vb = v + (size_t)b * Tn * ks + (size_t)g * HD;

    load_rows(sK, kb, ks, k0, Tn, BN, HD, HDM, LD);
    load_rows(sV, vb, ks, k0, Tn, BN, HD, HDM, LD);
    /* thread owns keys ty + 16 i and dims tx + 16 jd */
    float dk_acc[RK][DJ], dv_acc[RK][DJ];
#pragma unroll
    for (int i = 0; i < RK; i++)
#pragma unroll
        for (int jd = 0; jd < DJ; jd++) {
            dk_acc[i][jd] = 0.0f;
            dv_acc[i][jd] = 0.0f;
        }

    for (int h = g * group; h < (g + 1) * group; h++) {
        const T *qb = q + (size_t)b * Tn * qs + (size_t)h * HD;
        const T *ob = dout + (size_t)b * Tn * qs + (size_t)h * HD;
        const float *lse_bh = lse + ((size_t)b * NH + h) * Tn;
        const float *D_bh = Dbuf + ((size_t)b * NH + h) * Tn;
        for (int q0 = (k0 / BM) * BM; q0 < Tn; q0 += BM) {
            /* this query tile and every later one start their documents after the key tile: all masked
             * (the same for every thread of the block, so no thread skips a barrier the others reach) */
            if (doc && doc[(size_t)b * Tn + q0] >= k0 + BN) break;
            __syncthreads(); /* previous sQ, sO, sP, sS, sL, sD reads are done */
            load_rows(sQ, qb, qs, q0, Tn, BM, HD, HDM, LD);
            load_rows(sO, ob, qs, q0, Tn, BM, HD, HDM, LD);
            for (int r = threadIdx.x; r < BM; r += ATTN_THREADS) {
                const int t = q0 + r;
                sL[r] = t < Tn ? lse_bh[t] : 0.0f;
                sD[r] = t < Tn ? D_bh[t] : 0.0f;
                sF[r] = doc && t < Tn ? doc[(size_t)b * Tn + t] : 0;
            }
            __syncthreads();
            float s[RM][RN], dp[RM][RN];
            tile_dots<RM, RN, true>(s, dp, sQ, sK, sO, sV, HD, LD);
#pragma unroll
            for (int i = 0; i < RM; i++) {
                const int r = ty + 16 * i, t = q0 + r;
#pragma unroll
                for (int j = 0; j < RN; j++) {
                    const int c = tx + 16 * j, sk = k0 + c;
                    float pt = 0.0f, ds = 0.0f;
                    if (t < Tn && sk <= t && sk >= sF[r]) {
                        const float p = expf(s[i][j] * scale - sL[r]);
                        float d = dp[i][j];
                        pt = p;
                        if (dropout > 0.0f) {
                            const bool keep = gt_dropout_keep_at(rng, gt_attention_drop_index(b, h, t, sk, NH, Tn), dropout);
                            d = keep ? d * keep_scale : 0.0f;
                            pt = keep ? p * keep_scale : 0.0f;
                        }
                        ds = p * (d - sD[r]) * scale;
                    }
                    sP[r * LP + c] = pt;
                    sS[r * LP + c] = ds;
                }
            }
            __syncthreads();
            for (int r = 0; r < BM; r++) {
                float qv[DJ], ov[DJ];
#pragma unroll
                for (int jd = 0; jd < DJ; jd++) {
                    qv[jd] = sQ[r * LD + tx + 16 * jd];
                    ov[jd] = sO[r * LD + tx + 16 * jd];
                }
#pragma unroll
                for (int i = 0; i < RK; i++) {
                    const float pt = sP[r * LP + ty + 16 * i], ds = sS[r * LP + ty + 16 * i];
#pragma unroll
                    for (int jd = 0; jd < DJ; jd++) {
                        dv_acc[i][jd] += pt * ov[jd];
                        dk_acc[i][jd] += ds * qv[jd];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RK; i++) {
        const int sk = k0 + ty + 16 * i;
        if (sk >= Tn) continue;
        T *dkt = dk + ((size_t)b * Tn + sk) * ks + (size_t)g * HD;
        T *dvt = dv + ((size_t)b * Tn + sk) * ks + (size_t)g * HD;
#pragma unroll
        for (int jd = 0; jd < DJ; jd++) {
            const int d = tx + 16 * jd;
            if (d < HD) {
                store_f(dkt + d, dk_acc[i][jd]);
                store_f(dvt + d, dv_acc[i][jd]);
            }
        }
    }
}

/* ---------------------------------------------------------------- launchers */

/* a kernel needing more than 48 KiB of dynamic shared memory must say so once */
template <typename K>
static void allow_smem(K kernel, size_t bytes, int *done) {
    if (*done) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *done = 1;
}

static void check_shapes(int NH, int NKV, int HD) {
    if (NKV <= 0 || NH % NKV != 0) GT_CUDA_FAIL("attention: NH=%d is not a multiple of NKV=%d", NH, NKV);
    if (HD <= 0 || HD > 128) GT_CUDA_FAIL("attention: head dim %d not supported (1..128)", HD);
}

template <typename T, int HDM>
static void forward_hd(T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc, int B, int Tn, int NH,
                       int NKV, int HD, float dropout, gt_rng_key key) {
    constexpr int BM = FWD_BM, BN = FWD_BN, LD = HDM + 1;
    const size_t smem = sizeof(float) * ((size_t)(BM + 2 * BN) * LD + (size_t)BM * (BN + 1));
    static int smem_set;
    allow_smem(attention_forward_kernel<T, BM, BN, HDM>, smem, &smem_set);
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    dim3 grid((unsigned)((Tn + BM - 1) / BM), (unsigned)NH, (unsigned)B);
    attention_forward_kernel<T, BM, BN, HDM><<<grid, ATTN_THREADS, smem>>>(out, lse, q, k, v, doc, Tn, NH, NKV, HD, scale,
                                                                          dropout, keep_scale, gt_rng_base(key));
    CUDA_CHECK_LAUNCH();
}

template <typename T, int HDM>
static void backward_hd(T *dq, T *dk, T *dv, const T *dout, const T *out, const T *q, const T *k, const T *v,
                        const float *lse, const int32_t *doc, int B, int Tn, int NH, int NKV, int HD, float dropout,
                        gt_rng_key key) {
    constexpr int BM = BWD_BM, BN = BWD_BN, LD = HDM + 1, LP = BN + 1;
    const float scale = 1.0f / sqrtf((float)HD);
    const float keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;
    const uint64_t rng = gt_rng_base(key);
    float *Dbuf = (float *)gt_cuda_alloc(sizeof(float) * (size_t)B * NH * Tn); /* (B, NH, T) */
    gt_cuda_attention_rowdot(Dbuf, dout, out, B, Tn, NH, HD, sizeof(T) == sizeof(bf16));

    const size_t smem_dq = sizeof(float) * ((size_t)(2 * BM + 2 * BN) * LD + (size_t)BM * LP);
    static int dq_set;
    allow_smem(attention_backward_dq_kernel<T, BM, BN, HDM>, smem_dq, &dq_set);
    dim3 grid_dq((unsigned)((Tn + BM - 1) / BM), (unsigned)NH, (unsigned)B);
    attention_backward_dq_kernel<T, BM, BN, HDM><<<grid_dq, ATTN_THREADS, smem_dq>>>(
        dq, Dbuf, dout, q, k, v, lse, doc, Tn, NH, NKV, HD, scale, dropout, keep_scale, rng);
    CUDA_CHECK_LAUNCH();

    const size_t smem_kv = sizeof(float) * ((size_t)(2 * BN + 2 * BM) * LD + (size_t)2 * BM * LP + (size_t)3 * BM);
    static int kv_set;
    allow_smem(attention_backward_dkdv_kernel<T, BM, BN, HDM>, smem_kv, &kv_set);
    dim3 grid_kv((unsigned)((Tn + BN - 1) / BN), (unsigned)NKV, (unsigned)B);
    attention_backward_dkdv_kernel<T, BM, BN, HDM><<<grid_kv, ATTN_THREADS, smem_kv>>>(
        dk, dv, Dbuf, dout, q, k, v, lse, doc, Tn, NH, NKV, HD, scale, dropout, keep_scale, rng);
    CUDA_CHECK_LAUNCH();
    gt_cuda_free(Dbuf); /* stream-ordered: a later user of this block runs after the kernel */
}

/* ---------------------------------------------------------------- the variant */

/* the variant gt_ops_cuda was given; -1: no variant forced by a test */
static gt_cuda_attention g_selected = GT_CUDA_ATTENTION_DEFAULT;
static int g_forced_variant = -1;

static int variant_named(const char *name) {
    if (strcmp(name, "default") == 0) return GT_CUDA_ATTENTION_DEFAULT;
    if (strcmp(name, "mma") == 0) return GT_CUDA_ATTENTION_MMA;
    if (strcmp(name, "cudnn") == 0) return GT_CUDA_ATTENTION_CUDNN;
    return -1;
}

void gt_cuda_attention_select(gt_cuda_attention attention) { g_selected = attention; }

gt_cuda_attention gt_cuda_attention_variant(void) {
    return g_forced_variant >= 0 ? (gt_cuda_attention)g_forced_variant : g_selected;
}

extern "C" void gt_cuda_attention_force_variant(const char *name) {
    if (!name) {
        g_forced_variant = -1;
        return;
    }
    g_forced_variant = variant_named(name);
    if (g_forced_variant < 0) GT_CUDA_FAIL("attention variant \"%s\" is not known (default, mma, cudnn)", name);
}

/* the bf16 working type only: 1 when the chosen opt-in variant ran the call */
static int variant_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int Tn, int NH,
                           int NKV, int HD, float dropout, gt_rng_key key) {
    switch (gt_cuda_attention_variant()) {
    case GT_CUDA_ATTENTION_MMA: return gt_cuda_attention_mma_forward(out, lse, q, k, v, B, Tn, NH, NKV, HD, dropout, key);
    case GT_CUDA_ATTENTION_CUDNN: return gt_cuda_attention_cudnn_forward(out, lse, q, k, v, B, Tn, NH, NKV, HD, dropout);
    default: return 0;
    }
}

static int variant_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *q,
                            const void *k, const void *v, const float *lse, int B, int Tn, int NH, int NKV, int HD,
                            float dropout, gt_rng_key key) {
    switch (gt_cuda_attention_variant()) {
    case GT_CUDA_ATTENTION_MMA:
        return gt_cuda_attention_mma_backward(dq, dk, dv, dout, out, q, k, v, lse, B, Tn, NH, NKV, HD, dropout, key);
    case GT_CUDA_ATTENTION_CUDNN:
        return gt_cuda_attention_cudnn_backward(dq, dk, dv, dout, out, q, k, v, lse, B, Tn, NH, NKV, HD, dropout);
    default: return 0;
    }
}

/* ---------------------------------------------------------------- the table's entries */

/* the opt-in variants have no document masking: the config refuses the combination (exit 2) before a
 * kernel runs, so reaching this is a caller's bug */
static void check_doc_variant(const int32_t *doc) {
    if (doc && gt_cuda_attention_variant() != GT_CUDA_ATTENTION_DEFAULT)
        GT_CUDA_FAIL("document masking runs on train.cuda_attention = default only");
}

template <typename T>
void gt_cuda_attention_forward(void *out, float *lse, float *probs, const void *q, const void *k, const void *v,
                              const int32_t *doc, int B, int Tn, int NH, int NKV, int HD, float dropout, gt_rng_key key) {
    check_shapes(NH, NKV, HD);
    if (probs) GT_CUDA_FAIL("the CUDA attention never stores probabilities (can_keep_attention_probs = 0)");
    check_doc_variant(doc);
    if (B <= 0 || Tn <= 0) return;
    if (sizeof(T) == sizeof(bf16) && variant_forward(out, lse, q, k, v, B, Tn, NH, NKV, HD, dropout, key)) return;
    T *o = (T *)out;
    const T *qq = (const T *)q, *kk = (const T *)k, *vv = (const T *)v;
    if (HD <= 16) forward_hd<T, 16>(o, lse, qq, kk, vv, doc, B, Tn, NH, NKV, HD, dropout, key);
    else if (HD <= 32) forward_hd<T, 32>(o, lse, qq, kk, vv, doc, B, Tn, NH, NKV, HD, dropout, key);
    else if (HD <= 64) forward_hd<T, 64>(o, lse, qq, kk, vv, doc, B, Tn, NH, NKV, HD, dropout, key);
    else forward_hd<T, 128>(o, lse, qq, kk, vv, doc, B, Tn, NH, NKV, HD, dropout, key);
}

/* probs is ignored: the probabilities are always recomputed from q, k and lse */
template <typename T>
void gt_cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *q,
                               const void *k, const void *v, const float *lse, const float *probs,
                               const int32_t *doc, int B, int Tn, int NH, int NKV, int HD, float dropout,
                               gt_rng_key key) {
    (void)probs;
    check_shapes(NH, NKV, HD);
    check_doc_variant(doc);
    if (B <= 0 || Tn <= 0) return;
    if (sizeof(T) == sizeof(bf16) &&
        variant_backward(dq, dk, dv, dout, out, q, k, v, lse, B, Tn, NH, NKV, HD, dropout, key))
        return;
    T *a = (T *)dq, *bk = (T *)dk, *bv = (T *)dv;
    const T *o = (const T *)dout, *ou = (const T *)out, *qq = (const T *)q, *kk = (const T *)k, *vv = (const T *)v;
    if (HD <= 16) backward_hd<T, 16>(a, bk, bv, o, ou, qq, kk, vv, lse, doc, B, Tn, NH, NKV, HD, dropout, key);
    else if (HD <= 32) backward_hd<T, 32>(a, bk, bv, o, ou, qq, kk, vv, lse, doc, B, Tn, NH, NKV, HD, dropout, key);
    else if (HD <= 64) backward_hd<T, 64>(a, bk, bv, o, ou, qq, kk, vv, lse, doc, B, Tn, NH, NKV, HD, dropout, key);
    else backward_hd<T, 128>(a, bk, bv, o, ou, qq, kk, vv, lse, doc, B, Tn, NH, NKV, HD, dropout, key);
}

GT_OPS_ATTENTION(GT_CUDA_INSTANTIATE)
