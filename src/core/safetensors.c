/*
 * safetensors.c — the safetensors header parser (see safetensors.h).
 *
 * Every entry is checked before the caller may use it: a supported dtype (BF16, F16, F32), at most 8
 * non-negative dimensions whose product cannot overflow, data_offsets [begin, end] with
 * begin <= end <= the data's length and end - begin = shape x dtype bytes. Errors are one line
 * naming the file and the tensor; the return value is 2, the trainer's exit code for bad input.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */

#include "safetensors.h"

#include "errmsg.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int dtype_of(const char *s, gt_st_dtype *d) {
    if (strcmp(s, "F32") == 0) *d = GT_ST_F32;
    else if (strcmp(s, "F16") == 0) *d = GT_ST_F16;
    else if (strcmp(s, "BF16") == 0) *d = GT_ST_BF16;
    else return -1;
    return 0;
}

size_t gt_st_dtype_bytes(gt_st_dtype d) { return d == GT_ST_F32 ? 4 : 2; }

uint64_t gt_st_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A non-negative JSON integer as uint64. */
static int json_u64(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

void gt_st_free(gt_st_header *h) {
    if (!h) return;
    for (int i = 0; i < h->n_tensors; i++) free(h->tensors[i].name);
    free(h->tensors);
    memset(h, 0, sizeof *h);
}

/* Checks one header entry, KEY: {"dtype", "shape", "data_offsets"} within data_len bytes of data,
 * into *t (all but the name). 0, or 2 with err. */
static int parse_entry(const char *file, const char *key, json_t *entry, uint64_t data_len, gt_st_tensor *t,
                       char *err, size_t err_len) {
    json_t *dtype = json_object_get(entry, "dtype"), *shape = json_object_get(entry, "shape");
    json_t *offs = json_object_get(entry, "data_offsets");
    if (!json_is_object(entry) || !json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offs) ||
        json_array_size(offs) != 2)
        return gt_errorf(err, err_len, "%s: tensor %s: expected {\"dtype\": ..., \"shape\": [...], "
                         "\"data_offsets\": [begin, end]} in the header", file, key);
    if (dtype_of(json_string_value(dtype), &t->dtype) != 0)
        return gt_errorf(err, err_len, "%s: tensor %s: dtype %.16s is not supported (expected BF16, F16 or "
                         "F32)", file, key, json_string_value(dtype));
    if (json_array_size(shape) > 8)
        return gt_errorf(err, err_len, "%s: tensor %s: %zu dimensions (expected at most 8)", file, key,
                         json_array_size(shape));
    t->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    int overflow = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (json_u64(json_array_get(shape, (size_t)d), &t->shape[d]) != 0)
            return gt_errorf(err, err_len, "%s: tensor %s: shape entry %d is not a non-negative integer", file,
                             key, d);
        if (t->shape[d] && numel > UINT64_MAX / 8 / t->shape[d]) overflow = 1;
        else numel *= t->shape[d];
    }
    if (json_u64(json_array_get(offs, 0), &t->begin) != 0 || json_u64(json_array_get(offs, 1), &t->end) != 0 ||
        t->begin > t->end)
        return gt_errorf(err, err_len, "%s: tensor %s: data_offsets are not [begin, end] with 0 <= begin <= "
                         "end", file, key);
    if (t->end > data_len)
        return gt_errorf(err, err_len, "%s: tensor %s: data_offsets [%llu, %llu] run past the end of the data "
                         "(%llu bytes after the header; truncated file?)", file, key, (unsigned long long)t->begin,
                         (unsigned long long)t->end, (unsigned long long)data_len);
    if (overflow || numel * gt_st_dtype_bytes(t->dtype) != t->end - t->begin) {
        unsigned long long need = overflow ? (unsigned long long)UINT64_MAX / 8
                                           : (unsigned long long)(numel * gt_st_dtype_bytes(t->dtype));
        return gt_errorf(err, err_len, "%s: tensor %s: data_offsets [%llu, %llu] hold %llu bytes, but its shape "
                         "and dtype %s need %s%llu", file, key, (unsigned long long)t->begin,
                         (unsigned long long)t->end, (unsigned long long)(t->end - t->begin),
                         json_string_value(dtype), overflow ? "more than " : "", need);
    }
    return 0;
}

int gt_st_parse(const char *file, const unsigned char *bytes, size_t len, uint64_t file_size, gt_st_header *out,
                char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    out->file_size = file_size;
    if (file_size < 8 || len < 8)
        return gt_errorf(err, err_len, "%s: %llu bytes, too short for a safetensors file (expected an 8-byte "
                         "header length first)", file, (unsigned long long)file_size);
    uint64_t n = gt_st_le64(bytes);
    if (n > GT_ST_HEADER_MAX)
        return gt_errorf(err, err_len, "%s: header length %llu is over the format's 100 MiB limit (not a "
                         "safetensors file?)", file, (unsigned long long)n);
    if (n > file_size - 8 || n > len - 8)
        return gt_errorf(err, err_len, "%s: header length %llu runs past the end of the file (%llu bytes; "
                         "truncated?)", file, (unsigned long long)n, (unsigned long long)file_size);
    out->data_start = 8 + n;
    uint64_t data_len = file_size - out->data_start;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)bytes + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return gt_errorf(err, err_len, "%s: the header is not JSON (%s, at byte %d of the header)", file,
                         jerr.text, jerr.position);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = gt_errorf(err, err_len, "%s: the header is not a JSON object", file);
        goto done;
    }
    out->tensors = calloc(json_object_size(root) + 1, sizeof *out->tensors);
    if (!out->tensors) {
        rc = gt_errorf(err, err_len, "%s: out of memory for %zu tensors", file, json_object_size(root));
        goto done;
    }
    const char *key;
    json_t *entry;
    json_object_foreach(root, key, entry) {
        if (strcmp(key, "__metadata__") == 0) continue;
        gt_st_tensor *t = &out->tensors[out->n_tensors];
        if ((rc = parse_entry(file, key, entry, data_len, t, err, err_len)) != 0) goto done;
        t->name = strdup(key);
        if (!t->name) {
            rc = gt_errorf(err, err_len, "%s: out of memory", file);
            goto done;
        }
        out->n_tensors++;
    }
done:
    json_decref(root);
    if (rc) gt_st_free(out);
    return rc;
}

