/*
 * cuda_ops.cu — the CUDA backend's entry point (gt_ops_cuda), its ops tables (one for bf16 working
 * tensors, one for fp32) and its memory: a caching allocator, zero, copies, synchronize.
 *
 * The allocator. The trainer allocates and frees the same activation sizes every micro-batch, and
 * cudaMalloc/cudaFree synchronise the device and cost tens of microseconds, so freed blocks are kept
 * on free lists keyed by a rounded size ("size class") and handed out again; cudaFree is called only
 * when a cudaMalloc fails, to give the cache back before retrying (never on the hot path). Size
 * classes: 512-byte granularity below 16 KiB, above it 32 steps per power of two (at most ~3% of a
 * block wasted). Every block comes from cudaMalloc (256-byte aligned; never managed memory). All work
 * is on the legacy default stream, so a block freed here and reused by the next alloc is only touched
 * by kernels ordered after every kernel that used it before.
 *
 * Bookkeeping is host-side and single-threaded (the trainer calls the table from one thread): a
 * chained hash of live blocks (pointer -> size class) and a chained hash of size classes, each with a
 * stack of free blocks. Nodes move between the two, so a warm cache allocates no host memory either.
 *
 * This file does not launch kernels; the other cuda_*.cu files own the math and fill their entries.
 */
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

/* ---------------------------------------------------------------- caching allocator */

typedef struct cached_block {
    void *ptr;
    size_t bytes; /* the size class, what cudaMalloc was asked for */
    struct cached_block *next;
} cached_block;

typedef struct size_class {
    size_t bytes;
    cached_block *free_blocks;
    struct size_class *next;
} size_class;

#define LIVE_BUCKETS 8192
#define CLASS_BUCKETS 1024

static cached_block *g_live[LIVE_BUCKETS];
static size_class *g_classes[CLASS_BUCKETS];
static size_t g_bytes_reserved; /* held from cudaMalloc, live or cached */
static size_t g_bytes_live;

static size_t round_to_class(size_t bytes) {
    if (bytes == 0) bytes = 1;
    size_t granule = 512;
    if (bytes > 16384) {
        size_t top = (size_t)1 << (63 - __builtin_clzll((unsigned long long)bytes));
        granule = top / 32;
    }
    return (bytes + granule - 1) / granule * granule;
}

static size_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p >> 8; /* cudaMalloc blocks are 256-byte aligned */
    return (size_t)(gt_mix64(x) & (LIVE_BUCKETS - 1));
}

static size_class *find_class(size_t bytes, int create) {
    size_t h = (size_t)(gt_mix64(bytes) & (CLASS_BUCKETS - 1));
    for (size_class *c = g_classes[h]; c; c = c->next)
        if (c->bytes == bytes) return c;
    if (!create) return NULL;
    size_class *c = (size_class *)calloc(1, sizeof *c);
    if (!c) GT_CUDA_FAIL("out of host memory");
    c->bytes = bytes;
    c->next = g_classes[h];
    g_classes[h] = c;
    return c;
}

/* cudaFree every cached (not live) block: the out-of-memory path only */
static void release_cache(void) {
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int h = 0; h < CLASS_BUCKETS; h++)
        for (size_class *c = g_classes[h]; c; c = c->next)
            while (c->free_blocks) {
                cached_block *b = c->free_blocks;
                c->free_blocks = b->next;
                CUDA_CHECK(cudaFree(b->ptr));
                g_bytes_reserved -= b->bytes;
                free(b);
            }
}

void *gt_cuda_alloc(size_t bytes) {
    size_t cls = round_to_class(bytes);
    size_class *c = find_class(cls, 1);
    cached_block *b = c->free_blocks;
    if (b) {
        c->free_blocks = b->next;
    } else {
        void *ptr = NULL;
        cudaError_t err = cudaMalloc(&ptr, cls);
        if (err != cudaSuccess) {
            (void)cudaGetLastError(); /* out of memory is not sticky; clear it and retry once */
            release_cache();
            err = cudaMalloc(&ptr, cls);
        }
        if (err != cudaSuccess) {
            size_t free_b = 0, total_b = 0;
            (void)cudaGetLastError();
            (void)cudaMemGetInfo(&free_b, &total_b);
            GT_CUDA_FAIL("cudaMalloc of %zu bytes failed (%s); gtrain holds %zu bytes (%zu live), "
                         "device has %zu of %zu bytes free",
                         cls, cudaGetErrorString(err), g_bytes_reserved, g_bytes_live, free_b, total_b);
        }
        b = (cached_block *)malloc(sizeof *b);
        if (!b) GT_CUDA_FAIL("out of host memory");
        b->ptr = ptr;
        b->bytes = cls;
        g_bytes_reserved += cls;
    }
    size_t h = hash_ptr(b->ptr);
    b->next = g_live[h];
    g_live[h] = b;
    g_bytes_live += b->bytes;
    return b->ptr;
}

