/*
 * test_timemodel.c — the time model (src/core/timemodel.c, planner.c gt_plan_time) and the calibration
 * file (calib.c).
 *
 *   - a hand-built micro-batch trace (two ZeRO-3 gathers, a gradient reduce-scatter, three compute
 *     pieces) played twice on two ranks gives the step time worked out by hand, with prefetch 1 and 0;
 *   - the executor's dry schedule of the tiny model is priced at a matmul-only rate to the model's
 *     matmul FLOPs (forward and backward, 3 x), and recompute full costs more than none;
 *   - the picture of the step (gt_time_set_span_listener, what `gtrain --plan --trace` writes): the
 *     hand-built schedule's spans at the hand-computed times, the step's span equal to the step time,
 *     no two spans of one stream overlapping; on the tiny model's dry schedule one op span per op call
 *     of a dry micro-batch, per micro-batch;
 *   - gradient buckets (ZeRO-1, hand-built and from the dry schedule), and the weights' gather in the
 *     next forward, shorten the step by what they overlap, moving the same bytes;
 *   - a calibration file round-trips, and one of another key is refused;
 *   - the calibration of the run's ranks per node: a run of 2 ranks per node reads the 2-rank file
 *     (its own name), one of 1 the 1-rank file; without its own, the file of the nearest count (on a
 *     tie the larger), and the note says so; a named file of another count is used with the note; no
 *     file of that key at all: the defaults;
 *   - the memory-bound kernels, the step's sum of squares and conversion, and attention are priced
 *     from their own measured sizes (between two, beyond the largest, below the smallest: by hand), an op not
 *     measured at the residual add's bandwidth, and a file without them loads (the older format); a
 *     second calibration keeps the sizes of the first that it did not measure;
 *   - auto (gt_plan_auto_all) ranks by the time model: with collectives of a second each on two
 *     ranks, the fewest collectives win (ZeRO-0, one micro-batch of 4), and the pick is the fastest of
 *     every option priced one by one; a budget that rules that out changes the pick to the fastest of
 *     what fits;
 *   - dist.prefetch = auto takes the depth of the fastest ZeRO-3 step, priced one by one;
 *   - dist.bucket_mb = auto: buckets hurt (latency-bound) and help (compute to hide) by hand; the
 *     sizes tried; the pick is the fastest size priced one by one, 0 at a second per collective and
 *     under grad_sync micro; the key reads and writes auto;
 *   - on 16 blocks with recompute auto (a coarse pass, then its five fastest in full), the pick is at
 *     least as fast as the fastest of every (stage, micro-batch) searched in full one by one;
 *   - the recompute search, bounded by FLOPs, picks what trying every plan of its family picks (the
 *     least recompute FLOPs that fit, then the least memory, then the first), over a sweep of budgets;
 *   - auto's recompute plan is the fastest that fits, not the least FLOPs: under rates where a
 *     selective block costs about a recomputed one, and where it costs nothing, auto's pick is as fast
 *     as the fastest plan of the family priced one by one, over a sweep of budgets where the
 *     least-FLOPs plan is at times slower;
 *   - train.global_batch sets grad_accum at the world size, micro_batch = auto takes a divisor, and
 *     the inconsistent cases are one line naming the file, line and key;
 *   - the calibration runs every GEMM of its list once, forward and backward, before it times any
 *     (on a table that records the calls), as a step has run them all before each of its own;
 *   - the in-step factor's micro-batch has every block of a small model, the most that fit the cap of
 *     a larger one (at least 2).
 */
#include "check.h"
#include "calib.h"
#include "calibrate.h"
#include "config.h"
#include "planner.h"
#include "recompute.h"
#include "model.h"
#include "ops_dry.h"
#include "timemodel.h"

#include <jansson.h>
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
    /* The same buckets beside compute that loses 1 ms per MB they move (calib.h, overlap_*): the first
     * bucket (2 MB moved) still runs 4..7, the compute then loses 2 ms (4..6 becomes 6..8), the second
     * bucket runs 8..11 and the compute ends at 10: the step waits to 11, then 24 ms: 35 ms, 4 ms more
     * of compute. At half the bandwidth beside compute as well, the buckets take 5 ms: 4..9, 9..14, the
     * step 38 ms; the step's own collectives (the scalar, the all-gather) keep the rate alone. */
    c.overlap_compute_s_per_byte = 1e-9;
    gt_time_simulate(&t2, &s2, &c, &t);
    CHECK(near(t.step_s, 35e-3), "buckets beside compute that loses 1 ms per MB: step %.6f s, by hand 0.035", t.step_s);
    CHECK(near(t.compute_s, 6e-3 + 4e-3 + 20e-3), "the compute lost 4 ms: %.6f s, by hand 0.030", t.compute_s);
    c.overlap_bytes_per_s = 0.5e9;
    gt_time_simulate(&t2, &s2, &c, &t);
    CHECK(near(t.step_s, 38e-3), "and at half the bandwidth beside compute: step %.6f s, by hand 0.038", t.step_s);
    c.overlap_compute_s_per_byte = 0, c.overlap_bytes_per_s = 0;
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

/* This machine's CPU fp32 key, and a calibration of it with the defaults' rates marked measured. */
static void measured_calib(gt_calib *key, gt_calib *c) {
    gt_calib_key(key, 0, 0);
    *c = *key;
    gt_calib_defaults(c, 0, 0);
    c->measured = 1;
}

static void test_file(void) {
    char dir[] = "/tmp/test_timemodel.XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256], err[1024];
    snprintf(path, sizeof path, "%s/sub/cal.json", dir);
    gt_calib key, c, back;
    measured_calib(&key, &c);
    c.n_gemm = 1;
    c.gemm[0] = (gt_calib_gemm){1024, 128, 352, 3e9, 2e9};
    c.attn_bwd_flops_per_s = 7e9;
    c.overlap_bytes_per_s = 2e9, c.overlap_compute_s_per_byte = 3e-10;
    CHECK(gt_calib_save(path, &c, err, sizeof err) == 0, "save: %s", err);
    CHECK(gt_calib_load(path, &key, &back, err, sizeof err) == 0, "load: %s", err);
    CHECK(back.measured && back.n_gemm == 1 && back.gemm[0].oc == 352 && back.attn_bwd_flops_per_s == 7e9,
          "round trip");
    CHECK(back.overlap_bytes_per_s == 2e9 && back.overlap_compute_s_per_byte == 3e-10,
          "the collectives beside compute round-trip: %g B/s, %g s/B", back.overlap_bytes_per_s,
          back.overlap_compute_s_per_byte);
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

/* The collectives per link kind (calib.c gt_calib_select_links), by hand: a calibration with, within a
 * node, 10 us and 8 GB/s, between nodes 40 us and 1 GB/s, and 4 GB/s beside compute measured within a
 * node. A run of 2 ranks on one node prices within a node; one of 4 ranks, 2 per node, between nodes,
 * its bandwidth beside compute scaled to 4 x 1 / 8 = 0.5 GB/s, and a 16 MB reduce-scatter takes
 * 40 us + 12 MB / 1 GB/s. Without the between-nodes pair: the defaults' 50 us and 1.25 GB/s, said so.
 * One rank: nothing set. The pairs round-trip through the file; a file of an older gtrain (none)
 * prices its one pair for both kinds. */
static void test_links(void) {
    gt_calib key, c, r;
    measured_calib(&key, &c);
    c.node_latency_s = 10e-6, c.node_bytes_per_s = 8e9;
    c.net_latency_s = 40e-6, c.net_bytes_per_s = 1e9;
    c.coll_latency_s = 40e-6, c.coll_bytes_per_s = 1e9;
    c.overlap_bytes_per_s = 4e9, c.overlap_between_nodes = 0;
    char note[512];
    r = c;
    snprintf(note, sizeof note, "calibrated: f");
    gt_calib_select_links(&r, 0, 2, 2, note, sizeof note);
    CHECK(r.coll_latency_s == 10e-6 && r.coll_bytes_per_s == 8e9 && r.overlap_bytes_per_s == 4e9,
          "one node: %g s, %g B/s, beside compute %g B/s", r.coll_latency_s, r.coll_bytes_per_s, r.overlap_bytes_per_s);
    CHECK(strcmp(note, "calibrated: f; collectives within a node: calibrated") == 0, "one node's note: %s", note);
    r = c;
    snprintf(note, sizeof note, "calibrated: f");
    gt_calib_select_links(&r, 0, 4, 2, note, sizeof note);
    CHECK(r.coll_latency_s == 40e-6 && r.coll_bytes_per_s == 1e9 && near(r.overlap_bytes_per_s, 0.5e9),
          "two nodes: %g s, %g B/s, beside compute %g B/s", r.coll_latency_s, r.coll_bytes_per_s, r.overlap_bytes_per_s);
    CHECK(strcmp(note, "calibrated: f; collectives between nodes (2 ranks per node): calibrated (beside compute: "
                       "scaled from within a node)") == 0,
          "two nodes' note: %s", note);
    CHECK(near(gt_time_collective(&r, 4, 'r', 16e6), 40e-6 + 12e6 / 1e9), "two nodes' reduce-scatter: %g s",
          gt_time_collective(&r, 4, 'r', 16e6));
    r = c;
    r.net_latency_s = r.net_bytes_per_s = 0;
    snprintf(note, sizeof note, "calibrated: f");
    gt_calib_select_links(&r, 0, 4, 1, note, sizeof note);
    CHECK(r.coll_latency_s == 50e-6 && r.coll_bytes_per_s == 1.25e9 && near(r.overlap_bytes_per_s, 4e9 * 1.25 / 8),
          "between nodes not measured: %g s, %g B/s, beside compute %g B/s", r.coll_latency_s, r.coll_bytes_per_s,
          r.overlap_bytes_per_s);
    CHECK(strstr(note, "; collectives between nodes (1 rank per node): not calibrated, the defaults' 50 us and 1.25 GB/s"),
          "not measured, not said: %s", note);
    r = c;
    gt_calib_select_links(&r, 0, 1, 1, NULL, 0);
    CHECK(r.coll_latency_s == 40e-6 && r.coll_bytes_per_s == 1e9, "one rank: set");

    char dir[] = "/tmp/test_timemodel_links.XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256], err[1024];
    snprintf(path, sizeof path, "%s/cal.json", dir);
    c.overlap_between_nodes = 1;
    CHECK(gt_calib_save(path, &c, err, sizeof err) == 0, "save: %s", err);
    CHECK(gt_calib_load(path, &key, &r, err, sizeof err) == 0, "load: %s", err);
    CHECK(r.node_latency_s == 10e-6 && r.node_bytes_per_s == 8e9 && r.net_latency_s == 40e-6 &&
              r.net_bytes_per_s == 1e9 && r.overlap_between_nodes == 1,
          "the link kinds round-trip");
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr), *rates = json_object_get(root, "rates");
    const char *keys[] = {"within_node_latency_s", "within_node_bytes_per_s", "between_nodes_latency_s",
                          "between_nodes_bytes_per_s", "overlap_between_nodes"};
    for (int i = 0; i < 5; i++) CHECK(json_object_del(rates, keys[i]) == 0, "no key %s in the file", keys[i]);
    CHECK(json_dump_file(root, path, 0) == 0, "rewrite");
    json_decref(root);
    CHECK(gt_calib_load(path, &key, &r, err, sizeof err) == 0, "load the older file: %s", err);
    CHECK(r.node_latency_s == 40e-6 && r.net_latency_s == 40e-6 && r.node_bytes_per_s == 1e9 && r.net_bytes_per_s == 1e9,
          "an older file: its one pair for both kinds");
    unlink(path);
    rmdir(dir);
}

