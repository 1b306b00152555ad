/* gtrain-prep: byte-level tokenisation of text files into gtrain token files (see data.h).
 * Never touches MPI. */
#define _POSIX_C_SOURCE 200809L
#include "data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: gtrain-prep [--val-fraction F] -o PREFIX FILE...\n"
            "\n"
            "Byte-level tokenisation for gtrain: every byte of the input is one token (0..255,\n"
            "vocab_size 256, stored as 2-byte tokens). The FILEs are concatenated in the order given,\n"
            "without separators; the last F of the bytes go to PREFIX.val.bin, the rest to\n"
            "PREFIX.train.bin. Each output is written to a temporary file and renamed into place.\n"
            "\n"
            "  -o, --output PREFIX    output prefix (required)\n"
            "  --val-fraction F       fraction of the bytes for validation, 0 <= F < 1 (default 0.1);\n"
            "                         0 writes no validation file\n"
            "  -h, --help             this text\n"
            "\n"
            "Exit status: 0 done; 2 bad invocation or input (missing file, F out of range, no -o,\n"
            "empty input); 1 an I/O error while writing.\n"
            "File format: docs/data-format.md. For a real tokenizer (a Hugging Face tokenizer.json)\n"
            "use tools/prep_tokenized.py instead.\n");
}

static int fail(int rc, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "gtrain-prep: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return rc;
}

/* Everything main allocates, freed in one place whatever the exit path. */
static struct {
    const char **files;
    uint64_t *sizes;
    char *train_path, *val_path;
    unsigned char *buf;
    int32_t *tok;
} A;

static int prep(int argc, char **argv);

int main(int argc, char **argv) {
    int rc = prep(argc, argv);
    free(A.files);
    free(A.sizes);
    free(A.train_path);
    free(A.val_path);
    free(A.buf);
    free(A.tok);
    return rc;
}

