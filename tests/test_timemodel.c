/*
 * test_timemodel.c — the time model (src/core/timemodel.c, planner.c gt_plan_time) and the calibration
 * file (calib.c).
 *
 *   - a hand-built micro-batch trace (two ZeRO-3 gathers, a gradient reduce-scatter, three compute
 *     pieces) played twice on two ranks gives the step time worked out by hand, with prefetch 1 and 0;
 *   - the executor's dry schedule of the tiny model is priced at a matmul-only rate to the model's
 *     matmul FLOPs (forward and backward, 3 x), and recompute full costs more than none;
 *   - gradient buckets (ZeRO-1, hand-built and from the dry schedule), and the weights' gather in the
 *     next forward, shorten the step by what they overlap, moving the same bytes;
 *   - a calibration file round-trips, and one of another key is refused.
 */
#include "check.h"
#include "calib.h"
#include "config.h"
#include "planner.h"
#include "recompute.h"
#include "timemodel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(b) > 1 ? fabs(b) : 1); }

static gt_calib flat_calib(void) {
    gt_calib c;
    memset(&c, 0, sizeof c);
    c.matmul_flops_per_s = c.attn_fwd_flops_per_s = c.attn_bwd_flops_per_s = 1e12;
    c.mem_bytes_per_s = 1e9;
    c.optim_bytes_per_s = 2.8e9;
    c.coll_latency_s = 1e-3;
    c.coll_bytes_per_s = 1e9;
    c.measured = 1;
    return c;
}

/* One micro-batch: 1 ms, gather 2 MB, 3 ms, gather 4 MB, 1 ms, reduce-scatter 6 MB, 2 ms, its end. On
 * two ranks a collective of S bytes takes 1 ms + S/2 / 1 GB/s: the gathers 2 and 3 ms, the
 * reduce-scatter 4 ms. Prefetch 1, micro-batch 1: compute 0..1, both gathers issued at 1 (done at 3
 * and 6), compute 3..6, 6..7, the reduce-scatter 7..11, compute 7..9, the end waits to 11; micro-batch
 * 2: compute 11..12, gathers 12..14 and 14..17, compute 14..17, 17..18, reduce-scatter 18..22, compute
 * 18..20, end 22. The step: the norm's scalar all-reduce 1 ms; sum of squares 4 MB / 1 GB/s = 4 ms,
 * AdamW 28 MB / 2.8 GB/s = 10 ms, to working 6 MB / 1 GB/s = 6 ms: 22 + 21 = 43 ms. Prefetch 0: the
 * second gather starts when needed (6..9 in micro-batch 1), the end at 14, then 28; 49 ms. */
