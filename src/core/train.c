/*
 * train.c — the training loop (see train.h).
 *
 * Data parallelism in the global sample space: step s (1-based) consumes the global samples
 * [(s-1)*G, s*G) with G = micro_batch * grad_accum * world. Rank r's micro-batch m takes the
 * micro_batch samples starting at (s-1)*G + (r*grad_accum + m)*micro_batch, so 1 rank x 4
 * micro-batches, 2 x 2 and 4 x 1 train on the same sequences each step. Every token's loss gradient
 * is scaled by 1/(G*T), so the summed gradient is the gradient of the global mean loss.
 * A resumed run continues at the saved data cursor (run.first_sample), which is (s-1)*G unless the
 * global batch changed across the resume.
 *
 * Micro-batches never communicate; gt_optim_step does the step's one gradient reduction.
 *
 * Reading order: gt_train at the bottom opens a run (open_run: backend, communicator, plan, data,
 * model, state), then calls train_step once per optimizer step; train_step returns a step_result
 * that the progress line and the metrics line read; close_run releases what open_run made.
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "agree.h"
#include "bytes.h"
#include "calibrate.h"
#include "comm.h"
#include "data.h"
#include "hf_import.h"
#include "memtrack.h"
#include "mfu.h"
#include "model.h"
#include "ops_watch.h"
#include "optim.h"
#include "pace.h"
#include "planner.h"
#include "preflight.h"
#include "recompute.h"
#include "runclaim.h"
#include "runstate.h"
#include "spike.h"
#include "startup.h"
#include "tbevents.h"
#include "testhooks.h"
#include "trace.h"
#include "watchdog.h"
#include "zero.h"


static double now_seconds(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* Every rank reaches the same verdict on the same config, so exits stay collective. */
static int fail_input(int rank, const char *msg) {
    if (rank == 0) fprintf(stderr, "gtrain: %s\n", msg);
    return GT_EXIT_BAD_INPUT;
}

/* A check that files or devices decide, which may differ between ranks and nodes: agreed, and
 * reported once (by rank 0, with the failing rank's message), so no rank is left in a collective. */
static int agree_input(MPI_Comm comm, int code, char *msg, size_t msg_len) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    code = gt_agree_on_failure(comm, code, msg, msg_len);
    if (code && rank == 0) fprintf(stderr, "gtrain: %s\n", msg);
    return code;
}

/* The CPU's table for train.precision: bf16 runs on every CPU, through oneDNN on the bf16 units where
 * a rank has them and widened to fp32 for sgemm where it has not (bf16's memory, its products at about
 * 3/4 of fp32's speed). auto takes the faster of the two for the machine: bf16 where every rank has bf16 matrix
 * instructions (AMX or AVX512-BF16: 1.7x fp32's tokens/s on tiny and 2.1x on llama100m here,
 * docs/cpu-speed.md), else fp32; either way it says which in one line. */
static int choose_cpu_precision(const gt_config *cfg, MPI_Comm comm, const gt_ops **ops_out) {
    char why[512] = "";
    int rank;
    MPI_Comm_rank(comm, &rank);
    int here = cfg->train.precision == GT_PRECISION_FP32 ? 0 : gt_cpu_bf16_native(why, sizeof why), all = 0;
    MPI_Allreduce(&here, &all, 1, MPI_INT, MPI_MIN, comm);
    if (cfg->train.precision == GT_PRECISION_BF16) {
        if (rank == 0)
            printf("gtrain: bf16 on the CPU: matrix products through %s%s\n", gt_cpu_bf16_isa(),
                   here && !all ? "; widened on the ranks whose CPU has no bf16 instructions" : "");
        *ops_out = gt_ops_cpu_bf16();
        return 0;
    }
    if (cfg->train.precision == GT_PRECISION_AUTO && rank == 0) {
        if (all)
            printf("gtrain: [train] precision = auto: bf16 on the CPU (matrix products through %s; "
                   "precision = fp32 for fp32)\n", gt_cpu_bf16_isa());
        else
            printf("gtrain: [train] precision = auto: fp32 on the CPU (no bf16 here: %s)\n",
                   here ? "another rank's CPU has no bf16 instructions" : why);
    }
    *ops_out = all && cfg->train.precision == GT_PRECISION_AUTO ? gt_ops_cpu_bf16() : gt_ops_cpu();
    return 0;
}

/* Chooses the backend from train.device and train.precision; the same one on every rank (a rank
 * without a GPU makes device = auto fall back to the CPU everywhere, and device = cuda fail). */
static int choose_backend(const gt_config *cfg, MPI_Comm comm, const gt_ops **ops_out) {
    char why[512] = "", msg[2048] = "";
    int rank;
    MPI_Comm_rank(comm, &rank);
    const char *dev = gt_device_name(cfg->train.device);
    int want_bf16 = cfg->train.precision != GT_PRECISION_FP32; /* auto and bf16 mean bf16 on the GPU */
    const gt_ops *ops = NULL;
    if (cfg->train.device == GT_DEVICE_CUDA || cfg->train.device == GT_DEVICE_AUTO) {
        /* the GPU of this rank (local rank modulo the visible devices); two ranks on one GPU is an
         * error with either setting, since the user clearly meant to use the GPUs */
        int gpu = gt_cuda_select_device(comm, why, sizeof why);
        if (gpu == GT_CUDA_SHARED_GPU) {
            snprintf(msg, sizeof msg, "%s: [train] device = %s: %s", cfg->path, dev, why);
            return fail_input(rank, msg);
        }
        ops = gpu >= 0 ? gt_ops_cuda(want_bf16, cfg->train.cuda_attention, why, sizeof why) : NULL;
        if (!ops) snprintf(msg, sizeof msg, "%s: [train] device = %s, but %s", cfg->path, dev, why);
        int code = agree_input(comm, !ops && cfg->train.device == GT_DEVICE_CUDA ? GT_EXIT_BAD_INPUT : 0, msg,
                               sizeof msg);
        if (code) return code;
        int here[2] = {ops != NULL, -(ops != NULL)}, all[2] = {0, 0}; /* {everywhere, -somewhere} */
        MPI_Allreduce(here, all, 2, MPI_INT, MPI_MIN, comm);
        if (!all[0]) ops = NULL;
        if (!all[0] && all[1] && rank == 0)
            fprintf(stderr, "gtrain: %s: [train] device = auto: some ranks see no GPU, so every rank runs on the CPU\n",
                    cfg->path);
    }
    if (!ops) return choose_cpu_precision(cfg, comm, ops_out);
    *ops_out = ops;
    return 0;
}

/* Bad input a backend found on the device (a token id outside the vocabulary: the CUDA kernels raise a
 * flag instead of reading out of bounds), read once per step and after each evaluation; every rank
 * agrees, and the run stops with exit 2 and the data file named, as the loader's own check does. */
static int device_faults(const gt_ops *ops, MPI_Comm comm, const char *path, char *msg, size_t msg_len) {
    if (!ops->take_fault) return 0;
    char fault[512] = "";
    int bad = ops->take_fault(fault, sizeof fault);
    if (bad) snprintf(msg, msg_len, "%s: %s", path, fault);
    return agree_input(comm, bad ? GT_EXIT_BAD_INPUT : 0, msg, msg_len);
}

