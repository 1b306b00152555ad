/*
 * hf_import.c — Hugging Face checkpoint directories in (see hf_import.h).
 *
 * Two JSON documents are read here with jansson (Debian's libjansson): config.json and the optional
 * model.safetensors.index.json ({"weight_map": {tensor: file}}); safetensors.c parses and checks
 * the header of each safetensors file (the header length against the file size, each tensor's byte
 * range against the data area and against shape x dtype), so a truncated file or a header whose
 * offsets lie is an error message, never a read past the end.
 *
 * Reading a slice walks the layout's tensors in flat order, intersects each with [begin, end) and
 * pread()s just those bytes, in bounded chunks, converting to fp32 on the way (the host must be
 * little-endian, as safetensors is; checked at run time).
 */
#define _POSIX_C_SOURCE 200809L /* pread, strdup */

#include "hf_import.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_ELEMS (1u << 20)   /* elements converted per read */

static int failf(char *err, size_t err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
    return 2;
}

/* ------------------------------------------------------------------ config.json */

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
        return failf(err, err_len, "[model] init = %s: %s (expected a Hugging Face checkpoint directory with "
                     "config.json and model.safetensors)", dir, st_rc != 0 ? strerror(errno) : "not a directory");
    FILE *f = fopen(path, "r");
    if (!f) return failf(err, err_len, "%s: cannot read: %s", path, strerror(errno));
    json_error_t jerr;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (!root) return failf(err, err_len, "%s:%d: not JSON: %s", path, jerr.line, jerr.text);
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
    return r.failed ? 2 : 0;
}

/* "run.ini:12 [model] dim", "[model] dim (set on the command line)" or "[model] dim (the default; run.ini
 * does not set it)": where the value compared with config.json came from. */
static const char *ini_key(const gt_config *cfg, const char *key, char *buf, size_t len) {
    int line = gt_config_key_line(cfg, "model", key);
    if (line > 0)
        snprintf(buf, len, "%s:%d [model] %s", cfg->path, line, key);
    else if (line < 0)
        snprintf(buf, len, "[model] %s (set on the command line)", key);
    else
        snprintf(buf, len, "[model] %s (the default; %s does not set it)", key, cfg->path[0] ? cfg->path : "the INI");
    return buf;
}

