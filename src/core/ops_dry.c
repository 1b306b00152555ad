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

static void (*g_cost_fn)(void *ctx, const gt_op_cost *cost);
static void *g_cost_ctx;
static double g_e = 4; /* act_bytes of the table last made: the working tensors' element size */

void gt_ops_dry_set_cost(void (*fn)(void *ctx, const gt_op_cost *cost), void *ctx) {
    g_cost_fn = fn;
    g_cost_ctx = ctx;
}

static void emit(const char *op, gt_cost_kind kind, int backward, double flops, double bytes, int n, int ic, int oc) {
    gt_op_cost c = {op, kind, backward, flops, bytes, n, ic, oc};
    g_cost_fn(g_cost_ctx, &c);
}

/* Each op's cost from its arguments (gt_op_cost): bytes read and written, e per working element. */
#define MEM(op, bytes) emit(#op, GT_COST_MEMORY, 0, 0, (double)(bytes), 0, 0, 0)
#define COST_embedding_forward(out, tokens, wte, BT, C, V) MEM(embedding_forward, (double)(BT) * (C) * 2 * g_e)
#define COST_embedding_backward(dwte, dout, tokens, BT, C, V) \
    MEM(embedding_backward, (double)(BT) * (C) * (g_e + 8))
#define COST_swiglu_forward(out, gate, up, n) MEM(swiglu_forward, (double)(n) * 3 * g_e)
#define COST_swiglu_backward(dgate, dup, dout, gate, up, n) MEM(swiglu_backward, (double)(n) * 5 * g_e)
#define COST_residual_forward(out, res, branch, n, dropout, key) MEM(residual_forward, (double)(n) * 3 * g_e)
#define COST_dropout_backward(dbranch, dout, n, dropout, key) MEM(dropout_backward, (double)(n) * 2 * g_e)
#define COST_rmsnorm_forward(out, rstd, inp, weight, N, C, eps) MEM(rmsnorm_forward, (double)(N) * (C) * 2 * g_e)
#define COST_rmsnorm_apply(out, rstd, inp, weight, N, C) MEM(rmsnorm_apply, (double)(N) * (C) * 2 * g_e)
#define COST_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C) \
    MEM(rmsnorm_backward, (double)(N) * (C) * 4 * g_e)
#define COST_rope_forward(out, inp, rope, doc, B, T, NH, HD) MEM(rope_forward, (double)(B) * (T) * (NH) * (HD) * 2 * g_e)
#define COST_rope_backward(dinp, dout, rope, doc, B, T, NH, HD) \
    MEM(rope_backward, (double)(B) * (T) * (NH) * (HD) * 2 * g_e)
#define ATTN_FLOPS(B, T, NH, HD) (4.0 * (B) * (NH) * (HD) * ((double)(T) * ((T) + 1) / 2))
#define COST_attention_forward(out, lse, probs, q, k, v, doc, B, T, NH, NKV, HD, dropout, key) \
    emit("attention_forward", GT_COST_ATTENTION, 0, ATTN_FLOPS(B, T, NH, HD), 0, 0, 0, 0)
#define COST_attention_backward(dq, dk, dv, dout, out, q, k, v, lse, probs, doc, B, T, NH, NKV, HD, dropout, key) \
    emit("attention_backward", GT_COST_ATTENTION, 1, 2.5 * ATTN_FLOPS(B, T, NH, HD), 0, 0, 0, 0)
#define COST_matmul_forward(out, inp, weight, N, IC, OC) \
    emit("matmul_forward", GT_COST_MATMUL, 0, 2.0 * (N) * (IC) * (OC), 0, N, IC, OC)
#define COST_matmul_backward(dinp, dweight, dout, inp, weight, N, IC, OC, acc) \
    emit("matmul_backward", GT_COST_MATMUL, 1, 4.0 * (N) * (IC) * (OC), 0, N, IC, OC)
#define COST_crossentropy_forward(losses, lse, logits, targets, BT, V) \
    MEM(crossentropy_forward, (double)(BT) * (V) * g_e)
#define COST_crossentropy_backward(logits, lse, targets, BT, V, dloss) \
    MEM(crossentropy_backward, (double)(BT) * (V) * 2 * g_e)
#define COST_sumsq(x, n) MEM(sumsq, (double)(n) * 4)
#define COST_scale(x, n, s) MEM(scale, (double)(n) * 8)
#define COST_adamw(param, m, v, grad, n, lr, b1, b2, eps, wd, t) \
    emit("adamw", GT_COST_OPTIMIZER, 0, 0, (double)(n) * 28, 0, 0, 0)
#define COST_to_working(working, master, n) MEM(to_working, (double)(n) * (4 + g_e))
#define COST_to_master(master, working, n) MEM(to_master, (double)(n) * (4 + g_e))

/* One stub per op of ops.h's list, dry_<op> (dry_embedding_forward, ..., dry_to_master): it reports
 * its cost when a time model listens (gt_ops_dry_set_cost), does nothing else, and returns 0 where
 * the op returns a value. */
#define DRY_STUB(kind, op, ret, params, args, shapes) \
    static ret dry_##op params { if (g_cost_fn) COST_##op args; DRY_RETURN_##ret }
#define DRY_RETURN_void
#define DRY_RETURN_double return 0.0;
GT_OPS(DRY_STUB)
#undef DRY_STUB

void gt_ops_dry_init(gt_ops *ops, int act_bytes, int keep_probs) {
    memset(ops, 0, sizeof *ops); /* the optional members (take_fault, reserved_bytes, ...) stay NULL */
    ops->name = "dry";
    ops->act_bytes = act_bytes;
    g_e = act_bytes;
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
