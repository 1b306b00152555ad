/*
 * test_ops_cuda.c — the CUDA backend agrees with the CPU backend, op by op, and repeats itself bit
 * for bit.
 *
 * Exits 77 (skipped) when gt_ops_cuda() finds no device. Otherwise, for each working type (fp32,
 * then bf16), every op of the table runs on random inputs on both backends and the results are
 * compared as  max|gpu - cpu| / max|cpu|  (error relative to the tensor's scale, so values near zero
 * do not dominate), and for attention and matmul outputs also row by row (check_rows: each row's error
 * relative to that row's own scale, at twice the tensor tolerance), so a head or a token whose values
 * are small cannot be wrong unnoticed. In bf16 mode the CPU gets the same bf16-rounded inputs the GPU sees, so the
 * difference is the GPU's rounding of its outputs (and of accumulated outputs) to bf16, 2^-8
 * relative per element, plus summation order.
 *
 * Tolerances (fp32 mode / bf16 mode), with why:
 *   exact ops (conversions, embedding, scale)             0        / 0
 *   elementwise (rope, swiglu, residual, dropout)         1e-5     / 1e-2   (expf/cos ulps; bf16 output)
 *   rmsnorm out, crossentropy dlogits                     1e-5     / 1e-2
 *   rmsnorm dinp (accumulated into the working type)      1e-4     / 2e-2   (two bf16 roundings)
 *   fp32 statistics: rstd, lse, losses                    1e-5     / 1e-4   (same rounded inputs)
 *   matmul out / dinp                                     1e-5     / 1e-2   (no TF32 in fp32 mode)
 *   weight gradients (fp32 accumulate: matmul, rmsnorm)   1e-5     / 1e-4
 *   attention out, dq, dk, dv                             1e-4     / 2e-2   (online softmax vs two-pass)
 *   sumsq                                                 1e-12 relative (double, order only)
 *   adamw param / moments                                 1e-6
 * Determinism: every GPU op runs twice on identical inputs and the two results must be equal bytes.
 * Attention includes the 7B shape (T 2048, 32 heads of 128) in bf16 mode, and runs twice in bf16
 * mode: with the default kernels, then with the opt-in mma forward and backward (cuda_attention_mma.cu,
 * train.cuda_attention = mma) forced on, same tolerances, with a check that the variant really took
 * the calls (forward and backward). Third, when libcudnn loads (else one SKIP line), cuDNN's fused attention (cuda_attention_cudnn.cu, train.cuda_attention = cudnn): same
 * tolerances, the calls it must take counted with its own fallback rules (dropout, HD, T = 1 and older
 * cuDNN's T % 128 go to the default kernels, whose results are checked all the same), and both mixed
 * pairings (default forward + cudnn backward and the reverse) to check that its lse is gtrain's.
 * cuDNN's backward accumulates dq non-deterministically, so for it the repeats of dq, dk and dv are
 * not required to be equal bytes (its forward's are).
 * Attention backward: the CPU gets the forward output as the GPU's backward reads it (bf16-rounded in
 * bf16 mode), and values whose exact value is zero (dq at position 0; dk too at T = 1) are bounded
 * against the size of the terms that cancel there instead of compared: both sides are rounding noise.
 * A dq row that fails the per-row comparison is judged again against an fp64 recomputation of that row
 * (a "note" line says so): where a row's sum cancels, the CPU's own error can exceed the tolerance. In
 * bf16 mode that recomputation takes D from the GPU's forward output, as the GPU's backward does (the
 * CPU's output, rounded, differs from it by a bf16 step here and there, which such rows magnify).
 * Built with GT_CUDA_EMULATED (the CPU emulation of tests/gpu/emu, test cuda_kernels_emulated_match_cpu)
 * the mma variant runs its real kernel source (ldmatrix, mma.sync and cp.async by the emulation's
 * include/cuda_ptx.cuh; the work in cuda_emu.cpp).
 * Token ids and targets outside [0, V) must raise the device fault flag (take_fault) and never be
 * read through. Also checked: rmsnorm_apply equals rmsnorm_forward's out bit for bit (the recompute contract),
 * and in-place calls give the out-of-place bits (the aliasing model.c uses: rope forward and backward,
 * residual with out == res and out == branch, swiglu_backward with dgate == dout, dropout_backward).
 *
 * Data moves with the table's own functions: copy_to_device/copy_to_host of fp32 staging buffers
 * and to_working/to_master for the working type.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

static const gt_ops *cpu, *gpu;

/* private to the CUDA backend (cuda_attention.cuh): force the attention variant by its
 * train.cuda_attention name ("default", "mma", "cudnn"; NULL: back to the one gt_ops_cuda was given) */
void gt_cuda_attention_force_variant(const char *name);
long gt_cuda_attention_mma_calls(void); /* cuda_attention_mma.cu: forward and backward calls it took */
/* cuda_attention_cudnn.cu: calls cuDNN ran; its version once loaded (0 and why otherwise); whether its
 * static fallback rules let a call through */
long gt_cuda_attention_cudnn_calls(void);
long gt_cuda_attention_cudnn_version(char *why, size_t n);
int gt_cuda_attention_cudnn_shape_ok(int backward, int T, int HD, float dropout);
const char *gt_cuda_attention_cudnn_last_fallback(void);
static const char *attn_variant = ""; /* prefix of the attention checks' names */
/* the variant forced just before each forward / backward call (mixed pairings); NULL: leave it */
static const char *attn_fwd_force, *attn_bwd_force;
static int attn_nondet_bwd; /* 1: dq, dk, dv repeats need not be equal bytes (cuDNN's backward) */
static int bf16_mode;
static int failures, checks;

/* ---------------------------------------------------------------- host helpers */

static uint64_t rng_state = 0x1234567ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state = gt_mix64(rng_state);
    return (float)(rng_state >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    return p;
}

/* host round-to-nearest-even to bf16 (no NaNs in these tests) */
static float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* random vector; in bf16 mode a working-type input is rounded so the CPU sees what the GPU sees */
static float *rand_vec(size_t n, float scale, int working) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        x[i] = frand() * scale;
        if (working && bf16_mode) x[i] = round_bf16(x[i]);
    }
    return x;
}

static float *dup_vec(const float *x, size_t n) {
    float *y = xmalloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* ---------------------------------------------------------------- device helpers */

static float *dev_f32(const float *h, size_t n) {
    float *d = gpu->alloc(n * sizeof(float));
    gpu->copy_to_device(d, h, n * sizeof(float));
    return d;
}

static void get_f32(float *h, const float *d, size_t n) { gpu->copy_to_host(h, d, n * sizeof(float)); }

static void *dev_work(const float *h, size_t n) {
    void *d = gpu->alloc(n * (size_t)gpu->act_bytes);
    float *tmp = dev_f32(h, n);
    gpu->to_working(d, tmp, n);
    gpu->free(tmp);
    return d;
}

static void get_work(float *h, const void *d, size_t n) {
    float *tmp = gpu->alloc(n * sizeof(float));
    gpu->to_master(tmp, d, n);
    get_f32(h, tmp, n);
    gpu->free(tmp);
}

static int32_t *dev_i32(const int32_t *h, size_t n) {
    int32_t *d = gpu->alloc(n * sizeof(int32_t));
    gpu->copy_to_device(d, h, n * sizeof(int32_t));
    return d;
}

/* ---------------------------------------------------------------- checks */

static void check_close(const char *name, const float *got, const float *want, size_t n, double tol) {
    double max_diff = 0.0, max_ref = 0.0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) && isfinite(want[i])) bad = 1;
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > max_diff) max_diff = d;
        if (fabs((double)want[i]) > max_ref) max_ref = fabs((double)want[i]);
    }
    double rel = max_ref > 0.0 ? max_diff / max_ref : max_diff;
    checks++;
    if (bad || !(rel <= tol)) {
        failures++;
        printf("FAIL %-5s %-40s rel err %.3e > tol %.1e%s\n", bf16_mode ? "bf16" : "fp32", name, rel, tol,
               bad ? " (non-finite values)" : "");
    } else {
        printf("ok   %-5s %-40s rel err %.3e (tol %.1e)\n", bf16_mode ? "bf16" : "fp32", name, rel, tol);
    }
}

/* The same comparison row by row: for rows of row_len elements, max|got - want| over the row divided by
 * the row's own max|want| (floored at 1e-3 of the tensor's max, so an all-but-zero row is judged on the
 * tensor's scale): a row with small values cannot hide behind the tensor's largest one, as it can in
 * check_close. Reports the worst row. */
/* when > 0: check_rows leaves out the rows of position t = 0 of a (B, T, rows_skip_t0_NH, row_len)
 * tensor (attention dq, whose exact value there is zero: check_zero judges those rows instead) */
