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
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "comm.h"
#include "data.h"
#include "hf_import.h"
#include "memtrack.h"
#include "model.h"
#include "optim.h"
#include "planner.h"
#include "preflight.h"
#include "recompute.h"
#include "runstate.h"
#include "zero.h"

#define H200_BF16_DENSE_FLOPS 989e12 /* H100/H200 SXM dense bf16 peak, NVIDIA datasheet */

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

int gt_agree_on_failure(MPI_Comm comm, int code, char *msg, size_t msg_len) {
    int worst = 0, world, rank;
    MPI_Comm_size(comm, &world);
    MPI_Comm_rank(comm, &rank);
    MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, comm);
    if (!worst) return 0;
    int mine = code == worst ? rank : world, who = 0;
    MPI_Allreduce(&mine, &who, 1, MPI_INT, MPI_MIN, comm);
    MPI_Bcast(msg, (int)msg_len, MPI_CHAR, who, comm);
    return worst;
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
        ops = gpu >= 0 ? gt_ops_cuda(want_bf16, why, sizeof why) : NULL;
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
    if (!ops) {
        if (cfg->train.precision == GT_PRECISION_BF16) {
            snprintf(msg, sizeof msg, "%s: [train] precision = bf16 needs the CUDA backend; the CPU runs fp32",
                     cfg->path);
            return fail_input(rank, msg);
        }
        ops = gt_ops_cpu();
    }
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