static int prep(int argc, char **argv) {
    const char *prefix = NULL;
    double frac = 0.1;
    const char **files = A.files = calloc((size_t)argc + 1, sizeof *files);
    int nfiles = 0, opts_done = 0;
    if (!files) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (!opts_done && a[0] == '-' && a[1] != 0) {
            if (!strcmp(a, "--")) {
                opts_done = 1;
                continue;
            }
            if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                usage(stdout);
                return 0;
            }
            int is_out = !strcmp(a, "-o") || !strcmp(a, "--output");
            int is_frac = !strcmp(a, "--val-fraction");
            if (!strncmp(a, "--output=", 9)) {
                is_out = 1;
                val = a + 9;
            } else if (!strncmp(a, "--val-fraction=", 15)) {
                is_frac = 1;
                val = a + 15;
            }
            if (!is_out && !is_frac) {
                fprintf(stderr, "gtrain-prep: unknown option '%s'\n", a);
                usage(stderr);
                return 2;
            }
            if (!val) {
                if (i + 1 >= argc) return fail(2, "option '%s' needs a value%s", a, "");
                val = argv[++i];
            }
            if (is_out) {
                if (!*val) return fail(2, "empty output prefix%s%s", "", "");
                prefix = val;
            } else {
                char *end = NULL;
                errno = 0;
                double f = strtod(val, &end);
                if (end == val || *end || errno || !isfinite(f) || f < 0.0 || f >= 1.0)
                    return fail(2, "--val-fraction '%s' must be a number with 0 <= F < 1%s", val, "");
                frac = f;
            }
            continue;
        }
        files[nfiles++] = a;
    }
    if (!prefix) {
        fprintf(stderr, "gtrain-prep: no output prefix: give -o PREFIX\n");
        usage(stderr);
        return 2;
    }
    if (nfiles == 0) {
        fprintf(stderr, "gtrain-prep: no input files\n");
        usage(stderr);
        return 2;
    }

    /* Sizes first, so the split point is known before streaming. */
    uint64_t total = 0;
    uint64_t *sizes = A.sizes = calloc((size_t)nfiles, sizeof *sizes);
    if (!sizes) return 1;
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        if (stat(files[i], &st) != 0) return fail(2, "%s: %s", files[i], strerror(errno));
        if (!S_ISREG(st.st_mode)) return fail(2, "%s: not a regular file%s", files[i], "");
        sizes[i] = (uint64_t)st.st_size;
        total += sizes[i];
    }
    if (total == 0) return fail(2, "empty input: the input files hold no bytes%s%s", "", "");
    uint64_t n_val = (uint64_t)floor((double)total * frac);
    if (n_val > total) n_val = total;
    uint64_t n_train = total - n_val;
    char msg[512];
    if (frac > 0 && n_val < 2) {
        snprintf(msg, sizeof msg, "input too small: %llu bytes give %llu validation tokens with "
                 "--val-fraction %g (need at least 2; use --val-fraction 0 for no validation file)",
                 (unsigned long long)total, (unsigned long long)n_val, frac);
        return fail(2, "%s%s", msg, "");
    }
    if (n_train < 2) {
        snprintf(msg, sizeof msg, "input too small: %llu training tokens (need at least 2)",
                 (unsigned long long)n_train);
        return fail(2, "%s%s", msg, "");
    }

    size_t plen = strlen(prefix) + 16;
    char *train_path = A.train_path = malloc(plen), *val_path = A.val_path = malloc(plen);
    if (!train_path || !val_path) return 1;
    snprintf(train_path, plen, "%s.train.bin", prefix);
    snprintf(val_path, plen, "%s.val.bin", prefix);

    char err[1024];
    gt_data_writer *wt = gt_data_writer_open(train_path, 2, 256, err, sizeof err);
    if (!wt) return fail(2, "%s%s", err, "");
    gt_data_writer *wv = NULL;
    if (n_val > 0) {
        wv = gt_data_writer_open(val_path, 2, 256, err, sizeof err);
        if (!wv) {
            gt_data_writer_abort(wt);
            return fail(2, "%s%s", err, "");
        }
    }

    enum { CHUNK = 1 << 16 };
    unsigned char *buf = A.buf = malloc(CHUNK);
    int32_t *tok = A.tok = malloc(CHUNK * sizeof *tok);
    if (!buf || !tok) return 1;
    uint64_t pos = 0; /* global byte index */
    int rc = 0;
    for (int i = 0; i < nfiles && rc == 0; i++) {
        FILE *f = fopen(files[i], "rb");
        if (!f) {
            rc = fail(2, "%s: %s", files[i], strerror(errno));
            break;
        }
        uint64_t got = 0;
        size_t n;
        while (rc == 0 && (n = fread(buf, 1, CHUNK, f)) > 0) {
            got += n;
            if (got > sizes[i]) break;
            for (size_t k = 0; k < n; k++) tok[k] = buf[k];
            /* bytes [pos, pos+n): the part below n_train goes to train */
            size_t nt = pos >= n_train ? 0 : (n_train - pos < n ? (size_t)(n_train - pos) : n);
            if (nt && gt_data_writer_append(wt, tok, nt, err, sizeof err)) rc = fail(1, "%s%s", err, "");
            if (rc == 0 && n > nt && gt_data_writer_append(wv, tok + nt, n - nt, err, sizeof err))
                rc = fail(1, "%s%s", err, "");
            pos += n;
        }
        if (rc == 0 && ferror(f)) rc = fail(1, "%s: read error: %s", files[i], strerror(errno));
        else if (rc == 0 && got != sizes[i]) rc = fail(1, "%s: %s", files[i], "file changed size while being read");
        fclose(f);
    }
    if (rc != 0) {
        gt_data_writer_abort(wt);
        gt_data_writer_abort(wv);
        return rc;
    }
    uint64_t ct = gt_data_writer_count(wt), cv = wv ? gt_data_writer_count(wv) : 0;
    if (gt_data_writer_finish(wt, err, sizeof err)) {
        gt_data_writer_abort(wv);
        return fail(1, "%s%s", err, "");
    }
    if (wv && gt_data_writer_finish(wv, err, sizeof err)) return fail(1, "%s%s", err, "");

    printf("gtrain-prep: %d file%s, %llu bytes, byte-level tokens (vocab_size 256, 2 bytes each)\n",
           nfiles, nfiles == 1 ? "" : "s", (unsigned long long)total);
    printf("  %s: %llu tokens\n", train_path, (unsigned long long)ct);
    if (wv) printf("  %s: %llu tokens\n", val_path, (unsigned long long)cv);
    else printf("  no validation file (--val-fraction 0)\n");
    return 0;
}
