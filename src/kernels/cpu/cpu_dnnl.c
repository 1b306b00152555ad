/*
 * cpu_dnnl.c — bf16 matrix products on the CPU: through oneDNN (Debian's libdnnl) on the CPU's bf16
 * units (AMX tiles, else AVX512-BF16 dot products) with fp32 accumulation, or, on a CPU without them
 * (or a gtrain built without oneDNN), widened: the bf16 operands converted to fp32 block by block and
 * multiplied by OpenBLAS sgemm. A bf16 x bf16 product is exact in fp32 (8 + 8 significand bits), so the
 * widened path computes the same thing, bf16 inputs summed in fp32, in another order, at about 3/4 of
 * fp32's speed (the copies; bench/bf16_gemm with DNNL_MAX_CPU_ISA=AVX512_CORE). oneDNN's own
 * emulation below AVX512-BF16 runs at a fraction of that, and below AVX512 it has no bf16 matmul.
 *
 * One entry point, gt_dnnl_gemm_ld: C (M, N) [+]= A (M, K) @ B (K, N), A and B bf16 (either may be
 * stored transposed, any leading dimension), C fp32 or bf16 (rounded once from the fp32 sum; with
 * accumulate, the old C is added in fp32 before that rounding, oneDNN's sum post-op). Creating a
 * oneDNN primitive costs milliseconds, so each distinct (shape, layout, output type, accumulate) gets
 * one primitive and its three memory objects the first time it is seen and keeps them; a call only
 * swaps the data pointers. A step has a few dozen distinct shapes per caller, so a small table searched
 * linearly is enough.
 *
 * Called outside a parallel region (the linear layers), oneDNN threads each product over its output
 * tiles with omp_get_max_threads() threads. Called from inside one (attention: one product per work
 * item), it runs on the calling thread alone; each OpenMP thread then has its own table and stream,
 * since memory objects and streams are not to be shared between threads. Either way a run repeats
 * bit for bit at a fixed thread count (the same kernels, the same partition); unlike the fp32 path, a
 * different thread count may choose another partition of K and round differently (docs/precision.md).
 * The widened path inherits sgemm's behaviour: the same sums at any thread count.
 */
#include <string.h>

#include "cpu_kernels.h"

#include <stdlib.h>

#include <cblas.h>

/* The widened product in blocks of at most WB x WB outputs, so its fp32 copies stay a few MiB whatever
 * the shape: A's rows of a block, B's columns of it, and for a bf16 C the block's fp32 sums. */
enum { WB = 512 };

/* dst (rows, cols) row-major = the (r0.., c0..) block of src as it is stored (row-major, leading
 * dimension ld): contiguous reads and writes; a transposed operand stays transposed, sgemm is told. */
static void widen(float *dst, int rows, int cols, const uint16_t *src, int ld, int r0, int c0) {
    for (int r = 0; r < rows; r++) {
        const uint16_t *s = src + (size_t)(r0 + r) * ld + c0;
        float *d = dst + (size_t)r * cols;
        for (int c = 0; c < cols; c++) d[c] = gt_bf16_to_f32(s[c]);
    }
}

