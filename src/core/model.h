/*
 * model.h — the LLaMA model: parameter layout with Hugging Face names, and the forward/backward
 * of one micro-batch under an activation-checkpointing plan.
 *
 * Parameters live in one flat buffer (working type of the backend), gradients in one flat fp32
 * buffer with the same offsets; `gt_tensor_info` names the views. Order and names follow
 * transformers' LlamaForCausalLM.named_parameters():
 *   model.embed_tokens.weight                      [V, C]
 *   model.layers.{i}.self_attn.q_proj.weight       [NH*HD, C]
 *   model.layers.{i}.self_attn.k_proj.weight       [NKV*HD, C]
 *   model.layers.{i}.self_attn.v_proj.weight       [NKV*HD, C]
 *   model.layers.{i}.self_attn.o_proj.weight       [C, NH*HD]
 *   model.layers.{i}.mlp.gate_proj.weight          [F, C]
 *   model.layers.{i}.mlp.up_proj.weight            [F, C]
 *   model.layers.{i}.mlp.down_proj.weight          [C, F]
 *   model.layers.{i}.input_layernorm.weight        [C]
 *   model.layers.{i}.post_attention_layernorm.weight [C]
 *   model.norm.weight                              [C]
 *   lm_head.weight                                 [V, C]   (absent with tie_word_embeddings)
 */
#ifndef GT_MODEL_H
#define GT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "memtrack.h"
#include "ops.h"
#include "recompute.h"

typedef struct gt_tensor_info {
    char name[96];     /* Hugging Face state-dict name */
    size_t offset;     /* elements from the start of the flat buffer */
    size_t numel;
    int ndim;          /* 1 or 2 */
    int shape[2];      /* [out, in] for matrices, [C] for norm weights */
    int decay;         /* 1 when AdamW weight decay applies (every matrix; not the norm weights) */
} gt_tensor_info;

typedef struct gt_layout {
    gt_model_config cfg;
    int n_tensors;
    gt_tensor_info *tensors;
    size_t n_params;
} gt_layout;

void gt_layout_init(gt_layout *layout, const gt_model_config *cfg);
void gt_layout_free(gt_layout *layout);
const gt_tensor_info *gt_layout_find(const gt_layout *layout, const char *name);

/* Initial fp32 parameters on the host: matrices and embeddings N(0, 0.02) (transformers'
 * initializer_range), norm weights 1. Deterministic in seed, independent of world size. */
void gt_layout_init_params(const gt_layout *layout, float *params, uint64_t seed);
/* The same values for the flat elements [begin, end) only, into dst (end - begin): what a rank
 * that owns that slice needs, without the whole model in memory. */
void gt_layout_init_params_range(const gt_layout *layout, float *dst, size_t begin, size_t end, uint64_t seed);

/* Units: the pieces ZeRO-3 gathers and ZeRO-2/3 reduce one at a time, each a contiguous range of
 * the flat vector: unit 0 the embedding, unit 1+i block i (its nine tensors), unit N+1 the final
 * norm with lm_head (just the norm when tied: the head then uses unit 0). */
int gt_model_n_units(const gt_model_config *cfg);   /* n_layers + 2 */
void gt_layout_unit(const gt_layout *layout, int unit, size_t *offset, size_t *numel);

/* The same counts from the shape alone, without building a layout (the planner prices models it
 * never builds): parameters of the model, and unit sizes in elements (the embedding, one block, the
 * head unit). */
uint64_t gt_model_param_count(const gt_model_config *model);
void gt_unit_sizes(const gt_model_config *model, uint64_t *embed, uint64_t *block, uint64_t *head);

/* RoPE inverse frequencies inv_freq (HD/2) exactly as transformers computes them for the config
 * (rope_type default or llama3), and the (cos, sin) table (T, HD/2, 2) of positions 0..T-1 that the
 * model hands to the kernels (ops.h rope_forward). */
void gt_rope_inv_freq(const gt_model_config *cfg, float *inv_freq);
void gt_rope_table(const gt_model_config *cfg, int T, float *table);

typedef struct gt_model gt_model;

/* Allocates working parameters and gradients (tracked in mem). Activations are allocated per
 * micro-batch and freed as soon as backward is done with them. */
gt_model *gt_model_create(const gt_ops *ops, gt_mem *mem, const gt_model_config *cfg);
/* The same, with parameter and gradient buffers of n_padded >= n_params elements (the tail is zero
 * and belongs to no tensor): ZeRO slices of equal length need it (src/dist/shard.h). */
gt_model *gt_model_create_padded(const gt_ops *ops, gt_mem *mem, const gt_model_config *cfg, size_t n_padded);
/* The general form: params_len working elements and grads_len fp32 elements (0: no such buffer;
 * then hooks must provide every unit, as ZeRO-3 does for parameters and ZeRO-2/3 for gradients). */
gt_model *gt_model_create_buffers(const gt_ops *ops, gt_mem *mem, const gt_model_config *cfg, size_t params_len,
                                  size_t grads_len);