static void write_json_number(FILE *f, const char *key, double v, int last) {
    if (isfinite(v)) fprintf(f, "\"%s\":%.9g%s", key, v, last ? "" : ",");
    else fprintf(f, "\"%s\":null%s", key, last ? "" : ",");
}

/* The validation loss over data.val_batches batches of source src (-1: all sources together). */
static double evaluate(gt_model *model, gt_data *val, int src, const gt_config *cfg, gt_comm *comm, int lockstep) {
    int B = cfg->train.micro_batch, T = cfg->train.seq_len;
    int rank = gt_comm_rank(comm), world = gt_comm_size(comm);
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    if (!in || !tg) abort();
    double sum = 0.0, counted = 0.0;
    /* Every rank runs the same number of forwards: under ZeRO-3 each one gathers units collectively,
     * so a rank without a batch of its own left runs batch 0 again and drops the result. */
    int rounds = (cfg->data.val_batches + world - 1) / world;
    for (int i = 0; i < rounds; i++) {
        int b = i * world + rank, mine = b < cfg->data.val_batches;
        if (!mine && !lockstep) break;
        gt_data_val_batch_source(val, src, mine ? b : 0, B, T, in, tg);
        double l = gt_model_eval(model, in, tg, B, T, NULL);
        if (mine) sum += l;
        if (mine && gt_data_counts_targets(val))
            for (int t = 0; t < B * T; t++) counted += tg[t] >= 0;
    }
    free(in);
    free(tg);
    sum = gt_comm_all_reduce_scalar_sum(comm, sum);
    if (gt_data_counts_targets(val)) /* the mean over the targets the masks (and separator_loss) count */
        return sum / gt_comm_all_reduce_scalar_sum(comm, counted);
    return sum / ((double)cfg->data.val_batches * B * T);
}

/* Progress: a full line every log.every steps (and the first and last), each with an ETA from the
 * mean step time so far. On a terminal, the steps in between update one line in place; when
 * stdout is a file or a pipe (batch jobs) nothing is printed between the full lines, so logs grow
 * by exactly one line per log.every steps. */
typedef struct progress {
    int tty, width, first_step, last_step, every;
    double seconds;    /* summed step time since first_step */
    int steps_timed;
    int partial;       /* an in-place line is on screen */
} progress;

/* In-place progress only on a terminal of our own: under mpirun or srun a rank's stdout may be a
 * pseudo-terminal even when the job's log is a file, so launched ranks never draw in place.
 * GTRAIN_PROGRESS=1 or 0 forces it on or off. */
static int progress_in_place(void) {
    const char *force = getenv("GTRAIN_PROGRESS");
    if (force && *force) return atoi(force) != 0;
    const char *launchers[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_JOB_ID"};
    for (int i = 0; i < 4; i++)
        if (getenv(launchers[i])) return 0;
    return isatty(STDOUT_FILENO);
}

static void format_eta(double s, char *out, size_t len) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, len, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(out, len, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, len, "%lds", t);
}

static void progress_update(progress *p, int step, double loss, double lr, double norm, double tok_per_s,
                            double step_s, double mfu) {
    /* the first step carries one-off costs (allocation, warm caches): leave it out of the ETA */
    if (step > p->first_step) {
        p->seconds += step_s;
        p->steps_timed++;
    }
    double per_step = p->steps_timed ? p->seconds / p->steps_timed : step_s;
    char eta[32];
    format_eta(per_step * (p->last_step - step), eta, sizeof eta);
    int full = step % p->every == 0 || step == p->last_step || step == p->first_step;
    if (full) {
        if (p->partial) printf("\r\033[K");
        char mfu_text[32] = ""; /* only where a peak is known (mfu.h) */
        if (isfinite(mfu)) snprintf(mfu_text, sizeof mfu_text, " | mfu %.1f%%", 100.0 * mfu);
        printf("step %*d/%d | loss %.4f | lr %.2e | norm %.4f | %.0f tok/s | %.1f ms%s | eta %s\n", p->width, step,
               p->last_step, loss, lr, norm, tok_per_s, step_s * 1e3, mfu_text, eta);
        p->partial = 0;
    } else if (p->tty) {
        printf("\r\033[K[%d/%d %.1f%% | loss %.4f | %.0f tok/s | eta %s]", step, p->last_step,
               100.0 * step / p->last_step, loss, tok_per_s, eta);
        p->partial = 1;
    }
    fflush(stdout);
}

/* model.init: the Hugging Face checkpoint's weights become the master weights, each rank reading
 * only its own slice; the optimizer moments stay zero, so step 1 starts AdamW afresh. A state file
 * found by checkpoint.resume wins (it is the same run, further on): then nothing is read. */
static int import_checkpoint(const gt_config *cfg, gt_optim *opt, const gt_layout *layout, MPI_Comm comm,
                             int resumed) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    const char *dir = cfg->model.init;
    if (resumed) {
        if (rank == 0) {
            printf("gtrain: model.init = %s not read: resuming from the state file in [checkpoint] dir instead\n",
                   dir);
            fflush(stdout);
        }
        return 0;
    }
    char msg[2048] = "";
    int code = gt_hf_check_config(dir, cfg, msg, sizeof msg);
    code = agree_input(comm, code, msg, sizeof msg);
    if (code) return code;
    size_t count = gt_shard_count(&opt->shard);
    float *slice = malloc((count ? count : 1) * sizeof *slice);
    if (!slice) abort();
    int n_files = 0;
    code = gt_hf_read_slice(dir, layout, opt->shard.begin, opt->shard.end, slice, &n_files, msg, sizeof msg);
    code = agree_input(comm, code, msg, sizeof msg);
    if (!code) {
        if (count) opt->ops->copy_to_device(opt->master, slice, count * sizeof(float));
        gt_optim_publish_params(opt);
        if (rank == 0) {
            printf("gtrain: model.init: %zu parameters from %s (%d safetensors file%s)\n", layout->n_params, dir,
                   n_files, n_files == 1 ? "" : "s");
            fflush(stdout);
        }
    }
    free(slice);
    return code;
}

/* ---------------------------------------------------------------- the run */

/* Everything one run holds: opened by open_run, released in one place by close_run. */
typedef struct run {
    const gt_config *cfg;      /* the run's own copy: a resume may rescale train.grad_accum */
    MPI_Comm mpi;
    int rank, world;
    const gt_ops *ops;
    int is_cuda;
    gt_comm *comm;
    gt_plan_choice choice;     /* stage, grad_sync and recompute plan, `auto` resolved */
    gt_data *train_data, *val_data;
    gt_mem mem;
    gt_layout layout;
    gt_model *model;
    gt_optim opt;
    gt_zero zero;
    gt_run_state state;        /* resume, saves, signals (runstate.h) */
    size_t n_padded;           /* the flat parameter and gradient length */
    uint64_t G;                /* global batch in sequences */
    float dloss;               /* every counted token's loss gradient: 1 / (G * T), with loss masks
                                  1 / (the step's counted targets, all micro-batches of all ranks) */
    double flops_per_step;     /* model FLOPs per rank and step (MFU): 3 forwards' worth, recompute not counted */
    double peak_flops;         /* the MFU's peak per rank (mfu.h); 0 = no MFU */
    gt_time_estimate predicted_time; /* the time model's step (planner.h gt_plan_time), from the calibration */
    int file_micro_batch;            /* train.micro_batch as configured (GT_INT_AUTO: the planner chose) */
    char predicted_note[1024];       /* where its rates come from (gt_calib_for_run) */
    FILE *metrics;             /* rank 0, log.metrics */
    gt_tb *tb;                 /* rank 0, log.tensorboard */
    int32_t *inputs, *targets; /* one micro-batch of token ids (B, T) */
    progress progress;
    gt_spike_window spikes;    /* train.spike_zscore: the recent applied steps */
    gt_pace pace;              /* rank 0: the pace line's steps (pace.h) */
} run;

