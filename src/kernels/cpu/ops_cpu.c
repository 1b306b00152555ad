/*
 * ops_cpu.c — the CPU backend's two gt_ops tables (fp32 and bf16 working tensors), generated from
 * ops.h's op list, and their memory functions (host memory, 64-byte aligned).
 *
 * The ops live one file per family (ops.h's table): cpu_pointwise.c, cpu_norm.c, cpu_rope.c,
 * cpu_attention.c and cpu_loss.c (each written once, compiled for both tables: cpu_elem.h),
 * cpu_matmul.c (fp32 OpenBLAS, bf16 through cpu_dnnl.c: oneDNN, or widened to sgemm) and cpu_optimizer.c.
 */
#define _GNU_SOURCE /* MAP_POPULATE */
#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu_kernels.h"

void *gt_cpu_xmalloc(size_t bytes, const char *file, int line) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "gtrain cpu kernels: %s:%d: out of memory allocating %zu bytes\n", file, line,
                bytes);
        abort();
    }
    return p;
}

/* ---------------------------------------------------------------- memory */

/* The trainer allocates and frees the same activation sizes every micro-batch. Handing large
 * freed blocks straight back to the system (glibc unmaps anything over its mmap threshold) would
 * make every step pay page faults on fresh memory, so freed blocks wait in a small cache for the
 * next request of exactly the same size. The trainer's byte accounting (memtrack) counts what is
 * requested; the cache only keeps the process from re-faulting it. Single-threaded by contract:
 * the core allocates from one thread. A new block finds the table full only of blocks in use and
 * idle ones of other sizes: the idle one least recently handed out is given back to the system for
 * it. (Without that, a table filled with idle blocks of sizes no longer asked for, as --calibrate's
 * kernel measurements leave it, kept a deep model's micro-batch out: its blocks beyond the table
 * were faulted in afresh at every call, 205 ms against 150 ms for 8 sequences of 6 blocks of dim 256
 * on an Intel Xeon.) The table is searched only as far as it has ever been filled (cache_top), so
 * its size costs nothing until a model holds that many blocks. */
enum { CPU_CACHE_ENTRIES = 4096 };
#define CPU_CACHE_MAX_BYTES ((size_t)2 << 30)

typedef struct cached_block {
    void *ptr;
    size_t bytes;   /* rounded size */
    int in_use;
    int mapped;     /* a large block mapped pre-faulted (below): munmap, not free */
    uint64_t used;  /* when it was last handed out (cache_clock) */
} cached_block;

/* A block this large (the parameters, gradients and optimizer state, the largest activations) is
 * mapped with MAP_POPULATE: the kernel faults its pages in in one call, which takes about a third
 * less CPU time than taking the page faults one by one when the buffer is first written (its zeroing
 * at allocation, or a state file's read): most of a start's allocation time. Its contents are the
 * same zeros either way. A map that fails falls back to aligned_alloc. */
#define CPU_POPULATE_BYTES ((size_t)32 << 20)

static cached_block cache[CPU_CACHE_ENTRIES];
static size_t cache_idle_bytes;
static uint64_t cache_clock;
static int cache_top; /* entries at and beyond it have never held a block */

/* gives entry i's block back to the system and empties the entry */
static void cache_release(int i) {
    if (cache[i].mapped) munmap(cache[i].ptr, cache[i].bytes);
    else free(cache[i].ptr);
    cache[i] = (cached_block){0};
}