static int rows_skip_t0_T, rows_skip_t0_NH;
/* and with document starts (B, T) set, the rows of every document's first position, whose dq cancels
 * exactly as that of t = 0 */
static const int32_t *rows_skip_doc;
/* dk: with document starts set, the rows of keys that are one-token documents (seen by their own query
 * alone, whose ds cancels exactly: dk is zero there, as at T = 1); rows (B, T, rows_single_heads, .) */
static const int32_t *rows_single_doc;
static int rows_single_T, rows_single_heads;
/* when set: a row that fails against the CPU is judged again against this fp64 recomputation of the row
 * (attention dq in fp32 mode: rows whose sum cancels, where the CPU's fp32 result can itself be off by
 * more than the tolerance, e.g. 4.2e-4 at B3 T33 HD24 row 103 of the full run while the GPU kernel was
 * within 4.9e-5 of fp64; the row passes only if the GPU is within the tolerance of the fp64 value) */
static void (*rows_fp64)(size_t row, double *out);

static void check_rows(const char *name, const float *got, const float *want, size_t n, size_t row_len, double tol) {
    double max_ref = 0.0, worst = 0.0, cpu_off = 0.0;
    size_t worst_row = 0, rejudged = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)want[i]) > max_ref) max_ref = fabs((double)want[i]);
    for (size_t r = 0; r * row_len < n; r++) {
        if (rows_skip_t0_T > 0 && (r / (size_t)rows_skip_t0_NH) % (size_t)rows_skip_t0_T == 0) continue;
        if (rows_single_doc) {
            const size_t bt = r / (size_t)rows_single_heads;
            const int t = (int)(bt % (size_t)rows_single_T);
            if (rows_single_doc[bt] == t && (t + 1 == rows_single_T || rows_single_doc[bt + 1] == t + 1)) continue;
        }
        if (rows_skip_t0_T > 0 && rows_skip_doc) {
            const size_t bt = r / (size_t)rows_skip_t0_NH;
            if (rows_skip_doc[bt] == (int32_t)(bt % (size_t)rows_skip_t0_T)) continue;
        }
        double d = 0.0, ref = 1e-3 * max_ref;
        for (size_t i = r * row_len; i < (r + 1) * row_len && i < n; i++) {
            if (!isfinite(got[i]) && isfinite(want[i])) bad = 1;
            double e = fabs((double)got[i] - (double)want[i]);
            if (e > d) d = e;
            if (fabs((double)want[i]) > ref) ref = fabs((double)want[i]);
        }
        double rel = ref > 0.0 ? d / ref : d;
        if (!(rel <= tol) && rows_fp64 && row_len <= 256) {
            double exact[256], d64 = 0.0, c64 = 0.0, ref64 = 1e-3 * max_ref;
            rows_fp64(r, exact);
            for (size_t j = 0; j < row_len && r * row_len + j < n; j++) {
                d64 = fmax(d64, fabs((double)got[r * row_len + j] - exact[j]));
                c64 = fmax(c64, fabs((double)want[r * row_len + j] - exact[j]));
                ref64 = fmax(ref64, fabs(exact[j]));
            }
            rel = d64 / ref64;
            rejudged++;
            cpu_off = fmax(cpu_off, c64 / ref64);
        }
        if (rel > worst) worst = rel, worst_row = r;
    }
    checks++;
    char label[160];
    snprintf(label, sizeof label, "%s per row", name);
    if (rejudged)
        printf("note %-5s %-40s %zu rows judged against fp64 (the CPU's error there: up to %.3e)\n",
               bf16_mode ? "bf16" : "fp32", label, rejudged, cpu_off);
    if (bad || !(worst <= tol)) {
        failures++;
        printf("FAIL %-5s %-40s worst row %zu rel err %.3e > tol %.1e%s\n", bf16_mode ? "bf16" : "fp32", label,
               worst_row, worst, tol, bad ? " (non-finite values)" : "");
    } else {
        printf("ok   %-5s %-40s worst row rel err %.3e (tol %.1e)\n", bf16_mode ? "bf16" : "fp32", label, worst, tol);
    }
}

/* values whose exact value is zero, where both backends leave rounding noise of a sum that cancels:
 * judged against the size of the cancelling terms (bound), not against each other */
static void check_zero(const char *name, const float *got, size_t n, size_t row_len, size_t stride, double bound) {
    double worst = 0.0;
    int bad = 0;
    for (size_t r = 0; r * stride < n; r++)
        for (size_t i = r * stride; i < r * stride + row_len && i < n; i++) {
            if (!isfinite(got[i])) bad = 1;
            if (fabs((double)got[i]) > worst) worst = fabs((double)got[i]);
        }
    checks++;
    if (bad || !(worst <= bound)) {
        failures++;
        printf("FAIL %-5s %-40s max |value| %.3e > %.1e%s\n", bf16_mode ? "bf16" : "fp32", name, worst, bound,
               bad ? " (non-finite values)" : "");
    } else {
        printf("ok   %-5s %-40s max |value| %.3e (bound %.1e)\n", bf16_mode ? "bf16" : "fp32", name, worst, bound);
    }
}

static void check_same(const char *name, const float *a, const float *b, size_t n) {
    checks++;
    if (memcmp(a, b, n * sizeof(float)) != 0) {
        failures++;
        printf("FAIL %-5s %-40s not bit-identical\n", bf16_mode ? "bf16" : "fp32", name);
    }
}

static double tol_of(double fp32_tol, double bf16_tol) { return bf16_mode ? bf16_tol : fp32_tol; }

/* ---------------------------------------------------------------- tests */

static void test_allocator_reuses_blocks(void) {
    void *a = gpu->alloc(1000);
    gpu->free(a);
    void *b = gpu->alloc(1000);
    checks++;
    if (a != b) {
        failures++;
        printf("FAIL       allocator: a freed block of the same size is not reused\n");
    }
    gpu->free(b);
    gpu->free(NULL);

    /* reserved bytes count live and cached blocks; release_cached gives the cache back */
    const size_t big = (size_t)64 << 20;
    size_t r0 = gpu->reserved_bytes();
    void *p = gpu->alloc(big);
    size_t r1 = gpu->reserved_bytes();
    gpu->free(p);
    size_t r2 = gpu->reserved_bytes();
    gpu->release_cached();
    size_t r3 = gpu->reserved_bytes();
    checks++;
    if (!(r1 >= r0 + big && r2 == r1 && r3 + big <= r2)) {
        failures++;
        printf("FAIL       allocator: reserved %zu, after a 64 MiB alloc %zu, after free %zu, after release %zu\n", r0,
               r1, r2, r3);
    } else {
        printf("ok         allocator: reserved bytes follow alloc, free and release_cached (%zu -> %zu -> %zu)\n", r1,
               r2, r3);
    }
}

static void test_conversions(void) {
    const size_t n = 4099;
    float *x = rand_vec(n, 3.0f, 0), *got = xmalloc(n * sizeof(float)), *want = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = bf16_mode ? round_bf16(x[i]) : x[i];
    void *d = dev_work(x, n);
    get_work(got, d, n);
    check_close("to_working/to_master round trip (RNE)", got, want, n, 0.0);
    gpu->free(d);
    free(x);
    free(got);
    free(want);
}

static void test_embedding(int V, int C, int BT) {
    int32_t *tok = xmalloc(BT * sizeof(int32_t));
    for (int i = 0; i < BT; i++) tok[i] = (int32_t)((frand() + 1.0f) * 0.5f * V) % V;
    float *wte = rand_vec((size_t)V * C, 1.0f, 1), *dout = rand_vec((size_t)BT * C, 1.0f, 1);
    float *dwte0 = rand_vec((size_t)V * C, 1.0f, 0);
    size_t no = (size_t)BT * C, nw = (size_t)V * C;

    float *want = xmalloc(no * sizeof(float)), *dwant = dup_vec(dwte0, nw);
    cpu->embedding_forward(want, tok, wte, BT, C, V);
    cpu->embedding_backward(dwant, dout, tok, BT, C, V);

    float *got[2], *dgot[2];
    int32_t *dtok = dev_i32(tok, BT);
    void *dwte_w = dev_work(wte, nw), *ddout = dev_work(dout, no);
    for (int rep = 0; rep < 2; rep++) {
        got[rep] = xmalloc(no * sizeof(float));
        dgot[rep] = xmalloc(nw * sizeof(float));
        void *out = gpu->alloc(no * gpu->act_bytes);
        float *dw = dev_f32(dwte0, nw);
        gpu->embedding_forward(out, dtok, dwte_w, BT, C, V);
        gpu->embedding_backward(dw, ddout, dtok, BT, C, V);
        get_work(got[rep], out, no);
        get_f32(dgot[rep], dw, nw);
        gpu->free(out);
        gpu->free(dw);
    }
    check_close("embedding_forward", got[0], want, no, 0.0);
    check_close("embedding_backward (+=)", dgot[0], dwant, nw, 1e-6);
    check_same("embedding_forward repeat", got[0], got[1], no);
    check_same("embedding_backward repeat", dgot[0], dgot[1], nw);
    gpu->free(dtok);
    gpu->free(dwte_w);
    gpu->free(ddout);
    for (int rep = 0; rep < 2; rep++) {
        free(got[rep]);
        free(dgot[rep]);
    }
    free(tok), free(wte), free(dout), free(dwte0), free(want), free(dwant);
}