/* What one optimizer step did, as the progress line and the metrics line report it. */
typedef struct step_result {
    int step;
    double loss, lr, grad_norm; /* loss: the global mean; grad_norm NaN when the optimizer did not run */
    gt_step_outcome outcome;    /* applied, or skipped (why says which loss or norm, and why) */
    char why[3000];
    double seconds, tok_per_s, mfu; /* mfu NaN on the CPU */
    uint64_t tokens;            /* tokens seen after this step */
    int recomputed;             /* block forwards re-run in backward */
    uint64_t unit_gathers;      /* ZeRO-3 unit gathers */
    uint64_t buckets, buckets_early; /* gradient buckets reduced; of them started before block 0's
                                        backward ended */
    int param_gathers_max;      /* ZeRO-1/2 working weights' gathers in flight at once, the most */
    uint64_t act_peak_bytes, mem_peak_bytes, params_peak_bytes, grads_peak_bytes;
    uint64_t staging_peak_bytes; /* the MPI reduce-scatters' host staging (comm.h), most held in the step */
    gt_comm_stats comm;
    int64_t skipped_steps;      /* so far, this one included */
} step_result;

/* dist.comm and the backend decide the communicator: NCCL (comm = nccl, or auto on more than one
 * GPU rank: the planner counts NCCL's buffers by this rule), the local one for a single GPU (nothing
 * to reduce), else MPI, which moves host memory only. */
static int open_communicator(run *r) {
    const gt_config *cfg = r->cfg;
    char msg[2048], why[256];
    if (!r->is_cuda && cfg->dist.comm == GT_COMM_NCCL) {
        snprintf(msg, sizeof msg, "%s: [dist] comm = nccl needs the CUDA backend", cfg->path);
        return fail_input(r->rank, msg);
    } else if (gt_plan_uses_nccl(r->is_cuda, r->world, cfg->dist.comm)) {
        r->comm = gt_comm_create_nccl(r->mpi, why, sizeof why);
        if (!r->comm) {
            snprintf(msg, sizeof msg, "%s: [dist] comm: NCCL is not usable: %s", cfg->path, why);
            return fail_input(r->rank, msg);
        }
    } else if (r->is_cuda && r->world == 1) {
        r->comm = gt_comm_create_local(r->mpi, r->ops->copy, why, sizeof why);
        if (!r->comm) {
            snprintf(msg, sizeof msg, "%s: [dist] comm: %s", cfg->path, why);
            return fail_input(r->rank, msg);
        }
    } else {
        if (r->is_cuda && r->world > 1) {
            snprintf(msg, sizeof msg,
                     "%s: [dist] comm = mpi works on host memory and the CUDA backend keeps its tensors on the "
                     "GPU (expected comm = nccl or auto with a GPU, or train.device = cpu)", cfg->path);
            return fail_input(r->rank, msg);
        }
        r->comm = gt_comm_create_mpi(r->mpi);
        /* started collectives (buckets, ZeRO-2/3) advance while the compute thread computes */
        if (r->world > 1 && cfg->dist.progress_us > 0 &&
            !gt_comm_progress_start(r->comm, cfg->dist.progress_us, why, sizeof why) && r->rank == 0)
            printf("gtrain: note: no progress thread (%s): started collectives advance between kernels only\n", why);
    }
    return 0;
}

/* Does the run span more than one node (GTRAIN_TEST_RANK_IS_NODE: every rank a node)? Then the
 * memory snapshots keep partner copies too (runstate_memsnap.c). Collective. */
static int spans_nodes(MPI_Comm comm) {
    int world = 1, local_size = 1;
    MPI_Comm_size(comm, &world);
    gt_node_ranks(comm, NULL, &local_size);
    return world > 1 && (local_size < world || gt_test_hooks_get()->rank_is_node);
}

/* The plan (gt_plan_resolve, shared with `gtrain --plan`), refused when auto finds nothing within
 * memory.budget or when it does not fit what this rank can have (preflight), before any allocation. */
static int resolve_plan(run *r) {
    const gt_config *cfg = r->cfg;
    char msg[2048], err[3000];
    gt_mem_shape shape = gt_plan_shape(cfg, r->is_cuda, r->ops->act_bytes, r->ops->can_keep_attention_probs,
                                       r->world);
    /* rank 0's rates for every rank: auto ranks by them, and every rank must resolve the same plan */
    gt_calib calib;
    int local = 1; /* the ranks sharing rank 0's host: the calibration of that count (calib.h) */
    gt_node_ranks(r->mpi, NULL, &local);
    gt_calib_for_run(&calib, r->is_cuda, r->ops->act_bytes == 2, 0, local, NULL, r->predicted_note,
                     sizeof r->predicted_note);
    gt_calib_note_in_step(&calib, cfg, r->predicted_note, sizeof r->predicted_note);
    gt_calib_select_links(&calib, r->is_cuda, r->world, local, r->predicted_note, sizeof r->predicted_note);
    MPI_Bcast(&calib, (int)sizeof calib, MPI_BYTE, 0, r->mpi);
    MPI_Bcast(r->predicted_note, (int)sizeof r->predicted_note, MPI_CHAR, 0, r->mpi);
    if (gt_plan_resolve(cfg, &shape, &calib, &r->choice, err, sizeof err) != 0) return fail_input(r->rank, err);
    /* what auto chose (and grad_accum as train.global_batch sets it) is what the run trains with */
    gt_config *own = (gt_config *)r->cfg;
    r->file_micro_batch = own->train.micro_batch;
    own->train.micro_batch = r->choice.shape.micro_batch;
    own->train.grad_accum = r->choice.shape.grad_accum > 0 ? r->choice.shape.grad_accum : 1;
    own->dist.prefetch = r->choice.shape.prefetch;
    own->dist.bucket_mb = r->choice.shape.bucket_mb; /* auto: the search's size (0 where buckets do not apply) */
    if (!r->choice.fits) {
        char need[32], have[32];
        gt_format_bytes(r->choice.predicted.total_bytes, need, sizeof need);
        gt_format_bytes(cfg->memory.budget, have, sizeof have);
        snprintf(msg, sizeof msg,
                 "%s: [memory] budget = %s: nothing fits (dist.shard = %s, dist.grad_sync = %s, "
                 "memory.recompute = %s); the smallest needs %s per rank",
                 cfg->path, have, gt_shard_stage_name(cfg->dist.shard), gt_grad_sync_name(cfg->dist.grad_sync),
                 cfg->memory.recompute, need);
        return fail_input(r->rank, msg);
    }
    gt_plan_time(&r->choice.shape, &r->choice.plan, &calib, &r->predicted_time);
    int memsnap_off = 0;
    int rc = gt_preflight_memory(cfg, r->ops, r->mpi, &r->choice.predicted,
                                 gt_plan_snapshot_bytes(cfg, &r->choice.shape), /* the async save's copy */
                                 gt_plan_memsnap_bytes(cfg, &r->choice.shape, spans_nodes(r->mpi)), &memsnap_off);
    if (memsnap_off) own->checkpoint.memory_every = 0; /* auto, and they do not fit: off (one warning said so) */
    return rc;
}

