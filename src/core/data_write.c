/* gtrain token data, the writing side: the header of a gtrain shard and gt_data_writer, which
 * gtrain-prep writes shards with (a temporary file renamed into place once complete). data.h describes
 * the format; data.c reads it. */
#define _POSIX_C_SOURCE 200809L
#include "data.h"
#include "errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void wr32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void wr64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

void gt_data_encode_header(unsigned char out[GT_DATA_HEADER_BYTES], uint32_t token_bytes,
                           uint64_t token_count, uint32_t vocab_size) {
    memset(out, 0, GT_DATA_HEADER_BYTES);
    memcpy(out, GT_DATA_MAGIC, 8); /* includes the NUL */
    wr32(out + 8, GT_DATA_VERSION);
    wr32(out + 12, token_bytes);
    wr64(out + 16, token_count);
    wr32(out + 24, vocab_size);
    wr32(out + 28, 0);
}

/* ------------------------------------------------------------------ writing */

struct gt_data_writer {
    char *path, *tmp;
    FILE *f;
    int tb;
    uint32_t vocab;
    uint64_t count;
};

gt_data_writer *gt_data_writer_open(const char *path, int token_bytes, uint32_t vocab_size, char *err,
                                    size_t err_len) {
    if (token_bytes != 2 && token_bytes != 4) {
        gt_errorf(err, err_len, "%s: token_bytes %d must be 2 or 4", path, token_bytes);
        return NULL;
    }
    if (vocab_size == 0 || (token_bytes == 2 && vocab_size > 65536u) ||
        (token_bytes == 4 && vocab_size > (uint32_t)INT32_MAX)) {
        gt_errorf(err, err_len, "%s: vocab_size %u does not fit %d-byte tokens", path, vocab_size,
               token_bytes);
        return NULL;
    }
    gt_data_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path) + 32;
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n))) {
        if (w) free(w->path);
        free(w);
        gt_errorf(err, err_len, "%s: out of memory", path);
        return NULL;
    }
    snprintf(w->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        gt_errorf(err, err_len, "%s: cannot create: %s", w->tmp, strerror(errno));
        free(w->tmp);
        free(w->path);
        free(w);
        return NULL;
    }
    w->tb = token_bytes;
    w->vocab = vocab_size;
    unsigned char hdr[GT_DATA_HEADER_BYTES];
    gt_data_encode_header(hdr, (uint32_t)token_bytes, 0, vocab_size); /* count patched at finish */
    if (fwrite(hdr, 1, sizeof hdr, w->f) != sizeof hdr) {
        gt_errorf(err, err_len, "%s: write failed: %s", w->tmp, strerror(errno));
        gt_data_writer_abort(w);
        return NULL;
    }
    return w;
}

int gt_data_writer_append(gt_data_writer *w, const int32_t *tokens, size_t n, char *err,
                          size_t err_len) {
    unsigned char buf[4096];
    size_t per = sizeof buf / (size_t)w->tb, done = 0;
    while (done < n) {
        size_t k = n - done < per ? n - done : per;
        for (size_t i = 0; i < k; i++) {
            int32_t v = tokens[done + i];
            if (v < 0 || (uint32_t)v >= w->vocab) {
                gt_errorf(err, err_len, "%s: token %ld at position %llu is outside [0, %u)", w->path,
                       (long)v, (unsigned long long)(w->count + i), w->vocab);
                return -1;
            }
            for (int b = 0; b < w->tb; b++) buf[i * w->tb + b] = (unsigned char)((uint32_t)v >> (8 * b));
        }
        if (fwrite(buf, (size_t)w->tb, k, w->f) != k) {
            gt_errorf(err, err_len, "%s: write failed: %s", w->tmp, strerror(errno));
            return -1;
        }
        w->count += k;
        done += k;
    }
    return 0;
}

uint64_t gt_data_writer_count(const gt_data_writer *w) { return w->count; }

static void free_writer(gt_data_writer *w) {
    free(w->tmp);
    free(w->path);
    free(w);
}

void gt_data_writer_abort(gt_data_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    unlink(w->tmp);
    free_writer(w);
}

static void fsync_dir_of(const char *path) {
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *dn = ".";
    if (slash) {
        if (slash == dir) slash[1] = 0; else *slash = 0;
        dn = dir;
    }
    int fd = open(dn, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

int gt_data_writer_finish(gt_data_writer *w, char *err, size_t err_len) {
    unsigned char hdr[GT_DATA_HEADER_BYTES];
    gt_data_encode_header(hdr, (uint32_t)w->tb, w->count, w->vocab);
    FILE *f = w->f;
    w->f = NULL;
    int ok = fflush(f) == 0 && fseek(f, 0, SEEK_SET) == 0 && fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr &&
             fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        gt_errorf(err, err_len, "%s: write failed: %s", w->tmp, strerror(saved));
        gt_data_writer_abort(w);
        return -1;
    }
    if (rename(w->tmp, w->path) != 0) {
        gt_errorf(err, err_len, "%s: cannot rename %s into place: %s", w->path, w->tmp, strerror(errno));
        gt_data_writer_abort(w);
        return -1;
    }
    fsync_dir_of(w->path);
    free_writer(w);
    return 0;
}
