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

typedef struct gt_ops gt_ops;
struct gt_ops {
    const char *name;   /* "cpu" or "cuda" */
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

    /* ---- embedding ---- */
    /* out (BT, C) = wte[tokens] ; tokens (BT) int32 in [0, V) ; wte (V, C) working. A token id outside
     * [0, V) is never read through: the CPU aborts naming it; CUDA writes a zero row and raises the
     * flag that take_fault reports. */
    void (*embedding_forward)(void *out, const int32_t *tokens, const void *wte, int BT, int C, int V);
    /* dwte (V, C) fp32 += scatter of dout (BT, C) by tokens; deterministic (fixed order per row);
     * ids outside [0, V) add nothing */
    void (*embedding_backward)(float *dwte, const void *dout, const int32_t *tokens, int BT, int C, int V);

    /* ---- RMSNorm (Hugging Face LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w, in fp32) ---- */
    /* out (N, C), rstd (N) fp32 = rsqrt(mean(x^2)+eps); inp (N, C); weight (C) */
    void (*rmsnorm_forward)(void *out, float *rstd, const void *inp, const void *weight, int N, int C,
                            float eps);
    /* out (N, C) from the rstd forward stored: bit-identical to rmsnorm_forward's out */
    void (*rmsnorm_apply)(void *out, const float *rstd, const void *inp, const void *weight, int N, int C);
    /* dinp (N, C) += d/dinp ; dweight (C) fp32 += ; dout (N, C) */
    void (*rmsnorm_backward)(void *dinp, float *dweight, const void *dout, const void *inp,
                             const void *weight, const float *rstd, int N, int C);

    /* ---- linear layers (no bias): out (N, OC) = inp (N, IC) @ weight^T, weight (OC, IC) ---- */
    void (*matmul_forward)(void *out, const void *inp, const void *weight, int N, int IC, int OC);
    /* dinp (N, IC) = dout @ weight (accumulate_dinp: +=, else =) ; dweight (OC, IC) fp32 += dout^T @ inp */
    void (*matmul_backward)(void *dinp, float *dweight, const void *dout, const void *inp,
                            const void *weight, int N, int IC, int OC, int accumulate_dinp);

    /* ---- rotary embedding, rotate-half convention, positions 0..T-1, in place allowed ----
     * x (B, T, NH, HD), pairs (i, i + HD/2) of each head:
     *   x'_i = x_i cos - x_{i+HD/2} sin ;  x'_{i+HD/2} = x_{i+HD/2} cos + x_i sin
     * with (cos, sin) = rope[(t*HD/2 + i)*2 + {0, 1}]: rope (T_max >= T, HD/2, 2) fp32, a device table
     * the model builds once from its inverse frequencies (plain theta^(-2i/HD), or llama3-scaled), so
     * the kernels need not know how the frequencies were made and every backend uses the same numbers. */
    void (*rope_forward)(void *out, const void *inp, const float *rope, int B, int T, int NH, int HD);
    /* dinp = inverse rotation of dout (in place allowed) */
    void (*rope_backward)(void *dinp, const void *dout, const float *rope, int B, int T, int NH, int HD);

    /* ---- causal grouped-query attention, scale 1/sqrt(HD) ----
     * q (B, T, NH, HD), k and v (B, T, NKV, HD) (NH % NKV == 0, head h reads kv head h/(NH/NKV));
     * out (B, T, NH, HD); lse (B, NH, T) fp32 log-sum-exp of each score row;
     * probs (B, NH, T, T) fp32 or NULL: the softmax probabilities before dropout, computed as
     * exp(s - lse) so that a backward which recomputes them from q, k and lse gets the same bits.
     * dropout (on the probabilities, as transformers' attention_dropout) uses key and element
     * index ((b*NH + h)*T + t)*T + s. */
    void (*attention_forward)(void *out, float *lse, float *probs, const void *q, const void *k,
                              const void *v, int B, int T, int NH, int NKV, int HD, float dropout,
                              gt_rng_key key);
    /* dq (B,T,NH,HD), dk and dv (B,T,NKV,HD) overwritten; out (B,T,NH,HD) is attention_forward's
     * output for these q, k, v (bit for bit, as forward or a recompute made it): backward takes the
     * softmax-gradient row term D = rowsum(dout * out) from it instead of recomputing P V over the
     * whole triangle. probs may be NULL (recomputed from q, k, lse); the result is bit-identical
     * either way. */
    void (*attention_backward)(void *dq, void *dk, void *dv, const void *dout, const void *out,
                               const void *q, const void *k, const void *v, const float *lse,
                               const float *probs, int B, int T, int NH, int NKV, int HD, float dropout,
                               gt_rng_key key);

    /* ---- SwiGLU: out = silu(gate) * up, elementwise over n ---- */
    void (*swiglu_forward)(void *out, const void *gate, const void *up, size_t n);
    /* elementwise: dgate may alias dout */
    void (*swiglu_backward)(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                            size_t n);

    /* ---- residual with dropout on the branch: out = res + dropout(branch); elementwise, so out
     * may alias res or branch ---- */
    void (*residual_forward)(void *out, const void *res, const void *branch, size_t n, float dropout,
                             gt_rng_key key);
    /* dbranch = dropout mask * dout / (1-p) (the residual path's gradient is dout itself);
     * dbranch may alias dout */
    void (*dropout_backward)(void *dbranch, const void *dout, size_t n, float dropout, gt_rng_key key);

    /* ---- fused softmax + cross-entropy over logits (BT, V) ---- */
    /* losses (BT) = lse - logit[target], lse (BT) fp32; a target < 0 is ignored (loss 0) */
    void (*crossentropy_forward)(float *losses, float *lse, const void *logits, const int32_t *targets,
                                 int BT, int V);
    /* logits turn into dlogits in place: (softmax - onehot) * dloss (0 for ignored rows) */
    void (*crossentropy_backward)(void *logits, const float *lse, const int32_t *targets, int BT, int V,
                                  float dloss);

    /* ---- optimizer and fp32 vector utilities ---- */
    /* sum of squares in double, fixed summation order */
    double (*sumsq)(const float *x, size_t n);
    void (*scale)(float *x, size_t n, float s);
    /* PyTorch AdamW: p -= lr*wd*p; m,v moments; p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) */
    void (*adamw)(float *param, float *exp_avg, float *exp_avg_sq, const float *grad, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t);
    /* working (n) = master (n) in the working type (a copy on the CPU) */
    void (*to_working)(void *working, const float *master, size_t n);
    /* master (n) fp32 = working (n) */
    void (*to_master)(float *master, const void *working, size_t n);

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

/* The CPU backend with bf16 working tensors (the CUDA bf16 table's semantics; matrix products through
 * oneDNN on the CPU's bf16 units), or NULL with a reason in `why` when gtrain was built without oneDNN
 * or the CPU has no bf16 instructions (AMX-BF16 or AVX512-BF16). gt_cpu_bf16_isa: the instruction
 * set oneDNN runs on, for logs ("none" without oneDNN). */
const gt_ops *gt_ops_cpu_bf16(char *why, size_t why_len);
const char *gt_cpu_bf16_isa(void);

/* The CUDA backend, or NULL with a reason in `why` when it was not built or no GPU is visible.
 * bf16 selects bf16 working tensors; otherwise fp32. */
const gt_ops *gt_ops_cuda(int bf16, char *why, size_t why_len);

/* One line for `gtrain --version`: the CUDA runtime, driver and NCCL versions, or that the backend
 * was not built. Needs no GPU. */
void gt_cuda_versions(char *buf, size_t len);

#endif
