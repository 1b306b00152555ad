/*
 * config.h — the run configuration: INI file (parsed with libinih) plus `section.key=value`
 * overrides from the command line, typed and validated before any work starts.
 *
 * Every key has a default (documented in configs/README.md); unknown sections or keys are errors.
 * A problem is reported as one message naming the file, the line (for values from the file, or
 * "command line" for overrides) and the key, and the caller exits with code 2.
 */
#ifndef GT_CONFIG_H
#define GT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h" /* gt_cuda_attention */

#include "pathmax.h" /* GT_PATH_MAX */

#define GT_INT_AUTO (-1) /* an integer key set to auto (train.micro_batch, dist.prefetch: the planner chooses;
                          * checkpoint.every, checkpoint.memory_every: autosave.h) */
#define GT_DOUBLE_AUTO (-1.0) /* a number key set to auto (dist.bucket_mb: the planner chooses) */
#define GT_CONFIG_MAX_KEYS 128 /* room for config.c's key table (checked there) */

/* The choice-valued settings, as the loader leaves them. Each has one name table in config.c, used
 * to parse the INI, to print banners and to write the /config text of state files; gt_*_name gives
 * the name of a value as the INI spells it. */
typedef enum gt_device { GT_DEVICE_AUTO, GT_DEVICE_CPU, GT_DEVICE_CUDA } gt_device;
typedef enum gt_precision { GT_PRECISION_AUTO, GT_PRECISION_FP32, GT_PRECISION_BF16 } gt_precision;
typedef enum gt_nonfinite { GT_NONFINITE_STOP, GT_NONFINITE_SKIP } gt_nonfinite;
/* data.loss_mask; the same order as data.h's GT_DATA_MASK_* */
typedef enum gt_loss_mask { GT_LOSS_MASK_AUTO, GT_LOSS_MASK_ON, GT_LOSS_MASK_OFF } gt_loss_mask;
typedef enum gt_lr_schedule { GT_LR_COSINE, GT_LR_LINEAR, GT_LR_CONSTANT } gt_lr_schedule;
/* the values of none..parameters are the ZeRO stages 0..3 */
typedef enum gt_shard_stage {
    GT_SHARD_NONE, GT_SHARD_OPTIMIZER, GT_SHARD_GRADIENTS, GT_SHARD_PARAMETERS, GT_SHARD_AUTO
} gt_shard_stage;
typedef enum gt_comm_choice { GT_COMM_AUTO, GT_COMM_NCCL, GT_COMM_MPI } gt_comm_choice;
typedef enum gt_grad_sync { GT_GRAD_SYNC_AUTO, GT_GRAD_SYNC_STEP, GT_GRAD_SYNC_MICRO } gt_grad_sync;
typedef enum gt_rope_type { GT_ROPE_DEFAULT, GT_ROPE_LLAMA3 } gt_rope_type;
/* checkpoint.resume is auto, never or a path: the text stays in the config (a path has no name
 * table); gt_config_resume says which */
typedef enum gt_resume { GT_RESUME_AUTO, GT_RESUME_NEVER, GT_RESUME_PATH } gt_resume;

/* GT_MAX_LAYERS and memory.recompute's parsed form (gt_policy, gt_policy_parse): recompute.h. */

const char *gt_device_name(gt_device v);
const char *gt_precision_name(gt_precision v);
const char *gt_nonfinite_name(gt_nonfinite v);
const char *gt_loss_mask_name(gt_loss_mask v);
const char *gt_lr_schedule_name(gt_lr_schedule v);
const char *gt_shard_stage_name(gt_shard_stage v);
const char *gt_comm_choice_name(gt_comm_choice v);
const char *gt_grad_sync_name(gt_grad_sync v);
const char *gt_rope_type_name(gt_rope_type v);

typedef struct gt_model_config {
    int dim;           /* C, hidden size */
    int n_layers;      /* N, transformer blocks */
    int n_heads;       /* NH */
    int n_kv_heads;    /* NKV (grouped-query attention; == n_heads for MHA) */
    int vocab_size;    /* V */
    int ffn_dim;       /* F, SwiGLU inner size */
    int max_seq_len;
    float norm_eps;
    float rope_theta;
    float dropout;     /* attention-probability and residual-branch dropout, training only */
    int tie_word_embeddings; /* 1: the LM head is model.embed_tokens.weight (no lm_head.weight) */
    /* RoPE frequency scaling, Hugging Face's rope_parameters / rope_scaling: rope_type default
     * (none) or llama3 (LLaMA-3.1: the four numbers below, as transformers names them) */
    gt_rope_type rope_type;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position_embeddings;
    char init[GT_PATH_MAX]; /* a Hugging Face checkpoint directory to start from; "" = random init */
} gt_model_config;

