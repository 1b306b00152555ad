/*
 * cuda_ops.cu — the CUDA backend's entry point (gt_ops_cuda), its ops tables (one for bf16 working
 * tensors, one for fp32, generated from ops.h's op list), its memory (a caching allocator, zero,
 * copies, synchronize), the fault flag behind take_fault, and GTRAIN_CUDA_SYNC's wrappers.
 *
 * The allocator. The trainer allocates and frees the same activation sizes every micro-batch, and
 * cudaMalloc/cudaFree synchronise the device and cost tens of microseconds, so freed blocks are kept
 * on free lists keyed by a rounded size ("size class") and handed out again; cudaFree is called only
 * when a cudaMalloc fails, to give the cache back before retrying (never on the hot path). Size
 * classes: 512-byte granularity below 16 KiB, above it 32 steps per power of two (at most ~3% of a
 * block wasted). Every block comes from cudaMalloc (256-byte aligned; never managed memory). The cache
 * is also given back on request (release_cached of the table: the core asks after freeing the fp32
 * staging copy of the parameters, 27 GB at 7B, which nothing would reuse). All work
 * is on the legacy default stream, so a block freed here and reused by the next alloc is only touched
 * by kernels ordered after every kernel that used it before.
 *
 * Bookkeeping is host-side and single-threaded (the trainer calls the table from one thread): a
 * chained hash of live blocks (pointer -> size class) and a chained hash of size classes, each with a
 * stack of free blocks. Nodes move between the two, so a warm cache allocates no host memory either.
 *
 * This file does not launch kernels; the other cuda_*.cu files own the math, one file per family of
 * ops.h.
 */
#include <stdarg.h>
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

/* cudaFree every cached (not live) block: the out-of-memory path, and release_cached of the table */
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

static void *cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) == cudaSuccess) return p;
    (void)cudaGetLastError(); /* a refused pinning is not a sticky error: the caller takes malloc */
    return NULL;
}

static void cuda_host_free(void *ptr) {
    if (ptr) CUDA_CHECK(cudaFreeHost(ptr));
}

static int cuda_memory_available(size_t *free_bytes, size_t *total_bytes) {
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? 0 : -1;
}

static size_t cuda_reserved_bytes(void) { return g_bytes_reserved; }

/* ---------------------------------------------------------------- faults, GTRAIN_CUDA_SYNC */

static int g_sync = -1;      /* GTRAIN_CUDA_SYNC, read once */
static char g_op[384] = "";  /* the op running under the sync wrappers, with its shapes */

int gt_cuda_sync_enabled(void) {
    if (g_sync < 0) {
        const char *e = getenv("GTRAIN_CUDA_SYNC");
        g_sync = e && *e && strcmp(e, "0") != 0;
    }
    return g_sync;
}

const char *gt_cuda_current_op(void) { return g_op; }

void gt_cuda_fail_at(cudaError_t err, const char *what, const char *file, int line) {
    fprintf(stderr, "gtrain: CUDA error: %s, in %s at %s:%d", cudaGetErrorString(err), what, file, line);
    if (g_op[0]) fprintf(stderr, ", during %s", g_op);
    else if (!gt_cuda_sync_enabled())
        fprintf(stderr, " (kernels run asynchronously, so the fault may belong to an earlier op: run with "
                        "GTRAIN_CUDA_SYNC=1 to have it reported by the op that made it)");
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

void gt_cuda_check_launch_at(const char *file, int line) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess && gt_cuda_sync_enabled()) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) gt_cuda_fail_at(err, "a kernel launched", file, line);
}

/* ---------------------------------------------------------------- the fault flag */

static int *g_fault; /* int[5] in device memory: cuda_common.cuh says what it holds */

int *gt_cuda_fault_flag(void) {
    if (!g_fault) {
        /* once, outside the caching allocator (its figures are the run's own buffers) */
        CUDA_CHECK(cudaMalloc(&g_fault, 5 * sizeof(int)));
        CUDA_CHECK(cudaMemset(g_fault, 0, 5 * sizeof(int)));
    }
    return g_fault;
}

static int take_fault(char *msg, size_t msg_len) {
    if (!g_fault) return 0; /* no kernel that checks token ids has run yet */
    int f[5];
    CUDA_CHECK(cudaMemcpy(f, g_fault, sizeof f, cudaMemcpyDeviceToHost)); /* waits for the kernels before it */
    if (!f[0]) return 0;
    CUDA_CHECK(cudaMemset(g_fault, 0, sizeof f));
    if (msg && msg_len)
        snprintf(msg, msg_len, "%s %d is outside [model] vocab_size = %d (position %d of a micro-batch, found on the GPU)",
                 f[4] == 0 ? "token id" : "target token id", f[2], f[3], f[1]);
    return 1;
}