/* Each rank opens the data files itself: they may be missing or different on some nodes. */
static int open_data(run *r) {
    const gt_config *cfg = r->cfg;
    char err[3000] = "";
    int bad = 0;
    const char *paths[2] = {cfg->data.train, cfg->data.val};
    gt_data **sets[2] = {&r->train_data, &r->val_data};
    for (int i = 0; i < 2 && !bad && paths[i][0]; i++) {
        gt_data *d = *sets[i] = gt_data_open(paths[i], err, sizeof err);
        char where[GT_PATH_MAX * 2 + 64];
        gt_config_where(cfg, "data", "loss_mask", where, sizeof where);
        if (!d || gt_data_load_masks(d, (int)cfg->data.loss_mask, where, err, sizeof err) != 0 ||
            gt_data_check_seq(d, cfg->train.seq_len, err, sizeof err) != 0 ||
            gt_data_check_vocab(d, cfg->model.vocab_size, err, sizeof err) != 0) /* no missing embedding row */
            bad = 1;
        else if (!cfg->data.separator_loss)
            gt_data_uncount_separator(d, cfg->data.separator);
    }
    return agree_input(r->mpi, bad ? GT_EXIT_BAD_INPUT : 0, err, sizeof err);
}

/* Model, parameters, optimizer: ZeRO-3 holds no full parameter buffer and grad_sync = micro no full
 * gradient buffer; zero.c gathers and reduces their units. Without model.init the parameters are
 * drawn here, each rank only its own slice (counter-based: the same values at any world size); with
 * it, the import (or a resume) fills the master. */
static void build_model(run *r) {
    const gt_config *cfg = r->cfg;
    const gt_ops *ops = r->ops;
    int stage = r->choice.stage, grad_micro = r->choice.grad_micro;
    gt_mem_init(&r->mem, ops);
    gt_layout_init(&r->layout, &cfg->model);
    r->n_padded = gt_optim_padded_len(r->layout.n_params, r->world, stage >= 1);
    r->model = gt_model_create_buffers(ops, &r->mem, &cfg->model, stage == 3 ? 0 : r->n_padded,
                                       grad_micro ? 0 : r->n_padded);
    gt_model_set_documents(r->model, cfg->data.document_mask, cfg->data.reset_positions, cfg->data.separator,
                           cfg->data.separator_before);
    /* grad_sync = step with buckets: the flat reduce-scatter is cut into buckets started during the
     * last micro-batch's backward (zero.h); nothing to reduce on one rank or with shard none */
    int buckets = stage >= 1 && !grad_micro && r->world > 1 && cfg->dist.bucket_mb > 0;
    /* ZeRO-1/2 with the working weights' gather waited for unit by unit in the next forward */
    int gathers = (stage == 1 || stage == 2) && r->world > 1 && cfg->dist.overlap_param_gather;
    if (stage >= 2 || buckets || gathers) {
        gt_zero_init(&r->zero, ops, &r->mem, r->comm, &r->layout, stage, grad_micro, cfg->dist.prefetch);
        if (buckets)
            gt_zero_set_buckets(&r->zero, gt_model_grads(r->model), r->n_padded,
                                (size_t)(cfg->dist.bucket_mb * 1024.0 * 1024.0));
        if (gathers) gt_zero_set_param_gathers(&r->zero, gt_model_params(r->model));
        gt_unit_hooks hooks;
        gt_zero_hooks(&r->zero, &hooks);
        gt_model_set_unit_hooks(r->model, &hooks);
    }
    gt_optim_init(&r->opt, ops, &r->mem, r->comm, r->model, stage >= 1, NULL);
    r->opt.grad_slice = r->zero.grad_slice;
    r->opt.param_shard = r->zero.param_shard;
    r->opt.reduced_in_backward = r->zero.n_buckets > 0;
    if (gathers) {
        r->opt.gather_start = gt_zero_params_start;
        r->opt.gather_finish = gt_zero_params_finish;
        r->opt.gather_ctx = &r->zero;
    }
}

/* The random initial weights of a fresh start (train.seed), this rank's slice, then published. Not
 * for a resume, which reads every byte of the slice from the state file: drawing 4 bytes per
 * parameter of normal noise and gathering them was a large part of a restart's time to its first
 * step, for values the read overwrote. */
static void init_params(run *r) {
    const gt_ops *ops = r->ops;
    size_t count = gt_shard_count(&r->opt.shard);
    float *init = malloc((count ? count : 1) * sizeof *init);
    if (!init) abort();
    gt_layout_init_params_range(&r->layout, init, r->opt.shard.begin, r->opt.shard.end, r->cfg->train.seed);
    if (count) ops->copy_to_device(r->opt.master, init, count * sizeof(float));
    free(init);
    gt_optim_publish_params(&r->opt);
}

