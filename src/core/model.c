/*
 * model.c — one micro-batch of the LLaMA model, forward and backward, executing an
 * activation-checkpointing plan (recompute.h) on top of the kernels interface (ops.h).
 *
 * A block (pre-norm LLaMA decoder layer) maps its input x (B, T, C) to its output:
 *   xn1 = rmsnorm(x); q, k, v = xn1 Wq^T, xn1 Wk^T, xn1 Wv^T; q, k = rope(q), rope(k)
 *   att = causal_gqa_attention(q, k, v); x2 = x + dropout(att Wo^T)
 *   xn2 = rmsnorm(x2); h = silu(xn2 Wg^T) * (xn2 Wu^T); out = x2 + dropout(h Wd^T)
 * What a block keeps for its backward (its "stash") depends on the plan:
 *   KEEP_ALL        xn1 rstd1 q k v lse [probs] att x2 rstd2 xn2 gate up h
 *   KEEP_SELECTIVE  rstd1 q k v lse att x2 rstd2 gate up — xn1, xn2, h and the attention
 *                   probabilities are recomputed in backward (Korthikanti et al. 2022)
 *   KEEP_RECOMPUTE  nothing: the segment's input is kept and backward re-runs the segment
 * Every block input x_i is kept unless the block is inside a recompute segment.
 *
 * Memory discipline (tests/test_recompute.c writes it out and holds the executor to it):
 *   - a block's stash and transients are allocated together at the start of its forward; the
 *     transients are freed at its end;
 *   - the block output doubles as scratch for the o-projection and down-projection outputs;
 *   - backward holds one gradient of the residual stream (dx) and one scratch region for all
 *     block backwards; a block's stash and its input are freed as soon as its backward is done.
 * Every buffer goes through gt_mem (memtrack.h), so act_peak_bytes is measured, not estimated.
 *
 * This executor is the only statement of the schedule. A dry model (gt_model_create_dry) runs the
 * same code on a backend that computes nothing (ops_dry.h): the planner predicts memory that way,
 * ZeRO's peaks included, and a model learns the order in which it will acquire units (for ZeRO-3's
 * prefetch) from a dry twin of itself, so prediction equals measurement by construction.
 *
 * Recompute is bit-exact: a recomputed forward calls the same kernels on the same inputs with the
 * same dropout keys, so gradients are identical under every plan.
 *
 * RoPE: the model builds the (cos, sin) table once (gt_rope_table: transformers' inv_freq, with
 * LLaMA-3.1's llama3 scaling when rope_type says so) and hands it to the kernels. Tied embeddings
 * (LLaMA-3.2): the head multiplies by model.embed_tokens.weight, and its weight gradient adds into
 * the embedding's gradient, which the embedding backward then adds to as well: the sum of both uses.
 */
#include "model.h"

#include "ops_dry.h"
#include "testhooks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer_offsets {
    size_t wq, wk, wv, wo, wg, wu, wd, ln1, ln2;   /* element offsets into params and grads */
    size_t base;                                   /* the block unit's first element (= wq) */
} layer_offsets;

struct gt_model {
    const gt_ops *ops;
    gt_mem *mem;
    gt_model_config cfg;
    gt_layout layout;
    size_t eb;                 /* bytes per working element */
    size_t params_len;         /* elements in params (n_params padded; a ZeRO-3 shard; 0: none) */
    size_t grads_len;          /* elements in grads (n_params padded; 0: none, ZeRO-2/3 units) */
    void *params;              /* (params_len) working */
    float *grads;              /* (grads_len) fp32 */
    gt_unit_hooks hooks;       /* where units' parameters and gradients come from (NULL: the buffers) */
    size_t *unit_off;          /* (n_units) first element of each unit */
    layer_offsets *layers;
    size_t off_embed, off_norm, off_head;
    int32_t *d_inputs, *d_targets;  /* device copies of the token ids (BT) */
    int32_t *d_doc;            /* (BT) the first position of each token's document (ops.h), or NULL */
    size_t token_capacity;
    int doc_mask, doc_reset;   /* document masking; RoPE positions restart at each document */
    int32_t doc_sep;           /* the separator token */
    int doc_sep_before;        /* 1: it starts a document (BOS); 0: it ends one (EOS) */
    float *rope;               /* (rope_T, HD/2, 2) fp32 cos/sin, device */
    int rope_T;
    gt_model *twin;            /* a dry model of the same shape: records the order of acquisitions */
    gt_ops dry_ops;            /* a dry model's backend and tracker (ops and mem point here) */
    gt_mem dry_mem;
};

/* Sizes of one micro-batch's tensors, in bytes. */
typedef struct shapes {
    int B, T, BT, C, NH, NKV, HD, KVD, F, V;
    size_t x;        /* (BT, C) working */
    size_t kv;       /* (BT, NKV*HD) working */
    size_t ff;       /* (BT, F) working */
    size_t row;      /* (BT) fp32 */
    size_t lse;      /* (B, NH, T) fp32 */
    size_t probs;    /* (B, NH, T, T) fp32 */
    size_t logits;   /* (BT, V) working */
} shapes;

typedef struct stash {
    int keep;          /* gt_block_keep the buffers were allocated for */
    int with_probs;
    void *xn1, *q, *k, *v, *att, *x2, *xn2, *gate, *up, *h;
    float *rstd1, *rstd2, *lse, *probs;
} stash;

typedef struct scratch {
    void *c1, *c2;         /* (BT, C) each */
    void *big;             /* max(2 (BT, F), (BT, C) + 2 (BT, KVD)): dh|dgate, dup — or dq, dk, dv */
    size_t big_bytes;
} scratch;

/* A tensor of block L inside its unit's parameters pw / gradients pg. */
#define PW(off) ((char *)pw + ((off) - L->base) * m->eb)
#define PG(off) (pg + ((off) - L->base))