static void test_hand_schedule(void) {
    gt_time_trace tr;
    memset(&tr, 0, sizeof tr);
    gt_time_trace_push(&tr, GT_TEV_COMPUTE, 1e-3, 0);
    gt_time_trace_push(&tr, GT_TEV_GATHER, 0, 2e6);
    gt_time_trace_push(&tr, GT_TEV_COMPUTE, 3e-3, 0);
    gt_time_trace_push(&tr, GT_TEV_GATHER, 0, 4e6);
    gt_time_trace_push(&tr, GT_TEV_COMPUTE, 0.5e-3, 0);
    gt_time_trace_push(&tr, GT_TEV_COMPUTE, 0.5e-3, 0); /* merged with the one before */
    gt_time_trace_push(&tr, GT_TEV_GRAD_DONE, 0, 6e6);
    gt_time_trace_push(&tr, GT_TEV_COMPUTE, 2e-3, 0);
    gt_time_trace_push(&tr, GT_TEV_MICRO_END, 0, 0);
    CHECK(tr.n == 8, "consecutive compute events merge: %d events", tr.n);
    gt_calib c = flat_calib();
    gt_time_step st = {2, 3, 1, 2, 1, 2, 2000000, 1000000, 100, 0};
    gt_time_estimate t;
    gt_time_simulate(&tr, &st, &c, &t);
    CHECK(near(t.step_s, 43e-3), "prefetch 1: step %.6f s, by hand 0.043", t.step_s);
    CHECK(near(t.compute_s, 34e-3), "compute %.6f s, by hand 0.034", t.compute_s);
    CHECK(near(t.exposed_comm_s, 9e-3), "exposed %.6f s, by hand 0.009", t.exposed_comm_s);
    CHECK(near(t.comm_s, 19e-3), "comm %.6f s, by hand 0.019", t.comm_s);
    CHECK(near(t.optimizer_s, 20e-3), "optimizer %.6f s, by hand 0.020", t.optimizer_s);
    CHECK(near(t.tokens_per_s, 400 / 43e-3), "tokens/s %.3f", t.tokens_per_s);
    st.prefetch = 0;
    gt_time_simulate(&tr, &st, &c, &t);
    CHECK(near(t.step_s, 49e-3), "prefetch 0: step %.6f s, by hand 0.049", t.step_s);
    /* ZeRO-1 on the same ranks: the reduce-scatter of 8 MB fp32 (1 + 4 ms) and the all-gather of the
     * 4 MB bf16 working parameters (1 + 2 ms) after the micro-batches, which now record no collectives */
    gt_time_trace t1;
    memset(&t1, 0, sizeof t1);
    gt_time_trace_push(&t1, GT_TEV_COMPUTE, 6e-3, 0);
    gt_time_step s1 = {2, 1, 0, 2, 0, 2, 2000000, 1000000, 100, 0};
    gt_time_simulate(&t1, &s1, &c, &t);
    CHECK(near(t.step_s, 12e-3 + 5e-3 + 1e-3 + 3e-3 + 20e-3), "ZeRO-1: step %.6f s, by hand 0.041", t.step_s);
    s1.world = 1;
    gt_time_simulate(&t1, &s1, &c, &t);
    CHECK(near(t.step_s, 12e-3 + 20e-3) && t.comm_s == 0, "one rank: no collectives, step %.6f s", t.step_s);
    /* ZeRO-1 with gradient buckets of 4 MB: a micro-batch of compute 1 ms, a unit's 4 MB of gradients
     * done, 2 ms, another 4 MB done (the embedding's bucket, started at the end). Micro-batch 1 starts no
     * bucket (0..3 ms); in micro-batch 2 the first bucket's reduce-scatter (1 + 2 ms) runs 4..7 beside
     * the compute 4..6, the second 7..10, which the step waits for: 10 ms, then the scalar 1, the
     * all-gather 3 and the optimizer 20, and no reduce-scatter of its own: 34 ms. Unbucketed: 6 ms of
     * compute, then the 8 MB reduce-scatter 5 ms: 35 ms. */
    gt_time_trace t2;
    memset(&t2, 0, sizeof t2);
    gt_time_trace_push(&t2, GT_TEV_COMPUTE, 1e-3, 0);
    gt_time_trace_push(&t2, GT_TEV_GRAD_DONE, 0, 4e6);
    gt_time_trace_push(&t2, GT_TEV_COMPUTE, 2e-3, 0);
    gt_time_trace_push(&t2, GT_TEV_GRAD_DONE, 0, 4e6);
    gt_time_step s2 = {2, 1, 0, 2, 0, 2, 2000000, 1000000, 100, 0, 4e6};
    gt_time_simulate(&t2, &s2, &c, &t);
    CHECK(near(t.step_s, 34e-3), "ZeRO-1 with buckets: step %.6f s, by hand 0.034", t.step_s);
    CHECK(near(t.exposed_comm_s, 4e-3 + 4e-3), "ZeRO-1 with buckets: exposed %.6f s, by hand 0.008",
          t.exposed_comm_s);
    s2.bucket_bytes = 0;
    gt_time_simulate(&t2, &s2, &c, &t);
    CHECK(near(t.step_s, 35e-3), "ZeRO-1 without buckets: step %.6f s, by hand 0.035", t.step_s);
    gt_time_trace_free(&tr);
    gt_time_trace_free(&t1);
    gt_time_trace_free(&t2);
}

/* The tiny model's dry schedule at 1 TFLOP/s matmuls and free everything else: the matmul time is the
 * model's matmul FLOPs (planner.c's forward FLOPs less attention's two products per block), 3 x. */
