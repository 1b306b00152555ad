/*
 * ops.h — the kernels interface: every piece of math the trainer needs, as one table of
 * plain functions that a backend (cpu/, cuda/) fills in.
 *
 * The core never calls BLAS, OpenMP or CUDA itself; it calls these. A backend owns its memory
 * (alloc/free of device buffers) and its number format for "working" tensors:
 *   - activations, activation gradients and working parameters are `void *` in the backend's
 *     working type (bf16 or fp32 on either backend, as train.precision chooses): `act_bytes` bytes per element;
 *   - weight gradients, fp32 master weights, optimizer moments, norm statistics and losses are
 *     always `float *` (fp32), also on the GPU.
 * All pointers are device pointers of the backend (host memory for the CPU backend); tokens too.
 *
 * Layout conventions (shapes in comments, row-major, B batch, T sequence, C model dim):
 *   residual stream (B, T, C); q (B, T, NH, HD); k, v (B, T, NKV, HD); weights [out, in] as in
 *   Hugging Face, so y = x @ W^T.
 *
 * Determinism: every function gives the same bits for the same inputs, with no atomics in any
 * reduction that feeds a gradient. Two functions that must agree bit for bit are noted: the
 * recompute executor relies on them (a recomputed tensor equals the one forward kept).
 *
 * The kernels know nothing of configs, ranks or files.
 */
#ifndef GT_OPS_H
#define GT_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* The small functions below are written once for both backends: plain C for the CPU and the core,
 * and callable from CUDA kernels too when nvcc compiles them (cuda_common.cuh includes this file). */
#ifdef __CUDACC__
#define GT_HOST_DEVICE __host__ __device__
#else
#define GT_HOST_DEVICE
#endif

/* Counter-based dropout randomness: the keep/drop decision for element `index` is a pure function
 * of (key.seed, key.stream, index), so a recomputed forward and the backward replay the same mask
 * with no RNG state saved. The core builds `stream` from (step, micro-batch, layer, site). */
typedef struct gt_rng_key {
    uint64_t seed;
    uint64_t stream;
} gt_rng_key;

/* splitmix64 finaliser: the one mixing function shared by every backend. */
static inline GT_HOST_DEVICE uint64_t gt_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The decision for element `index` depends on the key only through this base, so a kernel gets the
 * base once per call (computed on the host) and spends one mix per element. */
static inline GT_HOST_DEVICE uint64_t gt_rng_base(gt_rng_key key) { return gt_mix64(key.seed ^ gt_mix64(key.stream)); }

/* Dropout keeps an element when u >= p, u uniform in [0, 1) with 24 random bits (the same bits on
 * every backend), and scales a kept one by 1/(1-p). */
static inline GT_HOST_DEVICE int gt_dropout_keep_at(uint64_t base, uint64_t index, float p) {
    const uint64_t h = gt_mix64(base + index);
    return (float)(h >> 40) * (1.0f / 16777216.0f) >= p;
}
static inline int gt_dropout_keep(gt_rng_key key, uint64_t index, float p) {
    return gt_dropout_keep_at(gt_rng_base(key), index, p);
}

/* The attention dropout's element index of (batch b, query head h, query t, key s): the flat index
 * the (B, NH, T, T) probabilities would have, so every attention kernel drops the same elements. */
static inline GT_HOST_DEVICE uint64_t gt_attention_drop_index(int b, int h, int t, int s, int NH, int T) {
    return (((uint64_t)b * (uint64_t)NH + (uint64_t)h) * (uint64_t)T + (uint64_t)t) * (uint64_t)T + (uint64_t)s;
}

/* The scalars of one step of torch.optim.AdamW (torch/optim/adamw.py, _single_tensor_adamw): formed
 * in double as python does, rounded to float where torch hands them to an fp32 kernel. Every
 * backend's adamw takes them from here, so they agree to the bit. t counts steps from 1. */
