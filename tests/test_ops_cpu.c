/*
 * test_ops_cpu.c — the CPU backend of ops.h checked op by op.
 *
 * Gradients: every backward is compared with central finite differences of L = sum(r * out) for a
 * random r, where out comes from a small double-precision reference of the forward written here
 * (so the differences are not drowned in fp32 noise; step h = 1e-4, truncation error ~h^2).
 * Forwards are compared with the same references. Errors are normalised:
 *   err = max_i |got_i - want_i| / max_i |want_i|
 * Tolerances: FWD_TOL = 1e-6 for forwards (fp32 round-off of short sums is ~1e-7), GRAD_TOL = 1e-5
 * for gradients (observed ~2e-7: fp32 round-off; a wrong term gives errors of order 1e-2 or more),
 * ADAM_TOL = 1e-6 absolute on parameters of size ~1 after three AdamW steps.
 * Bit-identity properties (probs kept vs recomputed, rmsnorm_apply vs forward, repeat runs, thread
 * counts) are checked with memcmp.
 *
 * The bf16 table (gt_ops_cpu_bf16; skipped with a note where the CPU has no bf16 instructions) is
 * checked against the fp32 one: each element- and row-wise bf16 output must be the fp32 table's output
 * on the upcast inputs rounded by the test's own round-to-nearest-even, bit for bit, with exact ties
 * built into to_working's and residual's inputs; the matrix products (oneDNN) must lie within one bf16
 * rounding plus the fp32 summation-order bound of sgemm's (test_bf16_table and what it calls).
 *
 * Prints one line per check, exits 1 if any failed.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* From libgomp, which gtrain_kernels links; declared here so the test needs no OpenMP flags. */
void omp_set_num_threads(int n);

#define FWD_TOL 1e-6
#define GRAD_TOL 1e-5
#define ADAM_TOL 1e-6
#define FD_H 1e-4

static const gt_ops *ops;
static int failures;

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x1234567887654321ull;
static double urand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* Every test buffer is remembered and released at exit, so leak checkers stay quiet. */
static struct {
    void *ptr;
    int from_ops;
} buffers[1024];
static int nbuffers;

static void *remember(void *p, int from_ops) {
    if (!p || nbuffers == (int)(sizeof buffers / sizeof buffers[0])) abort();
    buffers[nbuffers].ptr = p;
    buffers[nbuffers++].from_ops = from_ops;
    return p;
}

static void release_all(void) {
    for (int i = 0; i < nbuffers; i++) {
        if (buffers[i].from_ops)
            ops->free(buffers[i].ptr);
        else
            free(buffers[i].ptr);
    }
    nbuffers = 0;
}

static float *fvec(size_t n) { return remember(ops->alloc(n * sizeof(float)), 1); }
static double *dvec(size_t n) { return remember(calloc(n ? n : 1, sizeof(double)), 0); }

/* random fp32 values and their exact double copy */
static float *frand(size_t n, double amp, double **copy) {
    float *f = fvec(n);
    double *d = dvec(n);
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)(amp * urand());
        d[i] = f[i];
    }
    *copy = d;
    return f;
}

static void report(const char *name, int ok, double err, double tol) {
    printf("%-58s %s  (err %.3g, tol %.3g)\n", name, ok ? "PASS" : "FAIL", err, tol);
    if (!ok) failures++;
}

/* normalised max error of got (float) against want (double) */
static void check_close(const char *name, const float *got, const double *want, size_t n, double tol) {
    double maxerr = 0.0, maxref = 0.0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) finite = 0;
        double e = fabs((double)got[i] - want[i]);
        if (e > maxerr) maxerr = e;
        if (fabs(want[i]) > maxref) maxref = fabs(want[i]);
    }
    double err = maxref > 0 ? maxerr / maxref : maxerr;
    report(name, finite && err <= tol, err, tol);
}

static void check_same_bits(const char *name, const void *a, const void *b, size_t bytes) {
    int same = memcmp(a, b, bytes) == 0;
    printf("%-58s %s  (memcmp)\n", name, same ? "PASS" : "FAIL");
    if (!same) failures++;
}

/* after - before, for backwards that accumulate */
static float *fdelta(const float *after, const double *before, size_t n) {
    float *d = fvec(n);
    for (size_t i = 0; i < n; i++) d[i] = (float)((double)after[i] - before[i]);
    return d;
}

typedef double (*loss_fn)(void *ctx);

/* central differences of loss(ctx) with respect to every stride-th element of x (the others 0); with
 * check_close_every, over those elements only: for losses whose every evaluation is costly (attention
 * at T 150 is O(T^2) per evaluation, times two per element). A stride odd and prime to the head size
 * still visits every row and every head. fd_grad: every element. */
static double *fd_grad_every(double *x, size_t n, size_t stride, loss_fn loss, void *ctx) {
    double *g = dvec(n);
    for (size_t i = 0; i < n; i += stride) {
        double keep = x[i];
        x[i] = keep + FD_H;
        double lp = loss(ctx);
        x[i] = keep - FD_H;
        double lm = loss(ctx);
        x[i] = keep;
        g[i] = (lp - lm) / (2 * FD_H);
    }
    return g;
}

static double *fd_grad(double *x, size_t n, loss_fn loss, void *ctx) { return fd_grad_every(x, n, 1, loss, ctx); }

static void check_close_every(const char *name, const float *got, const double *want, size_t n, size_t stride,
                              double tol) {
    size_t m = (n + stride - 1) / stride;
    float *g = fvec(m);
    double *w = dvec(m);
    for (size_t i = 0, j = 0; i < n; i += stride, j++) g[j] = got[i], w[j] = want[i];
    check_close(name, g, w, m, tol);
}

static double dotr(const double *r, const double *out, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += r[i] * out[i];
    return s;
}

static float *to_f(const double *d, size_t n) {
    float *f = fvec(n);
    for (size_t i = 0; i < n; i++) f[i] = (float)d[i];
    return f;
}

/* ---------------------------------------------------------------- embedding */

typedef struct {
    double *wte, *r, *out;
    const int32_t *tok;
    int BT, C;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    for (int i = 0; i < c->BT; i++)
        for (int j = 0; j < c->C; j++) c->out[(size_t)i * c->C + j] = c->wte[(size_t)c->tok[i] * c->C + j];
    return dotr(c->r, c->out, (size_t)c->BT * c->C);
}

static void test_embedding(void) {
    enum { BT = 9, C = 70, V = 5 }; /* C > 64 so two column blocks; repeated tokens */
    int32_t tok[BT] = {3, 1, 3, 0, 4, 3, 1, 1, 2};
    double *wte_d, *r, *dw0;
    float *wte = frand((size_t)V * C, 1, &wte_d), *dout = fvec((size_t)BT * C), *out = fvec((size_t)BT * C);
    r = dvec((size_t)BT * C);
    for (size_t i = 0; i < (size_t)BT * C; i++) dout[i] = (float)(r[i] = urand());
    float *dw = frand((size_t)V * C, 1, &dw0);
    emb_ctx c = {wte_d, r, dvec((size_t)BT * C), tok, BT, C};

    ops->embedding_forward(out, tok, wte, BT, C, V);
    emb_loss(&c);
    check_close("embedding_forward matches reference", out, c.out, (size_t)BT * C, FWD_TOL);
    ops->embedding_backward(dw, dout, tok, BT, C, V);
    double *g = fd_grad(wte_d, (size_t)V * C, emb_loss, &c);
    check_close("embedding_backward dwte (accumulate) vs finite diff", fdelta(dw, dw0, (size_t)V * C), g,
                (size_t)V * C, GRAD_TOL);
}

/* ---------------------------------------------------------------- rmsnorm */

typedef struct {
    double *x, *w, *r, *out;
    int N, C;
    double eps;
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = p;
    for (int n = 0; n < c->N; n++) {
        const double *x = c->x + (size_t)n * c->C;
        double ss = 0;
        for (int i = 0; i < c->C; i++) ss += x[i] * x[i];
        double rs = 1.0 / sqrt(ss / c->C + c->eps);
        for (int i = 0; i < c->C; i++) c->out[(size_t)n * c->C + i] = c->w[i] * x[i] * rs;
    }
    return dotr(c->r, c->out, (size_t)c->N * c->C);
}