/* Token ids outside [0, V): no out-of-bounds read, a zero row (a zero loss for a target), and the
 * fault flag that take_fault reports once, with the id and the vocabulary size in its message. */
static void test_token_fault(void) {
    const int V = 11, C = 64, BT = 6;
    int32_t tok[6] = {0, 3, 11, 5, -2, 10};
    float *wte = rand_vec((size_t)V * C, 1.0f, 1), *got = xmalloc((size_t)BT * C * sizeof(float));
    char msg[512] = "";
    int stale = gpu->take_fault(msg, sizeof msg); /* clear anything earlier tests left */
    int32_t *dtok = dev_i32(tok, BT);
    void *dwte = dev_work(wte, (size_t)V * C), *out = gpu->alloc((size_t)BT * C * gpu->act_bytes);
    gpu->embedding_forward(out, dtok, dwte, BT, C, V);
    get_work(got, out, (size_t)BT * C);
    int raised = gpu->take_fault(msg, sizeof msg), again = gpu->take_fault(NULL, 0);
    int zero_rows = 1, good_rows = 1;
    for (int c = 0; c < C; c++) {
        zero_rows &= got[2 * C + c] == 0.0f && got[4 * C + c] == 0.0f;
        good_rows &= got[1 * C + c] == wte[3 * C + c] && got[5 * C + c] == wte[10 * C + c];
    }
    checks++;
    if (stale || !raised || again || !zero_rows || !good_rows || !strstr(msg, "vocab_size = 11") ||
        (!strstr(msg, "token id 11 ") && !strstr(msg, "token id -2 "))) {
        failures++;
        printf("FAIL %-5s token id out of range: stale %d raised %d again %d zero rows %d good rows %d msg \"%s\"\n",
               bf16_mode ? "bf16" : "fp32", stale, raised, again, zero_rows, good_rows, msg);
    } else {
        printf("ok   %-5s %-40s \"%s\"\n", bf16_mode ? "bf16" : "fp32", "embedding: bad token id flagged", msg);
    }

    /* a target past the vocabulary: loss 0 (not NaN, not a read past the row), flagged */
    int32_t tg[2] = {4, 99};
    float *logits = rand_vec((size_t)2 * V, 1.0f, 1), loss[2] = {NAN, NAN};
    void *dlog = dev_work(logits, (size_t)2 * V);
    int32_t *dtg = dev_i32(tg, 2);
    float *dloss = gpu->alloc(2 * sizeof(float)), *dlse = gpu->alloc(2 * sizeof(float));
    gpu->crossentropy_forward(dloss, dlse, dlog, dtg, 2, V);
    get_f32(loss, dloss, 2);
    raised = gpu->take_fault(msg, sizeof msg);
    checks++;
    if (!raised || loss[1] != 0.0f || !isfinite(loss[0]) || !strstr(msg, "target token id 99")) {
        failures++;
        printf("FAIL %-5s target out of range: raised %d losses %g %g msg \"%s\"\n", bf16_mode ? "bf16" : "fp32",
               raised, loss[0], loss[1], msg);
    } else {
        printf("ok   %-5s %-40s \"%s\"\n", bf16_mode ? "bf16" : "fp32", "crossentropy: bad target flagged", msg);
    }
    gpu->free(dtok), gpu->free(dwte), gpu->free(out), gpu->free(dlog), gpu->free(dtg), gpu->free(dloss), gpu->free(dlse);
    free(wte), free(got), free(logits);
}

/* C 300: the separate kernels in bf16 (not a multiple of 8), the fused one in fp32; C 2048 and 8192:
 * the fused backward with 1, 2 and 4 groups per thread (8192 fp32: the separate kernels again) */
static void test_rmsnorm(int N, int C) {
    const float eps = 1e-5f;
    size_t n = (size_t)N * C;
    float *x = rand_vec(n, 2.0f, 1), *w = rand_vec(C, 1.0f, 1), *dout = rand_vec(n, 1.0f, 1);
    float *dinp0 = rand_vec(n, 1.0f, 1), *dw0 = rand_vec(C, 1.0f, 0);

    float *want = xmalloc(n * sizeof(float)), *rstd_want = xmalloc(N * sizeof(float));
    float *dinp_want = dup_vec(dinp0, n), *dw_want = dup_vec(dw0, C);
    cpu->rmsnorm_forward(want, rstd_want, x, w, N, C, eps);
    cpu->rmsnorm_backward(dinp_want, dw_want, dout, x, w, rstd_want, N, C);

    float *got[2], *rstd_got[2], *dinp_got[2], *dw_got[2];
    float *applied = xmalloc(n * sizeof(float));
    void *dx = dev_work(x, n), *dwt = dev_work(w, C), *ddout = dev_work(dout, n);
    for (int rep = 0; rep < 2; rep++) {
        got[rep] = xmalloc(n * sizeof(float));
        rstd_got[rep] = xmalloc(N * sizeof(float));
        dinp_got[rep] = xmalloc(n * sizeof(float));
        dw_got[rep] = xmalloc(C * sizeof(float));
        void *out = gpu->alloc(n * gpu->act_bytes), *dinp = dev_work(dinp0, n);
        float *rstd = gpu->alloc(N * sizeof(float)), *dw = dev_f32(dw0, C);
        gpu->rmsnorm_forward(out, rstd, dx, dwt, N, C, eps);
        gpu->rmsnorm_backward(dinp, dw, ddout, dx, dwt, rstd, N, C);
        get_work(got[rep], out, n);
        get_f32(rstd_got[rep], rstd, N);
        get_work(dinp_got[rep], dinp, n);
        get_f32(dw_got[rep], dw, C);
        if (rep == 0) {
            gpu->zero(out, n * gpu->act_bytes);
            gpu->rmsnorm_apply(out, rstd, dx, dwt, N, C);
            get_work(applied, out, n);
        }
        gpu->free(out), gpu->free(dinp), gpu->free(rstd), gpu->free(dw);
    }
    char name[96];
    snprintf(name, sizeof name, "rmsnorm_forward out C=%d", C);
    check_close(name, got[0], want, n, tol_of(1e-5, 1e-2));
    snprintf(name, sizeof name, "rmsnorm_forward rstd C=%d", C);
    check_close(name, rstd_got[0], rstd_want, N, tol_of(1e-5, 1e-4));
    snprintf(name, sizeof name, "rmsnorm_backward dinp (+=) C=%d", C);
    check_close(name, dinp_got[0], dinp_want, n, tol_of(1e-4, 2e-2));
    snprintf(name, sizeof name, "rmsnorm_backward dweight (+=) C=%d", C);
    check_close(name, dw_got[0], dw_want, C, tol_of(1e-5, 1e-4));
    snprintf(name, sizeof name, "rmsnorm_apply == rmsnorm_forward out C=%d", C);
    check_same(name, applied, got[0], n);
    snprintf(name, sizeof name, "rmsnorm_forward repeat C=%d", C);
    check_same(name, got[0], got[1], n);
    snprintf(name, sizeof name, "rmsnorm_forward rstd repeat C=%d", C);
    check_same(name, rstd_got[0], rstd_got[1], N);
    snprintf(name, sizeof name, "rmsnorm_backward dinp repeat C=%d", C);
    check_same(name, dinp_got[0], dinp_got[1], n);
    snprintf(name, sizeof name, "rmsnorm_backward dweight repeat C=%d", C);
    check_same(name, dw_got[0], dw_got[1], C);
    gpu->free(dx), gpu->free(dwt), gpu->free(ddout);
    for (int rep = 0; rep < 2; rep++) free(got[rep]), free(rstd_got[rep]), free(dinp_got[rep]), free(dw_got[rep]);
    free(x), free(w), free(dout), free(dinp0), free(dw0), free(want), free(rstd_want), free(dinp_want), free(dw_want);
    free(applied);
}

