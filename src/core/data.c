/* gtrain token data: see data.h for the file formats, the spec of several files and the sampling
 * rules. */
#define _POSIX_C_SOURCE 200809L
#include "data.h"
#include "errmsg.h"
#include "exitcodes.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>


static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* ------------------------------------------------------------------ the spec */

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int push_path(char ***paths, int *n, int *cap, const char *p) {
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 8;
        char **np = realloc(*paths, (size_t)nc * sizeof *np);
        if (!np) return -1;
        *paths = np;
        *cap = nc;
    }
    char *c = strdup(p);
    if (!c) return -1;
    (*paths)[(*n)++] = c;
    return 0;
}

void gt_data_free_paths(char **paths, int n) {
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

/* One source of a spec: an entry between commas, "PATTERN" or "PATTERN:WEIGHT". */
typedef struct spec_entry {
    char *pattern;
    double weight; /* > 0 when weighted */
    int weighted;
} spec_entry;

static void free_entries(spec_entry *e, int n) {
    for (int i = 0; i < n; i++) free(e[i].pattern);
    free(e);
}

/* Splits SPEC into its sources. A trailing ":NUMBER" is the source's weight (a path whose last ':'
 * is followed by something other than a number keeps its colon). 0, or -1 and a message. */
static int parse_spec(const char *spec, spec_entry **out, int *n_out, char *err, size_t err_len) {
    *out = NULL;
    *n_out = 0;
    if (!spec || !*spec) {
        gt_errorf(err, err_len, "token data: no file name given");
        return -1;
    }
    char *copy = strdup(spec);
    spec_entry *e = NULL;
    int n = 0, cap = 0, rc = 0, n_weighted = 0;
    if (!copy) {
        gt_errorf(err, err_len, "%s: out of memory", spec);
        return -1;
    }
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t') tok++;
        size_t len = strlen(tok);
        while (len && (tok[len - 1] == ' ' || tok[len - 1] == '\t')) tok[--len] = 0;
        if (!len) continue; /* "a.bin, ,b.bin" or a trailing comma */
        double w = 0;
        int weighted = 0;
        char *colon = strrchr(tok, ':');
        if (colon) {
            char *ws = colon + 1, *end = NULL;
            while (*ws == ' ' || *ws == '\t') ws++;
            if (!*ws) {
                gt_errorf(err, err_len, "'%s': no weight after ':' (expected PATTERN:WEIGHT, a positive number)", tok);
                rc = -1;
                break;
            }
            errno = 0;
            w = strtod(ws, &end);
            if (end != ws && *end == 0) {
                weighted = 1;
                if (!(w > 0) || !isfinite(w)) {
                    gt_errorf(err, err_len, "'%s': weight %s is not a positive number", tok, ws);
                    rc = -1;
                    break;
                }
                size_t pl = (size_t)(colon - tok);
                while (pl && (tok[pl - 1] == ' ' || tok[pl - 1] == '\t')) pl--;
                tok[pl] = 0;
                if (!pl) {
                    gt_errorf(err, err_len, "'%s': a weight without a file name", spec);
                    rc = -1;
                    break;
                }
            }
        }
        if (n == cap) {
            int nc = cap ? 2 * cap : 8;
            spec_entry *ne = realloc(e, (size_t)nc * sizeof *ne);
            if (!ne) { rc = -2; break; }
            e = ne;
            cap = nc;
        }
        e[n].pattern = strdup(tok);
        e[n].weight = w;
        e[n].weighted = weighted;
        if (!e[n].pattern) { rc = -2; break; }
        n++;
        n_weighted += weighted;
    }
    free(copy);
    if (rc == -2) gt_errorf(err, err_len, "%s: out of memory", spec);
    if (!rc && n == 0) {
        gt_errorf(err, err_len, "'%s': no file name given", spec);
        rc = -1;
    }
    if (!rc && n_weighted && n_weighted != n) {
        gt_errorf(err, err_len, "'%s': some sources have a weight and some do not (give every source a "
                  "weight, PATTERN:WEIGHT, or none)", spec);
        rc = -1;
    }
    if (rc) {
        free_entries(e, n);
        return -1;
    }
    *out = e;
    *n_out = n;
    return 0;
}

/* Expands one pattern (or literal path) onto paths. 0, -1 + message, -2 out of memory. */
static int expand_one(const char *tok, char ***paths, int *n, int *cap, char *err, size_t err_len) {
    if (!has_glob_chars(tok)) return push_path(paths, n, cap, tok) ? -2 : 0;
    glob_t g;
    int rc = 0, grc = glob(tok, GLOB_ERR, NULL, &g); /* sorted by name (no GLOB_NOSORT) */
    if (grc == GLOB_NOMATCH) {
        gt_errorf(err, err_len, "%s: the pattern matches no file", tok);
        return -1;
    }
    if (grc != 0) {
        gt_errorf(err, err_len, "%s: cannot expand the pattern: %s", tok,
                  grc == GLOB_NOSPACE ? "out of memory" : "a directory cannot be read");
        rc = -1;
    } else {
        for (size_t i = 0; i < g.gl_pathc && !rc; i++)
            if (push_path(paths, n, cap, g.gl_pathv[i])) rc = -2;
    }
    globfree(&g);
    return rc;
}