/* Units (model.h): the parameters of unit u, indexed from the unit's first element. Without hooks
 * they are views of the flat buffers; with them (ZeRO-3, src/core/zero.c) a gathered copy. */
static void *unit_params(gt_model *m, int u) {
    if (m->hooks.params) return m->hooks.params(m->hooks.ctx, u);
    return (char *)m->params + m->unit_off[u] * m->eb;
}
static void unit_params_done(gt_model *m, int u) {
    if (m->hooks.params_done) m->hooks.params_done(m->hooks.ctx, u);
}
static float *unit_grads(gt_model *m, int u) {
    if (m->hooks.grads) return m->hooks.grads(m->hooks.ctx, u);
    return m->grads + m->unit_off[u];
}
static void unit_grads_done(gt_model *m, int u) {
    if (m->hooks.grads_done) m->hooks.grads_done(m->hooks.ctx, u);
}
static void progress(const gt_model *m) {
    if (m->hooks.progress) m->hooks.progress(m->hooks.ctx);
}

static shapes make_shapes(const gt_model *m, int B, int T) {
    shapes s;
    s.B = B;
    s.T = T;
    s.BT = B * T;
    s.C = m->cfg.dim;
    s.NH = m->cfg.n_heads;
    s.NKV = m->cfg.n_kv_heads;
    s.HD = s.C / s.NH;
    s.KVD = s.NKV * s.HD;
    s.F = m->cfg.ffn_dim;
    s.V = m->cfg.vocab_size;
    s.x = (size_t)s.BT * s.C * m->eb;
    s.kv = (size_t)s.BT * s.KVD * m->eb;
    s.ff = (size_t)s.BT * s.F * m->eb;
    s.row = (size_t)s.BT * sizeof(float);
    s.lse = (size_t)s.B * s.NH * s.T * sizeof(float);
    s.probs = (size_t)s.B * s.NH * s.T * s.T * sizeof(float);
    s.logits = (size_t)s.BT * s.V * m->eb;
    return s;
}

static void *act_alloc(gt_model *m, size_t bytes) { return gt_mem_alloc(m->mem, GT_MEM_ACT, bytes); }
static void act_free(gt_model *m, void *p, size_t bytes) {
    if (p) gt_mem_free(m->mem, GT_MEM_ACT, p, bytes);
}

/* ------------------------------------------------------------------ RoPE table */

/* transformers' _compute_default_rope_parameters and _compute_llama3_parameters
 * (modeling_rope_utils.py), step by step in fp32 as torch evaluates them: a Python number meeting
 * an fp32 tensor is rounded to fp32 first, and `number / tensor` is tensor.reciprocal() * number. */
void gt_rope_inv_freq(const gt_model_config *cfg, float *inv_freq) {
    int HD = cfg->dim / cfg->n_heads, half = HD / 2;
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)HD);
    if (cfg->rope_type != GT_ROPE_LLAMA3) return;
    const float factor = (float)cfg->rope_factor;
    const float low = (float)cfg->rope_low_freq_factor;
    const double old_len = (double)cfg->rope_original_max_position_embeddings;
    const float low_freq_wavelen = (float)(old_len / cfg->rope_low_freq_factor);
    const float high_freq_wavelen = (float)(old_len / cfg->rope_high_freq_factor);
    const float span = (float)(cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
    for (int i = 0; i < half; i++) {
        float f = inv_freq[i];
        float wavelen = (1.0f / f) * (float)(2.0 * M_PI);
        float scaled = wavelen > low_freq_wavelen ? f / factor : f;
        float smooth = ((1.0f / wavelen) * (float)old_len - low) / span;
        float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        int medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        inv_freq[i] = medium ? smoothed : scaled;
    }
}

/* (T, HD/2, 2): the angle is the fp32 product t * inv_freq_i as in LlamaRotaryEmbedding.forward;
 * its cos and sin are taken in double and rounded (transformers takes them in fp32: within an ulp). */
void gt_rope_table(const gt_model_config *cfg, int T, float *table) {
    int half = cfg->dim / cfg->n_heads / 2;
    float *inv_freq = malloc((size_t)half * sizeof *inv_freq);
    if (!inv_freq) abort();
    gt_rope_inv_freq(cfg, inv_freq);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)t * inv_freq[i];
            table[((size_t)t * half + i) * 2] = (float)cos((double)angle);
            table[((size_t)t * half + i) * 2 + 1] = (float)sin((double)angle);
        }
    }
    free(inv_freq);
}

/* The device table covers positions 0..T-1 (built for max_seq_len at creation; grown if a caller
 * ever runs longer sequences). Workspace memory: (T, HD/2, 2) fp32. */
static void ensure_rope(gt_model *m, int T) {
    if (m->rope && m->rope_T >= T) return;
    size_t HD = (size_t)(m->cfg.dim / m->cfg.n_heads);
    if (m->rope) gt_mem_free(m->mem, GT_MEM_WORKSPACE, m->rope, (size_t)m->rope_T * HD * sizeof(float));
    float *host = malloc((size_t)T * HD * sizeof(float));
    if (!host) abort();
    gt_rope_table(&m->cfg, T, host);
    m->rope = gt_mem_alloc(m->mem, GT_MEM_WORKSPACE, (size_t)T * HD * sizeof(float));
    m->ops->copy_to_device(m->rope, host, (size_t)T * HD * sizeof(float));
    free(host);
    m->rope_T = T;
}

/* ------------------------------------------------------------------ construction */

gt_model *gt_model_create(const gt_ops *ops, gt_mem *mem, const gt_model_config *cfg) {
    return gt_model_create_padded(ops, mem, cfg, 0);
}

