/*
 * planner.c — memory model and recompute planner (see planner.h).
 *
 * Model state per rank (ZeRO-1, Rajbhandari et al. 2020; docs/data-parallel.md): working params P*e
 * + fp32 grads 4P + (master + exp_avg + exp_avg_sq) 12P/W, with P padded up to a multiple of W when
 * sharded.
 *
 * Activations: with x the bytes of one block input and I what a block keeps beyond it, the closed
 * forms (docs/recompute.md, "Memory model"; uniform:K is Chen et al. 2016's segments) are none N(x+I), full N x + I, uniform:K (N/K) x + K(x+I), blocks:K K x + (N-K)(x+I) + I.
 * Those are approximations (the head, the backward's scratch and the order of frees matter); the exact
 * figure is measured on the executor itself, run dry (dry_run below: model.h's dry model), and
 * remembered per plan, since auto prices the same plans for every grad_sync and every caller.
 *
 * Compute: a recomputed block costs one more block forward (3F -> 4F at most, +33%), less the
 * down-projection for the last block of each segment (its output is the next segment's kept input,
 * so model.c does not recompute it); selective costs one more attention-score product (QK^T) per block.
 */
#include "planner.h"
#include "bytes.h"
#include "model.h"
#include "testhooks.h"
#include "zero.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The dry model of the last activation shape priced, and the dry runs already made on it: auto prices
 * the same plans again for each grad_sync and for each caller (a hundred thousand of them for an
 * 80-block model), and a plan's peaks depend on neither the world size nor the budget. Not
 * thread-safe (the planner runs on one thread). */
typedef struct dry_entry {
    uint64_t hash;        /* 0: an empty slot */
    uint8_t *code;        /* (n_blocks) keep | seg_start << 2 */
    int n_blocks, with_zero;
    uint64_t act, gather, acc;
} dry_entry;

static struct {
    int valid;
    gt_model_config model;
    int B, T, act_bytes, keep_probs, depth;
    uint64_t head_chunk_bytes;   /* testhooks.h: a unit test's override changes the head's chunks */
    gt_model *dry;
    dry_entry *memo;      /* open addressing, cap a power of two, at most half full */
    size_t cap, used;
} g_dry;

static void dry_forget(void) {
    for (size_t i = 0; i < g_dry.cap; i++) free(g_dry.memo[i].code);
    free(g_dry.memo);
    gt_model_destroy(g_dry.dry);
    memset(&g_dry, 0, sizeof g_dry);
}

static gt_model *dry_model(const gt_mem_shape *sh) {
    if (g_dry.valid && memcmp(&g_dry.model, &sh->model, offsetof(gt_model_config, init)) == 0 &&
        g_dry.B == sh->micro_batch && g_dry.T == sh->seq_len && g_dry.act_bytes == sh->act_bytes &&
        g_dry.keep_probs == sh->keep_probs && g_dry.depth == sh->prefetch &&
        g_dry.head_chunk_bytes == gt_test_hooks_get()->head_chunk_bytes)
        return g_dry.dry;
    dry_forget();
    g_dry.model = sh->model;
    g_dry.B = sh->micro_batch;
    g_dry.T = sh->seq_len;
    g_dry.act_bytes = sh->act_bytes;
    g_dry.keep_probs = sh->keep_probs;
    g_dry.depth = sh->prefetch;
    g_dry.head_chunk_bytes = gt_test_hooks_get()->head_chunk_bytes;
    g_dry.dry = gt_model_create_dry(&sh->model, sh->act_bytes, sh->keep_probs);
    g_dry.cap = 1024;
    g_dry.memo = calloc(g_dry.cap, sizeof *g_dry.memo);
    if (!g_dry.memo) abort();
    g_dry.valid = 1;
    return g_dry.dry;
}

static uint64_t plan_hash(const gt_plan *plan) {
    uint64_t h = gt_mix64((uint64_t)plan->n_blocks);
    for (int i = 0; i < plan->n_blocks; i++) h = gt_mix64(h ^ (uint64_t)(plan->keep[i] | plan->seg_start[i] << 2));
    return h ? h : 1;
}

/* The memo's slot of `plan`: its entry, or the empty slot where it goes. */
static dry_entry *memo_slot(const gt_plan *plan, uint64_t hash) {
    for (size_t i = hash & (g_dry.cap - 1);; i = (i + 1) & (g_dry.cap - 1)) {
        dry_entry *e = &g_dry.memo[i];
        if (!e->hash) return e;
        if (e->hash != hash || e->n_blocks != plan->n_blocks) continue;
        int same = 1;
        for (int b = 0; b < plan->n_blocks && same; b++)
            same = e->code[b] == (plan->keep[b] | plan->seg_start[b] << 2);
        if (same) return e;
    }
}

static dry_entry *memo_add(const gt_plan *plan, uint64_t hash) {
    if (2 * (g_dry.used + 1) > g_dry.cap) {
        dry_entry *old = g_dry.memo;
        size_t old_cap = g_dry.cap;
        g_dry.cap *= 2;
        g_dry.memo = calloc(g_dry.cap, sizeof *g_dry.memo);
        if (!g_dry.memo) abort();
        for (size_t i = 0; i < old_cap; i++) {
            if (!old[i].hash) continue;
            size_t j = old[i].hash & (g_dry.cap - 1);
            while (g_dry.memo[j].hash) j = (j + 1) & (g_dry.cap - 1);
            g_dry.memo[j] = old[i];
        }
        free(old);
    }
    dry_entry *e = memo_slot(plan, hash);
    e->hash = hash;
    e->n_blocks = plan->n_blocks;
    e->code = malloc((size_t)plan->n_blocks + 1);
    if (!e->code) abort();
    for (int b = 0; b < plan->n_blocks; b++) e->code[b] = (uint8_t)(plan->keep[b] | plan->seg_start[b] << 2);
    g_dry.used++;
    return e;
}

/* The executor itself, run dry (model.h, ops_dry.h) on a micro-batch of the shape under `plan`: the
 * activation high-water mark and, when ZeRO-3 or grad_sync = micro need them, the peaks of gathered
 * units and gradient accumulators from zero.c's own state machine on the executor's hooks. That run
 * has both of zero's machines on (stage 3 and grad_sync micro): they share no state (zero.c: the
 * gathers are reference-counted per unit, the accumulators apart), so each peak is what a run with
 * only its own machine measures, and one run serves every stage. */
static void dry_run(const gt_mem_shape *sh, const gt_plan *plan, int stage, int micro, gt_mem_estimate *est) {
    gt_model *dry = dry_model(sh);
    int need_zero = stage == 3 || micro;
    uint64_t hash = plan_hash(plan);
    dry_entry *e = memo_slot(plan, hash);
    if (!e->hash || (need_zero && !e->with_zero)) {
        if (!e->hash) e = memo_add(plan, hash);
        gt_zero z;
        gt_unit_hooks hooks;
        if (need_zero) {
            gt_zero_init_dry(&z, gt_model_layout(dry), 3, 1, sh->prefetch, sh->act_bytes);
            gt_zero_hooks(&z, &hooks);
        }
        gt_model_set_unit_hooks(dry, need_zero ? &hooks : NULL);
        e->act = gt_model_dry_train_micro(dry, plan, sh->micro_batch, sh->seq_len);
        gt_model_set_unit_hooks(dry, NULL);
        if (need_zero) {
            e->gather = z.dry_peak[0];
            e->acc = z.dry_peak[1];
            e->with_zero = 1;
            gt_zero_free(&z);
        }
    }
    est->act_peak_bytes = e->act;
    if (need_zero) {
        est->gather_bytes = stage == 3 ? e->gather : 0;
        est->grad_buffer_bytes = micro ? e->acc : 0;
    }
}

/* Model FLOPs of one forward (2 per multiply-add), causal attention counted as half the square. */
static void forward_flops(const gt_mem_shape *sh, double *block, double *head, double *scores, double *down) {
    const gt_model_config *m = &sh->model;
    double B = sh->micro_batch, T = sh->seq_len, BT = B * T;
    double C = m->dim, F = m->ffn_dim, V = m->vocab_size, HD = C / m->n_heads;
    double KVD = m->n_kv_heads * HD;
    double causal_pairs = B * m->n_heads * T * (T + 1) / 2;
    *scores = 2 * causal_pairs * HD; /* QK^T */
    *block = 2 * BT * (2 * C * C + 2 * C * KVD + 3 * C * F) + 2 * (*scores);
    *head = 2 * BT * C * V;
    *down = 2 * BT * F * C; /* the down-projection: not re-run for a segment's last block (model.c) */
}

/* The extra forward FLOPs of a plan (forward_flops' parts): a recomputed block's forward, less the
 * down-projection for a segment's last block; a selective block's QK^T. */