static void *cpu_alloc(size_t bytes) {
    /* aligned_alloc wants a size that is a multiple of the alignment */
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    int empty = -1;
    for (int i = 0; i < cache_top; i++) {
        if (cache[i].ptr && !cache[i].in_use && cache[i].bytes == rounded) {
            cache[i].in_use = 1;
            cache[i].used = ++cache_clock;
            cache_idle_bytes -= rounded;
            return cache[i].ptr;
        }
        if (!cache[i].ptr && empty < 0) empty = i;
    }
    if (empty < 0 && cache_top < CPU_CACHE_ENTRIES) empty = cache_top++;
    int oldest_idle = -1; /* a miss on a full table, rare once a step has run: the least recently handed out */
    for (int i = 0; empty < 0 && i < cache_top; i++)
        if (!cache[i].in_use && (oldest_idle < 0 || cache[i].used < cache[oldest_idle].used)) oldest_idle = i;
    if (empty < 0 && oldest_idle >= 0) {
        cache_idle_bytes -= cache[oldest_idle].bytes;
        cache_release(oldest_idle);
        empty = oldest_idle;
    }
    int mapped = 0;
    void *p = NULL;
    if (rounded >= CPU_POPULATE_BYTES && empty >= 0) { /* tracked, so that cpu_free knows to unmap it */
        p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED) p = NULL;
        mapped = p != NULL;
    }
    if (!p) p = aligned_alloc(64, rounded);
    GT_CPU_CHECK(p != NULL, "out of memory allocating %zu bytes", bytes);
    if (empty >= 0) cache[empty] = (cached_block){p, rounded, 1, mapped, ++cache_clock};
    return p;
}

static void cpu_free(void *ptr) {
    if (!ptr) return;
    for (int i = 0; i < cache_top; i++) {
        if (cache[i].ptr != ptr) continue;
        GT_CPU_CHECK(cache[i].in_use, "double free of %p", ptr);
        if (cache_idle_bytes + cache[i].bytes <= CPU_CACHE_MAX_BYTES) {
            cache[i].in_use = 0;
            cache_idle_bytes += cache[i].bytes;
        } else {
            cache_release(i);
        }
        return;
    }
    free(ptr); /* allocated while the table was full */
}

static void cpu_zero(void *ptr, size_t bytes) {
    if (bytes) memset(ptr, 0, bytes);
}

static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memmove(dst, src, bytes);
}

static void cpu_synchronize(void) {}

/* ---------------------------------------------------------------- the tables */

/* The entries of both tables, from ops.h's list: the fp32 table takes gt_cpu_<op> for every op; the
 * bf16 table gt_cpu_<op>_bf16 for a W op (one function per working type) and gt_cpu_<op> for an F op
 * (fp32 tensors only, shared). The kernels can store the (B, NH, T, T) attention probabilities for
 * backward (tests use that path), but the blocked attention rebuilds them from q, k and lse with one
 * product per query block for less than the traffic of storing and reading them: llama100m's
 * no-recompute step took the same CPU seconds either way (docs/cpu-speed.md) and keeps 576 MiB less. */
#define CPU_FP32_ENTRY(kind, op, ret, params, args, shapes) .op = gt_cpu_##op,
#define CPU_BF16_ENTRY(kind, op, ret, params, args, shapes) CPU_BF16_ENTRY_##kind(op)
#define CPU_BF16_ENTRY_W(op) .op = gt_cpu_##op##_bf16,
#define CPU_BF16_ENTRY_F(op) .op = gt_cpu_##op,
#define CPU_MEMORY_ENTRIES                                                                  \
    .name = "cpu", .can_keep_attention_probs = 0,                                           \
    .alloc = cpu_alloc, .free = cpu_free, .zero = cpu_zero, .copy_to_device = cpu_copy,     \
    .copy_to_host = cpu_copy, .copy = cpu_copy, .synchronize = cpu_synchronize

static const gt_ops cpu_ops = {
    CPU_MEMORY_ENTRIES,
    .act_bytes = 4,
    GT_OPS(CPU_FP32_ENTRY)
};

static const gt_ops cpu_bf16_ops = {
    CPU_MEMORY_ENTRIES,
    .act_bytes = 2,
    GT_OPS(CPU_BF16_ENTRY)
};

const gt_ops *gt_ops_cpu(void) { return &cpu_ops; }

const gt_ops *gt_ops_cpu_bf16(void) { return &cpu_bf16_ops; }

int gt_cpu_bf16_native(char *why, size_t why_len) { return gt_dnnl_native(why, why_len); }

const char *gt_cpu_bf16_isa(void) {
    char why[256];
    static char line[320];
    if (gt_dnnl_native(why, sizeof why))
        snprintf(line, sizeof line, "oneDNN on %s", gt_dnnl_isa());
    else
        snprintf(line, sizeof line, "OpenBLAS sgemm, the bf16 operands widened to fp32 (%s)", why);
    return line;
}