/* SPEC -> its sources and their files; src_first[j] = index of source j's first path ([n_src+1]). */
static int expand_sources(const char *spec, spec_entry **entries, int *n_src, int **src_first, char ***paths_out,
                          int *n_out, char *err, size_t err_len) {
    *paths_out = NULL;
    *n_out = 0;
    *src_first = NULL;
    if (parse_spec(spec, entries, n_src, err, err_len) != 0) return -1;
    char **paths = NULL;
    int n = 0, cap = 0, rc = 0;
    int *first = malloc(((size_t)*n_src + 1) * sizeof *first);
    if (!first) rc = -2;
    for (int j = 0; j < *n_src && !rc; j++) {
        first[j] = n;
        rc = expand_one((*entries)[j].pattern, &paths, &n, &cap, err, err_len);
    }
    if (rc == -2) gt_errorf(err, err_len, "%s: out of memory", spec);
    if (rc) {
        gt_data_free_paths(paths, n);
        free(first);
        free_entries(*entries, *n_src);
        *entries = NULL;
        return -1;
    }
    first[*n_src] = n;
    *src_first = first;
    *paths_out = paths;
    *n_out = n;
    return 0;
}

int gt_data_expand(const char *spec, char ***paths_out, int *n_out, char *err, size_t err_len) {
    spec_entry *e = NULL;
    int n_src = 0, *first = NULL;
    if (expand_sources(spec, &e, &n_src, &first, paths_out, n_out, err, err_len) != 0) return -1;
    free(first);
    free_entries(e, n_src);
    return 0;
}

int gt_data_spec_weighted(const char *spec) {
    spec_entry *e = NULL;
    int n = 0;
    char err[64];
    if (parse_spec(spec, &e, &n, err, sizeof err) != 0) return 0;
    int w = n > 0 && e[0].weighted;
    free_entries(e, n);
    return w;
}

/* ------------------------------------------------------------------ reading */

/* One mapped file. */
typedef struct shard {
    char *path;
    const unsigned char *map; /* whole file */
    size_t map_len;
    const unsigned char *tok; /* first token */
    uint64_t count;
    uint32_t vocab; /* from a gtrain header; 0 for llm.c (not recorded) */
    int tb;         /* 2 or 4 */
    int llmc;
    int max_tok;    /* cached, -1 = not yet scanned */
    const unsigned char *mask; /* the loss mask beside it: one byte per token, 0 = not counted; NULL = none */
    const unsigned char *mask_map;
    size_t mask_map_len;
} shard;

struct gt_data {
    char *spec;
    shard *s;
    int n;
    uint64_t count;       /* all shards */
    uint64_t *base;       /* [n+1]: global index of shard i's first token */
    /* window tables for one T (made by ensure_tables; 0 = none yet) */
    int T;
    uint64_t *train_cum;  /* [n+1]: train windows in shards < i */
    uint64_t *val_cum;    /* [n+1]: validation windows in shards < i */
    /* sources: the spec's entries; source j holds shards src_first[j] .. src_first[j+1]-1 */
    int n_src;
    int *src_first;       /* [n_src+1] */
    char **src_name;      /* [n_src] */
    double *src_weight;   /* [n_src], normalised to sum 1 when weighted, else 0 */
    uint64_t *src_thr;    /* [n_src]: source j is drawn when the sample's Weyl value < src_thr[j] */
    int weighted;
    int sep_uncounted;    /* 1: the target at a position whose input is sep is not counted (data.separator_loss) */
    int32_t sep;
};

static void unmap_shard(shard *s) {
    if (s->map) munmap((void *)s->map, s->map_len);
    if (s->mask_map) munmap((void *)s->mask_map, s->mask_map_len);
    free(s->path);
}

/* Maps PATH read-only: *map and *size, or -1 + a message naming the file. A file too short to hold
 * any magic (8 bytes) is refused here, so the header readers below may read the first 8 bytes. */
