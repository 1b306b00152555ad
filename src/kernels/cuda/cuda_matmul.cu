/*
 * cuda_matmul.cu — the matmul family of ops.h on the GPU: the linear layers (gt_cuda_matmul_forward,
 * gt_cuda_matmul_backward, each <float> and <bf16>) on cuBLASLt.
 *
 * Layouts. The interface is row-major: out (N, OC) = inp (N, IC) @ W^T with W (OC, IC). cuBLASLt is
 * column-major, and a row-major (R, C) matrix is the same bytes as a column-major (C, R) one, so each
 * product is computed transposed (m, n, k in column-major terms):
 *   forward   out^T (OC x N)  = op_T(W: IC x OC, ld IC)  @ inp^T (IC x N, ld IC)      m=OC n=N  k=IC
 *   dinp      dinp^T (IC x N) = W (IC x OC, ld IC)       @ dout^T (OC x N, ld OC)     m=IC n=N  k=OC
 *   dweight   dW^T (IC x OC)  = inp^T (IC x N, ld IC)    @ op_T(dout^T: OC x N, ld OC) m=IC n=OC k=N
 *
 * Types. bf16 mode: A/B bf16, fp32 accumulation (CUBLAS_COMPUTE_32F); activations (out, dinp) come
 * out in bf16, weight gradients go to fp32 C = D with beta = 1 (cuBLASLt supports bf16 A/B with fp32
 * C/D). fp32 mode: everything fp32 with CUBLAS_COMPUTE_32F, which never uses TF32, so fp32 mode can be
 * compared tightly with the CPU backend.
 *
 * Determinism. cuBLASLt gives the same bits for the same problem, algorithm, workspace and GPU. Each
 * distinct problem (shape, types, transposes, pointer alignment) gets one plan: descriptors plus the
 * heuristic's first algorithm, cached, so the same call always runs the same algorithm — and so a
 * recomputed forward equals the one kept. Split-K reductions are restricted to the compute type (fp32),
 * never in place in a bf16 output. Pointer alignment enters the heuristic capped at 16 bytes, so a
 * tensor at a 256- or a 16-byte-aligned address (e.g. a view into a flat buffer) gets the same plan.
 * One workspace of GT_CUDA_MATMUL_WORKSPACE_BYTES (ops.h: 32 MiB, which the planner counts), allocated
 * on first use, on the default stream with everything else.
 */
#include <cublasLt.h>
#include <string.h>

#include "cuda_common.cuh"

#define CUBLAS_CHECK(call)                                                                       \
    do {                                                                                         \
        cublasStatus_t cublas_check_st_ = (call);                                                \
        if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS)                                           \
            GT_CUDA_FAIL("cuBLASLt error in %s: %s (status %d)%s%s", #call,                       \
                         cublasLtGetStatusString(cublas_check_st_), (int)cublas_check_st_,               \
                         gt_cuda_current_op()[0] ? ", during " : "", gt_cuda_current_op());           \
    } while (0)

#define PLAN_SLOTS 256

typedef struct plan_key {
    int32_t ab_type, cd_type;     /* cudaDataType */
    int32_t op_a, op_b;           /* cublasOperation_t */
    int64_t m, n, k, lda, ldb, ldd;
    int32_t align_a, align_b, align_d; /* bytes, capped at 16 */
    int32_t pad;
} plan_key;

typedef struct plan {
    plan_key key;
    int used;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} plan;

static cublasLtHandle_t g_lt;
static void *g_workspace;
static plan g_plans[PLAN_SLOTS];
static int g_plan_next; /* round-robin eviction once every slot is used */

static void ensure_lt(void) {
    if (g_lt) return;
    CUBLAS_CHECK(cublasLtCreate(&g_lt));
    CUDA_CHECK(cudaMalloc(&g_workspace, GT_CUDA_MATMUL_WORKSPACE_BYTES)); /* once, outside the caching allocator */
}

static int32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int32_t al = 16;
    while (al > 1 && (a % (uintptr_t)al) != 0) al >>= 1;
    return al;
}

static void destroy_plan(plan *p) {
    if (!p->used) return;
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->d));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
    p->used = 0;
}

