/*
 * layout.c — where each named parameter lives in the flat buffer, and how it starts out.
 *
 * The names and order are transformers' LlamaForCausalLM.named_parameters(), so a state file, an
 * export and a log line all agree on "model.layers.3.mlp.up_proj.weight". Zeroing, reducing,
 * sharding and saving are loops over one buffer; this table is how they find the tensors in it.
 * With tie_word_embeddings (LLaMA-3.2 1B/3B) there is no lm_head.weight: the head reads
 * model.embed_tokens.weight, as transformers' named_parameters() of a tied model lists it.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_tensor(gt_layout *layout, const char *name, int rows, int cols, int decay) {
    gt_tensor_info *t = &layout->tensors[layout->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = layout->n_params;
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 0;
    t->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    t->decay = decay;
    layout->n_params += t->numel;
}

void gt_layout_init(gt_layout *layout, const gt_model_config *cfg) {
    memset(layout, 0, sizeof *layout);
    layout->cfg = *cfg;
    int C = cfg->dim, F = cfg->ffn_dim, V = cfg->vocab_size;
    int HD = cfg->dim / cfg->n_heads;
    int KVD = cfg->n_kv_heads * HD;
    layout->tensors = calloc((size_t)cfg->n_layers * 9 + 3, sizeof *layout->tensors);
    if (!layout->tensors) {
        fprintf(stderr, "%s:%d: out of memory\n", __FILE__, __LINE__);
        abort();
    }
    char name[96];
    add_tensor(layout, "model.embed_tokens.weight", V, C, 1);
    for (int i = 0; i < cfg->n_layers; i++) {
#define LAYER(suffix, rows, cols, decay)                                   \
    snprintf(name, sizeof name, "model.layers.%d.%s", i, suffix);         \
    add_tensor(layout, name, rows, cols, decay)
        LAYER("self_attn.q_proj.weight", C, C, 1);
        LAYER("self_attn.k_proj.weight", KVD, C, 1);
        LAYER("self_attn.v_proj.weight", KVD, C, 1);
        LAYER("self_attn.o_proj.weight", C, C, 1);
        LAYER("mlp.gate_proj.weight", F, C, 1);
        LAYER("mlp.up_proj.weight", F, C, 1);
        LAYER("mlp.down_proj.weight", C, F, 1);
        LAYER("input_layernorm.weight", C, 0, 0);
        LAYER("post_attention_layernorm.weight", C, 0, 0);
#undef LAYER
    }
    add_tensor(layout, "model.norm.weight", C, 0, 0);
    if (!cfg->tie_word_embeddings) add_tensor(layout, "lm_head.weight", V, C, 1);
}

void gt_layout_free(gt_layout *layout) {
    free(layout->tensors);
    layout->tensors = NULL;
    layout->n_tensors = 0;
}

const gt_tensor_info *gt_layout_find(const gt_layout *layout, const char *name) {
    for (int i = 0; i < layout->n_tensors; i++)
        if (strcmp(layout->tensors[i].name, name) == 0) return &layout->tensors[i];
    return NULL;
}

/* Standard normal from two counter-based uniforms (Box-Muller): parameter j of the flat buffer
 * depends only on (seed, j), so every rank and every world size starts from the same weights. */
static float normal_at(uint64_t seed, uint64_t j) {
    double u1 = ((double)(gt_mix64(gt_mix64(seed) + 2 * j) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = ((double)(gt_mix64(gt_mix64(seed) + 2 * j + 1) >> 11)) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int gt_model_n_units(const gt_model_config *cfg) { return cfg->n_layers + 2; }

void gt_layout_unit(const gt_layout *layout, int u, size_t *offset, size_t *numel) {
    int N = layout->cfg.n_layers;
    if (u < 0 || u > N + 1) {
        fprintf(stderr, "%s:%d: unit %d of a %d-layer model\n", __FILE__, __LINE__, u, N);
        abort();
    }
    if (u == 0) {
        *offset = layout->tensors[0].offset;
        *numel = layout->tensors[0].numel;
    } else if (u <= N) {
        const gt_tensor_info *first = &layout->tensors[1 + 9 * (u - 1)], *last = first + 8;
        *offset = first->offset;
        *numel = last->offset + last->numel - first->offset;
    } else {
        *offset = layout->tensors[1 + 9 * N].offset;
        *numel = layout->n_params - *offset;
    }
}

/* One block's nine tensors, as gt_layout_init lays them out: q, k, v, o, gate, up, down, two norms. */
static uint64_t block_params(const gt_model_config *m) {
    uint64_t C = (uint64_t)m->dim, F = (uint64_t)m->ffn_dim;
    uint64_t KVD = (uint64_t)m->n_kv_heads * (C / (uint64_t)m->n_heads);
    return 2 * C * C + 2 * KVD * C + 3 * C * F + 2 * C;
}

uint64_t gt_model_param_count(const gt_model_config *m) {
    uint64_t C = (uint64_t)m->dim, V = (uint64_t)m->vocab_size;
    return (m->tie_word_embeddings ? 1 : 2) * V * C + (uint64_t)m->n_layers * block_params(m) + C;
}

void gt_unit_sizes(const gt_model_config *m, uint64_t *embed, uint64_t *block, uint64_t *head) {
    uint64_t C = (uint64_t)m->dim, V = (uint64_t)m->vocab_size;
    *embed = V * C;
    *block = block_params(m);
    *head = C + (m->tie_word_embeddings ? 0 : V * C);
}

void gt_layout_init_params_range(const gt_layout *layout, float *dst, size_t begin, size_t end, uint64_t seed) {
    const float std = 0.02f; /* as gt_layout_init_params */
    for (int i = 0; i < layout->n_tensors; i++) {
        const gt_tensor_info *t = &layout->tensors[i];
        size_t lo = t->offset > begin ? t->offset : begin;
        size_t hi = t->offset + t->numel < end ? t->offset + t->numel : end;
        if (lo >= hi) continue;
        float *p = dst + (lo - begin);
        size_t n = hi - lo;
        if (t->ndim == 1) {
            for (size_t j = 0; j < n; j++) p[j] = 1.0f;
        } else {
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < n; j++) p[j] = std * normal_at(seed, lo + j);
        }
    }
}

void gt_layout_init_params(const gt_layout *layout, float *params, uint64_t seed) {
    const float std = 0.02f; /* transformers' LlamaConfig.initializer_range */
    for (int i = 0; i < layout->n_tensors; i++) {
        const gt_tensor_info *t = &layout->tensors[i];
        float *p = params + t->offset;
        if (t->ndim == 1) {
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
        } else {
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < t->numel; j++) p[j] = std * normal_at(seed, t->offset + j);
        }
    }
}