static void test_matmul(int N, int IC, int OC) {
    char name[96];
    size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
    float *x = rand_vec(ni, 1.0f, 1), *w = rand_vec(nw, 0.2f, 1), *dout = rand_vec(no, 1.0f, 1);
    float *dinp0 = rand_vec(ni, 1.0f, 1), *dw0 = rand_vec(nw, 1.0f, 0);

    float *want = xmalloc(no * sizeof(float));
    float *dinp_set = xmalloc(ni * sizeof(float)), *dinp_acc = dup_vec(dinp0, ni), *dw_want = dup_vec(dw0, nw);
    cpu->matmul_forward(want, x, w, N, IC, OC);
    cpu->matmul_backward(dinp_set, NULL, dout, x, w, N, IC, OC, 0);
    cpu->matmul_backward(dinp_acc, dw_want, dout, x, w, N, IC, OC, 1);

    float *got[2], *gset[2], *gacc[2], *gdw[2];
    void *dx = dev_work(x, ni), *dwt = dev_work(w, nw), *ddout = dev_work(dout, no);
    for (int rep = 0; rep < 2; rep++) {
        got[rep] = xmalloc(no * sizeof(float));
        gset[rep] = xmalloc(ni * sizeof(float));
        gacc[rep] = xmalloc(ni * sizeof(float));
        gdw[rep] = xmalloc(nw * sizeof(float));
        void *out = gpu->alloc(no * gpu->act_bytes), *dset = dev_work(dinp0, ni), *dacc = dev_work(dinp0, ni);
        float *dw = dev_f32(dw0, nw);
        gpu->matmul_forward(out, dx, dwt, N, IC, OC);
        gpu->matmul_backward(dset, NULL, ddout, dx, dwt, N, IC, OC, 0);
        gpu->matmul_backward(dacc, dw, ddout, dx, dwt, N, IC, OC, 1);
        get_work(got[rep], out, no);
        get_work(gset[rep], dset, ni);
        get_work(gacc[rep], dacc, ni);
        get_f32(gdw[rep], dw, nw);
        gpu->free(out), gpu->free(dset), gpu->free(dacc), gpu->free(dw);
    }
    snprintf(name, sizeof name, "matmul_forward %dx%dx%d", N, IC, OC);
    check_close(name, got[0], want, no, tol_of(1e-5, 1e-2));
    check_rows(name, got[0], want, no, (size_t)OC, tol_of(2e-5, 2e-2));
    check_same(name, got[0], got[1], no);
    snprintf(name, sizeof name, "matmul_backward dinp (=) %dx%dx%d", N, IC, OC);
    check_close(name, gset[0], dinp_set, ni, tol_of(1e-5, 1e-2));
    check_same(name, gset[0], gset[1], ni);
    snprintf(name, sizeof name, "matmul_backward dinp (+=) %dx%dx%d", N, IC, OC);
    check_close(name, gacc[0], dinp_acc, ni, tol_of(1e-5, 2e-2));
    check_same(name, gacc[0], gacc[1], ni);
    snprintf(name, sizeof name, "matmul_backward dweight (+=) %dx%dx%d", N, IC, OC);
    check_close(name, gdw[0], dw_want, nw, tol_of(1e-5, 1e-4));
    check_same(name, gdw[0], gdw[1], nw);
    gpu->free(dx), gpu->free(dwt), gpu->free(ddout);
    for (int rep = 0; rep < 2; rep++) free(got[rep]), free(gset[rep]), free(gacc[rep]), free(gdw[rep]);
    free(x), free(w), free(dout), free(dinp0), free(dw0), free(want), free(dinp_set), free(dinp_acc), free(dw_want);
}

static void test_rope(int B, int T, int NH, int HD) {
    const float theta = 10000.0f;
    char name[96], tag[48];
    snprintf(tag, sizeof tag, "B%d T%d NH%d HD%d", B, T, NH, HD);
    size_t n = (size_t)B * T * NH * HD;
    float *x = rand_vec(n, 1.0f, 1), *want = xmalloc(n * sizeof(float)), *dwant = xmalloc(n * sizeof(float));
    /* the (cos, sin) table (T, HD/2, 2) the model builds (gt_rope_table), here for plain theta */
    float *tab = xmalloc((size_t)T * HD * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HD / 2; i++) {
            float angle = (float)t * (1.0f / powf(theta, (float)(2 * i) / (float)HD));
            tab[((size_t)t * HD / 2 + i) * 2] = (float)cos((double)angle);
            tab[((size_t)t * HD / 2 + i) * 2 + 1] = (float)sin((double)angle);
        }
    float *dtab = gpu->alloc((size_t)T * HD * sizeof(float));
    gpu->copy_to_device(dtab, tab, (size_t)T * HD * sizeof(float));
    cpu->rope_forward(want, x, tab, NULL, B, T, NH, HD);
    cpu->rope_backward(dwant, x, tab, NULL, B, T, NH, HD);
    float *got[2], *dgot[2], *inplace = xmalloc(n * sizeof(float));
    void *dx = dev_work(x, n);
    for (int rep = 0; rep < 2; rep++) {
        got[rep] = xmalloc(n * sizeof(float));
        dgot[rep] = xmalloc(n * sizeof(float));
        void *out = gpu->alloc(n * gpu->act_bytes), *dout = gpu->alloc(n * gpu->act_bytes);
        gpu->rope_forward(out, dx, dtab, NULL, B, T, NH, HD);
        gpu->rope_backward(dout, dx, dtab, NULL, B, T, NH, HD);
        get_work(got[rep], out, n);
        get_work(dgot[rep], dout, n);
        gpu->free(out), gpu->free(dout);
    }
    void *io = dev_work(x, n);
    gpu->rope_forward(io, io, dtab, NULL, B, T, NH, HD);
    get_work(inplace, io, n);
    gpu->free(io);
    float *dinplace = xmalloc(n * sizeof(float));
    io = dev_work(x, n);
    gpu->rope_backward(io, io, dtab, NULL, B, T, NH, HD);
    get_work(dinplace, io, n);
    gpu->free(io);
#define ROPE_NAME(what) (snprintf(name, sizeof name, "rope_%s %s", what, tag), name)
    check_same(ROPE_NAME("backward in place"), dinplace, dgot[0], n);
    free(dinplace);
    check_close(ROPE_NAME("forward"), got[0], want, n, tol_of(1e-5, 1e-2));
    check_close(ROPE_NAME("backward"), dgot[0], dwant, n, tol_of(1e-5, 1e-2));
    check_same(ROPE_NAME("forward repeat"), got[0], got[1], n);
    check_same(ROPE_NAME("backward repeat"), dgot[0], dgot[1], n);
    check_same(ROPE_NAME("forward in place"), inplace, got[0], n);
    /* positions restarting at each document (ops.h's doc): sequence b restarts at t = 1 + b % (T - 1)
     * and at 2 + b % (T - 1) when T > 2 (a one-token document between) */
    int32_t *doc = xmalloc((size_t)B * T * sizeof(int32_t));
    for (int b = 0; b < B; b++) {
        const int r = T > 1 ? 1 + b % (T - 1) : 0, r2 = T > 2 && r + 1 < T ? r + 1 : T;
        for (int t = 0; t < T; t++) doc[(size_t)b * T + t] = t < r ? 0 : t < r2 ? r : r2;
    }
    int32_t *ddoc = gpu->alloc((size_t)B * T * sizeof(int32_t));
    gpu->copy_to_device(ddoc, doc, (size_t)B * T * sizeof(int32_t));
    cpu->rope_forward(want, x, tab, doc, B, T, NH, HD);
    cpu->rope_backward(dwant, x, tab, doc, B, T, NH, HD);
    void *dout = gpu->alloc(n * gpu->act_bytes), *ddx = gpu->alloc(n * gpu->act_bytes);
    gpu->rope_forward(dout, dx, dtab, ddoc, B, T, NH, HD);
    gpu->rope_backward(ddx, dx, dtab, ddoc, B, T, NH, HD);
    get_work(got[0], dout, n);
    get_work(dgot[0], ddx, n);
    check_close(ROPE_NAME("forward, documents"), got[0], want, n, tol_of(1e-5, 1e-2));
    check_close(ROPE_NAME("backward, documents"), dgot[0], dwant, n, tol_of(1e-5, 1e-2));
    gpu->free(dout), gpu->free(ddx), gpu->free(ddoc);
    free(doc);
#undef ROPE_NAME
    gpu->free(dx);
    for (int rep = 0; rep < 2; rep++) free(got[rep]), free(dgot[rep]);
    gpu->free(dtab);
    free(x), free(want), free(dwant), free(inplace), free(tab);
}

/* the inputs of the attention call being checked, for attention_dq_fp64 */
static struct {
    const float *q, *k, *v, *dout;
    const float *out; /* when set: D = dout . out (the output the GPU's backward read), else exact */
    int T, NH, NKV, HD;
    float dropout;
    gt_rng_key key;
} attn_in;