typedef struct gt_config {
    gt_model_config model;
    struct {
        int seq_len;
        int micro_batch;       /* sequences per rank per micro-batch; GT_INT_AUTO: the planner chooses
                                  (gt_plan_resolve), with global_batch set */
        int grad_accum;        /* micro-batches per optimizer step */
        int global_batch;      /* sequences per optimizer step over all ranks; 0 = unset (then
                                  micro_batch x grad_accum x ranks); set: grad_accum follows from it */
        int steps;             /* optimizer steps in total */
        double lr, min_lr;
        int warmup_steps;
        gt_lr_schedule lr_schedule;
        double weight_decay, beta1, beta2, adam_eps;
        double grad_clip;      /* global norm; 0 disables clipping */
        uint64_t seed;
        gt_precision precision; /* auto: bf16 on cuda, fp32 on cpu */
        gt_device device;
        gt_nonfinite nonfinite; /* what a step whose loss or gradient norm is not finite does */
        double peak_tflops;     /* the MFU's peak in TFLOP/s; 0 = the GPU's, by its name (mfu.h) */
        double spike_zscore;    /* skip an update whose loss or gradient norm is this many standard
                                   deviations above the last 100 steps'; 0 = off */
        gt_cuda_attention cuda_attention; /* the CUDA backend's attention kernels (ops.h) */
    } train;
    struct {
        char recompute[32];    /* none|full|uniform:K|blocks:K|sqrt|selective|auto: text, because
                                * K's range depends on n_layers; gt_policy_parse (recompute.h) reads it */
        uint64_t budget;       /* bytes per rank, 0 = unset */
    } memory;
    struct {
        gt_shard_stage shard;
        gt_comm_choice comm;
        gt_grad_sync grad_sync; /* when ZeRO-2/3 reduce gradients (zero.h) */
        int prefetch;          /* ZeRO-3: unit gathers in flight ahead of use (0..8); GT_INT_AUTO: the
                                  planner chooses */
        int progress_us;       /* MPI: the progress thread's interval in microseconds (0 = none) */
        int overlap_param_gather; /* ZeRO-1/2: the new weights' all-gather waited for per unit in the next forward */
        double bucket_mb;      /* grad_sync = step: MiB of gradients per bucket reduced during the last
                                * backward (0 = one reduction after it); GT_DOUBLE_AUTO: the planner
                                * chooses */
        double timeout;        /* seconds before the watchdog ends a hang (floor; 0 = off) */
        double liveness_timeout; /* seconds: a rank stopped, dead or wedged is named (0 = off) */
    } dist;
    struct {
        char train[GT_PATH_MAX];
        char val[GT_PATH_MAX]; /* "" = no validation */
        int val_every;         /* steps; 0 = never */
        int val_batches;
        gt_loss_mask loss_mask; /* the mask files beside the shards: auto (when there), on, off */
        int document_mask;     /* 1: attention stays inside each document of a window */
        int reset_positions;   /* 1: RoPE positions restart at each document */
        int separator;         /* the token id that delimits documents; -1 = unset */
        int separator_before;  /* 1: it starts each document (bos); 0: it ends each one (eos) */
        int separator_loss;    /* 0: the target predicted at a separator is not counted (Megatron's --eod-mask-loss) */
    } data;
    struct {
        char dir[GT_PATH_MAX]; /* "" = no training-state files */
        int every;             /* steps; 0 = only at the end and on signals; GT_INT_AUTO = auto (autosave.h) */
        double every_minutes;  /* also save when this many minutes passed since the last save; 0 = off */
        int keep;              /* newest K files kept; 0 = all */
        char resume[GT_PATH_MAX]; /* auto | never | PATH */
        int allow_model_change; /* 1: resume a file saved with other values of model keys */
        int takeover;          /* 1: take over the claim of a run on another host (runclaim.h) */
        int async;             /* 1: saves are written by a thread per rank while training goes on */
        int max_failed_saves;  /* stop with exit 74 after this many saves in a row failed; 0 = never */
        int memory_every;      /* steps between memory snapshots (memsnap.h); 0 = off; -1 = auto */
        double mtbf;           /* hours between faults, the prior of checkpoint.every = auto (autosave.h) */
        double memory_share;   /* under memory_every = auto, refresh at least this often: at most this share
                                * of the time on refreshes (autosave.h) */
    } checkpoint;
    struct {
        int every;             /* print a line every N steps */
        char metrics[GT_PATH_MAX]; /* JSONL path, "" = none */
        char tensorboard[GT_PATH_MAX]; /* directory of TensorBoard event files, "" = none */
        char trace[GT_PATH_MAX];   /* Chrome trace JSON of the measured steps, one file per rank; "" = none */
        int trace_first, trace_last; /* the steps log.trace records */
    } log;

    char path[GT_PATH_MAX];    /* the config file it came from */

    /* Where each key was set, in the order of config.c's key table (gt_config_key_line reads it):
     * a line of `path`, 0 = default, -1 = command line. Filled by gt_config_load. */
    int key_line[GT_CONFIG_MAX_KEYS];
} gt_config;

