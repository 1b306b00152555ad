/*
 * hf_config.c — reads a Hugging Face checkpoint directory's config.json (model.init) into the [model]
 * values it determines, with jansson, and merges them into a config: the [model] keys the INI leaves
 * out are taken, the ones it sets must agree (gt_config_apply_init, which config.c's loader calls);
 * hf_import.c reads the weights. Declared in config.h, so that config.c needs no header of the
 * importer.
 *
 * Both spellings of RoPE found in the wild are read: `rope_theta` + `rope_scaling` (published
 * checkpoints) and `rope_parameters` (what transformers 5 writes).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "errmsg.h"
#include "exitcodes.h"

typedef struct cfg_reader {
    const char *path;
    json_t *root;
    char *err;
    size_t err_len;
    int failed;
} cfg_reader;

static void cfg_fail(cfg_reader *r, const char *fmt, ...) {
    if (r->failed) return;
    r->failed = 1;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, r->err_len, "%s: %s", r->path, msg);
}

/* A positive integer key; `dflt` < 0 means required. A JSON null counts as absent. */
static int cfg_int(cfg_reader *r, json_t *obj, const char *key, long long dflt, long long max) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (dflt < 0) cfg_fail(r, "%s is missing (expected an integer)", key);
        return (int)(dflt < 0 ? 0 : dflt);
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > max) {
        cfg_fail(r, "%s is not an integer in 1..%lld", key, max);
        return 0;
    }
    return (int)json_integer_value(v);
}

static double cfg_num(cfg_reader *r, json_t *obj, const char *key, double dflt, int required) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) cfg_fail(r, "%s is missing (expected a number)", key);
        return dflt;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) <= 0) {
        cfg_fail(r, "%s is not a number > 0", key);
        return dflt;
    }
    return json_number_value(v);
}

static int cfg_bool(cfg_reader *r, json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        cfg_fail(r, "%s is not true or false", key);
        return 0;
    }
    return json_is_true(v);
}

static void read_rope(cfg_reader *r, gt_model_config *out) {
    json_t *root = r->root;
    json_t *params = json_object_get(root, "rope_parameters"), *scaling = json_object_get(root, "rope_scaling");
    json_t *rope = json_is_object(params) ? params : json_is_object(scaling) ? scaling : NULL;
    const char *rope_key = rope == params ? "rope_parameters" : "rope_scaling";
    /* rope_theta: inside rope_parameters (transformers 5), else at the top (LlamaConfig default 10000) */
    double theta = 10000.0;
    if (rope == params && json_object_get(params, "rope_theta"))
        theta = cfg_num(r, params, "rope_theta", theta, 1);
    else
        theta = cfg_num(r, root, "rope_theta", theta, 0);
    out->rope_theta = (float)theta;
    out->rope_type = GT_ROPE_DEFAULT;
    if (!rope) return;
    json_t *type = json_object_get(rope, "rope_type");
    if (!type) type = json_object_get(rope, "type"); /* the older spelling */
    if (!type || json_is_null(type) || (json_is_string(type) && strcmp(json_string_value(type), "default") == 0))
        return;
    if (!json_is_string(type)) {
        cfg_fail(r, "%s.rope_type is not a string", rope_key);
        return;
    }
    if (strcmp(json_string_value(type), "llama3") != 0) {
        cfg_fail(r, "%s.rope_type = \"%s\" is not supported (expected default or llama3)", rope_key,
                 json_string_value(type));
        return;
    }
    out->rope_type = GT_ROPE_LLAMA3;
    out->rope_factor = cfg_num(r, rope, "factor", 0, 1);
    out->rope_low_freq_factor = cfg_num(r, rope, "low_freq_factor", 0, 1);
    out->rope_high_freq_factor = cfg_num(r, rope, "high_freq_factor", 0, 1);
    out->rope_original_max_position_embeddings = cfg_int(r, rope, "original_max_position_embeddings", -1, 1 << 24);
    if (!r->failed && !(out->rope_high_freq_factor > out->rope_low_freq_factor))
        cfg_fail(r, "%s: high_freq_factor %g is not above low_freq_factor %g", rope_key, out->rope_high_freq_factor,
                 out->rope_low_freq_factor);
}

