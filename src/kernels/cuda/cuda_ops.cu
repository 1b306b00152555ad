/*
 * cuda_ops.cu — the CUDA backend's entry point (gt_ops_cuda), its ops tables (one for bf16 working
 * tensors, one for fp32) and its memory: a caching allocator, zero, copies, synchronize.
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
 * This file does not launch kernels; the other cuda_*.cu files own the math and fill their entries.
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

/* The sync wrappers: when GTRAIN_CUDA_SYNC=1, every op of the table is replaced by one that records
 * its name and shapes, runs the real op (whose launches each synchronise too), then synchronises
 * and checks, so a fault inside a cuBLASLt call or a kernel is reported by the op that made it:
 *   gtrain: CUDA error: an illegal memory access was encountered, in ..., during matmul_forward N=8192 IC=2048 OC=2048
 * Every op entry (GT_CUDA_OP_ENTRIES below: embedding_forward .. to_master, and take_fault) is wrapped,
 * which fill_table checks; the memory entries (alloc .. synchronize) are not ops: they check their own
 * CUDA calls.
 * Template over the table index (0 fp32, 1 bf16) so both tables can be wrapped at once. */
static gt_ops g_real[2];

static void op_begin(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void op_begin(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_op, sizeof g_op, fmt, ap);
    va_end(ap);
}

static void op_end(void) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) gt_cuda_fail_at(err, "GTRAIN_CUDA_SYNC's check after the op", __FILE__, __LINE__);
    g_op[0] = '\0';
}

#define WRAP(I, call, ...) \
    do {                   \
        op_begin(__VA_ARGS__); \
        g_real[I].call;    \
        op_end();          \
    } while (0)

template <int I>
struct sync_ops {
    static void embedding_forward(void *out, const int32_t *tok, const void *wte, int BT, int C, int V) {
        WRAP(I, embedding_forward(out, tok, wte, BT, C, V), "embedding_forward BT=%d C=%d V=%d", BT, C, V);
    }
    static void embedding_backward(float *dwte, const void *dout, const int32_t *tok, int BT, int C, int V) {
        WRAP(I, embedding_backward(dwte, dout, tok, BT, C, V), "embedding_backward BT=%d C=%d V=%d", BT, C, V);
    }
    static void rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps) {
        WRAP(I, rmsnorm_forward(out, rstd, inp, w, N, C, eps), "rmsnorm_forward N=%d C=%d", N, C);
    }
    static void rmsnorm_apply(void *out, const float *rstd, const void *inp, const void *w, int N, int C) {
        WRAP(I, rmsnorm_apply(out, rstd, inp, w, N, C), "rmsnorm_apply N=%d C=%d", N, C);
    }
    static void rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                                 const float *rstd, int N, int C) {
        WRAP(I, rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C), "rmsnorm_backward N=%d C=%d", N, C);
    }
    static void matmul_forward(void *out, const void *inp, const void *w, int N, int IC, int OC) {
        WRAP(I, matmul_forward(out, inp, w, N, IC, OC), "matmul_forward N=%d IC=%d OC=%d", N, IC, OC);
    }
    static void matmul_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w, int N, int IC,
                                int OC, int acc) {
        WRAP(I, matmul_backward(dinp, dw, dout, inp, w, N, IC, OC, acc), "matmul_backward N=%d IC=%d OC=%d", N, IC, OC);
    }
    static void rope_forward(void *out, const void *inp, const float *rope, int B, int T, int NH, int HD) {
        WRAP(I, rope_forward(out, inp, rope, B, T, NH, HD), "rope_forward B=%d T=%d NH=%d HD=%d", B, T, NH, HD);
    }
    static void rope_backward(void *dinp, const void *dout, const float *rope, int B, int T, int NH, int HD) {
        WRAP(I, rope_backward(dinp, dout, rope, B, T, NH, HD), "rope_backward B=%d T=%d NH=%d HD=%d", B, T, NH, HD);
    }
    static void attention_forward(void *out, float *lse, float *probs, const void *q, const void *k, const void *v,
                                  int B, int T, int NH, int NKV, int HD, float p, gt_rng_key key) {
        WRAP(I, attention_forward(out, lse, probs, q, k, v, B, T, NH, NKV, HD, p, key),
             "attention_forward B=%d T=%d NH=%d NKV=%d HD=%d dropout=%g", B, T, NH, NKV, HD, p);
    }
    static void attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *q,
                                   const void *k, const void *v, const float *lse, const float *probs, int B, int T,
                                   int NH, int NKV, int HD, float p, gt_rng_key key) {
        WRAP(I, attention_backward(dq, dk, dv, dout, out, q, k, v, lse, probs, B, T, NH, NKV, HD, p, key),
             "attention_backward B=%d T=%d NH=%d NKV=%d HD=%d dropout=%g", B, T, NH, NKV, HD, p);
    }
    static void swiglu_forward(void *out, const void *g, const void *u, size_t n) {
        WRAP(I, swiglu_forward(out, g, u, n), "swiglu_forward n=%zu", n);
    }
    static void swiglu_backward(void *dg, void *du, const void *dout, const void *g, const void *u, size_t n) {
        WRAP(I, swiglu_backward(dg, du, dout, g, u, n), "swiglu_backward n=%zu", n);
    }
    static void residual_forward(void *out, const void *res, const void *br, size_t n, float p, gt_rng_key key) {
        WRAP(I, residual_forward(out, res, br, n, p, key), "residual_forward n=%zu dropout=%g", n, p);
    }
    static void dropout_backward(void *db, const void *dout, size_t n, float p, gt_rng_key key) {
        WRAP(I, dropout_backward(db, dout, n, p, key), "dropout_backward n=%zu dropout=%g", n, p);
    }
    static void crossentropy_forward(float *losses, float *lse, const void *logits, const int32_t *tg, int BT, int V) {
        WRAP(I, crossentropy_forward(losses, lse, logits, tg, BT, V), "crossentropy_forward BT=%d V=%d", BT, V);
    }
    static void crossentropy_backward(void *logits, const float *lse, const int32_t *tg, int BT, int V, float dl) {
        WRAP(I, crossentropy_backward(logits, lse, tg, BT, V, dl), "crossentropy_backward BT=%d V=%d", BT, V);
    }
    static double sumsq(const float *x, size_t n) {
        op_begin("sumsq n=%zu", n);
        double r = g_real[I].sumsq(x, n);
        op_end();
        return r;
    }
    static void scale(float *x, size_t n, float s) { WRAP(I, scale(x, n, s), "scale n=%zu", n); }
    static void adamw(float *p, float *m, float *v, const float *g, size_t n, float lr, float b1, float b2, float eps,
                      float wd, int t) {
        WRAP(I, adamw(p, m, v, g, n, lr, b1, b2, eps, wd, t), "adamw n=%zu t=%d", n, t);
    }
    static void to_working(void *w, const float *m, size_t n) { WRAP(I, to_working(w, m, n), "to_working n=%zu", n); }
    static void to_master(float *m, const void *w, size_t n) { WRAP(I, to_master(m, w, n), "to_master n=%zu", n); }
    static int take_fault(char *msg, size_t msg_len) {
        op_begin("take_fault");
        const int r = g_real[I].take_fault(msg, msg_len);
        op_end();
        return r;
    }

    static void install(gt_ops *ops) {
        g_real[I] = *ops;
        ops->embedding_forward = embedding_forward;
        ops->embedding_backward = embedding_backward;
        ops->rmsnorm_forward = rmsnorm_forward;
        ops->rmsnorm_apply = rmsnorm_apply;
        ops->rmsnorm_backward = rmsnorm_backward;
        ops->matmul_forward = matmul_forward;
        ops->matmul_backward = matmul_backward;
        ops->rope_forward = rope_forward;
        ops->rope_backward = rope_backward;
        ops->attention_forward = attention_forward;
        ops->attention_backward = attention_backward;
        ops->swiglu_forward = swiglu_forward;
        ops->swiglu_backward = swiglu_backward;
        ops->residual_forward = residual_forward;
        ops->dropout_backward = dropout_backward;
        ops->crossentropy_forward = crossentropy_forward;
        ops->crossentropy_backward = crossentropy_backward;
        ops->sumsq = sumsq;
        ops->scale = scale;
        ops->adamw = adamw;
        ops->to_working = to_working;
        ops->to_master = to_master;
        ops->take_fault = take_fault;
    }
};
#undef WRAP

