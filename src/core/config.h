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

#define GT_PATH_MAX 1024

#define GT_CONFIG_MAX_KEYS 128 /* room for config.c's key table (checked there) */

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
    /* RoPE frequency scaling, Hugging Face's rope_parameters / rope_scaling: rope_type "default"
     * (none) or "llama3" (LLaMA-3.1: the four numbers below, as transformers names them) */
    char rope_type[16];
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position_embeddings;
    char init[GT_PATH_MAX]; /* a Hugging Face checkpoint directory to start from; "" = random init */
} gt_model_config;

typedef struct gt_config {
    gt_model_config model;
    struct {
        int seq_len;
        int micro_batch;       /* sequences per rank per micro-batch */
        int grad_accum;        /* micro-batches per optimizer step */
        int steps;             /* optimizer steps in total */
        double lr, min_lr;
        int warmup_steps;
        char lr_schedule[16];  /* cosine | linear | constant */
        double weight_decay, beta1, beta2, adam_eps;
        double grad_clip;      /* global norm; 0 disables clipping */
        uint64_t seed;
        char precision[8];     /* fp32 | bf16 | auto (bf16 on cuda, fp32 on cpu) */
        char device[8];        /* auto | cpu | cuda */
        char nonfinite[8];     /* stop | skip: a step whose loss or gradient norm is not finite */
    } train;
    struct {
        char recompute[32];    /* none|full|uniform:K|blocks:K|sqrt|selective|auto */
        uint64_t budget;       /* bytes per rank, 0 = unset */
    } memory;
    struct {
        char shard[16];        /* none | optimizer | gradients | parameters */
        char comm[8];          /* auto | nccl | mpi */
        char grad_sync[8];     /* auto | step | micro: when ZeRO-2/3 reduce gradients (zero.h) */
        int prefetch;          /* ZeRO-3: unit gathers in flight ahead of use (0..8) */
    } dist;
    struct {
        char train[GT_PATH_MAX];
        char val[GT_PATH_MAX]; /* "" = no validation */
        int val_every;         /* steps; 0 = never */
        int val_batches;
    } data;
    struct {
        char dir[GT_PATH_MAX]; /* "" = no training-state files */
        int every;             /* steps; 0 = only at the end and on signals */
        double every_minutes;  /* also save when this many minutes passed since the last save; 0 = off */
        int keep;              /* newest K files kept; 0 = all */
        char resume[GT_PATH_MAX]; /* auto | never | PATH */
        char allow_model_change[8]; /* false | true: resume a file saved with other model keys */
    } checkpoint;
    struct {
        int every;             /* print a line every N steps */
        char metrics[GT_PATH_MAX]; /* JSONL path, "" = none */
    } log;

    char path[GT_PATH_MAX];    /* the config file it came from */

    /* Where data.train and data.val were set, so gt_config_check_files can name the line:
     * a line of `path`, 0 = default, -1 = command line. Filled by gt_config_load. */
    int data_train_line, data_val_line;
    int log_metrics_line; /* the same for log.metrics */
    /* The same for every key, in the order of config.c's key table (gt_config_key_line reads it). */
    int key_line[GT_CONFIG_MAX_KEYS];
} gt_config;

/* Where [section] name was set: a line of cfg->path (> 0), the command line (-1) or nowhere, the
 * default (0; also for a name that is no key). */
int gt_config_key_line(const gt_config *cfg, const char *section, const char *name);

/* Defaults for every key (the tiny CPU model). */
void gt_config_defaults(gt_config *cfg);

/* Loads `path`, applies `overrides` ("section.key=value"), validates everything but the
 * existence of data files. Returns 0, or 2 with a message in err. On 0, err holds the notes worth
 * printing (one per line, e.g. "note: ...: the warm-up is shortened to 10 steps", "warning: ... sets
 * no keys"), or "". A warmup_steps above steps is no error: the warm-up is cut to steps. */
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

/* Parses a byte size: "123", "64KiB", "70GiB", "1.5GB", "2TiB". 0 on success, -1 on bad input. */
int gt_parse_bytes(const char *text, uint64_t *bytes);

#endif