static void test_dry_schedule(void) {
    gt_config cfg;
    gt_config_defaults(&cfg);
    gt_mem_shape sh = gt_plan_shape(&cfg, 0, 4, 1, 1);
    gt_calib c = flat_calib();
    c.attn_fwd_flops_per_s = c.attn_bwd_flops_per_s = c.mem_bytes_per_s = c.optim_bytes_per_s = 1e30;
    gt_plan plan;
    gt_policy none = {GT_POLICY_NONE, 0}, full = {GT_POLICY_FULL, 0};
    gt_mem_estimate est;
    gt_plan_for_policy(&plan, &none, &sh, &est);
    gt_time_estimate t;
    gt_plan_time(&sh, &plan, &c, &t);
    const gt_model_config *m = &cfg.model;
    double B = sh.micro_batch, T = sh.seq_len, HD = m->dim / m->n_heads;
    double attn = 2 * 2 * B * m->n_heads * T * (T + 1) / 2 * HD; /* QK^T and PV, per block */
    double matmul = est.forward_flops - m->n_layers * attn;
    CHECK(near(t.kind_s[GT_COST_MATMUL], 3 * matmul / 1e12), "matmul %.9f s, by hand %.9f s",
          t.kind_s[GT_COST_MATMUL], 3 * matmul / 1e12);
    CHECK(near(t.step_s, 3 * matmul / 1e12), "step %.9f s, by hand %.9f s", t.step_s, 3 * matmul / 1e12);
    CHECK(t.recompute_s == 0, "recompute none: %.9f s of recompute", t.recompute_s);
    gt_plan pf;
    gt_plan_from_policy(&pf, &full, m->n_layers); /* every block recomputed (no tail kept) */
    gt_time_estimate tf;
    gt_plan_time(&sh, &pf, &c, &tf);
    CHECK(tf.recompute_s > 0 && near(tf.step_s, t.step_s + tf.recompute_s),
          "recompute full: step %.9f s = none %.9f + recompute %.9f", tf.step_s, t.step_s, tf.recompute_s);

    /* ZeRO-1 on 2 ranks, collectives without latency: gradient buckets of about a block move the same
     * bytes as the one reduce-scatter (the same communication time) but start during the backward,
     * so the step is shorter */
    c.coll_latency_s = 0;
    cfg.dist.bucket_mb = 0;
    gt_mem_shape s2 = gt_plan_shape(&cfg, 0, 4, 1, 2);
    gt_time_estimate flat, bucketed;
    gt_plan_time(&s2, &plan, &c, &flat);
    cfg.dist.bucket_mb = 0.01;
    s2 = gt_plan_shape(&cfg, 0, 4, 1, 2);
    gt_plan_time(&s2, &plan, &c, &bucketed);
    CHECK(flat.comm_s > 0 && near(bucketed.comm_s, flat.comm_s), "buckets: communication %.9f s, one reduction %.9f s",
          bucketed.comm_s, flat.comm_s);
    CHECK(bucketed.step_s < flat.step_s && bucketed.exposed_comm_s < flat.exposed_comm_s,
          "buckets: step %.9f s (exposed %.9f) not below one reduction's %.9f s (exposed %.9f)", bucketed.step_s,
          bucketed.exposed_comm_s, flat.step_s, flat.exposed_comm_s);
    /* and the weights' gather waited for per unit in the next forward: the same bytes again, less exposed */
    cfg.dist.overlap_param_gather = 1;
    s2 = gt_plan_shape(&cfg, 0, 4, 1, 2);
    gt_time_estimate gathered;
    gt_plan_time(&s2, &plan, &c, &gathered);
    CHECK(near(gathered.comm_s, flat.comm_s), "gather in the forward: communication %.9f s, one gather %.9f s",
          gathered.comm_s, flat.comm_s);
    CHECK(gathered.step_s < bucketed.step_s, "gather in the forward: step %.9f s not below %.9f s", gathered.step_s,
          bucketed.step_s);
}

static void test_file(void) {
    char dir[] = "/tmp/test_timemodel.XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256], err[1024];
    snprintf(path, sizeof path, "%s/sub/cal.json", dir);
    gt_calib key, c, back;
    gt_calib_key(&key, 0, 0);
    c = key;
    gt_calib_defaults(&c, 0, 0);
    c.measured = 1;
    c.n_gemm = 1;
    c.gemm[0] = (gt_calib_gemm){1024, 128, 352, 3e9, 2e9};
    c.attn_bwd_flops_per_s = 7e9;
    CHECK(gt_calib_save(path, &c, err, sizeof err) == 0, "save: %s", err);
    CHECK(gt_calib_load(path, &key, &back, err, sizeof err) == 0, "load: %s", err);
    CHECK(back.measured && back.n_gemm == 1 && back.gemm[0].oc == 352 && back.attn_bwd_flops_per_s == 7e9,
          "round trip");
    CHECK(gt_calib_gemm_rate(&back, 512, 128, 352, 1) == 2e9, "the measured shape's backward rate");
    CHECK(gt_calib_gemm_rate(&back, 512, 128, 128, 0) == back.matmul_flops_per_s, "another shape: the median");
    gt_calib other = key;
    other.threads = key.threads + 1;
    CHECK(gt_calib_load(path, &other, &back, err, sizeof err) == -1 && strstr(err, "threads"),
          "another key is refused: %s", err);
    char none[300];
    snprintf(none, sizeof none, "%s/none.json", dir);
    CHECK(gt_calib_load(none, &key, &back, err, sizeof err) == 1, "no file");
    unlink(path);
    snprintf(none, sizeof none, "%s/sub", dir);
    rmdir(none);
    rmdir(dir);
}

int main(void) {
    test_hand_schedule();
    test_dry_schedule();
    test_file();
    if (check_failures) fprintf(stderr, "%d failure(s)\n", check_failures);
    else printf("test_timemodel: ok\n");
    return check_failures ? 1 : 0;
}
