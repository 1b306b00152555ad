/*
 * planner.c — memory model and recompute planner (see planner.h).
 *
 * Model state per rank (DESIGN.md, ZeRO-1): working params P*e + fp32 grads 4P + (master +
 * exp_avg + exp_avg_sq) 12P/W, with P padded up to a multiple of W when sharded.
 *
 * Activations: with x the bytes of one block input and I what a block keeps beyond it, the seed's
 * closed forms are none N(x+I), full N x + I, uniform:K (N/K) x + K(x+I), blocks:K K x + (N-K)(x+I) + I.
 * The exact figure below walks the executor's allocation order (model.c) with byte sizes only:
 * forward keeps block inputs and stashes, each block adds its output and its transients while it
 * runs; the head adds the normed output, its gradient, loss rows and one chunk of logits; backward holds dx and one scratch
 * region, re-creates a recompute segment's stashes and frees each block's memory after its backward.
 *
 * Compute: a recomputed block costs one more block forward (3F -> 4F at most, +33%), less the
 * down-projection for the last block of each segment (its output is the next segment's kept input,
 * so model.c does not recompute it); selective costs one more attention-score product (QK^T) per block.
 */
#include "planner.h"
#include "zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct sizes {
    uint64_t x, kv, ff, row, lse, probs, logits;
    uint64_t stash_all, stash_all_probs, stash_sel;
    uint64_t scratch;
} sizes;

static sizes make_sizes(const gt_mem_shape *sh) {
    const gt_model_config *m = &sh->model;
    uint64_t B = (uint64_t)sh->micro_batch, T = (uint64_t)sh->seq_len, BT = B * T;
    uint64_t e = (uint64_t)sh->act_bytes;
    uint64_t HD = (uint64_t)(m->dim / m->n_heads), KVD = (uint64_t)m->n_kv_heads * HD;
    sizes s;
    s.x = BT * (uint64_t)m->dim * e;
    s.kv = BT * KVD * e;
    s.ff = BT * (uint64_t)m->ffn_dim * e;
    s.row = BT * 4;
    s.lse = B * (uint64_t)m->n_heads * T * 4;
    s.probs = B * (uint64_t)m->n_heads * T * T * 4;
    s.logits = (uint64_t)gt_head_rows(m, (int)BT, (int)e) * (uint64_t)m->vocab_size * e;
    /* xn1 q att x2 xn2 (5x), k v, rstd1 rstd2, lse, gate up h */
    s.stash_all = 5 * s.x + 2 * s.kv + 2 * s.row + s.lse + 3 * s.ff;
    s.stash_all_probs = s.stash_all + (sh->keep_probs ? s.probs : 0);
    s.stash_sel = s.stash_all - 2 * s.x - s.ff; /* minus xn1, xn2, h */
    uint64_t big = 2 * s.ff > s.x + 2 * s.kv ? 2 * s.ff : s.x + 2 * s.kv;
    s.scratch = 2 * s.x + big;
    return s;
}

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

static int segment_start(const gt_plan *plan, int last) {
    int a = last;
    while (a > 0 && plan->keep[a] == GT_KEEP_RECOMPUTE && !plan->seg_start[a]) a--;
    return a;
}