static int map_file(const char *path, const unsigned char **map, uint64_t *size, char *err, size_t err_len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        gt_errorf(err, err_len, "%s: cannot open token data file: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int bad = 1;
    if (fstat(fd, &st) != 0)
        gt_errorf(err, err_len, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        gt_errorf(err, err_len, "%s: not a regular file", path);
    else if ((uint64_t)st.st_size < 8)
        gt_errorf(err, err_len, "%s: truncated header: file has %llu bytes, a gtrain token file has a "
                  "%d-byte header (an llm.c shard %d)", path, (unsigned long long)st.st_size,
                  GT_DATA_HEADER_BYTES, GT_LLMC_HEADER_BYTES);
    else if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX)
        gt_errorf(err, err_len, "%s: file too large to map", path);
    else
        bad = 0;
    if (bad) {
        close(fd);
        return -1;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        gt_errorf(err, err_len, "%s: mmap failed: %s", path, strerror(errno));
        return -1;
    }
    *map = m;
    *size = (uint64_t)st.st_size;
    return 0;
}

/* What a shard's header says. */
typedef struct header {
    uint64_t hdr;   /* header bytes */
    uint64_t count; /* tokens */
    uint32_t vocab; /* 0 for llm.c (not recorded) */
    uint32_t tb;    /* token bytes */
    int llmc;
} header;

/* The checks below return NULL for a good header, else why it is not (in buf or a literal). */

static const char *read_gtrain_header(const unsigned char *h, uint64_t fsize, header *o, char *buf,
                                      size_t len) {
    o->hdr = GT_DATA_HEADER_BYTES;
    if (fsize < o->hdr) {
        snprintf(buf, len, "truncated header: file has %llu bytes, a gtrain token file has a "
                 "%d-byte header", (unsigned long long)fsize, GT_DATA_HEADER_BYTES);
        return buf;
    }
    uint32_t version = rd32(h + 8), reserved = rd32(h + 28);
    o->tb = rd32(h + 12);
    o->vocab = rd32(h + 24);
    o->count = rd64(h + 16);
    if (version != GT_DATA_VERSION)
        snprintf(buf, len, "unsupported format version %u (this gtrain reads version %u)", version,
                 GT_DATA_VERSION);
    else if (o->tb != 2 && o->tb != 4)
        snprintf(buf, len, "unsupported token width token_bytes=%u (must be 2 or 4)", o->tb);
    else if (o->vocab == 0)
        return "vocab_size is 0";
    else if (o->tb == 2 && o->vocab > 65536u)
        snprintf(buf, len, "vocab_size %u does not fit 2-byte tokens (max 65536)", o->vocab);
    else if (reserved != 0)
        snprintf(buf, len, "reserved header field is %u, must be 0", reserved);
    else
        return NULL;
    return buf;
}

static const char *read_llmc_header(const unsigned char *h, uint64_t fsize, uint32_t magic, header *o,
                                    char *buf, size_t len) {
    o->llmc = 1;
    o->hdr = GT_LLMC_HEADER_BYTES;
    o->tb = magic == GT_LLMC_MAGIC ? 2u : 4u;
    uint32_t want_version = magic == GT_LLMC_MAGIC ? 1u : 7u;
    if (fsize < o->hdr) {
        snprintf(buf, len, "truncated llm.c header: file has %llu bytes, an llm.c shard has a "
                 "%d-byte header (256 int32)", (unsigned long long)fsize, GT_LLMC_HEADER_BYTES);
        return buf;
    }
    uint32_t version = rd32(h + 4);
    int32_t n = (int32_t)rd32(h + 8);
    o->count = n < 0 ? 0 : (uint64_t)n;
    if (version != want_version)
        snprintf(buf, len, "unsupported llm.c shard version %u (magic %u goes with version %u)", version,
                 magic, want_version);
    else if (n < 0)
        snprintf(buf, len, "llm.c header has a negative token count %d", (int)n);
    else
        return NULL;
    return buf;
}

/* Tells the two formats apart by their first bytes and reads the header. */
static const char *read_header(const unsigned char *h, uint64_t fsize, header *o, char *buf, size_t len) {
    memset(o, 0, sizeof *o);
    uint32_t magic = rd32(h);
    if (memcmp(h, GT_DATA_MAGIC, 8) == 0) return read_gtrain_header(h, fsize, o, buf, len);
    if (magic == GT_LLMC_MAGIC || magic == GT_LLMC_MAGIC_U32) return read_llmc_header(h, fsize, magic, o, buf, len);
    if (fsize < GT_DATA_HEADER_BYTES) {
        snprintf(buf, len, "truncated header: file has %llu bytes, a gtrain token file has a "
                 "%d-byte header", (unsigned long long)fsize, GT_DATA_HEADER_BYTES);
        return buf;
    }
    return "bad magic (neither a gtrain token file, \"GTRNTOK\\0\" in the first 8 bytes, made by "
           "gtrain-prep or tools/prep_tokenized.py, nor an llm.c shard, int32 20240520 or 20240801)";
}

/* The file must hold exactly the header and the tokens it announces, and at least 2 tokens. */
static const char *check_size(const header *o, uint64_t fsize, char *buf, size_t len) {
    int overflow = o->count > (UINT64_MAX - o->hdr) / o->tb;
    if (overflow || fsize != o->hdr + o->count * o->tb) {
        snprintf(buf, len,
                 "size mismatch: %s says %llu tokens of %u bytes (%llu bytes with the header) "
                 "but the file has %llu bytes (truncated or corrupt?)",
                 o->llmc ? "llm.c header" : "header", (unsigned long long)o->count, o->tb,
                 overflow ? 0ULL : (unsigned long long)(o->hdr + o->count * o->tb), (unsigned long long)fsize);
        return buf;
    }
    if (o->count < 2) {
        snprintf(buf, len, "too few tokens: %llu (need at least 2, and seq_len+1 to train)",
                 (unsigned long long)o->count);
        return buf;
    }
    return NULL;
}

/* Opens one file into *s. 0, or -1 + a message naming the file. */
static int open_shard(const char *path, shard *s, char *err, size_t err_len) {
    memset(s, 0, sizeof *s);
    const unsigned char *m;
    uint64_t fsize;
    if (map_file(path, &m, &fsize, err, err_len) != 0) return -1;
    header o;
    char buf[300];
    const char *why = read_header(m, fsize, &o, buf, sizeof buf);
    if (!why) why = check_size(&o, fsize, buf, sizeof buf);
    if (why) {
        gt_errorf(err, err_len, "%s: %s", path, why);
        munmap((void *)m, (size_t)fsize);
        return -1;
    }
    s->path = strdup(path);
    if (!s->path) {
        munmap((void *)m, (size_t)fsize);
        gt_errorf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    s->map = m;
    s->map_len = (size_t)fsize;
    s->tok = m + o.hdr;
    s->count = o.count;
    s->vocab = o.vocab; /* 0 for llm.c */
    s->tb = (int)o.tb;
    s->llmc = o.llmc;
    s->max_tok = -1;
#ifdef MADV_RANDOM
    madvise((void *)m, (size_t)fsize, MADV_RANDOM);
#endif
    return 0;
}

/* A short name for a source: its pattern's file name up to the first '.' or glob character
 * ("data/web.train.*.bin" -> "web"), made unique by a suffix "_J" (J = the source's number). */
static char *source_name(const char *pattern, char **earlier, int j) {
    const char *b = strrchr(pattern, '/');
    b = b ? b + 1 : pattern;
    size_t len = strcspn(b, ".*?[");
    char buf[128];
    if (len == 0 || len > 64) snprintf(buf, sizeof buf, "source%d", j);
    else snprintf(buf, sizeof buf, "%.*s", (int)len, b);
    for (int i = 0; i < j; i++)
        if (strcmp(earlier[i], buf) == 0) {
            size_t l = strlen(buf);
            snprintf(buf + l, sizeof buf - l, "_%d", j);
            break;
        }
    return strdup(buf);
}

gt_data *gt_data_open(const char *spec, char *err, size_t err_len) {
    char **paths = NULL;
    int n = 0, n_src = 0, *first = NULL;
    spec_entry *e = NULL;
    if (expand_sources(spec, &e, &n_src, &first, &paths, &n, err, err_len) != 0) return NULL;
    gt_data *d = calloc(1, sizeof *d);
    int oom = 0;
    if (d) {
        d->spec = strdup(spec);
        d->s = calloc((size_t)n, sizeof *d->s);
        d->base = calloc((size_t)n + 1, sizeof *d->base);
        d->src_first = first;
        first = NULL;
        d->n_src = n_src;
        d->src_name = calloc((size_t)n_src, sizeof *d->src_name);
        d->src_weight = calloc((size_t)n_src, sizeof *d->src_weight);
        d->src_thr = calloc((size_t)n_src, sizeof *d->src_thr);
        oom = !d->spec || !d->s || !d->base || !d->src_name || !d->src_weight || !d->src_thr;
        for (int j = 0; j < n_src && !oom; j++) oom = !(d->src_name[j] = source_name(e[j].pattern, d->src_name, j));
    }
    if (!d || oom) {
        gt_errorf(err, err_len, "%s: out of memory", spec);
        gt_data_free_paths(paths, n);
        free(first);
        free_entries(e, n_src);
        gt_data_close(d);
        return NULL;
    }
    d->weighted = n_src > 0 && e[0].weighted;
    if (d->weighted) {
        double sum = 0, cum = 0;
        for (int j = 0; j < n_src; j++) sum += e[j].weight;
        for (int j = 0; j < n_src; j++) {
            d->src_weight[j] = e[j].weight / sum;
            cum += d->src_weight[j];
            /* cum * 2^64, the last source takes everything above the one before */
            double t = cum * 18446744073709551616.0;
            d->src_thr[j] = j == n_src - 1 || t >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)t;
        }
    }
    free_entries(e, n_src);
    for (int i = 0; i < n; i++) {
        if (open_shard(paths[i], &d->s[i], err, err_len) != 0) {
            gt_data_free_paths(paths, n);
            gt_data_close(d);
            return NULL;
        }
        d->n = i + 1;
        d->base[i + 1] = d->base[i] + d->s[i].count;
    }
    d->count = d->base[n];
    gt_data_free_paths(paths, n);
    return d;
}

/* ------------------------------------------------------------------ loss masks */

void gt_data_mask_path(const char *path, char *out, size_t len) {
    size_t n = strlen(path);
    if (n >= 4 && strcmp(path + n - 4, ".bin") == 0) snprintf(out, len, "%.*s.mask", (int)(n - 4), path);
    else snprintf(out, len, "%s.mask", path);
}

/* Maps the mask beside shard s: 1 mapped, 0 there is none, -1 + message (a bad mask file). */
static int open_mask(shard *s, char *err, size_t err_len) {
    char mp[PATH_MAX + 8];
    gt_data_mask_path(s->path, mp, sizeof mp);
    if (access(mp, F_OK) != 0) return 0;
    const unsigned char *m;
    uint64_t fsize;
    if (map_file(mp, &m, &fsize, err, err_len) != 0) return -1;
    const char *why = NULL;
    char buf[300];
    if (fsize < GT_DATA_HEADER_BYTES || memcmp(m, GT_MASK_MAGIC, 8) != 0)
        why = "bad magic (a loss mask starts with \"GTRNMSK\\0\", made by tools/prep_tokenized.py)";
    else if (rd32(m + 8) != GT_DATA_VERSION || rd32(m + 12) != 1 || rd32(m + 28) != 0)
        why = "unsupported mask header (version 1, 1 byte per token, reserved 0)";
    else if (rd64(m + 16) != s->count) {
        snprintf(buf, sizeof buf, "the mask has %llu entries but %s has %llu tokens",
                 (unsigned long long)rd64(m + 16), s->path, (unsigned long long)s->count);
        why = buf;
    } else if (fsize != GT_DATA_HEADER_BYTES + s->count) {
        snprintf(buf, sizeof buf, "size mismatch: %llu bytes, expected %llu (truncated or corrupt?)",
                 (unsigned long long)fsize, (unsigned long long)(GT_DATA_HEADER_BYTES + s->count));
        why = buf;
    }
    if (why) {
        gt_errorf(err, err_len, "%s: %s", mp, why);
        munmap((void *)m, (size_t)fsize);
        return -1;
    }
    s->mask_map = m;
    s->mask_map_len = (size_t)fsize;
    s->mask = m + GT_DATA_HEADER_BYTES;
    return 1;
}

int gt_data_load_masks(gt_data *d, int mode, const char *where, char *err, size_t err_len) {
    if (mode == GT_DATA_MASK_OFF) return 0;
    for (int i = 0; i < d->n; i++) {
        char why[PATH_MAX + 300];
        int rc = open_mask(&d->s[i], why, sizeof why);
        if (rc < 0) {
            gt_errorf(err, err_len, "%s", why);
            return -1;
        }
        if (rc == 0 && mode == GT_DATA_MASK_ON) {
            char mp[PATH_MAX + 8];
            gt_data_mask_path(d->s[i].path, mp, sizeof mp);
            gt_errorf(err, err_len, "%s: %s has no loss mask %s (expected one beside every file, made by "
                      "tools/prep_tokenized.py; or data.loss_mask = auto)", where, d->s[i].path, mp);
            return -1;
        }
    }
    return 0;
}

int gt_data_has_masks(const gt_data *d) {
    for (int i = 0; i < d->n; i++)
        if (d->s[i].mask) return 1;
    return 0;
}

void gt_data_uncount_separator(gt_data *d, int32_t sep) {
    d->sep_uncounted = sep >= 0;
    d->sep = sep;
}

int gt_data_counts_targets(const gt_data *d) { return d->sep_uncounted || gt_data_has_masks(d); }

int gt_data_n_sources(const gt_data *d) { return d->n_src; }
const char *gt_data_source_name(const gt_data *d, int j) { return d->src_name[j]; }
int gt_data_weighted(const gt_data *d) { return d->weighted; }
double gt_data_source_weight(const gt_data *d, int j) { return d->src_weight[j]; }

uint64_t gt_data_source_tokens(const gt_data *d, int j) {
    return d->base[d->src_first[j + 1]] - d->base[d->src_first[j]];
}

int gt_data_check_readable(const char *spec, const char *where, char *err, size_t err_len) {
    static const char expected[] =
        "expected token files made by gtrain-prep or tools/prep_tokenized.py, or llm.c shards: "
        "paths separated by commas, or a glob, each optionally with a weight, PATTERN:WEIGHT";
    char **paths = NULL, why_buf[PATH_MAX + 256];
    int n = 0;
    if (gt_data_expand(spec, &paths, &n, why_buf, sizeof why_buf) != 0) {
        snprintf(err, err_len, "%s: %s (%s)", where, why_buf, expected);
        return GT_EXIT_BAD_INPUT;
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        struct stat st;
        const char *why = NULL;
        if (stat(paths[i], &st) != 0)
            why = strerror(errno);
        else if (S_ISDIR(st.st_mode))
            why = "it is a directory";
        else if (access(paths[i], R_OK) != 0)
            why = strerror(errno);
        if (why) {
            snprintf(err, err_len, "%s: cannot read '%s': %s (%s)", where, paths[i], why, expected);
            rc = GT_EXIT_BAD_INPUT;
        }
    }
    gt_data_free_paths(paths, n);
    return rc;
}

void gt_data_close(gt_data *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) unmap_shard(&d->s[i]);
    free(d->s);
    free(d->base);
    free(d->train_cum);
    free(d->val_cum);
    for (int j = 0; j < d->n_src && d->src_name; j++) free(d->src_name[j]);
    free(d->src_name);
    free(d->src_first);
    free(d->src_weight);
    free(d->src_thr);
    free(d->spec);
    free(d);
}