/* The lines a run starts with (rank 0): size, backend, ranks, sharding, plan, data. */
static void print_banner(const run *r) {
    const gt_config *cfg = r->cfg;
    const gt_plan_choice *c = &r->choice;
    const gt_mem_estimate *p = &c->predicted;
    char desc[256], params_b[32], act_b[32];
    gt_plan_describe(&c->plan, desc, sizeof desc);
    gt_format_bytes(p->params_bytes + p->grads_bytes + p->optim_bytes, params_b, sizeof params_b);
    gt_format_bytes(p->act_peak_bytes, act_b, sizeof act_b);
    int micro_auto = r->file_micro_batch == GT_INT_AUTO;
    printf("gtrain: %zu parameters, %s backend, %d rank%s (%s), shard %s%s, global batch %llu x %d tokens "
           "(micro_batch %d%s x grad_accum %d x %d)\n",
           r->layout.n_params, r->ops->name, r->world, r->world == 1 ? "" : "s", gt_comm_name(r->comm),
           gt_shard_stage_name((gt_shard_stage)c->stage), cfg->dist.shard == GT_SHARD_AUTO ? " (auto)" : "",
           (unsigned long long)r->G, cfg->train.seq_len, cfg->train.micro_batch, micro_auto ? " (auto)" : "",
           cfg->train.grad_accum, r->world);
    printf("gtrain: recompute %s (%s); predicted per rank: state %s, activations %s\n", cfg->memory.recompute,
           desc, params_b, act_b);
    if (c->stage >= 2)
        printf("gtrain: ZeRO-%d, grad_sync %s%s; predicted peaks per rank: params_peak_bytes %llu, "
               "grads_peak_bytes %llu\n", c->stage, c->grad_micro ? "micro" : "step",
               cfg->dist.grad_sync == GT_GRAD_SYNC_AUTO ? " (auto)" : "",
               (unsigned long long)p->params_bytes, (unsigned long long)p->grads_bytes);
    if (c->bucket_auto)
        printf("gtrain: dist.bucket_mb %.17g (auto: the size of the least predicted step; 0: one reduction after the "
               "backward)\n", cfg->dist.bucket_mb);
    if (p->staging_bytes) /* the most of any rank, and this rank's (rank 0's metrics report it) */
        printf("gtrain: predicted reduce-scatter staging per rank (MPI, host memory): comm_staging_bytes %llu, "
               "rank 0 %llu; in the total_bytes %llu the memory check counts, beside the other_bytes %llu of state, "
               "activations and workspace\n", (unsigned long long)p->staging_bytes,
               (unsigned long long)gt_plan_staging_bytes(&c->shape, 0), (unsigned long long)p->total_bytes,
               (unsigned long long)(p->params_bytes + p->grads_bytes + p->optim_bytes + p->workspace_bytes +
                                    p->act_peak_bytes + p->library_bytes));
    printf("gtrain: predicted step%s %.1f ms, %.0f tokens/s; rates: %s\n",
           r->predicted_time.measured ? "" : " (from defaults, not measured)", r->predicted_time.step_s * 1e3,
           r->predicted_time.tokens_per_s, r->predicted_note);
    char files[1024];
    gt_data_describe(r->train_data, files, sizeof files);
    printf("gtrain: train data %s\n", files);
    if (gt_data_has_masks(r->train_data))
        printf("gtrain: train data has loss masks (data.loss_mask = %s): the loss is the mean over the tokens "
               "they count\n", gt_loss_mask_name(cfg->data.loss_mask));
    if (!cfg->data.separator_loss)
        printf("gtrain: data.separator_loss = false: the targets predicted at the separator %d are not counted\n",
               cfg->data.separator);
    if (gt_data_weighted(r->train_data)) {
        /* the mix the run's own samples realise (at most the first million of them) */
        uint64_t first = r->state.first_sample;
        int left = cfg->train.steps - r->state.first_step + 1;
        uint64_t n = left > 0 ? (uint64_t)left * r->G : 0;
        char mix[2048];
        gt_data_describe_mix(r->train_data, cfg->train.seed, first, n < 1000000 ? (n ? n : 1) : 1000000, mix, sizeof mix);
        printf("gtrain: train data %s\n", mix);
    }
    if (r->val_data) gt_data_describe(r->val_data, files, sizeof files);
    printf("gtrain: validation data %s\n", r->val_data ? files : "none (data.val is empty)");
    gt_config defaults; /* the built-in corpus: data/fortunes.{train,val}.bin */
    gt_config_defaults(&defaults);
    if (r->val_data && strcmp(cfg->data.train, defaults.data.train) != 0 &&
        strcmp(cfg->data.val, defaults.data.val) == 0)
        fprintf(stderr, "gtrain: warning: data.train is set to %s but data.val is still the built-in "
                "corpus %s; set [data] val to your own validation files (or to nothing)\n",
                cfg->data.train, cfg->data.val);
    fflush(stdout);
}

/* log.tensorboard: rank 0 makes the directory and a new event file; all ranks agree on the outcome. */
static int open_tensorboard(run *r) {
    const gt_config *cfg = r->cfg;
    if (!cfg->log.tensorboard[0]) return 0;
    char msg[GT_PATH_MAX * 3 + 256] = "", why[GT_PATH_MAX + 256] = "", where[GT_PATH_MAX * 2 + 64];
    int rc = 0;
    if (r->rank == 0) {
        r->tb = gt_tb_open(cfg->log.tensorboard, why, sizeof why);
        r->state.tb = r->tb; /* the completed saves' times */
        if (!r->tb) {
            gt_config_where(cfg, "log", "tensorboard", where, sizeof where);
            snprintf(msg, sizeof msg, "%s: %s (expected a directory gtrain can write TensorBoard event files into)",
                     where, why);
            rc = GT_EXIT_BAD_INPUT;
        }
    }
    return agree_input(r->mpi, rc, msg, sizeof msg);
}

/* The MFU's peak: train.peak_tflops, else on a GPU the table's peak for its name (mfu.h) at the run's
 * precision, else none (the CPU, an unknown GPU: rank 0 says so once). */
static void choose_peak(run *r) {
    const gt_config *cfg = r->cfg;
    if (cfg->train.peak_tflops > 0) {
        r->peak_flops = cfg->train.peak_tflops * 1e12;
        return;
    }
    if (!r->is_cuda) return;
    char which[64];
    const char *name = gt_cuda_device_name();
    int bf16 = cfg->train.precision != GT_PRECISION_FP32;
    r->peak_flops = gt_gpu_peak_flops(name, bf16, which, sizeof which);
    if (r->rank != 0) return;
    if (r->peak_flops > 0)
        printf("gtrain: MFU against the %s's dense %s peak, %.0f TFLOP/s (train.peak_tflops sets another)\n", which,
               bf16 ? "bf16" : "fp32", r->peak_flops / 1e12);
    else
        printf("gtrain: no MFU: the %s peak of '%s' is not known (set train.peak_tflops to the GPU's dense "
               "TFLOP/s)\n", bf16 ? "bf16" : "fp32", name);
}

/* Opens a run: backend and communicator, plan, data, model, then the state (a resume, or model.init),
 * the metrics file and the banner. Returns 0 or an exit code; close_run releases either way. */
static int open_run(run *r, const gt_config *file_cfg, MPI_Comm mpi) {
    memset(r, 0, sizeof *r);
    gt_config *own = malloc(sizeof *own);
    if (!own) abort();
    *own = *file_cfg;
    const gt_config *cfg = r->cfg = own;
    r->mpi = mpi;
    MPI_Comm_rank(mpi, &r->rank);
    MPI_Comm_size(mpi, &r->world);
    int rc = gt_test_hooks_check(r->rank); /* a stray GTRAIN_TEST_* variable: refused before anything runs */
    if (rc || (rc = gt_runclaim_take(cfg, mpi))) return rc; /* one run per checkpoint.dir, before it is touched */
    gt_startup_mark("claim of checkpoint.dir");
    rc = choose_backend(cfg, mpi, &r->ops);
    if (rc) return rc;
    r->ops = gt_ops_watched(r->ops); /* the watchdog sees each kernel begin and end: a wedged one is named */
    char trace_msg[GT_PATH_MAX * 3 + 512] = "";
    rc = agree_input(mpi, gt_trace_run_open(cfg, r->rank, trace_msg, sizeof trace_msg), trace_msg, sizeof trace_msg);
    if (rc) return rc;
    r->ops = gt_trace_run_ops(r->ops); /* log.trace: each op timed in the recorded steps; else the same table */
    r->is_cuda = strcmp(r->ops->name, "cuda") == 0;
    if ((rc = open_communicator(r)) || (rc = gt_runstate_keep_global_batch(own, mpi)) || (rc = resolve_plan(r)) ||
        (rc = open_data(r)))
        return rc;
    gt_trace_run_comm(r->comm);
    gt_startup_mark(GT_STARTUP_CHECKED);
    build_model(r);
    gt_startup_mark(GT_STARTUP_ALLOCATED);
    int B = cfg->train.micro_batch, T = cfg->train.seq_len, A = cfg->train.grad_accum;
    r->G = (uint64_t)B * A * r->world;
    rc = gt_runstate_begin(&r->state, cfg, r->comm, mpi, r->model, &r->opt, r->G);
    if (rc) return rc;
    gt_startup_mark(GT_STARTUP_BUFFERS);
    if (!cfg->model.init[0] && r->state.first_step == 1) init_params(r); /* a resume read them */
    if (cfg->model.init[0]) {
        rc = import_checkpoint(cfg, &r->opt, &r->layout, mpi, r->state.first_step > 1);
        if (rc) return rc;
    }
    gt_startup_mark("weights (drawn at a fresh start, or model.init)");
    if (r->rank == 0 && cfg->log.metrics[0]) {
        r->metrics = fopen(cfg->log.metrics, r->state.first_step > 1 ? "a" : "w");
        if (!r->metrics) fprintf(stderr, "gtrain: cannot write %s; metrics off\n", cfg->log.metrics);
        r->state.metrics = r->metrics; /* one record per completed save */
    }
    if ((rc = open_tensorboard(r))) return rc;
    if (r->rank == 0) print_banner(r);
    r->inputs = malloc((size_t)B * T * sizeof *r->inputs);
    r->targets = malloc((size_t)B * T * sizeof *r->targets);
    if (!r->inputs || !r->targets) abort();
    r->dloss = (float)(1.0 / ((double)r->G * T));
    r->flops_per_step = 3.0 * r->choice.predicted.forward_flops * A;
    choose_peak(r);
    r->progress = (progress){progress_in_place(), (int)snprintf(NULL, 0, "%d", cfg->train.steps),
                             r->state.first_step, cfg->train.steps, cfg->log.every, 0.0, 0, 0};
    /* last, so that start-up (loading a state file can take minutes) is not timed */
    char why[4400] = "", msg[4800] = "";
    rc = gt_watchdog_start(mpi, cfg->checkpoint.dir, cfg->dist.timeout, cfg->dist.liveness_timeout, why, sizeof why)
             ? GT_EXIT_BAD_INPUT : 0;
    if (rc) snprintf(msg, sizeof msg, "%s: [dist] timeout: %s (dist.timeout = 0 runs without the watchdog)", cfg->path,
                     why);
    rc = agree_input(mpi, rc, msg, sizeof msg);
    gt_startup_mark(GT_STARTUP_READY);
    return rc;
}