/* The memory-bound kernels priced from their own measured sizes (calib.c gt_calib_kernel_seconds),
 * by hand: rmsnorm_forward measured at 1000 B 10 us, 3000 B 20 us, 9000 B 80 us. 2000 B: halfway
 * between the first two, 15 us; 3000 B: 20 us; 18000 B: beyond the largest, 80 us x 2 = 160 us;
 * 500 B: the line through the two smallest (0.005 us per byte) gives 7.5 us (above 10 us x 0.5 = 5);
 * 0 B: 5 us, the fixed cost the line leaves. sumsq measured at one size, 4000 B 2 us: 8000 B 4 us,
 * 1000 B 0.5 us. rope_forward not measured: its bytes at the residual add's 1 GB/s, 1000 B 1 us.
 * Attention the same way by its FLOPs (below).
 * The step's own kernels too: ZeRO-1 on one rank, 12 ms of micro-batches, slice 1e6 elements of
 * 2-byte working parameters: the sum of squares' 4 MB scaled from sumsq's 4000 B, 2 ms (not 4 MB /
 * 1 GB/s = 4 ms), AdamW 10 ms, to_working's 6 MB at 1 GB/s 6 ms: 30 ms; with sumsq measured at 4 MB
 * 1 ms and to_working at 6 MB 2 ms: 12 + 1 + 10 + 2 = 25 ms. A file without the kernels (as
 * written before they were measured) loads with none, and a file's kernels round-trip. */
static double mem_op(const gt_calib *c, const char *op, double bytes) {
    gt_op_cost k = {op, GT_COST_MEMORY, 0, 0, bytes, 0, 0, 0};
    return gt_time_op_seconds_at(c, &k, c->in_step_factor);
}
/* Saves c, its key's ranks per node set to rpn and its matmul rate to `rate`, into the keyed file */
static void save_ranks(const gt_calib *c, int rpn, double rate, char *path, size_t len) {
    gt_calib f = *c;
    char err[1024];
    f.ranks_per_node = rpn;
    f.matmul_flops_per_s = rate;
    CHECK(gt_calib_path(&f, path, len) == 0, "the path of %d ranks per node", rpn);
    CHECK(gt_calib_save(path, &f, err, sizeof err) == 0, "save: %s", err);
}

static void test_ranks_per_node(void) {
    char dir[] = "/tmp/test_timemodel.XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    setenv("XDG_CACHE_HOME", dir, 1);
    unsetenv("GTRAIN_CALIBRATION");
    gt_calib key, c, got;
    measured_calib(&key, &c);
    c.threads = key.threads = 3; /* the run's threads, given to gt_calib_for_run */
    char p1[4096], p2[4096], p3[4096], note[8192], err[1024];
    save_ranks(&c, 1, 1e9, p1, sizeof p1);
    save_ranks(&c, 2, 2e9, p2, sizeof p2);
    CHECK(strcmp(p1, p2) != 0 && strstr(p1, "-t3-r1.json") && strstr(p2, "-t3-r2.json"),
          "one file per count of ranks per node: %s, %s", p1, p2);
    key.ranks_per_node = 2;
    CHECK(gt_calib_load(p1, &key, &got, err, sizeof err) == -1 && strstr(err, "ranks per node"),
          "a 1-rank file refused for a key of 2 ranks per node: %s", err);
    /* each count reads its own file, and says nothing more */
    gt_calib_for_run(&got, 0, 0, 3, 2, NULL, note, sizeof note);
    CHECK(got.matmul_flops_per_s == 2e9 && got.ranks_per_node == 2 && strstr(note, p2) &&
              !strstr(note, "calibrated with"),
          "2 ranks per node: the 2-rank file (%.3g FLOP/s): %s", got.matmul_flops_per_s, note);
    gt_calib_for_run(&got, 0, 0, 3, 1, NULL, note, sizeof note);
    CHECK(got.matmul_flops_per_s == 1e9 && strstr(note, p1) && !strstr(note, "calibrated with"),
          "1 rank per node: the 1-rank file (%.3g FLOP/s): %s", got.matmul_flops_per_s, note);
    /* without the 2-rank file: the 1-rank file, said */
    unlink(p2);
    gt_calib_for_run(&got, 0, 0, 3, 2, NULL, note, sizeof note);
    CHECK(got.measured && got.matmul_flops_per_s == 1e9 && strstr(note, p1) &&
              strstr(note, "; calibrated with 1 rank per node; this run has 2: compute rates may be optimistic"),
          "no 2-rank file: the nearest, said (%.3g FLOP/s): %s", got.matmul_flops_per_s, note);
    /* 1 and 3 are as near to 2: the larger; 4 is nearer to 3 than 1 */
    save_ranks(&c, 3, 3e9, p3, sizeof p3);
    gt_calib_for_run(&got, 0, 0, 3, 2, NULL, note, sizeof note);
    CHECK(got.matmul_flops_per_s == 3e9 && strstr(note, p3) &&
              strstr(note, "calibrated with 3 ranks per node; this run has 2: compute rates may be pessimistic"),
          "1 and 3 ranks per node for a run of 2: the 3-rank file (%.3g FLOP/s): %s", got.matmul_flops_per_s, note);
    char p4[4096];
    save_ranks(&c, 4, 4e9, p4, sizeof p4);
    unlink(p3);
    gt_calib_for_run(&got, 0, 0, 3, 3, NULL, note, sizeof note);
    CHECK(got.matmul_flops_per_s == 4e9 && strstr(note, "calibrated with 4 ranks per node; this run has 3"),
          "1 and 4 for a run of 3: the 4-rank file (%.3g FLOP/s): %s", got.matmul_flops_per_s, note);
    /* a file named by the user, of another count: used, said */
    gt_calib_for_run(&got, 0, 0, 3, 2, p4, note, sizeof note);
    CHECK(got.matmul_flops_per_s == 4e9 && strstr(note, "calibrated with 4 ranks per node; this run has 2"),
          "a named 4-rank file for a run of 2: used, said: %s", note);
    /* another thread count: no file of that key, the defaults */
    gt_calib_for_run(&got, 0, 0, 5, 2, NULL, note, sizeof note);
    CHECK(!got.measured && strstr(note, "no calibration file") && strstr(note, "-t5-r2.json"),
          "no file of that key: the defaults: %s", note);
    unlink(p1);
    unlink(p4);
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/gtrain", dir);
    rmdir(sub);
    rmdir(dir);
    unsetenv("XDG_CACHE_HOME");
}