typedef struct gt_adamw_scalars {
    float decay;     /* 1 - lr * weight_decay (param.mul_) */
    float w1;        /* 1 - beta1: the lerp weight of exp_avg */
    float w2;        /* 1 - beta2: the weight of grad^2 in exp_avg_sq */
    float step_size; /* lr / (1 - beta1^t) */
    float bc2_sqrt;  /* sqrt(1 - beta2^t) */
} gt_adamw_scalars;

static inline gt_adamw_scalars gt_adamw_step_scalars(float lr, float beta1, float beta2, float weight_decay, int t) {
    gt_adamw_scalars s;
    s.decay = (float)(1.0 - (double)lr * (double)weight_decay);
    s.w1 = (float)(1.0 - (double)beta1);
    s.w2 = (float)(1.0 - (double)beta2);
    s.step_size = (float)((double)lr / (1.0 - pow((double)beta1, (double)t)));
    s.bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t));
    return s;
}

/* ---------------------------------------------------------------- the op list
 *
 * Every op of the table is listed once, here, by family; everything that needs one line per op is
 * generated from these lists: the members of struct gt_ops below, the CPU backend's declarations and
 * its two tables (cpu/cpu_kernels.h, cpu/ops_cpu.c), the dry backend (src/core/ops_dry.c), and the
 * CUDA backend's declarations (cuda/cuda_common.cuh), its table, the check that every entry is set
 * and the GTRAIN_CUDA_SYNC wrappers (cuda/cuda_ops.cu).
 *
 * Each family's kernels live in one file per backend, named after the family:
 *   family      ops                                                  CPU                  CUDA
 *   pointwise   embedding, swiglu, residual + dropout                cpu/cpu_pointwise.c  cuda/cuda_pointwise.cu
 *   norm        rmsnorm_forward, _apply, _backward                   cpu/cpu_norm.c       cuda/cuda_norm.cu
 *   rope        rope_forward, rope_backward                          cpu/cpu_rope.c       cuda/cuda_rope.cu
 *   attention   attention_forward, attention_backward                cpu/cpu_attention.c  cuda/cuda_attention.cu
 *   matmul      matmul_forward, matmul_backward                      cpu/cpu_matmul.c     cuda/cuda_matmul.cu
 *   loss        crossentropy_forward, crossentropy_backward          cpu/cpu_loss.c       cuda/cuda_loss.cu
 *   optimizer   sumsq, scale, adamw, to_working, to_master           cpu/cpu_optimizer.c  cuda/cuda_optimizer.cu
 * Adding an op: one X(...) line in its family's list, and its code in that family's file of each
 * backend.
 *
 * One entry: X(kind, op, ret, params, args, shapes)
 *   kind    W: one function per working type (the void * tensors are bf16 or fp32):
 *              CPU gt_cpu_<op> (fp32) and gt_cpu_<op>_bf16; CUDA gt_cuda_<op><float> and <bf16>;
 *           F: fp32 tensors only, one function that both tables share: gt_cpu_<op>, gt_cuda_<op>;
 *   op      the member's name;  ret, params: its type;  args: the parameter names, in order;
 *   shapes  (format, values...): the shapes GTRAIN_CUDA_SYNC names when the op faults.
 * The comment above each entry is the op's contract. Shapes are row-major; B batch, T sequence,
 * C model dim. */