/* dq of row (b, t, h) in fp64 from the inputs, directly: p = softmax(scale q k^T) over s <= t,
 * dp = dout . v_s (times keep/(1-p) or 0 under dropout), D = sum p dp (or dout . out, attn_in.out given),
 * dq = sum_s p (dp - D) scale k_s */
static void attention_dq_fp64(size_t row, double *out) {
    const int T = attn_in.T, NH = attn_in.NH, NKV = attn_in.NKV, HD = attn_in.HD, h = (int)(row % NH);
    const size_t bt = row / NH;
    const int t = (int)(bt % T), b = (int)(bt / T), g = h / (NH / NKV);
    const double scale = 1.0 / sqrt((double)HD), keep_scale = attn_in.dropout > 0.0f ? 1.0 / (1.0 - attn_in.dropout) : 1.0;
    const float *qt = attn_in.q + row * HD, *dt = attn_in.dout + row * HD;
    double *p = xmalloc(sizeof(double) * 2 * (t + 1)), *dp = p + t + 1, mx = -INFINITY, sum = 0.0, D = 0.0;
    for (int s = 0; s <= t; s++) {
        const float *ks = attn_in.k + (((size_t)b * T + s) * NKV + g) * HD, *vs = attn_in.v + (((size_t)b * T + s) * NKV + g) * HD;
        double a = 0.0, c = 0.0;
        for (int d = 0; d < HD; d++) a += (double)qt[d] * ks[d], c += (double)dt[d] * vs[d];
        p[s] = a * scale;
        mx = fmax(mx, p[s]);
        const uint64_t di = (((uint64_t)b * NH + h) * T + t) * T + s;
        dp[s] = attn_in.dropout > 0.0f ? (gt_dropout_keep(attn_in.key, di, attn_in.dropout) ? c * keep_scale : 0.0) : c;
    }
    for (int s = 0; s <= t; s++) sum += p[s] = exp(p[s] - mx);
    for (int s = 0; s <= t; s++) p[s] /= sum, D += p[s] * dp[s];
    if (attn_in.out) {
        D = 0.0;
        for (int d = 0; d < HD; d++) D += (double)dt[d] * attn_in.out[row * HD + d];
    }
    for (int d = 0; d < HD; d++) out[d] = 0.0;
    for (int s = 0; s <= t; s++) {
        const float *ks = attn_in.k + (((size_t)b * T + s) * NKV + g) * HD;
        for (int d = 0; d < HD; d++) out[d] += p[s] * (dp[s] - D) * scale * ks[d];
    }
    free(p);
}

/* doc: ops.h's document starts (B, T) on the host, or NULL */
static void test_attention_doc(int B, int T, int NH, int NKV, int HD, float dropout, const int32_t *doc) {
    char name[128], tag[80];
    snprintf(tag, sizeof tag, "%sB%d T%d NH%d NKV%d HD%d p%.2f%s", attn_variant, B, T, NH, NKV, HD, dropout,
             doc ? " documents" : "");
    const gt_rng_key key = {42, 7};
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD, nl = (size_t)B * NH * T;
    float *q = rand_vec(nq, 2.0f, 1), *k = rand_vec(nk, 2.0f, 1), *v = rand_vec(nk, 1.0f, 1);
    float *dout = rand_vec(nq, 1.0f, 1);
    float *out_w = xmalloc(nq * sizeof(float)), *lse_w = xmalloc(nl * sizeof(float));
    float *dq_w = xmalloc(nq * sizeof(float)), *dk_w = xmalloc(nk * sizeof(float)), *dv_w = xmalloc(nk * sizeof(float));
    cpu->attention_forward(out_w, lse_w, NULL, q, k, v, doc, B, T, NH, NKV, HD, dropout, key);
    /* backward reads the forward's output (D = dout . out): in bf16 mode the GPU's is rounded to bf16, so
     * the CPU gets it rounded too (as with every other working-type input) */
    float *out_in = dup_vec(out_w, nq);
    if (bf16_mode)
        for (size_t i = 0; i < nq; i++) out_in[i] = round_bf16(out_in[i]);
    cpu->attention_backward(dq_w, dk_w, dv_w, dout, out_in, q, k, v, lse_w, NULL, doc, B, T, NH, NKV, HD, dropout, key);
    int32_t *ddoc = NULL;
    if (doc) {
        ddoc = gpu->alloc((size_t)B * T * sizeof(int32_t));
        gpu->copy_to_device(ddoc, doc, (size_t)B * T * sizeof(int32_t));
    }

    float *o[2], *l[2], *gq[2], *gk[2], *gv[2];
    void *dq_in = dev_work(q, nq), *dk_in = dev_work(k, nk), *dv_in = dev_work(v, nk), *ddout = dev_work(dout, nq);
    for (int rep = 0; rep < 2; rep++) {
        o[rep] = xmalloc(nq * sizeof(float));
        l[rep] = xmalloc(nl * sizeof(float));
        gq[rep] = xmalloc(nq * sizeof(float));
        gk[rep] = xmalloc(nk * sizeof(float));
        gv[rep] = xmalloc(nk * sizeof(float));
        void *out = gpu->alloc(nq * gpu->act_bytes), *dq = gpu->alloc(nq * gpu->act_bytes);
        void *dk = gpu->alloc(nk * gpu->act_bytes), *dv = gpu->alloc(nk * gpu->act_bytes);
        float *lse = gpu->alloc(nl * sizeof(float));
        if (attn_fwd_force) gt_cuda_attention_force_variant(attn_fwd_force);
        gpu->attention_forward(out, lse, NULL, dq_in, dk_in, dv_in, ddoc, B, T, NH, NKV, HD, dropout, key);
        if (attn_bwd_force) gt_cuda_attention_force_variant(attn_bwd_force);
        gpu->attention_backward(dq, dk, dv, ddout, out, dq_in, dk_in, dv_in, lse, NULL, ddoc, B, T, NH, NKV, HD, dropout, key);
        get_work(o[rep], out, nq);
        get_f32(l[rep], lse, nl);
        get_work(gq[rep], dq, nq);
        get_work(gk[rep], dk, nk);
        get_work(gv[rep], dv, nk);
        gpu->free(out), gpu->free(dq), gpu->free(dk), gpu->free(dv), gpu->free(lse);
    }
#define ATT_CHECK(label, got, want, n, t32, t16, repeat)                                                       \
    do {                                                                                                      \
        snprintf(name, sizeof name, "attention %s %s", label, tag);                                           \
        check_close(name, got[0], want, n, tol_of(t32, t16));                                                \
        if (n != nl) check_rows(name, got[0], want, n, (size_t)HD, 2.0 * tol_of(t32, t16));                  \
        if (repeat) check_same(name, got[0], got[1], n);                                                      \
    } while (0)
    ATT_CHECK("out", o, out_w, nq, 1e-4, 2e-2, 1);
    ATT_CHECK("lse", l, lse_w, nl, 1e-5, 1e-4, 1);
    /* The exact dq of position t = 0 is zero (one key: ds = p (dp - D) with p = 1 and D = dp), and at
     * T = 1 so is dk; there both backends hold the rounding noise of a cancelling sum, which cannot be
     * compared with each other: those values are bounded by the tolerance times the size of the
     * cancelling terms (|dp| |k| scale <= HD max|dout| max|v| max|k| / sqrt(HD)), and left out of the
     * per-row comparison (dq) or of every comparison (dk at T = 1). */
    double mx_dout = 0.0, mx_v = 0.0, mx_qk = 0.0;
    for (size_t i = 0; i < nq; i++) mx_dout = fmax(mx_dout, fabs(dout[i])), mx_qk = fmax(mx_qk, fabs(q[i]));
    for (size_t i = 0; i < nk; i++) mx_v = fmax(mx_v, fabs(v[i])), mx_qk = fmax(mx_qk, fabs(k[i]));
    const double zero_bound = tol_of(1e-4, 2e-2) * mx_dout * mx_v * mx_qk * sqrt((double)HD);
    snprintf(name, sizeof name, "attention dq at t=0 (exactly 0) %s", tag);
    check_zero(name, gq[0], nq, (size_t)NH * HD, (size_t)T * NH * HD, zero_bound);
    if (T > 1) {
        rows_skip_t0_T = T, rows_skip_t0_NH = NH, rows_skip_doc = doc;
        attn_in.q = q, attn_in.k = k, attn_in.v = v, attn_in.dout = dout, attn_in.T = T, attn_in.NH = NH;
        attn_in.NKV = NKV, attn_in.HD = HD, attn_in.dropout = dropout, attn_in.key = key;
        /* In bf16 mode each backend takes D from the output it was given: the CPU from its own output
         * rounded to bf16, the GPU from the GPU's forward output, and the two differ by a bf16 step here
         * and there. Where a row's dq cancels (dp - D small: early rows, dropout), that step moves dq by
         * far more than the tolerance (up to 0.24 of the row on the mma variant's T200 shape, found on
         * the CPU emulation, where the fp64 row with the GPU's D agreed with the GPU within 0.01); so
         * there a failing row is judged against the fp64 dq with D from the GPU's output, the GPU's exact
         * task. fp32 mode: exact D (the outputs agree to fp32 rounding). */
        attn_in.out = bf16_mode ? o[0] : NULL;
        rows_fp64 = doc ? NULL : attention_dq_fp64; /* the fp64 rows know no documents */
        ATT_CHECK("dq", gq, dq_w, nq, 1e-4, 2e-2, !attn_nondet_bwd);
        rows_skip_t0_T = 0, rows_fp64 = NULL, rows_skip_doc = NULL;
        rows_single_doc = doc, rows_single_T = T, rows_single_heads = NKV;
        ATT_CHECK("dk", gk, dk_w, nk, 1e-4, 2e-2, !attn_nondet_bwd);
        rows_single_doc = NULL;
    } else {
        snprintf(name, sizeof name, "attention dk (exactly 0 at T=1) %s", tag);
        check_zero(name, gk[0], nk, nk, nk, zero_bound);
        if (!attn_nondet_bwd) {
            check_same("attention dq repeat", gq[0], gq[1], nq);
            check_same("attention dk repeat", gk[0], gk[1], nk);
        }
    }
    ATT_CHECK("dv", gv, dv_w, nk, 1e-4, 2e-2, !attn_nondet_bwd);
#undef ATT_CHECK
    gpu->free(dq_in), gpu->free(dk_in), gpu->free(dv_in), gpu->free(ddout);
    if (ddoc) gpu->free(ddoc);
    for (int rep = 0; rep < 2; rep++) free(o[rep]), free(l[rep]), free(gq[rep]), free(gk[rep]), free(gv[rep]);
    free(q), free(k), free(v), free(dout), free(out_w), free(out_in), free(lse_w), free(dq_w), free(dk_w), free(dv_w);
}

