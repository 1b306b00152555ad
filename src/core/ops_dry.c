/*
 * ops_dry.c — the dry backend (see ops_dry.h): the memory entries, and one do-nothing function per
 * op of ops.h's list, generated from it.
 */
#include "ops_dry.h"

#include <string.h>

/* What alloc returns: never read or written, only compared with NULL and offset (the executor
 * takes views inside its buffers); aligned as a real allocation would be. */
static _Alignas(64) char dry_token[64];

static void *dry_alloc(size_t bytes) { (void)bytes; return dry_token; }
static void dry_free(void *ptr) { (void)ptr; }
static void dry_zero(void *ptr, size_t bytes) { (void)ptr; (void)bytes; }
static void dry_copy_to_device(void *dst, const void *src, size_t bytes) { (void)dst; (void)src; (void)bytes; }
static void dry_copy_to_host(void *dst, const void *src, size_t bytes) {
    (void)src;
    memset(dst, 0, bytes);
}
static void dry_copy(void *dst, const void *src, size_t bytes) { (void)dst; (void)src; (void)bytes; }
static void dry_synchronize(void) {}

/* One stub per op of ops.h's list, dry_<op> (dry_embedding_forward, ..., dry_to_master): it does
 * nothing and returns 0 where the op returns a value. */
#define DRY_STUB(kind, op, ret, params, args, shapes) static ret dry_##op params { DRY_RETURN_##ret }
#define DRY_RETURN_void
#define DRY_RETURN_double return 0.0;
GT_OPS(DRY_STUB)
#undef DRY_STUB

void gt_ops_dry_init(gt_ops *ops, int act_bytes, int keep_probs) {
    memset(ops, 0, sizeof *ops); /* the optional members (take_fault, reserved_bytes, ...) stay NULL */
    ops->name = "dry";
    ops->act_bytes = act_bytes;
    ops->can_keep_attention_probs = keep_probs;
    ops->alloc = dry_alloc;
    ops->free = dry_free;
    ops->zero = dry_zero;
    ops->copy_to_device = dry_copy_to_device;
    ops->copy_to_host = dry_copy_to_host;
    ops->copy = dry_copy;
    ops->synchronize = dry_synchronize;
#define DRY_ENTRY(kind, op, ret, params, args, shapes) ops->op = dry_##op;
    GT_OPS(DRY_ENTRY)
#undef DRY_ENTRY
}