int gt_data_n_files(const gt_data *d) { return d->n; }
const char *gt_data_file_path(const gt_data *d, int i) { return d->s[i].path; }
const char *gt_data_file_format(const gt_data *d, int i) { return d->s[i].llmc ? "llm.c" : "gtrain"; }
uint64_t gt_data_token_count(const gt_data *d) { return d->count; }

uint32_t gt_data_vocab_size(const gt_data *d) {
    uint32_t v = 0;
    for (int i = 0; i < d->n; i++) v = d->s[i].vocab > v ? d->s[i].vocab : v;
    return v;
}

int gt_data_token_bytes(const gt_data *d) {
    int tb = 2;
    for (int i = 0; i < d->n; i++) tb = d->s[i].tb > tb ? d->s[i].tb : tb;
    return tb;
}

static int32_t shard_token(const shard *s, uint64_t i) {
    if (s->tb == 2) {
        const unsigned char *p = s->tok + 2 * i;
        return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8);
    }
    uint32_t v = rd32(s->tok + 4 * i);
    return v > (uint32_t)INT32_MAX ? INT32_MAX : (int32_t)v;
}

/* The largest i in [0, n) with cum[i] <= x (cum[0..n] non-decreasing, cum[0] = 0 <= x < cum[n]): the
 * i with cum[i] <= x < cum[i+1], so a shard that contributes nothing (cum[i] == cum[i+1]) is never
 * chosen. Binary search: log2(n) steps per window. */