int gt_hf_check_config(const char *dir, const gt_config *cfg, char *err, size_t err_len) {
    const gt_model_config *m = &cfg->model;
    gt_model_config hf;
    if (gt_hf_read_config(dir, &hf, err, err_len) != 0) return 2;
    char where[GT_PATH_MAX + 32], k[GT_PATH_MAX + 96];
    snprintf(where, sizeof where, "%s/config.json", dir);
#define SAME_INT(hf_key, key)                                                                                  \
    if (hf.key != m->key)                                                                                      \
        return failf(err, err_len, "%s: %s = %d, but %s = %d (expected the same value)", where, hf_key, hf.key, \
                     ini_key(cfg, #key, k, sizeof k), m->key);
    SAME_INT("hidden_size", dim)
    SAME_INT("num_hidden_layers", n_layers)
    SAME_INT("num_attention_heads", n_heads)
    SAME_INT("num_key_value_heads", n_kv_heads)
    SAME_INT("vocab_size", vocab_size)
    SAME_INT("intermediate_size", ffn_dim)
#undef SAME_INT
    if (hf.norm_eps != m->norm_eps)
        return failf(err, err_len, "%s: rms_norm_eps = %g, but %s = %g (expected the same value)", where, hf.norm_eps,
                     ini_key(cfg, "norm_eps", k, sizeof k), m->norm_eps);
    if (hf.rope_theta != m->rope_theta)
        return failf(err, err_len, "%s: rope_theta = %g, but %s = %g (expected the same value)", where,
                     hf.rope_theta, ini_key(cfg, "rope_theta", k, sizeof k), m->rope_theta);
    if (hf.tie_word_embeddings != m->tie_word_embeddings)
        return failf(err, err_len, "%s: tie_word_embeddings = %s, but %s = %s (expected the same value)", where,
                     hf.tie_word_embeddings ? "true" : "false", ini_key(cfg, "tie_word_embeddings", k, sizeof k),
                     m->tie_word_embeddings ? "true" : "false");
    int m_llama3 = m->rope_type == GT_ROPE_LLAMA3;
    if (hf.rope_type != m->rope_type)
        return failf(err, err_len, "%s: rope_type = %s, but %s = %s (expected the same value)", where,
                     gt_rope_type_name(hf.rope_type), ini_key(cfg, "rope_type", k, sizeof k),
                     gt_rope_type_name(m->rope_type));
    if (m_llama3) {
#define SAME_NUM(hf_key, key)                                                                                  \
    if ((double)hf.key != (double)m->key)                                                                      \
        return failf(err, err_len, "%s: rope %s = %g, but %s = %g (expected the same value)", where, hf_key,    \
                     (double)hf.key, ini_key(cfg, #key, k, sizeof k), (double)m->key);
        SAME_NUM("factor", rope_factor)
        SAME_NUM("low_freq_factor", rope_low_freq_factor)
        SAME_NUM("high_freq_factor", rope_high_freq_factor)
        SAME_NUM("original_max_position_embeddings", rope_original_max_position_embeddings)
#undef SAME_NUM
    }
    return 0;
}

/* ------------------------------------------------------------------ checkpoint files */

typedef struct st_file {
    char path[GT_PATH_MAX + 64];
    int fd;
    gt_st_header header;
} st_file;

typedef struct checkpoint {
    int n_files;
    st_file *files;
} checkpoint;

static void checkpoint_close(checkpoint *c) {
    for (int i = 0; i < c->n_files; i++) {
        if (c->files[i].fd >= 0) close(c->files[i].fd);
        gt_st_free(&c->files[i].header);
    }
    free(c->files);
    memset(c, 0, sizeof *c);
}

static int open_st(st_file *f, char *err, size_t err_len) {
    f->fd = open(f->path, O_RDONLY);
    if (f->fd < 0) return failf(err, err_len, "%s: cannot open: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return failf(err, err_len, "%s: not a regular file", f->path);
    uint64_t size = (uint64_t)st.st_size;
    unsigned char head[8] = {0};
    ssize_t got = size >= 8 ? pread(f->fd, head, 8, 0) : 0;
    size_t want = 8;
    if (got == 8) {
        uint64_t n = gt_st_le64(head);
        if (n <= GT_ST_HEADER_MAX && n <= size - 8) want = 8 + (size_t)n;
    }
    unsigned char *buf = malloc(want);
    if (!buf) return failf(err, err_len, "%s: out of memory for the header", f->path);
    size_t have = 0;
    while (have < want) {
        ssize_t r = pread(f->fd, buf + have, want - have, (off_t)have);
        if (r <= 0) break;
        have += (size_t)r;
    }
    int rc = gt_st_parse(f->path, buf, have, size, &f->header, err, err_len);
    free(buf);
    return rc;
}

static int valid_file_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

/* Lists the safetensors files of dir: the index's files in order of first appearance, or
 * model.safetensors alone. Opens each and parses its header. */
static int checkpoint_open(const char *dir, checkpoint *c, char *err, size_t err_len) {
    memset(c, 0, sizeof *c);
    char index_path[GT_PATH_MAX + 64];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    char **names = NULL;
    int n = 0, rc = 0;
    struct stat st;
    if (stat(index_path, &st) == 0) {
        json_error_t jerr;
        json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
        if (!root) return failf(err, err_len, "%s:%d: not JSON: %s", index_path, jerr.line, jerr.text);
        json_t *map = json_object_get(root, "weight_map");
        if (!json_is_object(map)) {
            json_decref(root);
            return failf(err, err_len, "%s: no \"weight_map\" object (expected {\"weight_map\": {tensor: file}})",
                         index_path);
        }
        names = calloc(json_object_size(map) + 1, sizeof *names);
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            if (!json_is_string(v) || !valid_file_name(json_string_value(v))) {
                rc = failf(err, err_len, "%s: tensor %s: the file name is not a plain file name in this directory",
                           index_path, key);
                break;
            }
            int seen = 0;
            for (int i = 0; i < n && !seen; i++) seen = strcmp(names[i], json_string_value(v)) == 0;
            if (!seen) names[n++] = strdup(json_string_value(v));
        }
        json_decref(root);
        if (!rc && n == 0) rc = failf(err, err_len, "%s: the weight_map is empty", index_path);
    } else {
        char single[GT_PATH_MAX + 64];
        snprintf(single, sizeof single, "%s/model.safetensors", dir);
        if (stat(single, &st) != 0)
            return failf(err, err_len, "%s: no model.safetensors and no model.safetensors.index.json (expected a "
                         "Hugging Face checkpoint saved with safetensors)", dir);
        names = calloc(2, sizeof *names);
        names[n++] = strdup("model.safetensors");
    }
    if (!rc) {
        c->files = calloc((size_t)n, sizeof *c->files);
        for (int i = 0; i < n; i++) c->files[i].fd = -1;
        c->n_files = n;
        for (int i = 0; i < n && !rc; i++) {
            snprintf(c->files[i].path, sizeof c->files[i].path, "%s/%s", dir, names[i]);
            rc = open_st(&c->files[i], err, err_len);
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc) checkpoint_close(c);
    return rc;
}

/* Tensors a LLaMA checkpoint may carry that the model does not need. */
static int ignorable(const gt_layout *layout, const char *name) {
    size_t len = strlen(name), suffix = strlen("rotary_emb.inv_freq");
    if (len >= suffix && strcmp(name + len - suffix, "rotary_emb.inv_freq") == 0) return 1;
    return layout->cfg.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0;
}

/* fp16 -> fp32, subnormals, infinities and NaN included. */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            mant <<= 1;
            e++;
        } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void to_fp32(float *out, const unsigned char *raw, size_t n, gt_st_dtype dtype) {
    if (dtype == GT_ST_F32) {
        memcpy(out, raw, n * 4);
    } else if (dtype == GT_ST_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)(raw[2 * i] | (raw[2 * i + 1] << 8)) << 16;
            memcpy(&out[i], &bits, 4);
        }
    } else {
        for (size_t i = 0; i < n; i++) out[i] = half_to_float((uint16_t)(raw[2 * i] | (raw[2 * i + 1] << 8)));
    }
}

static void format_st_shape(const gt_st_tensor *t, char *out, size_t len) {
    size_t used = (size_t)snprintf(out, len, "[");
    for (int d = 0; d < t->ndim && used < len; d++)
        used += (size_t)snprintf(out + used, len - used, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    if (used < len) snprintf(out + used, len - used, "]");
}

int gt_hf_read_slice(const char *dir, const gt_layout *layout, size_t begin, size_t end, float *out, int *n_files,
                     char *err, size_t err_len) {
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1)
        return failf(err, err_len, "%s: reading safetensors needs a little-endian host", dir);
    checkpoint c;
    if (checkpoint_open(dir, &c, err, err_len) != 0) return 2;
    if (n_files) *n_files = c.n_files;
    int rc = 0;
    /* where each layout tensor is: (file, tensor) */
    int *at_file = calloc((size_t)layout->n_tensors + 1, sizeof *at_file);
    int *at_tensor = calloc((size_t)layout->n_tensors + 1, sizeof *at_tensor);
    unsigned char *raw = malloc((size_t)CHUNK_ELEMS * 4);
    if (!at_file || !at_tensor || !raw) {
        rc = failf(err, err_len, "%s: out of memory", dir);
        goto done;
    }
    for (int i = 0; i < layout->n_tensors; i++) at_file[i] = -1;
    for (int f = 0; f < c.n_files && !rc; f++) {
        const gt_st_header *h = &c.files[f].header;
        for (int k = 0; k < h->n_tensors && !rc; k++) {
            const gt_st_tensor *t = &h->tensors[k];
            int li = -1;
            for (int i = 0; i < layout->n_tensors && li < 0; i++)
                if (strcmp(layout->tensors[i].name, t->name) == 0) li = i;
            if (li < 0) {
                if (!ignorable(layout, t->name))
                    rc = failf(err, err_len, "%s: tensor %s is not part of the model [model] describes (a LLaMA "
                               "with %d layers%s)", c.files[f].path, t->name, layout->cfg.n_layers,
                               layout->cfg.tie_word_embeddings ? ", tied embeddings" : "");
                continue;
            }
            if (at_file[li] >= 0) {
                rc = failf(err, err_len, "%s: tensor %s is also in %s", c.files[f].path, t->name,
                           c.files[at_file[li]].path);
                continue;
            }
            const gt_tensor_info *lt = &layout->tensors[li];
            int same = t->ndim == lt->ndim && t->shape[0] == (uint64_t)lt->shape[0] &&
                       (lt->ndim == 1 || t->shape[1] == (uint64_t)lt->shape[1]);
            if (!same) {
                char have[128];
                format_st_shape(t, have, sizeof have);
                if (lt->ndim == 1)
                    rc = failf(err, err_len, "%s: tensor %s has shape %s (expected [%d] from [model])",
                               c.files[f].path, t->name, have, lt->shape[0]);
                else
                    rc = failf(err, err_len, "%s: tensor %s has shape %s (expected [%d, %d] from [model])",
                               c.files[f].path, t->name, have, lt->shape[0], lt->shape[1]);
                continue;
            }
            at_file[li] = f;
            at_tensor[li] = k;
        }
    }
    for (int i = 0; i < layout->n_tensors && !rc; i++)
        if (at_file[i] < 0)
            rc = failf(err, err_len, "%s: tensor %s is in none of the %d safetensors file%s", dir,
                       layout->tensors[i].name, c.n_files, c.n_files == 1 ? "" : "s");

    /* this slice's bytes only */
    for (int i = 0; i < layout->n_tensors && !rc; i++) {
        const gt_tensor_info *lt = &layout->tensors[i];
        size_t lo = lt->offset > begin ? lt->offset : begin;
        size_t hi = lt->offset + lt->numel < end ? lt->offset + lt->numel : end;
        if (lo >= hi) continue;
        const st_file *f = &c.files[at_file[i]];
        const gt_st_tensor *t = &f->header.tensors[at_tensor[i]];
        size_t eb = gt_st_dtype_bytes(t->dtype);
        for (size_t e = lo; e < hi && !rc; e += CHUNK_ELEMS) {
            size_t n = hi - e < CHUNK_ELEMS ? hi - e : CHUNK_ELEMS;
            uint64_t pos = f->header.data_start + t->begin + (uint64_t)(e - lt->offset) * eb;
            size_t want = n * eb, have = 0;
            while (have < want) {
                ssize_t r = pread(f->fd, raw + have, want - have, (off_t)(pos + have));
                if (r <= 0) break;
                have += (size_t)r;
            }
            if (have < want) {
                rc = failf(err, err_len, "%s: tensor %s: short read at byte %llu (the file changed or is truncated)",
                           f->path, t->name, (unsigned long long)(pos + have));
                break;
            }
            to_fp32(out + (e - begin), raw, n, t->dtype);
        }
    }
done:
    free(raw);
    free(at_file);
    free(at_tensor);
    checkpoint_close(&c);
    return rc;
}