/* The activation high-water mark of one training micro-batch (model.c's order, bytes only). */
static uint64_t act_peak(const sizes *s, const gt_plan *plan) {
    int N = plan->n_blocks;
    uint64_t held = s->x, peak = held; /* x_0, the embedding output */
    for (int a = 0; a < N;) {
        int b = gt_plan_segment_end(plan, a);
        for (int i = a; i < b; i++) {
            int keep = plan->keep[i];
            uint64_t alloc = keep == GT_KEEP_ALL ? s->stash_all_probs : s->stash_all;
            uint64_t kept = keep == GT_KEEP_ALL ? s->stash_all_probs : keep == GT_KEEP_SELECTIVE ? s->stash_sel : 0;
            peak = max_u64(peak, held + alloc + s->x);
            held += s->x + kept;
            if (keep == GT_KEEP_RECOMPUTE && i > a) held -= s->x;
        }
        a = b;
    }
    /* head: xf, rstdf, losses, lse, dxf and one chunk of logits; then the chunk, losses and lse go,
     * dx comes */
    peak = max_u64(peak, held + 2 * s->x + 3 * s->row + s->logits);
    peak = max_u64(peak, held + 3 * s->x + s->row);
    /* dxf, rstdf, xf and x_N are freed, dx stays: held is unchanged; the scratch region comes */
    held += s->scratch;
    peak = max_u64(peak, held);
    for (int b = N; b > 0;) {
        int a = segment_start(plan, b - 1);
        if (plan->keep[a] == GT_KEEP_RECOMPUTE) {
            for (int i = a; i < b; i++) {
                held += s->stash_all_probs + (i + 1 < b ? s->x : 0);
                peak = max_u64(peak, held);
            }
            for (int i = b - 1; i >= a; i--) held -= s->stash_all_probs + s->x;
        } else {
            /* a selective block re-creates h, then xn2, then xn1, one at a time */
            uint64_t transient = plan->keep[a] == GT_KEEP_SELECTIVE ? max_u64(s->ff, s->x) : 0;
            peak = max_u64(peak, held + transient);
            held -= (plan->keep[a] == GT_KEEP_ALL ? s->stash_all_probs : s->stash_sel) + s->x;
        }
        b = a;
    }
    return peak;
}