void gt_model_destroy(gt_model *model);

/* Where the executor finds a unit's parameters and gradient accumulators. Each call to params /
 * grads is paired with one params_done / grads_done (nested calls for the same unit happen: the
 * tied embedding, a recomputed block). Pointers are indexed from the unit's first element;
 * gradients add into what grads returns. A NULL member means the flat buffer. */
typedef struct gt_unit_hooks {
    void *ctx;
    void *(*params)(void *ctx, int unit);
    void (*params_done)(void *ctx, int unit);
    float *(*grads)(void *ctx, int unit);
    void (*grads_done)(void *ctx, int unit);
    /* the order of first acquisitions of this micro-batch (or evaluation), for prefetching */
    void (*schedule)(void *ctx, const int *units, int n);
    void (*progress)(void *ctx);     /* called between kernels: lets transfers in flight advance */
    void (*micro_end)(void *ctx);    /* the micro-batch's backward is done: finish its reductions */
} gt_unit_hooks;
void gt_model_set_unit_hooks(gt_model *model, const gt_unit_hooks *hooks);

/* Documents inside a window (data.document_mask, data.reset_positions): from the next micro-batch on,
 * mask = 1 restricts attention to earlier tokens of the same document, reset_positions = 1 restarts
 * the RoPE positions at each document. Documents are delimited by the token `sep`: it starts one
 * (sep_before = 1, a BOS) or ends one (0, an EOS). Either flag makes the model keep one int32 per
 * token of the micro-batch (the workspace the planner counts, gt_mem_shape.documents). */
void gt_model_set_documents(gt_model *model, int mask, int reset_positions, int32_t sep, int sep_before);
/* doc (B, T) = the first position of each token's document in inputs (B, T) (ops.h's doc array) */
void gt_doc_starts(int32_t *doc, const int32_t *inputs, int B, int T, int32_t sep, int sep_before);


/* A dry model: this executor on the dry backend (ops_dry.h), with a memory tracker of its own.
 * gt_model_train_micro and gt_model_eval on it compute nothing but make exactly the allocations and
 * unit-hook calls a real model of that shape makes, in the same order: the planner predicts memory
 * with it (hooks included, for ZeRO's gathers) and a model records its order of acquisitions with
 * one. act_bytes and keep_probs: those of the backend predicted (ops.h). */
gt_model *gt_model_create_dry(const gt_model_config *cfg, int act_bytes, int keep_probs);
/* One training micro-batch of (B, T) tokens under `plan` on a dry model: its activation high-water
 * mark in bytes, what gt_mem measures as peak[GT_MEM_ACT] in a real one. */
uint64_t gt_model_dry_train_micro(gt_model *dry, const gt_plan *plan, int B, int T);

const gt_layout *gt_model_layout(const gt_model *model);
void *gt_model_params(gt_model *model);      /* (n_params) working type, device */
float *gt_model_grads(gt_model *model);      /* (n_params) fp32, device */
/* Copies host fp32 parameters into the working buffer. */
void gt_model_set_params(gt_model *model, const float *params_host);

/* One training micro-batch: forward under `plan`, then backward; gradients ADD into the gradient
 * buffer (zero it at the start of an optimizer step). inputs and targets are host (B, T) token ids;
 * a target < 0 is ignored. dloss scales every token's loss gradient (1 / tokens of the global batch).
 * Dropout masks come from (dropout_key, layer, site): a recomputed forward replays them exactly.
 * Returns the sum of the per-token losses; *recomputed_blocks += block forwards re-run. */
double gt_model_train_micro(gt_model *model, const gt_plan *plan, const int32_t *inputs,
                            const int32_t *targets, int B, int T, float dloss, gt_rng_key dropout_key,
                            int *recomputed_blocks);

/* Rows of the loss head's chunks in training. The LM head, the cross-entropy and their backward run
 * over this many token rows at a time, so the (rows, V) logits buffer is at most what a block's
 * backward needs beside its stash anyway (its output gradient and scratch: (BT, C) + max(2 (BT, F),
 * (BT, C) + 2 (BT, KVD)) elements, model.c's scratch) instead of (BT, V), and the head does not set
 * the activation peak of a recompute plan. It depends on the shapes alone, so every recompute policy
 * runs the same chunks and the gradients keep the same bits across policies. A multiple of 64 rows
 * when it is 64 or more, of 8 when 8 or more; BT when the whole batch fits. A unit test's
 * gt_test_hooks.head_chunk_bytes, when not 0, replaces the limit (to get several chunks). */
int gt_head_rows(const gt_model_config *model, int BT, int elem_bytes);

/* Forward only, no dropout, nothing kept for backward: returns the sum of per-token losses over
 * targets >= 0; if logits_host is not NULL it receives the (B, T, V) logits as fp32. */
double gt_model_eval(gt_model *model, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *logits_host);

#endif
