/*
 * cpu_dnnl.c — bf16 matrix products on the CPU through oneDNN (Debian's libdnnl), which runs them on
 * the CPU's bf16 units (AMX tiles, else AVX512-BF16 dot products) with fp32 accumulation.
 *
 * One entry point, gt_dnnl_gemm: C (M, N) [+]= A (M, K) @ B (K, N), A and B bf16 (either may be
 * stored transposed), C fp32 or bf16 (rounded once from the fp32 sum; with accumulate, the old C is
 * added in fp32 before that rounding, oneDNN's sum post-op). Creating a oneDNN primitive costs
 * milliseconds, so each distinct (shape, layout, output type, accumulate) gets one primitive and its
 * three memory objects the first time it is seen and keeps them; a call only swaps the data pointers.
 * A step has a few dozen distinct shapes, so a small table searched linearly is enough.
 *
 * oneDNN here is built on OpenMP and threads each product over its output tiles with
 * omp_get_max_threads() threads, so a run repeats bit for bit at a fixed thread count (the same
 * kernels, the same partition); unlike the fp32 path, a different thread count may choose another
 * partition of K and round differently (docs/precision.md).
 *
 * Without libdnnl (GTRAIN_HAVE_DNNL undefined) only gt_dnnl_available exists and says why.
 */
#include <string.h>

#include "cpu_kernels.h"

#ifndef GTRAIN_HAVE_DNNL

int gt_dnnl_available(char *why, size_t why_len) {
    snprintf(why, why_len, "this gtrain was built without oneDNN (install libdnnl-dev: tools/setup-debian.sh)");
    return 0;
}
const char *gt_dnnl_isa(void) { return "none"; }
void gt_dnnl_gemm(int M, int N, int K, const void *A, int a_trans, const void *B, int b_trans, void *C,
                  int c_f32, int accumulate) {
    (void)M, (void)N, (void)K, (void)A, (void)a_trans, (void)B, (void)b_trans, (void)C, (void)c_f32,
        (void)accumulate;
    GT_CPU_CHECK(0, "bf16 matmul without oneDNN");
}

#else

#include <oneapi/dnnl/dnnl.h>

#define DNNL_OK(call)                                                                       \
    do {                                                                                   \
        dnnl_status_t st_ = (call);                                                        \
        GT_CPU_CHECK(st_ == dnnl_success, "oneDNN call %s failed with status %d", #call, (int)st_); \
    } while (0)

typedef struct gemm_key {
    int M, N, K, a_trans, b_trans, c_f32, accumulate;
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} gemm_entry;

enum { GEMM_CACHE = 128 };
static gemm_entry cache[GEMM_CACHE];
static int cache_used;
static dnnl_engine_t engine;
static dnnl_stream_t stream;

static void init_engine(void) {
    if (engine) return;
    DNNL_OK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    DNNL_OK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
}

/* A 2-D bf16/fp32 descriptor of a (rows, cols) operand stored row-major, or transposed (stored as
 * (cols, rows) row-major) when trans. */
static void desc2(dnnl_memory_desc_t *md, int rows, int cols, int trans, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : cols, trans ? rows : 1};
    DNNL_OK(dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides));
}

static gemm_entry *make_entry(const gemm_key *k) {
    GT_CPU_CHECK(cache_used < GEMM_CACHE, "more than %d distinct bf16 matmul shapes", GEMM_CACHE);
    init_engine();
    gemm_entry *e = &cache[cache_used];
    dnnl_memory_desc_t amd, bmd, cmd;
    desc2(&amd, k->M, k->K, k->a_trans, dnnl_bf16);
    desc2(&bmd, k->K, k->N, k->b_trans, dnnl_bf16);
    desc2(&cmd, k->M, k->N, 0, k->c_f32 ? dnnl_f32 : dnnl_bf16);
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
    cache_used++;
    return e;
}

void gt_dnnl_gemm(int M, int N, int K, const void *A, int a_trans, const void *B, int b_trans, void *C,
                  int c_f32, int accumulate) {
    if (M == 0 || N == 0) return;
    if (K == 0) {   /* an empty sum: C = 0 or C unchanged */
        if (!accumulate) memset(C, 0, (size_t)M * N * (c_f32 ? 4 : 2));
        return;
    }
    gemm_key k = {M, N, K, a_trans, b_trans, c_f32, accumulate};
    gemm_entry *e = NULL;
    for (int i = 0; i < cache_used && !e; i++)
        if (!memcmp(&cache[i].key, &k, sizeof k)) e = &cache[i];
    if (!e) e = make_entry(&k);
    DNNL_OK(dnnl_memory_set_data_handle(e->a, (void *)A));
    DNNL_OK(dnnl_memory_set_data_handle(e->b, (void *)B));
    DNNL_OK(dnnl_memory_set_data_handle(e->c, C));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    DNNL_OK(dnnl_primitive_execute(e->prim, stream, 3, args));
    DNNL_OK(dnnl_stream_wait(stream));
}

const char *gt_dnnl_isa(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), amx = (unsigned)dnnl_cpu_isa_avx512_core_amx,
             bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    if ((isa & amx) == amx) return "avx512_core_amx (AMX-BF16 tiles)";
    if ((isa & bf16) == bf16) return "avx512_core_bf16 (AVX512-BF16)";
    return "no bf16 instructions";
}

/* bf16 needs the instructions: oneDNN would otherwise emulate them at a fraction of fp32's speed. */
int gt_dnnl_available(char *why, size_t why_len) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    if ((isa & bf16) == bf16) return 1;   /* the ISA values are nested bit masks */
    snprintf(why, why_len, "this CPU has no bf16 instructions (oneDNN found neither AMX-BF16 nor AVX512-BF16)");
    return 0;
}

#endif