static void test_memory_kernels(void) {
    gt_calib c = flat_calib();
    const gt_calib_kernel ks[] = {{"rmsnorm_forward", 3000, 20e-6}, {"sumsq", 4000, 2e-6},
                                  {"rmsnorm_forward", 9000, 80e-6}, {"rmsnorm_forward", 1000, 10e-6}};
    c.n_kernel = 4;
    memcpy(c.kernel, ks, sizeof ks);
    const struct { const char *op; double bytes, us; } want[] = {
        {"rmsnorm_forward", 2000, 15}, {"rmsnorm_forward", 3000, 20}, {"rmsnorm_forward", 18000, 160},
        {"rmsnorm_forward", 500, 7.5}, {"rmsnorm_forward", 0, 5},     {"sumsq", 8000, 4},
        {"sumsq", 1000, 0.5},          {"rope_forward", 1000, 1}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        double us = mem_op(&c, want[i].op, want[i].bytes) * 1e6;
        CHECK(near(us, want[i].us), "%s of %.0f B: %.6f us, by hand %.1f", want[i].op, want[i].bytes, us, want[i].us);
    }
    CHECK(gt_calib_kernel_seconds(&c, "rope_forward", 1000) == -1, "an op not measured: -1");
    /* attention by its FLOPs: forward measured at 1 MFLOP 100 us and 4 MFLOP 250 us, so 2 MFLOP is
     * 100 + 150 / 3 = 150 us; the backward not measured: 2 MFLOP at the single 1 TFLOP/s, 2 us */
    gt_calib a = flat_calib();
    a.n_kernel = 2;
    a.kernel[0] = (gt_calib_kernel){"attention_forward", 4e6, 250e-6};
    a.kernel[1] = (gt_calib_kernel){"attention_forward", 1e6, 100e-6};
    gt_op_cost af = {"attention_forward", GT_COST_ATTENTION, 0, 2e6, 0, 0, 0, 0},
               ab = {"attention_backward", GT_COST_ATTENTION, 1, 2e6, 0, 0, 0, 0};
    CHECK(near(gt_time_op_seconds_at(&a, &af, a.in_step_factor) * 1e6, 150), "attention forward of 2 MFLOP: %.6f us, by hand 150",
          gt_time_op_seconds_at(&a, &af, a.in_step_factor) * 1e6);
    CHECK(near(gt_time_op_seconds_at(&a, &ab, a.in_step_factor) * 1e6, 2), "attention backward of 2 MFLOP: %.6f us, by hand 2",
          gt_time_op_seconds_at(&a, &ab, a.in_step_factor) * 1e6);
    gt_time_trace t1;
    memset(&t1, 0, sizeof t1);
    gt_time_trace_push(&t1, GT_TEV_COMPUTE, 12e-3, 0);
    gt_time_step s1 = {1, 1, 0, 1, 0, 2, 1000000, 1000000, 100, 0};
    gt_time_estimate t;
    gt_time_simulate(&t1, &s1, &c, &t);
    CHECK(near(t.step_s, 30e-3), "sumsq from its 4000 B: step %.6f s, by hand 0.030", t.step_s);
    c.kernel[c.n_kernel++] = (gt_calib_kernel){"sumsq", 4e6, 1e-3};
    c.kernel[c.n_kernel++] = (gt_calib_kernel){"to_working", 6e6, 2e-3};
    gt_time_simulate(&t1, &s1, &c, &t);
    CHECK(near(t.step_s, 25e-3) && near(t.optimizer_s, 13e-3), "step kernels measured: step %.6f s (optimizer %.6f), "
          "by hand 0.025 (0.013)", t.step_s, t.optimizer_s);
    gt_time_trace_free(&t1);

    char dir[] = "/tmp/test_timemodel_k.XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256], err[1024];
    snprintf(path, sizeof path, "%s/cal.json", dir);
    gt_calib key, f, back;
    measured_calib(&key, &f);
    f.n_kernel = 2;
    f.kernel[0] = (gt_calib_kernel){"swiglu_forward", 12288, 3.5e-6};
    f.kernel[1] = (gt_calib_kernel){"swiglu_forward", 49152, 9e-6};
    CHECK(gt_calib_save(path, &f, err, sizeof err) == 0, "save: %s", err);
    CHECK(gt_calib_load(path, &key, &back, err, sizeof err) == 0 && back.n_kernel == 2 &&
              strcmp(back.kernel[1].op, "swiglu_forward") == 0 && back.kernel[1].amount == 49152 &&
              back.kernel[1].seconds == 9e-6,
          "kernels round trip: %d (%s)", back.n_kernel, err);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECK(root && json_object_del(json_object_get(root, "rates"), "kernels") == 0 &&
              json_dump_file(root, path, 0) == 0, "rewrite without kernels");
    json_decref(root);
    CHECK(gt_calib_load(path, &key, &back, err, sizeof err) == 0 && back.n_kernel == 0, "a file without kernels: %s",
          err);
    CHECK(near(mem_op(&back, "swiglu_forward", 2 * back.mem_bytes_per_s), 2), "... prices at the residual add's rate");
    /* a second model's calibration keeps the first one's sizes it did not measure: swiglu_forward at
     * 12288 B again (now 4 us) and at 98304 B; the earlier 49152 B entry stays, the earlier 12288 B
     * one is replaced */
    gt_calib now = f;
    now.n_kernel = 2;
    now.kernel[0] = (gt_calib_kernel){"swiglu_forward", 12288, 4e-6};
    now.kernel[1] = (gt_calib_kernel){"swiglu_forward", 98304, 16e-6};
    gt_calib_merge_previous(&now, &f);
    CHECK(now.n_kernel == 3 && now.kernel[2].amount == 49152 && now.kernel[0].seconds == 4e-6,
          "merge: %d entries, the third %.0f B", now.n_kernel, now.n_kernel > 2 ? now.kernel[2].amount : 0);
    CHECK(near(mem_op(&now, "swiglu_forward", 12288 * 2.5) * 1e6, 4 + (9 - 4) * 0.5),
          "merged: 30720 B between the new 12288 B and the kept 49152 B: %.6f us, by hand 6.5",
          mem_op(&now, "swiglu_forward", 12288 * 2.5) * 1e6);
    unlink(path);
    rmdir(dir);
}

/* The spans a listener hears, kept. */
enum { MAX_SPANS = 4096 };
static gt_time_span spans[MAX_SPANS];
static char span_names[MAX_SPANS][48];
static int n_spans;
static void keep_span(void *ctx, const gt_time_span *s) {
    (void)ctx;
    if (n_spans == MAX_SPANS) return;
    spans[n_spans] = *s;
    snprintf(span_names[n_spans], sizeof span_names[0], "%s", s->name);
    spans[n_spans].name = span_names[n_spans];
    n_spans++;
}
static int find_span(const char *name, int stream, int micro, double start_ms, double end_ms) {
    for (int i = 0; i < n_spans; i++)
        if (strcmp(spans[i].name, name) == 0 && spans[i].stream == stream && spans[i].micro == micro &&
            near(spans[i].start_s, start_ms * 1e-3) && near(spans[i].end_s, end_ms * 1e-3))
            return 1;
    return 0;
}
/* No two op, wait or collective spans of one stream overlap (micro_batch and step hold others). */
static int overlaps(void) {
    int bad = 0;
    for (int i = 0; i < n_spans; i++)
        for (int j = i + 1; j < n_spans; j++) {
            const gt_time_span *a = &spans[i], *b = &spans[j];
            if (a->stream != b->stream || !strcmp(a->cat, "micro_batch") || !strcmp(a->cat, "step") ||
                !strcmp(b->cat, "micro_batch") || !strcmp(b->cat, "step"))
                continue;
            if (a->start_s < b->end_s - 1e-12 && b->start_s < a->end_s - 1e-12) {
                if (!bad) fprintf(stderr, "overlap: %s [%g, %g] and %s [%g, %g]\n", a->name, a->start_s, a->end_s,
                                  b->name, b->start_s, b->end_s);
                bad++;
            }
        }
    return bad;
}
static int count_spans(const char *cat, int micro) {
    int n = 0;
    for (int i = 0; i < n_spans; i++) n += !strcmp(spans[i].cat, cat) && spans[i].micro == micro;
    return n;
}