static void test_rmsnorm(void) {
    enum { N = 6, C = 80 };
    const float eps = 1e-5f;
    size_t nc = (size_t)N * C;
    double *x_d, *w_d, *r, *dx0, *dw0;
    float *x = frand(nc, 1.5, &x_d), *w = frand(C, 1, &w_d), *dout = frand(nc, 1, &r);
    float *out = fvec(nc), *out2 = fvec(nc), *rstd = fvec(N);
    float *dx = frand(nc, 1, &dx0), *dw = frand(C, 1, &dw0);
    rms_ctx c = {x_d, w_d, r, dvec(nc), N, C, eps};

    ops->rmsnorm_forward(out, rstd, x, w, N, C, eps);
    rms_loss(&c);
    check_close("rmsnorm_forward matches reference", out, c.out, nc, FWD_TOL);
    ops->rmsnorm_apply(out2, rstd, x, w, N, C);
    check_same_bits("rmsnorm_apply is bit-identical to rmsnorm_forward", out, out2, nc * sizeof(float));

    ops->rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
    check_close("rmsnorm_backward dinp (accumulate) vs finite diff", fdelta(dx, dx0, nc),
                fd_grad(x_d, nc, rms_loss, &c), nc, GRAD_TOL);
    check_close("rmsnorm_backward dweight (accumulate) vs finite diff", fdelta(dw, dw0, C),
                fd_grad(w_d, C, rms_loss, &c), C, GRAD_TOL);

    /* determinism: same bits on a second run and with another thread count */
    float *dxa = to_f(dx0, nc), *dwa = to_f(dw0, C), *dxb = to_f(dx0, nc), *dwb = to_f(dw0, C);
    ops->rmsnorm_backward(dxa, dwa, dout, x, w, rstd, N, C);
    omp_set_num_threads(1);
    ops->rmsnorm_backward(dxb, dwb, dout, x, w, rstd, N, C);
    omp_set_num_threads(3);
    check_same_bits("rmsnorm_backward repeat run, 1 thread vs 3 (dinp)", dxa, dxb, nc * sizeof(float));
    check_same_bits("rmsnorm_backward repeat run, 1 thread vs 3 (dweight)", dwa, dwb, C * sizeof(float));
    check_same_bits("rmsnorm_backward second run equals first (dweight)", dw, dwa, C * sizeof(float));
}

/* ---------------------------------------------------------------- matmul */

typedef struct {
    double *x, *w, *r, *out;
    int N, IC, OC;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            double s = 0;
            for (int i = 0; i < c->IC; i++) s += c->x[(size_t)n * c->IC + i] * c->w[(size_t)o * c->IC + i];
            c->out[(size_t)n * c->OC + o] = s;
        }
    return dotr(c->r, c->out, (size_t)c->N * c->OC);
}

static void test_matmul(void) {
    enum { N = 7, IC = 12, OC = 10 };
    double *x_d, *w_d, *r, *dx0, *dw0;
    float *x = frand((size_t)N * IC, 1, &x_d), *w = frand((size_t)OC * IC, 1, &w_d);
    float *dout = frand((size_t)N * OC, 1, &r), *out = fvec((size_t)N * OC);
    float *dx = frand((size_t)N * IC, 1, &dx0), *dw = frand((size_t)OC * IC, 1, &dw0);
    mm_ctx c = {x_d, w_d, r, dvec((size_t)N * OC), N, IC, OC};

    ops->matmul_forward(out, x, w, N, IC, OC);
    mm_loss(&c);
    check_close("matmul_forward matches reference", out, c.out, (size_t)N * OC, FWD_TOL);

    double *gx = fd_grad(x_d, (size_t)N * IC, mm_loss, &c), *gw = fd_grad(w_d, (size_t)OC * IC, mm_loss, &c);
    ops->matmul_backward(dx, dw, dout, x, w, N, IC, OC, 1);
    check_close("matmul_backward dinp (accumulate) vs finite diff", fdelta(dx, dx0, (size_t)N * IC), gx,
                (size_t)N * IC, GRAD_TOL);
    check_close("matmul_backward dweight (accumulate) vs finite diff", fdelta(dw, dw0, (size_t)OC * IC), gw,
                (size_t)OC * IC, GRAD_TOL);
    /* overwrite mode: dinp starts as garbage (NaN) and must be replaced */
    for (size_t i = 0; i < (size_t)N * IC; i++) dx[i] = NAN;
    ops->matmul_backward(dx, NULL, dout, x, w, N, IC, OC, 0);
    check_close("matmul_backward dinp (overwrite) vs finite diff", dx, gx, (size_t)N * IC, GRAD_TOL);
}

/* ---------------------------------------------------------------- rope */

typedef struct {
    double *x, *r, *out;
    int B, T, NH, HD;
    double theta;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    int half = c->HD / 2;
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int h = 0; h < c->NH; h++) {
                size_t base = (((size_t)b * c->T + t) * c->NH + h) * c->HD;
                for (int i = 0; i < half; i++) {
                    double ang = t * pow(c->theta, -2.0 * i / c->HD);
                    double x1 = c->x[base + i], x2 = c->x[base + i + half];
                    c->out[base + i] = x1 * cos(ang) - x2 * sin(ang);
                    c->out[base + i + half] = x2 * cos(ang) + x1 * sin(ang);
                }
            }
    return dotr(c->r, c->out, (size_t)c->B * c->T * c->NH * c->HD);
}

static void test_rope(void) {
    enum { B = 2, T = 9, NH = 3, HD = 8 };
    const float theta = 10000.0f;
    size_t n = (size_t)B * T * NH * HD;
    double *x_d, *r;
    float *x = frand(n, 1, &x_d), *dout = frand(n, 1, &r), *out = fvec(n), *dx = fvec(n);
    rope_ctx c = {x_d, r, dvec(n), B, T, NH, HD, theta};
    /* the (cos, sin) table (T, HD/2, 2) the model hands over, here from the plain formula */
    float tab[T * HD];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HD / 2; i++) {
            double ang = t * pow(theta, -2.0 * i / HD);
            tab[(t * HD / 2 + i) * 2] = (float)cos(ang);
            tab[(t * HD / 2 + i) * 2 + 1] = (float)sin(ang);
        }

    ops->rope_forward(out, x, tab, NULL, B, T, NH, HD);
    rope_loss(&c);
    check_close("rope_forward matches direct double formula", out, c.out, n, FWD_TOL);
    ops->rope_backward(dx, dout, tab, NULL, B, T, NH, HD);
    check_close("rope_backward vs finite diff", dx, fd_grad(x_d, n, rope_loss, &c), n, GRAD_TOL);
    /* in place */
    float *y = to_f(x_d, n);
    ops->rope_forward(y, y, tab, NULL, B, T, NH, HD);
    check_same_bits("rope_forward in place equals out of place", y, out, n * sizeof(float));
    ops->rope_backward(y, y, tab, NULL, B, T, NH, HD);
    check_close("rope_backward(rope_forward(x)) == x", y, x_d, n, FWD_TOL);

    /* positions restarting at each document: each document rotated alone, from position 0, gives the
     * same bits. Sequence 0 holds documents [0, 4) [4, 5) [5, 9); sequence 1 one document [0, 9). */
    int32_t doc[B * T] = {0, 0, 0, 0, 4, 5, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    float *yd = fvec(n), *dyd = fvec(n), *one = fvec(n), *done = fvec(n);
    ops->rope_forward(yd, x, tab, doc, B, T, NH, HD);
    ops->rope_backward(dyd, dout, tab, doc, B, T, NH, HD);
    int same = 1;
    const size_t row = (size_t)NH * HD;
    for (int b = 0; b < B; b++)
        for (int t0 = 0; t0 < T;) {
            int t1 = t0 + 1;
            while (t1 < T && doc[b * T + t1] == t0) t1++;
            size_t off = ((size_t)b * T + t0) * row, len = (size_t)(t1 - t0) * row;
            ops->rope_forward(one, x + off, tab, NULL, 1, t1 - t0, NH, HD);
            ops->rope_backward(done, dout + off, tab, NULL, 1, t1 - t0, NH, HD);
            same = same && !memcmp(one, yd + off, len * 4) && !memcmp(done, dyd + off, len * 4);
            t0 = t1;
        }
    check_same_bits("rope with doc = each document alone from position 0", &same, &(int){1}, sizeof(int));
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    double *q, *k, *v, *r, *out, *lse, *probs;
    int B, T, NH, NKV, HD;
    float dropout;
    gt_rng_key key;
    const int32_t *doc; /* ops.h's document starts, or NULL */
} attn_ctx;