static void test_attention(int B, int T, int NH, int NKV, int HD, float dropout) {
    test_attention_doc(B, T, NH, NKV, HD, dropout, NULL);
}

/* Document masking on the default kernels. T 130: documents [0, 40) [40, 100) [100, 130): forward and
 * dq tiles of the last rows start at key tile 3 (key 96), the dk/dv kernel's first key tiles stop
 * before the last query tiles; T 77, two sequences: one-token documents at 0..3, then [4, 77); and one
 * document. */
static void test_attention_documents(void) {
    static int32_t long_doc[130], short_doc[2 * 77];
    for (int t = 0; t < 130; t++) long_doc[t] = t < 40 ? 0 : t < 100 ? 40 : 100;
    for (int t = 0; t < 77; t++) short_doc[t] = t < 4 ? t : 4, short_doc[77 + t] = 0;
    test_attention_doc(1, 130, 2, 1, 64, 0.0f, long_doc);
    test_attention_doc(1, 130, 4, 2, 32, 0.2f, long_doc);
    test_attention_doc(2, 77, 4, 2, 64, 0.0f, short_doc);
}

static void test_swiglu(void) {
    const size_t n = 5003;
    float *g = rand_vec(n, 4.0f, 1), *u = rand_vec(n, 2.0f, 1), *dout = rand_vec(n, 1.0f, 1);
    float *want = xmalloc(n * sizeof(float)), *dg_w = xmalloc(n * sizeof(float)), *du_w = xmalloc(n * sizeof(float));
    cpu->swiglu_forward(want, g, u, n);
    cpu->swiglu_backward(dg_w, du_w, dout, g, u, n);
    float *got[2], *dg[2], *du[2];
    void *dgate = dev_work(g, n), *dup = dev_work(u, n), *ddout = dev_work(dout, n);
    for (int rep = 0; rep < 2; rep++) {
        got[rep] = xmalloc(n * sizeof(float));
        dg[rep] = xmalloc(n * sizeof(float));
        du[rep] = xmalloc(n * sizeof(float));
        void *out = gpu->alloc(n * gpu->act_bytes), *a = gpu->alloc(n * gpu->act_bytes), *b = gpu->alloc(n * gpu->act_bytes);
        gpu->swiglu_forward(out, dgate, dup, n);
        gpu->swiglu_backward(a, b, ddout, dgate, dup, n);
        get_work(got[rep], out, n);
        get_work(dg[rep], a, n);
        get_work(du[rep], b, n);
        gpu->free(out), gpu->free(a), gpu->free(b);
    }
    float *dg_alias = xmalloc(n * sizeof(float)), *du_alias = xmalloc(n * sizeof(float));
    void *da = dev_work(dout, n), *db = gpu->alloc(n * gpu->act_bytes);
    gpu->swiglu_backward(da, db, da, dgate, dup, n); /* dgate aliases dout, as model.c calls it */
    get_work(dg_alias, da, n);
    get_work(du_alias, db, n);
    gpu->free(da), gpu->free(db);
    check_same("swiglu_backward dgate == dout", dg_alias, dg[0], n);
    check_same("swiglu_backward dgate == dout (dup)", du_alias, du[0], n);
    free(dg_alias), free(du_alias);
    check_close("swiglu_forward", got[0], want, n, tol_of(1e-5, 1e-2));
    check_close("swiglu_backward dgate", dg[0], dg_w, n, tol_of(1e-5, 1e-2));
    check_close("swiglu_backward dup", du[0], du_w, n, tol_of(1e-5, 1e-2));
    check_same("swiglu_forward repeat", got[0], got[1], n);
    check_same("swiglu_backward dgate repeat", dg[0], dg[1], n);
    check_same("swiglu_backward dup repeat", du[0], du[1], n);
    gpu->free(dgate), gpu->free(dup), gpu->free(ddout);
    for (int rep = 0; rep < 2; rep++) free(got[rep]), free(dg[rep]), free(du[rep]);
    free(g), free(u), free(dout), free(want), free(dg_w), free(du_w);
}

static void test_residual_dropout(float dropout) {
    char name[96];
    const size_t n = 10007;
    const gt_rng_key key = {1234, 99};
    float *res = rand_vec(n, 1.0f, 1), *br = rand_vec(n, 1.0f, 1), *dout = rand_vec(n, 1.0f, 1);
    float *want = xmalloc(n * sizeof(float)), *dwant = xmalloc(n * sizeof(float));
    cpu->residual_forward(want, res, br, n, dropout, key);
    cpu->dropout_backward(dwant, dout, n, dropout, key);
    float *got[2], *dgot[2], *inplace = xmalloc(n * sizeof(float));
    void *dres = dev_work(res, n), *dbr = dev_work(br, n), *ddout = dev_work(dout, n);
    for (int rep = 0; rep < 2; rep++) {
        got[rep] = xmalloc(n * sizeof(float));
        dgot[rep] = xmalloc(n * sizeof(float));
        void *out = gpu->alloc(n * gpu->act_bytes), *db = gpu->alloc(n * gpu->act_bytes);
        gpu->residual_forward(out, dres, dbr, n, dropout, key);
        gpu->dropout_backward(db, ddout, n, dropout, key);
        get_work(got[rep], out, n);
        get_work(dgot[rep], db, n);
        gpu->free(out), gpu->free(db);
    }
    void *io = dev_work(res, n);
    gpu->residual_forward(io, io, dbr, n, dropout, key);
    get_work(inplace, io, n);
    gpu->free(io);
    float *inplace_br = xmalloc(n * sizeof(float)), *dinplace = xmalloc(n * sizeof(float));
    io = dev_work(br, n);
    gpu->residual_forward(io, dres, io, n, dropout, key); /* out aliases branch, as model.c calls it */
    get_work(inplace_br, io, n);
    gpu->free(io);
    io = dev_work(dout, n);
    gpu->dropout_backward(io, io, n, dropout, key);
    get_work(dinplace, io, n);
    gpu->free(io);
    /* a view one element in (n - 1 elements, odd): not 16-byte aligned, so the scalar kernel runs; the
     * RNG index counts from the view's start, on the CPU as on the GPU */
    const size_t ab = (size_t)gpu->act_bytes;
    float *dwant_u = xmalloc(n * sizeof(float)), *dgot_u = xmalloc(n * sizeof(float));
    cpu->dropout_backward(dwant_u, dout + 1, n - 1, dropout, key);
    void *du_out = gpu->alloc(n * ab);
    gpu->dropout_backward((char *)du_out + ab, (const char *)ddout + ab, n - 1, dropout, key);
    get_work(dgot_u, (const char *)du_out + ab, n - 1);
    gpu->free(du_out);
    snprintf(name, sizeof name, "dropout_backward p=%.2f unaligned", dropout);
    check_close(name, dgot_u, dwant_u, n - 1, tol_of(1e-6, 1e-2));
    free(dwant_u), free(dgot_u);
    snprintf(name, sizeof name, "residual_forward p=%.2f", dropout);
    check_close(name, got[0], want, n, tol_of(1e-6, 1e-2));
    check_same(name, got[0], got[1], n);
    check_same(name, inplace, got[0], n);
    check_same(name, inplace_br, got[0], n);
    snprintf(name, sizeof name, "dropout_backward p=%.2f", dropout);
    check_close(name, dgot[0], dwant, n, tol_of(1e-6, 1e-2));
    check_same(name, dgot[0], dgot[1], n);
    check_same(name, dinplace, dgot[0], n);
    free(inplace_br), free(dinplace);
    gpu->free(dres), gpu->free(dbr), gpu->free(ddout);
    for (int rep = 0; rep < 2; rep++) free(got[rep]), free(dgot[rep]);
    free(res), free(br), free(dout), free(want), free(dwant), free(inplace);
}