/* Rank 0, after the first step's line: one line with what this start's time went to (startup.h),
 * so that a restart's cost can be read without GTRAIN_STARTUP_TIMES. */
static void say_start_split(void) {
    char split[512];
    if (gt_startup_split(split, sizeof split) != 0) return;
    printf("gtrain: start: %s\n", split);
    fflush(stdout);
}

/* Rank 0: the pace line (pace.h), once a start, on a line of its own (not after an in-place progress line) */
static void check_pace(run *r, int step, double seconds) {
    char line[1024];
    if (!gt_pace_step(&r->pace, step, r->state.first_step, r->cfg->train.steps, seconds, r->predicted_time.step_s,
                      r->predicted_time.measured, line, sizeof line))
        return;
    if (r->progress.partial) printf("\r\033[K");
    r->progress.partial = 0;
    printf("gtrain: pace: %s\n", line);
    fflush(stdout);
}

static void close_run(run *r) {
    gt_watchdog_stop();
    gt_trace_run_close();
    if (r->metrics) fclose(r->metrics);
    gt_tb_close(r->tb);
    free(r->inputs);
    free(r->targets);
    gt_runstate_free(&r->state);
    gt_optim_free(&r->opt);
    gt_zero_free(&r->zero);
    gt_model_destroy(r->model);
    gt_layout_free(&r->layout);
    gt_data_close(r->val_data);
    gt_data_close(r->train_data);
    if (r->comm && gt_comm_progress_polls(r->comm) && r->rank == 0)
        printf("gtrain: progress thread (dist.progress_us = %d): %llu calls into MPI, %.3f s of CPU on rank 0\n",
               r->cfg->dist.progress_us, gt_comm_progress_polls(r->comm), gt_comm_progress_cpu_seconds(r->comm));
    gt_comm_destroy(r->comm);
    free((gt_config *)r->cfg);
    gt_runclaim_release(); /* last: the final save is complete */
}

/* ---------------------------------------------------------------- one step */

/* Micro-batches: forward and backward of each, gradients adding up locally, no communication.
 * Returns the summed loss of this rank; *bad_micro the first micro-batch whose loss is not finite. */
static double run_micro_batches(run *r, int step, int *recomputed, int *bad_micro) {
    const gt_config *cfg = r->cfg;
    int B = cfg->train.micro_batch, T = cfg->train.seq_len, A = cfg->train.grad_accum;
    double loss_sum = 0.0;
    *bad_micro = -1;
    for (int m = 0; m < A; m++) {
        if (m == A - 1) gt_zero_buckets_arm(&r->zero); /* the last backward starts the buckets */
        uint64_t micro_index = (uint64_t)r->rank * A + m; /* within the global batch */
        uint64_t first = r->state.first_sample + (uint64_t)(step - r->state.first_step) * r->G + micro_index * B;
        gt_trace_micro_begin(m);
        gt_data_train_batch(r->train_data, cfg->train.seed, first, B, T, r->inputs, r->targets);
        gt_rng_key key = {cfg->train.seed, gt_mix64(((uint64_t)step << 24) ^ micro_index)};
        double micro_loss = gt_model_train_micro(r->model, &r->choice.plan, r->inputs, r->targets, B, T, r->dloss,
                                                 key, recomputed);
        micro_loss = gt_test_nan(step, m, r->rank, r->ops->copy_to_device, gt_model_grads(r->model), micro_loss);
        gt_trace_micro_end(m);
        if (!isfinite(micro_loss) && *bad_micro < 0) *bad_micro = m;
        loss_sum += micro_loss;
    }
    gt_zero_buckets_finish(&r->zero); /* the embedding's bucket, then every bucket waited for */
    return loss_sum;
}

/* Reduce, update, publish: gt_optim_step reduces the gradients, clips them by the global norm, runs
 * AdamW on this rank's slice and publishes the new working parameters. A non-finite loss on any rank
 * is agreed first, and a loss spike judged (res->loss is the global loss already); either way the
 * optimizer does not run. Sets res->outcome, res->why for a skipped step, res->lr and res->grad_norm. */
static void reduce_update_publish(run *r, int step, int bad_micro, step_result *res) {
    double zscore = r->cfg->train.spike_zscore, max_grad_norm = 0;
    res->lr = gt_lr_at(r->cfg, step);
    res->grad_norm = NAN;
    if (bad_micro >= 0)
        snprintf(res->why, sizeof res->why, "step %d: the loss of micro-batch %d of %d on rank %d is not finite",
                 step, bad_micro, r->cfg->train.grad_accum, r->rank);
    if (gt_agree_on_failure(r->mpi, bad_micro >= 0, res->why, sizeof res->why)) {
        res->outcome = GT_STEP_SKIPPED_NONFINITE;
        return;
    }
    if (zscore > 0 &&
        gt_spike_check_loss(&r->spikes, zscore, step, res->loss, &max_grad_norm, res->why, sizeof res->why)) {
        res->outcome = GT_STEP_SKIPPED_SPIKE;
        return;
    }
    res->outcome = gt_optim_step(&r->opt, r->cfg, step, max_grad_norm, &res->grad_norm);
    switch (res->outcome) {
    case GT_STEP_APPLIED:
        if (zscore > 0) gt_spike_record(&r->spikes, res->loss, res->grad_norm);
        break;
    case GT_STEP_SKIPPED_SPIKE: /* the norm above max_grad_norm */
        gt_spike_describe_norm(&r->spikes, step, res->grad_norm, res->why, sizeof res->why);
        break;
    case GT_STEP_SKIPPED_NONFINITE:
        snprintf(res->why, sizeof res->why, "step %d: the gradient norm is %g, though the loss of every "
                 "micro-batch was finite", step, res->grad_norm);
        break;
    }
}