/* Where [section] name was set: a line of cfg->path (> 0), the command line (-1) or nowhere, the
 * default (0; also for a name that is no key). */
int gt_config_key_line(const gt_config *cfg, const char *section, const char *name);

/* One key by name, for code outside the key table (hf_config.c's model.init merge): its value as the
 * INI spells it ("" for no key); a copy of its value from src; whether a number key's value is in its
 * range (1; also for other keys), else 0 with what was expected. */
void gt_config_key_text(const gt_config *cfg, const char *section, const char *name, char *out, size_t len);
void gt_config_key_copy(gt_config *dst, const gt_config *src, const char *section, const char *name);
int gt_config_key_in_range(const gt_config *cfg, const char *section, const char *name, char *expected, size_t len);

/* Where [section] name was set, as a message about its value begins: "run.ini:12: [checkpoint] dir",
 * "command line: checkpoint.dir=VALUE" or "run.ini: [checkpoint] dir (default)". */
void gt_config_where(const gt_config *cfg, const char *section, const char *name, char *out, size_t len);

/* Which of auto, never or a path checkpoint.resume is. */
gt_resume gt_config_resume(const gt_config *cfg);

/* Defaults for every key (the tiny CPU model). */
void gt_config_defaults(gt_config *cfg);

/* Loads `path`, applies `overrides` ("section.key=value"), takes the [model] keys left unset from
 * model.init's config.json when model.init is set (gt_config_apply_init; a note lists them),
 * validates everything but the existence of data files. Returns 0, or 2 with a message in err. On 0,
 * err holds the notes worth printing (one per line, e.g. "note: ...: the warm-up is shortened to 10
 * steps", "warning: ... sets no keys"), or "". A warmup_steps above steps is no error: the warm-up
 * is cut to steps. */
int gt_config_load(gt_config *cfg, const char *path, int n_overrides, char *const *overrides, char *err,
                   size_t err_len);

/* The same as gt_config_load for INI text in memory (e.g. the /config of a training-state file);
 * `name` stands for the file in messages. */
int gt_config_load_string(gt_config *cfg, const char *text, const char *name, int n_overrides,
                          char *const *overrides, char *err, size_t err_len);

/* Checks that the data files named by the config exist and are readable. 0 or 2 with err. */
int gt_config_check_files(const gt_config *cfg, char *err, size_t err_len);

/* Checks that log.metrics (when set) can be written: creates its missing parent directories (as
 * checkpoint.dir is created) and refuses a path that is a directory or lies under a file. Rank 0 calls
 * it (only rank 0 writes the metrics). 0 or 2 with err naming the file and line. */
int gt_config_check_metrics(const gt_config *cfg, char *err, size_t err_len);

/* Writes the effective configuration (every key, after overrides) as INI text into a malloc'd
 * string: stored in training-state files and printed by --plan. */
char *gt_config_to_ini(const gt_config *cfg);

/* Calls each(user, "section.key", changes_model, was, now) for every key whose value differs between
 * `was` and `now`, in the key table's order, with both values as gt_config_to_ini writes them.
 * changes_model: the key changes the function the model computes (config.c's FN column). Keys `was`
 * did not set are skipped: a /config written by an older gtrain lacks the keys added since. */
typedef void gt_config_change_fn(void *user, const char *key, int changes_model, const char *was, const char *now);
void gt_config_changes(const gt_config *was, const gt_config *now, gt_config_change_fn *each, void *user);

/* The [model] values a Hugging Face checkpoint directory's config.json determines (hf_config.c):
 * dim, n_layers, n_heads, n_kv_heads, vocab_size, ffn_dim, norm_eps, rope_theta, rope_type and
 * rope_*, tie_word_embeddings; max_seq_len from max_position_embeddings; the rest are defaults.
 * Refuses attention_bias/mlp_bias true, a head_dim other than hidden_size/num_attention_heads,
 * activations other than silu and RoPE types other than default and llama3. 0, or 2 with err. */
int gt_hf_read_config(const char *dir, gt_model_config *out, char *err, size_t err_len);

/* model.init = DIR: compares DIR/config.json with cfg's keys that change the model's function (the
 * FN keys; rope_factor and its kin only for llama3 RoPE). With `take`, a key cfg left at its default
 * (set neither in the file nor on the command line) is taken from config.json instead, and `taken`
 * receives "dim = 64, n_layers = 2, ..." (or ""). Every mismatch comes in one message naming both
 * values and where the INI's was set. max_seq_len and dropout are the run's choice. gt_config_load
 * calls it with take = 1. 0, or 2 with err. */
int gt_config_apply_init(gt_config *cfg, int take, char *taken, size_t taken_len, char *err, size_t err_len);

#endif