static double plan_recompute_flops(const gt_plan *plan, double block, double scores, double down) {
    double f = 0;
    for (int i = 0; i < plan->n_blocks; i++) {
        if (plan->keep[i] == GT_KEEP_RECOMPUTE) {
            f += block;
            if (gt_plan_segment_end(plan, i) == i + 1) f -= down; /* segment's last */
        } else if (plan->keep[i] == GT_KEEP_SELECTIVE) {
            f += scores;
        }
    }
    return f;
}

int gt_plan_uses_nccl(int cuda, int world, gt_comm_choice comm) {
    return cuda && (comm == GT_COMM_NCCL || (comm == GT_COMM_AUTO && world > 1));
}

uint64_t gt_plan_cudnn_scratch_bytes(const gt_model_config *m, int micro_batch, int seq_len) {
    uint64_t rows = (uint64_t)micro_batch * (uint64_t)m->n_heads * (uint64_t)seq_len;
    return rows * 4 * (1 + (uint64_t)(m->dim / m->n_heads));
}

uint64_t gt_plan_library_bytes(int cuda, int world, gt_comm_choice comm, gt_cuda_attention attention,
                               const gt_model_config *m, int micro_batch, int seq_len) {
    if (!cuda) return 0;
    return (uint64_t)GT_CUDA_MATMUL_WORKSPACE_BYTES +
           (gt_plan_uses_nccl(cuda, world, comm) ? GT_PLAN_NCCL_BUFFERS : 0) +
           (attention == GT_CUDA_ATTENTION_CUDNN ? gt_plan_cudnn_scratch_bytes(m, micro_batch, seq_len) : 0);
}

/* ZeRO model state (zero.h, optim.c, model.c's unit order): working parameters, gradients and
 * what they hold at their high-water marks (est's gather and accumulator peaks, from dry_run), and
 * the ring-model bytes of one step. */
static void zero_state(const gt_mem_shape *sh, gt_mem_estimate *est) {
    uint64_t P = gt_model_param_count(&sh->model);
    uint64_t W = (uint64_t)(sh->world > 0 ? sh->world : 1);
    int stage = sh->stage;
    int micro = stage >= 2 && sh->grad_micro;
    int sharded = stage >= 1 && W > 1;
    uint64_t slice = stage >= 1 ? (P + W - 1) / W : P;
    uint64_t n_pad = sharded ? slice * W : P;
    uint64_t e = (uint64_t)sh->act_bytes;
    uint64_t Ue, Ub, Uh, t = (uint64_t)sh->model.tie_word_embeddings, N = (uint64_t)sh->model.n_layers;
    gt_unit_sizes(&sh->model, &Ue, &Ub, &Uh);
    est->optim_bytes = slice * 12;
    if (stage == 3) {
        est->params_bytes = slice * e + est->gather_bytes;
    } else {
        est->params_bytes = n_pad * e;
    }
    if (micro) {
        est->grads_bytes = slice * 4 + est->grad_buffer_bytes;
    } else {
        est->grads_bytes = n_pad * 4;
    }
    /* communication per step, ring model; v-collectives at their mean (W-1)/W of the unit */
    double A = sh->grad_accum > 0 ? sh->grad_accum : 1, w1 = (double)(W - 1), ring = w1 / (double)W;
    double gathered_per_micro = (double)(P + t * Ue + N * Ub); /* forward all units, backward the blocks */
    double bytes = 0;
    if (W > 1) {
        if (stage == 0) bytes = 2.0 * ring * (double)P * 4;
        else if (!micro) bytes = w1 * (double)slice * 4; /* one reduce-scatter at the step */
        else bytes = A * ring * (double)P * 4;           /* one per micro-batch, unit by unit */
        if (stage == 1 || stage == 2) bytes += w1 * (double)slice * (double)e; /* the step's all-gather */
        if (stage == 3) bytes += A * ring * gathered_per_micro * (double)e;
    }
    est->comm_bytes = bytes;
}

uint64_t gt_plan_snapshot_bytes(const gt_config *cfg, const gt_mem_shape *sh) {
    if (!cfg->checkpoint.dir[0] || !cfg->checkpoint.async) return 0;
    uint64_t P = gt_model_param_count(&sh->model), W = (uint64_t)(sh->world > 0 ? sh->world : 1);
    return (P + W - 1) / W * 12;
}

uint64_t gt_plan_memsnap_bytes(const gt_config *cfg, const gt_mem_shape *sh, int copies) {
    if (!cfg->checkpoint.dir[0] || cfg->checkpoint.memory_every == 0) return 0;
    uint64_t P = gt_model_param_count(&sh->model), W = (uint64_t)(sh->world > 0 ? sh->world : 1);
    uint64_t count = sh->stage >= 1 ? (P + W - 1) / W : P;
    char *text = gt_config_to_ini(cfg);
    uint64_t config_len = text ? strlen(text) : 0;
    free(text);
    return (copies ? 4 : 2) * (4096 + 12 * count + config_len);
}

/* |[a0, a1) ∩ [b0, b1)| */
static uint64_t overlap(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) {
    uint64_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? hi - lo : 0;
}

/* Bucket staging (gt_zero_bucket_staging_peak) of the last shape asked: auto asks again for every plan. */
static struct {
    int valid, world, rank;
    double bucket_mb;
    gt_model_config model;
    uint64_t bytes;
} g_bucket_staging;

static uint64_t bucket_staging(const gt_mem_shape *sh, int rank, uint64_t n_pad) {
    if (g_bucket_staging.valid && g_bucket_staging.world == sh->world && g_bucket_staging.rank == rank &&
        g_bucket_staging.bucket_mb == sh->bucket_mb &&
        memcmp(&g_bucket_staging.model, &sh->model, offsetof(gt_model_config, init)) == 0)
        return g_bucket_staging.bytes;
    uint64_t Ue, Ub, Uh;
    gt_unit_sizes(&sh->model, &Ue, &Ub, &Uh);
    int n = sh->model.n_layers + 2;
    size_t *numel = malloc((size_t)n * sizeof *numel);
    if (!numel) abort();
    for (int u = 0; u < n; u++) numel[u] = u == 0 ? Ue : u == n - 1 ? Uh : Ub;
    /* the bucket size as train.c hands it to gt_zero_set_buckets */
    uint64_t bytes = gt_zero_bucket_staging_peak(numel, n, n_pad, sh->world, rank,
                                                 (size_t)(sh->bucket_mb * 1024.0 * 1024.0));
    free(numel);
    g_bucket_staging.valid = 1;
    g_bucket_staging.world = sh->world;
    g_bucket_staging.rank = rank;
    g_bucket_staging.bucket_mb = sh->bucket_mb;
    g_bucket_staging.model = sh->model;
    g_bucket_staging.bytes = bytes;
    return bytes;
}

uint64_t gt_plan_staging_bytes(const gt_mem_shape *sh, int rank) {
    uint64_t W = (uint64_t)(sh->world > 0 ? sh->world : 1);
    if (!sh->host_comm || W < 2 || sh->stage < 1) return 0; /* shard none: an all-reduce, no staging */
    uint64_t P = gt_model_param_count(&sh->model), slice = (P + W - 1) / W;
    if (!(sh->stage >= 2 && sh->grad_micro))
        return sh->bucket_mb > 0 ? bucket_staging(sh, rank, slice * W) : gt_comm_mpi_staging_bytes((int)W, slice, 4);
    /* the units back to back (model.h): the embedding, the blocks, the final norm with the head */
    uint64_t Ue, Ub, Uh, N = (uint64_t)sh->model.n_layers, most = 0;
    gt_unit_sizes(&sh->model, &Ue, &Ub, &Uh);
    for (uint64_t u = 0; u < N + 2; u++) {
        uint64_t u0 = u == 0 ? 0 : Ue + (u - 1) * Ub, u1 = u == 0 ? Ue : u <= N ? u0 + Ub : u0 + Uh;
        /* rank r's slice of [0, P) (shard.h); only the ranks the unit meets, or the one asked */
        uint64_t r_lo = rank >= 0 ? (uint64_t)rank : u0 / slice, r_hi = rank >= 0 ? (uint64_t)rank : (u1 - 1) / slice;
        for (uint64_t r = r_lo; r <= r_hi && u1 > u0; r++) {
            uint64_t piece = overlap(u0, u1, r * slice, (r + 1) * slice < P ? (r + 1) * slice : P);
            if (piece > most) most = piece;
        }
    }
    return W * most * 4;
}