/* V a multiple of 8 takes the 16-byte kernels (fp32 and bf16), V = 1003 the single-logit ones */
static void test_crossentropy(int V) {
    const int BT = 13;
    const float dloss = 1.0f / BT;
    size_t n = (size_t)BT * V;
    float *logits = rand_vec(n, 8.0f, 1);
    int32_t targets[13];
    for (int i = 0; i < BT; i++) targets[i] = (int32_t)((frand() + 1.0f) * 0.5f * V) % V;
    targets[3] = -1;
    targets[9] = -1;
    float loss_w[13], lse_w[13], *dl_w = dup_vec(logits, n);
    cpu->crossentropy_forward(loss_w, lse_w, logits, targets, BT, V);
    cpu->crossentropy_backward(dl_w, lse_w, targets, BT, V, dloss);

    float loss[2][13], lse[2][13], *dl[2];
    int32_t *dtg = dev_i32(targets, BT);
    for (int rep = 0; rep < 2; rep++) {
        dl[rep] = xmalloc(n * sizeof(float));
        void *dlog = dev_work(logits, n);
        float *dloss_v = gpu->alloc(BT * sizeof(float)), *dlse = gpu->alloc(BT * sizeof(float));
        gpu->crossentropy_forward(dloss_v, dlse, dlog, dtg, BT, V);
        gpu->crossentropy_backward(dlog, dlse, dtg, BT, V, dloss);
        get_f32(loss[rep], dloss_v, BT);
        get_f32(lse[rep], dlse, BT);
        get_work(dl[rep], dlog, n);
        gpu->free(dlog), gpu->free(dloss_v), gpu->free(dlse);
    }
    char name[96];
    snprintf(name, sizeof name, "crossentropy_forward losses V=%d", V);
    check_close(name, loss[0], loss_w, BT, tol_of(1e-5, 1e-4));
    snprintf(name, sizeof name, "crossentropy_forward lse V=%d", V);
    check_close(name, lse[0], lse_w, BT, tol_of(1e-5, 1e-4));
    snprintf(name, sizeof name, "crossentropy_backward dlogits V=%d", V);
    check_close(name, dl[0], dl_w, n, tol_of(1e-5, 1e-2));
    snprintf(name, sizeof name, "crossentropy_forward losses repeat V=%d", V);
    check_same(name, loss[0], loss[1], BT);
    snprintf(name, sizeof name, "crossentropy_backward repeat V=%d", V);
    check_same(name, dl[0], dl[1], n);
    gpu->free(dtg);
    free(dl[0]), free(dl[1]), free(logits), free(dl_w);
}