#define GT_OPS_POINTWISE(X)                                                                                    \
    /* out (BT, C) = wte[tokens] ; tokens (BT) int32 in [0, V) ; wte (V, C) working. A token id outside      \
     * [0, V) is never read through: the CPU aborts naming it; CUDA writes a zero row and raises the         \
     * flag that take_fault reports. */                                                                      \
    X(W, embedding_forward, void, (void *out, const int32_t *tokens, const void *wte, int BT, int C, int V),  \
      (out, tokens, wte, BT, C, V), ("BT=%d C=%d V=%d", BT, C, V))                                            \
    /* dwte (V, C) fp32 += scatter of dout (BT, C) by tokens; deterministic (fixed order per row);           \
     * ids outside [0, V) add nothing */                                                                     \
    X(W, embedding_backward, void, (float *dwte, const void *dout, const int32_t *tokens, int BT, int C, int V), \
      (dwte, dout, tokens, BT, C, V), ("BT=%d C=%d V=%d", BT, C, V))                                          \
    /* SwiGLU: out = silu(gate) * up, elementwise over n */                                                  \
    X(W, swiglu_forward, void, (void *out, const void *gate, const void *up, size_t n), (out, gate, up, n),  \
      ("n=%zu", n))                                                                                          \
    /* elementwise: dgate may alias dout */                                                                  \
    X(W, swiglu_backward, void, (void *dgate, void *dup, const void *dout, const void *gate, const void *up, \
                                 size_t n),                                                                  \
      (dgate, dup, dout, gate, up, n), ("n=%zu", n))                                                         \
    /* residual with dropout on the branch: out = res + dropout(branch); elementwise, so out may alias       \
     * res or branch */                                                                                      \
    X(W, residual_forward, void, (void *out, const void *res, const void *branch, size_t n, float dropout,   \
                                  gt_rng_key key),                                                           \
      (out, res, branch, n, dropout, key), ("n=%zu dropout=%g", n, dropout))                                 \
    /* dbranch = dropout mask * dout / (1-p) (the residual path's gradient is dout itself); dbranch may      \
     * alias dout */                                                                                         \
    X(W, dropout_backward, void, (void *dbranch, const void *dout, size_t n, float dropout, gt_rng_key key), \
      (dbranch, dout, n, dropout, key), ("n=%zu dropout=%g", n, dropout))

/* RMSNorm (Hugging Face LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w, in fp32) */
#define GT_OPS_NORM(X)                                                                                         \
    /* out (N, C), rstd (N) fp32 = rsqrt(mean(x^2)+eps); inp (N, C); weight (C) */                           \
    X(W, rmsnorm_forward, void, (void *out, float *rstd, const void *inp, const void *weight, int N, int C,  \
                                 float eps),                                                                 \
      (out, rstd, inp, weight, N, C, eps), ("N=%d C=%d", N, C))                                              \
    /* out (N, C) from the rstd forward stored: bit-identical to rmsnorm_forward's out */                    \
    X(W, rmsnorm_apply, void, (void *out, const float *rstd, const void *inp, const void *weight, int N,     \
                               int C),                                                                       \
      (out, rstd, inp, weight, N, C), ("N=%d C=%d", N, C))                                                   \
    /* dinp (N, C) += d/dinp ; dweight (C) fp32 += ; dout (N, C) */                                          \
    X(W, rmsnorm_backward, void, (void *dinp, float *dweight, const void *dout, const void *inp,             \
                                  const void *weight, const float *rstd, int N, int C),                      \
      (dinp, dweight, dout, inp, weight, rstd, N, C), ("N=%d C=%d", N, C))

/* Documents inside a window: doc (B, T) int32 or NULL. doc[b*T + t] is the first position of the
 * document that holds token t of sequence b (so doc[b*T + t] <= t, and it never decreases along t).
 * NULL: the whole window is one document (doc = 0 everywhere). The model builds it from the
 * separator token (gt_model_set_documents). */

/* Rotary embedding, rotate-half convention, positions 0..T-1, in place allowed; with doc non-NULL
 * the position of (b, t) is t - doc[b*T + t] (positions restart at each document).
 * x (B, T, NH, HD), pairs (i, i + HD/2) of each head:
 *   x'_i = x_i cos - x_{i+HD/2} sin ;  x'_{i+HD/2} = x_{i+HD/2} cos + x_i sin
 * with (cos, sin) = rope[(t*HD/2 + i)*2 + {0, 1}]: rope (T_max >= T, HD/2, 2) fp32, a device table
 * the model builds once from its inverse frequencies (plain theta^(-2i/HD), or llama3-scaled), so
 * the kernels need not know how the frequencies were made and every backend uses the same numbers. */