static double attn_loss(void *p) {
    attn_ctx *c = p;
    int B = c->B, T = c->T, NH = c->NH, NKV = c->NKV, HD = c->HD, group = NH / NKV;
    double scale = 1.0 / sqrt((double)HD);
    double *s = calloc(T, sizeof(double));
    if (!s) abort();
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                int g = h / group;
                const double *qt = c->q + (((size_t)b * T + t) * NH + h) * HD;
                double mx = -INFINITY, sum = 0;
                const int j0 = c->doc ? c->doc[(size_t)b * T + t] : 0; /* keys j0 .. t */
                for (int j = j0; j <= t; j++) {
                    const double *kj = c->k + (((size_t)b * T + j) * NKV + g) * HD;
                    double d = 0;
                    for (int e = 0; e < HD; e++) d += qt[e] * kj[e];
                    s[j] = d * scale;
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = j0; j <= t; j++) sum += exp(s[j] - mx);
                size_t row = ((size_t)b * NH + h) * T + t;
                c->lse[row] = mx + log(sum);
                double *o = c->out + (((size_t)b * T + t) * NH + h) * HD;
                for (int e = 0; e < HD; e++) o[e] = 0;
                for (int j = 0; j < T; j++) {
                    double pj = j0 <= j && j <= t ? exp(s[j] - mx) / sum : 0.0;
                    c->probs[row * T + j] = pj;
                    if (j > t || j < j0) continue;
                    if (c->dropout > 0)
                        pj = gt_dropout_keep(c->key, row * T + j, c->dropout) ? pj / (1.0 - c->dropout) : 0.0;
                    const double *vj = c->v + (((size_t)b * T + j) * NKV + g) * HD;
                    for (int e = 0; e < HD; e++) o[e] += pj * vj[e];
                }
            }
    free(s);
    return dotr(c->r, c->out, (size_t)B * T * NH * HD);
}

/* B x T: (2, 19) is one query block; (1, 70) crosses the CPU kernel's 64-row query blocks, so
 * causal blocks are skipped and dk/dv add up over blocks */
static void test_attention_doc(float dropout, int B, int T, const int32_t *doc) {
    enum { NH = 4, NKV = 2, HD = 8 };
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD, nrow = (size_t)B * NH * T;
    gt_rng_key key = {42, 7};
    double *q_d, *k_d, *v_d, *r;
    float *q = frand(nq, 1.5, &q_d), *k = frand(nk, 1.5, &k_d), *v = frand(nk, 1, &v_d);
    float *dout = frand(nq, 1, &r);
    float *out = fvec(nq), *out2 = fvec(nq), *lse = fvec(nrow), *lse2 = fvec(nrow), *probs = fvec(nrow * T);
    attn_ctx c = {q_d, k_d, v_d, r, dvec(nq), dvec(nrow), dvec(nrow * T), B, T, NH, NKV, HD, dropout, key, doc};
    char name[128];
    char tag[64];
    snprintf(tag, sizeof tag, "%s, T %d%s", dropout > 0 ? "dropout 0.25" : "no dropout", T,
             doc ? ", documents" : "");

    ops->attention_forward(out, lse, probs, q, k, v, doc, B, T, NH, NKV, HD, dropout, key);
    ops->attention_forward(out2, lse2, NULL, q, k, v, doc, B, T, NH, NKV, HD, dropout, key);
    attn_loss(&c);
    snprintf(name, sizeof name, "attention_forward out vs naive double (GQA, %s)", tag);
    check_close(name, out, c.out, nq, FWD_TOL);
    snprintf(name, sizeof name, "attention_forward lse vs naive double (%s)", tag);
    check_close(name, lse, c.lse, nrow, FWD_TOL);
    snprintf(name, sizeof name, "attention_forward probs vs naive double (%s)", tag);
    check_close(name, probs, c.probs, nrow * T, FWD_TOL);
    snprintf(name, sizeof name, "attention_forward same bits with probs NULL (%s)", tag);
    check_same_bits(name, out, out2, nq * sizeof(float));

    float *dq = fvec(nq), *dk = fvec(nk), *dv = fvec(nk), *dq2 = fvec(nq), *dk2 = fvec(nk), *dv2 = fvec(nk);
    for (size_t i = 0; i < nq; i++) dq[i] = dq2[i] = NAN; /* overwritten, not accumulated */
    for (size_t i = 0; i < nk; i++) dk[i] = dv[i] = dk2[i] = dv2[i] = NAN;
    ops->attention_backward(dq, dk, dv, dout, out, q, k, v, lse, probs, doc, B, T, NH, NKV, HD, dropout, key);
    ops->attention_backward(dq2, dk2, dv2, dout, out, q, k, v, lse, NULL, doc, B, T, NH, NKV, HD, dropout, key);

    /* every element up to T 19; beyond, every 3rd (T 70) or 5th (T 150): each evaluation is O(T^2) */
    const size_t st = T <= 32 ? 1 : T <= 100 ? 3 : 5;
    snprintf(name, sizeof name, "attention_backward dq vs finite diff (%s)", tag);
    check_close_every(name, dq, fd_grad_every(q_d, nq, st, attn_loss, &c), nq, st, GRAD_TOL);
    snprintf(name, sizeof name, "attention_backward dk vs finite diff (%s)", tag);
    check_close_every(name, dk, fd_grad_every(k_d, nk, st, attn_loss, &c), nk, st, GRAD_TOL);
    snprintf(name, sizeof name, "attention_backward dv vs finite diff (%s)", tag);
    check_close_every(name, dv, fd_grad_every(v_d, nk, st, attn_loss, &c), nk, st, GRAD_TOL);
    snprintf(name, sizeof name, "attention_backward probs NULL is bit-identical (%s)", tag);
    int same = !memcmp(dq, dq2, nq * 4) && !memcmp(dk, dk2, nk * 4) && !memcmp(dv, dv2, nk * 4);
    check_same_bits(name, &same, &(int){1}, sizeof(int));

    /* determinism across runs and thread counts */
    omp_set_num_threads(1);
    ops->attention_backward(dq2, dk2, dv2, dout, out, q, k, v, lse, NULL, doc, B, T, NH, NKV, HD, dropout, key);
    omp_set_num_threads(3);
    snprintf(name, sizeof name, "attention_backward repeat run with 1 thread (%s)", tag);
    same = !memcmp(dq, dq2, nq * 4) && !memcmp(dk, dk2, nk * 4) && !memcmp(dv, dv2, nk * 4);
    check_same_bits(name, &same, &(int){1}, sizeof(int));
}

static void test_attention(float dropout, int B, int T) { test_attention_doc(dropout, B, T, NULL); }

/* Document masking. T 150: documents [0, 10) [10, 81) [81, 150), so the third query block (rows
 * 128..149) skips key block 0 entirely and the second (64..127) starts at key 10. T 19, two
 * sequences: [0, 3), one-token documents 3, 4, 5, then [6, 19); and one document [0, 19). */
static void test_attention_documents(float dropout) {
    static int32_t long_doc[150], short_doc[2 * 19];
    for (int t = 0; t < 150; t++) long_doc[t] = t < 10 ? 0 : t < 81 ? 10 : 81;
    for (int t = 0; t < 19; t++) {
        short_doc[t] = t < 3 ? 0 : t < 6 ? t : 6;
        short_doc[19 + t] = 0;
    }
    test_attention_doc(dropout, 1, 150, long_doc);
    test_attention_doc(dropout, 2, 19, short_doc);
}

/* ---------------------------------------------------------------- swiglu */

typedef struct {
    double *g, *u, *r, *out;
    size_t n;
} swiglu_ctx;

static double swiglu_loss(void *p) {
    swiglu_ctx *c = p;
    for (size_t i = 0; i < c->n; i++) c->out[i] = c->g[i] / (1 + exp(-c->g[i])) * c->u[i];
    return dotr(c->r, c->out, c->n);
}