/* The hand schedule of test_hand_schedule (prefetch 1), heard span by span. */
static void test_hand_spans(void) {
    n_spans = 0;
    gt_time_set_span_listener(keep_span, NULL);
    gt_time_trace tr;
    memset(&tr, 0, sizeof tr);
    gt_op_cost k = {"matmul_forward", GT_COST_MATMUL, 0, 2e9, 0, 1, 1, 1};
    gt_time_trace_push_op(&tr, &k, 1e-3);
    gt_time_trace_push(&tr, GT_TEV_GATHER, 0, 2e6);
    gt_time_trace_push_op(&tr, &k, 3e-3);
    gt_time_trace_push(&tr, GT_TEV_GATHER, 0, 4e6);
    gt_time_trace_push_op(&tr, &k, 0.5e-3);
    gt_time_trace_push_op(&tr, &k, 0.5e-3); /* listened to: not merged */
    gt_time_trace_push(&tr, GT_TEV_GRAD_DONE, 0, 6e6);
    gt_time_trace_push_op(&tr, &k, 2e-3);
    gt_time_trace_push(&tr, GT_TEV_MICRO_END, 0, 0);
    CHECK(tr.n == 9, "listened to, each op stays an event: %d events", tr.n);
    gt_calib c = flat_calib();
    gt_time_step st = {2, 3, 1, 2, 1, 2, 2000000, 1000000, 100, 0};
    gt_time_estimate t;
    gt_time_simulate(&tr, &st, &c, &t);
    gt_time_set_span_listener(NULL, NULL);
    CHECK(near(t.step_s, 43e-3), "listened to, the same step: %.6f s, by hand 0.043", t.step_s);
    CHECK(find_span("step", 0, -1, 0, 43), "a step span 0..43 ms");
    CHECK(find_span("micro_batch", 0, 0, 0, 11) && find_span("micro_batch", 0, 1, 11, 22), "micro-batches 0..11, 11..22");
    CHECK(find_span("all_gather_v", 1, 0, 1, 3) && find_span("all_gather_v", 1, 0, 3, 6) &&
          find_span("all_gather_v", 1, 1, 12, 14) && find_span("all_gather_v", 1, 1, 14, 17), "gathers 1..3, 3..6, 12..14, 14..17");
    CHECK(find_span("wait_all_gather_v", 0, 0, 1, 3) && find_span("wait_all_gather_v", 0, 1, 12, 14),
          "compute waits for the first gather: 1..3, 12..14");
    CHECK(find_span("reduce_scatter_v", 1, 0, 7, 11) && find_span("wait_reduce_scatter_v", 0, 0, 9, 11),
          "the reduce-scatter 7..11, waited for 9..11");
    CHECK(find_span("matmul_forward", 0, 0, 3, 6) && find_span("matmul_forward", 0, 1, 18, 20), "ops 3..6, 18..20");
    CHECK(count_spans("op", 0) == 5 && count_spans("op", 1) == 5, "five op spans per micro-batch (%d, %d)",
          count_spans("op", 0), count_spans("op", 1));
    CHECK(find_span("sumsq", 0, -1, 22, 26) && find_span("all_reduce_scalar", 1, -1, 26, 27) &&
          find_span("wait_all_reduce_scalar", 0, -1, 26, 27) && find_span("adamw", 0, -1, 27, 37) &&
          find_span("to_working", 0, -1, 37, 43), "the step after the micro-batches: 22..26, 26..27, 27..37, 37..43");
    CHECK(overlaps() == 0, "no two spans of one stream overlap");
    gt_time_trace_free(&tr);
}

static int n_cost_calls;
static void count_cost(void *ctx, const gt_op_cost *cost) {
    (void)ctx;
    (void)cost;
    n_cost_calls++;
}

/* The tiny model, ZeRO-3 on two ranks, grad_accum 3: one op span per op call of a dry micro-batch
 * (counted on a dry model of its own), in each of the three micro-batches. */
static void test_dry_spans(void) {
    gt_config cfg;
    gt_config_defaults(&cfg);
    cfg.train.grad_accum = 3;
    gt_mem_shape sh = gt_plan_shape(&cfg, 0, 4, 1, 2);
    sh.stage = 3;
    sh.grad_micro = 1;
    gt_calib c = flat_calib();
    gt_plan plan;
    gt_policy none = {GT_POLICY_NONE, 0};
    gt_mem_estimate est;
    gt_plan_for_policy(&plan, &none, &sh, &est);
    gt_model *dry = gt_model_create_dry(&cfg.model, 4, 1);
    n_cost_calls = 0;
    gt_ops_dry_set_cost(count_cost, NULL);
    gt_model_dry_train_micro(dry, &plan, sh.micro_batch, sh.seq_len);
    gt_ops_dry_set_cost(NULL, NULL);
    gt_model_destroy(dry);
    n_spans = 0;
    gt_time_set_span_listener(keep_span, NULL);
    gt_time_estimate t;
    gt_plan_time(&sh, &plan, &c, &t);
    gt_time_set_span_listener(NULL, NULL);
    CHECK(n_cost_calls > 0 && n_spans < MAX_SPANS, "%d op calls in a dry micro-batch, %d spans", n_cost_calls, n_spans);
    for (int m = 0; m < 3; m++)
        CHECK(count_spans("op", m) == n_cost_calls, "micro-batch %d: %d op spans, the dry micro-batch calls %d ops", m,
              count_spans("op", m), n_cost_calls);
    CHECK(count_spans("micro_batch", 0) == 1 && count_spans("micro_batch", 3) == 0, "one span per micro-batch");
    CHECK(count_spans("collective", 0) > 0, "ZeRO-3 on two ranks: collectives in the micro-batch");
    double end = 0;
    for (int i = 0; i < n_spans; i++)
        if (!strcmp(spans[i].cat, "step")) end = spans[i].end_s;
    CHECK(near(end, t.step_s), "the step span ends at the step time: %.9f s, %.9f s", end, t.step_s);
    CHECK(overlaps() == 0, "no two spans of one stream overlap");
}

/* The tiny model on two ranks, recompute none, prefetch 1; micro_batch searched over the divisors of 4
 * sequences per rank (grad_accum 4, 2, 1). */
static gt_mem_shape rank_shape(gt_config *cfg) {
    gt_config_defaults(cfg);
    return gt_plan_shape(cfg, 0, 4, 1, 2);
}

/* The fastest of every (stage, grad_sync, micro-batch) priced one by one, of those within budget;
 * stage >= 0: that stage only; B > 0: that micro-batch only. */
static double brute_fastest(const gt_mem_shape *base, int stage, int B_only, uint64_t budget, gt_mem_shape *best_shape) {
    double best = -1;
    gt_policy none = {GT_POLICY_NONE, 0};
    for (int st = 0; st <= 3; st++)
        for (int mi = 0; mi <= (st >= 2); mi++)
            for (int B = 1; B <= 4; B *= 2) {
                if ((stage >= 0 && st != stage) || (B_only > 0 && B != B_only)) continue;
                gt_mem_shape s = *base;
                s.stage = st, s.grad_micro = mi, s.micro_batch = B, s.grad_accum = 4 / B;
                gt_plan plan;
                gt_mem_estimate est;
                gt_plan_for_policy(&plan, &none, &s, &est);
                if (budget && est.total_bytes > budget) continue;
                gt_time_estimate t;
                gt_calib c = flat_calib();
                c.coll_latency_s = 1;
                gt_plan_time(&s, &plan, &c, &t);
                if (best < 0 || t.step_s < best) best = t.step_s, *best_shape = s;
            }
    return best;
}