gt_model *gt_model_create_padded(const gt_ops *ops, gt_mem *mem, const gt_model_config *cfg, size_t n_padded) {
    gt_layout layout;
    gt_layout_init(&layout, cfg);
    size_t n = n_padded > layout.n_params ? n_padded : layout.n_params;
    gt_layout_free(&layout);
    return gt_model_create_buffers(ops, mem, cfg, n, n);
}

static void model_init(gt_model *m, const gt_ops *ops, gt_mem *mem, const gt_model_config *cfg, size_t params_len,
                       size_t grads_len) {
    m->ops = ops;
    m->mem = mem;
    m->cfg = *cfg;
    m->eb = (size_t)ops->act_bytes;
    gt_layout_init(&m->layout, cfg);
    m->params_len = params_len;
    m->grads_len = grads_len;
    if (params_len) {
        m->params = gt_mem_alloc(mem, GT_MEM_PARAMS, params_len * m->eb);
        ops->zero(m->params, params_len * m->eb);
    }
    if (grads_len) {
        m->grads = gt_mem_alloc(mem, GT_MEM_GRADS, grads_len * sizeof(float));
        ops->zero(m->grads, grads_len * sizeof(float));
    }
    int n_units = gt_model_n_units(cfg);
    m->unit_off = malloc((size_t)n_units * sizeof *m->unit_off);
    if (!m->unit_off) abort();
    for (int u = 0; u < n_units; u++) {
        size_t numel;
        gt_layout_unit(&m->layout, u, &m->unit_off[u], &numel);
    }
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers) abort();
    /* layout order: embed, 9 tensors per layer, norm, head */
    const gt_tensor_info *t = m->layout.tensors;
    m->off_embed = t[0].offset;
    for (int i = 0; i < cfg->n_layers; i++) {
        const gt_tensor_info *l = t + 1 + 9 * i;
        m->layers[i] = (layer_offsets){l[0].offset, l[1].offset, l[2].offset, l[3].offset, l[4].offset,
                                       l[5].offset, l[6].offset, l[7].offset, l[8].offset, l[0].offset};
    }
    m->off_norm = t[1 + 9 * cfg->n_layers].offset;
    /* tied: the head is the embedding (layout.c then has no lm_head.weight) */
    m->off_head = cfg->tie_word_embeddings ? m->off_embed : t[2 + 9 * cfg->n_layers].offset;
    ensure_rope(m, cfg->max_seq_len);
}


gt_model *gt_model_create_buffers(const gt_ops *ops, gt_mem *mem, const gt_model_config *cfg, size_t params_len,
                                  size_t grads_len) {
    gt_model *m = calloc(1, sizeof *m);
    if (!m) abort();
    model_init(m, ops, mem, cfg, params_len, grads_len);
    return m;
}

gt_model *gt_model_create_dry(const gt_model_config *cfg, int act_bytes, int keep_probs) {
    gt_model *m = calloc(1, sizeof *m);
    if (!m) abort();
    gt_ops_dry_init(&m->dry_ops, act_bytes, keep_probs);
    gt_mem_init(&m->dry_mem, &m->dry_ops);
    uint64_t n = gt_model_param_count(cfg);
    model_init(m, &m->dry_ops, &m->dry_mem, cfg, n, n);
    return m;
}

uint64_t gt_model_dry_train_micro(gt_model *dry, const gt_plan *plan, int B, int T) {
    gt_mem_reset_peaks(dry->mem);
    gt_rng_key no_key = {0, 0};
    int recomputed = 0;
    gt_model_train_micro(dry, plan, NULL, NULL, B, T, 0.0f, no_key, &recomputed);
    return dry->mem->peak[GT_MEM_ACT];
}

void gt_model_destroy(gt_model *m) {
    if (!m) return;
    gt_model_destroy(m->twin);
    if (m->params) gt_mem_free(m->mem, GT_MEM_PARAMS, m->params, m->params_len * m->eb);
    if (m->grads) gt_mem_free(m->mem, GT_MEM_GRADS, m->grads, m->grads_len * sizeof(float));
    free(m->unit_off);
    if (m->d_inputs) {
        gt_mem_free(m->mem, GT_MEM_WORKSPACE, m->d_inputs, m->token_capacity * sizeof(int32_t));
        gt_mem_free(m->mem, GT_MEM_WORKSPACE, m->d_targets, m->token_capacity * sizeof(int32_t));
        if (m->d_doc) gt_mem_free(m->mem, GT_MEM_WORKSPACE, m->d_doc, m->token_capacity * sizeof(int32_t));
    }
    if (m->rope)
        gt_mem_free(m->mem, GT_MEM_WORKSPACE, m->rope,
                    (size_t)m->rope_T * (size_t)(m->cfg.dim / m->cfg.n_heads) * sizeof(float));
    free(m->layers);
    gt_layout_free(&m->layout);
    free(m);
}

const gt_layout *gt_model_layout(const gt_model *m) { return &m->layout; }
void *gt_model_params(gt_model *m) { return m->params; }
float *gt_model_grads(gt_model *m) { return m->grads; }
void gt_model_set_unit_hooks(gt_model *m, const gt_unit_hooks *hooks) {
    if (hooks) m->hooks = *hooks;
    else memset(&m->hooks, 0, sizeof m->hooks);
}

void gt_model_set_params(gt_model *m, const float *params_host) {
    size_t n = m->layout.n_params;
    float *staging = m->ops->alloc(n * sizeof(float));
    m->ops->copy_to_device(staging, params_host, n * sizeof(float));
    m->ops->to_working(m->params, staging, n);
    m->ops->free(staging);
    /* a caching allocator would keep the 4-bytes-per-parameter staging block for nothing */
    if (m->ops->release_cached) m->ops->release_cached();
}