static void test_swiglu(void) {
    enum { N = 200 };
    double *g_d, *u_d, *r;
    float *g = frand(N, 4, &g_d), *u = frand(N, 2, &u_d), *dout = frand(N, 1, &r);
    float *out = fvec(N), *dg = fvec(N), *du = fvec(N);
    swiglu_ctx c = {g_d, u_d, r, dvec(N), N};
    ops->swiglu_forward(out, g, u, N);
    swiglu_loss(&c);
    check_close("swiglu_forward matches reference", out, c.out, N, FWD_TOL);
    ops->swiglu_backward(dg, du, dout, g, u, N);
    check_close("swiglu_backward dgate vs finite diff", dg, fd_grad(g_d, N, swiglu_loss, &c), N, GRAD_TOL);
    check_close("swiglu_backward dup vs finite diff", du, fd_grad(u_d, N, swiglu_loss, &c), N, GRAD_TOL);
}

/* ---------------------------------------------------------------- residual + dropout */

typedef struct {
    double *res, *br, *r, *out;
    size_t n;
    float p;
    gt_rng_key key;
} resid_ctx;

static double resid_loss(void *p) {
    resid_ctx *c = p;
    for (size_t i = 0; i < c->n; i++) {
        double b = c->p > 0 ? (gt_dropout_keep(c->key, i, c->p) ? c->br[i] / (1.0 - c->p) : 0.0) : c->br[i];
        c->out[i] = c->res[i] + b;
    }
    return dotr(c->r, c->out, c->n);
}

static void test_residual(float p) {
    enum { N = 300 };
    gt_rng_key key = {9, 1234};
    double *res_d, *br_d, *r;
    float *res = frand(N, 1, &res_d), *br = frand(N, 1, &br_d), *dout = frand(N, 1, &r);
    float *out = fvec(N), *dbr = fvec(N);
    resid_ctx c = {res_d, br_d, r, dvec(N), N, p, key};
    char name[128];
    ops->residual_forward(out, res, br, N, p, key);
    resid_loss(&c);
    snprintf(name, sizeof name, "residual_forward matches reference (dropout %.2f)", p);
    check_close(name, out, c.out, N, FWD_TOL);
    ops->dropout_backward(dbr, dout, N, p, key);
    snprintf(name, sizeof name, "dropout_backward dbranch vs finite diff (dropout %.2f)", p);
    check_close(name, dbr, fd_grad(br_d, N, resid_loss, &c), N, GRAD_TOL);
    float *alias = to_f(res_d, N);
    ops->residual_forward(alias, alias, br, N, p, key);
    snprintf(name, sizeof name, "residual_forward with out == res (dropout %.2f)", p);
    check_same_bits(name, alias, out, N * sizeof(float));
    if (p > 0) {
        int dropped = 0;
        for (int i = 0; i < N; i++) dropped += dbr[i] == 0.0f;
        report("dropout drops about p of the elements", dropped > 0.15 * N && dropped < 0.35 * N,
               (double)dropped / N, p);
    }
}

/* ---------------------------------------------------------------- cross-entropy */

typedef struct {
    double *l, *losses;
    const int32_t *tgt;
    int BT, V;
    double dloss;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *c = p;
    double total = 0;
    for (int i = 0; i < c->BT; i++) {
        const double *l = c->l + (size_t)i * c->V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < c->V; j++) mx = l[j] > mx ? l[j] : mx;
        for (int j = 0; j < c->V; j++) s += exp(l[j] - mx);
        c->losses[i] = c->tgt[i] < 0 ? 0.0 : mx + log(s) - l[c->tgt[i]];
        total += c->losses[i];
    }
    return total * c->dloss;
}

static void test_crossentropy(void) {
    enum { BT = 5, V = 37 };
    int32_t tgt[BT] = {3, -1, 36, 0, 17}; /* row 1 is ignored */
    double *l_d;
    float *logits = frand((size_t)BT * V, 4, &l_d), *losses = fvec(BT), *lse = fvec(BT);
    ce_ctx c = {l_d, dvec(BT), tgt, BT, V, 0.37};
    ops->crossentropy_forward(losses, lse, logits, tgt, BT, V);
    ce_loss(&c);
    check_close("crossentropy_forward losses vs reference (ignored target -> 0)", losses, c.losses, BT,
                FWD_TOL);
    report("crossentropy_forward ignored row has loss exactly 0", losses[1] == 0.0f, fabs(losses[1]), 0);
    ops->crossentropy_backward(logits, lse, tgt, BT, V, (float)c.dloss);
    check_close("crossentropy_backward dlogits vs finite diff", logits, fd_grad(l_d, (size_t)BT * V, ce_loss, &c),
                (size_t)BT * V, GRAD_TOL);
    int zero = 1;
    for (int j = 0; j < V; j++) zero &= logits[V + j] == 0.0f;
    report("crossentropy_backward ignored row is all zero", zero, 0, 0);
}

/* ---------------------------------------------------------------- optimizer and utilities */