/* The global mean loss of the step: one scalar reduction, before the update (spike skipping judges
 * it). It stays out of the step's communication figures (the metrics' calls and comm_ms count the
 * training's own collectives, docs/data-parallel.md): *own is what it added to them. */
static double global_loss(run *r, double loss_sum, double tokens, gt_comm_stats *own) {
    gt_comm_stats before;
    gt_comm_stats_get(r->comm, &before);
    double loss = gt_comm_all_reduce_scalar_sum(r->comm, loss_sum) / tokens;
    gt_comm_stats_get(r->comm, own);
    own->calls_scalar -= before.calls_scalar;
    own->seconds -= before.seconds;
    own->seconds_exposed -= before.seconds_exposed;
    own->seconds_total -= before.seconds_total;
    return loss;
}

/* One optimizer step: micro-batches, then reduce, update and publish. Fills *res; returns 0, or exit 2
 * when the device found bad input (device_faults). */
static int train_step(run *r, int step, step_result *res) {
    const gt_config *cfg = r->cfg;
    double t0 = now_seconds();
    gt_test_hang(step, r->rank); /* GTRAIN_TEST_HANG_AT; inside the step's time: a `slow` step counts */
    memset(res, 0, sizeof *res);
    res->step = step;
    gt_mem_reset_peaks(&r->mem);
    gt_comm_stats_reset(r->comm);
    if (r->choice.grad_micro) r->ops->zero(r->zero.grad_slice, r->zero.shard.slice_len * sizeof(float));
    else r->ops->zero(gt_model_grads(r->model), r->n_padded * sizeof(float));
    uint64_t gathers0 = r->zero.gathers, buckets0 = r->zero.bucket_starts, early0 = r->zero.bucket_early;
    gt_zero_params_reset_max(&r->zero);
    int bad_micro;
    double tokens = (double)r->G * cfg->train.seq_len, counted = tokens;
    if (gt_data_counts_targets(r->train_data)) {
        /* the mean over the counted targets of the whole global batch: every rank counts all G samples
         * itself (the sampler is a pure function), so no rank waits for another's count */
        uint64_t first = r->state.first_sample + (uint64_t)(step - r->state.first_step) * r->G;
        counted = (double)gt_data_train_counted(r->train_data, cfg->train.seed, first, r->G, cfg->train.seq_len);
        r->dloss = counted > 0 ? (float)(1.0 / counted) : 0.0f; /* none counted: the loss is 0/0, not finite */
    }
    double loss_sum = run_micro_batches(r, step, &res->recomputed, &bad_micro);
    gt_comm_stats loss_comm;
    res->loss = global_loss(r, loss_sum, counted, &loss_comm);
    reduce_update_publish(r, step, bad_micro, res);
    if (res->outcome == GT_STEP_SKIPPED_SPIKE ||
        (res->outcome == GT_STEP_SKIPPED_NONFINITE && cfg->train.nonfinite != GT_NONFINITE_STOP))
        r->state.skipped_steps++;
    gt_comm_stats_get(r->comm, &res->comm);
    res->comm.calls_scalar -= loss_comm.calls_scalar;
    res->comm.seconds -= loss_comm.seconds;
    res->comm.seconds_exposed -= loss_comm.seconds_exposed;
    res->comm.seconds_total -= loss_comm.seconds_total;
    r->ops->synchronize();
    res->seconds = now_seconds() - t0;
    char fault[3000];
    int rc = device_faults(r->ops, r->mpi, cfg->data.train, fault, sizeof fault);
    if (rc) return rc;
    r->state.tokens_seen += r->G * (uint64_t)cfg->train.seq_len;
    res->tokens = r->state.tokens_seen;
    res->tok_per_s = tokens / res->seconds;
    res->mfu = r->peak_flops > 0 ? r->flops_per_step / res->seconds / r->peak_flops : NAN;
    res->unit_gathers = r->zero.gathers - gathers0;
    res->buckets = r->zero.bucket_starts - buckets0;
    res->buckets_early = r->zero.bucket_early - early0;
    res->param_gathers_max = r->zero.params_live_max;
    res->act_peak_bytes = r->mem.peak[GT_MEM_ACT];
    res->mem_peak_bytes = r->mem.total_peak;
    res->params_peak_bytes = r->mem.peak[GT_MEM_PARAMS];
    res->grads_peak_bytes = r->mem.peak[GT_MEM_GRADS];
    res->staging_peak_bytes = gt_comm_staging_peak_bytes(r->comm);
    res->skipped_steps = r->state.skipped_steps;
    return 0;
}

/* ---------------------------------------------------------------- reporting */

/* The step's line of log.metrics (docs/data-parallel.md, "What the metrics say"). */
static void write_metrics(FILE *f, const run *r, const step_result *res) {
    const gt_comm_stats *st = &res->comm;
    fprintf(f, "{\"step\":%d,", res->step);
    write_json_number(f, "loss", res->loss, 0);
    write_json_number(f, "lr", res->lr, 0);
    write_json_number(f, "grad_norm", res->grad_norm, 0);
    fprintf(f, "\"tokens\":%llu,", (unsigned long long)res->tokens);
    write_json_number(f, "tok_per_s", res->tok_per_s, 0);
    write_json_number(f, "step_ms", res->seconds * 1e3, 0);
    write_json_number(f, "predicted_step_ms", r->predicted_time.step_s * 1e3, 0);
    write_json_number(f, "save_blocking_ms", r->state.save_blocking_ms, 0);
    write_json_number(f, "mfu", res->mfu, 0);
    fprintf(f,
            "\"act_peak_bytes\":%llu,\"mem_peak_bytes\":%llu,\"recomputed_blocks\":%d,"
            "\"optim_bytes\":%llu,\"comm_bytes\":%llu,\"comm_ms\":%.3f,\"comm_exposed_ms\":%.3f,\"comm_total_ms\":%.3f,"
            "\"params_peak_bytes\":%llu,\"grads_peak_bytes\":%llu,\"comm_staging_bytes\":%llu,\"unit_gathers\":%llu,"
            "\"buckets\":%llu,\"buckets_early\":%llu,\"param_gathers_in_flight\":%d,"
            "\"calls\":{\"all_reduce\":%llu,\"reduce_scatter\":%llu,\"all_gather\":%llu,"
            "\"reduce_scatter_v\":%llu,\"all_gather_v\":%llu,\"scalar\":%llu},\"skipped_steps\":%lld,",
            (unsigned long long)res->act_peak_bytes, (unsigned long long)res->mem_peak_bytes, res->recomputed,
            (unsigned long long)gt_optim_bytes(&r->opt), (unsigned long long)st->bytes_sent, st->seconds * 1e3,
            st->seconds_exposed * 1e3, st->seconds_total * 1e3, (unsigned long long)res->params_peak_bytes,
            (unsigned long long)res->grads_peak_bytes, (unsigned long long)res->staging_peak_bytes,
            (unsigned long long)res->unit_gathers,
            (unsigned long long)res->buckets, (unsigned long long)res->buckets_early, res->param_gathers_max,
            (unsigned long long)st->calls_all_reduce, (unsigned long long)st->calls_reduce_scatter,
            (unsigned long long)st->calls_all_gather, (unsigned long long)st->calls_reduce_scatter_v,
            (unsigned long long)st->calls_all_gather_v, (unsigned long long)st->calls_scalar,
            (long long)res->skipped_steps);
    if (r->ops->reserved_bytes)
        fprintf(f, "\"mem_reserved_bytes\":%llu}\n", (unsigned long long)r->ops->reserved_bytes());
    else
        fprintf(f, "\"mem_reserved_bytes\":null}\n");
    fflush(f);
}

