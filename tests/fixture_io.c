/* fixture_io.c — see fixture_io.h for the GTFX format. */
#include "fixture_io.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
    return -1;
}

static int rd_u32(const gt_fixture *fx, size_t *pos, uint32_t *v) {
    if (fx->size - *pos < 4 || *pos > fx->size) return -1;
    const unsigned char *p = fx->buf + *pos;
    *v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    *pos += 4;
    return 0;
}

int gt_fx_open(gt_fixture *fx, const char *path, char *err, size_t err_len) {
    memset(fx, 0, sizeof *fx);
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, err_len, "%s: cannot open", path);
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return fail(err, err_len, "%s: cannot seek", path); }
    long sz = ftell(f);
    rewind(f);
    if (sz < 12) { fclose(f); return fail(err, err_len, "%s: too short (%ld bytes)", path, sz); }
    fx->size = (size_t)sz;
    fx->buf = malloc(fx->size);
    if (!fx->buf || fread(fx->buf, 1, fx->size, f) != fx->size) {
        fclose(f);
        gt_fx_close(fx);
        return fail(err, err_len, "%s: read failed", path);
    }
    fclose(f);
    if (memcmp(fx->buf, "GTFX", 4) != 0) { gt_fx_close(fx); return fail(err, err_len, "%s: not a GTFX file", path); }
    size_t pos = 4;
    uint32_t version, count;
    rd_u32(fx, &pos, &version);
    rd_u32(fx, &pos, &count);
    if (version != 1) { gt_fx_close(fx); return fail(err, err_len, "%s: GTFX version %u, expected 1", path, version); }
    fx->records = calloc(count ? count : 1, sizeof *fx->records);
    if (!fx->records) { gt_fx_close(fx); return fail(err, err_len, "out of memory"); }
    for (uint32_t i = 0; i < count; i++) {
        gt_fx_record *r = &fx->records[i];
        uint32_t name_len, dtype, ndim;
        if (rd_u32(fx, &pos, &name_len) || name_len > fx->size - pos) goto truncated;
        r->name = malloc(name_len + 1);
        if (!r->name) { gt_fx_close(fx); return fail(err, err_len, "out of memory"); }
        memcpy(r->name, fx->buf + pos, name_len);
        r->name[name_len] = '\0';
        pos += name_len;
        fx->count = (int)i + 1;
        if (rd_u32(fx, &pos, &dtype) || rd_u32(fx, &pos, &ndim)) goto truncated;
        if (dtype > GT_FX_U8) { gt_fx_close(fx); return fail(err, err_len, "%s: record %u: bad dtype %u", path, i, dtype); }
        if (ndim > GT_FX_MAX_DIMS) { gt_fx_close(fx); return fail(err, err_len, "%s: record %u: ndim %u", path, i, ndim); }
        r->dtype = (int)dtype;
        r->ndim = (int)ndim;
        r->numel = 1;
        for (uint32_t d = 0; d < ndim; d++) {
            if (rd_u32(fx, &pos, &r->dims[d])) goto truncated;
            r->numel *= r->dims[d];
        }
        size_t esize = dtype == GT_FX_U8 ? 1 : 4;
        if (r->numel > (fx->size - pos) / esize) goto truncated;
        /* an aligned copy: records start at arbitrary byte offsets in the file */
        void *copy = malloc(r->numel > 0 ? r->numel * esize : 1);
        if (!copy) { gt_fx_close(fx); return fail(err, err_len, "out of memory"); }
        memcpy(copy, fx->buf + pos, r->numel * esize);
        r->data = copy;
        pos += r->numel * esize;
    }
    if (pos != fx->size) { gt_fx_close(fx); return fail(err, err_len, "%s: %zu trailing bytes", path, fx->size - pos); }
    fx->count = (int)count;
    return 0;
truncated:
    gt_fx_close(fx);
    return fail(err, err_len, "%s: truncated", path);
}

void gt_fx_close(gt_fixture *fx) {
    if (fx->records)
        for (int i = 0; i < fx->count; i++) {
            free(fx->records[i].name);
            free((void *)fx->records[i].data);
        }
    free(fx->records);
    free(fx->buf);
    memset(fx, 0, sizeof *fx);
}

const gt_fx_record *gt_fx_find(const gt_fixture *fx, const char *name) {
    for (int i = 0; i < fx->count; i++)
        if (strcmp(fx->records[i].name, name) == 0) return &fx->records[i];
    return NULL;
}

static const gt_fx_record *scalar(const gt_fixture *fx, const char *name, int dtype) {
    const gt_fx_record *r = gt_fx_find(fx, name);
    if (!r || r->dtype != dtype || r->numel != 1) {
        fprintf(stderr, "fixture: scalar record '%s' (%s) %s\n", name, dtype == GT_FX_F32 ? "f32" : "i32",
                r ? "has the wrong type or size" : "is missing");
        abort();
    }
    return r;
}

int32_t gt_fx_i32(const gt_fixture *fx, const char *name) {
    int32_t v;
    memcpy(&v, scalar(fx, name, GT_FX_I32)->data, 4);
    return v;
}

float gt_fx_f32(const gt_fixture *fx, const char *name) {
    float v;
    memcpy(&v, scalar(fx, name, GT_FX_F32)->data, 4);
    return v;
}