#define GT_OPS_ROPE(X)                                                                                         \
    X(W, rope_forward, void, (void *out, const void *inp, const float *rope, const int32_t *doc, int B,     \
                              int T, int NH, int HD),                                                        \
      (out, inp, rope, doc, B, T, NH, HD), ("B=%d T=%d NH=%d HD=%d", B, T, NH, HD))                          \
    /* dinp = inverse rotation of dout (in place allowed) */                                                 \
    X(W, rope_backward, void, (void *dinp, const void *dout, const float *rope, const int32_t *doc, int B,  \
                               int T, int NH, int HD),                                                       \
      (dinp, dout, rope, doc, B, T, NH, HD), ("B=%d T=%d NH=%d HD=%d", B, T, NH, HD))

/* Causal grouped-query attention, scale 1/sqrt(HD). With doc (B, T) non-NULL (above) query t sees only
 * keys j with doc[b*T + t] <= j <= t (block-causal, document masking); NULL: keys 0..t. Probabilities
 * of masked keys are 0 (in probs too), and the kernels skip key blocks that a query block cannot see. */
#define GT_OPS_ATTENTION(X)                                                                                    \
    /* q (B, T, NH, HD), k and v (B, T, NKV, HD) (NH % NKV == 0, head h reads kv head h/(NH/NKV));          \
     * out (B, T, NH, HD); lse (B, NH, T) fp32 log-sum-exp of each score row;                               \
     * probs (B, NH, T, T) fp32 or NULL: the softmax probabilities before dropout, computed as              \
     * exp(s - lse) so that a backward which recomputes them from q, k and lse gets the same bits.          \
     * dropout (on the probabilities, as transformers' attention_dropout) uses key and element              \
     * index ((b*NH + h)*T + t)*T + s. */                                                                    \
    X(W, attention_forward, void, (void *out, float *lse, float *probs, const void *q, const void *k,        \
                                   const void *v, const int32_t *doc, int B, int T, int NH, int NKV, int HD, \
                                   float dropout, gt_rng_key key),                                           \
      (out, lse, probs, q, k, v, doc, B, T, NH, NKV, HD, dropout, key),                                      \
      ("B=%d T=%d NH=%d NKV=%d HD=%d dropout=%g", B, T, NH, NKV, HD, dropout))                               \
    /* dq (B,T,NH,HD), dk and dv (B,T,NKV,HD) overwritten; out (B,T,NH,HD) is attention_forward's           \
     * output for these q, k, v (bit for bit, as forward or a recompute made it): backward takes the        \
     * softmax-gradient row term D = rowsum(dout * out) from it instead of recomputing P V over the         \
     * whole triangle. probs may be NULL (recomputed from q, k, lse); the result is bit-identical           \
     * either way; doc must be the one forward had. */                                                       \
    X(W, attention_backward, void, (void *dq, void *dk, void *dv, const void *dout, const void *out,         \
                                    const void *q, const void *k, const void *v, const float *lse,           \
                                    const float *probs, const int32_t *doc, int B, int T, int NH, int NKV,   \
                                    int HD, float dropout, gt_rng_key key),                                  \
      (dq, dk, dv, dout, out, q, k, v, lse, probs, doc, B, T, NH, NKV, HD, dropout, key),                    \
      ("B=%d T=%d NH=%d NKV=%d HD=%d dropout=%g", B, T, NH, NKV, HD, dropout))

/* Linear layers (no bias): out (N, OC) = inp (N, IC) @ weight^T, weight (OC, IC). */
#define GT_OPS_MATMUL(X)                                                                                       \
    X(W, matmul_forward, void, (void *out, const void *inp, const void *weight, int N, int IC, int OC),      \
      (out, inp, weight, N, IC, OC), ("N=%d IC=%d OC=%d", N, IC, OC))                                        \
    /* dinp (N, IC) = dout @ weight (accumulate_dinp: +=, else =) ; dweight (OC, IC) fp32 += dout^T @ inp */ \
    X(W, matmul_backward, void, (void *dinp, float *dweight, const void *dout, const void *inp,              \
                                 const void *weight, int N, int IC, int OC, int accumulate_dinp),            \
      (dinp, dweight, dout, inp, weight, N, IC, OC, accumulate_dinp), ("N=%d IC=%d OC=%d", N, IC, OC))