static const plan *get_plan(const plan_key *key) {
    for (int i = 0; i < PLAN_SLOTS; i++)
        if (g_plans[i].used && memcmp(&g_plans[i].key, key, sizeof *key) == 0) return &g_plans[i];

    plan *p = &g_plans[g_plan_next];
    g_plan_next = (g_plan_next + 1) % PLAN_SLOTS;
    destroy_plan(p);
    p->key = *key;

    cublasOperation_t op_a = (cublasOperation_t)key->op_a, op_b = (cublasOperation_t)key->op_b;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));

    /* stored shapes: A is m x k (op N) or k x m (op T); B is k x n (op N) or n x k (op T) */
    uint64_t a_rows = op_a == CUBLAS_OP_N ? key->m : key->k, a_cols = op_a == CUBLAS_OP_N ? key->k : key->m;
    uint64_t b_rows = op_b == CUBLAS_OP_N ? key->k : key->n, b_cols = op_b == CUBLAS_OP_N ? key->n : key->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, (cudaDataType)key->ab_type, a_rows, a_cols, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, (cudaDataType)key->ab_type, b_rows, b_cols, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, (cudaDataType)key->cd_type, key->m, key->n, key->ldd));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = GT_CUDA_MATMUL_WORKSPACE_BYTES;
    uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    uint32_t al_a = (uint32_t)key->align_a, al_b = (uint32_t)key->align_b, al_d = (uint32_t)key->align_d;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                      sizeof reduction));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));

    cublasLtMatmulHeuristicResult_t result;
    int returned = 0;
    memset(&result, 0, sizeof result);
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &returned);
    if (st != CUBLAS_STATUS_SUCCESS || returned < 1) {
        /* no algorithm under the reduction-scheme filter: lift it (still deterministic, just a split-K
         * reduction that may run in the output type) */
        uint32_t any = CUBLASLT_REDUCTION_SCHEME_MASK;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &any,
                                                          sizeof any));
        returned = 0;
        CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &returned));
    }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (returned < 1)
        GT_CUDA_FAIL("cuBLASLt has no algorithm for m=%lld n=%lld k=%lld (types %d/%d)", (long long)key->m,
                     (long long)key->n, (long long)key->k, key->ab_type, key->cd_type);
    p->algo = result.algo;
    p->used = 1;
    return p;
}

/* D (m x n, column-major, ld ldd) = op_a(A) @ op_b(B) + beta * D */
static void lt_matmul(cudaDataType ab_type, cudaDataType cd_type, cublasOperation_t op_a, cublasOperation_t op_b,
                      int m, int n, int k, const void *A, int lda, const void *B, int ldb, void *D, int ldd,
                      float beta) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* empty sum: D = beta * D; only beta 0 and 1 occur here */
        if (beta == 0.0f) {
            size_t elem = cd_type == CUDA_R_32F ? 4 : 2;
            if (ldd != m) GT_CUDA_FAIL("strided empty matmul not supported");
            CUDA_CHECK(cudaMemsetAsync(D, 0, (size_t)m * (size_t)n * elem, 0));
        }
        return;
    }
    ensure_lt();
    plan_key key;
    memset(&key, 0, sizeof key);
    key.ab_type = ab_type;
    key.cd_type = cd_type;
    key.op_a = op_a;
    key.op_b = op_b;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldd = ldd;
    key.align_a = ptr_align(A);
    key.align_b = ptr_align(B);
    key.align_d = ptr_align(D);
    const plan *p = get_plan(&key);
    const float alpha = 1.0f;
    cublasStatus_t st = cublasLtMatmul(g_lt, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d, &p->algo,
                                       g_workspace, GT_CUDA_MATMUL_WORKSPACE_BYTES, 0);
    if (st != CUBLAS_STATUS_SUCCESS)
        GT_CUDA_FAIL("cublasLtMatmul failed: %s (status %d), m=%d n=%d k=%d lda=%d ldb=%d ldd=%d op_a=%c op_b=%c%s%s",
                     cublasLtGetStatusString(st), (int)st, m, n, k, lda, ldb, ldd, op_a == CUBLAS_OP_T ? 'T' : 'N',
                     op_b == CUBLAS_OP_T ? 'T' : 'N', gt_cuda_current_op()[0] ? ", during " : "", gt_cuda_current_op());
    CUDA_CHECK_LAUNCH(); /* with GTRAIN_CUDA_SYNC=1: synchronise after the library call too */
}

/* the cuBLASLt type of the working type T: bf16 A/B in bf16 mode, fp32 otherwise */
template <typename T>
static constexpr cudaDataType lt_type() { return sizeof(T) == sizeof(bf16) ? CUDA_R_16BF : CUDA_R_32F; }

template <typename T>
void gt_cuda_matmul_forward(void *out, const void *inp, const void *weight, int N, int IC, int OC) {
    /* out^T (OC x N) = op_T(W) @ inp^T, see the header comment */
    lt_matmul(lt_type<T>(), lt_type<T>(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, weight, IC, inp, IC, out, OC, 0.0f);
}

template <typename T>
void gt_cuda_matmul_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight, int N,
                             int IC, int OC, int accumulate_dinp) {
    if (dinp)
        lt_matmul(lt_type<T>(), lt_type<T>(), CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, weight, IC, dout, OC, dinp, IC,
                  accumulate_dinp ? 1.0f : 0.0f);
    if (dweight)
        lt_matmul(lt_type<T>(), CUDA_R_32F, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, IC, dout, OC, dweight, IC, 1.0f);
}

GT_OPS_MATMUL(GT_CUDA_INSTANTIATE)