static void widened_gemm(int M, int N, int K, const void *A, int lda, int a_trans, const void *B, int ldb,
                         int b_trans, void *C, int ldc, int c_f32, int accumulate) {
    if (K == 0) {   /* an empty sum: C = 0 or C unchanged */
        for (int i = 0; i < M && !accumulate; i++) memset((char *)C + (size_t)i * ldc * (c_f32 ? 4 : 2), 0,
                                                          (size_t)N * (c_f32 ? 4 : 2));
        return;
    }
    int mb = M < WB ? M : WB, nb = N < WB ? N : WB;
    float *a = malloc(sizeof(float) * (size_t)mb * K), *b = malloc(sizeof(float) * (size_t)K * nb),
          *c = c_f32 ? NULL : malloc(sizeof(float) * (size_t)mb * nb);
    GT_CPU_CHECK(a && b && (c_f32 || c), "out of memory for a %d x %d x %d widened bf16 product", M, N, K);
    for (int i0 = 0; i0 < M; i0 += WB) {
        int m = M - i0 < WB ? M - i0 : WB;
        /* A's rows i0.. : stored (M, K), or (K, M) when transposed */
        if (a_trans) widen(a, K, m, A, lda, 0, i0);
        else widen(a, m, K, A, lda, i0, 0);
        CBLAS_TRANSPOSE ta = a_trans ? CblasTrans : CblasNoTrans;
        int la = a_trans ? m : K;
        for (int j0 = 0; j0 < N; j0 += WB) {
            int n = N - j0 < WB ? N - j0 : WB;
            /* B's columns j0.. : stored (K, N), or (N, K) when transposed */
            if (b_trans) widen(b, n, K, B, ldb, j0, 0);
            else widen(b, K, n, B, ldb, 0, j0);
            CBLAS_TRANSPOSE tb = b_trans ? CblasTrans : CblasNoTrans;
            int lb = b_trans ? K : n;
            if (c_f32) {
                cblas_sgemm(CblasRowMajor, ta, tb, m, n, K, 1.0f, a, la, b, lb,
                            accumulate ? 1.0f : 0.0f, (float *)C + (size_t)i0 * ldc + j0, ldc);
                continue;
            }
            uint16_t *cb = (uint16_t *)C + (size_t)i0 * ldc + j0;
            cblas_sgemm(CblasRowMajor, ta, tb, m, n, K, 1.0f, a, la, b, lb, 0.0f, c, n);
            for (int r = 0; r < m; r++)
                for (int q = 0; q < n; q++) {
                    float v = c[(size_t)r * n + q];
                    if (accumulate) v += gt_bf16_to_f32(cb[(size_t)r * ldc + q]);
                    cb[(size_t)r * ldc + q] = gt_f32_to_bf16(v);
                }
        }
    }
    free(a), free(b), free(c);
}

#ifndef GTRAIN_HAVE_DNNL

int gt_dnnl_native(char *why, size_t why_len) {
    snprintf(why, why_len, "this gtrain was built without oneDNN (install libdnnl-dev: tools/setup-debian.sh)");
    return 0;
}
const char *gt_dnnl_isa(void) { return "none"; }
void gt_dnnl_gemm_ld(int M, int N, int K, const void *A, int lda, int a_trans, const void *B, int ldb, int b_trans,
                     void *C, int ldc, int c_f32, int accumulate) {
    if (M == 0 || N == 0) return;
    widened_gemm(M, N, K, A, lda, a_trans, B, ldb, b_trans, C, ldc, c_f32, accumulate);
}
void gt_dnnl_init(void) {}

#else

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#define DNNL_OK(call)                                                                       \
    do {                                                                                   \
        dnnl_status_t st_ = (call);                                                        \
        GT_CPU_CHECK(st_ == dnnl_success, "oneDNN call %s failed with status %d", #call, (int)st_); \
    } while (0)

typedef struct gemm_key {
    int M, N, K, lda, a_trans, ldb, b_trans, ldc, c_f32, accumulate;
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} gemm_entry;

/* Slot 0: calls from outside a parallel region; slot 1 + t: OpenMP thread t inside one. */
enum { GEMM_CACHE = 256, SLOTS = 65 };
typedef struct slot {
    gemm_entry cache[GEMM_CACHE];
    int used;
    dnnl_stream_t stream;
} slot;
static slot slots[SLOTS];
static dnnl_engine_t engine;
static int native = -1;   /* oneDNN runs on bf16 units: set by gt_dnnl_init */

static int has_bf16_units(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    return (isa & bf16) == bf16;   /* the ISA values are nested bit masks */
}

void gt_dnnl_init(void) {
    if (native < 0) native = has_bf16_units();
    if (native && !engine) DNNL_OK(dnnl_engine_create(&engine, dnnl_cpu, 0));
}

/* A 2-D bf16/fp32 descriptor of a (rows, cols) operand stored row-major with leading dimension ld, or
 * transposed (stored as (cols, rows) row-major, leading dimension ld) when trans. */
static void desc2(dnnl_memory_desc_t *md, int rows, int cols, int ld, int trans, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    DNNL_OK(dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides));
}

