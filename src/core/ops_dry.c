/*
 * ops_dry.c — the dry backend (see ops_dry.h): one do-nothing function per signature of ops.h.
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

static void dry_embedding_forward(void *out, const int32_t *tokens, const void *wte, int BT, int C, int V) {
    (void)out; (void)tokens; (void)wte; (void)BT; (void)C; (void)V;
}
static void dry_embedding_backward(float *dwte, const void *dout, const int32_t *tokens, int BT, int C, int V) {
    (void)dwte; (void)dout; (void)tokens; (void)BT; (void)C; (void)V;
}
static void dry_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C,
                                float eps) {
    (void)out; (void)rstd; (void)inp; (void)weight; (void)N; (void)C; (void)eps;
}
static void dry_rmsnorm_apply(void *out, const float *rstd, const void *inp, const void *weight, int N, int C) {
    (void)out; (void)rstd; (void)inp; (void)weight; (void)N; (void)C;
}
static void dry_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                                 const float *rstd, int N, int C) {
    (void)dinp; (void)dweight; (void)dout; (void)inp; (void)weight; (void)rstd; (void)N; (void)C;
}
static void dry_matmul_forward(void *out, const void *inp, const void *weight, int N, int IC, int OC) {
    (void)out; (void)inp; (void)weight; (void)N; (void)IC; (void)OC;
}
static void dry_matmul_backward(void *dinp, float *dweight, const void *dout, const void *inp, const void *weight,
                                int N, int IC, int OC, int accumulate_dinp) {
    (void)dinp; (void)dweight; (void)dout; (void)inp; (void)weight; (void)N; (void)IC; (void)OC;
    (void)accumulate_dinp;
}
static void dry_rope(void *out, const void *inp, const float *rope, int B, int T, int NH, int HD) {
    (void)out; (void)inp; (void)rope; (void)B; (void)T; (void)NH; (void)HD;
}
static void dry_attention_forward(void *out, float *lse, float *probs, const void *q, const void *k, const void *v,
                                  int B, int T, int NH, int NKV, int HD, float dropout, gt_rng_key key) {
    (void)out; (void)lse; (void)probs; (void)q; (void)k; (void)v; (void)B; (void)T; (void)NH; (void)NKV;
    (void)HD; (void)dropout; (void)key;
}
static void dry_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *q,
                                   const void *k, const void *v, const float *lse, const float *probs, int B, int T,
                                   int NH, int NKV, int HD, float dropout, gt_rng_key key) {
    (void)dq; (void)dk; (void)dv; (void)dout; (void)out; (void)q; (void)k; (void)v; (void)lse; (void)probs;
    (void)B; (void)T; (void)NH; (void)NKV; (void)HD; (void)dropout; (void)key;
}
static void dry_swiglu_forward(void *out, const void *gate, const void *up, size_t n) {
    (void)out; (void)gate; (void)up; (void)n;
}
static void dry_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                                size_t n) {
    (void)dgate; (void)dup; (void)dout; (void)gate; (void)up; (void)n;
}
static void dry_residual_forward(void *out, const void *res, const void *branch, size_t n, float dropout,
                                 gt_rng_key key) {
    (void)out; (void)res; (void)branch; (void)n; (void)dropout; (void)key;
}
static void dry_dropout_backward(void *dbranch, const void *dout, size_t n, float dropout, gt_rng_key key) {
    (void)dbranch; (void)dout; (void)n; (void)dropout; (void)key;
}
static void dry_crossentropy_forward(float *losses, float *lse, const void *logits, const int32_t *targets, int BT,
                                     int V) {
    (void)losses; (void)lse; (void)logits; (void)targets; (void)BT; (void)V;
}
static void dry_crossentropy_backward(void *logits, const float *lse, const int32_t *targets, int BT, int V,
                                      float dloss) {
    (void)logits; (void)lse; (void)targets; (void)BT; (void)V; (void)dloss;
}
static double dry_sumsq(const float *x, size_t n) { (void)x; (void)n; return 0.0; }
static void dry_scale(float *x, size_t n, float s) { (void)x; (void)n; (void)s; }
static void dry_adamw(float *param, float *exp_avg, float *exp_avg_sq, const float *grad, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int t) {
    (void)param; (void)exp_avg; (void)exp_avg_sq; (void)grad; (void)n; (void)lr; (void)beta1; (void)beta2;
    (void)eps; (void)weight_decay; (void)t;
}
static void dry_to_working(void *working, const float *master, size_t n) { (void)working; (void)master; (void)n; }
static void dry_to_master(float *master, const void *working, size_t n) { (void)master; (void)working; (void)n; }

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
    ops->embedding_forward = dry_embedding_forward;
    ops->embedding_backward = dry_embedding_backward;
    ops->rmsnorm_forward = dry_rmsnorm_forward;
    ops->rmsnorm_apply = dry_rmsnorm_apply;
    ops->rmsnorm_backward = dry_rmsnorm_backward;
    ops->matmul_forward = dry_matmul_forward;
    ops->matmul_backward = dry_matmul_backward;
    ops->rope_forward = dry_rope;
    ops->rope_backward = dry_rope;
    ops->attention_forward = dry_attention_forward;
    ops->attention_backward = dry_attention_backward;
    ops->swiglu_forward = dry_swiglu_forward;
    ops->swiglu_backward = dry_swiglu_backward;
    ops->residual_forward = dry_residual_forward;
    ops->dropout_backward = dry_dropout_backward;
    ops->crossentropy_forward = dry_crossentropy_forward;
    ops->crossentropy_backward = dry_crossentropy_backward;
    ops->sumsq = dry_sumsq;
    ops->scale = dry_scale;
    ops->adamw = dry_adamw;
    ops->to_working = dry_to_working;
    ops->to_master = dry_to_master;
}
