/*
 * memtrack.c — the byte counters behind act_peak_bytes and mem_peak_bytes (see memtrack.h).
 * The backend does the allocating; this file only counts.
 */
#include "memtrack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gt_mem_init(gt_mem *mem, const gt_ops *ops) {
    memset(mem, 0, sizeof *mem);
    mem->ops = ops;
}

void *gt_mem_alloc(gt_mem *mem, gt_mem_kind kind, size_t bytes) {
    void *ptr = mem->ops->alloc(bytes ? bytes : 1);
    mem->cur[kind] += bytes;
    if (mem->cur[kind] > mem->peak[kind]) mem->peak[kind] = mem->cur[kind];
    mem->total_cur += bytes;
    if (mem->total_cur > mem->total_peak) mem->total_peak = mem->total_cur;
    return ptr;
}

void gt_mem_free(gt_mem *mem, gt_mem_kind kind, void *ptr, size_t bytes) {
    if (!ptr) return;
    if (mem->cur[kind] < bytes) {
        fprintf(stderr, "%s:%d: freeing %zu %s bytes but only %llu are held\n", __FILE__, __LINE__, bytes,
                gt_mem_kind_name(kind), (unsigned long long)mem->cur[kind]);
        abort();
    }
    mem->ops->free(ptr);
    mem->cur[kind] -= bytes;
    mem->total_cur -= bytes;
}

void gt_mem_reset_peaks(gt_mem *mem) {
    for (int k = 0; k < GT_MEM_KINDS; k++) mem->peak[k] = mem->cur[k];
    mem->total_peak = mem->total_cur;
}

const char *gt_mem_kind_name(gt_mem_kind kind) {
    static const char *names[GT_MEM_KINDS] = {"params", "grads", "optim", "activation", "workspace"};
    return (unsigned)kind < GT_MEM_KINDS ? names[kind] : "?";
}