static gemm_entry *make_entry(slot *sl, const gemm_key *k) {
    GT_CPU_CHECK(sl->used < GEMM_CACHE, "more than %d distinct bf16 matmul shapes", GEMM_CACHE);
    GT_CPU_CHECK(engine, "gt_dnnl_init was not called before a parallel region");
    if (!sl->stream) DNNL_OK(dnnl_stream_create(&sl->stream, engine, dnnl_stream_default_flags));
    gemm_entry *e = &sl->cache[sl->used];
    dnnl_memory_desc_t amd, bmd, cmd;
    desc2(&amd, k->M, k->K, k->lda, k->a_trans, dnnl_bf16);
    desc2(&bmd, k->K, k->N, k->ldb, k->b_trans, dnnl_bf16);
    desc2(&cmd, k->M, k->N, k->ldc, 0, k->c_f32 ? dnnl_f32 : dnnl_bf16);
    dnnl_matmul_desc_t desc;
    DNNL_OK(dnnl_matmul_desc_init(&desc, &amd, &bmd, NULL, &cmd));
    dnnl_primitive_attr_t attr;
    DNNL_OK(dnnl_primitive_attr_create(&attr));
    if (k->accumulate) {
        dnnl_post_ops_t po;
        DNNL_OK(dnnl_post_ops_create(&po));
        DNNL_OK(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_OK(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    DNNL_OK(dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL));
    dnnl_primitive_attr_destroy(attr);
    DNNL_OK(dnnl_primitive_create(&e->prim, pd));
    dnnl_primitive_desc_destroy(pd);
    DNNL_OK(dnnl_memory_create(&e->a, &amd, engine, DNNL_MEMORY_NONE));
    DNNL_OK(dnnl_memory_create(&e->b, &bmd, engine, DNNL_MEMORY_NONE));
    DNNL_OK(dnnl_memory_create(&e->c, &cmd, engine, DNNL_MEMORY_NONE));
    e->key = *k;
    sl->used++;
    return e;
}

void gt_dnnl_gemm_ld(int M, int N, int K, const void *A, int lda, int a_trans, const void *B, int ldb, int b_trans,
                     void *C, int ldc, int c_f32, int accumulate) {
    if (M == 0 || N == 0) return;
    int s = omp_in_parallel() ? 1 + omp_get_thread_num() : 0;
    if (s == 0) gt_dnnl_init();
    GT_CPU_CHECK(native >= 0, "gt_dnnl_init was not called before a parallel region");
    if (K == 0 || !native) {
        widened_gemm(M, N, K, A, lda, a_trans, B, ldb, b_trans, C, ldc, c_f32, accumulate);
        return;
    }
    GT_CPU_CHECK(s < SLOTS, "more than %d OpenMP threads", SLOTS - 1);
    slot *sl = &slots[s];
    gemm_key k = {M, N, K, lda, a_trans, ldb, b_trans, ldc, c_f32, accumulate};
    gemm_entry *e = NULL;
    for (int i = 0; i < sl->used && !e; i++)
        if (!memcmp(&sl->cache[i].key, &k, sizeof k)) e = &sl->cache[i];
    if (!e) e = make_entry(sl, &k);
    DNNL_OK(dnnl_memory_set_data_handle(e->a, (void *)A));
    DNNL_OK(dnnl_memory_set_data_handle(e->b, (void *)B));
    DNNL_OK(dnnl_memory_set_data_handle(e->c, C));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    DNNL_OK(dnnl_primitive_execute(e->prim, sl->stream, 3, args));
    DNNL_OK(dnnl_stream_wait(sl->stream));
}


const char *gt_dnnl_isa(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), amx = (unsigned)dnnl_cpu_isa_avx512_core_amx;
    if ((isa & amx) == amx) return "avx512_core_amx (AMX-BF16 tiles)";
    return has_bf16_units() ? "avx512_core_bf16 (AVX512-BF16)" : "no bf16 instructions";
}

int gt_dnnl_native(char *why, size_t why_len) {
    if (has_bf16_units()) return 1;
    snprintf(why, why_len, "this CPU has no bf16 instructions (oneDNN found neither AMX-BF16 nor AVX512-BF16)");
    return 0;
}

#endif

void gt_dnnl_gemm(int M, int N, int K, const void *A, int a_trans, const void *B, int b_trans, void *C, int c_f32,
                  int accumulate) {
    gt_dnnl_gemm_ld(M, N, K, A, a_trans ? M : K, a_trans, B, b_trans ? K : N, b_trans, C, N, c_f32, accumulate);
}