uint64_t gt_model_param_count(const gt_model_config *m) {
    uint64_t C = (uint64_t)m->dim, F = (uint64_t)m->ffn_dim, V = (uint64_t)m->vocab_size;
    uint64_t KVD = (uint64_t)m->n_kv_heads * (C / (uint64_t)m->n_heads);
    uint64_t per_layer = 2 * C * C + 2 * KVD * C + 3 * C * F + 2 * C;
    return (m->tie_word_embeddings ? 1 : 2) * V * C + (uint64_t)m->n_layers * per_layer + C;
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

int gt_plan_uses_nccl(int cuda, int world, gt_comm_choice comm) {
    return cuda && (comm == GT_COMM_NCCL || (comm == GT_COMM_AUTO && world > 1));
}

/* GTRAIN_CUDA_ATTENTION is read by the CUDA backend (wmma_selected, cuda_attention_wmma.cu); the
 * planner only needs to know whether it names cuDNN. */
static int cudnn_attention_asked(void) {
    const char *e = getenv("GTRAIN_CUDA_ATTENTION");
    return e && strcmp(e, "cudnn") == 0;
}

uint64_t gt_plan_cudnn_scratch_bytes(const gt_model_config *m, int micro_batch, int seq_len) {
    uint64_t rows = (uint64_t)micro_batch * (uint64_t)m->n_heads * (uint64_t)seq_len;
    return rows * 4 * (1 + (uint64_t)(m->dim / m->n_heads));
}

uint64_t gt_plan_library_bytes(int cuda, int world, gt_comm_choice comm, const gt_model_config *m, int micro_batch,
                               int seq_len) {
    if (!cuda) return 0;
    return GT_PLAN_CUBLASLT_WORKSPACE + (gt_plan_uses_nccl(cuda, world, comm) ? GT_PLAN_NCCL_BUFFERS : 0) +
           (cudnn_attention_asked() ? gt_plan_cudnn_scratch_bytes(m, micro_batch, seq_len) : 0);
}

void gt_unit_sizes(const gt_model_config *m, uint64_t *embed, uint64_t *block, uint64_t *head) {
    uint64_t C = (uint64_t)m->dim, F = (uint64_t)m->ffn_dim, V = (uint64_t)m->vocab_size;
    uint64_t KVD = (uint64_t)m->n_kv_heads * (C / (uint64_t)m->n_heads);
    *embed = V * C;
    *block = 2 * C * C + 2 * KVD * C + 3 * C * F + 2 * C;
    *head = C + (m->tie_word_embeddings ? 0 : V * C);
}

/* ZeRO model state (zero.h, optim.c, model.c's unit order): working parameters, gradients and
 * what they hold at their high-water marks, and the ring-model bytes of one step. */
static void zero_state(const gt_mem_shape *sh, const gt_plan *plan, gt_mem_estimate *est) {
    uint64_t P = gt_model_param_count(&sh->model);
    uint64_t W = (uint64_t)(sh->world > 0 ? sh->world : 1);
    int stage = sh->stage ? sh->stage : (sh->shard_optimizer ? 1 : 0);
    int micro = stage >= 2 && sh->grad_micro;
    int sharded = stage >= 1 && W > 1;
    uint64_t slice = stage >= 1 ? (P + W - 1) / W : P;
    uint64_t n_pad = sharded ? slice * W : P;
    uint64_t e = (uint64_t)sh->act_bytes;
    uint64_t Ue, Ub, Uh, t = (uint64_t)sh->model.tie_word_embeddings, N = (uint64_t)sh->model.n_layers;
    gt_unit_sizes(&sh->model, &Ue, &Ub, &Uh);
    est->optim_bytes = slice * 12;
    if (stage == 3 || micro) /* zero.c's own state machine, replayed over model.c's order of unit calls */
        gt_zero_predict(&sh->model, plan, stage, micro, sh->prefetch, sh->act_bytes, &est->gather_bytes,
                        &est->grad_buffer_bytes);
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

void gt_plan_estimate(const gt_mem_shape *sh, const gt_plan *plan, gt_mem_estimate *est) {
    memset(est, 0, sizeof *est);
    sizes s = make_sizes(sh);
    zero_state(sh, plan, est);
    /* token ids (inputs, targets) and the RoPE cos/sin table (max_seq_len, HD/2, 2) fp32 */
    est->workspace_bytes = 2 * (uint64_t)sh->micro_batch * (uint64_t)sh->seq_len * 4 +
                           (uint64_t)sh->model.max_seq_len * (uint64_t)(sh->model.dim / sh->model.n_heads) * 4;
    est->act_peak_bytes = act_peak(&s, plan);
    est->library_bytes = sh->library_bytes;
    est->total_bytes = est->params_bytes + est->grads_bytes + est->optim_bytes + est->workspace_bytes +
                       est->act_peak_bytes + est->library_bytes;
    double block, head, scores, down;
    forward_flops(sh, &block, &head, &scores, &down);
    est->forward_flops = block * sh->model.n_layers + head;
    for (int i = 0; i < plan->n_blocks; i++) {
        if (plan->keep[i] == GT_KEEP_RECOMPUTE) {
            est->recompute_flops += block;
            if (gt_plan_segment_end(plan, i) == i + 1) est->recompute_flops -= down; /* segment's last */
        } else if (plan->keep[i] == GT_KEEP_SELECTIVE) {
            est->recompute_flops += scores;
        }
    }
}

int gt_plan_keep_tail(gt_plan *plan, const gt_mem_shape *sh, gt_mem_estimate *est) {
    gt_mem_estimate was, now;
    gt_plan_estimate(sh, plan, &was);
    if (est) *est = was;
    int N = plan->n_blocks;
    if (N == 0 || plan->keep[N - 1] != GT_KEEP_RECOMPUTE) return 0;
    gt_plan kept = *plan;
    for (int i = segment_start(plan, N - 1); i < N; i++) {
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

int gt_plan_auto(const gt_mem_shape *sh, uint64_t budget, gt_plan *best, gt_mem_estimate *best_est) {
    int N = sh->model.n_layers;
    int found = 0;
    gt_plan plan;
    gt_mem_estimate est;
    gt_mem_estimate smallest_est;
    gt_plan smallest;
    int have_smallest = 0;
    /* Exhaustive up to 64 blocks (N^3/2 plans, each priced in O(N)); beyond that every count moves
     * in steps of N/64 so the search stays near a second even at 1024 blocks. */
    int stride = N > 64 ? N / 64 : 1;
    for (int n_rec = 0; n_rec <= N; n_rec = next_count(n_rec, stride, N)) {
        for (int K = 1; K <= (n_rec > 0 ? n_rec : 1); K += stride) {
            for (int n_sel = 0; n_sel <= N - n_rec; n_sel = next_count(n_sel, stride, N - n_rec)) {
                shaped_plan(&plan, N, n_rec, K, n_sel);
                if (n_rec == N) gt_plan_keep_tail(&plan, sh, &est); /* only then is the tail recomputed */
                else gt_plan_estimate(sh, &plan, &est);
                if (!have_smallest || est.total_bytes < smallest_est.total_bytes) {
                    smallest = plan;
                    smallest_est = est;
                    have_smallest = 1;
                }
                if (est.total_bytes > budget) continue;
                /* least recompute first; among equals, the least memory */
                if (!found || est.recompute_flops < best_est->recompute_flops ||
                    (est.recompute_flops == best_est->recompute_flops && est.total_bytes < best_est->total_bytes)) {
                    *best = plan;
                    *best_est = est;
                    found = 1;
                }
            }
        }
    }
    if (!found) {
        *best = smallest;
        *best_est = smallest_est;
        return -1;
    }
    return 0;
}

/* shape at ZeRO stage st (0..3) with grad_sync micro (mi = 1) or step */
static gt_mem_shape at_stage(const gt_mem_shape *shape, int st, int mi) {
    gt_mem_shape s = *shape;
    s.stage = st;
    s.shard_optimizer = st >= 1;
    s.grad_micro = mi;
    return s;
}

void gt_format_bytes(uint64_t bytes, char *out, size_t out_len) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(out, out_len, "%llu B", (unsigned long long)bytes);
    else snprintf(out, out_len, "%.2f %s", v, units[u]);
}

void gt_plan_report(FILE *out, const gt_config *cfg, const gt_mem_shape *shape_in) {
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    /* dist.shard or dist.grad_sync = auto: the tables describe what auto chooses (as train.c would) */
    gt_mem_shape resolved = *shape_in;
    const gt_mem_shape *shape = &resolved;
    {
        int shard_auto = cfg->dist.shard == GT_SHARD_AUTO, sync_auto = cfg->dist.grad_sync == GT_GRAD_SYNC_AUTO;
        int st = shard_auto ? -1 : resolved.stage ? resolved.stage : resolved.shard_optimizer;
        gt_policy pol;
        char perr[128];
        if ((shard_auto || (st >= 2 && sync_auto)) &&
            gt_policy_parse(cfg->memory.recompute, resolved.model.n_layers, &pol, perr, sizeof perr) == 0) {
            gt_plan p;
            gt_mem_estimate e;
            gt_plan_auto_all(&resolved, st, sync_auto ? -1 : cfg->dist.grad_sync == GT_GRAD_SYNC_MICRO, &pol,
                             cfg->memory.budget, &p, &e);
        }
    }
    uint64_t P = gt_model_param_count(&shape->model);
    fprintf(out, "gtrain plan for %s\n", cfg->path);
    fprintf(out, "model: %llu parameters (%.3f B), %d blocks, dim %d, ffn %d, heads %d/%d kv, vocab %d\n",
            (unsigned long long)P, P / 1e9, shape->model.n_layers, shape->model.dim, shape->model.ffn_dim,
            shape->model.n_heads, shape->model.n_kv_heads, shape->model.vocab_size);
    static const char *const stage_name[] = {"none", "optimizer", "gradients", "parameters"};
    int stage_now = shape->stage ? shape->stage : shape->shard_optimizer;
    fprintf(out, "micro-batch %d x %d tokens, grad_accum %d, %d-byte activations%s, world %d, shard %s%s%s%s\n\n",
            shape->micro_batch, shape->seq_len, shape->grad_accum, shape->act_bytes,
            shape->keep_probs ? ", attention probabilities kept" : "", shape->world, stage_name[stage_now],
            cfg->dist.shard == GT_SHARD_AUTO ? " (auto)" : "",
            stage_now >= 2 ? (shape->grad_micro ? ", grad_sync micro" : ", grad_sync step") : "",
            stage_now >= 2 && cfg->dist.grad_sync == GT_GRAD_SYNC_AUTO ? " (auto)" : "");

    fprintf(out, "model state per rank at recompute none (shard %s%s; params and grads are peaks: with ZeRO-3 "
                 "the shard plus gathered units, with grad_sync micro the slice plus unit accumulators):\n",
            stage_name[stage_now], stage_now >= 2 ? (shape->grad_micro ? " / micro" : " / step") : "");
    fprintf(out, "  %6s %14s %14s %14s %14s\n", "world", "params", "grads", "optimizer", "state total");
    int worlds[] = {1, 2, 4, 8, shape->world};
    int n_worlds = shape->world == 1 || shape->world == 2 || shape->world == 4 || shape->world == 8 ? 4 : 5;
    for (int w = 0; w < n_worlds; w++) {
        gt_mem_shape sw = *shape;
        sw.world = worlds[w];
        gt_plan none;
        gt_policy pn = {GT_POLICY_NONE, 0};
        gt_plan_from_policy(&none, &pn, shape->model.n_layers);
        gt_mem_estimate e;
        gt_plan_estimate(&sw, &none, &e);
        gt_format_bytes(e.params_bytes, b1, sizeof b1);
        gt_format_bytes(e.grads_bytes, b2, sizeof b2);
        gt_format_bytes(e.optim_bytes, b3, sizeof b3);
        gt_format_bytes(e.params_bytes + e.grads_bytes + e.optim_bytes, b4, sizeof b4);
        fprintf(out, "  %5d%s %14s %14s %14s %14s\n", worlds[w], worlds[w] == shape->world ? "*" : " ", b1, b2,
                b3, b4);
    }
    if (shape->library_bytes) {
        gt_format_bytes(shape->library_bytes, b1, sizeof b1);
        uint64_t cudnn = cudnn_attention_asked()
                             ? gt_plan_cudnn_scratch_bytes(&shape->model, shape->micro_batch, shape->seq_len)
                             : 0;
        char b6[32] = "";
        if (cudnn) gt_format_bytes(cudnn, b6, sizeof b6);
        fprintf(out, "library workspaces per rank at world %d: %s (cuBLASLt %llu MiB%s%s%s), in every total below\n",
                shape->world, b1, (unsigned long long)(GT_PLAN_CUBLASLT_WORKSPACE >> 20),
                gt_plan_uses_nccl(1, shape->world, cfg->dist.comm) ? ", NCCL buffers ~512 MiB (an estimate)"
                                                                   : "; no NCCL communicator",
                cudnn ? ", cuDNN attention backward scratch " : "", b6);
    }

    uint64_t budget = cfg->memory.budget;
    if (budget) gt_format_bytes(budget, b5, sizeof b5);

    /* every stage the trainer runs, at the configured world, with the configured recompute policy
     * (none when it is auto) */
    {
        int N0 = shape->model.n_layers;
        gt_policy pol;
        char perr[128];
        if (gt_policy_parse(cfg->memory.recompute, N0, &pol, perr, sizeof perr) != 0 || pol.kind == GT_POLICY_AUTO)
            pol = (gt_policy){GT_POLICY_NONE, 0};
        char pdesc[32];
        gt_policy_format(&pol, pdesc, sizeof pdesc);
        int A = shape->grad_accum > 0 ? shape->grad_accum : 1;
        fprintf(out, "\nper stage at world %d, recompute %s, grad_accum k = %d (peaks per rank; gather = ZeRO-3's "
                     "gathered units, buffers = unit gradient accumulators; comm = bytes a rank sends per step):\n",
                shape->world, pdesc, A);
        fprintf(out, "  %-26s %11s %11s %11s %11s %11s %11s %11s %11s  %s\n", "dist.shard / grad_sync", "params",
                "(gather)", "grads", "(buffers)", "optimizer", "activations", "total", "comm/step", "fits");
        static const char *const stage_names[] = {"none", "optimizer", "gradients", "parameters"};
        for (int st = 0; st <= 3; st++) {
            for (int mi = 0; mi <= (st >= 2); mi++) {
                gt_mem_shape ss = at_stage(shape, st, mi);
                gt_plan plan;
                gt_mem_estimate e;
                gt_plan_for_policy(&plan, &pol, &ss, &e);
                char label[40], c1[32], c2[32], c3[32], c4[32], c5[32], c6[32], c7[32], c8[32];
                snprintf(label, sizeof label, "ZeRO-%d %s%s", st, stage_names[st], st < 2 ? "" : mi ? " / micro" : " / step");
                gt_format_bytes(e.params_bytes, c1, sizeof c1);
                gt_format_bytes(e.gather_bytes, c2, sizeof c2);
                gt_format_bytes(e.grads_bytes, c3, sizeof c3);
                gt_format_bytes(e.grad_buffer_bytes, c4, sizeof c4);
                gt_format_bytes(e.optim_bytes, c5, sizeof c5);
                gt_format_bytes(e.act_peak_bytes, c6, sizeof c6);
                gt_format_bytes(e.total_bytes, c7, sizeof c7);
                gt_format_bytes((uint64_t)e.comm_bytes, c8, sizeof c8);
                fprintf(out, "  %-26s %11s %11s %11s %11s %11s %11s %11s %11s  %s\n", label, c1, c2, c3, c4, c5, c6,
                        c7, c8, !budget ? "-" : e.total_bytes <= budget ? "yes" : "no");
            }
        }
        fprintf(out, "  (comm: the ring model of src/dist/comm.h; per-unit collectives at their mean (W-1)/W)\n");
    }

    fprintf(out, "\nactivations per rank (one micro-batch) and fit at world %d%s%s:\n", shape->world,
            budget ? ", budget " : " (no memory.budget set)", budget ? b5 : "");
    fprintf(out, "  %-12s %14s %14s %12s  %s\n", "policy", "activations", "total", "extra fwd", "fits");
    const char *names[] = {"none", "selective", "blocks:1", "sqrt", "full"};
    int N = shape->model.n_layers;
    char blocks_half[32], uniform_k[32];
    snprintf(blocks_half, sizeof blocks_half, "blocks:%d", N / 2);
    snprintf(uniform_k, sizeof uniform_k, "uniform:%d", N >= 4 ? 4 : N);
    names[2] = blocks_half;
    const char *all_names[] = {names[0], names[1], names[2], uniform_k, names[3], names[4]};
    for (int i = 0; i < 6; i++) {
        gt_policy pol;
        char err[128];
        if (gt_policy_parse(all_names[i], N, &pol, err, sizeof err) != 0) continue;
        gt_plan plan;
        gt_mem_estimate e;
        gt_plan_for_policy(&plan, &pol, shape, &e);
        gt_format_bytes(e.act_peak_bytes, b1, sizeof b1);
        gt_format_bytes(e.total_bytes, b2, sizeof b2);
        double extra = 100.0 * e.recompute_flops / (3.0 * e.forward_flops);
        fprintf(out, "  %-12s %14s %14s %11.1f%%  %s\n", all_names[i], b1, b2, extra,
                !budget ? "-" : e.total_bytes <= budget ? "yes" : "no");
    }
    fprintf(out, "  (extra fwd: recompute FLOPs over one training step's 3 forwards' worth)\n");

    gt_policy configured;
    char err[256];
    int policy_ok = gt_policy_parse(cfg->memory.recompute, N, &configured, err, sizeof err) == 0;
    int shard_auto = cfg->dist.shard == GT_SHARD_AUTO, sync_auto = cfg->dist.grad_sync == GT_GRAD_SYNC_AUTO;
    int cfg_stage = shard_auto ? -1 : shape->stage ? shape->stage : shape->shard_optimizer;
    if (policy_ok && (configured.kind == GT_POLICY_AUTO || shard_auto || (cfg_stage >= 2 && sync_auto))) {
        gt_plan plan;
        gt_mem_estimate e;
        gt_mem_shape chosen = *shape;
        int rc = gt_plan_auto_all(&chosen, cfg_stage, sync_auto ? -1 : cfg->dist.grad_sync == GT_GRAD_SYNC_MICRO,
                                  &configured, budget, &plan, &e);
        char desc[256];
        gt_plan_describe(&plan, desc, sizeof desc);
        gt_format_bytes(e.total_bytes, b1, sizeof b1);
        gt_format_bytes(e.act_peak_bytes, b2, sizeof b2);
        gt_format_bytes((uint64_t)e.comm_bytes, b3, sizeof b3);
        static const char *const names4[] = {"none", "optimizer", "gradients", "parameters"};
        if (rc == 0) {
            fprintf(out, "\nauto: dist.shard %s, grad_sync %s, recompute %s\n  total %s (activations %s) fits %s%s "
                         "at the least recompute + communication time (+%.1f%% forward FLOPs, %s sent per step)\n",
                    names4[chosen.stage], chosen.stage < 2 ? "-" : chosen.grad_micro ? "micro" : "step", desc, b1, b2,
                    budget ? "the budget " : "(no budget set)", budget ? b5 : "",
                    100.0 * e.recompute_flops / (3.0 * e.forward_flops), b3);
        } else {
            fprintf(out, "\nauto: nothing fits the budget %s; the smallest (dist.shard %s, %s) needs %s\n", b5,
                    names4[chosen.stage], desc, b1);
        }
    } else {
        fprintf(out, "\nconfigured policy: %s\n", cfg->memory.recompute);
    }
}

double gt_plan_cost(const gt_mem_shape *sh, const gt_mem_estimate *est) {
    int gpu = sh->act_bytes == 2;
    double flops = gpu ? 400e12 : 100e9, bw = gpu ? 100e9 : 5e9;
    double A = sh->grad_accum > 0 ? sh->grad_accum : 1;
    return A * est->recompute_flops / flops + est->comm_bytes / bw;
}

int gt_plan_auto_all(gt_mem_shape *sh, int stage, int grad_micro, const gt_policy *policy, uint64_t budget,
                     gt_plan *best_plan, gt_mem_estimate *best_est) {
    int found = 0, have_small = 0;
    double best_cost = 0;
    gt_mem_shape best_shape = *sh, small_shape = *sh;
    gt_plan small_plan;
    gt_mem_estimate small_est;
    int recompute_auto = !policy || policy->kind == GT_POLICY_AUTO;
    for (int st = 0; st <= 3; st++) {
        if (stage >= 0 && st != stage) continue;
        for (int mi = 0; mi <= 1; mi++) {
            if (mi && st < 2) continue;
            if (st >= 2 && grad_micro >= 0 && mi != grad_micro) continue;
            gt_mem_shape s = at_stage(sh, st, mi);
            gt_plan plan;
            gt_mem_estimate est;
            int fits;
            if (recompute_auto) {
                fits = gt_plan_auto(&s, budget ? budget : UINT64_MAX, &plan, &est) == 0;
            } else {
                gt_plan_for_policy(&plan, policy, &s, &est);
                fits = !budget || est.total_bytes <= budget;
            }
            if (!have_small || est.total_bytes < small_est.total_bytes) {
                small_shape = s;
                small_plan = plan;
                small_est = est;
                have_small = 1;
            }
            if (!fits) continue;
            double cost = gt_plan_cost(&s, &est);
            if (!found || cost < best_cost || (cost == best_cost && est.total_bytes < best_est->total_bytes)) {
                best_shape = s;
                *best_plan = plan;
                *best_est = est;
                best_cost = cost;
                found = 1;
            }
        }
    }
    if (!found) {
        *sh = small_shape;
        *best_plan = small_plan;
        *best_est = small_est;
        return -1;
    }
    *sh = best_shape;
    return 0;
}