static void upload_tokens(gt_model *m, const int32_t *inputs, const int32_t *targets, int B, int T) {
    const int BT = B * T;
    if ((size_t)BT > m->token_capacity) {
        if (m->d_inputs) {
            gt_mem_free(m->mem, GT_MEM_WORKSPACE, m->d_inputs, m->token_capacity * sizeof(int32_t));
            gt_mem_free(m->mem, GT_MEM_WORKSPACE, m->d_targets, m->token_capacity * sizeof(int32_t));
            if (m->d_doc) gt_mem_free(m->mem, GT_MEM_WORKSPACE, m->d_doc, m->token_capacity * sizeof(int32_t));
            m->d_doc = NULL;
        }
        m->token_capacity = (size_t)BT;
        m->d_inputs = gt_mem_alloc(m->mem, GT_MEM_WORKSPACE, m->token_capacity * sizeof(int32_t));
        m->d_targets = gt_mem_alloc(m->mem, GT_MEM_WORKSPACE, m->token_capacity * sizeof(int32_t));
    }
    m->ops->copy_to_device(m->d_inputs, inputs, (size_t)BT * sizeof(int32_t));
    if (targets) m->ops->copy_to_device(m->d_targets, targets, (size_t)BT * sizeof(int32_t));
    if (m->doc_mask || m->doc_reset) {
        if (!m->d_doc) m->d_doc = gt_mem_alloc(m->mem, GT_MEM_WORKSPACE, m->token_capacity * sizeof(int32_t));
        if (inputs) { /* a dry model has none: it only allocates */
            int32_t *doc = malloc((size_t)BT * sizeof *doc);
            if (!doc) abort();
            gt_doc_starts(doc, inputs, B, T, m->doc_sep, m->doc_sep_before);
            m->ops->copy_to_device(m->d_doc, doc, (size_t)BT * sizeof(int32_t));
            free(doc);
        }
    }
}

void gt_doc_starts(int32_t *doc, const int32_t *inputs, int B, int T, int32_t sep, int sep_before) {
    for (int b = 0; b < B; b++) {
        const int32_t *in = inputs + (size_t)b * T;
        int32_t *d = doc + (size_t)b * T;
        int start = 0;
        for (int t = 0; t < T; t++) {
            /* BOS: the separator is a document's first token; EOS: the token after it is */
            if (t > 0 && (sep_before ? in[t] == sep : in[t - 1] == sep)) start = t;
            d[t] = start;
        }
    }
}

void gt_model_set_documents(gt_model *m, int mask, int reset_positions, int32_t sep, int sep_before) {
    m->doc_mask = mask;
    m->doc_reset = reset_positions;
    m->doc_sep = sep;
    m->doc_sep_before = sep_before;
}

/* Dropout sites of a block: each gets its own key so masks never repeat between sites. */
enum { SITE_ATTN_PROBS = 1, SITE_ATTN_RESIDUAL = 2, SITE_MLP_RESIDUAL = 3 };

static gt_rng_key site_key(gt_rng_key base, int layer, int site) {
    gt_rng_key k = {base.seed, gt_mix64(base.stream + 0x10000ull * (uint64_t)(layer + 1) + (uint64_t)site)};
    return k;
}

/* ------------------------------------------------------------------ stash */

/* Allocates what a block forward writes. KEEP_ALL keeps all of it; for SELECTIVE and RECOMPUTE the
 * tensors that plan does not keep are transients, freed by stash_drop_transients after forward. */
static void stash_alloc(gt_model *m, const shapes *s, stash *st, int keep, int with_probs) {
    memset(st, 0, sizeof *st);
    st->keep = keep;
    st->with_probs = with_probs;
    st->xn1 = act_alloc(m, s->x);
    st->rstd1 = act_alloc(m, s->row);
    st->q = act_alloc(m, s->x);
    st->k = act_alloc(m, s->kv);
    st->v = act_alloc(m, s->kv);
    st->lse = act_alloc(m, s->lse);
    if (with_probs) st->probs = act_alloc(m, s->probs);
    st->att = act_alloc(m, s->x);
    st->x2 = act_alloc(m, s->x);
    st->rstd2 = act_alloc(m, s->row);
    st->xn2 = act_alloc(m, s->x);
    st->gate = act_alloc(m, s->ff);
    st->up = act_alloc(m, s->ff);
    st->h = act_alloc(m, s->ff);
}

static void stash_free_all(gt_model *m, const shapes *s, stash *st) {
    act_free(m, st->xn1, s->x);
    act_free(m, st->rstd1, s->row);
    act_free(m, st->q, s->x);
    act_free(m, st->k, s->kv);
    act_free(m, st->v, s->kv);
    act_free(m, st->lse, s->lse);
    act_free(m, st->probs, s->probs);
    act_free(m, st->att, s->x);
    act_free(m, st->x2, s->x);
    act_free(m, st->rstd2, s->row);
    act_free(m, st->xn2, s->x);
    act_free(m, st->gate, s->ff);
    act_free(m, st->up, s->ff);
    act_free(m, st->h, s->ff);
    memset(st, 0, sizeof *st);
}

static void stash_drop_transients(gt_model *m, const shapes *s, stash *st) {
    if (st->keep == GT_KEEP_RECOMPUTE) {
        stash_free_all(m, s, st);
    } else if (st->keep == GT_KEEP_SELECTIVE) {
        act_free(m, st->xn1, s->x);
        act_free(m, st->xn2, s->x);
        act_free(m, st->h, s->ff);
        st->xn1 = st->xn2 = st->h = NULL;
    }
}

/* ------------------------------------------------------------------ block forward / backward */