static void test_adamw(void) {
    enum { N = 1000, STEPS = 3 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    double *p_d, *m_d = dvec(N), *v_d = dvec(N), *dummy;
    float *p = frand(N, 1, &p_d), *m = fvec(N), *v = fvec(N), *g = fvec(N);
    memset(m, 0, N * 4);
    memset(v, 0, N * 4);
    for (int t = 1; t <= STEPS; t++) {
        float *gs = frand(N, 1, &dummy);
        memcpy(g, gs, N * 4);
        ops->adamw(p, m, v, g, N, lr, b1, b2, eps, wd, t);
        /* torch.optim.AdamW in double */
        for (int i = 0; i < N; i++) {
            double gi = g[i];
            p_d[i] *= 1.0 - (double)lr * wd;
            m_d[i] = b1 * m_d[i] + (1.0 - b1) * gi;
            v_d[i] = b2 * v_d[i] + (1.0 - b2) * gi * gi;
            double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
            double denom = sqrt(v_d[i]) / sqrt(bc2) + eps;
            p_d[i] -= (lr / bc1) * m_d[i] / denom;
        }
    }
    double err = 0;
    for (int i = 0; i < N; i++) err = fmax(err, fabs(p[i] - p_d[i]));
    report("adamw 3 steps vs double torch.optim.AdamW (param, abs err)", err <= ADAM_TOL, err, ADAM_TOL);
    check_close("adamw 3 steps exp_avg", m, m_d, N, FWD_TOL);
    check_close("adamw 3 steps exp_avg_sq", v, v_d, N, FWD_TOL);
}

static void test_utilities(void) {
    enum { N = 50000 };
    double *x_d;
    float *x = frand(N, 1, &x_d);
    double want = 0;
    for (int i = 0; i < N; i++) want += x_d[i] * x_d[i];
    double got = ops->sumsq(x, N);
    report("sumsq vs double", fabs(got - want) <= 1e-12 * want, fabs(got - want) / want, 1e-12);
    omp_set_num_threads(1);
    double got3 = ops->sumsq(x, N);
    omp_set_num_threads(3);
    check_same_bits("sumsq same bits with 1 thread", &got, &got3, sizeof got);
    ops->scale(x, N, 0.5f);
    for (int i = 0; i < N; i++) x_d[i] *= 0.5;
    check_close("scale", x, x_d, N, 0);
    float *w = fvec(N), *back = fvec(N);
    ops->to_working(w, x, N);
    ops->to_master(back, w, N);
    check_same_bits("to_working then to_master round-trips", x, back, N * sizeof(float));

    float *a = fvec(N), *b = fvec(N);
    ops->zero(a, N * sizeof(float));
    ops->copy_to_device(b, x, N * sizeof(float));
    ops->copy(a, b, N * sizeof(float));
    ops->copy_to_host(back, a, N * sizeof(float));
    ops->synchronize();
    check_same_bits("copy_to_device / copy / copy_to_host", x, back, N * sizeof(float));
    report("alloc is 64-byte aligned", ((uintptr_t)a & 63) == 0, 0, 0);

    /* a large block (mapped pre-faulted, ops_cpu.c): aligned, zeroed by zero, written and read back,
     * freed and handed out again for the same size, and freed for good */
    size_t big = (size_t)40 << 20, nb = big / sizeof(float);
    float *l = ops->alloc(big);
    report("a large alloc is 64-byte aligned", l && ((uintptr_t)l & 63) == 0, 0, 0);
    ops->zero(l, big);
    int zeroed = 1;
    for (size_t i = 0; i < nb; i += 1021) zeroed &= l[i] == 0.0f;
    report("a large alloc zeroed", zeroed && l[nb - 1] == 0.0f, 0, 0);
    for (size_t i = 0; i < nb; i++) l[i] = (float)(i % 977);
    int kept = 1;
    for (size_t i = 0; i < nb; i += 997) kept &= l[i] == (float)(i % 977);
    report("a large alloc holds what was written", kept && l[nb - 1] == (float)((nb - 1) % 977), 0, 0);
    ops->free(l);
    float *l2 = ops->alloc(big);
    report("a freed large block is handed out again for the same size", l2 == l, 0, 0);
    ops->free(l2);

    /* a table full of idle blocks of another size (more small blocks than it has entries, held at once,
     * then freed, as --calibrate's measurements leave it) still keeps a new large block: one handed out
     * again holds what was written to it (given back to the system, it would come back zeroed) */
    enum { SMALL = 10000 };
    void **small = malloc(SMALL * sizeof *small);
    for (int i = 0; i < SMALL; i++) small[i] = ops->alloc(64);
    for (int i = 0; i < SMALL; i++) ops->free(small[i]);
    free(small);
    size_t big3 = (size_t)36 << 20, nb3 = big3 / sizeof(float);
    float *l3 = ops->alloc(big3);
    l3[nb3 - 1] = 12345.0f;
    ops->free(l3);
    float *l4 = ops->alloc(big3);
    report("a table full of idle blocks of other sizes keeps a new large block", l4 == l3 && l4[nb3 - 1] == 12345.0f, 0, 0);
    ops->free(l4);
}

static void test_embedding_determinism(void) {
    enum { BT = 64, C = 200, V = 7 };
    int32_t tok[BT];
    double *dummy;
    for (int i = 0; i < BT; i++) tok[i] = (int32_t)((i * 5) % V);
    float *dout = frand((size_t)BT * C, 1, &dummy);
    float *d1 = fvec((size_t)V * C), *d2 = fvec((size_t)V * C);
    ops->zero(d1, (size_t)V * C * 4);
    ops->zero(d2, (size_t)V * C * 4);
    ops->embedding_backward(d1, dout, tok, BT, C, V);
    omp_set_num_threads(1);
    ops->embedding_backward(d2, dout, tok, BT, C, V);
    omp_set_num_threads(3);
    check_same_bits("embedding_backward same bits with 1 thread", d1, d2, (size_t)V * C * 4);
}

/* ---------------------------------------------------------------- bf16 table against the fp32 table */

/* The bf16 table (gt_ops_cpu_bf16) runs the fp32 kernels' source with bf16 loads and stores
 * (cpu_elem.h): each output is the fp32 math on the upcast inputs, rounded once to nearest, ties to
 * even (docs/precision.md). So for every element- and row-wise kernel the bf16 output must equal, bit
 * for bit, the fp32 table's output on the same inputs upcast, rounded by rne_bf16 below; fp32 outputs
 * (dweight, rstd, lse, losses) and the accumulating ones (the old value added in fp32 before the one
 * rounding) included. The linear layers go to oneDNN instead of OpenBLAS: only the order of the fp32
 * sums differs, so they are held to a bound (bf16_matmul_bound). Attention is not compared here: its
 * bf16 kernel rounds P~ and dS to bf16 on purpose (precision.md), so it is no rounding of the fp32
 * result; test_recompute checks it through the model. */

static const gt_ops *ops16;

static float bf16_up(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest, ties to even, written apart from the kernels' gt_f32_to_bf16 (a carry trick on
 * the bits): take the two bf16 neighbours of f, the one toward zero (the top 16 bits) and the next one
 * away from zero, and compare the distances in double (exact: both sides have at most 25 significant
 * bits over a small exponent range); on a tie take the one whose last bit is 0. Past the largest bf16
 * the neighbour away from zero is infinity, which counts as 2^128, IEEE's overflow rule. A NaN stays
 * a NaN (only its payload is not checked). */
static uint16_t rne_bf16(float f) {
    if (isnan(f)) return 0x7fc0;
    uint32_t u = f32_bits(f);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if ((u & 0xffffu) == 0) return lo;
    double x = fabs((double)f), a = fabs((double)bf16_up(lo));
    double b = (hi & 0x7fffu) == 0x7f80u ? ldexp(1.0, 128) : fabs((double)bf16_up(hi));
    if (x - a < b - x) return lo;
    if (b - x < x - a) return hi;
    return (lo & 1u) ? hi : lo;
}

/* rne_bf16 on values whose rounding is known by hand, so a wrong reference cannot pass everything */
static void test_rne_reference(void) {
    static const struct { uint32_t f; uint16_t want; } cases[] = {
        {0x3f808000u, 0x3f80}, /* 1 + 2^-8: tie between 1 and 1 + 2^-7, to the even 1 */
        {0x3f818000u, 0x3f82}, /* 1 + 3 * 2^-8: tie, to the even 1 + 2^-6 */
        {0x3f808001u, 0x3f81}, /* just above the tie: up */
        {0x3f807fffu, 0x3f80}, /* just below: down */
        {0xbf818000u, 0xbf82}, /* negative tie: magnitude to even */
        {0x7f7f7fffu, 0x7f7f}, /* largest finite bf16 */
        {0x7f7f8000u, 0x7f80}, /* tie past it: to infinity (even) */
        {0x00008000u, 0x0000}, /* subnormal tie to even zero */
        {0x00018000u, 0x0002}, /* subnormal tie up to even */
        {0x80000000u, 0x8000}, /* -0 */
        {0x7f800000u, 0x7f80}, /* infinity */
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ok &= rne_bf16(f32_from_bits(cases[i].f)) == cases[i].want;
    report("test's own round-to-nearest-even on hand-made cases", ok, 0, 0);
}

static uint16_t *uvec(size_t n) { return remember(ops->alloc(n * sizeof(uint16_t)), 1); }

/* n random bf16 values amp * U[-1, 1), and their exact fp32 copy */
static uint16_t *brand(size_t n, double amp, float **up) {
    uint16_t *h = uvec(n);
    float *f = fvec(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = rne_bf16((float)(amp * urand()));
        f[i] = bf16_up(h[i]);
    }
    *up = f;
    return h;
}

static float *fcopy(const float *f, size_t n) {
    float *c = fvec(n);
    memcpy(c, f, n * sizeof *f);
    return c;
}

/* bf16 output of the bf16 table against the fp32 table's output rounded by rne_bf16, element by element */
static void check_rounded(const char *name, const uint16_t *got, const float *f32, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != rne_bf16(f32[i]) && !(isnan(f32[i]) && isnan(bf16_up(got[i])))) {
            if (!bad) first = i;
            bad++;
        }
    printf("%-58s %s  (%zu of %zu differ)\n", name, bad ? "FAIL" : "PASS", bad, n);
    if (bad) {
        printf("    first at %zu: bf16 table 0x%04x, fp32 table %a rounds to 0x%04x\n", first, got[first],
               (double)f32[first], rne_bf16(f32[first]));
        failures++;
    }
}

/* fp32 outputs of the two tables: the same bits */
static void check_equal_f32(const char *name, const float *got, const float *want, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (f32_bits(got[i]) != f32_bits(want[i])) {
            if (!bad) first = i;
            bad++;
        }
    printf("%-58s %s  (%zu of %zu differ)\n", name, bad ? "FAIL" : "PASS", bad, n);
    if (bad) {
        printf("    first at %zu: bf16 table %a, fp32 table %a\n", first, (double)got[first], (double)want[first]);
        failures++;
    }
}

/* How many fp32 results sit exactly halfway between two bf16 values: the tie tests must make some. */
static size_t count_ties(const float *f, size_t n) {
    size_t t = 0;
    for (size_t i = 0; i < n; i++) t += (f32_bits(f[i]) & 0xffffu) == 0x8000u;
    return t;
}

static void test_bf16_embedding(void) {
    enum { BT = 9, C = 83, V = 5 }; /* C odd and > 64: two column blocks and a vector tail */
    int32_t tok[BT] = {3, 1, 3, 0, 4, 3, 1, 1, 2};
    float *wte32, *dout32, *dw0;
    uint16_t *wte = brand((size_t)V * C, 1, &wte32), *dout = brand((size_t)BT * C, 1, &dout32);
    uint16_t *out = uvec((size_t)BT * C);
    float *out32 = fvec((size_t)BT * C);
    ops16->embedding_forward(out, tok, wte, BT, C, V);
    ops->embedding_forward(out32, tok, wte32, BT, C, V);
    check_rounded("bf16 embedding_forward = rne(fp32 table)", out, out32, (size_t)BT * C);
    dw0 = fvec((size_t)V * C);
    for (size_t i = 0; i < (size_t)V * C; i++) dw0[i] = (float)urand();
    float *dw = fcopy(dw0, (size_t)V * C), *dw32 = fcopy(dw0, (size_t)V * C);
    ops16->embedding_backward(dw, dout, tok, BT, C, V);
    ops->embedding_backward(dw32, dout32, tok, BT, C, V);
    check_equal_f32("bf16 embedding_backward dwte (fp32, +=) = fp32 table", dw, dw32, (size_t)V * C);
}

static void test_bf16_rmsnorm(void) {
    enum { N = 5, C = 83 };
    const float eps = 1e-5f;
    size_t nc = (size_t)N * C;
    float *x32, *w32, *d32, *dx32;
    uint16_t *x = brand(nc, 1.5, &x32), *w = brand(C, 1, &w32), *d = brand(nc, 1, &d32);
    uint16_t *dx = brand(nc, 1, &dx32), *out = uvec(nc), *out2 = uvec(nc);
    float *out32 = fvec(nc), *rstd = fvec(N), *rstd32 = fvec(N), *dw0 = fvec(C);
    for (int i = 0; i < C; i++) dw0[i] = (float)urand();
    float *dw = fcopy(dw0, C), *dw32 = fcopy(dw0, C);

    ops16->rmsnorm_forward(out, rstd, x, w, N, C, eps);
    ops->rmsnorm_forward(out32, rstd32, x32, w32, N, C, eps);
    check_rounded("bf16 rmsnorm_forward out = rne(fp32 table)", out, out32, nc);
    check_equal_f32("bf16 rmsnorm_forward rstd (fp32) = fp32 table", rstd, rstd32, N);
    ops16->rmsnorm_apply(out2, rstd, x, w, N, C);
    check_rounded("bf16 rmsnorm_apply out = rne(fp32 table)", out2, out32, nc);

    ops16->rmsnorm_backward(dx, dw, d, x, w, rstd, N, C);
    ops->rmsnorm_backward(dx32, dw32, d32, x32, w32, rstd32, N, C);
    check_rounded("bf16 rmsnorm_backward dinp (+=, one rounding) = rne(fp32)", dx, dx32, nc);
    check_equal_f32("bf16 rmsnorm_backward dweight (fp32, +=) = fp32 table", dw, dw32, C);
}

static void test_bf16_rope(void) {
    enum { B = 2, T = 5, NH = 3, HD = 22 }; /* HD/2 = 11: odd pair count, a vector tail */
    size_t n = (size_t)B * T * NH * HD;
    float tab[T * HD];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HD / 2; i++) {
            double ang = t * pow(10000.0, -2.0 * i / HD);
            tab[(t * HD / 2 + i) * 2] = (float)cos(ang);
            tab[(t * HD / 2 + i) * 2 + 1] = (float)sin(ang);
        }
    float *x32, *out32 = fvec(n), *dx32 = fvec(n);
    uint16_t *x = brand(n, 2, &x32), *out = uvec(n), *dx = uvec(n);
    ops16->rope_forward(out, x, tab, NULL, B, T, NH, HD);
    ops->rope_forward(out32, x32, tab, NULL, B, T, NH, HD);
    check_rounded("bf16 rope_forward = rne(fp32 table)", out, out32, n);
    ops16->rope_backward(dx, x, tab, NULL, B, T, NH, HD);
    ops->rope_backward(dx32, x32, tab, NULL, B, T, NH, HD);
    check_rounded("bf16 rope_backward = rne(fp32 table)", dx, dx32, n);
}