static int locate(const uint64_t *cum, int n, uint64_t x) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (cum[mid] <= x) lo = mid; else hi = mid - 1;
    }
    return lo;
}

int32_t gt_data_token(const gt_data *d, uint64_t i) {
    int k = locate(d->base, d->n, i);
    return shard_token(&d->s[k], i - d->base[k]);
}

/* One pass over the file, split over the OpenMP threads (a 100 M-token shard is 200 MB to read). */
static int shard_max_token(shard *s) {
    if (s->max_tok >= 0) return s->max_tok;
    int32_t mx = 0;
    if (s->tb == 2) {
#pragma omp parallel for reduction(max : mx) schedule(static)
        for (uint64_t i = 0; i < s->count; i++) {
            int32_t v = (int32_t)((uint32_t)s->tok[2 * i] | (uint32_t)s->tok[2 * i + 1] << 8);
            if (v > mx) mx = v;
        }
    } else {
#pragma omp parallel for reduction(max : mx) schedule(static)
        for (uint64_t i = 0; i < s->count; i++) {
            int32_t v = shard_token(s, i);
            if (v > mx) mx = v;
        }
    }
    s->max_tok = mx;
    return mx;
}

int gt_data_max_token(const gt_data *d) {
    int mx = 0;
    for (int i = 0; i < d->n; i++) { /* the object is heap-allocated and non-const: cache in it */
        int m = shard_max_token(&((gt_data *)d)->s[i]);
        mx = m > mx ? m : mx;
    }
    return mx;
}

