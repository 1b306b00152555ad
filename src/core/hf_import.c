/*
 * hf_import.c — Hugging Face checkpoint directories in (see hf_import.h).
 *
 * The optional model.safetensors.index.json ({"weight_map": {tensor: file}}) is read here with jansson
 * (config.json is hf_config.c's); safetensors.c parses and checks
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
#include "errmsg.h"
#include "exitcodes.h"

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

/* ------------------------------------------------------------------ config.json */

int gt_hf_check_config(const char *dir, const gt_config *cfg, char *err, size_t err_len) {
    gt_config copy = *cfg;
    snprintf(copy.model.init, sizeof copy.model.init, "%s", dir);
    return gt_config_apply_init(&copy, 0, NULL, 0, err, err_len);
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
    if (f->fd < 0) return gt_errorf(err, err_len, "%s: cannot open: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return gt_errorf(err, err_len, "%s: not a regular file", f->path);
    uint64_t size = (uint64_t)st.st_size;
    unsigned char head[8] = {0};
    ssize_t got = size >= 8 ? pread(f->fd, head, 8, 0) : 0;
    size_t want = 8;
    if (got == 8) {
        uint64_t n = gt_st_le64(head);
        if (n <= GT_ST_HEADER_MAX && n <= size - 8) want = 8 + (size_t)n;
    }
    unsigned char *buf = malloc(want);
    if (!buf) return gt_errorf(err, err_len, "%s: out of memory for the header", f->path);
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
        if (!root) return gt_errorf(err, err_len, "%s:%d: not JSON: %s", index_path, jerr.line, jerr.text);
        json_t *map = json_object_get(root, "weight_map");
        if (!json_is_object(map)) {
            json_decref(root);
            return gt_errorf(err, err_len, "%s: no \"weight_map\" object (expected {\"weight_map\": {tensor: file}})",
                         index_path);
        }
        names = calloc(json_object_size(map) + 1, sizeof *names);
        const char *key;
        json_t *v;
        json_object_foreach(map, key, v) {
            if (!json_is_string(v) || !valid_file_name(json_string_value(v))) {
                rc = gt_errorf(err, err_len, "%s: tensor %s: the file name is not a plain file name in this directory",
                           index_path, key);
                break;
            }
            int seen = 0;
            for (int i = 0; i < n && !seen; i++) seen = strcmp(names[i], json_string_value(v)) == 0;
            if (!seen) names[n++] = strdup(json_string_value(v));
        }
        json_decref(root);
        if (!rc && n == 0) rc = gt_errorf(err, err_len, "%s: the weight_map is empty", index_path);
    } else {
        char single[GT_PATH_MAX + 64];
        snprintf(single, sizeof single, "%s/model.safetensors", dir);
        if (stat(single, &st) != 0)
            return gt_errorf(err, err_len, "%s: no model.safetensors and no model.safetensors.index.json (expected a "
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
        return gt_errorf(err, err_len, "%s: reading safetensors needs a little-endian host", dir);
    checkpoint c;
    if (checkpoint_open(dir, &c, err, err_len) != 0) return GT_EXIT_BAD_INPUT;
    if (n_files) *n_files = c.n_files;
    int rc = 0;
    /* where each layout tensor is: (file, tensor) */
    int *at_file = calloc((size_t)layout->n_tensors + 1, sizeof *at_file);
    int *at_tensor = calloc((size_t)layout->n_tensors + 1, sizeof *at_tensor);
    unsigned char *raw = malloc((size_t)CHUNK_ELEMS * 4);
    if (!at_file || !at_tensor || !raw) {
        rc = gt_errorf(err, err_len, "%s: out of memory", dir);
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
                    rc = gt_errorf(err, err_len, "%s: tensor %s is not part of the model [model] describes (a LLaMA "
                               "with %d layers%s)", c.files[f].path, t->name, layout->cfg.n_layers,
                               layout->cfg.tie_word_embeddings ? ", tied embeddings" : "");
                continue;
            }
            if (at_file[li] >= 0) {
                rc = gt_errorf(err, err_len, "%s: tensor %s is also in %s", c.files[f].path, t->name,
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
                    rc = gt_errorf(err, err_len, "%s: tensor %s has shape %s (expected [%d] from [model])",
                               c.files[f].path, t->name, have, lt->shape[0]);
                else
                    rc = gt_errorf(err, err_len, "%s: tensor %s has shape %s (expected [%d, %d] from [model])",
                               c.files[f].path, t->name, have, lt->shape[0], lt->shape[1]);
                continue;
            }
            at_file[li] = f;
            at_tensor[li] = k;
        }
    }
    for (int i = 0; i < layout->n_tensors && !rc; i++)
        if (at_file[i] < 0)
            rc = gt_errorf(err, err_len, "%s: tensor %s is in none of the %d safetensors file%s", dir,
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
                rc = gt_errorf(err, err_len, "%s: tensor %s: short read at byte %llu (the file changed or is truncated)",
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
