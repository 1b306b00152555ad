/* Unit tests for the token data layer (src/core/data.c) and gtrain-prep.
 * argv[1]: path of the gtrain-prep executable. */
#define _POSIX_C_SOURCE 200809L
#include "data.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;
#define CHECK(c)                                                                         \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);        \
            failures++;                                                                  \
        }                                                                                \
    } while (0)

static char dir[64];

static char *pth(const char *name) {
    static char buf[8][256];
    static int k = 0;
    char *b = buf[k++ & 7];
    snprintf(b, 256, "%s/%s", dir, name);
    return b;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

/* run prog with args (NULL-terminated), stdout/stderr to files; return exit status */
static int run(char *const argv[], const char *out, const char *errf) {
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        if (!freopen(out, "w", stdout) || !freopen(errf, "w", stderr)) _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int contains_file(const char *path, const char *needle) {
    size_t n;
    unsigned char *b = read_all(path, &n);
    if (!b) return 0;
    b[n] = 0;
    int r = strstr((char *)b, needle) != NULL;
    free(b);
    return r;
}

/* ---------------------------------------------------------------- prep round trip */

static const char *TEXT_A =
    "The quick brown fox jumps over the lazy dog.\n%\nAll work and no play makes Jack a dull boy.\n";
static const char *TEXT_B =
    "It was the best of times, it was the worst of times.\n\xc3\xa9t\xc3\xa9 \x01\x7f\xff bytes\n%\n"
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.\n";

static void test_prep_roundtrip(const char *prep) {
    write_file(pth("a.txt"), TEXT_A, strlen(TEXT_A));
    write_file(pth("b.txt"), TEXT_B, strlen(TEXT_B));
    size_t la = strlen(TEXT_A), lb = strlen(TEXT_B), total = la + lb;
    unsigned char *src = malloc(total);
    memcpy(src, TEXT_A, la);
    memcpy(src + la, TEXT_B, lb);

    char *argv[] = {(char *)prep, "--val-fraction", "0.25", "-o", pth("rt"), pth("a.txt"),
                    pth("b.txt"), NULL};
    int rc = run(argv, pth("out.txt"), pth("err.txt"));
    CHECK(rc == 0);
    CHECK(contains_file(pth("out.txt"), "tokens"));

    size_t n_val = (size_t)(total * 0.25), n_train = total - n_val;
    char err[512];
    gt_data *tr = gt_data_open(pth("rt.train.bin"), err, sizeof err);
    gt_data *va = gt_data_open(pth("rt.val.bin"), err, sizeof err);
    CHECK(tr && va);
    if (!tr || !va) {
        fprintf(stderr, "open: %s\n", err);
        exit(1);
    }
    CHECK(gt_data_token_count(tr) == n_train);
    CHECK(gt_data_token_count(va) == n_val);
    CHECK(gt_data_vocab_size(tr) == 256 && gt_data_vocab_size(va) == 256);
    CHECK(gt_data_token_bytes(tr) == 2);
    /* same text as the source, in order */
    for (size_t i = 0; i < n_train; i++) CHECK(gt_data_token(tr, i) == src[i]);
    for (size_t i = 0; i < n_val; i++) CHECK(gt_data_token(va, i) == src[n_train + i]);
    int mx = 0;
    for (size_t i = 0; i < n_train; i++) mx = src[i] > mx ? src[i] : mx;
    CHECK(gt_data_max_token(tr) == mx);
    CHECK(gt_data_max_token(tr) == mx); /* cached path */
    CHECK(gt_data_max_token(tr) < 256);

    /* train batches: shifted by one, < 256, equal to the source window at sample_start */
    enum { T = 16, N = 8 };
    CHECK(gt_data_check_seq(tr, T, err, sizeof err) == 0);
    int32_t in[N * T], tg[N * T];
    gt_data_train_batch(tr, 1234, 0, N, T, in, tg);
    for (int s = 0; s < N; s++) {
        uint64_t st = gt_data_sample_start(tr, 1234, (uint64_t)s, T);
        CHECK(st + T < n_train);
        for (int t = 0; t < T; t++) {
            CHECK(in[s * T + t] >= 0 && in[s * T + t] < 256);
            CHECK(in[s * T + t] == src[st + t]);
            CHECK(tg[s * T + t] == src[st + t + 1]);
            if (t + 1 < T) CHECK(tg[s * T + t] == in[s * T + t + 1]);
        }
    }
    /* validation batches: sequential windows */
    uint64_t nw = gt_data_val_windows(va, 4);
    CHECK(nw == (n_val - 1) / 4);
    int32_t vin[2 * 4], vtg[2 * 4];
    gt_data_val_batch(va, 1, 2, 4, vin, vtg);
    for (int i = 0; i < 2; i++) {
        uint64_t w = (uint64_t)(2 + i) % nw;
        for (int t = 0; t < 4; t++) {
            CHECK(vin[i * 4 + t] == src[n_train + w * 4 + t]);
            CHECK(vtg[i * 4 + t] == src[n_train + w * 4 + t + 1]);
        }
    }
    gt_data_close(tr);
    gt_data_close(va);

    /* --val-fraction 0: train only, all bytes */
    char *argv0[] = {(char *)prep, "--val-fraction=0", "--output", pth("nv"), pth("a.txt"), NULL};
    CHECK(run(argv0, pth("out.txt"), pth("err.txt")) == 0);
    tr = gt_data_open(pth("nv.train.bin"), err, sizeof err);
    CHECK(tr && gt_data_token_count(tr) == la);
    gt_data_close(tr);
    CHECK(access(pth("nv.val.bin"), F_OK) != 0);
    free(src);
}

/* ---------------------------------------------------------------- prep CLI errors */

static void expect_prep(char *const argv[], int want, const char *msg) {
    int rc = run(argv, pth("out.txt"), pth("err.txt"));
    if (rc != want) fprintf(stderr, "gtrain-prep %s: exit %d, want %d\n", argv[1] ? argv[1] : "", rc, want);
    CHECK(rc == want);
    if (msg) {
        int ok = contains_file(pth("err.txt"), msg);
        if (!ok) fprintf(stderr, "stderr lacks \"%s\"\n", msg);
        CHECK(ok);
    }
}

static void test_prep_errors(const char *prep) {
    write_file(pth("empty.txt"), "", 0);
    char *p = (char *)prep;
    char *a1[] = {p, "-o", pth("x"), pth("does-not-exist.txt"), NULL};
    expect_prep(a1, 2, "does-not-exist.txt");
    char *a2[] = {p, "--val-fraction", "1", "-o", pth("x"), pth("a.txt"), NULL};
    expect_prep(a2, 2, "val-fraction");
    char *a3[] = {p, "--val-fraction", "-0.5", "-o", pth("x"), pth("a.txt"), NULL};
    expect_prep(a3, 2, "val-fraction");
    char *a4[] = {p, "--val-fraction", "abc", "-o", pth("x"), pth("a.txt"), NULL};
    expect_prep(a4, 2, "val-fraction");
    char *a5[] = {p, pth("a.txt"), NULL};
    expect_prep(a5, 2, "-o");
    char *a6[] = {p, "-o", pth("x"), pth("empty.txt"), NULL};
    expect_prep(a6, 2, "empty input");
    char *a7[] = {p, "-o", pth("x"), NULL};
    expect_prep(a7, 2, "no input files");
    char *a8[] = {p, "--bogus", NULL};
    expect_prep(a8, 2, "unknown option");
    char *a9[] = {p, "-o", pth("no-such-dir/x"), pth("a.txt"), NULL};
    expect_prep(a9, 2, "no-such-dir");
    char *a10[] = {p, "--help", NULL};
    expect_prep(a10, 0, NULL);
    CHECK(contains_file(pth("out.txt"), "usage: gtrain-prep"));
    CHECK(access(pth("x.train.bin"), F_OK) != 0);
}

/* ---------------------------------------------------------------- sampling */

static void make_tokens(const char *path, int tb, uint32_t vocab, const int32_t *t, size_t n) {
    char err[512];
    gt_data_writer *w = gt_data_writer_open(path, tb, vocab, err, sizeof err);
    if (!w || gt_data_writer_append(w, t, n, err, sizeof err) || gt_data_writer_finish(w, err, sizeof err)) {
        fprintf(stderr, "writer: %s\n", err);
        exit(1);
    }
}

static void test_sampling(void) {
    enum { NT = 1000, T = 7 };
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = (i * 37 + 11) % 251;
    make_tokens(pth("s.bin"), 2, 256, toks, NT);
    char err[512];
    gt_data *d = gt_data_open(pth("s.bin"), err, sizeof err);
    CHECK(d != NULL);
    if (!d) return;

    /* determinism: same (seed, s) -> same sample */
    int32_t a[4 * T], b[4 * T], c[4 * T], e[4 * T], one_in[T], one_tg[T];
    gt_data_train_batch(d, 42, 100, 4, T, a, b);
    gt_data_train_batch(d, 42, 100, 4, T, c, e);
    CHECK(!memcmp(a, c, sizeof a) && !memcmp(b, e, sizeof b));
    /* a batch of 4 samples == 4 batches of 1 (world-size independence) */
    for (int i = 0; i < 4; i++) {
        gt_data_train_batch(d, 42, 100 + (uint64_t)i, 1, T, one_in, one_tg);
        CHECK(!memcmp(one_in, a + i * T, sizeof one_in));
        CHECK(!memcmp(one_tg, b + i * T, sizeof one_tg));
    }
    /* e.g. 2 ranks x 2 sequences == 1 rank x 4 sequences */
    gt_data_train_batch(d, 42, 100, 2, T, c, e);
    gt_data_train_batch(d, 42, 102, 2, T, c + 2 * T, e + 2 * T);
    CHECK(!memcmp(a, c, sizeof a) && !memcmp(b, e, sizeof b));
    /* a different seed gives different samples */
    gt_data_train_batch(d, 43, 100, 4, T, c, e);
    CHECK(memcmp(a, c, sizeof a) != 0);
    /* windows come from the file, shifted by one */
    for (int i = 0; i < 4; i++) {
        uint64_t st = gt_data_sample_start(d, 42, 100 + (uint64_t)i, T);
        for (int t = 0; t < T; t++) {
            CHECK(a[i * T + t] == toks[st + t]);
            CHECK(b[i * T + t] == toks[st + t + 1]);
        }
    }
    /* starts cover [0, NT - T - 1] and stay inside it */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint64_t s = 0; s < 200000; s++) {
        uint64_t st = gt_data_sample_start(d, 7, s, T);
        lo = st < lo ? st : lo;
        hi = st > hi ? st : hi;
    }
    CHECK(lo == 0 && hi == NT - T - 1);
    /* check_seq */
    CHECK(gt_data_check_seq(d, NT - 1, err, sizeof err) == 0);
    CHECK(gt_data_check_seq(d, NT, err, sizeof err) != 0 && strstr(err, "s.bin") && strstr(err, "1000"));
    CHECK(gt_data_check_seq(d, 0, err, sizeof err) != 0);
    /* exactly T+1 tokens: the only start is 0 */
    CHECK(gt_data_sample_start(d, 99, 5, NT - 1) == 0);

    /* validation: fixed sequential windows with wrap */
    uint64_t nw = gt_data_val_windows(d, T);
    CHECK(nw == (NT - 1) / T);
    int32_t vi[3 * T], vt[3 * T];
    int batch = (int)(nw / 3); /* windows 3*batch .. 3*batch+2 wrap past nw when nw % 3 != 0 */
    gt_data_val_batch(d, batch, 3, T, vi, vt);
    for (int i = 0; i < 3; i++) {
        uint64_t w = ((uint64_t)batch * 3 + i) % nw;
        for (int t = 0; t < T; t++) {
            CHECK(vi[i * T + t] == toks[w * T + t]);
            CHECK(vt[i * T + t] == toks[w * T + t + 1]);
        }
    }
    CHECK(((NT - 1) / T) * T + 1 <= NT);
    gt_data_close(d);

    /* 4-byte tokens with large ids */
    int32_t big[5] = {0, 70000, 123456789, 5, 70000};
    make_tokens(pth("w4.bin"), 4, 200000000u, big, 5);
    d = gt_data_open(pth("w4.bin"), err, sizeof err);
    CHECK(d && gt_data_token_bytes(d) == 4 && gt_data_token_count(d) == 5);
    if (d) {
        CHECK(gt_data_max_token(d) == 123456789);
        int32_t x[2 * 2], y[2 * 2];
        gt_data_val_batch(d, 0, 2, 2, x, y);
        CHECK(x[0] == 0 && x[1] == 70000 && y[0] == 70000 && y[1] == 123456789);
        CHECK(x[2] == 123456789 && x[3] == 5 && y[3] == 70000);
        gt_data_close(d);
    }
    /* writer rejects out-of-vocab tokens and leaves no file behind */
    gt_data_writer *w = gt_data_writer_open(pth("bad.bin"), 2, 256, err, sizeof err);
    int32_t oov[2] = {1, 256};
    CHECK(w && gt_data_writer_append(w, oov, 2, err, sizeof err) != 0 && strstr(err, "256"));
    gt_data_writer_abort(w);
    CHECK(access(pth("bad.bin"), F_OK) != 0);
}

/* ---------------------------------------------------------------- several files, llm.c shards */

/* An llm.c shard as llm.c's data scripts write it: 256 int32 (magic, version, count), u16 tokens. */
static void write_llmc(const char *path, const uint16_t *t, size_t n, size_t claim) {
    int32_t hdr[256] = {0};
    hdr[0] = 20240520;
    hdr[1] = 1;
    hdr[2] = (int32_t)claim;
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(hdr, sizeof hdr, 1, f) != 1 || fwrite(t, 2, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static void test_llmc_shard_is_read_as_it_is(void) {
    uint16_t t[300];
    for (int i = 0; i < 300; i++) t[i] = (uint16_t)((i * 7919) % 50257);
    write_llmc(pth("l.bin"), t, 300, 300);
    char err[512];
    gt_data *d = gt_data_open(pth("l.bin"), err, sizeof err);
    CHECK(d != NULL);
    if (!d) return;
    CHECK(gt_data_token_count(d) == 300 && gt_data_token_bytes(d) == 2 && gt_data_vocab_size(d) == 0);
    CHECK(!strcmp(gt_data_file_format(d, 0), "llm.c"));
    int ok = 1, mx = 0;
    for (int i = 0; i < 300; i++) {
        ok &= gt_data_token(d, (uint64_t)i) == t[i];
        mx = t[i] > mx ? t[i] : mx;
    }
    CHECK(ok);
    /* no vocabulary in the header: the largest id decides; a u16 shard needs no scan for >= 65536 */
    CHECK(gt_data_check_vocab(d, 50257, err, sizeof err) == 0);
    CHECK(gt_data_check_vocab(d, 65536, err, sizeof err) == 0);
    CHECK(gt_data_check_vocab(d, mx, err, sizeof err) != 0 && strstr(err, "l.bin") && strstr(err, "llm.c"));
    gt_data_close(d);

    /* truncated (fewer tokens than the header says), a header cut short, a wrong version */
    write_llmc(pth("ltrunc.bin"), t, 299, 300);
    d = gt_data_open(pth("ltrunc.bin"), err, sizeof err);
    CHECK(!d && strstr(err, "ltrunc.bin") && strstr(err, "size mismatch") && strstr(err, "llm.c"));
    int32_t h[100] = {20240520, 1, 10};
    write_file(pth("lshort.bin"), h, sizeof h);
    d = gt_data_open(pth("lshort.bin"), err, sizeof err);
    CHECK(!d && strstr(err, "lshort.bin") && strstr(err, "truncated llm.c header"));
    int32_t hv[256 + 5] = {20240520, 3, 10};
    write_file(pth("lver.bin"), hv, 1024 + 20);
    d = gt_data_open(pth("lver.bin"), err, sizeof err);
    CHECK(!d && strstr(err, "lver.bin") && strstr(err, "version 3"));
}

static void test_several_files_one_sample_space(void) {
    enum { T = 5 };
    /* three shards: 40 tokens, 3 tokens (too short for T = 5: never sampled), 25 tokens; ids tell
     * shard and position apart: shard k holds 1000*k + position */
    int32_t a[40], b[3], c[25];
    for (int i = 0; i < 40; i++) a[i] = i;
    for (int i = 0; i < 3; i++) b[i] = 1000 + i;
    for (int i = 0; i < 25; i++) c[i] = 2000 + i;
    make_tokens(pth("m.000.bin"), 2, 4000, a, 40);
    make_tokens(pth("m.001.bin"), 2, 4000, b, 3);
    make_tokens(pth("m.002.bin"), 4, 4000, c, 25);
    char err[512], spec[600];
    snprintf(spec, sizeof spec, "%s", pth("m.*.bin"));
    gt_data *d = gt_data_open(spec, err, sizeof err);
    CHECK(d != NULL);
    if (!d) {
        fprintf(stderr, "open: %s\n", err);
        return;
    }
    CHECK(gt_data_n_files(d) == 3 && gt_data_token_count(d) == 68 && gt_data_token_bytes(d) == 4);
    CHECK(strstr(gt_data_file_path(d, 0), "m.000.bin") && strstr(gt_data_file_path(d, 2), "m.002.bin"));
    CHECK(gt_data_token(d, 39) == 39 && gt_data_token(d, 40) == 1000 && gt_data_token(d, 43) == 2000);
    CHECK(gt_data_check_seq(d, T, err, sizeof err) == 0);
    char line[512];
    gt_data_describe(d, line, sizeof line);
    CHECK(strstr(line, "3 files, 68 tokens") && strstr(line, "m.000.bin"));

    /* every window lies inside one shard, shifted by one; all 35 + 20 windows are drawn */
    int seen[68] = {0}, inside = 1;
    for (uint64_t s = 0; s < 20000; s++) {
        int32_t in[T], tg[T];
        gt_data_train_batch(d, 11, s, 1, T, in, tg);
        int shard = in[0] / 1000;
        for (int t = 0; t < T; t++)
            inside &= in[t] / 1000 == shard && tg[t] / 1000 == shard && tg[t] == in[t] + 1 && shard != 1;
        seen[gt_data_sample_start(d, 11, s, T)] = 1;
    }
    CHECK(inside);
    int n_seen = 0;
    for (int i = 0; i < 68; i++) n_seen += seen[i];
    CHECK(n_seen == 35 + 20 && seen[0] && seen[34] && !seen[35] && seen[43] && seen[43 + 19] && !seen[43 + 20]);

    /* the same spec as a comma list gives the same samples (world-size independence is per sample) */
    snprintf(spec, sizeof spec, "%s, %s,%s", pth("m.000.bin"), pth("m.001.bin"), pth("m.002.bin"));
    gt_data *e = gt_data_open(spec, err, sizeof err);
    CHECK(e != NULL);
    if (e) {
        int32_t x[4 * T], y[4 * T], u[4 * T], v[4 * T];
        gt_data_train_batch(d, 5, 77, 4, T, x, y);
        gt_data_train_batch(e, 5, 77, 2, T, u, v); /* "rank 0" */
        gt_data_train_batch(e, 5, 79, 2, T, u + 2 * T, v + 2 * T); /* "rank 1" */
        CHECK(!memcmp(x, u, sizeof x) && !memcmp(y, v, sizeof y));
        gt_data_close(e);
    }

    /* validation windows: 7 of shard 0 ((40-1)/5), none of shard 1, 4 of shard 2 ((25-1)/5) */
    CHECK(gt_data_val_windows(d, T) == 11);
    int32_t vi[11 * T], vt[11 * T];
    gt_data_val_batch(d, 0, 11, T, vi, vt);
    CHECK(vi[0] == 0 && vi[6 * T] == 30 && vt[6 * T + T - 1] == 35 && vi[7 * T] == 2000 && vi[10 * T] == 2015);

    /* vocabulary: headers say 4000 */
    CHECK(gt_data_vocab_size(d) == 4000);
    CHECK(gt_data_check_vocab(d, 4000, err, sizeof err) == 0);
    CHECK(gt_data_check_vocab(d, 2024, err, sizeof err) != 0 && strstr(err, "m.002.bin") && strstr(err, "2024"));
    CHECK(gt_data_check_vocab(d, 2025, err, sizeof err) == 0); /* a scan: the largest id is 2024 */
    /* T = 25: only shard 0 has 26 tokens */
    CHECK(gt_data_check_seq(d, 25, err, sizeof err) == 0 && gt_data_sample_start(d, 3, 9, 25) < 15);
    CHECK(gt_data_check_seq(d, 40, err, sizeof err) != 0 && strstr(err, "no file has") && strstr(err, "m.000.bin"));
    gt_data_close(d);

    /* a pattern matching nothing; a bad file among several is named */
    snprintf(spec, sizeof spec, "%s,%s", pth("m.000.bin"), pth("nothing.*.bin"));
    d = gt_data_open(spec, err, sizeof err);
    CHECK(!d && strstr(err, "nothing.*.bin") && strstr(err, "matches no file"));
    write_file(pth("m.003.bin"), "junk junk junk junk junk junk junk junk", 39);
    snprintf(spec, sizeof spec, "%s", pth("m.*.bin"));
    d = gt_data_open(spec, err, sizeof err);
    CHECK(!d && strstr(err, "m.003.bin") && strstr(err, "bad magic"));
    unlink(pth("m.003.bin"));
    char **paths = NULL;
    int n = 0;
    CHECK(gt_data_expand(" , ", &paths, &n, err, sizeof err) != 0 && n == 0);
}

/* ---------------------------------------------------------------- weighted blends */

static void test_blend(void) {
    enum { T = 4 };
    /* web: two files (tokens 0.., 100..), code: one small file (200..), math: one big file (300..):
     * sizes deliberately unlike the weights */
    int32_t w0[30], w1[20], c0[8], m0[90];
    for (int i = 0; i < 30; i++) w0[i] = i;
    for (int i = 0; i < 20; i++) w1[i] = 100 + i;
    for (int i = 0; i < 8; i++) c0[i] = 200 + i;
    for (int i = 0; i < 90; i++) m0[i] = 300 + i;
    make_tokens(pth("web.000.bin"), 2, 400, w0, 30);
    make_tokens(pth("web.001.bin"), 2, 400, w1, 20);
    make_tokens(pth("code.bin"), 2, 400, c0, 8);
    make_tokens(pth("math.bin"), 4, 400, m0, 90);
    char err[1024], spec[1024];
    snprintf(spec, sizeof spec, "%s:0.7, %s:0.2,%s : 0.1", pth("web.*.bin"), pth("code.bin"), pth("math.bin"));
    gt_data *d = gt_data_open(spec, err, sizeof err);
    CHECK(d != NULL);
    if (!d) {
        fprintf(stderr, "open: %s\n", err);
        return;
    }
    CHECK(gt_data_weighted(d) && gt_data_n_sources(d) == 3 && gt_data_n_files(d) == 4);
    CHECK(!strcmp(gt_data_source_name(d, 0), "web") && !strcmp(gt_data_source_name(d, 1), "code") &&
          !strcmp(gt_data_source_name(d, 2), "math"));
    CHECK(gt_data_source_tokens(d, 0) == 50 && gt_data_source_tokens(d, 2) == 90);
    CHECK(gt_data_check_seq(d, T, err, sizeof err) == 0);
    const double want[3] = {0.7, 0.2, 0.1};
    for (uint64_t seed = 0; seed < 4; seed++) {
        /* 10,000 samples drawn (by whole batches, as the trainer does): each source within 1% of its
         * weight, and every window lies in one file of the source the sampler names */
        int cnt[3] = {0}, inside = 1;
        for (uint64_t s = 0; s < 10000; s += 8) {
            int32_t in[8 * T], tg[8 * T];
            int nb = s + 8 <= 10000 ? 8 : (int)(10000 - s);
            gt_data_train_batch(d, seed, s, nb, T, in, tg);
            for (int b = 0; b < nb; b++) {
                int src = gt_data_sample_source(d, seed, s + (uint64_t)b);
                int file = in[b * T] / 100; /* 0, 1: web; 2: code; 3: math */
                int from = file <= 1 ? 0 : file - 1;
                inside &= from == src;
                for (int t = 0; t < T; t++) inside &= in[b * T + t] / 100 == file && tg[b * T + t] == in[b * T + t] + 1;
                cnt[from]++;
            }
        }
        CHECK(inside);
        for (int j = 0; j < 3; j++) {
            double share = cnt[j] / 10000.0;
            int ok = share > want[j] - 0.01 && share < want[j] + 0.01;
            if (!ok) fprintf(stderr, "blend seed %llu: source %d share %.4f, weight %.2f\n", (unsigned long long)seed, j, share, want[j]);
            CHECK(ok);
        }
    }
    /* every window of a source is drawn (both web files, all of code's 4) */
    int seen[400] = {0};
    for (uint64_t s = 0; s < 20000; s++) {
        int32_t in[T], tg[T];
        gt_data_train_batch(d, 3, s, 1, T, in, tg);
        seen[in[0]] = 1;
    }
    int all = 1;
    for (int i = 0; i <= 30 - T - 1; i++) all &= seen[i];
    for (int i = 0; i <= 20 - T - 1; i++) all &= seen[100 + i];
    for (int i = 0; i <= 8 - T - 1; i++) all &= seen[200 + i];
    CHECK(all && !seen[200 + 8 - T]);
    /* a batch of n samples = n batches of one sample (any micro-batch split, any world size) */
    int32_t x[6 * T], y[6 * T], u[6 * T], v[6 * T];
    gt_data_train_batch(d, 9, 1234, 6, T, x, y);
    for (int i = 0; i < 6; i++) gt_data_train_batch(d, 9, 1234 + (uint64_t)i, 1, T, u + i * T, v + i * T);
    CHECK(!memcmp(x, u, sizeof x) && !memcmp(y, v, sizeof y));
    /* the realised mix line names each source, its share and its weight */
    char line[1024];
    gt_data_describe_mix(d, 0, 0, 10000, line, sizeof line);
    CHECK(strstr(line, "web 7") && strstr(line, "weight 70.00%") && strstr(line, "code 2") && strstr(line, "math"));
    /* validation by source: web has 7 + 4 windows, code 1, math 22 */
    CHECK(gt_data_val_windows_source(d, 0, T) == 11 && gt_data_val_windows_source(d, 1, T) == 1 &&
          gt_data_val_windows_source(d, 2, T) == 22 && gt_data_val_windows(d, T) == 34);
    int32_t vi[2 * T], vt[2 * T];
    gt_data_val_batch_source(d, 2, 0, 2, T, vi, vt);
    CHECK(vi[0] == 300 && vi[T] == 304 && vt[T + T - 1] == 308);
    gt_data_val_batch_source(d, 1, 5, 2, T, vi, vt); /* one window: wraps */
    CHECK(vi[0] == 200 && vi[T] == 200);
    /* T = 8: code (8 tokens) has no window, so its weight cannot be honoured */
    CHECK(gt_data_check_seq(d, 8, err, sizeof err) != 0 && strstr(err, "'code'"));
    gt_data_close(d);

    /* one weighted source draws what the unweighted spec draws */
    snprintf(spec, sizeof spec, "%s:3", pth("web.*.bin"));
    gt_data *a = gt_data_open(spec, err, sizeof err);
    gt_data *b = gt_data_open(pth("web.*.bin"), err, sizeof err);
    CHECK(a && b && gt_data_weighted(a) && !gt_data_weighted(b));
    if (a && b) {
        CHECK(gt_data_check_seq(a, T, err, sizeof err) == 0 && gt_data_check_seq(b, T, err, sizeof err) == 0);
        int same = 1;
        for (uint64_t s = 0; s < 500; s++) same &= gt_data_sample_start(a, 5, s, T) == gt_data_sample_start(b, 5, s, T);
        CHECK(same);
    }
    gt_data_close(a);
    gt_data_close(b);

    /* bad specs: one line naming the problem (and, through check_readable, the config place) */
    const char *bad[][2] = {
        {"%s:0", "not a positive number"},       {"%s:-0.5", "not a positive number"},
        {"%s:nan", "not a positive number"},     {"%s:", "no weight"},
        {"%s:0.5, %s", "some sources have a weight"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(spec, sizeof spec, bad[i][0], pth("code.bin"), pth("math.bin"));
        err[0] = 0;
        gt_data *x1 = gt_data_open(spec, err, sizeof err);
        int ok = !x1 && strstr(err, bad[i][1]);
        CHECK(gt_data_check_readable(spec, "tiny.ini:3: data.train", err, sizeof err) == 2 &&
              strstr(err, "tiny.ini:3: data.train") && strstr(err, bad[i][1]));
        if (!ok) fprintf(stderr, "bad spec '%s': %s\n", spec, err);
        CHECK(ok);
        gt_data_close(x1);
    }
    snprintf(spec, sizeof spec, "%s:0.5, %s:0.5", pth("code.bin"), pth("nothing.*.bin"));
    CHECK(gt_data_check_readable(spec, "tiny.ini:3: data.train", err, sizeof err) == 2 && strstr(err, "matches no file") &&
          strstr(err, "nothing.*.bin"));
    CHECK(gt_data_spec_weighted("a.bin:1") && !gt_data_spec_weighted("a.bin") && !gt_data_spec_weighted("a:b.bin"));
}

/* ---------------------------------------------------------------- loss masks */

static void write_mask(const char *path, const unsigned char *m, uint64_t n) {
    unsigned char hdr[GT_DATA_HEADER_BYTES];
    gt_data_encode_header(hdr, 1, n, 0);
    memcpy(hdr, GT_MASK_MAGIC, 8);
    unsigned char *b = malloc(sizeof hdr + n);
    memcpy(b, hdr, sizeof hdr);
    memcpy(b + sizeof hdr, m, n);
    write_file(path, b, sizeof hdr + n);
    free(b);
}

static void test_loss_mask(void) {
    enum { T = 4, N = 40 };
    int32_t t[N];
    unsigned char m[N];
    for (int i = 0; i < N; i++) {
        t[i] = i;
        m[i] = (i % 10) >= 6; /* tokens 6..9, 16..19, ...: the "answers" */
    }
    make_tokens(pth("chat.000.bin"), 2, 100, t, N);
    write_mask(pth("chat.000.mask"), m, N);
    make_tokens(pth("plain.bin"), 2, 100, t, N); /* no mask */
    char err[1024], mp[300];
    gt_data_mask_path("a/b.train.000.bin", mp, sizeof mp);
    CHECK(!strcmp(mp, "a/b.train.000.mask"));
    gt_data_mask_path("x.tok", mp, sizeof mp);
    CHECK(!strcmp(mp, "x.tok.mask"));
    gt_data *d = gt_data_open(pth("chat.000.bin"), err, sizeof err);
    CHECK(d && gt_data_load_masks(d, GT_DATA_MASK_AUTO, "w", err, sizeof err) == 0 && gt_data_has_masks(d));
    if (!d) return;
    CHECK(gt_data_check_seq(d, T, err, sizeof err) == 0);
    uint64_t counted = 0, want = 0;
    for (uint64_t s = 0; s < 200; s++) {
        int32_t in[T], tg[T];
        gt_data_train_batch(d, 1, s, 1, T, in, tg);
        for (int k = 0; k < T; k++) {
            int pos = in[k] + 1; /* the target's position */
            CHECK(tg[k] == (m[pos] ? pos : -1));
            want += m[pos];
        }
        counted += gt_data_train_counted(d, 1, s, 1, T);
    }
    CHECK(counted == want && gt_data_train_counted(d, 1, 0, 200, T) == want && want > 0 && want < 200 * T);
    int32_t vi[T], vt[T];
    gt_data_val_batch(d, 1, 1, T, vi, vt); /* window 1: tokens 4..8 */
    CHECK(vi[0] == 4 && vt[0] == -1 && vt[1] == 6 && vt[3] == 8);
    gt_data_close(d);
    /* off: no masks; on: a file without a mask is refused, naming it and the place */
    d = gt_data_open(pth("chat.000.bin"), err, sizeof err);
    CHECK(d && gt_data_load_masks(d, GT_DATA_MASK_OFF, "w", err, sizeof err) == 0 && !gt_data_has_masks(d));
    gt_data_close(d);
    char spec[700];
    snprintf(spec, sizeof spec, "%s,%s", pth("chat.000.bin"), pth("plain.bin"));
    d = gt_data_open(spec, err, sizeof err);
    CHECK(d && gt_data_load_masks(d, GT_DATA_MASK_ON, "run.ini:9: [data] loss_mask", err, sizeof err) != 0 &&
          strstr(err, "run.ini:9: [data] loss_mask") && strstr(err, "plain.bin") && strstr(err, "plain.mask"));
    gt_data_close(d);
    d = gt_data_open(spec, err, sizeof err); /* auto: the plain file counts every token */
    CHECK(d && gt_data_load_masks(d, GT_DATA_MASK_AUTO, "w", err, sizeof err) == 0 && gt_data_has_masks(d));
    gt_data_close(d);
    /* a mask of the wrong length is refused, naming the mask file */
    write_mask(pth("chat.000.mask"), m, N - 1);
    d = gt_data_open(pth("chat.000.bin"), err, sizeof err);
    CHECK(d && gt_data_load_masks(d, GT_DATA_MASK_AUTO, "w", err, sizeof err) != 0 && strstr(err, "chat.000.mask") &&
          strstr(err, "39 entries"));
    gt_data_close(d);
}

/* data.separator_loss = false: a target is uncounted (-1) exactly where its input is the separator, on
 * top of a mask, in training and validation batches, and gt_data_train_counted counts what is left */
static void test_separator_uncounted(void) {
    enum { T = 5, N = 60, SEP = 99 };
    int32_t t[N];
    unsigned char m[N];
    for (int i = 0; i < N; i++) {
        t[i] = i % 7 == 3 ? SEP : i;
        m[i] = (i % 10) >= 4;
    }
    make_tokens(pth("sep.bin"), 2, 100, t, N);
    make_tokens(pth("sepm.bin"), 2, 100, t, N);
    write_mask(pth("sepm.mask"), m, N);
    char err[1024];
    for (int masked = 0; masked < 2; masked++) {
        const char *path = pth(masked ? "sepm.bin" : "sep.bin");
        gt_data *all = gt_data_open(path, err, sizeof err), *d = gt_data_open(path, err, sizeof err);
        CHECK(all && d && gt_data_load_masks(all, GT_DATA_MASK_AUTO, "w", err, sizeof err) == 0 &&
              gt_data_load_masks(d, GT_DATA_MASK_AUTO, "w", err, sizeof err) == 0);
        if (!all || !d) return;
        CHECK(gt_data_check_seq(d, T, err, sizeof err) == 0 && gt_data_check_seq(all, T, err, sizeof err) == 0);
        CHECK(gt_data_counts_targets(all) == masked);
        gt_data_uncount_separator(d, SEP);
        CHECK(gt_data_counts_targets(d) && gt_data_has_masks(d) == masked);
        uint64_t want = 0, dropped = 0;
        for (uint64_t s = 0; s < 200; s++) {
            int32_t in0[T], tg0[T], in[T], tg[T];
            gt_data_train_batch(all, 3, s, 1, T, in0, tg0);
            gt_data_train_batch(d, 3, s, 1, T, in, tg);
            for (int k = 0; k < T; k++) {
                CHECK(in[k] == in0[k] && tg[k] == (in[k] == SEP ? -1 : tg0[k]));
                want += tg[k] >= 0;
                dropped += in[k] == SEP && tg0[k] >= 0;
            }
        }
        CHECK(gt_data_train_counted(d, 3, 0, 200, T) == want && dropped > 0 &&
              gt_data_train_counted(all, 3, 0, 200, T) == want + dropped);
        int32_t vi[T], vt[T], vi0[T], vt0[T];
        gt_data_val_batch(all, 0, 1, T, vi0, vt0); /* window 0: tokens 0..5, the separator at 3 */
        gt_data_val_batch(d, 0, 1, T, vi, vt);
        CHECK(vi[3] == SEP && vt[3] == -1 && vt0[3] == 4 && vt[2] == vt0[2] && vt[4] == vt0[4]);
        gt_data_uncount_separator(d, -1); /* counted again */
        CHECK(gt_data_train_counted(d, 3, 0, 200, T) == want + dropped && gt_data_counts_targets(d) == masked);
        gt_data_close(all);
        gt_data_close(d);
    }
}

/* ---------------------------------------------------------------- bad headers */

static void expect_reject(const char *name, const void *bytes, size_t n, const char *what) {
    write_file(pth(name), bytes, n);
    char err[512] = "";
    gt_data *d = gt_data_open(pth(name), err, sizeof err);
    CHECK(d == NULL);
    gt_data_close(d);
    int ok = strstr(err, name) != NULL && strstr(err, what) != NULL;
    if (!ok) fprintf(stderr, "%s: message \"%s\" lacks the file name or \"%s\"\n", name, err, what);
    CHECK(ok);
}

static void test_bad_headers(void) {
    unsigned char buf[32 + 2 * 10];
    for (int i = 0; i < 10; i++) {
        buf[32 + 2 * i] = (unsigned char)('a' + i);
        buf[33 + 2 * i] = 0;
    }
    gt_data_encode_header(buf, 2, 10, 256);
    char err[512];
    write_file(pth("good.bin"), buf, sizeof buf);
    gt_data *d = gt_data_open(pth("good.bin"), err, sizeof err);
    CHECK(d && gt_data_token_count(d) == 10 && gt_data_token(d, 3) == 'd');
    gt_data_close(d);

    unsigned char t[32 + 4 * 10] = {0};
    memcpy(t, buf, sizeof buf);
    t[0] = 'X';
    expect_reject("badmagic.bin", t, sizeof buf, "bad magic");
    memcpy(t, buf, sizeof buf);
    t[8] = 2;
    expect_reject("version2.bin", t, sizeof buf, "version 2");
    gt_data_encode_header(t, 3, 10, 256);
    expect_reject("width3.bin", t, 32 + 30, "token_bytes=3");
    expect_reject("trunc.bin", buf, sizeof buf - 1, "size mismatch");
    {
        unsigned char l[sizeof buf + 1];
        memcpy(l, buf, sizeof buf);
        l[sizeof buf] = 0;
        expect_reject("long2.bin", l, sizeof l, "size mismatch");
    }
    expect_reject("shorthdr.bin", buf, 10, "truncated header");
    expect_reject("empty.bin", buf, 0, "truncated header");
    gt_data_encode_header(t, 2, 1, 256);
    expect_reject("onetoken.bin", t, 34, "too few tokens");
    gt_data_encode_header(t, 2, 10, 0);
    expect_reject("vocab0.bin", t, sizeof buf, "vocab_size");
    gt_data_encode_header(t, 2, 10, 256);
    t[28] = 1;
    expect_reject("reserved.bin", t, sizeof buf, "reserved");
    gt_data_encode_header(t, 2, UINT64_MAX / 2, 256);
    expect_reject("hugecount.bin", t, sizeof buf, "size mismatch");

    d = gt_data_open(pth("missing.bin"), err, sizeof err);
    CHECK(d == NULL && strstr(err, "missing.bin"));
    d = gt_data_open(dir, err, sizeof err);
    CHECK(d == NULL && strstr(err, "not a regular file"));
}

static void cleanup(void) {
    DIR *dd = opendir(dir);
    if (!dd) return;
    struct dirent *e;
    while ((e = readdir(dd))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        unlink(pth(e->d_name));
    }
    closedir(dd);
    rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_data PATH-OF-gtrain-prep\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "test_data.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_prep_roundtrip(argv[1]);
    test_prep_errors(argv[1]);
    test_sampling();
    test_bad_headers();
    test_llmc_shard_is_read_as_it_is();
    test_several_files_one_sample_space();
    test_blend();
    test_loss_mask();
    test_separator_uncounted();
    if (failures == 0) cleanup();
    else fprintf(stderr, "test_data: %d check(s) failed; files kept in %s\n", failures, dir);
    printf("test_data: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