int gt_data_check_vocab(const gt_data *d, int model_vocab, char *err, size_t err_len) {
    for (int i = 0; i < d->n; i++) {
        shard *s = &((gt_data *)d)->s[i];
        if (!s->llmc && s->vocab <= (uint32_t)model_vocab) continue; /* the writer checked every id */
        if (s->llmc && s->tb == 2 && model_vocab >= 65536) continue;
        int mx = shard_max_token(s);
        if (mx < model_vocab) continue;
        if (s->llmc)
            gt_errorf(err, err_len, "%s: token id %d is outside [model] vocab_size = %d (an llm.c shard: "
                   "the data was tokenised for a larger vocabulary)", s->path, mx, model_vocab);
        else
            gt_errorf(err, err_len, "%s: token id %d is outside [model] vocab_size = %d (the file was made "
                   "for a vocabulary of %u)", s->path, mx, model_vocab, s->vocab);
        return -1;
    }
    return 0;
}

/* Window tables for T (cast away const like the max-token cache: the object is ours). */
static void ensure_tables(const gt_data *cd, int T) {
    gt_data *d = (gt_data *)cd;
    if (d->T == T && d->train_cum) return;
    if (!d->train_cum) {
        d->train_cum = malloc(((size_t)d->n + 1) * sizeof *d->train_cum);
        d->val_cum = malloc(((size_t)d->n + 1) * sizeof *d->val_cum);
        if (!d->train_cum || !d->val_cum) abort();
    }
    d->train_cum[0] = d->val_cum[0] = 0;
    for (int i = 0; i < d->n; i++) {
        uint64_t c = d->s[i].count, ok = T >= 1 && c >= (uint64_t)T + 1;
        d->train_cum[i + 1] = d->train_cum[i] + (ok ? c - (uint64_t)T : 0);
        d->val_cum[i + 1] = d->val_cum[i] + (ok ? (c - 1) / (uint64_t)T : 0);
    }
    d->T = T;
}