void gt_plan_estimate(const gt_mem_shape *sh, const gt_plan *plan, gt_mem_estimate *est) {
    memset(est, 0, sizeof *est);
    int stage = sh->stage;
    int micro = stage >= 2 && sh->grad_micro;
    dry_run(sh, plan, stage, micro, est);
    zero_state(sh, est);
    /* token ids (inputs, targets; and the document starts when documents are masked or positions
     * reset) and the RoPE cos/sin table (max_seq_len, HD/2, 2) fp32 */
    est->workspace_bytes = (sh->documents ? 3 : 2) * (uint64_t)sh->micro_batch * (uint64_t)sh->seq_len * 4 +
                           (uint64_t)sh->model.max_seq_len * (uint64_t)(sh->model.dim / sh->model.n_heads) * 4;
    est->library_bytes = sh->library_bytes;
    est->staging_bytes = gt_plan_staging_bytes(sh, -1);
    est->total_bytes = est->params_bytes + est->grads_bytes + est->optim_bytes + est->workspace_bytes +
                       est->act_peak_bytes + est->library_bytes + est->staging_bytes;
    double block, head, scores, down;
    forward_flops(sh, &block, &head, &scores, &down);
    est->forward_flops = block * sh->model.n_layers + head;
    est->recompute_flops = plan_recompute_flops(plan, block, scores, down);
}

int gt_plan_keep_tail(gt_plan *plan, const gt_mem_shape *sh, gt_mem_estimate *est) {
    gt_mem_estimate was, now;
    gt_plan_estimate(sh, plan, &was);
    if (est) *est = was;
    int N = plan->n_blocks;
    if (N == 0 || plan->keep[N - 1] != GT_KEEP_RECOMPUTE) return 0;
    gt_plan kept = *plan;
    for (int i = gt_plan_segment_start(plan, N - 1); i < N; i++) {
        kept.keep[i] = GT_KEEP_ALL;
        kept.seg_start[i] = 1;
    }
    gt_plan_estimate(sh, &kept, &now);
    if (now.act_peak_bytes > was.act_peak_bytes || now.total_bytes > was.total_bytes) return 0;
    *plan = kept;
    if (est) *est = now;
    return 1;
}

void gt_plan_for_policy(gt_plan *plan, const gt_policy *policy, const gt_mem_shape *sh, gt_mem_estimate *est) {
    gt_plan_from_policy(plan, policy, sh->model.n_layers);
    gt_plan_keep_tail(plan, sh, est);
}

/* Plans of the shape "first n_rec blocks recompute in segments of K, then n_sel selective, then
 * the rest keep everything" — recompute goes first because early blocks' activations live longest
 * (Megatron's block method). */
static void shaped_plan(gt_plan *plan, int N, int n_rec, int K, int n_sel) {
    memset(plan, 0, sizeof *plan);
    plan->n_blocks = N;
    for (int i = 0; i < N; i++) {
        if (i < n_rec) {
            plan->keep[i] = GT_KEEP_RECOMPUTE;
            plan->seg_start[i] = (i % K) == 0;
        } else {
            plan->keep[i] = i < n_rec + n_sel ? GT_KEEP_SELECTIVE : GT_KEEP_ALL;
            plan->seg_start[i] = 1;
        }
    }
}

/* v + stride, but never stepping over `last` itself: the extremes (none, all) are always tried. */
static int next_count(int v, int stride, int last) {
    if (v >= last) return last + 1;
    return v + stride < last ? v + stride : last;
}

/* A plan of the search (shaped_plan's counts), its recompute cost (recompute_weights) and its place in
 * the enumeration. */
typedef struct plan_cand {
    double key;
    int n_rec, K, n_sel, order;
} plan_cand;

static int cand_cmp(const void *pa, const void *pb) {
    const plan_cand *a = pa, *b = pb;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return (a->order > b->order) - (a->order < b->order);
}

static double record_compute_s(const gt_mem_shape *sh, const gt_plan *plan, const gt_calib *calib);

/* What one block's recompute costs, in plan_recompute_flops' three parts (a recomputed block, a
 * selective one, less a segment's last block's down-projection). Without rates: the FLOPs
 * (forward_flops). With rates: the seconds the time model gives them on the executor's dry schedule
 * of this shape, each over the same schedule at recompute none: every block recomputed one per
 * segment (N x (block - down)) and in one segment (N x block - down), and every block selective (the
 * norms and SwiGLU it re-runs, at the memory-bound rate: FLOPs would charge it a QK^T instead). */
static void recompute_weights(const gt_mem_shape *sh, const gt_calib *calib, double *block, double *sel,
                              double *down) {
    double head;
    forward_flops(sh, block, &head, sel, down);
    if (!calib) return;
    int N = sh->model.n_layers;
    gt_plan p;
    gt_policy pn = {GT_POLICY_NONE, 0};
    gt_plan_from_policy(&p, &pn, N);
    double c0 = record_compute_s(sh, &p, calib);
    shaped_plan(&p, N, N, 1, 0);
    double one_each = record_compute_s(sh, &p, calib) - c0;
    shaped_plan(&p, N, N, N, 0);
    double one_seg = record_compute_s(sh, &p, calib) - c0;
    shaped_plan(&p, N, 0, 1, N);
    double all_sel = record_compute_s(sh, &p, calib) - c0;
    *down = N > 1 ? (one_seg - one_each) / (N - 1) : 0;
    *block = (one_seg + *down) / N;
    *sel = all_sel / N;
}

/* The fitting plans the search keeps with rates: the PRICED least costly, each then priced in full. */
#define PRICED 4
typedef struct kept_plan {
    gt_plan plan;
    gt_mem_estimate est;
    double key;
    int order;
} kept_plan;

/* a before b: the lesser cost, then the lesser memory, then the enumeration's first */
static int kept_before(double key, const gt_mem_estimate *est, int order, const kept_plan *b) {
    if (key != b->key) return key < b->key;
    if (est->total_bytes != b->est.total_bytes) return est->total_bytes < b->est.total_bytes;
    return order < b->order;
}

/* gt_plan_auto with every count moving in steps of at least min_stride (1: gt_plan_auto's own search),
 * and with `calib` (may be NULL) the cost a plan's recompute is ranked by.
 *
 * Without calib the cost is the recompute FLOPs. With calib it is the time model's: each part of
 * recompute_weights in seconds, so a plan's cost is its recompute time on the compute stream; the
 * PRICED least costly plans that fit are then priced in full (gt_plan_time: the step with its
 * communication, which recompute can expose or hide) and the fastest is chosen (*best_time, may be
 * NULL, gets its prediction).
 *
 * Bounded: a plan's cost needs no dry run once the weights are known, so the plans are tried in
 * order of cost and the search stops at the first cost above that of the last plan kept; only the
 * plans that recompute every block (whose tail gt_plan_keep_tail may keep, lowering their cost) are
 * all tried. Without calib the choice is the exhaustive search's: the least FLOPs that fit, then the
 * least memory, then the first in the enumeration; with nothing fitting, every plan is tried and the
 * smallest given. */
static int plan_auto(const gt_mem_shape *sh, uint64_t budget, int min_stride, const gt_calib *calib, gt_plan *best,
                     gt_mem_estimate *best_est, gt_time_estimate *best_time) {
    int N = sh->model.n_layers;
    int small_order = 0, n_kept = 0, cap_kept = calib ? PRICED : 1;
    kept_plan kept[PRICED];
    gt_plan plan;
    gt_mem_estimate est;
    gt_mem_estimate smallest_est;
    gt_plan smallest;
    int have_smallest = 0;
    /* Exhaustive up to 64 blocks (N^3/6 plans); beyond that every count moves in steps of N/64 so
     * the search stays near a second even at 1024 blocks. */
    int stride = N > 64 ? N / 64 : 1;
    if (stride < min_stride) stride = min_stride;
    size_t n_c = 0, cap = 1024;
    plan_cand *c = malloc(cap * sizeof *c);
    if (!c) abort();
    double w_block, w_sel, w_down;
    recompute_weights(sh, calib, &w_block, &w_sel, &w_down);
    int order = 0;
    for (int n_rec = 0; n_rec <= N; n_rec = next_count(n_rec, stride, N)) {
        for (int K = 1; K <= (n_rec > 0 ? n_rec : 1); K += stride) {
            for (int n_sel = 0; n_sel <= N - n_rec; n_sel = next_count(n_sel, stride, N - n_rec)) {
                if (n_c == cap) {
                    cap *= 2;
                    c = realloc(c, cap * sizeof *c);
                    if (!c) abort();
                }
                shaped_plan(&plan, N, n_rec, K, n_sel);
                c[n_c++] = (plan_cand){plan_recompute_flops(&plan, w_block, w_sel, w_down), n_rec, K, n_sel, order++};
            }
        }
    }
    qsort(c, n_c, sizeof *c, cand_cmp);
    /* the plans that recompute every block first, all of them; then the rest in order of cost */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n_c; i++) {
            int tail = c[i].n_rec == N;
            if (tail != (pass == 0)) continue;
            if (!tail && n_kept == cap_kept && c[i].key > kept[n_kept - 1].key) break;
            shaped_plan(&plan, N, c[i].n_rec, c[i].K, c[i].n_sel);
            if (tail) gt_plan_keep_tail(&plan, sh, &est); /* only then is the tail recomputed */
            else gt_plan_estimate(sh, &plan, &est);
            if (!have_smallest || est.total_bytes < smallest_est.total_bytes ||
                (est.total_bytes == smallest_est.total_bytes && c[i].order < small_order)) {
                smallest = plan;
                smallest_est = est;
                small_order = c[i].order;
                have_smallest = 1;
            }
            if (est.total_bytes > budget) continue;
            /* the tail kept lowers a plan's cost: the plan's own, not its candidate's */
            double key = tail ? plan_recompute_flops(&plan, w_block, w_sel, w_down) : c[i].key;
            int at = n_kept;
            while (at > 0 && kept_before(key, &est, c[i].order, &kept[at - 1])) at--;
            if (at >= cap_kept) continue;
            for (int k = n_kept < cap_kept ? n_kept : cap_kept - 1; k > at; k--) kept[k] = kept[k - 1];
            kept[at] = (kept_plan){plan, est, key, c[i].order};
            if (n_kept < cap_kept) n_kept++;
        }
    }
    free(c);
    if (!n_kept) {
        *best = smallest;
        *best_est = smallest_est;
        return -1;
    }
    int pick = 0;
    if (calib) { /* the fastest predicted step of those kept; on a tie (to a part in 1e9) the first */
        gt_time_estimate t, fastest;
        for (int k = 0; k < n_kept; k++) {
            gt_plan_time(sh, &kept[k].plan, calib, &t);
            if (k == 0 || fastest.step_s - t.step_s > 1e-9 * fastest.step_s) fastest = t, pick = k;
        }
        if (best_time) *best_time = fastest;
    }
    *best = kept[pick].plan;
    *best_est = kept[pick].est;
    return 0;
}