/* bf16 with documents: the rope of a one-token-then-long document layout rounds the fp32 table's; the
 * attention keeps its bit-identity with and without stored probabilities (what recompute relies on)
 * and stays within bf16 rounding of the fp32 kernel on the same (rounded) inputs */
static void test_bf16_documents(void) {
    enum { B = 1, T = 150, NH = 4, NKV = 2, HD = 8 };
    static int32_t doc[B * T];
    for (int t = 0; t < T; t++) doc[t] = t < 1 ? 0 : t < 81 ? 1 : 81;
    static float tab[T * HD];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HD / 2; i++) {
            double ang = t * pow(10000.0, -2.0 * i / HD);
            tab[(t * HD / 2 + i) * 2] = (float)cos(ang);
            tab[(t * HD / 2 + i) * 2 + 1] = (float)sin(ang);
        }
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD, nl = (size_t)B * NH * T;
    float *q32, *k32, *v32, *d32;
    uint16_t *q = brand(nq, 1.5, &q32), *k = brand(nk, 1.5, &k32), *v = brand(nk, 1, &v32), *d = brand(nq, 1, &d32);
    uint16_t *rq = uvec(nq);
    float *rq32 = fvec(nq);
    ops16->rope_forward(rq, q, tab, doc, B, T, NH, HD);
    ops->rope_forward(rq32, q32, tab, doc, B, T, NH, HD);
    check_rounded("bf16 rope_forward with documents = rne(fp32 table)", rq, rq32, nq);

    gt_rng_key key = {3, 4};
    uint16_t *out = uvec(nq), *out2 = uvec(nq);
    float *lse = fvec(nl), *lse2 = fvec(nl), *probs = fvec(nl * T), *out32 = fvec(nq), *lse32 = fvec(nl);
    ops16->attention_forward(out, lse, probs, q, k, v, doc, B, T, NH, NKV, HD, 0.1f, key);
    ops16->attention_forward(out2, lse2, NULL, q, k, v, doc, B, T, NH, NKV, HD, 0.1f, key);
    check_same_bits("bf16 attention_forward with documents: same bits with probs NULL", out, out2, nq * 2);
    ops->attention_forward(out32, lse32, NULL, q32, k32, v32, doc, B, T, NH, NKV, HD, 0.1f, key);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < nq; i++) {
        worst = fmax(worst, fabs((double)bf16_up(out[i]) - out32[i]));
        scale = fmax(scale, fabs((double)out32[i]));
    }
    report("bf16 attention_forward with documents vs fp32 (of max |out|)", worst <= 2e-2 * scale,
           scale > 0 ? worst / scale : worst, 2e-2);
    uint16_t *dq = uvec(nq), *dk = uvec(nk), *dv = uvec(nk), *dq2 = uvec(nq), *dk2 = uvec(nk), *dv2 = uvec(nk);
    ops16->attention_backward(dq, dk, dv, d, out, q, k, v, lse, probs, doc, B, T, NH, NKV, HD, 0.1f, key);
    ops16->attention_backward(dq2, dk2, dv2, d, out, q, k, v, lse, NULL, doc, B, T, NH, NKV, HD, 0.1f, key);
    int same = !memcmp(dq, dq2, nq * 2) && !memcmp(dk, dk2, nk * 2) && !memcmp(dv, dv2, nk * 2);
    check_same_bits("bf16 attention_backward with documents: probs NULL bit-identical", &same, &(int){1}, sizeof(int));
}

static void test_bf16_swiglu(void) {
    enum { N = 1001 }; /* not a multiple of any lane count */
    float *g32, *u32, *d32, *out32 = fvec(N), *dg32 = fvec(N), *du32 = fvec(N);
    uint16_t *g = brand(N, 6, &g32), *u = brand(N, 2, &u32), *d = brand(N, 1, &d32);
    uint16_t *out = uvec(N), *dg = uvec(N), *du = uvec(N);
    ops16->swiglu_forward(out, g, u, N);
    ops->swiglu_forward(out32, g32, u32, N);
    check_rounded("bf16 swiglu_forward = rne(fp32 table)", out, out32, N);
    ops16->swiglu_backward(dg, du, d, g, u, N);
    ops->swiglu_backward(dg32, du32, d32, g32, u32, N);
    check_rounded("bf16 swiglu_backward dgate = rne(fp32 table)", dg, dg32, N);
    check_rounded("bf16 swiglu_backward dup = rne(fp32 table)", du, du32, N);
}