void gt_cuda_free(void *ptr) {
    if (!ptr) return;
    size_t h = hash_ptr(ptr);
    cached_block **link = &g_live[h];
    while (*link && (*link)->ptr != ptr) link = &(*link)->next;
    cached_block *b = *link;
    if (!b) GT_CUDA_FAIL("free of a pointer the CUDA allocator did not hand out (%p)", ptr);
    *link = b->next;
    g_bytes_live -= b->bytes;
    size_class *c = find_class(b->bytes, 0);
    if (!c) GT_CUDA_FAIL("allocator size class lost for %zu bytes", b->bytes);
    b->next = c->free_blocks;
    c->free_blocks = b;
}

/* ---------------------------------------------------------------- memory entries of the table */

static void cuda_zero(void *ptr, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, 0));
}

static void cuda_copy_to_device(void *dst, const void *host_src, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
}

static void cuda_copy_to_host(void *host_dst, const void *src, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
}

static void cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

static void cuda_synchronize(void) { CUDA_CHECK(cudaDeviceSynchronize()); }

static int cuda_memory_available(size_t *free_bytes, size_t *total_bytes) {
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? 0 : -1;
}

/* ---------------------------------------------------------------- the tables */

static gt_ops g_table[2]; /* [0] fp32 working tensors, [1] bf16 */
static int g_table_ready[2];

static void fill_table(gt_ops *ops, int use_bf16) {
    memset(ops, 0, sizeof *ops);
    ops->name = "cuda";
    ops->act_bytes = use_bf16 ? 2 : 4;
    ops->can_keep_attention_probs = 0; /* flash-style: backward recomputes from q, k, lse */
    ops->alloc = gt_cuda_alloc;
    ops->free = gt_cuda_free;
    ops->zero = cuda_zero;
    ops->copy_to_device = cuda_copy_to_device;
    ops->copy_to_host = cuda_copy_to_host;
    ops->copy = cuda_copy;
    ops->synchronize = cuda_synchronize;
    ops->memory_available = cuda_memory_available;
    gt_cuda_fill_matmul(ops, use_bf16);
    gt_cuda_fill_attention(ops, use_bf16);
    gt_cuda_fill_kernels(ops, use_bf16);
    gt_cuda_fill_optim(ops, use_bf16);

    /* every entry must be set: a missing one is a bug here, not a NULL call later */
#define REQUIRE_SET(field) \
    if (!ops->field) GT_CUDA_FAIL("CUDA ops table entry %s is not set", #field)
    REQUIRE_SET(embedding_forward);
    REQUIRE_SET(embedding_backward);
    REQUIRE_SET(rmsnorm_forward);
    REQUIRE_SET(rmsnorm_apply);
    REQUIRE_SET(rmsnorm_backward);
    REQUIRE_SET(matmul_forward);
    REQUIRE_SET(matmul_backward);
    REQUIRE_SET(rope_forward);
    REQUIRE_SET(rope_backward);
    REQUIRE_SET(attention_forward);
    REQUIRE_SET(attention_backward);
    REQUIRE_SET(swiglu_forward);
    REQUIRE_SET(swiglu_backward);
    REQUIRE_SET(residual_forward);
    REQUIRE_SET(dropout_backward);
    REQUIRE_SET(crossentropy_forward);
    REQUIRE_SET(crossentropy_backward);
    REQUIRE_SET(sumsq);
    REQUIRE_SET(scale);
    REQUIRE_SET(adamw);
    REQUIRE_SET(to_working);
    REQUIRE_SET(to_master);
#undef REQUIRE_SET
}

extern "C" const gt_ops *gt_ops_cuda(int use_bf16, char *why, size_t why_len) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        if (why && why_len)
            snprintf(why, why_len, "no CUDA device is visible (%s)",
                     err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
        (void)cudaGetLastError();
        return NULL;
    }
    int idx = use_bf16 ? 1 : 0;
    if (!g_table_ready[idx]) {
        fill_table(&g_table[idx], idx);
        g_table_ready[idx] = 1;
    }
    return &g_table[idx];
}