static void test_auto_ranks_by_time(void) {
    gt_config cfg;
    gt_mem_shape base = rank_shape(&cfg);
    base.micro_batch = 4, base.grad_accum = 1;
    gt_calib c = flat_calib();
    c.coll_latency_s = 1; /* a second per collective: their count decides */
    gt_policy none = {GT_POLICY_NONE, 0};
    /* the stage searched at micro-batch 4 x 1. By hand: ZeRO-0 runs two collectives (the gradients'
     * all-reduce and the norm's scalar), ZeRO-1 and ZeRO-2 three (a reduce-scatter, the scalar, the
     * all-gather), ZeRO-3 one gather per unit and more: ZeRO-0 is the fastest, and the most memory */
    gt_plan_search s = {-1, -1, &none, 0, 1, 0, &c, 0};
    gt_plan_option best, top[GT_PLAN_TOP];
    int n_top = 0;
    CHECK(gt_plan_auto_all(&base, &s, &best, top, &n_top) == 0, "everything fits without a budget");
    CHECK(best.shape.stage == 0, "fastest: ZeRO-%d (by hand ZeRO-0)", best.shape.stage);
    gt_mem_shape brute_shape;
    double fastest = brute_fastest(&base, -1, 4, 0, &brute_shape);
    CHECK(near(best.time.step_s, fastest), "auto's step %.6f s, the fastest priced one by one %.6f s", best.time.step_s,
          fastest);
    CHECK(n_top == GT_PLAN_TOP && near(top[0].time.step_s, best.time.step_s), "the list: %d, first %.6f s", n_top,
          top[0].time.step_s);
    for (int i = 1; i < n_top; i++)
        CHECK(top[i].time.step_s >= top[i - 1].time.step_s, "the list in order: %d: %.6f after %.6f", i,
              top[i].time.step_s, top[i - 1].time.step_s);
    /* a budget just below ZeRO-0's total rules it out: the pick moves to the fastest of the rest */
    uint64_t budget = best.est.total_bytes - 1;
    s.budget = budget;
    gt_plan_option pick;
    CHECK(gt_plan_auto_all(&base, &s, &pick, NULL, NULL) == 0, "something fits %llu bytes", (unsigned long long)budget);
    fastest = brute_fastest(&base, -1, 4, budget, &brute_shape);
    CHECK(pick.est.total_bytes <= budget && pick.shape.stage != 0, "the budget moves the pick: ZeRO-%d, %llu bytes",
          pick.shape.stage, (unsigned long long)pick.est.total_bytes);
    CHECK(near(pick.time.step_s, fastest), "under the budget: ZeRO-%d %.6f s; priced one by one ZeRO-%d %.6f s",
          pick.shape.stage, pick.time.step_s, brute_shape.stage, fastest);
    /* nothing fits: -1 and the smallest */
    s.budget = 1;
    CHECK(gt_plan_auto_all(&base, &s, &pick, NULL, &n_top) == -1 && n_top == 0, "a 1-byte budget: nothing fits");
    /* ZeRO-3 with the micro-batch searched over 4 sequences per rank: every micro-batch gathers every
     * unit again (a second each), so one micro-batch of 4 is the fastest, by hand and priced one by one */
    gt_plan_search s3 = {3, -1, &none, 4, 1, 0, &c, 0};
    CHECK(gt_plan_auto_all(&base, &s3, &best, NULL, NULL) == 0, "ZeRO-3 fits");
    fastest = brute_fastest(&base, 3, 0, 0, &brute_shape);
    CHECK(best.shape.micro_batch == 4 && best.shape.grad_accum == 1 && near(best.time.step_s, fastest),
          "ZeRO-3: micro-batch %d x %d, %.6f s (by hand 4 x 1; priced one by one %d, %.6f s)", best.shape.micro_batch,
          best.shape.grad_accum, best.time.step_s, brute_shape.micro_batch, fastest);
}

/* planner.c's family of plans: the first n_rec blocks recompute in segments of K, then n_sel selective */
static void family_plan(gt_plan *p, int N, int n_rec, int K, int n_sel) {
    memset(p, 0, sizeof *p);
    p->n_blocks = N;
    for (int i = 0; i < N; i++) {
        p->keep[i] = i < n_rec ? GT_KEEP_RECOMPUTE : i < n_rec + n_sel ? GT_KEEP_SELECTIVE : GT_KEEP_ALL;
        p->seg_start[i] = i >= n_rec || i % K == 0;
    }
}

static void test_bounded_search_is_exhaustive(void) {
    gt_config cfg;
    gt_config_defaults(&cfg);
    cfg.model.n_layers = 8;
    gt_mem_shape sh = gt_plan_shape(&cfg, 0, 4, 1, 1);
    int N = 8, n_plans = 0;
    static gt_plan plans[1024];
    static gt_mem_estimate ests[1024];
    for (int n_rec = 0; n_rec <= N; n_rec++)
        for (int K = 1; K <= (n_rec > 0 ? n_rec : 1); K++)
            for (int n_sel = 0; n_sel <= N - n_rec; n_sel++) {
                family_plan(&plans[n_plans], N, n_rec, K, n_sel);
                if (n_rec == N) gt_plan_keep_tail(&plans[n_plans], &sh, &ests[n_plans]);
                else gt_plan_estimate(&sh, &plans[n_plans], &ests[n_plans]);
                n_plans++;
            }
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < n_plans; i++) {
        if (ests[i].total_bytes < lo) lo = ests[i].total_bytes;
        if (ests[i].total_bytes > hi) hi = ests[i].total_bytes;
    }
    int differ = 0;
    for (int k = 0; k <= 40; k++) {
        uint64_t budget = lo + (hi - lo) * (uint64_t)k / 40;
        int want = -1;
        for (int i = 0; i < n_plans; i++) {
            if (ests[i].total_bytes > budget) continue;
            if (want < 0 || ests[i].recompute_flops < ests[want].recompute_flops ||
                (ests[i].recompute_flops == ests[want].recompute_flops && ests[i].total_bytes < ests[want].total_bytes))
                want = i;
        }
        gt_plan got;
        gt_mem_estimate est;
        CHECK(want >= 0 && gt_plan_auto(&sh, budget, &got, &est) == 0, "budget %llu fits", (unsigned long long)budget);
        if (want < 0) continue;
        int same = est.recompute_flops == ests[want].recompute_flops && est.total_bytes == ests[want].total_bytes &&
                   memcmp(got.keep, plans[want].keep, (size_t)N) == 0 &&
                   memcmp(got.seg_start, plans[want].seg_start, (size_t)N) == 0;
        if (!same) {
            char a[256], b[256];
            gt_plan_describe(&got, a, sizeof a);
            gt_plan_describe(&plans[want], b, sizeof b);
            fprintf(stderr, "  budget %llu: auto %s (%g FLOPs, %llu bytes); every plan tried: %s (%g, %llu)\n",
                    (unsigned long long)budget, a, est.recompute_flops, (unsigned long long)est.total_bytes, b,
                    ests[want].recompute_flops, (unsigned long long)ests[want].total_bytes);
            differ++;
        }
    }
    CHECK(differ == 0, "the bounded search differs from trying every plan at %d budgets", differ);
}

/* The recompute plan chosen by the time model, not by FLOPs. The tiny model at 8 blocks, under three
 * sets of rates that FLOPs do not see. On one rank (no communication: a plan's step is the schedule's
 * compute): (a) matrix products and attention cheap, the memory-bound kernels slow, so a selective
 * block, which re-runs two norms and the SwiGLU product (model.c), costs nearly what a recomputed
 * block does while FLOPs charge it only a QK^T; (b) the memory-bound kernels free and the matrix
 * products slow, so a selective block costs nothing while FLOPs charge it a QK^T. (c) ZeRO-3 on two
 * ranks with slow collectives: a recompute segment of several blocks costs the compute of the same
 * blocks one per segment, less their down-projections, but changes when the gathers of the backward
 * can run, which only the full simulation sees (planner.c prices its few least costly plans so). Over a sweep of
 * budgets, every plan of the search's family that fits is priced by gt_plan_time one by one; auto
 * (gt_plan_auto_all, recompute auto) must pick a plan as fast as the fastest of them, and under (a)
 * the least-FLOPs plan (gt_plan_auto) is slower than that at some budgets (so the sweep tests
 * something; under (b) both keep selective blocks before recomputed ones and agree). */
