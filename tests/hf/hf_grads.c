/*
 * hf_grads.c — the loss and every parameter gradient of one batch, computed by gtrain's model on a
 * Hugging Face checkpoint it imported (src/core/hf_import.h), for tests/hf/hf_test.py to compare with
 * transformers' own.
 *
 *   hf_grads HF_DIR BATCH OUT_PREFIX
 *
 * BATCH: int32 little-endian B, T, then B*T input ids and B*T target ids. Writes OUT_PREFIX.txt
 * ("loss L", "inv_freq f0 f1 ...", then "NAME NUMEL" per tensor in layout order), OUT_PREFIX.bin
 * (the gradients as fp32, in that order) and OUT_PREFIX.params.bin (the imported fp32 parameters, in
 * the same order). The loss is the mean over the tokens, as transformers'.
 *
 * It also checks one property itself: the gradients are bit-identical under the recompute policies
 * none, full and selective (tied embeddings and llama3 RoPE included). Exit 0, 1 on a failed check,
 * 2 when the checkpoint cannot be imported.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_import.h"
#include "memtrack.h"
#include "model.h"
#include "ops.h"
#include "recompute.h"

static void *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* grads (n_params) of one micro-batch under `policy`; returns the mean loss */
static double grads_under(gt_model *model, const char *policy_text, int n_layers, const int32_t *in,
                          const int32_t *tg, int B, int T, float *grads_host, size_t n) {
    gt_policy policy;
    gt_plan plan;
    char err[256];
    if (gt_policy_parse(policy_text, n_layers, &policy, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    gt_plan_from_policy(&plan, &policy, n_layers);
    memset(gt_model_grads(model), 0, n * sizeof(float));
    int recomputed = 0;
    gt_rng_key key = {1, 2};
    double sum = gt_model_train_micro(model, &plan, in, tg, B, T, 1.0f / (float)(B * T), key, &recomputed);
    memcpy(grads_host, gt_model_grads(model), n * sizeof(float));
    return sum / (double)(B * T);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: hf_grads HF_DIR BATCH OUT_PREFIX\n");
        return 2;
    }
    char err[2048];
    gt_model_config cfg;
    if (gt_hf_read_config(argv[1], &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "hf_grads: %s\n", err);
        return 2;
    }
    size_t len = 0;
    int32_t *batch = read_all(argv[2], &len);
    if (!batch || len < 8) {
        fprintf(stderr, "hf_grads: cannot read %s\n", argv[2]);
        return 2;
    }
    int B = batch[0], T = batch[1];
    if (len != (size_t)(2 + 2 * B * T) * 4) {
        fprintf(stderr, "hf_grads: %s: %zu bytes, expected %d\n", argv[2], len, (2 + 2 * B * T) * 4);
        return 2;
    }
    const int32_t *in = batch + 2, *tg = batch + 2 + B * T;
    cfg.max_seq_len = T;

    gt_layout layout;
    gt_layout_init(&layout, &cfg);
    size_t n = layout.n_params;
    float *params = malloc(n * sizeof *params);
    int n_files = 0;
    if (gt_hf_read_slice(argv[1], &layout, 0, n, params, &n_files, err, sizeof err) != 0) {
        fprintf(stderr, "hf_grads: %s\n", err);
        return 2;
    }
    printf("hf_grads: %zu parameters from %d file(s), %d tensors, rope %s, %s embeddings\n", n, n_files,
           layout.n_tensors, gt_rope_type_name(cfg.rope_type), cfg.tie_word_embeddings ? "tied" : "untied");

    const gt_ops *ops = gt_ops_cpu();
    gt_mem mem;
    gt_mem_init(&mem, ops);
    gt_model *model = gt_model_create(ops, &mem, &cfg);
    gt_model_set_params(model, params);

    float *g_none = malloc(n * sizeof(float)), *g_other = malloc(n * sizeof(float));
    double loss = grads_under(model, "none", cfg.n_layers, in, tg, B, T, g_none, n);
    int failed = 0;
    const char *others[] = {"full", "selective"};
    for (int p = 0; p < 2; p++) {
        double l = grads_under(model, others[p], cfg.n_layers, in, tg, B, T, g_other, n);
        int same = memcmp(g_none, g_other, n * sizeof(float)) == 0 && l == loss;
        printf("%s: gradients under recompute %s %s those under none\n", same ? "ok" : "FAIL", others[p],
               same ? "are bit-identical to" : "differ from");
        failed |= !same;
    }

    char path[4096];
    snprintf(path, sizeof path, "%s.txt", argv[3]);
    FILE *txt = fopen(path, "w");
    snprintf(path, sizeof path, "%s.bin", argv[3]);
    FILE *bin = fopen(path, "wb");
    if (!txt || !bin) {
        fprintf(stderr, "hf_grads: cannot write %s.*\n", argv[3]);
        return 2;
    }
    fprintf(txt, "loss %.17g\ninv_freq", loss);
    int half = cfg.dim / cfg.n_heads / 2;
    float *inv_freq = malloc((size_t)half * sizeof *inv_freq);
    gt_rope_inv_freq(&cfg, inv_freq);
    for (int i = 0; i < half; i++) fprintf(txt, " %.9g", inv_freq[i]);
    fprintf(txt, "\n");
    for (int i = 0; i < layout.n_tensors; i++)
        fprintf(txt, "%s %zu\n", layout.tensors[i].name, layout.tensors[i].numel);
    fwrite(g_none, sizeof(float), n, bin);
    fclose(txt);
    fclose(bin);
    snprintf(path, sizeof path, "%s.params.bin", argv[3]);
    FILE *pf = fopen(path, "wb");
    if (!pf || fwrite(params, sizeof(float), n, pf) != n || fclose(pf) != 0) {
        fprintf(stderr, "hf_grads: cannot write %s\n", path);
        return 2;
    }

    free(inv_freq);
    free(g_none);
    free(g_other);
    free(params);
    free(batch);
    gt_model_destroy(model);
    gt_layout_free(&layout);
    return failed;
}