int gt_hf_read_config(const char *dir, gt_model_config *out, char *err, size_t err_len) {
    char path[GT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    gt_config defaults;
    gt_config_defaults(&defaults);
    *out = defaults.model;
    snprintf(out->init, sizeof out->init, "%s", dir);
    struct stat st;
    int st_rc = stat(dir, &st);
    if (st_rc != 0 || !S_ISDIR(st.st_mode)) /* e.g. "[model] init = /models/x: No such file or directory" */
        return gt_errorf(err, err_len, "[model] init = %s: %s (expected a Hugging Face checkpoint directory with "
                     "config.json and model.safetensors)", dir, st_rc != 0 ? strerror(errno) : "not a directory");
    FILE *f = fopen(path, "r");
    if (!f) return gt_errorf(err, err_len, "%s: cannot read: %s", path, strerror(errno));
    json_error_t jerr;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (!root) return gt_errorf(err, err_len, "%s:%d: not JSON: %s", path, jerr.line, jerr.text);
    cfg_reader r = {path, root, err, err_len, 0};
    if (!json_is_object(root)) cfg_fail(&r, "not a JSON object");

    json_t *v = json_object_get(root, "model_type");
    if (!r.failed && v && !(json_is_string(v) && strcmp(json_string_value(v), "llama") == 0))
        cfg_fail(&r, "model_type = %s is not supported (expected \"llama\")",
                 json_is_string(v) ? json_string_value(v) : "(not a string)");
    v = json_object_get(root, "hidden_act");
    if (!r.failed && v && !(json_is_string(v) && strcmp(json_string_value(v), "silu") == 0))
        cfg_fail(&r, "hidden_act = %s is not supported (expected \"silu\")",
                 json_is_string(v) ? json_string_value(v) : "(not a string)");
    if (!r.failed && cfg_bool(&r, root, "attention_bias"))
        cfg_fail(&r, "attention_bias = true is not supported (gtrain's LLaMA has no biases; expected false)");
    if (!r.failed && cfg_bool(&r, root, "mlp_bias"))
        cfg_fail(&r, "mlp_bias = true is not supported (gtrain's LLaMA has no biases; expected false)");

    out->dim = cfg_int(&r, root, "hidden_size", -1, 65536);
    out->n_layers = cfg_int(&r, root, "num_hidden_layers", -1, 1 << 20);
    out->n_heads = cfg_int(&r, root, "num_attention_heads", -1, 4096);
    out->n_kv_heads = cfg_int(&r, root, "num_key_value_heads", out->n_heads, 4096);
    out->vocab_size = cfg_int(&r, root, "vocab_size", -1, 1 << 24);
    out->ffn_dim = cfg_int(&r, root, "intermediate_size", -1, 1 << 20);
    out->max_seq_len = cfg_int(&r, root, "max_position_embeddings", 2048, 1 << 24);
    out->norm_eps = (float)cfg_num(&r, root, "rms_norm_eps", 1e-6, 0); /* LlamaConfig's default */
    out->tie_word_embeddings = cfg_bool(&r, root, "tie_word_embeddings");
    if (!r.failed && out->dim % out->n_heads != 0)
        cfg_fail(&r, "hidden_size %d is not a multiple of num_attention_heads %d", out->dim, out->n_heads);
    int head_dim = r.failed ? 0 : cfg_int(&r, root, "head_dim", out->dim / out->n_heads, 65536);
    if (!r.failed && head_dim != out->dim / out->n_heads)
        cfg_fail(&r, "head_dim = %d is not supported (expected hidden_size / num_attention_heads = %d)", head_dim,
                 out->dim / out->n_heads);
    if (!r.failed) read_rope(&r, out);
    json_decref(root);
    return r.failed ? GT_EXIT_BAD_INPUT : 0;
}

/* ------------------------------------------------------------------------------------------------
 * The merge into a config (gt_config_apply_init)
 * ---------------------------------------------------------------------------------------------- */

/* What config.json calls the [model] keys that change the model's function. */
static const struct {
    const char *key, *json;
} hf_names[] = {
    {"dim", "hidden_size"}, {"n_layers", "num_hidden_layers"}, {"n_heads", "num_attention_heads"},
    {"n_kv_heads", "num_key_value_heads"}, {"vocab_size", "vocab_size"}, {"ffn_dim", "intermediate_size"},
    {"norm_eps", "rms_norm_eps"}, {"rope_theta", "rope_theta"}, {"tie_word_embeddings", "tie_word_embeddings"},
    {"rope_type", "rope_type"}, {"rope_factor", "rope factor"}, {"rope_low_freq_factor", "rope low_freq_factor"},
    {"rope_high_freq_factor", "rope high_freq_factor"},
    {"rope_original_max_position_embeddings", "rope original_max_position_embeddings"},
};

int gt_config_apply_init(gt_config *cfg, int take, char *taken, size_t taken_len, char *err, size_t err_len) {
    if (taken_len) taken[0] = '\0';
    gt_config from = *cfg;
    if (gt_hf_read_config(cfg->model.init, &from.model, err, err_len) != 0) return GT_EXIT_BAD_INPUT;
    char mismatches[4096] = "";
    for (size_t i = 0; i < sizeof hf_names / sizeof hf_names[0]; i++) {
        const char *key = hf_names[i].key;
        if (strncmp(key, "rope_", 5) == 0 && strcmp(key, "rope_theta") != 0 && strcmp(key, "rope_type") != 0 &&
            from.model.rope_type != GT_ROPE_LLAMA3)
            continue; /* llama3's numbers mean nothing to default RoPE */
        char json_value[64], ini_value[64], expected[128];
        gt_config_key_text(&from, "model", key, json_value, sizeof json_value);
        gt_config_key_text(cfg, "model", key, ini_value, sizeof ini_value);
        int line = gt_config_key_line(cfg, "model", key);
        if (take && line == 0 && !gt_config_key_in_range(&from, "model", key, expected, sizeof expected)) {
            gt_appendf(mismatches, sizeof mismatches, "%s%s = %s is out of range for [model] %s (expected %s)",
                       mismatches[0] ? "; " : "", hf_names[i].json, json_value, key, expected);
        } else if (take && line == 0) {
            gt_config_key_copy(cfg, &from, "model", key);
            if (strcmp(json_value, ini_value) != 0) /* the note lists what changed, not defaults kept */
                gt_appendf(taken, taken_len, "%s%s = %s", taken[0] ? ", " : "", key, json_value);
        } else if (strcmp(json_value, ini_value) != 0) {
            char where[GT_PATH_MAX + 96];
            if (line > 0)
                snprintf(where, sizeof where, "%s:%d [model] %s", cfg->path, line, key);
            else if (line < 0)
                snprintf(where, sizeof where, "[model] %s (set on the command line)", key);
            else
                snprintf(where, sizeof where, "[model] %s (the default; %s does not set it)", key,
                         cfg->path[0] ? cfg->path : "the INI");
            gt_appendf(mismatches, sizeof mismatches, "%s%s = %s, but %s = %s", mismatches[0] ? "; " : "",
                       hf_names[i].json, json_value, where, ini_value);
        }
    }
    if (!mismatches[0]) return 0;
    snprintf(err, err_len, "%s/config.json: %s (expected the same values, or the keys left out of [model] so "
             "that they are taken from config.json)", cfg->model.init, mismatches);
    return GT_EXIT_BAD_INPUT;
}