static void test_recompute_by_time(void) {
    gt_config cfg;
    gt_config_defaults(&cfg);
    cfg.model.n_layers = 8;
    gt_mem_shape sh = gt_plan_shape(&cfg, 0, 4, 1, 1);
    sh.grad_accum = 1;
    int N = 8, n_plans = 0;
    static gt_plan plans[1024];
    static gt_mem_estimate ests[1024];
    for (int n_rec = 0; n_rec <= N; n_rec++)
        for (int K = 1; K <= (n_rec > 0 ? n_rec : 1); K++)
            for (int n_sel = 0; n_sel <= N - n_rec; n_sel++) {
                family_plan(&plans[n_plans], N, n_rec, K, n_sel);
                if (n_rec == N) gt_plan_keep_tail(&plans[n_plans], &sh, &ests[n_plans]);
                else gt_plan_estimate(&sh, &plans[n_plans], &ests[n_plans]);
                n_plans++;
            }
    int flops_slower[3] = {0, 0, 0};
    for (int r = 0; r < 3; r++) {
        gt_calib c = flat_calib();
        if (r == 0) {
            c.matmul_flops_per_s = c.attn_fwd_flops_per_s = c.attn_bwd_flops_per_s = 1e15;
            c.mem_bytes_per_s = 1e8;
        } else if (r == 1) {
            c.matmul_flops_per_s = c.attn_fwd_flops_per_s = c.attn_bwd_flops_per_s = 1e9;
            c.mem_bytes_per_s = 1e30;
        } else {
            c.matmul_flops_per_s = c.attn_fwd_flops_per_s = c.attn_bwd_flops_per_s = 1e10;
            c.mem_bytes_per_s = 1e9;
            c.coll_bytes_per_s = 3e6;
            c.coll_latency_s = 1e-4;
            sh.world = 2, sh.stage = 3, sh.grad_micro = 1, sh.prefetch = 1;
            for (int i = 0; i < n_plans; i++) gt_plan_estimate(&sh, &plans[i], &ests[i]);
        }
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int i = 0; i < n_plans; i++) {
            if (ests[i].total_bytes < lo) lo = ests[i].total_bytes;
            if (ests[i].total_bytes > hi) hi = ests[i].total_bytes;
        }
        static double step[1024];
        for (int i = 0; i < n_plans; i++) {
            gt_time_estimate t;
            gt_plan_time(&sh, &plans[i], &c, &t);
            step[i] = t.step_s;
        }
        for (int k = 0; k <= 40; k++) {
            uint64_t budget = lo + (hi - lo) * (uint64_t)k / 40;
            int want = -1;
            for (int i = 0; i < n_plans; i++)
                if (ests[i].total_bytes <= budget && (want < 0 || step[i] < step[want])) want = i;
            gt_plan_search s = {sh.stage, sh.grad_micro, NULL, 0, 1, budget, &c, 0};
            gt_plan_option best;
            CHECK(want >= 0 && gt_plan_auto_all(&sh, &s, &best, NULL, NULL) == 0, "rates %d, budget %llu fits", r,
                  (unsigned long long)budget);
            if (want < 0) continue;
            char a[256], b[256];
            gt_plan_describe(&best.plan, a, sizeof a);
            gt_plan_describe(&plans[want], b, sizeof b);
            CHECK(best.est.total_bytes <= budget && best.time.step_s <= step[want] * (1 + 1e-9),
                  "rates %d, budget %llu: auto %s %.9f s; the fastest that fits, priced one by one: %s %.9f s", r,
                  (unsigned long long)budget, a, best.time.step_s, b, step[want]);
            gt_plan least;
            gt_mem_estimate est;
            gt_plan_auto(&sh, budget, &least, &est);
            gt_time_estimate tl;
            gt_plan_time(&sh, &least, &c, &tl);
            if (tl.step_s > step[want] * (1 + 1e-6)) flops_slower[r]++;
        }
    }
    /* (b) agrees with FLOPs on this model (both keep selective before recompute): it checks the choice
     * is still the fastest; (a) and (c) that the choice is not the least FLOPs' */
    CHECK(flops_slower[0] > 0 && flops_slower[2] > 0, "the least-FLOPs plan is slower than the fastest at %d, %d, %d "
          "budgets of 41 under rates (a), (b), (c) (expected some under (a) and (c))", flops_slower[0], flops_slower[1],
          flops_slower[2]);
}

/* dist.prefetch = auto: the depth (0, 1 or 2) of the fastest ZeRO-3 step, which with gathers that
 * can hide behind compute is not 0 */
static void test_prefetch_auto(void) {
    gt_config cfg;
    gt_mem_shape base = rank_shape(&cfg);
    base.micro_batch = 4, base.grad_accum = 1, base.stage = 3, base.grad_micro = 1;
    gt_calib c = flat_calib();
    c.matmul_flops_per_s = c.attn_fwd_flops_per_s = c.attn_bwd_flops_per_s = 1e9; /* compute to hide behind */
    gt_policy none = {GT_POLICY_NONE, 0};
    double t_depth[3];
    int want = 0;
    for (int d = 0; d < 3; d++) {
        gt_mem_shape sd = base;
        sd.prefetch = d;
        gt_plan p;
        gt_mem_estimate est;
        gt_plan_for_policy(&p, &none, &sd, &est);
        gt_time_estimate t;
        gt_plan_time(&sd, &p, &c, &t);
        t_depth[d] = t.step_s;
        if (t_depth[d] < t_depth[want] * (1 - 1e-9)) want = d;
    }
    CHECK(want > 0, "prefetch helps here: %.6f %.6f %.6f s at depth 0, 1, 2", t_depth[0], t_depth[1], t_depth[2]);
    gt_plan_search s = {3, 1, &none, 0, -1, 0, &c, 0};
    gt_plan_option best;
    CHECK(gt_plan_auto_all(&base, &s, &best, NULL, NULL) == 0 && best.shape.prefetch == want &&
              near(best.time.step_s, t_depth[want]),
          "prefetch auto: depth %d, %.6f s (priced one by one: depth %d, %.6f s)", best.shape.prefetch,
          best.time.step_s, want, t_depth[want]);
}

static void test_coarse_then_full(void) {
    gt_config cfg;
    gt_config_defaults(&cfg);
    cfg.model.n_layers = 16;
    gt_mem_shape base = gt_plan_shape(&cfg, 0, 4, 1, 2);
    gt_calib c = flat_calib();
    c.coll_latency_s = 1e-4;
    /* a budget that needs recompute at every micro-batch: between ZeRO-3 micro-batch 1's smallest
     * plan and its none plan */
    gt_mem_shape s4 = base;
    s4.stage = 3, s4.grad_micro = 1, s4.micro_batch = 1, s4.grad_accum = 4;
    gt_plan p;
    gt_mem_estimate small, none;
    gt_plan_auto(&s4, 0, &p, &small);
    gt_policy pn = {GT_POLICY_NONE, 0};
    gt_plan_for_policy(&p, &pn, &s4, &none);
    uint64_t budget = small.total_bytes + (none.total_bytes - small.total_bytes) / 2;
    gt_plan_search s = {-1, -1, NULL, 4, 1, budget, &c, 0};
    gt_plan_option best;
    CHECK(gt_plan_auto_all(&base, &s, &best, NULL, NULL) == 0, "something fits");
    double fastest = -1;
    int fb = 0, fst = 0;
    for (int st = 0; st <= 3; st++)
        for (int mi = 0; mi <= (st >= 2); mi++)
            for (int B = 1; B <= 4; B *= 2) {
                gt_mem_shape o = base;
                o.stage = st, o.grad_micro = mi, o.micro_batch = B, o.grad_accum = 4 / B;
                gt_mem_estimate est;
                if (gt_plan_auto(&o, budget, &p, &est) != 0) continue;
                gt_time_estimate t;
                gt_plan_time(&o, &p, &c, &t);
                if (fastest < 0 || t.step_s < fastest) fastest = t.step_s, fb = B, fst = st;
            }
    /* at least as fast: a coarse plan the time model prices faster than the full search's (FLOPs do
     * not count the memory-bound kernels selective blocks re-run) is kept */
    CHECK(best.time.step_s <= fastest * (1 + 1e-9), "coarse then full: ZeRO-%d micro-batch %d %.9f s; every option "
          "in full: ZeRO-%d micro-batch %d %.9f s", best.shape.stage, best.shape.micro_batch, best.time.step_s, fst, fb,
          fastest);
    CHECK(best.est.recompute_flops > 0, "the budget is one that needs recompute");
}

/* dist.bucket_mb = auto. By hand first (gt_time_simulate, ZeRO-1 on two ranks, one micro-batch): three
 * units' 1 MB of fp32 gradients done at 0, 0.1 and 0.2 ms (0.1 ms of compute between them), buckets of
 * 1 MB, n_pad 750000 (3 MB of gradients, 1.5 MB of bf16 weights), slice 375000. With 1 ms per
 * collective and 1 GB/s, a bucket's reduce-scatter takes 1 + 0.5 ms: 0..1.5, 1.5..3, 3..4.5, the step
 * waits to 4.5 ms; then the norm's scalar 1 ms, the weights' all-gather 1 + 0.75 ms, the optimizer
 * 1.5 + 3.75 + 2.25 = 7.5 ms: 14.75 ms. One reduction: 0.2 ms of compute, 1 + 1.5 ms, then the same:
 * 12.95 ms. Buckets hurt here (two more latencies than the 0.2 ms they hide), so the default stays 0.
 * Without latency: buckets 0..0.5, 0.5..1, 1..1.5, then 0.75 + 7.5: 9.75 ms; one reduction 0.2 + 1.5
 * + 0.75 + 7.5 = 9.95 ms: buckets help by the compute they hide. Then the search: the sizes tried on
 * the tiny model (a block is 184576 parameters, 738304 bytes of fp32 gradients = 0.7041015625 MiB),
 * the size auto picks on two ranks of ZeRO-1 is the fastest of those priced one by one, not 0 without
 * latency and 0 at a second per collective, and 0 where buckets do not apply (grad_sync micro); and
 * through the config: bucket_mb = auto reads and writes back as auto, and resolves to a size. */