int gt_plan_auto(const gt_mem_shape *sh, uint64_t budget, gt_plan *best, gt_mem_estimate *best_est) {
    return plan_auto(sh, budget, 1, NULL, best, best_est, NULL);
}

/* shape at ZeRO stage st (0..3) with grad_sync micro (mi = 1) or step */
static gt_mem_shape at_stage(const gt_mem_shape *shape, int st, int mi) {
    gt_mem_shape s = *shape;
    s.stage = st;
    s.grad_micro = mi;
    return s;
}

/* The first lines: the model, the step's shape and the sharding the run uses. */
static void report_header(FILE *out, const gt_config *cfg, const gt_mem_shape *shape) {
    uint64_t P = gt_model_param_count(&shape->model);
    fprintf(out, "gtrain plan for %s\n", cfg->path);
    fprintf(out, "model: %llu parameters (%.3f B), %d blocks, dim %d, ffn %d, heads %d/%d kv, vocab %d\n",
            (unsigned long long)P, P / 1e9, shape->model.n_layers, shape->model.dim, shape->model.ffn_dim,
            shape->model.n_heads, shape->model.n_kv_heads, shape->model.vocab_size);
    int stage = shape->stage;
    fprintf(out, "micro-batch %d x %d tokens, grad_accum %d, %d-byte activations%s, world %d, shard %s%s%s%s\n\n",
            shape->micro_batch, shape->seq_len, shape->grad_accum, shape->act_bytes,
            shape->keep_probs ? ", attention probabilities kept" : "", shape->world, gt_shard_stage_name((gt_shard_stage)stage),
            cfg->dist.shard == GT_SHARD_AUTO ? " (auto)" : "",
            stage >= 2 ? (shape->grad_micro ? ", grad_sync micro" : ", grad_sync step") : "",
            stage >= 2 && cfg->dist.grad_sync == GT_GRAD_SYNC_AUTO ? " (auto)" : "");
}

/* Model state at recompute none for worlds 1, 2, 4, 8 and the run's; then the libraries' share. */
static void report_state_by_world(FILE *out, const gt_config *cfg, const gt_mem_shape *shape) {
    char b1[32], b2[32], b3[32], b4[32];
    int stage = shape->stage;
    fprintf(out, "model state per rank at recompute none (shard %s%s; params and grads are peaks: with ZeRO-3 "
                 "the shard plus gathered units, with grad_sync micro the slice plus unit accumulators):\n",
            gt_shard_stage_name((gt_shard_stage)stage), stage >= 2 ? (shape->grad_micro ? " / micro" : " / step") : "");
    fprintf(out, "  %6s %14s %14s %14s %14s\n", "world", "params", "grads", "optimizer", "state total");
    int worlds[] = {1, 2, 4, 8, shape->world};
    int n_worlds = shape->world == 1 || shape->world == 2 || shape->world == 4 || shape->world == 8 ? 4 : 5;
    gt_plan none;
    gt_policy pn = {GT_POLICY_NONE, 0};
    gt_plan_from_policy(&none, &pn, shape->model.n_layers);
    for (int w = 0; w < n_worlds; w++) {
        gt_mem_shape sw = *shape;
        sw.world = worlds[w];
        gt_mem_estimate e;
        gt_plan_estimate(&sw, &none, &e);
        gt_format_bytes(e.params_bytes, b1, sizeof b1);
        gt_format_bytes(e.grads_bytes, b2, sizeof b2);
        gt_format_bytes(e.optim_bytes, b3, sizeof b3);
        gt_format_bytes(e.params_bytes + e.grads_bytes + e.optim_bytes, b4, sizeof b4);
        fprintf(out, "  %5d%s %14s %14s %14s %14s\n", worlds[w], worlds[w] == shape->world ? "*" : " ", b1, b2,
                b3, b4);
    }
    if (!shape->library_bytes) return;
    gt_format_bytes(shape->library_bytes, b1, sizeof b1);
    uint64_t cudnn =
        cfg->train.cuda_attention == GT_CUDA_ATTENTION_CUDNN
            ? gt_plan_cudnn_scratch_bytes(&shape->model, shape->micro_batch, shape->seq_len)
            : 0;
    char b6[32] = "";
    if (cudnn) gt_format_bytes(cudnn, b6, sizeof b6);
    fprintf(out, "library workspaces per rank at world %d: %s (cuBLASLt %llu MiB%s%s%s), in every total below\n",
            shape->world, b1, (unsigned long long)(GT_CUDA_MATMUL_WORKSPACE_BYTES >> 20),
            gt_plan_uses_nccl(1, shape->world, cfg->dist.comm) ? ", NCCL buffers ~512 MiB (an estimate)"
                                                               : "; no NCCL communicator",
            cudnn ? ", cuDNN attention backward scratch " : "", b6);
}

/* The MPI reduce-scatters' host staging (gt_plan_staging_bytes): in every total. */
static void report_staging(FILE *out, const gt_mem_shape *shape) {
    uint64_t bytes = gt_plan_staging_bytes(shape, -1);
    if (!bytes) {
        fprintf(out, "reduce-scatter staging per rank: none (%s)\n",
                !shape->host_comm ? "the GPU's collectives: NCCL's buffers are in the libraries' share"
                : shape->world < 2 ? "one rank" : "shard none: an all-reduce");
        return;
    }
    char b[32], c[32], why[160];
    gt_format_bytes(bytes, b, sizeof b);
    gt_format_bytes(GT_COMM_MPI_STAGING_BYTES, c, sizeof c);
    if (shape->stage >= 2 && shape->grad_micro)
        snprintf(why, sizeof why, "grad_sync micro: the largest unit's, one unit in flight");
    else if (shape->bucket_mb > 0)
        snprintf(why, sizeof why, "the %d gradient buckets in flight at once that hold the most", GT_ZERO_BUCKETS_IN_FLIGHT);
    else
        snprintf(why, sizeof why, "the step's reduce-scatter, in chunks of at most %s", c);
    fprintf(out, "reduce-scatter staging per rank at world %d: %s (host memory, where MPI sums the ranks' pieces in "
                 "rank order; %s), in every total below\n", shape->world, b, why);
}

/* The asynchronous save's host copy (gt_plan_snapshot_bytes): host memory beside every total. */
static void report_snapshot(FILE *out, const gt_config *cfg, const gt_mem_shape *shape) {
    uint64_t bytes = gt_plan_snapshot_bytes(cfg, shape);
    if (!bytes) {
        fprintf(out, "async save host copy per rank: none (%s)\n",
                cfg->checkpoint.dir[0] ? "checkpoint.async = false" : "no checkpoint.dir");
        return;
    }
    char b[32];
    gt_format_bytes(bytes, b, sizeof b);
    fprintf(out, "async save host copy per rank at world %d: %s (checkpoint.async = true: master and both moments "
                 "of the rank's slice, 12 bytes per element; host memory beside the totals below, counted by the "
                 "memory check before step 1)\n", shape->world, b);
}