/* Fused softmax + cross-entropy over logits (BT, V). */
#define GT_OPS_LOSS(X)                                                                                         \
    /* losses (BT) = lse - logit[target], lse (BT) fp32; a target < 0 is ignored (loss 0) */                 \
    X(W, crossentropy_forward, void, (float *losses, float *lse, const void *logits, const int32_t *targets, \
                                      int BT, int V),                                                        \
      (losses, lse, logits, targets, BT, V), ("BT=%d V=%d", BT, V))                                          \
    /* logits turn into dlogits in place: (softmax - onehot) * dloss (0 for ignored rows) */                 \
    X(W, crossentropy_backward, void, (void *logits, const float *lse, const int32_t *targets, int BT, int V,\
                                       float dloss),                                                         \
      (logits, lse, targets, BT, V, dloss), ("BT=%d V=%d", BT, V))

/* The optimizer step's fp32 vector utilities and the master <-> working conversions. */
#define GT_OPS_OPTIMIZER(X)                                                                                    \
    /* sum of squares in double, fixed summation order */                                                    \
    X(F, sumsq, double, (const float *x, size_t n), (x, n), ("n=%zu", n))                                    \
    X(F, scale, void, (float *x, size_t n, float s), (x, n, s), ("n=%zu", n))                                \
    /* PyTorch AdamW: p -= lr*wd*p; m,v moments; p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) */        \
    X(F, adamw, void, (float *param, float *exp_avg, float *exp_avg_sq, const float *grad, size_t n,         \
                       float lr, float beta1, float beta2, float eps, float weight_decay, int t),            \
      (param, exp_avg, exp_avg_sq, grad, n, lr, beta1, beta2, eps, weight_decay, t), ("n=%zu t=%d", n, t))   \
    /* working (n) = master (n) in the working type (a copy in fp32) */                                      \
    X(W, to_working, void, (void *working, const float *master, size_t n), (working, master, n),             \
      ("n=%zu", n))                                                                                          \
    /* master (n) fp32 = working (n) */                                                                      \
    X(W, to_master, void, (float *master, const void *working, size_t n), (master, working, n), ("n=%zu", n))

/* Every op, in the table's order. */
#define GT_OPS(X)                                                                                              \
    GT_OPS_POINTWISE(X) GT_OPS_NORM(X) GT_OPS_ROPE(X) GT_OPS_ATTENTION(X) GT_OPS_MATMUL(X) GT_OPS_LOSS(X)    \
    GT_OPS_OPTIMIZER(X)

/* (a, b, c) -> a, b, c: for the args and shapes of an entry */
#define GT_OPS_UNPAREN(...) __VA_ARGS__

typedef struct gt_ops gt_ops;
struct gt_ops {
    const char *name;   /* "cpu", "cuda" or "dry" */
    int act_bytes;      /* bytes per working element (4 fp32, 2 bf16) */
    /* 1 when attention_forward can store the (B, NH, T, T) probabilities for backward to reuse;
     * 0 when the backend always recomputes them from q, k and lse (flash-style). */
    int can_keep_attention_probs;

    /* ---- memory (device buffers; the core tracks sizes itself) ---- */
    void *(*alloc)(size_t bytes);                     /* aborts on failure, never returns NULL */
    void (*free)(void *ptr);
    void (*zero)(void *ptr, size_t bytes);
    void (*copy_to_device)(void *dst, const void *host_src, size_t bytes);
    void (*copy_to_host)(void *host_dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);   /* device to device */
    void (*synchronize)(void);
    /* Optional: the device memory this process can still allocate, and the device's total, in
     * bytes; 0, or -1 when it cannot tell. NULL when the backend's memory is the host's (the CPU):
     * the core then reads the host's. Used before the first allocation (src/core/preflight.c). */
    int (*memory_available)(size_t *free_bytes, size_t *total_bytes);
    /* Optional: page-locked host memory for a buffer that copy_to_host fills again and again (the
     * asynchronous save's snapshot), so that the copy is one DMA at the link's speed rather than a
     * copy staged through a pageable bounce buffer. NULL where the backend's memory is the host's;
     * host_alloc returns NULL when pinning is refused, and the caller then uses malloc. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *ptr);

    /* ---- the ops: one member per entry of GT_OPS (above), every one set by every backend ---- */
#define GT_OPS_MEMBER(kind, op, ret, params, args, shapes) ret(*op) params;
    GT_OPS(GT_OPS_MEMBER)
#undef GT_OPS_MEMBER

