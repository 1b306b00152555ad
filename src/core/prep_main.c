/* gtrain-prep: byte-level tokenisation of text files into gtrain token files (see data.h).
 * Never touches MPI. */
#define _POSIX_C_SOURCE 200809L
#include "data.h"
#include "exitcodes.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
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

/* Prints "gtrain-prep: MESSAGE" on stderr and returns rc, the exit status. */
static int fail(int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gtrain-prep: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
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

typedef struct prep_args {
    const char *prefix;
    double frac;        /* fraction of the bytes for validation */
    const char **files; /* = A.files */
    int nfiles;
} prep_args;

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

/* -o/--output and --val-fraction, with the value in the next argument or after '='. Returns 0 when
 * the option was taken, else the exit status. */
static int take_option(int argc, char **argv, int *i, prep_args *p) {
    const char *a = argv[*i];
    const char *val = NULL;
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
        return GT_EXIT_BAD_INPUT;
    }
    if (!val) {
        if (*i + 1 >= argc) return fail(GT_EXIT_BAD_INPUT, "option '%s' needs a value", a);
        val = argv[++*i];
    }
    if (is_out) {
        if (!*val) return fail(GT_EXIT_BAD_INPUT, "empty output prefix");
        p->prefix = val;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    double f = strtod(val, &end);
    if (end == val || *end || errno || !isfinite(f) || f < 0.0 || f >= 1.0)
        return fail(GT_EXIT_BAD_INPUT, "--val-fraction '%s' must be a number with 0 <= F < 1", val);
    p->frac = f;
    return 0;
}

/* Fills *p from the command line. Returns -1 to go on, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, prep_args *p) {
    p->prefix = NULL;
    p->frac = 0.1;
    p->nfiles = 0;
    p->files = A.files = calloc((size_t)argc + 1, sizeof *p->files);
    if (!p->files) return 1;
    int opts_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts_done || a[0] != '-' || a[1] == 0) {
            p->files[p->nfiles++] = a;
        } else if (!strcmp(a, "--")) {
            opts_done = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            int rc = take_option(argc, argv, &i, p);
            if (rc) return rc;
        }
    }
    if (!p->prefix) {
        fprintf(stderr, "gtrain-prep: no output prefix: give -o PREFIX\n");
        usage(stderr);
        return GT_EXIT_BAD_INPUT;
    }
    if (p->nfiles == 0) {
        fprintf(stderr, "gtrain-prep: no input files\n");
        usage(stderr);
        return GT_EXIT_BAD_INPUT;
    }
    return -1;
}

/* Sizes first, so the split point is known before streaming: A.sizes, *total and the number of
 * bytes for training (the first ones) and for validation (the rest). 0, or the exit status. */
static int split_point(const prep_args *p, uint64_t *total, uint64_t *n_train, uint64_t *n_val) {
    uint64_t *sizes = A.sizes = calloc((size_t)p->nfiles, sizeof *sizes);
    if (!sizes) return 1;
    *total = 0;
    for (int i = 0; i < p->nfiles; i++) {
        struct stat st;
        if (stat(p->files[i], &st) != 0) return fail(GT_EXIT_BAD_INPUT, "%s: %s", p->files[i], strerror(errno));
        if (!S_ISREG(st.st_mode)) return fail(GT_EXIT_BAD_INPUT, "%s: not a regular file", p->files[i]);
        sizes[i] = (uint64_t)st.st_size;
        *total += sizes[i];
    }
    if (*total == 0) return fail(GT_EXIT_BAD_INPUT, "empty input: the input files hold no bytes");
    *n_val = (uint64_t)floor((double)*total * p->frac);
    if (*n_val > *total) *n_val = *total;
    *n_train = *total - *n_val;
    if (p->frac > 0 && *n_val < 2)
        return fail(GT_EXIT_BAD_INPUT, "input too small: %llu bytes give %llu validation tokens with "
                    "--val-fraction %g (need at least 2; use --val-fraction 0 for no validation file)",
                    (unsigned long long)*total, (unsigned long long)*n_val, p->frac);
    if (*n_train < 2)
        return fail(GT_EXIT_BAD_INPUT, "input too small: %llu training tokens (need at least 2)", (unsigned long long)*n_train);
    return 0;
}

/* Streams the files in order: the first n_train bytes into wt, the rest into wv. 0, or the exit
 * status after a message. */
static int stream_bytes(const prep_args *p, uint64_t n_train, gt_data_writer *wt, gt_data_writer *wv) {
    enum { CHUNK = 1 << 16 };
    unsigned char *buf = A.buf = malloc(CHUNK);
    int32_t *tok = A.tok = malloc(CHUNK * sizeof *tok);
    if (!buf || !tok) return 1;
    char err[1024];
    uint64_t pos = 0; /* global byte index */
    int rc = 0;
    for (int i = 0; i < p->nfiles && rc == 0; i++) {
        FILE *f = fopen(p->files[i], "rb");
        if (!f) return fail(GT_EXIT_BAD_INPUT, "%s: %s", p->files[i], strerror(errno));
        uint64_t got = 0;
        size_t n;
        while (rc == 0 && (n = fread(buf, 1, CHUNK, f)) > 0) {
            got += n;
            if (got > A.sizes[i]) break;
            for (size_t k = 0; k < n; k++) tok[k] = buf[k];
            /* bytes [pos, pos+n): the part below n_train goes to train */
            size_t nt = pos >= n_train ? 0 : (n_train - pos < n ? (size_t)(n_train - pos) : n);
            if (nt && gt_data_writer_append(wt, tok, nt, err, sizeof err)) rc = fail(GT_EXIT_FAILURE, "%s", err);
            if (rc == 0 && n > nt && gt_data_writer_append(wv, tok + nt, n - nt, err, sizeof err))
                rc = fail(GT_EXIT_FAILURE, "%s", err);
            pos += n;
        }
        if (rc == 0 && ferror(f)) rc = fail(GT_EXIT_FAILURE, "%s: read error: %s", p->files[i], strerror(errno));
        else if (rc == 0 && got != A.sizes[i]) rc = fail(GT_EXIT_FAILURE, "%s: file changed size while being read", p->files[i]);
        fclose(f);
    }
    return rc;
}

static int prep(int argc, char **argv) {
    prep_args p;
    int rc = parse_args(argc, argv, &p);
    if (rc >= 0) return rc;
    uint64_t total, n_train, n_val;
    if ((rc = split_point(&p, &total, &n_train, &n_val))) return rc;

    size_t plen = strlen(p.prefix) + 16;
    char *train_path = A.train_path = malloc(plen), *val_path = A.val_path = malloc(plen);
    if (!train_path || !val_path) return 1;
    snprintf(train_path, plen, "%s.train.bin", p.prefix);
    snprintf(val_path, plen, "%s.val.bin", p.prefix);

    char err[1024];
    gt_data_writer *wt = gt_data_writer_open(train_path, 2, 256, err, sizeof err);
    if (!wt) return fail(GT_EXIT_BAD_INPUT, "%s", err);
    gt_data_writer *wv = NULL;
    if (n_val > 0) {
        wv = gt_data_writer_open(val_path, 2, 256, err, sizeof err);
        if (!wv) {
            gt_data_writer_abort(wt);
            return fail(GT_EXIT_BAD_INPUT, "%s", err);
        }
    }
    if ((rc = stream_bytes(&p, n_train, wt, wv))) {
        gt_data_writer_abort(wt);
        gt_data_writer_abort(wv);
        return rc;
    }
    uint64_t ct = gt_data_writer_count(wt), cv = wv ? gt_data_writer_count(wv) : 0;
    if (gt_data_writer_finish(wt, err, sizeof err)) {
        gt_data_writer_abort(wv);
        return fail(GT_EXIT_FAILURE, "%s", err);
    }
    if (wv && gt_data_writer_finish(wv, err, sizeof err)) return fail(GT_EXIT_FAILURE, "%s", err);

    printf("gtrain-prep: %d file%s, %llu bytes, byte-level tokens (vocab_size 256, 2 bytes each)\n",
           p.nfiles, p.nfiles == 1 ? "" : "s", (unsigned long long)total);
    printf("  %s: %llu tokens\n", train_path, (unsigned long long)ct);
    if (wv) printf("  %s: %llu tokens\n", val_path, (unsigned long long)cv);
    else printf("  no validation file (--val-fraction 0)\n");
    return 0;
}