/* The memory snapshots' slots (gt_plan_memsnap_bytes): node-local shared memory beside every total. */
static void report_memsnap(FILE *out, const gt_config *cfg, const gt_plan_choice *choice) {
    const gt_mem_shape *shape = &choice->shape;
    uint64_t bytes = gt_plan_memsnap_bytes(cfg, shape, 0), with_copies = gt_plan_memsnap_bytes(cfg, shape, 1);
    if (bytes && choice->memsnap_off[0]) {
        fprintf(out, "memory snapshots per rank: none (checkpoint.memory_every = auto turns them off on this machine: "
                     "%s)\n", choice->memsnap_off);
        return;
    }
    if (!bytes) {
        fprintf(out, "memory snapshots per rank: none (%s)\n",
                cfg->checkpoint.dir[0] ? "checkpoint.memory_every = 0" : "no checkpoint.dir");
        return;
    }
    char b[32], c[32];
    gt_format_bytes(bytes, b, sizeof b);
    gt_format_bytes(with_copies, c, sizeof c);
    if (shape->world > 1)
        fprintf(out, "memory snapshots per rank at world %d: %s on one node, %s across nodes (checkpoint.memory_every: "
                     "2 slots of the rank's state slice, 12 bytes per element, in node-local shared memory, and across "
                     "nodes 2 copies of a partner's; host memory beside the totals below, counted by the memory check "
                     "before step 1)\n", shape->world, b, c);
    else
        fprintf(out, "memory snapshots per rank at world 1: %s (checkpoint.memory_every: 2 slots of the rank's state "
                     "slice, 12 bytes per element, in node-local shared memory; host memory beside the totals below, "
                     "counted by the memory check before step 1)\n", b);
}

/* Every stage the trainer runs, at the configured world, with the configured recompute policy (none
 * when it is auto). */
static void report_stages(FILE *out, const gt_mem_shape *shape, const gt_policy *configured, uint64_t budget) {
    gt_policy pol = configured->kind == GT_POLICY_AUTO ? (gt_policy){GT_POLICY_NONE, 0} : *configured;
    char pdesc[32];
    gt_policy_format(&pol, pdesc, sizeof pdesc);
    int A = shape->grad_accum > 0 ? shape->grad_accum : 1;
    fprintf(out, "\nper stage at world %d, recompute %s, grad_accum k = %d (peaks per rank; gather = ZeRO-3's "
                 "gathered units, buffers = unit gradient accumulators; comm = bytes a rank sends per step):\n",
            shape->world, pdesc, A);
    fprintf(out, "  %-26s %11s %11s %11s %11s %11s %11s %11s %11s  %s\n", "dist.shard / grad_sync", "params",
            "(gather)", "grads", "(buffers)", "optimizer", "activations", "total", "comm/step", "fits");
    for (int st = 0; st <= 3; st++) {
        for (int mi = 0; mi <= (st >= 2); mi++) {
            gt_mem_shape ss = at_stage(shape, st, mi);
            gt_plan plan;
            gt_mem_estimate e;
            gt_plan_for_policy(&plan, &pol, &ss, &e);
            char label[40], c[8][32];
            snprintf(label, sizeof label, "ZeRO-%d %s%s", st, gt_shard_stage_name((gt_shard_stage)st), st < 2 ? "" : mi ? " / micro" : " / step");
            uint64_t v[8] = {e.params_bytes, e.gather_bytes, e.grads_bytes, e.grad_buffer_bytes, e.optim_bytes,
                             e.act_peak_bytes, e.total_bytes, (uint64_t)e.comm_bytes};
            for (int k = 0; k < 8; k++) gt_format_bytes(v[k], c[k], sizeof c[k]);
            fprintf(out, "  %-26s %11s %11s %11s %11s %11s %11s %11s %11s  %s\n", label, c[0], c[1], c[2], c[3], c[4],
                    c[5], c[6], c[7], !budget ? "-" : e.total_bytes <= budget ? "yes" : "no");
        }
    }
    fprintf(out, "  (comm: the ring model of src/dist/comm.h; per-unit collectives at their mean (W-1)/W)\n");
}

/* One micro-batch's activations under each usual policy, and whether the total fits the budget. */
static void report_policies(FILE *out, const gt_mem_shape *shape, uint64_t budget) {
    char b1[32], b2[32], b5[32] = "";
    if (budget) gt_format_bytes(budget, b5, sizeof b5);
    fprintf(out, "\nactivations per rank (one micro-batch) and fit at world %d%s%s:\n", shape->world,
            budget ? ", budget " : " (no memory.budget set)", budget ? b5 : "");
    fprintf(out, "  %-12s %14s %14s %12s  %s\n", "policy", "activations", "total", "extra fwd", "fits");
    int N = shape->model.n_layers;
    const gt_policy shown[] = {{GT_POLICY_NONE, 0},         {GT_POLICY_SELECTIVE, 0},
                               {GT_POLICY_BLOCKS, N / 2},    {GT_POLICY_UNIFORM, N >= 4 ? 4 : N},
                               {GT_POLICY_SQRT, 0},          {GT_POLICY_FULL, 0}};
    for (int i = 0; i < 6; i++) {
        gt_policy pol;
        char name[32], err[128];
        gt_policy_format(&shown[i], name, sizeof name);
        if (gt_policy_parse(name, N, &pol, err, sizeof err) != 0) continue; /* sqrt's K, full's 1 */
        gt_plan plan;
        gt_mem_estimate e;
        gt_plan_for_policy(&plan, &pol, shape, &e);
        gt_format_bytes(e.act_peak_bytes, b1, sizeof b1);
        gt_format_bytes(e.total_bytes, b2, sizeof b2);
        double extra = 100.0 * e.recompute_flops / (3.0 * e.forward_flops);
        fprintf(out, "  %-12s %14s %14s %11.1f%%  %s\n", name, b1, b2, extra,
                !budget ? "-" : e.total_bytes <= budget ? "yes" : "no");
    }
    fprintf(out, "  (extra fwd: recompute FLOPs over one training step's 3 forwards' worth)\n");
}

/* The last line: what auto chose (gt_plan_resolve), or the configured policy. */
static void report_choice(FILE *out, const gt_config *cfg, const gt_plan_choice *c) {
    if (!c->chosen_by_auto) {
        fprintf(out, "\nconfigured policy: %s\n", cfg->memory.recompute);
        return;
    }
    uint64_t budget = cfg->memory.budget;
    char desc[256], b1[32], b2[32], b3[32], b5[32] = "";
    gt_plan_describe(&c->plan, desc, sizeof desc);
    gt_format_bytes(c->predicted.total_bytes, b1, sizeof b1);
    gt_format_bytes(c->predicted.act_peak_bytes, b2, sizeof b2);
    gt_format_bytes((uint64_t)c->predicted.comm_bytes, b3, sizeof b3);
    if (budget) gt_format_bytes(budget, b5, sizeof b5);
    if (c->fits) {
        fprintf(out, "\nauto: dist.shard %s, grad_sync %s, recompute %s\n  total %s (activations %s) fits %s%s "
                     "at the least predicted step time (+%.1f%% forward FLOPs, %s sent per step)\n",
                gt_shard_stage_name((gt_shard_stage)c->stage), c->stage < 2 ? "-" : c->grad_micro ? "micro" : "step", desc, b1, b2,
                budget ? "the budget " : "(no budget set)", b5,
                100.0 * c->predicted.recompute_flops / (3.0 * c->predicted.forward_flops), b3);
    } else {
        fprintf(out, "\nauto: nothing fits the budget %s; the smallest (dist.shard %s, %s) needs %s\n", b5,
                gt_shard_stage_name((gt_shard_stage)c->stage), desc, b1);
    }
    if (!c->bucket_auto) return;
    const gt_mem_shape *sh = &c->shape;
    double mib[GT_PLAN_BUCKET_SIZES];
    int n = gt_plan_bucket_sizes(&sh->model, mib);
    char tried[256] = "";
    for (int i = 0, at = 0; i < n && at < (int)sizeof tried; i++)
        at += snprintf(tried + at, sizeof tried - (size_t)at, "%s%.3g", i ? ", " : "", mib[i]);
    char v[32];
    for (int digits = 6; digits <= 17; digits++) { /* the shortest text that reads back as the size */
        snprintf(v, sizeof v, "%.*g", digits, sh->bucket_mb);
        if (strtod(v, NULL) == sh->bucket_mb) break;
    }
    if (sh->stage >= 1 && !(sh->stage >= 2 && sh->grad_micro) && sh->world > 1)
        fprintf(out, "  dist.bucket_mb auto: %s MiB (%s) at the least predicted step time (of %s MiB)\n", v,
                sh->bucket_mb > 0 ? "gradient buckets reduced during the last backward" : "one reduction after the backward",
                tried);
    else
        fprintf(out, "  dist.bucket_mb auto: 0 (buckets need grad_sync = step, a sharded stage and more than one rank)\n");
}

