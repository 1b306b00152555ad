/* gtrain token data: see data.h for the file format and the sampling rules. */
#define _POSIX_C_SOURCE 200809L
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct gt_data {
    char *path;
    const unsigned char *map; /* whole file */
    size_t map_len;
    const unsigned char *tok; /* map + 32 */
    uint64_t count;
    uint32_t vocab;
    int tb;
    int max_tok; /* cached, -1 = not yet scanned */
};

static void seterr(char *err, size_t len, const char *fmt, ...) {
    if (!err || !len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
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

/* ------------------------------------------------------------------ reading */

gt_data *gt_data_open(const char *path, char *err, size_t err_len) {
    if (!path || !*path) {
        seterr(err, err_len, "token data: no file name given");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, err_len, "%s: cannot open token data file: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        seterr(err, err_len, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        seterr(err, err_len, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    uint64_t fsize = (uint64_t)st.st_size;
    if (fsize < GT_DATA_HEADER_BYTES) {
        seterr(err, err_len, "%s: truncated header: file has %llu bytes, a gtrain token file has a "
               "%d-byte header", path, (unsigned long long)fsize, GT_DATA_HEADER_BYTES);
        close(fd);
        return NULL;
    }
    if (fsize > (uint64_t)SIZE_MAX) {
        seterr(err, err_len, "%s: file too large to map", path);
        close(fd);
        return NULL;
    }
    void *m = mmap(NULL, (size_t)fsize, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        seterr(err, err_len, "%s: mmap failed: %s", path, strerror(errno));
        return NULL;
    }
    const unsigned char *h = m;
    const char *why = NULL;
    char buf[200];
    uint32_t version = rd32(h + 8), tb = rd32(h + 12), vocab = rd32(h + 24), reserved = rd32(h + 28);
    uint64_t count = rd64(h + 16);
    if (memcmp(h, GT_DATA_MAGIC, 8) != 0) {
        why = "bad magic (not a gtrain token file; expected \"GTRNTOK\\0\" in the first 8 bytes; "
              "make one with gtrain-prep)";
    } else if (version != GT_DATA_VERSION) {
        snprintf(buf, sizeof buf, "unsupported format version %u (this gtrain reads version %u)",
                 version, GT_DATA_VERSION);
        why = buf;
    } else if (tb != 2 && tb != 4) {
        snprintf(buf, sizeof buf, "unsupported token width token_bytes=%u (must be 2 or 4)", tb);
        why = buf;
    } else if (vocab == 0) {
        why = "vocab_size is 0";
    } else if (tb == 2 && vocab > 65536u) {
        snprintf(buf, sizeof buf, "vocab_size %u does not fit 2-byte tokens (max 65536)", vocab);
        why = buf;
    } else if (reserved != 0) {
        snprintf(buf, sizeof buf, "reserved header field is %u, must be 0", reserved);
        why = buf;
    } else if (count > (UINT64_MAX - GT_DATA_HEADER_BYTES) / tb ||
               fsize != GT_DATA_HEADER_BYTES + count * tb) {
        snprintf(buf, sizeof buf,
                 "size mismatch: header says %llu tokens of %u bytes (%llu bytes with the header) "
                 "but the file has %llu bytes (truncated or corrupt?)",
                 (unsigned long long)count, tb,
                 count > (UINT64_MAX - GT_DATA_HEADER_BYTES) / tb
                     ? 0ULL : (unsigned long long)(GT_DATA_HEADER_BYTES + count * tb),
                 (unsigned long long)fsize);
        why = buf;
    } else if (count < 2) {
        snprintf(buf, sizeof buf, "too few tokens: %llu (need at least 2, and seq_len+1 to train)",
                 (unsigned long long)count);
        why = buf;
    }
    if (why) {
        seterr(err, err_len, "%s: %s", path, why);
        munmap(m, (size_t)fsize);
        return NULL;
    }
    gt_data *d = calloc(1, sizeof *d);
    char *p = d ? strdup(path) : NULL;
    if (!d || !p) {
        free(d);
        munmap(m, (size_t)fsize);
        seterr(err, err_len, "%s: out of memory", path);
        return NULL;
    }
    d->path = p;
    d->map = m;
    d->map_len = (size_t)fsize;
    d->tok = h + GT_DATA_HEADER_BYTES;
    d->count = count;
    d->vocab = vocab;
    d->tb = (int)tb;
    d->max_tok = -1;
#ifdef MADV_RANDOM
    madvise(m, (size_t)fsize, MADV_RANDOM);
#endif
    return d;
}

void gt_data_close(gt_data *d) {
    if (!d) return;
    munmap((void *)d->map, d->map_len);
    free(d->path);
    free(d);
}

const char *gt_data_path(const gt_data *d) { return d->path; }
uint64_t gt_data_token_count(const gt_data *d) { return d->count; }
uint32_t gt_data_vocab_size(const gt_data *d) { return d->vocab; }
int gt_data_token_bytes(const gt_data *d) { return d->tb; }

int32_t gt_data_token(const gt_data *d, uint64_t i) {
    if (d->tb == 2) {
        const unsigned char *p = d->tok + 2 * i;
        return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8);
    }
    uint32_t v = rd32(d->tok + 4 * i);
    return v > (uint32_t)INT32_MAX ? INT32_MAX : (int32_t)v;
}

int gt_data_max_token(const gt_data *d) {
    if (d->max_tok >= 0) return d->max_tok;
    int32_t mx = 0;
    if (d->tb == 2) {
        for (uint64_t i = 0; i < d->count; i++) {
            int32_t v = (int32_t)((uint32_t)d->tok[2 * i] | (uint32_t)d->tok[2 * i + 1] << 8);
            if (v > mx) mx = v;
        }
    } else {
        for (uint64_t i = 0; i < d->count; i++) {
            int32_t v = gt_data_token(d, i);
            if (v > mx) mx = v;
        }
    }
    ((gt_data *)d)->max_tok = mx; /* the object is heap-allocated and non-const: cache it */
    return mx;
}

int gt_data_check_seq(const gt_data *d, int T, char *err, size_t err_len) {
    if (T < 1) {
        seterr(err, err_len, "%s: sequence length %d must be >= 1", d->path, T);
        return -1;
    }
    if (d->count < (uint64_t)T + 1) {
        seterr(err, err_len, "%s: too few tokens for seq_len %d: the file has %llu tokens, "
               "need at least seq_len+1 = %llu", d->path, T, (unsigned long long)d->count,
               (unsigned long long)T + 1);
        return -1;
    }
    return 0;
}

static uint64_t mix64(uint64_t z) { /* splitmix64 finaliser */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t gt_data_sample_start(const gt_data *d, uint64_t seed, uint64_t s, int T) {
    uint64_t n = d->count - (uint64_t)T; /* number of valid starts, >= 1 after check_seq */
    uint64_t h = mix64(mix64(seed) + (s + 1) * 0x9E3779B97F4A7C15ULL);
    return h % n;
}

static void copy_window(const gt_data *d, uint64_t start, int T, int32_t *in, int32_t *tg) {
    if (d->tb == 2) {
        const unsigned char *p = d->tok + 2 * start;
        int32_t prev = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8);
        for (int t = 0; t < T; t++) {
            const unsigned char *q = p + 2 * (size_t)(t + 1);
            int32_t next = (int32_t)((uint32_t)q[0] | (uint32_t)q[1] << 8);
            in[t] = prev;
            tg[t] = next;
            prev = next;
        }
    } else {
        for (int t = 0; t < T; t++) {
            in[t] = gt_data_token(d, start + (uint64_t)t);
            tg[t] = gt_data_token(d, start + (uint64_t)t + 1);
        }
    }
}

void gt_data_train_batch(const gt_data *d, uint64_t seed, uint64_t first_sample, int n_seq, int T,
                         int32_t *inputs, int32_t *targets) {
    for (int i = 0; i < n_seq; i++) {
        uint64_t start = gt_data_sample_start(d, seed, first_sample + (uint64_t)i, T);
        copy_window(d, start, T, inputs + (size_t)i * T, targets + (size_t)i * T);
    }
}

uint64_t gt_data_val_windows(const gt_data *d, int T) {
    if (T < 1 || d->count < (uint64_t)T + 1) return 0;
    return (d->count - 1) / (uint64_t)T;
}

void gt_data_val_batch(const gt_data *d, int batch, int n_seq, int T, int32_t *inputs,
                       int32_t *targets) {
    uint64_t nw = gt_data_val_windows(d, T);
    if (nw == 0) return; /* check_seq would have failed */
    for (int i = 0; i < n_seq; i++) {
        uint64_t w = ((uint64_t)(batch < 0 ? 0 : batch) * (uint64_t)n_seq + (uint64_t)i) % nw;
        copy_window(d, w * (uint64_t)T, T, inputs + (size_t)i * T, targets + (size_t)i * T);
    }
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
        seterr(err, err_len, "%s: token_bytes %d must be 2 or 4", path, token_bytes);
        return NULL;
    }
    if (vocab_size == 0 || (token_bytes == 2 && vocab_size > 65536u) ||
        (token_bytes == 4 && vocab_size > (uint32_t)INT32_MAX)) {
        seterr(err, err_len, "%s: vocab_size %u does not fit %d-byte tokens", path, vocab_size,
               token_bytes);
        return NULL;
    }
    gt_data_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path) + 32;
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n))) {
        if (w) free(w->path);
        free(w);
        seterr(err, err_len, "%s: out of memory", path);
        return NULL;
    }
    snprintf(w->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        seterr(err, err_len, "%s: cannot create: %s", w->tmp, strerror(errno));
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
        seterr(err, err_len, "%s: write failed: %s", w->tmp, strerror(errno));
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
                seterr(err, err_len, "%s: token %ld at position %llu is outside [0, %u)", w->path,
                       (long)v, (unsigned long long)(w->count + i), w->vocab);
                return -1;
            }
            for (int b = 0; b < w->tb; b++) buf[i * w->tb + b] = (unsigned char)((uint32_t)v >> (8 * b));
        }
        if (fwrite(buf, (size_t)w->tb, k, w->f) != k) {
            seterr(err, err_len, "%s: write failed: %s", w->tmp, strerror(errno));
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
        seterr(err, err_len, "%s: write failed: %s", w->tmp, strerror(saved));
        gt_data_writer_abort(w);
        return -1;
    }
    if (rename(w->tmp, w->path) != 0) {
        seterr(err, err_len, "%s: cannot rename %s into place: %s", w->path, w->tmp, strerror(errno));
        gt_data_writer_abort(w);
        return -1;
    }
    fsync_dir_of(w->path);
    free_writer(w);
    return 0;
}