int gt_data_check_seq(const gt_data *d, int T, char *err, size_t err_len) {
    if (T < 1) {
        gt_errorf(err, err_len, "%s: sequence length %d must be >= 1", d->spec, T);
        return -1;
    }
    ensure_tables(d, T);
    if (d->weighted)
        for (int j = 0; j < d->n_src; j++) {
            int a = d->src_first[j], b = d->src_first[j + 1];
            if (d->train_cum[b] > d->train_cum[a]) continue;
            gt_errorf(err, err_len, "%s: source '%s' (weight %g) has no file with seq_len+1 = %llu tokens, "
                      "so none of its windows can be drawn", d->spec, d->src_name[j], d->src_weight[j],
                      (unsigned long long)T + 1);
            return -1;
        }
    if (d->train_cum[d->n] > 0) return 0;
    int big = 0;
    for (int i = 1; i < d->n; i++) big = d->s[i].count > d->s[big].count ? i : big;
    if (d->n == 1)
        gt_errorf(err, err_len, "%s: too few tokens for seq_len %d: the file has %llu tokens, "
               "need at least seq_len+1 = %llu", d->s[0].path, T, (unsigned long long)d->s[0].count,
               (unsigned long long)T + 1);
    else
        gt_errorf(err, err_len, "%s: too few tokens for seq_len %d: no file has seq_len+1 = %llu tokens "
               "(windows never cross files; the largest, %s, has %llu)", d->spec, T,
               (unsigned long long)T + 1, d->s[big].path, (unsigned long long)d->s[big].count);
    return -1;
}

static void thousands(uint64_t v, char *out, size_t len) {
    char raw[32];
    snprintf(raw, sizeof raw, "%llu", (unsigned long long)v);
    size_t n = strlen(raw), o = 0;
    for (size_t i = 0; i < n && o + 2 < len; i++) {
        if (i && (n - i) % 3 == 0) out[o++] = ',';
        out[o++] = raw[i];
    }
    out[o] = 0;
}

void gt_data_describe(const gt_data *d, char *out, size_t len) {
    char num[40];
    thousands(d->count, num, sizeof num);
    if (d->n == 1) {
        snprintf(out, len, "%s (%s tokens%s)", d->s[0].path, num, d->s[0].llmc ? ", llm.c shard" : "");
        return;
    }
    int llmc = 0;
    for (int i = 0; i < d->n; i++) llmc += d->s[i].llmc;
    size_t o = (size_t)snprintf(out, len, "%d files, %s tokens%s: ", d->n, num,
                                llmc == d->n ? ", llm.c shards" : llmc ? ", some llm.c shards" : "");
    enum { SHOWN = 3 };
    for (int i = 0; i < d->n && i < SHOWN && o < len; i++)
        o += (size_t)snprintf(out + o, len - o, "%s%s", i ? ", " : "", d->s[i].path);
    if (d->n > SHOWN && o < len) snprintf(out + o, len - o, ", ...");
}

static uint64_t mix64(uint64_t z) { /* splitmix64 finaliser */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* The Weyl value of sample s: w(s) = mix64(seed) + (s + 1) * 0x9E3779B97F4A7C15 (mod 2^64). Its
 * mix64 picks the window; with weights, w(s) / 2^64 itself (a golden-ratio sequence, spread evenly
 * over [0, 1) in every run of consecutive samples) picks the source. */
static uint64_t weyl(uint64_t seed, uint64_t s) { return mix64(seed) + (s + 1) * 0x9E3779B97F4A7C15ULL; }

static int source_of(const gt_data *d, uint64_t w) {
    int j = 0;
    while (j < d->n_src - 1 && w >= d->src_thr[j]) j++;
    return j;
}

int gt_data_sample_source(const gt_data *d, uint64_t seed, uint64_t s) {
    return d->weighted ? source_of(d, weyl(seed, s)) : -1;
}

/* Training window -> shard index and local start. Unweighted: window k of all train_cum[n]; weighted:
 * window k of the chosen source's windows. */
static int train_window(const gt_data *d, uint64_t seed, uint64_t s, int T, uint64_t *local) {
    ensure_tables(d, T);
    uint64_t w = weyl(seed, s), h = mix64(w), k;
    if (d->weighted) {
        int j = source_of(d, w);
        uint64_t lo = d->train_cum[d->src_first[j]], hi = d->train_cum[d->src_first[j + 1]];
        k = lo + h % (hi - lo); /* >= 1 window per source after check_seq */
    } else {
        k = h % d->train_cum[d->n]; /* >= 1 window after check_seq */
    }
    int i = locate(d->train_cum, d->n, k);
    *local = k - d->train_cum[i];
    return i;
}

uint64_t gt_data_sample_start(const gt_data *d, uint64_t seed, uint64_t s, int T) {
    uint64_t local;
    int i = train_window(d, seed, s, T, &local);
    return d->base[i] + local;
}

static void copy_window(const gt_data *d, const shard *s, uint64_t start, int T, int32_t *in, int32_t *tg) {
    if (s->tb == 2) {
        const unsigned char *p = s->tok + 2 * start;
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
            in[t] = shard_token(s, start + (uint64_t)t);
            tg[t] = shard_token(s, start + (uint64_t)t + 1);
        }
    }
    if (s->mask) /* a target the mask does not count is ignored by the loss (< 0) */
        for (int t = 0; t < T; t++)
            if (!s->mask[start + (uint64_t)t + 1]) tg[t] = -1;
    if (d->sep_uncounted) /* nor is the one predicted at a separator (Megatron-LM's --eod-mask-loss) */
        for (int t = 0; t < T; t++)
            if (in[t] == d->sep) tg[t] = -1;
}