void gt_plan_report(FILE *out, const gt_config *cfg, const gt_plan_choice *choice) {
    /* the tables describe the shape the run would train with: auto's choice where something is auto */
    const gt_mem_shape *shape = &choice->shape;
    report_header(out, cfg, shape);
    report_state_by_world(out, cfg, shape);
    report_staging(out, shape);
    report_snapshot(out, cfg, shape);
    report_memsnap(out, cfg, choice);
    report_stages(out, shape, &choice->policy, cfg->memory.budget);
    report_policies(out, shape, cfg->memory.budget);
    report_choice(out, cfg, choice);
}

/* The option's shape at micro-batch B: the cuDNN attention scratch (in library_bytes) scales with it. */
static gt_mem_shape at_batch(const gt_mem_shape *base, int cudnn, int B, int grad_accum, int depth) {
    gt_mem_shape s = *base;
    if (cudnn && s.library_bytes)
        s.library_bytes = s.library_bytes - gt_plan_cudnn_scratch_bytes(&s.model, base->micro_batch, s.seq_len) +
                          gt_plan_cudnn_scratch_bytes(&s.model, B, s.seq_len);
    s.micro_batch = B;
    s.grad_accum = grad_accum;
    s.prefetch = depth;
    return s;
}

/* Faster first; on a tie (to a part in 1e9), the smaller total. */
static int option_before(const gt_plan_option *a, const gt_plan_option *b) {
    double ta = a->time.step_s, tb = b->time.step_s;
    if (fabs(ta - tb) > 1e-9 * (ta > tb ? ta : tb)) return ta < tb;
    return a->est.total_bytes < b->est.total_bytes;
}

/* Keeps the n best of the options offered so far, in order (an insertion into a short list). */
static void offer(gt_plan_option *list, int *n, int cap, const gt_plan_option *o) {
    int at = *n;
    while (at > 0 && option_before(o, &list[at - 1])) at--;
    if (at >= cap) return;
    int last = *n < cap ? *n : cap - 1;
    for (int i = last; i > at; i--) list[i] = list[i - 1];
    list[at] = *o;
    if (*n < cap) (*n)++;
}

/* The recompute plan of one (micro-batch, prefetch, stage, grad_sync): the fixed policy's, or with
 * auto the fastest of the least costly that fit (plan_auto, at the search's rates; counts in strides
 * of min_stride blocks). 1 when it fits, and then o->time is its predicted step. */
static int option_plan(gt_plan_option *o, const gt_plan_search *s, int min_stride) {
    uint64_t budget = s->budget ? s->budget : UINT64_MAX;
    if (!s->policy || s->policy->kind == GT_POLICY_AUTO)
        return plan_auto(&o->shape, budget, min_stride, s->calib, &o->plan, &o->est, &o->time) == 0;
    gt_plan_for_policy(&o->plan, s->policy, &o->shape, &o->est);
    if (o->est.total_bytes > budget) return 0;
    gt_plan_time(&o->shape, &o->plan, s->calib, &o->time);
    return 1;
}

static int cmp_double(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return (a > b) - (a < b);
}

int gt_plan_bucket_sizes(const gt_model_config *m, double *mib) {
    uint64_t Ue, Ub, Uh;
    gt_unit_sizes(m, &Ue, &Ub, &Uh);
    double block = (double)Ub * 4 / 1048576.0;
    double all[] = {1, 4, 16, 64, block, 2 * block, 4 * block};
    qsort(all, sizeof all / sizeof all[0], sizeof all[0], cmp_double);
    int n = 0;
    mib[n++] = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i] > 0 && all[i] <= 1024 && all[i] != mib[n - 1] && n < GT_PLAN_BUCKET_SIZES) mib[n++] = all[i];
    return n;
}

/* dist.bucket_mb = auto: where buckets apply to the option (zero.h: grad_sync step, a sharded stage,
 * more than one rank), its step priced at each size of gt_plan_bucket_sizes and the fastest kept (on a
 * tie, to a part in 1e9, the first: 0, one reduction); elsewhere 0. The recompute plan stays the one
 * chosen at the option's own size: a bucket's size changes no tracked memory. */
static void option_bucket(gt_plan_option *o, const gt_plan_search *s) {
    gt_mem_shape *sh = &o->shape;
    int applies = sh->stage >= 1 && !(sh->stage >= 2 && sh->grad_micro) && sh->world > 1;
    if (!applies) {
        if (sh->bucket_mb != 0) sh->bucket_mb = 0, gt_plan_time(sh, &o->plan, s->calib, &o->time);
        return;
    }
    double mib[GT_PLAN_BUCKET_SIZES];
    int n = gt_plan_bucket_sizes(&sh->model, mib);
    gt_mem_shape best = *sh;
    gt_time_estimate best_t;
    for (int i = 0; i < n; i++) {
        gt_mem_shape t = *sh;
        t.bucket_mb = mib[i];
        gt_time_estimate tt;
        gt_plan_time(&t, &o->plan, s->calib, &tt);
        if (i == 0 || best_t.step_s - tt.step_s > 1e-9 * best_t.step_s) best = t, best_t = tt;
    }
    o->shape = best;
    o->time = best_t;
}

int gt_plan_auto_all(const gt_mem_shape *base, const gt_plan_search *s, gt_plan_option *best, gt_plan_option *top,
                     int *n_top) {
    int N = base->model.n_layers;
    int recompute_auto = !s->policy || s->policy->kind == GT_POLICY_AUTO;
    /* the coarse pass: recompute counts in steps of N/8 blocks; its fastest GT_PLAN_TOP are refined */
    int coarse = recompute_auto && N >= 16 ? N / 8 : 1;
    int batches[64], n_b = 0;
    if (s->per_rank > 0) {
        for (int b = 1; b <= s->per_rank && b <= 1 << 16; b++)
            if (s->per_rank % b == 0 && n_b < 64) batches[n_b++] = b;
    } else {
        batches[n_b++] = base->micro_batch;
    }
    int depths[3] = {s->prefetch}, n_d = 1;
    if (s->prefetch < 0) depths[0] = 0, depths[1] = 1, depths[2] = 2, n_d = 3;
    gt_plan_option list[GT_PLAN_TOP], small, o;
    int n = 0, have_small = 0;
    for (int bi = 0; bi < n_b; bi++) {
        int B = batches[bi], A = s->per_rank > 0 ? s->per_rank / B : base->grad_accum;
        for (int di = 0; di < n_d; di++) {
            /* ZeRO-3 first: its dry runs record the gather and accumulator peaks the others reuse */
            for (int st = 3; st >= 0; st--) {
                if (s->stage >= 0 && st != s->stage) continue;
                /* prefetch only matters to ZeRO-3: below it, the configured depth (1 when auto) */
                if (st < 3 && depths[di] != (s->prefetch < 0 ? 1 : s->prefetch)) continue;
                for (int mi = 0; mi <= (st >= 2); mi++) {
                    if (st >= 2 && s->grad_micro >= 0 && mi != s->grad_micro) continue;
                    gt_mem_shape sb = at_batch(base, s->cudnn, B, A, depths[di]);
                    o.shape = at_stage(&sb, st, mi);
                    int fits = option_plan(&o, s, coarse);
                    if (!have_small || o.est.total_bytes < small.est.total_bytes) small = o, have_small = 1;
                    if (!fits) continue; /* the time model prices only what fits */
                    if (s->bucket_auto) option_bucket(&o, s);
                    offer(list, &n, GT_PLAN_TOP, &o);
                }
            }
        }
    }
    if (!n) {
        *best = small;
        gt_plan_time(&best->shape, &best->plan, s->calib, &best->time);
        if (n_top) *n_top = 0;
        return -1;
    }
    if (coarse > 1) { /* the coarse pass's fastest, at the full search's resolution */
        gt_plan_option fine[GT_PLAN_TOP];
        int n_fine = 0;
        for (int i = 0; i < n; i++) {
            o = list[i];
            /* the full search's plan, unless the coarse one is predicted faster (the full search
             * prices only its own PRICED least costly plans in full) */
            if (!option_plan(&o, s, 1)) o = list[i];
            else if (s->bucket_auto) option_bucket(&o, s);
            if (!option_before(&o, &list[i])) o = list[i];
            offer(fine, &n_fine, GT_PLAN_TOP, &o);
        }
        memcpy(list, fine, sizeof fine);
        n = n_fine;
    }
    *best = list[0];
    if (top) memcpy(top, list, (size_t)n * sizeof *list);
    if (n_top) *n_top = n;
    return 0;
}