/* x (BT, C) -> out (BT, C), writing the stash. With need_out = 0 (a recompute whose output nobody
 * reads: the last block of a segment, whose output is the next segment's kept input) it stops after
 * SwiGLU: backward reads h, not the down-projection or the residual sum, so the gradients are the same
 * bits and a quarter of the block's forward FLOPs (the F -> C product) is not spent again. out is
 * still written with the o-projection (scratch). */
static void block_forward(gt_model *m, int layer, const void *pw, const shapes *s, const void *x, void *out,
                          stash *st, gt_rng_key base, float dropout, int need_out) {
    const gt_ops *ops = m->ops;
    const layer_offsets *L = &m->layers[layer];
    int BT = s->BT, C = s->C, F = s->F;
    ops->rmsnorm_forward(st->xn1, st->rstd1, x, PW(L->ln1), BT, C, m->cfg.norm_eps);
    ops->matmul_forward(st->q, st->xn1, PW(L->wq), BT, C, C);
    progress(m);
    ops->matmul_forward(st->k, st->xn1, PW(L->wk), BT, C, s->KVD);
    progress(m);
    ops->matmul_forward(st->v, st->xn1, PW(L->wv), BT, C, s->KVD);
    progress(m);
    /* a recompute runs in the same micro-batch as the forward: the same d_doc, the same masks */
    const int32_t *pos_doc = m->doc_reset ? m->d_doc : NULL, *att_doc = m->doc_mask ? m->d_doc : NULL;
    ops->rope_forward(st->q, st->q, m->rope, pos_doc, s->B, s->T, s->NH, s->HD);
    ops->rope_forward(st->k, st->k, m->rope, pos_doc, s->B, s->T, s->NKV, s->HD);
    ops->attention_forward(st->att, st->lse, st->probs, st->q, st->k, st->v, att_doc, s->B, s->T, s->NH,
                           s->NKV, s->HD, dropout, site_key(base, layer, SITE_ATTN_PROBS));
    progress(m);
    ops->matmul_forward(out, st->att, PW(L->wo), BT, C, C);
    progress(m); /* out holds the o-projection */
    ops->residual_forward(st->x2, x, out, (size_t)BT * C, dropout, site_key(base, layer, SITE_ATTN_RESIDUAL));
    ops->rmsnorm_forward(st->xn2, st->rstd2, st->x2, PW(L->ln2), BT, C, m->cfg.norm_eps);
    ops->matmul_forward(st->gate, st->xn2, PW(L->wg), BT, C, F);
    progress(m);
    ops->matmul_forward(st->up, st->xn2, PW(L->wu), BT, C, F);
    progress(m);
    ops->swiglu_forward(st->h, st->gate, st->up, (size_t)BT * F);
    if (!need_out) return;
    ops->matmul_forward(out, st->h, PW(L->wd), BT, F, C);
    progress(m); /* out holds the down-projection */
    ops->residual_forward(out, st->x2, out, (size_t)BT * C, dropout, site_key(base, layer, SITE_MLP_RESIDUAL));
}

/* dx (BT, C): on entry dL/d(block output), on return dL/d(block input). Weight gradients add. */
static void block_backward(gt_model *m, int layer, const void *pw, float *pg, const shapes *s, const void *x,
                           void *dx, stash *st, scratch *sc, gt_rng_key base, float dropout) {
    const gt_ops *ops = m->ops;
    const layer_offsets *L = &m->layers[layer];
    int BT = s->BT, C = s->C, F = s->F;
    size_t n_c = (size_t)BT * C, n_f = (size_t)BT * F;
    int selective = st->keep == GT_KEEP_SELECTIVE;

    /* MLP branch: out = x2 + dropout(h Wd^T) */
    void *dd = sc->c1;                       /* (BT, C) */
    void *dh = sc->big;                      /* (BT, F), becomes dgate */
    void *dup = (char *)sc->big + s->ff;     /* (BT, F) */
    ops->dropout_backward(dd, dx, n_c, dropout, site_key(base, layer, SITE_MLP_RESIDUAL));
    void *h = st->h;
    if (selective) {
        h = act_alloc(m, s->ff);
        ops->swiglu_forward(h, st->gate, st->up, n_f);
    }
    ops->matmul_backward(dh, PG(L->wd), dd, h, PW(L->wd), BT, F, C, 0);
    progress(m);
    if (selective) act_free(m, h, s->ff);
    ops->swiglu_backward(dh, dup, dh, st->gate, st->up, n_f);
    void *xn2 = st->xn2;
    if (selective) {
        xn2 = act_alloc(m, s->x);
        ops->rmsnorm_apply(xn2, st->rstd2, st->x2, PW(L->ln2), BT, C);
    }
    void *dxn2 = sc->c1;
    ops->matmul_backward(dxn2, PG(L->wg), dh, xn2, PW(L->wg), BT, C, F, 0);
    progress(m);
    ops->matmul_backward(dxn2, PG(L->wu), dup, xn2, PW(L->wu), BT, C, F, 1);
    progress(m);
    if (selective) act_free(m, xn2, s->x);
    ops->rmsnorm_backward(dx, PG(L->ln2), dxn2, st->x2, PW(L->ln2), st->rstd2, BT, C); /* dx = dL/dx2 */

    /* attention branch: x2 = x + dropout(att Wo^T) */
    void *do_ = sc->c1, *datt = sc->c2;
    void *dq = sc->big;
    void *dk = (char *)sc->big + s->x;
    void *dv = (char *)dk + s->kv;
    ops->dropout_backward(do_, dx, n_c, dropout, site_key(base, layer, SITE_ATTN_RESIDUAL));
    ops->matmul_backward(datt, PG(L->wo), do_, st->att, PW(L->wo), BT, C, C, 0);
    progress(m);
    const int32_t *pos_doc = m->doc_reset ? m->d_doc : NULL, *att_doc = m->doc_mask ? m->d_doc : NULL;
    ops->attention_backward(dq, dk, dv, datt, st->att, st->q, st->k, st->v, st->lse, st->probs, att_doc, s->B,
                            s->T, s->NH, s->NKV, s->HD, dropout, site_key(base, layer, SITE_ATTN_PROBS));
    progress(m);
    ops->rope_backward(dq, dq, m->rope, pos_doc, s->B, s->T, s->NH, s->HD);
    ops->rope_backward(dk, dk, m->rope, pos_doc, s->B, s->T, s->NKV, s->HD);
    void *xn1 = st->xn1;
    if (selective) {
        xn1 = act_alloc(m, s->x);
        ops->rmsnorm_apply(xn1, st->rstd1, x, PW(L->ln1), BT, C);
    }
    void *dxn1 = sc->c1;
    ops->matmul_backward(dxn1, PG(L->wq), dq, xn1, PW(L->wq), BT, C, C, 0);
    progress(m);
    ops->matmul_backward(dxn1, PG(L->wk), dk, xn1, PW(L->wk), BT, C, s->KVD, 1);
    progress(m);
    ops->matmul_backward(dxn1, PG(L->wv), dv, xn1, PW(L->wv), BT, C, s->KVD, 1);
    progress(m);
    if (selective) act_free(m, xn1, s->x);
    ops->rmsnorm_backward(dx, PG(L->ln1), dxn1, x, PW(L->ln1), st->rstd1, BT, C); /* dx = dL/dx */
}