static void test_bucket_auto(void) {
    gt_time_trace tr;
    memset(&tr, 0, sizeof tr);
    gt_time_trace_push(&tr, GT_TEV_GRAD_DONE, 0, 1e6);
    gt_time_trace_push(&tr, GT_TEV_COMPUTE, 0.1e-3, 0);
    gt_time_trace_push(&tr, GT_TEV_GRAD_DONE, 0, 1e6);
    gt_time_trace_push(&tr, GT_TEV_COMPUTE, 0.1e-3, 0);
    gt_time_trace_push(&tr, GT_TEV_GRAD_DONE, 0, 1e6);
    gt_calib c = flat_calib();
    gt_time_step st = {2, 1, 0, 1, 0, 2, 750000, 375000, 100, 0, 1e6};
    gt_time_estimate t;
    gt_time_simulate(&tr, &st, &c, &t);
    CHECK(near(t.step_s, 14.75e-3), "1 ms latency, buckets of 1 MB: step %.6f s, by hand 0.01475", t.step_s);
    st.bucket_bytes = 0;
    gt_time_simulate(&tr, &st, &c, &t);
    CHECK(near(t.step_s, 12.95e-3), "1 ms latency, one reduction: step %.6f s, by hand 0.01295", t.step_s);
    c.coll_latency_s = 0;
    st.bucket_bytes = 1e6;
    gt_time_simulate(&tr, &st, &c, &t);
    CHECK(near(t.step_s, 9.75e-3), "no latency, buckets of 1 MB: step %.6f s, by hand 0.00975", t.step_s);
    st.bucket_bytes = 0;
    gt_time_simulate(&tr, &st, &c, &t);
    CHECK(near(t.step_s, 9.95e-3), "no latency, one reduction: step %.6f s, by hand 0.00995", t.step_s);
    gt_time_trace_free(&tr);

    gt_config cfg;
    gt_config_defaults(&cfg);
    double mib[GT_PLAN_BUCKET_SIZES];
    int n = gt_plan_bucket_sizes(&cfg.model, mib);
    const double want[] = {0, 0.7041015625, 1, 1.408203125, 2.81640625, 4, 16, 64};
    int same = n == 8;
    for (int i = 0; same && i < n; i++) same = mib[i] == want[i];
    CHECK(same, "the sizes tried: %d of them, %g %g %g ... (by hand 0, 0.7041015625, 1, 1.408203125, 2.81640625, "
          "4, 16, 64)", n, mib[0], n > 1 ? mib[1] : -1, n > 2 ? mib[2] : -1);

    gt_mem_shape base = gt_plan_shape(&cfg, 0, 4, 1, 2);
    base.stage = 1, base.grad_micro = 0, base.grad_accum = 1;
    gt_policy none = {GT_POLICY_NONE, 0};
    for (int lat = 0; lat < 2; lat++) {
        gt_calib cl = flat_calib();
        cl.coll_latency_s = lat ? 1 : 0;
        gt_plan plan;
        gt_mem_estimate est;
        gt_plan_for_policy(&plan, &none, &base, &est);
        double fastest = -1, at_zero = 0;
        int fi = 0;
        for (int i = 0; i < n; i++) {
            gt_mem_shape sb = base;
            sb.bucket_mb = mib[i];
            gt_plan_time(&sb, &plan, &cl, &t);
            if (i == 0) at_zero = t.step_s;
            if (fastest < 0 || t.step_s < fastest * (1 - 1e-9)) fastest = t.step_s, fi = i;
        }
        gt_plan_search s = {1, -1, &none, 0, 1, 0, &cl, 0, 1};
        gt_plan_option best;
        CHECK(gt_plan_auto_all(&base, &s, &best, NULL, NULL) == 0, "ZeRO-1 fits");
        CHECK(best.shape.bucket_mb == mib[fi] && near(best.time.step_s, fastest),
              "latency %d s: auto's bucket %g MiB, %.9f s; priced one by one %g MiB, %.9f s (0 MiB: %.9f s)", lat,
              best.shape.bucket_mb, best.time.step_s, mib[fi], fastest, at_zero);
        if (lat == 0)
            CHECK(best.shape.bucket_mb > 0 && best.time.step_s < at_zero, "without latency buckets help: %g MiB %.9f s, "
                  "0 MiB %.9f s", best.shape.bucket_mb, best.time.step_s, at_zero);
        else
            CHECK(best.shape.bucket_mb == 0, "a second per collective: one reduction, not %g MiB", best.shape.bucket_mb);
    }
    gt_calib c0 = flat_calib();
    c0.coll_latency_s = 0;
    gt_mem_shape b3 = base;
    b3.stage = 3, b3.grad_micro = 1;
    gt_plan_search s3 = {3, 1, &none, 0, 1, 0, &c0, 0, 1};
    gt_plan_option best;
    CHECK(gt_plan_auto_all(&b3, &s3, &best, NULL, NULL) == 0 && best.shape.bucket_mb == 0,
          "grad_sync micro: no buckets, %g MiB", best.shape.bucket_mb);

    static gt_plan_choice ch;
    char err[1024] = "";
    gt_config lc;
    CHECK(gt_config_load_string(&lc, "[dist]\nshard = optimizer\nbucket_mb = auto\n", "b.ini", 0, NULL, err,
                                sizeof err) == 0 && lc.dist.bucket_mb == GT_DOUBLE_AUTO, "bucket_mb = auto: %s", err);
    char *ini = gt_config_to_ini(&lc);
    CHECK(ini && strstr(ini, "\nbucket_mb = auto\n"), "written back as auto");
    free(ini);
    gt_mem_shape lb = gt_plan_shape(&lc, 0, 4, 1, 2);
    CHECK(lb.bucket_mb == 0, "the shape before the search: %g MiB", lb.bucket_mb);
    CHECK(gt_plan_resolve(&lc, &lb, &c0, &ch, err, sizeof err) == 0 && ch.bucket_auto && ch.chosen_by_auto &&
              ch.shape.bucket_mb > 0,
          "resolved without latency: %g MiB (%s)", ch.shape.bucket_mb, err);
}

/* gt_plan_resolve's batch: err for the config text `ini` (at file "gb.ini") on `world` ranks. */
static int resolve_batch(const char *ini, int world, gt_plan_choice *c, char *err, size_t len) {
    gt_config cfg;
    char lerr[1024];
    if (gt_config_load_string(&cfg, ini, "gb.ini", 0, NULL, lerr, sizeof lerr) != 0) {
        snprintf(err, len, "load: %s", lerr);
        return -2;
    }
    gt_mem_shape base = gt_plan_shape(&cfg, 0, 4, 1, world);
    gt_calib cal = flat_calib();
    return gt_plan_resolve(&cfg, &base, &cal, c, err, len);
}

static void test_global_batch(void) {
    static gt_plan_choice c;
    char err[1024] = "";
    CHECK(resolve_batch("[train]\nmicro_batch = 2\nglobal_batch = 16\n", 2, &c, err, sizeof err) == 0, "%s", err);
    CHECK(c.shape.micro_batch == 2 && c.shape.grad_accum == 4, "16 = 2 x %d x 2 ranks", c.shape.grad_accum);
    CHECK(resolve_batch("[train]\nmicro_batch = 2\nglobal_batch = 16\ngrad_accum = 4\n", 2, &c, err, sizeof err) == 0,
          "a grad_accum that agrees: %s", err);
    CHECK(resolve_batch("[train]\nmicro_batch = 2\nglobal_batch = 16\ngrad_accum = 2\n", 2, &c, err, sizeof err) == -1 &&
              strstr(err, "gb.ini:4: [train] grad_accum: grad_accum 2 disagrees with global_batch 16") == err,
          "a grad_accum that disagrees: %s", err);
    CHECK(resolve_batch("[train]\nmicro_batch = 2\nglobal_batch = 16\n", 3, &c, err, sizeof err) == -1 &&
              strstr(err, "gb.ini:3: [train] global_batch: global_batch 16 is not a multiple of the 3 ranks") == err,
          "3 ranks: %s", err);
    CHECK(resolve_batch("[train]\nmicro_batch = 4\nglobal_batch = 8\n", 4, &c, err, sizeof err) == -1 &&
              strstr(err, "gb.ini:3: [train] global_batch: global_batch 8 is not a multiple of micro_batch 4 x 4 ranks") ==
                  err,
          "4 ranks of micro-batch 4: %s", err);
    /* auto: a divisor of the 8 sequences per rank, grad_accum the rest; with grad_accum set, the quotient */
    CHECK(resolve_batch("[train]\nmicro_batch = auto\nglobal_batch = 16\n", 2, &c, err, sizeof err) == 0, "%s", err);
    CHECK(c.chosen_by_auto && c.shape.micro_batch >= 1 && 8 % c.shape.micro_batch == 0 &&
              c.shape.micro_batch * c.shape.grad_accum == 8,
          "auto: micro-batch %d x grad_accum %d x 2 ranks", c.shape.micro_batch, c.shape.grad_accum);
    CHECK(resolve_batch("[train]\nmicro_batch = auto\nglobal_batch = 16\ngrad_accum = 2\n", 2, &c, err, sizeof err) ==
                  0 && c.shape.micro_batch == 4 && c.shape.grad_accum == 2,
          "auto with grad_accum 2: micro-batch %d (%s)", c.shape.micro_batch, err);
    CHECK(resolve_batch("[train]\nmicro_batch = auto\nglobal_batch = 16\ngrad_accum = 3\n", 2, &c, err, sizeof err) ==
              -2, "grad_accum 3 into 16: refused at load: %s", err);
}