gt_mem_shape gt_plan_shape(const gt_config *cfg, int cuda, int act_bytes, int keep_probs, int world) {
    int stage = cfg->dist.shard == GT_SHARD_AUTO ? 0 : (int)cfg->dist.shard; /* auto: 0 until gt_plan_resolve chooses */
    /* micro_batch and prefetch auto: 1 until gt_plan_resolve chooses */
    int B = cfg->train.micro_batch > 0 ? cfg->train.micro_batch : 1;
    int depth = cfg->dist.prefetch >= 0 ? cfg->dist.prefetch : 1;
    gt_mem_shape shape = {cfg->model, B, cfg->train.seq_len, act_bytes, keep_probs, world,
                          gt_plan_library_bytes(cuda, world, cfg->dist.comm, cfg->train.cuda_attention, &cfg->model,
                                                B, cfg->train.seq_len),
                          stage, cfg->dist.grad_sync == GT_GRAD_SYNC_MICRO, cfg->train.grad_accum, depth,
                          cfg->data.document_mask || cfg->data.reset_positions,
                          cfg->dist.bucket_mb > 0 ? cfg->dist.bucket_mb : 0, /* auto: 0 until gt_plan_resolve */
                          cfg->dist.overlap_param_gather, !cuda};
    return shape;
}

/* train.global_batch on `world` ranks: the micro-batch and grad_accum it leaves (*per_rank > 0: the
 * micro-batch is searched over its divisors). 0, or -1 with err. */
static int settle_batch(const gt_config *cfg, gt_mem_shape *shape, int *per_rank, char *err, size_t err_len) {
    int W = shape->world > 0 ? shape->world : 1, G = cfg->train.global_batch, B = cfg->train.micro_batch;
    int A = cfg->train.grad_accum, accum_set = gt_config_key_line(cfg, "train", "grad_accum") != 0;
    char where[GT_PATH_MAX + 128];
    *per_rank = 0;
    if (G <= 0) {
        if (B != GT_INT_AUTO) return 0;
        gt_config_where(cfg, "train", "micro_batch", where, sizeof where);
        snprintf(err, err_len, "%s: micro_batch auto needs train.global_batch (expected global_batch = sequences per "
                 "optimizer step over all ranks, or a number for micro_batch)", where);
        return -1;
    }
    if (G % W != 0) {
        gt_config_where(cfg, "train", "global_batch", where, sizeof where);
        snprintf(err, err_len, "%s: global_batch %d is not a multiple of the %d ranks (expected global_batch = "
                 "micro_batch x grad_accum x ranks)", where, G, W);
        return -1;
    }
    int R = G / W;
    if (B != GT_INT_AUTO) {
        if (R % B != 0 || (accum_set && A != R / B)) {
            gt_config_where(cfg, "train", R % B != 0 ? "global_batch" : "grad_accum", where, sizeof where);
            if (R % B != 0)
                snprintf(err, err_len, "%s: global_batch %d is not a multiple of micro_batch %d x %d ranks (expected "
                         "global_batch = micro_batch x grad_accum x ranks)", where, G, B, W);
            else
                snprintf(err, err_len, "%s: grad_accum %d disagrees with global_batch %d = micro_batch %d x grad_accum "
                         "%d x %d ranks (expected grad_accum %d, or leave it out: it follows from global_batch)",
                         where, A, G, B, R / B, W, R / B);
            return -1;
        }
        shape->micro_batch = B;
        shape->grad_accum = R / B;
    } else if (accum_set) {
        if (R % A != 0) {
            gt_config_where(cfg, "train", "grad_accum", where, sizeof where);
            snprintf(err, err_len, "%s: grad_accum %d x %d ranks does not divide global_batch %d (expected "
                     "global_batch = micro_batch x grad_accum x ranks, or leave grad_accum out)", where, A, W, G);
            return -1;
        }
        shape->micro_batch = R / A;
        shape->grad_accum = A;
    } else {
        *per_rank = R;
    }
    return 0;
}

int gt_plan_resolve(const gt_config *cfg, const gt_mem_shape *base, const gt_calib *calib, gt_plan_choice *c,
                    char *err, size_t err_len) {
    memset(c, 0, sizeof *c);
    if (gt_policy_parse(cfg->memory.recompute, cfg->model.n_layers, &c->policy, err, err_len) != 0) return -1;
    int stage = cfg->dist.shard == GT_SHARD_AUTO ? -1 : (int)cfg->dist.shard;
    int want_micro = cfg->dist.grad_sync == GT_GRAD_SYNC_AUTO ? -1 : cfg->dist.grad_sync == GT_GRAD_SYNC_MICRO;
    c->shape = *base;
    int per_rank;
    if (settle_batch(cfg, &c->shape, &per_rank, err, err_len) != 0) return -1;
    int cudnn = cfg->train.cuda_attention == GT_CUDA_ATTENTION_CUDNN;
    if (c->shape.micro_batch != base->micro_batch) c->shape = at_batch(base, cudnn, c->shape.micro_batch,
                                                                       c->shape.grad_accum, base->prefetch);
    c->bucket_auto = cfg->dist.bucket_mb == GT_DOUBLE_AUTO;
    c->chosen_by_auto = stage < 0 || c->policy.kind == GT_POLICY_AUTO || (stage >= 2 && want_micro < 0) ||
                        per_rank > 0 || cfg->dist.prefetch == GT_INT_AUTO || c->bucket_auto;
    c->fits = 1;
    if (c->chosen_by_auto) {
        gt_plan_search s = {stage, want_micro, &c->policy, per_rank, cfg->dist.prefetch == GT_INT_AUTO ? -1 : c->shape.prefetch,
                            cfg->memory.budget, calib, cudnn, c->bucket_auto};
        gt_plan_option best;
        c->fits = gt_plan_auto_all(&c->shape, &s, &best, c->top, &c->n_top) == 0;
        c->shape = best.shape;
        c->plan = best.plan;
        c->time = best.time;
        stage = c->shape.stage;
    }
    c->stage = stage;
    c->grad_micro = stage >= 2 && c->shape.grad_micro;
    c->shape.stage = stage;
    c->shape.grad_micro = c->grad_micro;
    if (c->chosen_by_auto) gt_plan_estimate(&c->shape, &c->plan, &c->predicted);
    else gt_plan_for_policy(&c->plan, &c->policy, &c->shape, &c->predicted); /* the tail kept when that is free */
    return 0;
}

/* The time model's recorder: the dry run's op costs and unit-hook calls as a trace (timemodel.h),
 * ZeRO's dry machine behind the hooks as in dry_run. */
typedef struct time_rec {
    gt_time_trace tr;
    const gt_calib *calib;
    double in_step;         /* the in-step factor of the plan's micro-batch size (calib.h) */
    gt_unit_hooks inner;
    int stage3, micro, buckets, pgather, n_units;
    int *pref, *gref;       /* per unit: params / grads calls open */
    double *unit_elems;
    double e;
} time_rec;

static void rec_cost(void *ctx, const gt_op_cost *cost) {
    time_rec *r = ctx;
    double sec = gt_time_op_seconds_at(r->calib, cost, r->in_step);
    gt_time_trace_push_op(&r->tr, cost, sec);
    r->tr.kind_s[cost->kind] += sec;
    r->tr.flops += cost->flops;
}
static void *rec_params(void *ctx, int u) {
    time_rec *r = ctx;
    if (r->stage3 && r->pref[u]++ == 0) gt_time_trace_push(&r->tr, GT_TEV_GATHER, 0, r->unit_elems[u] * r->e);
    if (r->pgather && !r->pref[u]) { /* the forward's first use of the unit: its gather's wait (zero.h) */
        r->pref[u] = 1;
        gt_time_trace_push(&r->tr, GT_TEV_GATHER, 0, r->unit_elems[u] * r->e);
    }
    return r->inner.params(r->inner.ctx, u);
}
static void rec_params_done(void *ctx, int u) {
    time_rec *r = ctx;
    if (r->stage3) r->pref[u]--;
    r->inner.params_done(r->inner.ctx, u);
}
static float *rec_grads(void *ctx, int u) {
    time_rec *r = ctx;
    r->gref[u]++;
    return r->inner.grads(r->inner.ctx, u);
}
static void rec_grads_done(void *ctx, int u) {
    time_rec *r = ctx;
    if (--r->gref[u] == 0 && (r->micro || r->buckets))
        gt_time_trace_push(&r->tr, GT_TEV_GRAD_DONE, 0, r->unit_elems[u] * 4);
    r->inner.grads_done(r->inner.ctx, u);
}
/* The executor announces its order of acquisitions from a dry twin run first (model.c,
 * announce_schedule), whose ops report to the same listener: everything recorded before this call is
 * the twin's, not the micro-batch's, and is dropped. */