/* The step's scalars in log.tensorboard (tbevents.h names the tags). */
static void write_tensorboard(const run *r, const step_result *res) {
    gt_tb_step s = {res->loss, res->lr, res->grad_norm, res->tok_per_s, res->seconds * 1e3, res->mfu,
                    r->state.save_blocking_ms, (double)res->act_peak_bytes, (double)res->mem_peak_bytes,
                    r->ops->reserved_bytes ? (double)r->ops->reserved_bytes() : NAN};
    gt_tb_write_step(r->tb, res->step, &s);
}

/* A step that applied no update: a spike is skipped; a non-finite loss or norm ends the run with
 * train.nonfinite = stop (exit 1), and is skipped with skip. */
static int report_skipped(run *r, const step_result *res) {
    if (res->outcome == GT_STEP_SKIPPED_SPIKE) {
        if (r->rank == 0)
            fprintf(stderr, "gtrain: %s; the step is skipped, no update applied (train.spike_zscore = %g; %lld skipped "
                    "so far)\n", res->why, r->cfg->train.spike_zscore, (long long)r->state.skipped_steps);
        return 0;
    }
    char newest[GT_PATH_MAX + 128];
    gt_runstate_describe_newest(&r->state, newest, sizeof newest);
    if (r->cfg->train.nonfinite == GT_NONFINITE_STOP) {
        if (r->rank == 0)
            fprintf(stderr, "gtrain: %s; no update was applied and nothing was saved; %s (train.nonfinite "
                    "= stop; exit %d)\n", res->why, newest, GT_EXIT_FAILURE);
        return GT_EXIT_FAILURE;
    }
    if (r->rank == 0)
        fprintf(stderr, "gtrain: %s; the step is skipped, no update applied (train.nonfinite = skip; %lld "
                "skipped so far)\n", res->why, (long long)r->state.skipped_steps);
    return 0;
}

/* The validation loss every data.val_every steps and after the last. */
static int validate(run *r, int step) {
    const gt_config *cfg = r->cfg;
    if (!r->val_data || cfg->data.val_every <= 0 || (step % cfg->data.val_every != 0 && step != cfg->train.steps))
        return 0;
    double val_loss = evaluate(r->model, r->val_data, -1, cfg, r->comm, r->choice.stage == 3);
    /* several validation sources: each one's loss too (a source with no window has none) */
    enum { MAX_SRC = 64 };
    int n_src = gt_data_n_sources(r->val_data);
    n_src = n_src > 1 ? (n_src < MAX_SRC ? n_src : MAX_SRC) : 0;
    double per[MAX_SRC];
    for (int j = 0; j < n_src; j++)
        per[j] = gt_data_val_windows_source(r->val_data, j, cfg->train.seq_len)
                     ? evaluate(r->model, r->val_data, j, cfg, r->comm, r->choice.stage == 3) : NAN;
    char fault[3000];
    int rc = device_faults(r->ops, r->mpi, cfg->data.val, fault, sizeof fault);
    if (rc) return rc;
    if (r->rank == 0) {
        if (r->progress.partial) printf("\r\033[K");
        r->progress.partial = 0;
        printf("step %d | val_loss %.4f", step, val_loss);
        for (int j = 0; j < n_src; j++)
            if (!isnan(per[j])) printf(" | %s %.4f", gt_data_source_name(r->val_data, j), per[j]);
        printf("\n");
        fflush(stdout);
    }
    if (r->metrics) {
        /* one line; a loss that is not finite (no target counted, with masks) is null */
        fprintf(r->metrics, "{\"step\":%d", step);
        for (int j = -1; j < n_src; j++) {
            double v = j < 0 ? val_loss : per[j];
            if (j >= 0 && isnan(v)) continue; /* a source without a window */
            if (j < 0) fprintf(r->metrics, ",\"val_loss\":");
            else fprintf(r->metrics, ",\"val_loss.%s\":", gt_data_source_name(r->val_data, j));
            if (isfinite(v)) fprintf(r->metrics, "%.9g", v);
            else fprintf(r->metrics, "null");
        }
        fprintf(r->metrics, "}\n");
        fflush(r->metrics);
    }
    if (r->tb) {
        gt_tb_scalar(r->tb, step, "val/loss", val_loss);
        for (int j = 0; j < n_src; j++) {
            char tag[128];
            snprintf(tag, sizeof tag, "val/loss.%s", gt_data_source_name(r->val_data, j));
            if (!isnan(per[j])) gt_tb_scalar(r->tb, step, tag, per[j]);
        }
        gt_tb_flush(r->tb);
    }
    return 0;
}

/* ---------------------------------------------------------------- the loop */

int gt_train(const gt_config *cfg, MPI_Comm world_comm) {
    run r;
    int rc = open_run(&r, cfg, world_comm);
    for (int step = r.state.first_step; !rc && step <= r.cfg->train.steps; step++) {
        step_result res;
        gt_watchdog_step_begin(step);
        gt_trace_step_begin(step);
        if ((rc = train_step(&r, step, &res))) break;
        gt_trace_step_end(step);
        if (step == r.state.first_step) gt_startup_mark(GT_STARTUP_FIRST_STEP);
        gt_watchdog_step_done(step, res.seconds);
        if (r.rank == 0)
            progress_update(&r.progress, step, res.loss, res.lr, res.grad_norm, res.tok_per_s, res.seconds, res.mfu);
        if (r.rank == 0 && step == r.state.first_step) say_start_split();
        if (r.rank == 0) check_pace(&r, step, res.seconds);
        int stop = res.outcome == GT_STEP_APPLIED ? 0 : report_skipped(&r, &res);
        /* save when due, or stop on a signal; before the metrics line, which carries save_blocking_ms,
         * and that line before the step's validation line, as readers of the metrics expect */
        r.state.save_blocking_ms = 0;
        double save_start = gt_trace_clock();
        r.state.step_seconds = res.seconds; /* checkpoint.every = auto measures steps */
        if (!stop) rc = gt_runstate_after_step(&r.state, step);
        gt_trace_save(step, save_start, r.state.save_blocking_ms);
        if (r.metrics) write_metrics(r.metrics, &r, &res);
        if (r.tb) write_tensorboard(&r, &res);
        if (!stop && !rc) gt_runstate_snapshot(&r.state, step);
        if (!stop && !rc) stop = validate(&r, step);
        if (stop) {
            rc = stop;
            break;
        }
    }
    if (rc == GT_EXIT_OK) rc = gt_runstate_end(&r.state);
    else if (r.state.cfg) gt_runstate_settle(&r.state); /* every rank stops here together */
    close_run(&r);
    return rc;
}