static void test_bf16_residual(float p) {
    enum { N = 1001 };
    gt_rng_key key = {9, 77};
    char name[128];
    float *r32, *b32, *out32 = fvec(N), *db32 = fvec(N);
    uint16_t *r = brand(N, 1, &r32), *b = brand(N, 1, &b32), *out = uvec(N), *db = uvec(N);
    /* every third res cancels its scaled branch to bf16 precision: the sum is then about the fp32
     * rounding error of branch * scale, so a kernel that rounds that product in one table and fuses
     * it (fmaf) in the other shows at once */
    for (int i = 0; i < N; i += 3) {
        r[i] = rne_bf16(-b32[i] / (1.0f - p));
        r32[i] = bf16_up(r[i]);
    }
    ops16->residual_forward(out, r, b, N, p, key);
    ops->residual_forward(out32, r32, b32, N, p, key);
    snprintf(name, sizeof name, "bf16 residual_forward = rne(fp32 table) (dropout %.2f)", p);
    check_rounded(name, out, out32, N);
    ops16->dropout_backward(db, b, N, p, key);
    ops->dropout_backward(db32, b32, N, p, key);
    snprintf(name, sizeof name, "bf16 dropout_backward = rne(fp32 table) (dropout %.2f)", p);
    check_rounded(name, db, db32, N);
}

/* Ties: res + s * branch with branch = half a bf16 ulp of res (s = 1 without dropout, 2 = 1/(1-p) at
 * p = 0.5, so branch is a quarter ulp there): the fp32 sum is exact and lies halfway between two bf16
 * values, res's own last bit deciding which is even. Round-half-up or ties-away give the upper one for
 * every positive res with an even last bit; truncation the lower for every odd one. Branch signs
 * alternate so both directions of the tie occur. */
static void test_bf16_residual_ties(float p) {
    enum { N = 1001 };
    gt_rng_key key = {3, 5};
    char name[128];
    uint16_t *r = uvec(N), *b = uvec(N), *out = uvec(N);
    float *r32 = fvec(N), *b32 = fvec(N), *out32 = fvec(N);
    const float s = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
    for (int i = 0; i < N; i++) {
        r[i] = rne_bf16((float)(4 * urand()));
        if ((r[i] & 0x7fffu) < 0x0100u) r[i] = 0x3f80; /* keep half an ulp a normal bf16 */
        r32[i] = bf16_up(r[i]);
        int e;
        frexpf(r32[i], &e);                          /* |res| in [2^(e-1), 2^e): ulp 2^(e-8) */
        float half_ulp = ldexpf(1.0f, e - 9) / s;
        /* away from zero on even i, toward zero on odd i; never toward zero from a power of two,
         * where the ulp below is half as large and res - half an ulp is a bf16 value, no tie */
        int away = !(i & 1) || (r[i] & 0x7fu) == 0;
        b32[i] = copysignf(half_ulp, away ? r32[i] : -r32[i]);
        b[i] = rne_bf16(b32[i]);
        b32[i] = bf16_up(b[i]);
    }
    ops16->residual_forward(out, r, b, N, p, key);
    ops->residual_forward(out32, r32, b32, N, p, key);
    size_t ties = count_ties(out32, N);
    snprintf(name, sizeof name, "bf16 residual ties = rne(fp32) (dropout %.2f, %zu ties)", p, ties);
    check_rounded(name, out, out32, N);
    snprintf(name, sizeof name, "  the tie inputs make ties (dropout %.2f)", p);
    report(name, ties >= (p > 0 ? N / 4 : N / 2), (double)ties / N, p > 0 ? 0.25 : 0.5);
}

static void test_bf16_crossentropy(void) {
    enum { BT = 6, V = 101 }; /* V not a multiple of the 8 lanes */
    int32_t tgt[BT] = {3, -1, 100, 0, 17, 64};
    size_t n = (size_t)BT * V;
    float *l32, *losses = fvec(BT), *lse = fvec(BT), *losses32 = fvec(BT), *lse32 = fvec(BT);
    uint16_t *l = brand(n, 5, &l32);
    ops16->crossentropy_forward(losses, lse, l, tgt, BT, V);
    ops->crossentropy_forward(losses32, lse32, l32, tgt, BT, V);
    check_equal_f32("bf16 crossentropy_forward losses (fp32) = fp32 table", losses, losses32, BT);
    check_equal_f32("bf16 crossentropy_forward lse (fp32) = fp32 table", lse, lse32, BT);
    ops16->crossentropy_backward(l, lse, tgt, BT, V, 0.37f);
    ops->crossentropy_backward(l32, lse32, tgt, BT, V, 0.37f);
    check_rounded("bf16 crossentropy_backward dlogits = rne(fp32 table)", l, l32, n);
}

/* to_working is the only fp32 -> bf16 rounding of a weight: random values, exact ties with either
 * last bit, one bit either side of a tie, subnormals, the overflow edge and signed zero. */
static void test_bf16_to_working(void) {
    enum { N = 1001, SPECIAL = 9 };
    static const uint32_t special[SPECIAL] = {0x7f7fffffu, 0x7f7f7fffu, 0xff7f8000u, 0x00008000u, 0x00018000u,
                                              0x80000000u, 0x00000001u, 0x7f800000u, 0xff800000u};
    float *m = fvec(N), *back = fvec(N);
    uint16_t *w = uvec(N);
    for (int i = 0; i < N; i++) {
        uint32_t top = (uint32_t)rne_bf16((float)(8 * urand())) << 16;
        uint32_t low[4] = {0x8000u, 0x8000u, 0x7fffu, 0x8001u}; /* half the elements exact ties */
        m[i] = i < SPECIAL ? f32_from_bits(special[i]) : f32_from_bits(top | low[i & 3]);
        if (i % 7 == 0 && i >= SPECIAL) m[i] = (float)urand();
    }
    ops16->to_working(w, m, N);
    size_t ties = count_ties(m, N);
    char name[128];
    snprintf(name, sizeof name, "bf16 to_working = rne(master) (%zu ties)", ties);
    check_rounded(name, w, m, N);
    ops16->to_master(back, w, N);
    float *up = fvec(N);
    for (int i = 0; i < N; i++) up[i] = bf16_up(w[i]);
    check_equal_f32("bf16 to_master = exact upcast", back, up, N);
}

/* C (M, N) = sum over K of A(m, k) B(k, n), |A| |B| summed in double: the scale of each output's
 * rounding errors. A(m, k) = a[m * sam + k * sak], B(k, n) = b[k * sbk + n * sbn]. */
static double *abs_gemm(const float *a, size_t sam, size_t sak, const float *b, size_t sbk, size_t sbn, int M, int N,
                        int K) {
    double *c = dvec((size_t)M * N);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += fabs((double)a[m * sam + k * sak]) * fabs((double)b[k * sbk + n * sbn]);
            c[(size_t)m * N + n] = s;
        }
    return c;
}

/* The bound for one product output, OpenBLAS sgemm (fp32 table) against oneDNN (bf16 table) on the
 * same bf16 inputs. Each product of two bf16 values is exact in fp32 (8 + 8 significant bits), so
 * both libraries add the same K exact terms (K + 1 with the old value of an accumulating output) in
 * fp32, each in its own order and blocking: any order of n additions is within gamma_n * sum |term|
 * of the exact sum (Higham, Accuracy and Stability, 2nd ed., (4.4); gamma_n = n u / (1 - n u),
 * u = 2^-24), so the two fp32 sums are within 2 gamma_n S of each other, S = sum |term|. A bf16 output
 * is then rounded once to nearest: half a bf16 ulp, at most 2^-8 of its magnitude (bf16 keeps 8
 * significant bits: its unit roundoff is 2^-8); so
 *   |bf16 out - sgemm| <= 2^-8 (|sgemm| + 2 gamma S) + 2 gamma S + FLT_MIN,
 * FLT_MIN for the AMX and AVX512-BF16 instructions flushing subnormal results to zero. The fp32
 * dweight has no final rounding: 2 gamma S + FLT_MIN alone. */
static double bf16_matmul_bound(double sgemm, double S, int nterms, int bf16_out) {
    const double u = ldexp(1.0, -24), g = nterms * u / (1 - nterms * u);
    double e = 2 * g * S + FLT_MIN;
    return bf16_out ? e + ldexp(1.0, -8) * (fabs(sgemm) + 2 * g * S) : e;
}