/* ---------------------------------------------------------------- the tables */

static gt_ops g_table[2]; /* [0] fp32 working tensors, [1] bf16 */

/* the op entries of the table (everything but the memory entries): each must be set, and each has a
 * GTRAIN_CUDA_SYNC wrapper in sync_ops */
#define GT_CUDA_OP_ENTRIES(X)                                                                        \
    X(embedding_forward) X(embedding_backward) X(rmsnorm_forward) X(rmsnorm_apply) X(rmsnorm_backward) \
    X(matmul_forward) X(matmul_backward) X(rope_forward) X(rope_backward) X(attention_forward)         \
    X(attention_backward) X(swiglu_forward) X(swiglu_backward) X(residual_forward) X(dropout_backward)  \
    X(crossentropy_forward) X(crossentropy_backward) X(sumsq) X(scale) X(adamw) X(to_working)           \
    X(to_master) X(take_fault)
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
    ops->host_alloc = cuda_host_alloc;
    ops->host_free = cuda_host_free;
    ops->reserved_bytes = cuda_reserved_bytes;
    ops->release_cached = release_cache;
    gt_cuda_fill_matmul(ops, use_bf16);
    gt_cuda_fill_attention(ops, use_bf16);
    gt_cuda_fill_kernels(ops, use_bf16);
    gt_cuda_fill_optim(ops, use_bf16);

    /* every entry must be set: a missing one is a bug here, not a NULL call later */
#define REQUIRE_SET(field) \
    if (!ops->field) GT_CUDA_FAIL("CUDA ops table entry %s is not set", #field);
    GT_CUDA_OP_ENTRIES(REQUIRE_SET)
#undef REQUIRE_SET
    if (gt_cuda_sync_enabled()) {
        const gt_ops real = *ops;
        if (use_bf16) sync_ops<1>::install(ops);
        else sync_ops<0>::install(ops);
        /* and, with GTRAIN_CUDA_SYNC=1, wrapped: an op added to the table without a wrapper would run
         * unchecked and unnamed */
#define REQUIRE_WRAPPED(field) \
    if (ops->field == real.field) GT_CUDA_FAIL("CUDA ops table entry %s has no GTRAIN_CUDA_SYNC wrapper", #field);
        GT_CUDA_OP_ENTRIES(REQUIRE_WRAPPED)
#undef REQUIRE_WRAPPED
    }
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