/* The calibration's GEMMs are timed in the state a step leaves the BLAS in: every product of the list
 * (the model's shapes at each row count) runs once, forward and backward, before any is timed
 * (calibrate.c measure_gemms). On a table that records the products' calls: the first calls are each
 * case once, forward then backward, no case twice before all have run; then the timed calls. */
#define MAX_MM_CALLS 240000 /* the rounds of timed calls, and the micro-batches run whole at each size */
static struct {
    int n, ic, oc, backward;
} g_mm[MAX_MM_CALLS];
static int g_n_mm;
static void rec_mm(int N, int IC, int OC, int backward) {
    if (g_n_mm < MAX_MM_CALLS) g_mm[g_n_mm].n = N, g_mm[g_n_mm].ic = IC, g_mm[g_n_mm].oc = OC, g_mm[g_n_mm].backward = backward;
    g_n_mm++;
}
static void rec_mm_fwd(void *out, const void *inp, const void *w, int N, int IC, int OC) {
    (void)out, (void)inp, (void)w;
    rec_mm(N, IC, OC, 0);
}
static void rec_mm_bwd(void *dinp, float *dw, const void *dout, const void *inp, const void *w, int N, int IC, int OC,
                       int acc) {
    (void)dinp, (void)dw, (void)dout, (void)inp, (void)w, (void)acc;
    rec_mm(N, IC, OC, 1);
}
static void test_calibrate_warm_pass(void) {
    gt_config cfg;
    gt_config_defaults(&cfg);
    cfg.model.dim = 64, cfg.model.n_heads = 4, cfg.model.n_kv_heads = 2, cfg.model.ffn_dim = 160;
    cfg.model.vocab_size = 96, cfg.model.n_layers = 2;
    cfg.train.seq_len = 16, cfg.train.micro_batch = 2;
    gt_ops ops;
    gt_ops_dry_init(&ops, 4, 0);
    ops.matmul_forward = rec_mm_fwd;
    ops.matmul_backward = rec_mm_bwd;
    gt_calib c;
    memset(&c, 0, sizeof c);
    g_n_mm = 0;
    CHECK(gt_calibrate(&cfg, &ops, 0, NULL, MPI_COMM_NULL, &c, NULL) == 0, "gt_calibrate on the recording table");
    gt_ops_dry_set_cost(NULL, NULL);
    int cases = c.n_gemm; /* (C,C) (C,KVD) (C,F) (F,C) (C,V) at the rows of 2, 1, 2, 4, 8 sequences: 4 each */
    CHECK(cases == 20, "calibrated %d GEMM cases, expected 5 shapes x 4 row counts", cases);
    CHECK(g_n_mm > 2 * cases && g_n_mm <= MAX_MM_CALLS, "%d matmul calls", g_n_mm);
    if (g_n_mm <= 2 * cases || g_n_mm > MAX_MM_CALLS) return;
    for (int i = 0; i < cases; i++) {
        CHECK(!g_mm[2 * i].backward && g_mm[2 * i + 1].backward && g_mm[2 * i].n == g_mm[2 * i + 1].n &&
                  g_mm[2 * i].ic == g_mm[2 * i + 1].ic && g_mm[2 * i].oc == g_mm[2 * i + 1].oc,
              "warm pass: call %d is a forward followed by the backward of its shape", 2 * i);
        for (int j = 0; j < i; j++)
            CHECK(g_mm[2 * j].n != g_mm[2 * i].n || g_mm[2 * j].ic != g_mm[2 * i].ic || g_mm[2 * j].oc != g_mm[2 * i].oc,
                  "warm pass: case %d (n %d, %d -> %d) runs again before every case ran once", i, g_mm[2 * i].n,
                  g_mm[2 * i].ic, g_mm[2 * i].oc);
        int found = 0;
        for (int k = 0; k < c.n_gemm; k++)
            found |= c.gemm[k].n == g_mm[2 * i].n && c.gemm[k].ic == g_mm[2 * i].ic && c.gemm[k].oc == g_mm[2 * i].oc;
        CHECK(found, "warm pass: case n %d, %d -> %d is one the calibration times", g_mm[2 * i].n, g_mm[2 * i].ic,
              g_mm[2 * i].oc);
    }
    /* then the timed calls begin with the first case again */
    CHECK(g_mm[2 * cases].n == c.gemm[0].n && g_mm[2 * cases].ic == c.gemm[0].ic && g_mm[2 * cases].oc == c.gemm[0].oc,
          "the timed calls follow the warm pass");
}

/* The in-step factor's micro-batch: every block of a small model; of a model whose every block would
 * not fit the cap at 8 sequences, the most that do (one more would not), at least 2; the GPU's larger
 * cap takes more. */
static void test_in_step_blocks(void) {
    gt_config cfg;
    gt_config_defaults(&cfg);
    gt_model_config m = cfg.model;
    m.dim = 128, m.n_heads = 4, m.n_kv_heads = 2, m.ffn_dim = 352, m.vocab_size = 256, m.n_layers = 4;
    CHECK(gt_calibrate_in_step_blocks(&m, 4, 128, 1, 0) == 4, "a 4-block model of dim 128: %d blocks",
          gt_calibrate_in_step_blocks(&m, 4, 128, 1, 0));
    m.n_layers = 1;
    CHECK(gt_calibrate_in_step_blocks(&m, 4, 128, 1, 0) == 1, "a 1-block model: %d blocks",
          gt_calibrate_in_step_blocks(&m, 4, 128, 1, 0));
    m.dim = 1024, m.n_heads = 16, m.n_kv_heads = 8, m.ffn_dim = 2816, m.vocab_size = 32000, m.n_layers = 32;
    int k = gt_calibrate_in_step_blocks(&m, 4, 128, 1, 0);
    CHECK(k > 2 && k < 32, "32 blocks of dim 1024 on the CPU: %d blocks, expected fewer than all and more than 2", k);
    gt_model_config fit = m;
    fit.n_layers = k;
    CHECK(gt_calibrate_in_step_blocks(&fit, 4, 128, 1, 0) == k, "the %d blocks chosen do not fit", k);
    fit.n_layers = k + 1;
    CHECK(gt_calibrate_in_step_blocks(&fit, 4, 128, 1, 0) == k, "%d blocks fit, %d chosen", k + 1, k);
    CHECK(gt_calibrate_in_step_blocks(&m, 4, 128, 16, 0) < k, "at 16 sequences as many blocks as at 8 (%d)", k);
    CHECK(gt_calibrate_in_step_blocks(&m, 2, 128, 1, 1) == 32, "the GPU's cap at 2-byte activations: %d blocks of 32",
          gt_calibrate_in_step_blocks(&m, 2, 128, 1, 1));
    m.dim = 8192, m.n_heads = 64, m.n_kv_heads = 8, m.ffn_dim = 28672, m.vocab_size = 128256, m.n_layers = 80;
    CHECK(gt_calibrate_in_step_blocks(&m, 4, 128, 1, 0) == 2, "80 blocks of dim 8192: %d blocks, expected the least, 2",
          gt_calibrate_in_step_blocks(&m, 4, 128, 1, 0));
}

int main(void) {
    test_hand_schedule();
    test_dry_schedule();
    test_hand_spans();
    test_dry_spans();
    test_file();
    test_links();
    test_ranks_per_node();
    test_memory_kernels();
    test_auto_ranks_by_time();
    test_bounded_search_is_exhaustive();
    test_recompute_by_time();
    test_coarse_then_full();
    test_prefetch_auto();
    test_bucket_auto();
    test_global_batch();
    test_calibrate_warm_pass();
    test_in_step_blocks();
    if (check_failures) fprintf(stderr, "%d failure(s)\n", check_failures);
    else printf("test_timemodel: ok\n");
    return check_failures ? 1 : 0;
}