static void rec_schedule(void *ctx, const int *units, int n) {
    time_rec *r = ctx;
    r->tr.n = 0;
    if (r->pgather) memset(r->pref, 0, (size_t)r->n_units * sizeof *r->pref); /* the twin's uses, not ours */
    r->tr.compute_s = r->tr.flops = 0;
    memset(r->tr.kind_s, 0, sizeof r->tr.kind_s);
    if (r->inner.schedule) r->inner.schedule(r->inner.ctx, units, n);
}
static void rec_progress(void *ctx) {
    time_rec *r = ctx;
    if (r->inner.progress) r->inner.progress(r->inner.ctx);
}
static void rec_micro_end(void *ctx) {
    time_rec *r = ctx;
    if (r->micro) gt_time_trace_push(&r->tr, GT_TEV_MICRO_END, 0, 0);
    if (r->inner.micro_end) r->inner.micro_end(r->inner.ctx);
}

/* One micro-batch of `plan` on the dry model, recorded. */
static void time_record(const gt_mem_shape *sh, const gt_plan *plan, const gt_calib *calib, time_rec *r) {
    gt_model *dry = dry_model(sh);
    memset(r, 0, sizeof *r);
    r->calib = calib;
    r->in_step = calib ? gt_calib_in_step_at(calib, sh->micro_batch) : 1; /* it grows with the size (calib.h) */
    r->stage3 = sh->stage == 3;
    r->micro = sh->stage >= 2 && sh->grad_micro;
    r->buckets = !r->micro && sh->stage >= 1 && sh->world > 1 && sh->bucket_mb > 0; /* zero.h's buckets */
    r->pgather = (sh->stage == 1 || sh->stage == 2) && sh->world > 1 && sh->overlap_param_gather;
    r->e = sh->act_bytes;
    r->n_units = gt_model_n_units(&sh->model);
    r->pref = calloc((size_t)r->n_units, sizeof *r->pref);
    r->gref = calloc((size_t)r->n_units, sizeof *r->gref);
    r->unit_elems = calloc((size_t)r->n_units, sizeof *r->unit_elems);
    if (!r->pref || !r->gref || !r->unit_elems) abort();
    uint64_t Ue, Ub, Uh;
    gt_unit_sizes(&sh->model, &Ue, &Ub, &Uh);
    for (int u = 0; u < r->n_units; u++) r->unit_elems[u] = (double)(u == 0 ? Ue : u == r->n_units - 1 ? Uh : Ub);
    gt_zero z;
    gt_zero_init_dry(&z, gt_model_layout(dry), 3, 1, sh->prefetch, sh->act_bytes);
    gt_zero_hooks(&z, &r->inner);
    gt_unit_hooks h = {r, rec_params, rec_params_done, rec_grads, rec_grads_done, rec_schedule, rec_progress,
                       rec_micro_end};
    gt_model_set_unit_hooks(dry, &h);
    gt_ops_dry_set_cost(rec_cost, r);
    gt_model_dry_train_micro(dry, plan, sh->micro_batch, sh->seq_len);
    gt_ops_dry_set_cost(NULL, NULL);
    gt_model_set_unit_hooks(dry, NULL);
    gt_zero_free(&z);
    free(r->pref);
    free(r->gref);
    free(r->unit_elems);
}

/* The compute seconds of one micro-batch of `plan` on the dry schedule. */
static double record_compute_s(const gt_mem_shape *sh, const gt_plan *plan, const gt_calib *calib) {
    time_rec r;
    time_record(sh, plan, calib, &r);
    double sec = r.tr.compute_s;
    gt_time_trace_free(&r.tr);
    return sec;
}

void gt_plan_time(const gt_mem_shape *sh, const gt_plan *plan, const gt_calib *calib, gt_time_estimate *t) {
    time_rec run, base;
    time_record(sh, plan, calib, &run);
    gt_plan none;
    gt_policy pn = {GT_POLICY_NONE, 0};
    gt_plan_from_policy(&none, &pn, sh->model.n_layers);
    time_record(sh, &none, calib, &base);
    gt_mem_estimate est;
    gt_plan_estimate(sh, plan, &est);
    uint64_t P = gt_model_param_count(&sh->model), W = (uint64_t)(sh->world > 0 ? sh->world : 1);
    int sharded = sh->stage >= 1 && W > 1;
    uint64_t slice = sh->stage >= 1 ? (P + W - 1) / W : P;
    gt_time_step st = {(int)W, sh->stage, sh->stage >= 2 && sh->grad_micro, sh->grad_accum, sh->prefetch,
                       sh->act_bytes, sharded ? slice * W : P, slice,
                       (double)sh->micro_batch * sh->seq_len, 3.0 * est.forward_flops,
                       sharded && !(sh->stage >= 2 && sh->grad_micro) ? sh->bucket_mb * 1048576.0 : 0,
                       sharded && sh->stage <= 2 && sh->overlap_param_gather};
    gt_time_simulate(&run.tr, &st, calib, t);
    double A = sh->grad_accum > 0 ? sh->grad_accum : 1, extra = run.tr.compute_s - base.tr.compute_s;
    t->recompute_s = extra > 0 ? A * extra : 0;
    for (int k = 0; k < 4; k++) t->kind_s[k] = A * run.tr.kind_s[k];
    gt_time_trace_free(&run.tr);
    gt_time_trace_free(&base.tr);
}

/* dist.bucket_mb as the search left it, right-aligned in 11 columns: "-" where buckets do not apply */
static void bucket_text(const gt_mem_shape *sh, char *out, size_t len) {
    int applies = sh->stage >= 1 && !(sh->stage >= 2 && sh->grad_micro) && sh->world > 1;
    char v[16];
    if (applies) snprintf(v, sizeof v, "%.4g", sh->bucket_mb);
    else snprintf(v, sizeof v, "-");
    snprintf(out, len, "%11s", v);
}

void gt_plan_report_time(FILE *out, const gt_plan_choice *c, const gt_calib *calib, const char *note) {
    gt_time_estimate t;
    gt_plan_time(&c->shape, &c->plan, calib, &t);
    const char *mark = t.measured ? "" : " (from defaults, not measured)";
    fprintf(out, "\npredicted step%s: %.1f ms, %.0f tokens/s (world %d)", mark, t.step_s * 1e3, t.tokens_per_s,
            c->shape.world);
    if (t.mfu > 0) fprintf(out, ", MFU %.1f%%", 100.0 * t.mfu);
    fprintf(out, "\n  compute %.1f ms (recompute %.1f ms, %.1f%%; optimizer %.1f ms), communication %.1f ms of which "
                 "exposed %.1f ms\n",
            t.compute_s * 1e3, t.recompute_s * 1e3, t.step_s > 0 ? 100.0 * t.recompute_s / t.step_s : 0,
            t.optimizer_s * 1e3, t.comm_s * 1e3, t.exposed_comm_s * 1e3);
    fprintf(out, "  micro-batches' kernels: matmul %.1f ms, attention %.1f ms, memory-bound %.1f ms\n",
            t.kind_s[GT_COST_MATMUL] * 1e3, t.kind_s[GT_COST_ATTENTION] * 1e3, t.kind_s[GT_COST_MEMORY] * 1e3);
    fprintf(out, "  rates: %s\n", note);
    if (!c->chosen_by_auto || !c->n_top) return;
    fprintf(out, "\nthe %d fastest plans that fit%s (auto chose the first):\n", c->n_top, mark);
    fprintf(out, "  %-2s %-28s %7s %6s %8s %s%11s %10s  %s\n", "#", "dist.shard / grad_sync", "micro", "accum",
            "prefetch", c->bucket_auto ? " bucket MiB" : "", "total", "step ms", "recompute");
    for (int i = 0; i < c->n_top; i++) {
        const gt_plan_option *o = &c->top[i];
        char label[48], total[32], desc[256];
        int st = o->shape.stage;
        snprintf(label, sizeof label, "ZeRO-%d %s%s", st, gt_shard_stage_name((gt_shard_stage)st),
                 st < 2 ? "" : o->shape.grad_micro ? " / micro" : " / step");
        gt_format_bytes(o->est.total_bytes, total, sizeof total);
        gt_plan_describe(&o->plan, desc, sizeof desc);
        char depth[8] = "-", bucket[24] = "";
        if (st == 3) snprintf(depth, sizeof depth, "%d", o->shape.prefetch);
        if (c->bucket_auto) bucket_text(&o->shape, bucket, sizeof bucket);
        fprintf(out, "  %-2d %-28s %7d %6d %8s %s%11s %10.1f  %s\n", i + 1, label, o->shape.micro_batch,
                o->shape.grad_accum > 0 ? o->shape.grad_accum : 1, depth, bucket, total, o->time.step_s * 1e3, desc);
    }
}