/* got (bf16 bits when bf16_out, else fp32) against the fp32 table's want; prints the largest
 * difference, its share of the bound, and how many bf16 outputs equal rne(sgemm) exactly */
static void check_matmul_bound(const char *name, const void *got, const float *want, const double *S, size_t n,
                               int nterms, int bf16_out) {
    double maxdiff = 0, maxratio = 0;
    size_t same = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        double g = bf16_out ? bf16_up(((const uint16_t *)got)[i]) : ((const float *)got)[i];
        if (!isfinite(g)) finite = 0;
        double d = fabs(g - (double)want[i]), r = d / bf16_matmul_bound(want[i], S[i], nterms, bf16_out);
        if (d > maxdiff) maxdiff = d;
        if (r > maxratio) maxratio = r;
        same += bf16_out ? ((const uint16_t *)got)[i] == rne_bf16(want[i]) : f32_bits((float)g) == f32_bits(want[i]);
    }
    int ok = finite && maxratio <= 1.0;
    printf("%-58s %s  (max |diff| %.3g = %.3g of the bound; %zu of %zu equal %s)\n", name, ok ? "PASS" : "FAIL",
           maxdiff, maxratio, same, n, bf16_out ? "rne(sgemm)" : "sgemm");
    if (!ok) failures++;
}

static void test_bf16_matmul(void) {
    enum { N = 33, IC = 67, OC = 45 }; /* none a multiple of oneDNN's or OpenBLAS' blocks */
    float *x32, *w32, *d32, *dx0_32;
    uint16_t *x = brand((size_t)N * IC, 1, &x32), *w = brand((size_t)OC * IC, 1, &w32);
    uint16_t *d = brand((size_t)N * OC, 1, &d32), *dx0 = brand((size_t)N * IC, 1, &dx0_32);
    uint16_t *out = uvec((size_t)N * OC), *dx = uvec((size_t)N * IC);
    float *out32 = fvec((size_t)N * OC), *dx32 = fvec((size_t)N * IC), *dw0 = fvec((size_t)OC * IC);
    for (size_t i = 0; i < (size_t)OC * IC; i++) dw0[i] = (float)urand();
    float *dw = fcopy(dw0, (size_t)OC * IC), *dw32 = fcopy(dw0, (size_t)OC * IC);

    /* out (N, OC) = x (N, IC) @ w^T */
    ops16->matmul_forward(out, x, w, N, IC, OC);
    ops->matmul_forward(out32, x32, w32, N, IC, OC);
    double *S = abs_gemm(x32, IC, 1, w32, 1, IC, N, OC, IC);
    check_matmul_bound("bf16 matmul_forward (oneDNN) vs sgemm, bound", out, out32, S, (size_t)N * OC, IC, 1);

    /* dinp (N, IC) = d (N, OC) @ w, overwriting NaNs; dweight (OC, IC) += d^T @ x */
    for (size_t i = 0; i < (size_t)N * IC; i++) dx[i] = 0x7fc0;
    ops16->matmul_backward(dx, dw, d, x, w, N, IC, OC, 0);
    ops->matmul_backward(dx32, dw32, d32, x32, w32, N, IC, OC, 0);
    S = abs_gemm(d32, OC, 1, w32, IC, 1, N, IC, OC);
    check_matmul_bound("bf16 matmul_backward dinp (overwrite) vs sgemm, bound", dx, dx32, S, (size_t)N * IC, OC, 1);
    double *Sw = abs_gemm(d32, 1, OC, x32, IC, 1, OC, IC, N);
    for (size_t i = 0; i < (size_t)OC * IC; i++) Sw[i] += fabs((double)dw0[i]);
    check_matmul_bound("bf16 matmul_backward dweight (fp32, +=) vs sgemm, bound", dw, dw32, Sw, (size_t)OC * IC,
                       N + 1, 0);

    /* accumulate: dinp = old + d @ w, the old bf16 value added in fp32 before the one rounding */
    memcpy(dx, dx0, (size_t)N * IC * sizeof *dx);
    memcpy(dx32, dx0_32, (size_t)N * IC * sizeof *dx32);
    ops16->matmul_backward(dx, NULL, d, x, w, N, IC, OC, 1);
    ops->matmul_backward(dx32, NULL, d32, x32, w32, N, IC, OC, 1);
    for (size_t i = 0; i < (size_t)N * IC; i++) S[i] += fabs((double)dx0_32[i]);
    check_matmul_bound("bf16 matmul_backward dinp (+=) vs sgemm, bound", dx, dx32, S, (size_t)N * IC, OC + 1, 1);
}

/* Both tables hold every op of ops.h's list (GT_OPS), and the bf16 table takes its own function for a
 * W op (one per working type) and the fp32 table's for an F op (fp32 tensors only). */
static void test_table_entries(const gt_ops *fp32, const gt_ops *bf16) {
    int set = 1, own = 1;
    char bad[256] = "";
#define CHECK_ENTRY(kind, op, ret, params, args, shapes)                                                  \
    if (!fp32->op || (bf16 && !bf16->op)) set = 0, snprintf(bad, sizeof bad, "%s", #op);                 \
    if (bf16 && (fp32->op == bf16->op) != (#kind[0] == 'F')) own = 0, snprintf(bad, sizeof bad, "%s", #op);
    GT_OPS(CHECK_ENTRY)
#undef CHECK_ENTRY
    char name[128];
    snprintf(name, sizeof name, "tables: every op of GT_OPS set%s%s", bad[0] ? ", not: " : "", bad);
    report(name, set, 0, 0);
    if (bf16) report("tables: bf16 takes its own W ops, the fp32 F ops", own, 0, 0);
}

static void test_bf16_table(void) {
    ops16 = gt_ops_cpu_bf16();
    test_rne_reference();
    printf("NOTE: the bf16 table's matrix products: %s\n", gt_cpu_bf16_isa());
    report("bf16 table: name cpu, act_bytes 2", !strcmp(ops16->name, "cpu") && ops16->act_bytes == 2, 0, 0);
    test_table_entries(ops, ops16);
    test_bf16_to_working();
    test_bf16_embedding();
    test_bf16_rmsnorm();
    test_bf16_rope();
    test_bf16_documents();
    test_bf16_swiglu();
    test_bf16_residual(0.0f);
    test_bf16_residual(0.25f);
    test_bf16_residual_ties(0.0f);
    test_bf16_residual_ties(0.5f);
    test_bf16_crossentropy();
    test_bf16_matmul();
}

/* Groups (arguments; none = all): fp32 (every op but attention), attention, documents (attention
 * with document masks), bf16 (the bf16 table against the fp32 one). ctest runs each as its own test,
 * so a change to one family's kernels can be checked by its group alone. */
static int wanted(int argc, char **argv, const char *group) {
    if (argc < 2) return 1;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], group)) return 1;
    return 0;
}

int main(int argc, char **argv) {
    static const char *groups[] = {"fp32", "attention", "documents", "bf16"};
    for (int i = 1; i < argc; i++) {
        int known = 0;
        for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) known |= !strcmp(argv[i], groups[g]);
        if (!known) {
            fprintf(stderr, "test_ops_cpu: unknown group '%s' (expected fp32, attention, documents, bf16)\n", argv[i]);
            return 2;
        }
    }
    ops = gt_ops_cpu();
    report("table: name cpu, act_bytes 4, probabilities not kept",
           !strcmp(ops->name, "cpu") && ops->act_bytes == 4 && ops->can_keep_attention_probs == 0, 0, 0);
    omp_set_num_threads(3);
    if (wanted(argc, argv, "fp32")) {
        test_embedding();
        test_embedding_determinism();
        test_rmsnorm();
        test_matmul();
        test_rope();
    }
    if (wanted(argc, argv, "attention")) {
        test_attention(0.0f, 2, 19);
        test_attention(0.25f, 2, 19);
        test_attention(0.0f, 1, 70);
        test_attention(0.25f, 1, 70);
    }
    if (wanted(argc, argv, "documents")) {
        test_attention_documents(0.0f);
        test_attention_documents(0.25f);
    }
    if (wanted(argc, argv, "fp32")) {
        test_swiglu();
        test_residual(0.0f);
        test_residual(0.25f);
        test_crossentropy();
        test_adamw();
        test_utilities();
    }
    if (wanted(argc, argv, "bf16")) test_bf16_table();
    release_all();
    if (failures) {
        printf("%d check(s) FAILED\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