/* The targets copy_window leaves counted (>= 0), from the files alone. */
static uint64_t window_counted(const gt_data *d, const shard *s, uint64_t start, int T) {
    if (!s->mask && !d->sep_uncounted) return (uint64_t)T;
    uint64_t c = 0;
    for (int t = 0; t < T; t++)
        c += (!s->mask || s->mask[start + (uint64_t)t + 1] != 0) &&
             !(d->sep_uncounted && shard_token(s, start + (uint64_t)t) == d->sep);
    return c;
}

uint64_t gt_data_train_counted(const gt_data *d, uint64_t seed, uint64_t first_sample, uint64_t n, int T) {
    uint64_t c = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t local;
        int k = train_window(d, seed, first_sample + i, T, &local);
        c += window_counted(d, &d->s[k], local, T);
    }
    return c;
}

void gt_data_train_batch(const gt_data *d, uint64_t seed, uint64_t first_sample, int n_seq, int T,
                         int32_t *inputs, int32_t *targets) {
    for (int i = 0; i < n_seq; i++) {
        uint64_t local;
        int k = train_window(d, seed, first_sample + (uint64_t)i, T, &local);
        copy_window(d, &d->s[k], local, T, inputs + (size_t)i * T, targets + (size_t)i * T);
    }
}

uint64_t gt_data_val_windows_source(const gt_data *d, int src, int T) {
    if (T < 1) return 0;
    ensure_tables(d, T);
    if (src < 0) return d->val_cum[d->n];
    return d->val_cum[d->src_first[src + 1]] - d->val_cum[d->src_first[src]];
}

uint64_t gt_data_val_windows(const gt_data *d, int T) { return gt_data_val_windows_source(d, -1, T); }

void gt_data_val_batch_source(const gt_data *d, int src, int batch, int n_seq, int T, int32_t *inputs,
                              int32_t *targets) {
    uint64_t nw = gt_data_val_windows_source(d, src, T);
    if (nw == 0) return; /* check_seq would have failed */
    uint64_t lo = src < 0 ? 0 : d->val_cum[d->src_first[src]];
    for (int i = 0; i < n_seq; i++) {
        uint64_t w = lo + ((uint64_t)(batch < 0 ? 0 : batch) * (uint64_t)n_seq + (uint64_t)i) % nw;
        int k = locate(d->val_cum, d->n, w);
        copy_window(d, &d->s[k], (w - d->val_cum[k]) * (uint64_t)T, T, inputs + (size_t)i * T,
                    targets + (size_t)i * T);
    }
}

void gt_data_val_batch(const gt_data *d, int batch, int n_seq, int T, int32_t *inputs,
                       int32_t *targets) {
    gt_data_val_batch_source(d, -1, batch, n_seq, T, inputs, targets);
}

void gt_data_describe_mix(const gt_data *d, uint64_t seed, uint64_t first, uint64_t n, char *out, size_t len) {
    size_t o = 0;
    out[0] = 0;
    if (!d->weighted) return;
    uint64_t *cnt = calloc((size_t)d->n_src, sizeof *cnt);
    if (!cnt) return;
    for (uint64_t s = first; s < first + n; s++) cnt[source_of(d, weyl(seed, s))]++;
    char num[40];
    thousands(n, num, sizeof num);
    o += (size_t)snprintf(out + o, len - o, "blend of %d sources, realised mix over samples %llu..%llu (%s): ",
                          d->n_src, (unsigned long long)first, (unsigned long long)(first + n - 1), num);
    for (int j = 0; j < d->n_src && o < len; j++) {
        char tk[40];
        thousands(gt_data_source_tokens(d, j), tk, sizeof tk);
        o += (size_t)snprintf(out + o, len - o, "%s%s %.2f%% (weight %.2f%%, %d file%s, %s tokens)", j ? ", " : "",
                              d->src_name[j], n ? 100.0 * (double)cnt[j] / (double)n : 0.0, 100.0 * d->src_weight[j],
                              d->src_first[j + 1] - d->src_first[j], d->src_first[j + 1] - d->src_first[j] == 1 ? "" : "s", tk);
    }
    free(cnt);
}