/* ------------------------------------------------------------------ head */

int gt_head_rows(const gt_model_config *m, int BT, int elem_bytes) {
    uint64_t e = (uint64_t)elem_bytes, bt = (uint64_t)BT, C = (uint64_t)m->dim, F = (uint64_t)m->ffn_dim;
    uint64_t KVD = (uint64_t)m->n_kv_heads * (C / (uint64_t)m->n_heads);
    uint64_t big = 2 * F > C + 2 * KVD ? 2 * F : C + 2 * KVD;
    uint64_t test_limit = gt_test_hooks_get()->head_chunk_bytes;
    uint64_t limit = test_limit ? test_limit : bt * (C + big) * e;
    uint64_t row = (uint64_t)m->vocab_size * e;
    uint64_t r = row ? limit / row : bt;
    if (r >= bt) return BT;
    r = r >= 64 ? r / 64 * 64 : r >= 8 ? r / 8 * 8 : r > 0 ? r : 1; /* aligned row offsets where possible */
    return (int)r;
}

/* The sum of n fp32 values on the device, added in double in row order on the host. */
static double sum_rows(gt_model *m, const float *dev, int n) {
    if (m->ops == &m->dry_ops) return 0.0; /* a dry model has no losses: skip the host-side loop */
    float *host = malloc((size_t)n * sizeof(float));
    if (!host) abort();
    m->ops->copy_to_host(host, dev, (size_t)n * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += host[i];
    free(host);
    return sum;
}

/* Evaluation: xf (BT, C) = rmsnorm(x_last); logits (BT, V) whole (the sampler reads them); losses and
 * lse (BT). Returns the summed loss. */
static double head_forward(gt_model *m, const shapes *s, const void *norm_w, const void *head_w, const void *x_last,
                           void *xf, float *rstdf, void *logits, float *losses, float *lse) {
    const gt_ops *ops = m->ops;
    ops->rmsnorm_forward(xf, rstdf, x_last, norm_w, s->BT, s->C, m->cfg.norm_eps);
    ops->matmul_forward(logits, xf, head_w, s->BT, s->C, s->V);
    ops->crossentropy_forward(losses, lse, logits, m->d_targets, s->BT, s->V);
    return sum_rows(m, losses, s->BT);
}

/* ------------------------------------------------------------------ the order of acquisitions */

/* Hooks that record the order in which units are acquired afresh (their count of acquisitions not
 * yet released goes from 0 to 1: when zero.c gathers them). */
typedef struct recorder {
    int *refs;      /* (n_units) */
    int *order;     /* (cap) */
    int n, cap;
} recorder;

static void *record_params(void *ctx, int u) {
    recorder *r = ctx;
    if (r->refs[u]++ == 0) {
        if (r->n == r->cap) abort();
        r->order[r->n++] = u;
    }
    return r; /* a token: the dry run reads no parameters */
}
static void record_params_done(void *ctx, int u) { ((recorder *)ctx)->refs[u]--; }

/* Tells the hooks the order of this micro-batch's (eval = 0) or evaluation's (eval = 1) first
 * acquisitions, for prefetching: the same micro-batch run first on a dry twin of the model
 * (ops_dry.h), whose hooks record it, so the order is the executor's own and no second copy of
 * the schedule exists. */
static void announce_schedule(gt_model *m, const gt_plan *plan, int eval, int B, int T) {
    if (!m->hooks.schedule) return;
    if (!m->twin) m->twin = gt_model_create_dry(&m->cfg, (int)m->eb, m->ops->can_keep_attention_probs);
    int n_units = gt_model_n_units(&m->cfg);
    recorder r = {calloc((size_t)n_units, sizeof(int)), malloc(2 * (size_t)n_units * sizeof(int)), 0, 2 * n_units};
    if (!r.refs || !r.order) abort();
    gt_unit_hooks rec = {.ctx = &r, .params = record_params, .params_done = record_params_done};
    gt_model_set_unit_hooks(m->twin, &rec);
    if (eval) {
        gt_model_eval(m->twin, NULL, NULL, B, T, NULL);
    } else {
        gt_rng_key no_key = {0, 0};
        int recomputed = 0;
        gt_model_train_micro(m->twin, plan, NULL, NULL, B, T, 0.0f, no_key, &recomputed);
    }
    m->hooks.schedule(m->hooks.ctx, r.order, r.n);
    free(r.refs);
    free(r.order);
}

/* ------------------------------------------------------------------ one micro-batch */

/* What one training micro-batch holds while the executor walks it. */
typedef struct micro {
    shapes s;
    void **xs;         /* (N + 1) x_i the input of block i, x_N the last output; NULL once freed */
    stash *st;         /* (N) */
    void *dx;          /* (BT, C) gradient of the residual stream, from the head's backward on */
    gt_rng_key key;    /* dropout masks: (key, layer, site) */
    float p;           /* dropout probability */
    int keep_probs;    /* KEEP_ALL blocks keep the attention probabilities (the backend can) */
} micro;

/* Embedding and every block, keeping what the plan says; a recompute segment keeps its input only. */
static void forward_blocks(gt_model *m, const gt_plan *plan, micro *mb) {
    const shapes *s = &mb->s;
    mb->xs[0] = act_alloc(m, s->x);
    m->ops->embedding_forward(mb->xs[0], m->d_inputs, unit_params(m, 0), s->BT, s->C, s->V);
    unit_params_done(m, 0);
    for (int a = 0; a < m->cfg.n_layers;) {
        int b = gt_plan_segment_end(plan, a);
        for (int i = a; i < b; i++) {
            int keep = plan->keep[i];
            const void *pw = unit_params(m, 1 + i);
            stash_alloc(m, s, &mb->st[i], keep, keep == GT_KEEP_ALL && mb->keep_probs);
            mb->xs[i + 1] = act_alloc(m, s->x);
            block_forward(m, i, pw, s, mb->xs[i], mb->xs[i + 1], &mb->st[i], mb->key, mb->p, 1);
            unit_params_done(m, 1 + i);
            stash_drop_transients(m, s, &mb->st[i]);
            if (keep == GT_KEEP_RECOMPUTE && i > a) { /* inside a segment: inputs are not kept */
                act_free(m, mb->xs[i], s->x);
                mb->xs[i] = NULL;
            }
        }
        a = b;
    }
}

/* Head and loss, forward and backward together, chunk by chunk of token rows: each chunk's logits are
 * made, turned into losses and then (in place) into their gradient, which gives the chunk's rows of
 * dxf and adds to the head's weight gradient; the (BT, V) logits never exist (gt_head_rows). The head
 * unit is the final norm and lm_head and, tied, the embedding unit too, whose gradient stays open
 * until its own backward at the end adds to it. Leaves mb->dx; returns the summed loss. */
static double head_train(gt_model *m, micro *mb, float dloss) {
    const gt_ops *ops = m->ops;
    const shapes *s = &mb->s;
    int N = m->cfg.n_layers, tied = m->cfg.tie_word_embeddings, U_HEAD = N + 1;
    char *pn = unit_params(m, U_HEAD);
    char *ph = tied ? unit_params(m, 0) : pn + (m->off_head - m->off_norm) * m->eb;
    float *gn = unit_grads(m, U_HEAD);
    float *gh = tied ? unit_grads(m, 0) : gn + (m->off_head - m->off_norm);
    int R = gt_head_rows(&m->cfg, s->BT, (int)m->eb);
    size_t chunk_bytes = (size_t)R * s->V * m->eb;
    void *xf = act_alloc(m, s->x);
    float *rstdf = act_alloc(m, s->row);
    float *losses = act_alloc(m, s->row);
    float *lse = act_alloc(m, s->row);
    void *dxf = act_alloc(m, s->x);
    void *logits = act_alloc(m, chunk_bytes);
    ops->rmsnorm_forward(xf, rstdf, mb->xs[N], pn, s->BT, s->C, m->cfg.norm_eps);
    for (int r0 = 0; r0 < s->BT; r0 += R) {
        int rows = s->BT - r0 < R ? s->BT - r0 : R;
        size_t xo = (size_t)r0 * s->C * m->eb;
        ops->matmul_forward(logits, (char *)xf + xo, ph, rows, s->C, s->V);
        ops->crossentropy_forward(losses + r0, lse + r0, logits, m->d_targets + r0, rows, s->V);
        ops->crossentropy_backward(logits, lse + r0, m->d_targets + r0, rows, s->V, dloss);
        ops->matmul_backward((char *)dxf + xo, gh, logits, (char *)xf + xo, ph, rows, s->C, s->V, 0);
        progress(m);
    }
    act_free(m, logits, chunk_bytes);
    double loss_sum = sum_rows(m, losses, s->BT);
    act_free(m, losses, s->row);
    act_free(m, lse, s->row);
    mb->dx = act_alloc(m, s->x);
    ops->zero(mb->dx, s->x);
    ops->rmsnorm_backward(mb->dx, gn, dxf, mb->xs[N], pn, rstdf, s->BT, s->C);
    if (tied) unit_params_done(m, 0);
    unit_params_done(m, U_HEAD);
    unit_grads_done(m, U_HEAD);
    act_free(m, dxf, s->x);
    act_free(m, rstdf, s->row);
    act_free(m, xf, s->x);
    act_free(m, mb->xs[N], s->x);
    mb->xs[N] = NULL;
    return loss_sum;
}

/* Backward through blocks [a, b), one segment. A recompute segment first re-runs its forward from
 * its kept input, keeping everything; the last block's output is not needed, so it is not computed
 * (its o-projection goes to scratch). Each block's parameters stay acquired until its backward: one
 * gather serves both (ZeRO-3). Every block's memory goes as soon as its backward is done. */
static void backward_segment(gt_model *m, const gt_plan *plan, micro *mb, scratch *sc, int a, int b,
                             int *recomputed_blocks) {
    const shapes *s = &mb->s;
    int recompute = plan->keep[a] == GT_KEEP_RECOMPUTE;
    if (recompute) {
        for (int i = a; i < b; i++) {
            const void *pw = unit_params(m, 1 + i);
            stash_alloc(m, s, &mb->st[i], GT_KEEP_ALL, mb->keep_probs);
            int last = i + 1 == b;
            void *out = last ? sc->c2 : (mb->xs[i + 1] = act_alloc(m, s->x));
            block_forward(m, i, pw, s, mb->xs[i], out, &mb->st[i], mb->key, mb->p, !last);
            (*recomputed_blocks)++;
        }
    }
    for (int i = b - 1; i >= a; i--) {
        const void *pw = unit_params(m, 1 + i);
        float *pg = unit_grads(m, 1 + i);
        block_backward(m, i, pw, pg, s, mb->xs[i], mb->dx, &mb->st[i], sc, mb->key, mb->p);
        unit_grads_done(m, 1 + i);
        unit_params_done(m, 1 + i);
        if (recompute) unit_params_done(m, 1 + i);
        stash_free_all(m, s, &mb->st[i]);
        act_free(m, mb->xs[i], s->x);
        mb->xs[i] = NULL;
    }
}

/* Backward through the blocks, segment by segment from the last, with one scratch region for all. */
static void backward_blocks(gt_model *m, const gt_plan *plan, micro *mb, int *recomputed_blocks) {
    const shapes *s = &mb->s;
    scratch sc;
    sc.big_bytes = 2 * s->ff > s->x + 2 * s->kv ? 2 * s->ff : s->x + 2 * s->kv;
    sc.c1 = act_alloc(m, s->x);
    sc.c2 = act_alloc(m, s->x);
    sc.big = act_alloc(m, sc.big_bytes);
    for (int b = m->cfg.n_layers, a; b > 0; b = a) {
        a = gt_plan_segment_start(plan, b - 1);
        backward_segment(m, plan, mb, &sc, a, b, recomputed_blocks);
    }
    act_free(m, sc.c1, s->x);
    act_free(m, sc.c2, s->x);
    act_free(m, sc.big, sc.big_bytes);
}

double gt_model_train_micro(gt_model *m, const gt_plan *plan, const int32_t *inputs, const int32_t *targets,
                            int B, int T, float dloss, gt_rng_key dropout_key, int *recomputed_blocks) {
    int N = m->cfg.n_layers;
    micro mb = {.s = make_shapes(m, B, T), .key = dropout_key, .p = m->cfg.dropout,
                .keep_probs = m->ops->can_keep_attention_probs};
    ensure_rope(m, T);
    upload_tokens(m, inputs, targets, B, T);
    mb.xs = calloc((size_t)N + 1, sizeof *mb.xs);
    mb.st = calloc((size_t)N, sizeof *mb.st);
    if (!mb.xs || !mb.st) abort();

    announce_schedule(m, plan, 0, B, T);
    forward_blocks(m, plan, &mb);
    double loss_sum = head_train(m, &mb, dloss);
    backward_blocks(m, plan, &mb, recomputed_blocks);
    m->ops->embedding_backward(unit_grads(m, 0), mb.dx, m->d_inputs, mb.s.BT, mb.s.C, mb.s.V);
    unit_grads_done(m, 0);
    if (m->cfg.tie_word_embeddings) unit_grads_done(m, 0);
    if (m->hooks.micro_end) m->hooks.micro_end(m->hooks.ctx);
    act_free(m, mb.dx, mb.s.x);
    free(mb.xs);
    free(mb.st);
    return loss_sum;
}

double gt_model_eval(gt_model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *logits_host) {
    const gt_ops *ops = m->ops;
    shapes s = make_shapes(m, B, T);
    gt_rng_key no_key = {0, 0};
    ensure_rope(m, T);
    upload_tokens(m, inputs, targets, B, T);
    announce_schedule(m, NULL, 1, B, T);
    void *x = act_alloc(m, s.x);
    void *y = act_alloc(m, s.x);
    ops->embedding_forward(x, m->d_inputs, unit_params(m, 0), s.BT, s.C, s.V);
    unit_params_done(m, 0);
    for (int i = 0; i < m->cfg.n_layers; i++) {
        stash st;
        const void *pw = unit_params(m, 1 + i);
        stash_alloc(m, &s, &st, GT_KEEP_RECOMPUTE, 0);
        block_forward(m, i, pw, &s, x, y, &st, no_key, 0.0f, 1);
        unit_params_done(m, 1 + i);
        stash_free_all(m, &s, &st);
        void *t = x;
        x = y;
        y = t;
    }
    act_free(m, y, s.x);
    void *xf = act_alloc(m, s.x);
    float *rstdf = act_alloc(m, s.row);
    void *logits = act_alloc(m, s.logits);
    float *losses = act_alloc(m, s.row);
    float *lse = act_alloc(m, s.row);
    int U_HEAD = m->cfg.n_layers + 1;
    char *pn = unit_params(m, U_HEAD);
    char *ph = m->cfg.tie_word_embeddings ? unit_params(m, 0) : pn + (m->off_head - m->off_norm) * m->eb;
    double loss_sum = head_forward(m, &s, pn, ph, x, xf, rstdf, logits, losses, lse);
    if (m->cfg.tie_word_embeddings) unit_params_done(m, 0);
    unit_params_done(m, U_HEAD);
    if (logits_host) {
        size_t n = (size_t)s.BT * s.V;
        float *staging = ops->alloc(n * sizeof(float));
        ops->to_master(staging, logits, n);
        ops->copy_to_host(logits_host, staging, n * sizeof(float));
        ops->free(staging);
    }
    act_free(m, lse, s.row);
    act_free(m, losses, s.row);
    act_free(m, logits, s.logits);
    act_free(m, rstdf, s.row);
    act_free(m, xf, s.x);
    act_free(m, x, s.x);
    return loss_sum;
}