static double evaluate(gt_model *model, gt_data *val, const gt_config *cfg, gt_comm *comm, int lockstep) {
    int B = cfg->train.micro_batch, T = cfg->train.seq_len;
    int rank = gt_comm_rank(comm), world = gt_comm_size(comm);
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    if (!in || !tg) abort();
    double sum = 0.0;
    /* Every rank runs the same number of forwards: under ZeRO-3 each one gathers units collectively,
     * so a rank without a batch of its own left runs batch 0 again and drops the result. */
    int rounds = (cfg->data.val_batches + world - 1) / world;
    for (int i = 0; i < rounds; i++) {
        int b = i * world + rank, mine = b < cfg->data.val_batches;
        if (!mine && !lockstep) break;
        gt_data_val_batch(val, mine ? b : 0, B, T, in, tg);
        double l = gt_model_eval(model, in, tg, B, T, NULL);
        if (mine) sum += l;
    }
    free(in);
    free(tg);
    sum = gt_comm_all_reduce_scalar_sum(comm, sum);
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
                            double step_s) {
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
        printf("step %*d/%d | loss %.4f | lr %.2e | norm %.4f | %.0f tok/s | %.1f ms | eta %s\n", p->width, step,
               p->last_step, loss, lr, norm, tok_per_s, step_s * 1e3, eta);
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

/* GTRAIN_TEST_NAN_AT=STEP:MICRO[:RANK[:grad]] (tests only): at optimizer step STEP, after
 * micro-batch MICRO of rank RANK (default 0), one gradient element becomes NaN and, unless `grad`
 * is given, so does that micro-batch's loss, as an overflow in the forward pass would make them. */
typedef struct nan_hook {
    int step, micro, rank, grad_only; /* step 0: off */
} nan_hook;

static nan_hook test_nan_hook(void) {
    nan_hook h = {0, 0, 0, 0};
    const char *env = getenv("GTRAIN_TEST_NAN_AT");
    char kind[8] = "";
    if (env && sscanf(env, "%d:%d:%d:%7s", &h.step, &h.micro, &h.rank, kind) >= 2)
        h.grad_only = strcmp(kind, "grad") == 0;
    else
        h.step = 0;
    return h;
}

static double inject_nan(const gt_ops *ops, gt_model *model, int grad_only, double loss) {
    float nan_value = NAN;
    ops->copy_to_device(gt_model_grads(model), &nan_value, sizeof nan_value);
    return grad_only ? loss : NAN;
}

int gt_train(const gt_config *cfg, MPI_Comm world_comm) {
    int rank, world;
    MPI_Comm_rank(world_comm, &rank);
    MPI_Comm_size(world_comm, &world);
    char msg[2048], err[3000];
    /* everything the run holds, released in one place at the end */
    int rc = GT_EXIT_OK;
    gt_comm *comm = NULL;
    gt_data *train_data = NULL, *val_data = NULL;
    gt_mem mem;
    gt_layout layout = {0};
    gt_model *model = NULL;
    gt_optim opt = {0};
    gt_zero zero = {0};
    gt_run_state run = {0};
    FILE *metrics = NULL;
    int32_t *inputs = NULL, *targets = NULL;

    const gt_ops *ops = NULL;
    rc = choose_backend(cfg, world_comm, &ops);
    if (rc) return rc;
    int stage = cfg->dist.shard == GT_SHARD_AUTO ? -1 : (int)cfg->dist.shard; /* the values are the stages */

    /* communicator */
    int is_cuda = strcmp(ops->name, "cuda") == 0;
    if (!is_cuda && cfg->dist.comm == GT_COMM_NCCL) {
        snprintf(msg, sizeof msg, "%s: [dist] comm = nccl needs the CUDA backend", cfg->path);
        return fail_input(rank, msg);
    } else if (gt_plan_uses_nccl(is_cuda, world, cfg->dist.comm)) {
        /* comm = nccl, or auto on more than one GPU rank: the planner counts NCCL's buffers by this rule */
        char why[256];
        comm = gt_comm_create_nccl(world_comm, why, sizeof why);
        if (!comm) {
            snprintf(msg, sizeof msg, "%s: [dist] comm: NCCL is not usable: %s", cfg->path, why);
            return fail_input(rank, msg);
        }
    } else if (is_cuda && world == 1) {
        /* one GPU: nothing to reduce, so no NCCL (or host MPI) for collectives never made */
        char why[256];
        comm = gt_comm_create_local(world_comm, ops->copy, why, sizeof why);
        if (!comm) {
            snprintf(msg, sizeof msg, "%s: [dist] comm: %s", cfg->path, why);
            return fail_input(rank, msg);
        }
    } else {
        if (is_cuda && world > 1) { /* the MPI communicator moves host memory; CUDA tensors live on the GPU */
            snprintf(msg, sizeof msg,
                     "%s: [dist] comm = mpi works on host memory and the CUDA backend keeps its tensors on the "
                     "GPU (expected comm = nccl or auto with a GPU, or train.device = cpu)", cfg->path);
            return fail_input(rank, msg);
        }
        comm = gt_comm_create_mpi(world_comm);
    }

    /* plan */
    gt_policy policy;
    gt_plan plan;
    if (gt_policy_parse(cfg->memory.recompute, cfg->model.n_layers, &policy, err, sizeof err) != 0) {
        rc = fail_input(rank, err);
        goto done;
    }
    /* dist.shard, dist.grad_sync and memory.recompute: any of them `auto` are chosen together */
    int want_micro = cfg->dist.grad_sync == GT_GRAD_SYNC_AUTO ? -1 : cfg->dist.grad_sync == GT_GRAD_SYNC_MICRO;
    uint64_t library = gt_plan_library_bytes(is_cuda, world, cfg->dist.comm, &cfg->model, cfg->train.micro_batch,
                                             cfg->train.seq_len);
    gt_mem_shape shape = {cfg->model, cfg->train.micro_batch, cfg->train.seq_len, ops->act_bytes,
                          ops->can_keep_attention_probs, world, stage >= 1, library,
                          stage, want_micro == 1, cfg->train.grad_accum, cfg->dist.prefetch};
    int chosen_by_auto = stage < 0 || policy.kind == GT_POLICY_AUTO || (stage >= 2 && want_micro < 0);
    if (chosen_by_auto) {
        gt_mem_estimate est;
        if (gt_plan_auto_all(&shape, stage, want_micro, &policy, cfg->memory.budget, &plan, &est) != 0) {
            char need[32], have[32];
            gt_format_bytes(est.total_bytes, need, sizeof need);
            gt_format_bytes(cfg->memory.budget, have, sizeof have);
            snprintf(msg, sizeof msg,
                     "%s: [memory] budget = %s: nothing fits (dist.shard = %s, dist.grad_sync = %s, "
                     "memory.recompute = %s); the smallest needs %s per rank",
                     cfg->path, have, gt_shard_stage_name(cfg->dist.shard), gt_grad_sync_name(cfg->dist.grad_sync),
                     cfg->memory.recompute, need);
            rc = fail_input(rank, msg);
            goto done;
        }
        stage = shape.stage;
    }
    int sharded = stage >= 1, grad_micro = stage >= 2 && shape.grad_micro;
    shape.grad_micro = grad_micro;
    gt_mem_estimate predicted;
    if (chosen_by_auto) gt_plan_estimate(&shape, &plan, &predicted);
    else gt_plan_for_policy(&plan, &policy, &shape, &predicted); /* the tail kept when that is free */
    /* before the first allocation: does the plan fit what each rank can have? */
    rc = gt_preflight_memory(cfg, ops, world_comm, &predicted);
    if (rc) goto done;

    /* data (each rank opens the files itself: they may be missing or different on some nodes) */
    err[0] = '\0';
    int bad = 0;
    const char *paths[2] = {cfg->data.train, cfg->data.val};
    gt_data **sets[2] = {&train_data, &val_data};
    for (int i = 0; i < 2 && !bad && paths[i][0]; i++) {
        gt_data *d = *sets[i] = gt_data_open(paths[i], err, sizeof err);
        if (!d || gt_data_check_seq(d, cfg->train.seq_len, err, sizeof err) != 0 ||
            gt_data_check_vocab(d, cfg->model.vocab_size, err, sizeof err) != 0) /* no missing embedding row */
            bad = 1;
    }
    rc = agree_input(world_comm, bad ? GT_EXIT_BAD_INPUT : 0, err, sizeof err);
    if (rc) goto done;

    /* model, parameters, optimizer: ZeRO-3 holds no full parameter buffer and grad_sync = micro no
     * full gradient buffer; zero.c gathers and reduces their units */
    gt_mem_init(&mem, ops);
    gt_layout_init(&layout, &cfg->model);
    size_t n_padded = gt_optim_padded_len(layout.n_params, world, sharded);
    model = gt_model_create_buffers(ops, &mem, &cfg->model, stage == 3 ? 0 : n_padded, grad_micro ? 0 : n_padded);
    if (stage >= 2) {
        gt_zero_init(&zero, ops, &mem, comm, &layout, stage, grad_micro, cfg->dist.prefetch);
        gt_unit_hooks hooks;
        gt_zero_hooks(&zero, &hooks);
        gt_model_set_unit_hooks(model, &hooks);
    }
    gt_optim_init(&opt, ops, &mem, comm, model, sharded, NULL);
    opt.grad_slice = zero.grad_slice;
    opt.param_shard = zero.param_shard;
    if (!cfg->model.init[0]) { /* random; with model.init the import (or a resume) fills the master */
        /* each rank draws only its own slice (counter-based: the same values at any world size) */
        size_t count = gt_shard_count(&opt.shard);
        float *init = malloc((count ? count : 1) * sizeof *init);
        if (!init) abort();
        gt_layout_init_params_range(&layout, init, opt.shard.begin, opt.shard.end, cfg->train.seed);
        if (count) ops->copy_to_device(opt.master, init, count * sizeof(float));
        free(init);
        gt_optim_publish_params(&opt);
    }

    int B = cfg->train.micro_batch, T = cfg->train.seq_len, A = cfg->train.grad_accum;
    uint64_t G = (uint64_t)B * A * world;
    rc = gt_runstate_begin(&run, cfg, comm, world_comm, model, &opt, G);
    if (rc) goto done;
    if (cfg->model.init[0]) {
        rc = import_checkpoint(cfg, &opt, &layout, world_comm, run.first_step > 1);
        if (rc) goto done;
    }

    if (rank == 0 && cfg->log.metrics[0]) {
        metrics = fopen(cfg->log.metrics, run.first_step > 1 ? "a" : "w");
        if (!metrics) fprintf(stderr, "gtrain: cannot write %s; metrics off\n", cfg->log.metrics);
    }
    if (rank == 0) {
        char desc[256], params_b[32], act_b[32];
        gt_plan_describe(&plan, desc, sizeof desc);
        gt_format_bytes(predicted.params_bytes + predicted.grads_bytes + predicted.optim_bytes, params_b,
                        sizeof params_b);
        gt_format_bytes(predicted.act_peak_bytes, act_b, sizeof act_b);
        static const char *const stage_names[] = {"none", "optimizer", "gradients", "parameters"};
        printf("gtrain: %zu parameters, %s backend, %d rank%s (%s), shard %s%s, global batch %llu x %d tokens\n",
               layout.n_params, ops->name, world, world == 1 ? "" : "s", gt_comm_name(comm), stage_names[stage],
               cfg->dist.shard == GT_SHARD_AUTO ? " (auto)" : "",
               (unsigned long long)G, T);
        printf("gtrain: recompute %s (%s); predicted per rank: state %s, activations %s\n", cfg->memory.recompute,
               desc, params_b, act_b);
        if (stage >= 2)
            printf("gtrain: ZeRO-%d, grad_sync %s%s; predicted peaks per rank: params_peak_bytes %llu, "
                   "grads_peak_bytes %llu\n", stage, grad_micro ? "micro" : "step",
                   cfg->dist.grad_sync == GT_GRAD_SYNC_AUTO ? " (auto)" : "",
                   (unsigned long long)predicted.params_bytes, (unsigned long long)predicted.grads_bytes);
        char files[1024];
        gt_data_describe(train_data, files, sizeof files);
        printf("gtrain: train data %s\n", files);
        if (val_data) gt_data_describe(val_data, files, sizeof files);
        printf("gtrain: validation data %s\n", val_data ? files : "none (data.val is empty)");
        gt_config defaults; /* the built-in corpus: data/fortunes.{train,val}.bin */
        gt_config_defaults(&defaults);
        if (val_data && strcmp(cfg->data.train, defaults.data.train) != 0 &&
            strcmp(cfg->data.val, defaults.data.val) == 0)
            fprintf(stderr, "gtrain: warning: data.train is set to %s but data.val is still the built-in "
                    "corpus %s; set [data] val to your own validation files (or to nothing)\n",
                    cfg->data.train, cfg->data.val);
        fflush(stdout);
    }

    inputs = malloc((size_t)B * T * sizeof *inputs);
    targets = malloc((size_t)B * T * sizeof *targets);
    if (!inputs || !targets) abort();
    float dloss = (float)(1.0 / ((double)G * T));
    /* model FLOPs per rank and step (MFU): 3 forwards' worth, recompute not counted */
    double flops_per_step = 3.0 * predicted.forward_flops * A;
    int stop_on_nonfinite = cfg->train.nonfinite == GT_NONFINITE_STOP;
    nan_hook nan_hook = test_nan_hook();
    progress progress = {progress_in_place(), (int)snprintf(NULL, 0, "%d", cfg->train.steps), run.first_step,
                         cfg->train.steps, cfg->log.every, 0.0, 0, 0};

    for (int step = run.first_step; step <= cfg->train.steps; step++) {
        double t0 = now_seconds();
        gt_mem_reset_peaks(&mem);
        gt_comm_stats_reset(comm);
        if (grad_micro) ops->zero(zero.grad_slice, zero.shard.slice_len * sizeof(float));
        else ops->zero(gt_model_grads(model), n_padded * sizeof(float));
        uint64_t gathers0 = zero.gathers;
        double loss_sum = 0.0;
        int recomputed = 0, bad_micro = -1;
        for (int m = 0; m < A; m++) {
            uint64_t micro_index = (uint64_t)rank * A + m; /* within the global batch */
            uint64_t first = run.first_sample + (uint64_t)(step - run.first_step) * G + micro_index * B;
            gt_data_train_batch(train_data, cfg->train.seed, first, B, T, inputs, targets);
            gt_rng_key key = {cfg->train.seed, gt_mix64(((uint64_t)step << 24) ^ micro_index)};
            double micro_loss = gt_model_train_micro(model, &plan, inputs, targets, B, T, dloss, key, &recomputed);
            if (nan_hook.step == step && nan_hook.micro == m && nan_hook.rank == rank)
                micro_loss = inject_nan(ops, model, nan_hook.grad_only, micro_loss);
            if (!isfinite(micro_loss) && bad_micro < 0) bad_micro = m;
            loss_sum += micro_loss;
        }
        /* a non-finite loss on any rank: agreed before the optimizer step, which is then not taken;
         * a non-finite gradient norm: the optimizer step applies nothing (sr.applied = 0) */
        err[0] = '\0';
        if (bad_micro >= 0)
            snprintf(err, sizeof err, "step %d: the loss of micro-batch %d of %d on rank %d is not finite", step,
                     bad_micro, A, rank);
        int nonfinite = gt_agree_on_failure(world_comm, bad_micro >= 0, err, sizeof err);
        gt_step_result sr = {NAN, gt_lr_at(cfg, step), 0};
        if (!nonfinite) gt_optim_step(&opt, cfg, step, &sr);
        if (!nonfinite && !sr.applied) {
            nonfinite = 1;
            snprintf(err, sizeof err, "step %d: the gradient norm is %g, though the loss of every micro-batch was "
                     "finite", step, sr.grad_norm);
        }
        if (nonfinite && !stop_on_nonfinite) run.skipped_steps++;
        gt_comm_stats stats;
        gt_comm_stats_get(comm, &stats);
        double loss = gt_comm_all_reduce_scalar_sum(comm, loss_sum) / ((double)G * T);
        ops->synchronize();
        double step_s = now_seconds() - t0;
        rc = device_faults(ops, world_comm, cfg->data.train, err, sizeof err);
        if (rc) break;
        run.tokens_seen += G * (uint64_t)T;
        double tok_per_s = (double)G * T / step_s;
        double mfu = is_cuda ? flops_per_step / step_s / H200_BF16_DENSE_FLOPS : NAN;

        if (rank == 0) progress_update(&progress, step, loss, sr.lr, sr.grad_norm, tok_per_s, step_s);
        if (metrics) {
            fprintf(metrics, "{\"step\":%d,", step);
            write_json_number(metrics, "loss", loss, 0);
            write_json_number(metrics, "lr", sr.lr, 0);
            write_json_number(metrics, "grad_norm", sr.grad_norm, 0);
            fprintf(metrics, "\"tokens\":%llu,", (unsigned long long)run.tokens_seen);
            write_json_number(metrics, "tok_per_s", tok_per_s, 0);
            write_json_number(metrics, "step_ms", step_s * 1e3, 0);
            write_json_number(metrics, "mfu", mfu, 0);
            fprintf(metrics,
                    "\"act_peak_bytes\":%llu,\"mem_peak_bytes\":%llu,\"recomputed_blocks\":%d,"
                    "\"optim_bytes\":%llu,\"comm_bytes\":%llu,\"comm_ms\":%.3f,\"comm_total_ms\":%.3f,"
                    "\"params_peak_bytes\":%llu,\"grads_peak_bytes\":%llu,\"unit_gathers\":%llu,"
                    "\"calls\":{\"all_reduce\":%llu,\"reduce_scatter\":%llu,\"all_gather\":%llu,"
                    "\"reduce_scatter_v\":%llu,\"all_gather_v\":%llu,\"scalar\":%llu},\"skipped_steps\":%lld,",
                    (unsigned long long)mem.peak[GT_MEM_ACT], (unsigned long long)mem.total_peak, recomputed,
                    (unsigned long long)gt_optim_bytes(&opt), (unsigned long long)stats.bytes_sent,
                    stats.seconds * 1e3, stats.seconds_total * 1e3, (unsigned long long)mem.peak[GT_MEM_PARAMS],
                    (unsigned long long)mem.peak[GT_MEM_GRADS], (unsigned long long)(zero.gathers - gathers0),
                    (unsigned long long)stats.calls_all_reduce, (unsigned long long)stats.calls_reduce_scatter,
                    (unsigned long long)stats.calls_all_gather, (unsigned long long)stats.calls_reduce_scatter_v,
                    (unsigned long long)stats.calls_all_gather_v, (unsigned long long)stats.calls_scalar,
                    (long long)run.skipped_steps);
            if (ops->reserved_bytes)
                fprintf(metrics, "\"mem_reserved_bytes\":%llu}\n", (unsigned long long)ops->reserved_bytes());
            else
                fprintf(metrics, "\"mem_reserved_bytes\":null}\n");
            fflush(metrics);
        }
        if (nonfinite) {
            char newest[GT_PATH_MAX + 128];
            gt_runstate_describe_newest(&run, newest, sizeof newest);
            if (stop_on_nonfinite) {
                if (rank == 0)
                    fprintf(stderr, "gtrain: %s; no update was applied and nothing was saved; %s (train.nonfinite "
                            "= stop; exit %d)\n", err, newest, GT_EXIT_FAILURE);
                rc = GT_EXIT_FAILURE;
                break;
            }
            if (rank == 0)
                fprintf(stderr, "gtrain: %s; the step is skipped, no update applied (train.nonfinite = skip; %lld "
                        "skipped so far)\n", err, (long long)run.skipped_steps);
        }
        if (val_data && cfg->data.val_every > 0 && (step % cfg->data.val_every == 0 || step == cfg->train.steps)) {
            double val_loss = evaluate(model, val_data, cfg, comm, stage == 3);
            rc = device_faults(ops, world_comm, cfg->data.val, err, sizeof err);
            if (rc) break;
            if (rank == 0) {
                if (progress.partial) printf("\r\033[K");
                progress.partial = 0;
                printf("step %d | val_loss %.4f\n", step, val_loss);
                fflush(stdout);
            }
            if (metrics) {
                fprintf(metrics, "{\"step\":%d,\"val_loss\":%.9g}\n", step, val_loss);
                fflush(metrics);
            }
        }
        rc = gt_runstate_after_step(&run, step);
        if (rc) break;
    }
    if (rc == GT_EXIT_OK) rc = gt_runstate_end(&run);

done:
    if (metrics) fclose(metrics);
    free(inputs);
    free(targets);
    gt_runstate_free(&run);
    gt_optim_free(&opt);
    gt_zero_free(&zero);
    gt_model_destroy(model);
    gt_layout_free(&layout);
    gt_data_close(val_data);
    gt_data_close(train_data);
    gt_comm_destroy(comm);
    return rc;
}