    /* ---- faults found on the device (optional: NULL where kernels check synchronously, the CPU) ----
     * 0, or 1 and a one-line message ("token id 40000 is outside [model] vocab_size = 32000 ...")
     * when a kernel met bad input (a token id or target outside [0, V)) since the last call; clears
     * the flag. One small device-to-host read: the core calls it once per step. */
    int (*take_fault)(char *msg, size_t msg_len);

    /* ---- the allocator's own memory (optional: NULL where alloc/free go straight to the system) ----
     * reserved_bytes: what the backend holds from the device for alloc (live blocks and the cache of
     * freed ones, rounded to its size classes): the figure beside the tracked peaks in the metrics.
     * release_cached: gives every cached (freed, not live) block back to the device; the core calls it
     * after a one-off large buffer, such as the fp32 staging copy of the parameters, is freed. */
    size_t (*reserved_bytes)(void);
    void (*release_cached)(void);
};

/* The CPU backend: fp32, OpenBLAS sgemm, OpenMP. */
const gt_ops *gt_ops_cpu(void);

/* The CPU backend with bf16 working tensors (the CUDA bf16 table's semantics), on every CPU: matrix
 * products through oneDNN on the CPU's bf16 units (AMX-BF16 or AVX512-BF16), or, where it has none or
 * gtrain was built without oneDNN, with the bf16 operands widened to fp32 for OpenBLAS sgemm (the same
 * sums of bf16 products in fp32, their products at about 3/4 of fp32's speed). gt_cpu_bf16_native: 1 when the bf16 units are
 * there (precision = auto takes bf16 only then), else 0 and why. gt_cpu_bf16_isa: how the table's
 * matrix products run, for logs. */
const gt_ops *gt_ops_cpu_bf16(void);
int gt_cpu_bf16_native(char *why, size_t why_len);
const char *gt_cpu_bf16_isa(void);

/* The CUDA backend's attention kernels: the default ones (every head size, fp32 arithmetic), or one of
 * the opt-in bf16 variants (docs/gpu.md). The config key train.cuda_attention names them (default, mma,
 * cudnn, in this order); the CPU backend has one attention and ignores it. */
typedef enum gt_cuda_attention {
    GT_CUDA_ATTENTION_DEFAULT, /* cuda/cuda_attention.cu */
    GT_CUDA_ATTENTION_MMA,     /* cuda/cuda_attention_mma.cu: tensor-core flash attention, HD 64 and 128 */
    GT_CUDA_ATTENTION_CUDNN,   /* cuda/cuda_attention_cudnn.cu: cuDNN's fused attention, dlopen()ed */
} gt_cuda_attention;

/* The CUDA backend, or NULL with a reason in `why` when it was not built or no GPU is visible.
 * bf16 selects bf16 working tensors; otherwise fp32. attention: the kernels its attention entries run
 * (for the whole process: the last call's choice holds). */
const gt_ops *gt_ops_cuda(int bf16, gt_cuda_attention attention, char *why, size_t why_len);

/* The cuBLASLt workspace the CUDA backend's matrix products hold for the whole run (cuda_matmul.cu);
 * the planner counts it in every CUDA total. */
#define GT_CUDA_MATMUL_WORKSPACE_BYTES ((size_t)32 << 20)

/* One line for `gtrain --version`: the CUDA runtime, driver and NCCL versions, or that the backend
 * was not built. Needs no GPU. */
void gt_cuda_versions(char *buf, size_t len);

#endif