static void test_vector_utilities(void) {
    const size_t n = 100003;
    float *x = rand_vec(n, 3.0f, 0);
    float *dx = dev_f32(x, n);
    double want = cpu->sumsq(x, n), got0 = gpu->sumsq(dx, n), got1 = gpu->sumsq(dx, n);
    checks++;
    if (!(fabs(got0 - want) <= 1e-12 * want) || memcmp(&got0, &got1, sizeof got0) != 0) {
        failures++;
        printf("FAIL %-5s sumsq %.17g vs cpu %.17g (repeat %.17g)\n", bf16_mode ? "bf16" : "fp32", got0, want, got1);
    } else {
        printf("ok   %-5s %-40s rel err %.3e (tol 1.0e-12)\n", bf16_mode ? "bf16" : "fp32", "sumsq",
               fabs(got0 - want) / want);
    }

    /* n is odd (the 16-byte path's scalar tail); one element in, the pointer is not 16-byte aligned
     * (the scalar kernel) */
    want = cpu->sumsq(x + 1, n - 1), got0 = gpu->sumsq(dx + 1, n - 1), got1 = gpu->sumsq(dx + 1, n - 1);
    checks++;
    if (!(fabs(got0 - want) <= 1e-12 * want) || memcmp(&got0, &got1, sizeof got0) != 0) {
        failures++;
        printf("FAIL %-5s sumsq unaligned %.17g vs cpu %.17g (repeat %.17g)\n", bf16_mode ? "bf16" : "fp32", got0,
               want, got1);
    } else {
        printf("ok   %-5s %-40s rel err %.3e (tol 1.0e-12)\n", bf16_mode ? "bf16" : "fp32", "sumsq unaligned",
               fabs(got0 - want) / want);
    }

    float *sc = dup_vec(x, n), *got = xmalloc(n * sizeof(float));
    cpu->scale(sc, n, 0.37f);
    gpu->scale(dx, n, 0.37f);
    get_f32(got, dx, n);
    check_close("scale", got, sc, n, 0.0);
    gpu->free(dx);
    memcpy(sc, x, n * sizeof(float));
    cpu->scale(sc + 1, n - 1, 0.37f);
    dx = dev_f32(x, n);
    gpu->scale(dx + 1, n - 1, 0.37f);
    get_f32(got, dx, n);
    check_close("scale unaligned", got, sc, n, 0.0);
    gpu->free(dx);

    /* three AdamW steps from random state */
    const size_t m = 10007;
    float *p = rand_vec(m, 1.0f, 0), *ea = rand_vec(m, 0.1f, 0), *eas = rand_vec(m, 0.01f, 0);
    float *g = rand_vec(m, 0.5f, 0);
    for (size_t i = 0; i < m; i++) eas[i] = fabsf(eas[i]);
    float *dp = dev_f32(p, m), *dea = dev_f32(ea, m), *deas = dev_f32(eas, m), *dg = dev_f32(g, m);
    for (int t = 1; t <= 3; t++) {
        cpu->adamw(p, ea, eas, g, m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        gpu->adamw(dp, dea, deas, dg, m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    }
    float *gp = xmalloc(m * sizeof(float)), *gea = xmalloc(m * sizeof(float)), *geas = xmalloc(m * sizeof(float));
    get_f32(gp, dp, m);
    get_f32(gea, dea, m);
    get_f32(geas, deas, m);
    check_close("adamw param", gp, p, m, 1e-6);
    check_close("adamw exp_avg", gea, ea, m, 1e-6);
    check_close("adamw exp_avg_sq", geas, eas, m, 1e-6);
    gpu->free(dp), gpu->free(dea), gpu->free(deas), gpu->free(dg);
    free(x), free(sc), free(got), free(p), free(ea), free(eas), free(g), free(gp), free(gea), free(geas);
}

/* Forces the mma attention variant, runs test_attention over shapes (the last one, the 7B shape, left
 * out when quick) and checks that the variant took every forward and backward call of head size 64
 * and 128 and none of the others (those the default kernels run, checked all the same). */
typedef struct attn_shape { int B, T, NH, NKV, HD; float p; } attn_shape;

static void attention_mma_takes_all(const attn_shape *cs, int n, int quick) {
    gt_cuda_attention_force_variant("mma");
    attn_variant = "mma ";
    const long c0 = gt_cuda_attention_mma_calls();
    long want = 0;
    for (int i = 0; i < n - (quick ? 1 : 0); i++) {
        test_attention(cs[i].B, cs[i].T, cs[i].NH, cs[i].NKV, cs[i].HD, cs[i].p);
        if (cs[i].HD == 64 || cs[i].HD == 128) want += 2 * 2; /* 2 repeats x (forward + backward) */
    }
    const long took = gt_cuda_attention_mma_calls() - c0;
    checks++;
    if (took != want) {
        failures++;
        printf("FAIL bf16  attention mma: the variant took %ld of %ld calls\n", took, want);
    }
    attn_variant = "";
}

int main(void) {
    char why[256] = "";
    /* GT_TEST_QUICK=1: leave out the large shapes (for compute-sanitizer, which runs kernels 10-100x
     * slower); GT_TEST_ONLY=attention: only the attention checks (for racecheck); GT_TEST_NO_CUDNN=1:
     * leave out the cudnn variant's checks (cuDNN's kernels are not gtrain's to sanitize) */
    const char *quick_env = getenv("GT_TEST_QUICK"), *only_env = getenv("GT_TEST_ONLY");
    const int quick = quick_env && atoi(quick_env) != 0;
    const int attention_only = only_env && strcmp(only_env, "attention") == 0;
    if (!gt_ops_cuda(0, GT_CUDA_ATTENTION_DEFAULT, why, sizeof why)) {
        printf("skipped: %s\n", why);
        return 77;
    }
    cpu = gt_ops_cpu();
    for (bf16_mode = 0; bf16_mode <= 1; bf16_mode++) {
        gpu = gt_ops_cuda(bf16_mode, GT_CUDA_ATTENTION_DEFAULT, why, sizeof why);
        if (gpu->act_bytes != (bf16_mode ? 2 : 4) || gpu->can_keep_attention_probs != 0) {
            printf("FAIL table: act_bytes %d, can_keep_attention_probs %d\n", gpu->act_bytes,
                   gpu->can_keep_attention_probs);
            failures++;
        }
        if (!attention_only) {
            test_allocator_reuses_blocks();
            test_conversions();
            test_embedding(61, 300, 333);
            if (!quick) test_embedding(37, 40, 5000); /* more tokens than one shared-memory chunk (2048) */
            test_embedding(50, 36, 7);    /* C not a multiple of the 16-byte vector: the element kernel */
            test_token_fault();
            test_rmsnorm(37, 300);
            test_rmsnorm(70, 2048);
            test_rmsnorm(9, 8192);
            test_matmul(37, 96, 80);
            if (!quick) test_matmul(256, 512, 384);
            test_matmul(5, 33, 7); /* odd sizes: unaligned rows */
            test_rope(2, 19, 3, 64);  /* 96 pairs per row of heads: one block of 96 threads */
            test_rope(1, 5, 9, 128);  /* 576 pairs: three blocks of 256, the last partly idle */
            test_rope(2, 7, 3, 20);   /* HD/2 = 10, not a multiple of the 16-byte vector: the single-pair kernel */
        }
        gt_cuda_attention_force_variant("default");
        test_attention(2, 77, 4, 2, 64, 0.0f);
        test_attention(2, 77, 4, 2, 64, 0.1f);
        test_attention(1, 130, 2, 1, 128, 0.0f);
        test_attention(1, 130, 4, 4, 128, 0.2f);
        test_attention(3, 33, 3, 3, 24, 0.0f);
        test_attention(1, 1, 2, 1, 16, 0.0f);
        test_attention_documents();
        if (bf16_mode && !quick) test_attention(1, 2048, 32, 32, 128, 0.0f); /* the 7B shape: T 2048, 32 heads of 128 */
        if (bf16_mode) {
            /* the opt-in bf16 tensor-core variant (train.cuda_attention = mma: cuda_attention_mma.cu, HD 64
             * and 128); each call is also run twice and compared bytewise, and it must take every call:
             * GQA (groups of 2 and 4: the dk/dv kernel sums a kv head's query heads), dropout, T not a
             * multiple of its tiles (several key and query tiles at T 200), one row, the 7B shape; and
             * HD 32, which it leaves to the default kernels. */
            static const attn_shape tc_shapes[] = {
                {2, 77, 4, 2, 64, 0.0f}, {2, 77, 4, 2, 64, 0.1f},  {1, 130, 2, 1, 128, 0.0f},
                {1, 130, 4, 4, 128, 0.2f}, {1, 200, 8, 2, 64, 0.1f}, {2, 50, 4, 1, 32, 0.0f},
                {1, 1, 2, 1, 128, 0.0f},
                {1, 2048, 32, 32, 128, 0.0f}, /* the 7B shape, last: left out when quick */
            };
            attention_mma_takes_all(tc_shapes, (int)(sizeof tc_shapes / sizeof tc_shapes[0]), quick);
            /* the opt-in cuDNN fused attention (train.cuda_attention = cudnn: cuda_attention_cudnn.cu), when
             * libcudnn loads: GQA, T not a multiple of 64 or 128, HD 24/32/64/128, and shapes that must
             * fall back to the default kernels (dropout, HD 20, T 1) */
            char cudnn_why[320];
            const char *no_cudnn = getenv("GT_TEST_NO_CUDNN"); /* run.sh's sanitizer runs: not gtrain's kernels */
            if (no_cudnn && atoi(no_cudnn) != 0) {
                printf("SKIP bf16  attention cudnn: GT_TEST_NO_CUDNN=%s\n", no_cudnn);
            } else if (!gt_cuda_attention_cudnn_version(cudnn_why, sizeof cudnn_why)) {
                printf("SKIP bf16  attention cudnn: %s\n", cudnn_why);
            } else {
                static const attn_shape cs[] = {
                    {2, 77, 4, 2, 64, 0.0f},  {2, 77, 4, 2, 64, 0.1f}, {1, 130, 2, 1, 128, 0.0f},
                    {1, 256, 8, 2, 64, 0.0f}, {2, 128, 4, 4, 128, 0.0f}, {2, 50, 4, 1, 32, 0.0f},
                    {3, 33, 3, 3, 24, 0.0f},  {2, 40, 2, 1, 20, 0.0f}, {1, 1, 2, 1, 128, 0.0f},
                    {1, 2048, 32, 32, 128, 0.0f}, /* the 7B shape, last: left out when quick */
                };
                const int ncs = (int)(sizeof cs / sizeof cs[0]) - (quick ? 1 : 0);
                gt_cuda_attention_force_variant("cudnn");
                attn_variant = "cudnn ";
                attn_nondet_bwd = 1;
                const long c0 = gt_cuda_attention_cudnn_calls();
                long cwant = 0;
                for (int i = 0; i < ncs; i++) {
                    const long before = gt_cuda_attention_cudnn_calls();
                    test_attention(cs[i].B, cs[i].T, cs[i].NH, cs[i].NKV, cs[i].HD, cs[i].p);
                    const long want = 2 * (gt_cuda_attention_cudnn_shape_ok(0, cs[i].T, cs[i].HD, cs[i].p) +
                                           gt_cuda_attention_cudnn_shape_ok(1, cs[i].T, cs[i].HD, cs[i].p));
                    cwant += want;
                    if (gt_cuda_attention_cudnn_calls() - before != want) /* the count check below fails */
                        printf("note bf16  attention cudnn B%d T%d NH%d NKV%d HD%d: cuDNN took %ld of %ld calls: %s\n",
                               cs[i].B, cs[i].T, cs[i].NH, cs[i].NKV, cs[i].HD,
                               gt_cuda_attention_cudnn_calls() - before, want, gt_cuda_attention_cudnn_last_fallback());
                }
                /* mixed pairings: the lse of one variant feeds the other's backward */
                attn_variant = "default-fwd+cudnn-bwd ";
                attn_fwd_force = "default", attn_bwd_force = "cudnn";
                test_attention(1, 256, 8, 2, 64, 0.0f);
                cwant += 2 * gt_cuda_attention_cudnn_shape_ok(1, 256, 64, 0.0f);
                attn_variant = "cudnn-fwd+default-bwd ";
                attn_fwd_force = "cudnn", attn_bwd_force = "default";
                attn_nondet_bwd = 0;
                test_attention(1, 256, 8, 2, 64, 0.0f);
                cwant += 2 * gt_cuda_attention_cudnn_shape_ok(0, 256, 64, 0.0f);
                attn_fwd_force = attn_bwd_force = NULL;
                const long ctook = gt_cuda_attention_cudnn_calls() - c0;
                checks++;
                if (ctook != cwant) {
                    failures++;
                    printf("FAIL bf16  attention cudnn (%ld): cuDNN took %ld of %ld calls (the notes say where)\n",
                           gt_cuda_attention_cudnn_version(NULL, 0), ctook, cwant);
                } else {
                    printf("ok   bf16  attention cudnn (%ld): cuDNN took %ld calls\n",
                           gt_cuda_attention_cudnn_version(NULL, 0), ctook);
                }
            }
            attn_variant = "";
        }
        gt_cuda_attention_force_variant(NULL);
        if (!attention_only) {
            test_swiglu();
            test_residual_dropout(0.0f);
            test_residual_dropout(0.1f);
            test_crossentropy(1003);
            test_crossentropy(32000); /* several 16-byte groups per thread: the running max is rescaled */
            test_vector_utilities();
        }
        gpu->synchronize();
    }
    printf("%d of %d checks failed\n", failures, checks);
    return failures ? 1 : 0;
}