/* ---------------------------------------------------------------- GTRAIN_CUDA_SYNC's wrappers */

/* When GTRAIN_CUDA_SYNC=1, every op of the table (ops.h's list) and take_fault is replaced by a
 * wrapper that records its name and shapes, runs the real op (whose launches each synchronise too),
 * then synchronises and checks, so a fault inside a cuBLASLt call or a kernel is reported by the op
 * that made it:
 *   gtrain: CUDA error: an illegal memory access was encountered, in ..., during matmul_forward N=8192 IC=2048 OC=2048
 * The wrappers sync_ops<I>::<op> are generated from the list (the shapes of each entry), so no op
 * runs unwrapped; fill_table checks it. The memory entries (alloc .. synchronize) are not ops: they
 * check their own CUDA calls. Template over the table index (0 fp32, 1 bf16) so both tables can be
 * wrapped at once. */
static gt_ops g_real[2];

static void op_begin(const char *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void op_begin(const char *op, const char *fmt, ...) {
    char shapes[sizeof g_op];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(shapes, sizeof shapes, fmt, ap);
    va_end(ap);
    snprintf(g_op, sizeof g_op, "%s%s%s", op, shapes[0] ? " " : "", shapes);
}

static void op_end(void) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) gt_cuda_fail_at(err, "GTRAIN_CUDA_SYNC's check after the op", __FILE__, __LINE__);
    g_op[0] = '\0';
}

/* op_end when the wrapper returns, after the real op's result is in hand */
struct op_scope {
    ~op_scope() { op_end(); }
};

template <int I>
struct sync_ops {
#define SYNC_WRAPPER(kind, op, ret, params, args, shapes)  \
    static ret op params {                                  \
        op_begin(#op, GT_OPS_UNPAREN shapes);               \
        const op_scope scope;                               \
        return g_real[I].op args;                           \
    }
    GT_OPS(SYNC_WRAPPER)
#undef SYNC_WRAPPER
    static int take_fault(char *msg, size_t msg_len) {
        op_begin("take_fault", "%s", "");
        const op_scope scope;
        return g_real[I].take_fault(msg, msg_len);
    }
    static void install(gt_ops *ops) {
        g_real[I] = *ops;
#define SYNC_INSTALL(kind, op, ret, params, args, shapes) ops->op = op;
        GT_OPS(SYNC_INSTALL)
#undef SYNC_INSTALL
        ops->take_fault = take_fault;
    }
};

/* ---------------------------------------------------------------- the tables */

static gt_ops g_table[2]; /* [0] fp32 working tensors, [1] bf16 */
static int g_table_ready[2];

/* The ops from ops.h's list: gt_cuda_<op><T> for a W entry (T the working type), gt_cuda_<op> for
 * an F entry; their files are ops.h's families. */
#define TABLE_ENTRY(kind, op, ret, params, args, shapes) TABLE_ENTRY_##kind(op)
#define TABLE_ENTRY_W(op) ops->op = use_bf16 ? gt_cuda_##op<bf16> : gt_cuda_##op<float>;
#define TABLE_ENTRY_F(op) ops->op = gt_cuda_##op;

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
    ops->host_alloc = cuda_host_alloc;
    ops->host_free = cuda_host_free;
    ops->reserved_bytes = cuda_reserved_bytes;
    ops->release_cached = release_cache;
    GT_OPS(TABLE_ENTRY)
    ops->take_fault = take_fault;

    /* every op must be set: a missing one is a bug here, not a NULL call later */
#define REQUIRE_SET(kind, op, ret, params, args, shapes) \
    if (!ops->op) GT_CUDA_FAIL("CUDA ops table entry %s is not set", #op);
    GT_OPS(REQUIRE_SET)
#undef REQUIRE_SET
    if (gt_cuda_sync_enabled()) {
        if (use_bf16) sync_ops<1>::install(ops);
        else sync_ops<0>::install(ops);
    }
}

extern "C" const gt_ops *gt_ops_cuda(int use_bf16, gt_cuda_attention attention, char *why, size_t why_len) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        if (why && why_len)
            snprintf(why, why_len, "no CUDA device is visible (%s)",
                     err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
        (void)cudaGetLastError();
        return NULL;
    }
    gt_cuda_attention_select(attention);
    int idx = use_bf16 ? 1 : 0;
    if (!g_table_ready[idx]) {
        fill_table(&g_table[idx], idx);
        g_table_ready[idx] = 1;
    }
    return &g_table[idx];
}
