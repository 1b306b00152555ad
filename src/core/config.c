/*
 * config.c — reads the run configuration: an INI file (libinih) plus `section.key=value` overrides.
 *
 * Every key is described once, in the `keys` table below: whether it changes the function the model
 * computes (FN), its section, name, type, range and where it lives in gt_config. Parsing, range
 * checks, error messages, the list of known keys, gt_config_to_ini, the comparison of a state file's
 * /config on resume (gt_config_changes) and model.init's config.json (hf_config.c's gt_config_apply_init,
 * through gt_config_key_*) all walk that table, so a new key is one line there (plus its default and its
 * row in configs/README.md).
 * A choice is an enum in gt_config; its one name table here parses it and prints it.
 *
 * Errors are one line, `FILE:LINE: [section] key: MESSAGE (expected ...)`, or for an override
 * `command line: section.key=value: MESSAGE (expected ...)`; the caller exits with code 2. Things
 * worth saying about an accepted config (a warm-up cut to the run's length, a file that sets no key)
 * come back as notes, one per line, in the same buffer, for the caller to print. The line
 * of every key is remembered, so checks that involve two keys (dim % n_heads, seq_len <= max_seq_len)
 * name the line of one of them: the one set last (command line over file over default).
 *
 * About libinih: Debian builds it without line numbers for the handler, with a 200-byte line
 * buffer and with Python-style continuation lines (an indented line continues the previous value).
 * We feed it through our own reader, which counts lines, strips leading whitespace (so indented keys
 * are plain keys, never continuations) and hands over overlong `key = value` lines as `key = \1`,
 * keeping the real text for the handler, so long paths work and every line number stays exact.
 */
#define _POSIX_C_SOURCE 200809L /* fileno */

#include "config.h"

#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bytes.h"
#include "config_keys.h"
#include "data.h"
#include "errmsg.h"
#include "exitcodes.h"
#include "paths.h"
#include "recompute.h"

/* ------------------------------------------------------------------------------------------------
 * The key table
 * ---------------------------------------------------------------------------------------------- */

_Static_assert(sizeof(gt_shard_stage) == sizeof(int), "enum fields are stored as int (KEY_ENUM)");
_Static_assert(GT_KEY_INT_AUTO == GT_INT_AUTO, "an integer key's auto is one value");
_Static_assert(GT_KEY_DOUBLE_AUTO == GT_DOUBLE_AUTO, "a number key's auto is one value");

#define OFF(field) offsetof(gt_config, field)
#define STR(field) OFF(field), sizeof(((gt_config *)0)->field)
/* The first column: FN marks the keys whose value is part of the function the model computes. A
 * state file saved with another value would be resumed into a different function even where every
 * tensor keeps its shape (n_heads at the same dim, rope_theta, norm_eps), so resume refuses it unless
 * checkpoint.allow_model_change = true; model.init takes these keys from config.json (hf_config.c). */
#define FN 1
#define RUN 0
#define INT(fn, sec, name, field, lo, hi) {sec, name, KEY_INT, OFF(field), 0, lo, hi, 0, NULL, fn}
#define INT_AUTO(fn, sec, name, field, lo, hi) {sec, name, KEY_INT_AUTO, OFF(field), 0, lo, hi, 0, NULL, fn}
#define NUM(fn, sec, name, type, field, lo, hi, fl) {sec, name, type, OFF(field), 0, lo, hi, fl, NULL, fn}
#define ENUM(fn, sec, name, field, names) {sec, name, KEY_ENUM, OFF(field), 0, 0, 0, 0, names, fn}
#define TEXT(fn, sec, name, type, field, nonempty) {sec, name, type, STR(field), nonempty, 0, 0, NULL, fn}
#define PLAIN(fn, sec, name, type, field) {sec, name, type, OFF(field), 0, 0, 0, 0, NULL, fn}

/* One name table per choice-valued setting, in the order of its enum (config.h). */
static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const precision_names[] = {"auto", "fp32", "bf16", NULL};
static const char *const nonfinite_names[] = {"stop", "skip", NULL};
static const char *const loss_mask_names[] = {"auto", "on", "off", NULL};
static const char *const lr_schedule_names[] = {"cosine", "linear", "constant", NULL};
static const char *const shard_names[] = {"none", "optimizer", "gradients", "parameters", "auto", NULL};
static const char *const comm_names[] = {"auto", "nccl", "mpi", NULL};
static const char *const grad_sync_names[] = {"auto", "step", "micro", NULL};
static const char *const rope_type_names[] = {"default", "llama3", NULL};
static const char *const cuda_attention_names[] = {"default", "mma", "cudnn", NULL};
static const char *const separator_role_names[] = {"eos", "bos", NULL}; /* data.separator_before 0, 1 */

const char *gt_device_name(gt_device v) { return device_names[v]; }
const char *gt_precision_name(gt_precision v) { return precision_names[v]; }
const char *gt_nonfinite_name(gt_nonfinite v) { return nonfinite_names[v]; }
const char *gt_loss_mask_name(gt_loss_mask v) { return loss_mask_names[v]; }
const char *gt_lr_schedule_name(gt_lr_schedule v) { return lr_schedule_names[v]; }
const char *gt_shard_stage_name(gt_shard_stage v) { return shard_names[v]; }
const char *gt_comm_choice_name(gt_comm_choice v) { return comm_names[v]; }
const char *gt_grad_sync_name(gt_grad_sync v) { return grad_sync_names[v]; }
const char *gt_rope_type_name(gt_rope_type v) { return rope_type_names[v]; }

static const key_spec keys[] = {
    INT(FN, "model", "dim", model.dim, 1, 65536),
    INT(FN, "model", "n_layers", model.n_layers, 1, GT_MAX_LAYERS),
    INT(FN, "model", "n_heads", model.n_heads, 1, 4096),
    INT(FN, "model", "n_kv_heads", model.n_kv_heads, 1, 4096),
    INT(FN, "model", "vocab_size", model.vocab_size, 1, 1 << 24),
    INT(FN, "model", "ffn_dim", model.ffn_dim, 1, 1 << 20),
    NUM(FN, "model", "norm_eps", KEY_FLOAT, model.norm_eps, 0, INFINITY, MIN_OPEN),
    NUM(FN, "model", "rope_theta", KEY_FLOAT, model.rope_theta, 0, INFINITY, MIN_OPEN),
    INT(RUN, "model", "max_seq_len", model.max_seq_len, 1, 1 << 20),
    NUM(RUN, "model", "dropout", KEY_FLOAT, model.dropout, 0, 1, MAX_OPEN),
    PLAIN(FN, "model", "tie_word_embeddings", KEY_BOOL, model.tie_word_embeddings),
    ENUM(FN, "model", "rope_type", model.rope_type, rope_type_names),
    NUM(FN, "model", "rope_factor", KEY_DOUBLE, model.rope_factor, 0, INFINITY, MIN_OPEN),
    NUM(FN, "model", "rope_low_freq_factor", KEY_DOUBLE, model.rope_low_freq_factor, 0, INFINITY, MIN_OPEN),
    NUM(FN, "model", "rope_high_freq_factor", KEY_DOUBLE, model.rope_high_freq_factor, 0, INFINITY, MIN_OPEN),
    INT(FN, "model", "rope_original_max_position_embeddings", model.rope_original_max_position_embeddings, 1, 1 << 24),
    TEXT(RUN, "model", "init", KEY_PATH, model.init, 0),

    INT(RUN, "train", "seq_len", train.seq_len, 1, 1 << 20),
    INT_AUTO(RUN, "train", "micro_batch", train.micro_batch, 1, 1 << 16),
    INT(RUN, "train", "grad_accum", train.grad_accum, 1, 1 << 20),
    INT(RUN, "train", "global_batch", train.global_batch, 0, INT_MAX),
    INT(RUN, "train", "steps", train.steps, 1, INT_MAX),
    NUM(RUN, "train", "lr", KEY_DOUBLE, train.lr, 0, INFINITY, MIN_OPEN),
    NUM(RUN, "train", "min_lr", KEY_DOUBLE, train.min_lr, 0, INFINITY, 0),
    INT(RUN, "train", "warmup_steps", train.warmup_steps, 0, INT_MAX),
    ENUM(RUN, "train", "lr_schedule", train.lr_schedule, lr_schedule_names),
    NUM(RUN, "train", "weight_decay", KEY_DOUBLE, train.weight_decay, 0, INFINITY, 0),
    NUM(RUN, "train", "beta1", KEY_DOUBLE, train.beta1, 0, 1, MAX_OPEN),
    NUM(RUN, "train", "beta2", KEY_DOUBLE, train.beta2, 0, 1, MAX_OPEN),
    NUM(RUN, "train", "adam_eps", KEY_DOUBLE, train.adam_eps, 0, INFINITY, MIN_OPEN),
    NUM(RUN, "train", "grad_clip", KEY_DOUBLE, train.grad_clip, 0, INFINITY, 0),
    PLAIN(RUN, "train", "seed", KEY_U64, train.seed),
    ENUM(RUN, "train", "precision", train.precision, precision_names),
    ENUM(RUN, "train", "device", train.device, device_names),
    ENUM(RUN, "train", "nonfinite", train.nonfinite, nonfinite_names),
    NUM(RUN, "train", "spike_zscore", KEY_DOUBLE, train.spike_zscore, 0, INFINITY, 0),
    NUM(RUN, "train", "peak_tflops", KEY_DOUBLE, train.peak_tflops, 0, INFINITY, 0),
    ENUM(RUN, "train", "cuda_attention", train.cuda_attention, cuda_attention_names),

    TEXT(RUN, "memory", "recompute", KEY_POLICY, memory.recompute, 1),
    PLAIN(RUN, "memory", "budget", KEY_BYTES, memory.budget),

    ENUM(RUN, "dist", "shard", dist.shard, shard_names),
    ENUM(RUN, "dist", "comm", dist.comm, comm_names),
    ENUM(RUN, "dist", "grad_sync", dist.grad_sync, grad_sync_names),
    INT_AUTO(RUN, "dist", "prefetch", dist.prefetch, 0, 8),
    NUM(RUN, "dist", "bucket_mb", KEY_DOUBLE_AUTO, dist.bucket_mb, 0, 1024, 0), /* or auto */
    INT(RUN, "dist", "progress_us", dist.progress_us, 0, 1000000),
    PLAIN(RUN, "dist", "overlap_param_gather", KEY_BOOL, dist.overlap_param_gather),
    NUM(RUN, "dist", "timeout", KEY_DOUBLE, dist.timeout, 0, INFINITY, 0),
    NUM(RUN, "dist", "liveness_timeout", KEY_DOUBLE, dist.liveness_timeout, 0, INFINITY, 0),

    TEXT(RUN, "data", "train", KEY_PATH, data.train, 1),
    TEXT(RUN, "data", "val", KEY_PATH, data.val, 0),
    INT(RUN, "data", "val_every", data.val_every, 0, INT_MAX),
    INT(RUN, "data", "val_batches", data.val_batches, 1, 1 << 20),
    ENUM(RUN, "data", "loss_mask", data.loss_mask, loss_mask_names),
    PLAIN(RUN, "data", "document_mask", KEY_BOOL, data.document_mask),
    PLAIN(RUN, "data", "reset_positions", KEY_BOOL, data.reset_positions),
    INT(RUN, "data", "separator", data.separator, -1, INT_MAX),
    ENUM(RUN, "data", "separator_role", data.separator_before, separator_role_names),
    PLAIN(RUN, "data", "separator_loss", KEY_BOOL, data.separator_loss),

    TEXT(RUN, "checkpoint", "dir", KEY_PATH, checkpoint.dir, 0),
    {"checkpoint", "every", KEY_INT_AUTO, OFF(checkpoint.every), 0, 0, INT_MAX, 0, NULL, RUN}, /* or auto */
    NUM(RUN, "checkpoint", "every_minutes", KEY_DOUBLE, checkpoint.every_minutes, 0, INFINITY, 0),
    INT(RUN, "checkpoint", "keep", checkpoint.keep, 0, INT_MAX),
    TEXT(RUN, "checkpoint", "resume", KEY_RESUME, checkpoint.resume, 1),
    PLAIN(RUN, "checkpoint", "allow_model_change", KEY_BOOL, checkpoint.allow_model_change),
    PLAIN(RUN, "checkpoint", "takeover", KEY_BOOL, checkpoint.takeover),
    PLAIN(RUN, "checkpoint", "async", KEY_BOOL, checkpoint.async),
    INT(RUN, "checkpoint", "max_failed_saves", checkpoint.max_failed_saves, 0, INT_MAX),
    NUM(RUN, "checkpoint", "memory_every", KEY_INT_AUTO, checkpoint.memory_every, 0, INT_MAX, 0),
    NUM(RUN, "checkpoint", "mtbf", KEY_DOUBLE, checkpoint.mtbf, 0, INFINITY, MIN_OPEN),
    NUM(RUN, "checkpoint", "memory_share", KEY_DOUBLE, checkpoint.memory_share, 0, 1, MAX_OPEN),

    INT(RUN, "log", "every", log.every, 1, INT_MAX),
    TEXT(RUN, "log", "metrics", KEY_PATH, log.metrics, 0),
    TEXT(RUN, "log", "tensorboard", KEY_PATH, log.tensorboard, 0),
    TEXT(RUN, "log", "trace", KEY_PATH, log.trace, 0),
    INT(RUN, "log", "trace_first", log.trace_first, 1, INT_MAX),
    INT(RUN, "log", "trace_last", log.trace_last, 1, INT_MAX),
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

static const char *const sections[] = {"model", "train", "memory", "dist", "data", "checkpoint", "log"};
#define N_SECTIONS ((int)(sizeof sections / sizeof sections[0]))

void gt_config_defaults(gt_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->model = (gt_model_config){
        .dim = 128, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 256, .ffn_dim = 352,
        .max_seq_len = 256, .norm_eps = 1e-5f, .rope_theta = 10000.0f, .dropout = 0.0f,
        .tie_word_embeddings = 0, .rope_type = GT_ROPE_DEFAULT,
        /* LLaMA-3.1's values; they only matter with rope_type = llama3 */
        .rope_factor = 8.0, .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0,
        .rope_original_max_position_embeddings = 8192,
    };
    cfg->train.seq_len = 128;
    cfg->train.micro_batch = 8;
    cfg->train.grad_accum = 1;
    cfg->train.global_batch = 0;
    cfg->train.steps = 400;
    cfg->train.lr = 3e-3;
    cfg->train.min_lr = 3e-4;
    cfg->train.warmup_steps = 20;
    cfg->train.lr_schedule = GT_LR_COSINE;
    cfg->train.weight_decay = 0.1;
    cfg->train.beta1 = 0.9;
    cfg->train.beta2 = 0.95;
    cfg->train.adam_eps = 1e-8;
    cfg->train.grad_clip = 1.0;
    cfg->train.seed = 1337;
    cfg->train.precision = GT_PRECISION_AUTO;
    cfg->train.device = GT_DEVICE_AUTO;
    cfg->train.nonfinite = GT_NONFINITE_STOP;
    cfg->train.spike_zscore = 0;
    cfg->train.peak_tflops = 0;
    cfg->train.cuda_attention = GT_CUDA_ATTENTION_DEFAULT;
    snprintf(cfg->memory.recompute, sizeof cfg->memory.recompute, "none");
    cfg->memory.budget = 0;
    cfg->dist.shard = GT_SHARD_OPTIMIZER;
    cfg->dist.comm = GT_COMM_AUTO;
    cfg->dist.grad_sync = GT_GRAD_SYNC_AUTO;
    cfg->dist.prefetch = 1;
    cfg->dist.progress_us = 1000;
    cfg->dist.timeout = 600; /* a floor: src/dist/watchdog.h */
    cfg->dist.liveness_timeout = 5; /* a stopped, dead or wedged rank (watchdog.h) */
    snprintf(cfg->data.train, sizeof cfg->data.train, "data/fortunes.train.bin");
    snprintf(cfg->data.val, sizeof cfg->data.val, "data/fortunes.val.bin");
    cfg->data.val_every = 100;
    cfg->data.val_batches = 4;
    cfg->data.loss_mask = GT_LOSS_MASK_AUTO;
    cfg->data.document_mask = 0;
    cfg->data.reset_positions = 0;
    cfg->data.separator = -1;
    cfg->data.separator_before = 0;
    cfg->data.separator_loss = 1;
    cfg->checkpoint.every = 0;
    cfg->checkpoint.every_minutes = 30;
    cfg->checkpoint.keep = 3;
    snprintf(cfg->checkpoint.resume, sizeof cfg->checkpoint.resume, "auto");
    cfg->checkpoint.allow_model_change = 0;
    cfg->checkpoint.takeover = 0;
    cfg->checkpoint.async = 1;
    cfg->checkpoint.max_failed_saves = 3;
    cfg->checkpoint.memory_every = GT_INT_AUTO; /* autosave.h: the interval that pays */
    cfg->checkpoint.mtbf = 4; /* hours: autosave.h says why */
    cfg->checkpoint.memory_share = 0.01; /* autosave.h says why */
    cfg->log.every = 1;
    cfg->log.trace_first = 2; /* step 1 warms up (first touches of memory, threads starting) */
    cfg->log.trace_last = 2;
}

/* ------------------------------------------------------------------------------------------------
 * Parsing state: where each key was set, and the first error
 * ---------------------------------------------------------------------------------------------- */

#define ORIGIN_DEFAULT 0
#define ORIGIN_FILE 1
#define ORIGIN_CLI 2

typedef struct origin {
    int kind;
    int line;             /* ORIGIN_FILE */
    const char *override; /* ORIGIN_CLI: the override text as given */
} origin;

typedef struct loader {
    gt_config *cfg;
    const char *name; /* the file, as the messages name it */
    origin where[N_KEYS];
    char *err;
    size_t err_len;
    int failed;
    int err_line;     /* the file line of the first handler error, 0 if none */
    char notes[4096]; /* notes for an accepted config, one per line */

    /* the reader's side: a FILE or a string, the current line number, the last line in full */
    FILE *file;
    const char *text;
    int line;
    char *full;       /* the current line, leading whitespace removed */
    size_t full_cap;
    int stashed;      /* the current line was too long for libinih and was handed over as key = \1 */
} loader;

static void fail(loader *ld, const char *fmt, ...) {
    if (ld->failed) return;
    ld->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ld->err, ld->err_len, fmt, ap);
    va_end(ap);
}

/* Adds a line to the notes of an accepted config. */
static void note(loader *ld, const char *fmt, ...) {
    size_t used = strlen(ld->notes);
    if (used + 2 >= sizeof ld->notes) return;
    if (used) ld->notes[used++] = '\n';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ld->notes + used, sizeof ld->notes - used, fmt, ap);
    va_end(ap);
}

/* "configs/tiny.ini:7: [model] n_heads" or "command line: model.n_heads=6" or, for a key left at
 * its default, "configs/tiny.ini: [model] n_heads (default)". */
static void describe_origin(const loader *ld, int k, char *out, size_t len) {
    const origin *o = &ld->where[k];
    if (o->kind == ORIGIN_CLI)
        snprintf(out, len, "command line: %s", o->override);
    else if (o->kind == ORIGIN_FILE)
        snprintf(out, len, "%s:%d: [%s] %s", ld->name, o->line, keys[k].section, keys[k].name);
    else
        snprintf(out, len, "%s%s[%s] %s (default)", ld->name, ld->name[0] ? ": " : "", keys[k].section,
                 keys[k].name);
}

static int key_index(const char *section, const char *name) {
    for (int k = 0; k < N_KEYS; k++)
        if (strcmp(keys[k].section, section) == 0 && strcmp(keys[k].name, name) == 0) return k;
    return -1;
}

static int section_known(const char *section) {
    for (int s = 0; s < N_SECTIONS; s++)
        if (strcmp(sections[s], section) == 0) return 1;
    return 0;
}

/* Edit distance, for "did you mean" on a misspelt key or section. */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The sections other than `section` (NULL: none) that have a key `name`: "[model]" or
 * "[checkpoint] or [log]", or "" when none has it. For the hint at a missing section line. */
static void home_of(const char *section, const char *name, char *out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < N_KEYS && used < len; k++) {
        if (strcmp(keys[k].name, name) != 0 || (section && strcmp(keys[k].section, section) == 0)) continue;
        used += (size_t)snprintf(out + used, len - used, "%s[%s]", used ? " or " : "", keys[k].section);
    }
}

/* "did you mean steps? known keys: seq_len, micro_batch, ..." */
static void known_list(const char *section, const char *wrong, char *out, size_t len) {
    const char *names[N_KEYS > N_SECTIONS ? N_KEYS : N_SECTIONS];
    int n = 0;
    if (section) {
        for (int k = 0; k < N_KEYS; k++)
            if (strcmp(keys[k].section, section) == 0) names[n++] = keys[k].name;
    } else {
        for (int s = 0; s < N_SECTIONS; s++) names[n++] = sections[s];
    }
    const char *best = NULL;
    int best_d = 3; /* suggest only close matches */
    for (int i = 0; i < n; i++) {
        int d = edit_distance(wrong, names[i]);
        if (d < best_d) best_d = d, best = names[i];
    }
    size_t used = 0;
    out[0] = '\0';
    if (best) used += (size_t)snprintf(out, len, "did you mean %s? ", best);
    if (used < len) used += (size_t)snprintf(out + used, len - used, "known %s: ", section ? "keys" : "sections");
    for (int i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%s", i ? ", " : "", names[i]);
}

/* Key k's value in cfg as the INI spells it. */
static void format_value(const gt_config *cfg, int k, char *value, size_t len) {
    gt_key_write(&keys[k], (const char *)cfg + keys[k].offset, value, len);
}

/* Sets key k from text. On a bad value, fails with `prefix: MESSAGE (expected ...)`. */
static int set_key(loader *ld, int k, const char *value, const char *prefix) {
    char why[GT_PATH_MAX * 2 + 512];
    if (gt_key_set(&keys[k], (char *)ld->cfg + keys[k].offset, value, why, sizeof why) == 0) return 0;
    fail(ld, "%s: %s", prefix, why);
    return -1;
}

/* ------------------------------------------------------------------------------------------------
 * The file: libinih with a line-counting reader
 * ---------------------------------------------------------------------------------------------- */

/* Reads one whole line (any length) into ld->full, without leading whitespace. 0 at the end. */
static int next_line(loader *ld) {
    size_t n = 0;
    int c, got = 0;
    for (;;) {
        if (ld->file) {
            c = fgetc(ld->file);
            if (c == EOF) break;
        } else {
            c = (unsigned char)*ld->text;
            if (c == 0) break;
            ld->text++;
        }
        got = 1;
        if (n == 0 && (c == ' ' || c == '\t')) continue;
        if (n + 2 > ld->full_cap) {
            size_t cap = ld->full_cap ? 2 * ld->full_cap : 256;
            char *p = realloc(ld->full, cap);
            if (!p) {
                fail(ld, "%s:%d: out of memory reading this line", ld->name, ld->line + 1);
                ld->err_line = ld->line + 1;
                return 0;
            }
            ld->full = p, ld->full_cap = cap;
        }
        ld->full[n++] = (char)c;
        if (c == '\n') break;
    }
    if (!got) return 0;
    if (!ld->full) { /* a line of only blanks at the very end */
        ld->full = malloc(256);
        if (!ld->full) return 0;
        ld->full_cap = 256;
    }
    ld->full[n] = '\0';
    ld->line++;
    return 1;
}

/* libinih's reader: one call per line of the file, so libinih's line numbers are ours. */
static char *reader(char *str, int num, void *stream) {
    loader *ld = stream;
    if (!next_line(ld)) return NULL;
    ld->stashed = 0;
    /* libinih does not tell the handler about section lines, and an unknown section without keys
     * would pass unseen: check the name here, where the line is known */
    if (ld->full[0] == '[' && !ld->failed) {
        const char *close = strchr(ld->full, ']');
        char name[128];
        if (close && (size_t)(close - ld->full) < sizeof name) {
            snprintf(name, sizeof name, "%.*s", (int)(close - ld->full - 1), ld->full + 1);
            if (!section_known(name)) {
                char known[512];
                known_list(NULL, name, known, sizeof known);
                fail(ld, "%s:%d: unknown section [%s] (%s)", ld->name, ld->line, name, known);
                ld->err_line = ld->line;
            }
        }
    }
    size_t len = strlen(ld->full);
    if (len + 1 <= (size_t)num) {
        memcpy(str, ld->full, len + 1);
        return str;
    }
    /* Too long for libinih's buffer. A comment is passed as an empty comment; a key line as
     * `key=\1`, and the handler takes the value from ld->full; anything else is cut short, and
     * libinih reports it as a syntax error on this line. */
    const char *eq = strpbrk(ld->full, "=:");
    if (ld->full[0] == ';' || ld->full[0] == '#') {
        snprintf(str, (size_t)num, ";\n");
    } else if (eq && (int)(eq - ld->full) + 4 <= num) {
        snprintf(str, (size_t)num, "%.*s=\001\n", (int)(eq - ld->full), ld->full);
        ld->stashed = 1;
    } else {
        snprintf(str, (size_t)num, "%.*s\n", num - 2, ld->full);
    }
    return str;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* libinih strips `;` comments after whitespace; we also strip `#` ones, and for a stashed line do
 * libinih's work ourselves. The result goes into out (trimmed). */
static void clean_value(const char *value, char *out, size_t len) {
    const char *start = value;
    size_t n = strlen(start);
    size_t cut = n;
    for (size_t i = 0; i < n; i++) {
        if ((start[i] == '#' || start[i] == ';') && (i == 0 || is_blank(start[i - 1]))) {
            cut = i;
            break;
        }
    }
    while (cut > 0 && is_blank(start[cut - 1])) cut--;
    while (cut > 0 && is_blank(*start)) start++, cut--;
    if (cut >= len) cut = len - 1;
    memcpy(out, start, cut);
    out[cut] = '\0';
}

static int handler(void *user, const char *section, const char *name, const char *raw_value) {
    loader *ld = user;
    if (ld->failed) return 1;
    int line = ld->line;
    const char *value = raw_value;
    if (ld->stashed && strcmp(raw_value, "\001") == 0) value = strpbrk(ld->full, "=:") + 1;
    char clean[GT_PATH_MAX + 64];
    clean_value(value, clean, sizeof clean);

    if (!section[0]) {
        char home[256];
        home_of(NULL, name, home, sizeof home);
        if (home[0])
            fail(ld, "%s:%d: key '%s' outside any section (expected a [section] line before it: %s is a key of %s)",
                 ld->name, line, name, name, home);
        else
            fail(ld, "%s:%d: key '%s' outside any section (expected a [section] line before it)", ld->name, line, name);
    } else if (!section_known(section)) {
        char known[512];
        known_list(NULL, section, known, sizeof known);
        fail(ld, "%s:%d: unknown section [%s] (%s)", ld->name, line, section, known);
    } else {
        int k = key_index(section, name);
        char prefix[GT_PATH_MAX + 128];
        snprintf(prefix, sizeof prefix, "%s:%d: [%s] %s", ld->name, line, section, name);
        if (k < 0) {
            char known[512], home[256];
            known_list(section, name, known, sizeof known);
            home_of(section, name, home, sizeof home);
            if (home[0])
                fail(ld, "%s:%d: unknown key [%s] %s (%s is a key of %s: is that section line missing above it? %s)",
                     ld->name, line, section, name, name, home, known);
            else
                fail(ld, "%s:%d: unknown key [%s] %s (%s)", ld->name, line, section, name, known);
        } else if (ld->where[k].kind == ORIGIN_FILE) {
            fail(ld, "%s: set twice (first on line %d)", prefix, ld->where[k].line);
        } else if (set_key(ld, k, clean, prefix) == 0) {
            ld->where[k] = (origin){ORIGIN_FILE, line, NULL};
        }
    }
    if (ld->failed) {
        ld->err_line = line;
        return 0;
    }
    return 1;
}

/* Parses the file or text in ld; libinih's own syntax errors come back as its return value. */
static void parse_ini(loader *ld) {
    int rc = ini_parse_stream(reader, ld, handler, ld);
    if (rc > 0 && (ld->err_line == 0 || rc < ld->err_line)) {
        /* a syntax error on an earlier line than any other error: report it instead */
        ld->failed = 0;
        fail(ld, "%s:%d: cannot parse this line (expected [section], key = value or a comment)", ld->name, rc);
    } else if (rc < 0) {
        ld->failed = 0;
        fail(ld, "%s: cannot read the config file", ld->name);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Overrides
 * ---------------------------------------------------------------------------------------------- */

static void apply_override(loader *ld, const char *text) {
    const char *eq = strchr(text, '=');
    const char *dot = strchr(text, '.');
    char section[64], name[64], value[GT_PATH_MAX + 64];
    if (!eq || !dot || dot > eq || dot == text || dot + 1 == eq || (size_t)(dot - text) >= sizeof section ||
        (size_t)(eq - dot - 1) >= sizeof name) {
        fail(ld, "command line: %s: not an override (expected section.key=value, e.g. train.lr=1e-3)", text);
        return;
    }
    snprintf(section, sizeof section, "%.*s", (int)(dot - text), text);
    snprintf(name, sizeof name, "%.*s", (int)(eq - dot - 1), dot + 1);
    snprintf(value, sizeof value, "%s", eq + 1);
    /* trim the value only: "train.lr= 1e-3" is fine, keys are taken as written */
    char *v = value;
    while (is_blank(*v)) v++;
    size_t n = strlen(v);
    while (n > 0 && is_blank(v[n - 1])) v[--n] = '\0';

    if (!section_known(section)) {
        char known[512];
        known_list(NULL, section, known, sizeof known);
        fail(ld, "command line: %s: unknown section [%s] (%s)", text, section, known);
        return;
    }
    int k = key_index(section, name);
    if (k < 0) {
        char known[512], home[256];
        known_list(section, name, known, sizeof known);
        home_of(section, name, home, sizeof home);
        if (home[0])
            fail(ld, "command line: %s: unknown key [%s] %s (%s is a key of %s; %s)", text, section, name, name, home,
                 known);
        else
            fail(ld, "command line: %s: unknown key [%s] %s (%s)", text, section, name, known);
        return;
    }
    char prefix[GT_PATH_MAX + 128];
    snprintf(prefix, sizeof prefix, "command line: %s", text);
    if (set_key(ld, k, v, prefix) == 0) ld->where[k] = (origin){ORIGIN_CLI, 0, text};
}

/* ------------------------------------------------------------------------------------------------
 * Checks across keys
 * ---------------------------------------------------------------------------------------------- */

/* Of two keys in one check, the one to blame: the one set last (command line, then file), the
 * first named on a tie. */
static int blame(const loader *ld, const char *sec_a, const char *a, const char *sec_b, const char *b) {
    int ka = key_index(sec_a, a), kb = key_index(sec_b, b);
    return ld->where[kb].kind > ld->where[ka].kind ? kb : ka;
}

static void fail_at(loader *ld, int k, const char *fmt, ...) {
    if (ld->failed) return;
    char where[GT_PATH_MAX + 128], msg[1024];
    describe_origin(ld, k, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail(ld, "%s: %s", where, msg);
}

static void check_across(loader *ld) {
    const gt_config *c = ld->cfg;
    const gt_model_config *m = &c->model;
    if (m->dim % m->n_heads != 0) {
        fail_at(ld, blame(ld, "model", "n_heads", "model", "dim"),
                "n_heads %d does not divide dim %d (expected dim to be a multiple of n_heads)", m->n_heads, m->dim);
    } else if ((m->dim / m->n_heads) % 2 != 0) {
        fail_at(ld, blame(ld, "model", "n_heads", "model", "dim"),
                "head size dim/n_heads = %d/%d = %d is odd (expected an even head size: rotary embeddings "
                "rotate pairs)", m->dim, m->n_heads, m->dim / m->n_heads);
    }
    if (m->n_heads % m->n_kv_heads != 0)
        fail_at(ld, blame(ld, "model", "n_kv_heads", "model", "n_heads"),
                "n_kv_heads %d does not divide n_heads %d (expected n_heads to be a multiple of n_kv_heads)",
                m->n_kv_heads, m->n_heads);
    if (m->rope_type == GT_ROPE_LLAMA3 && !(m->rope_high_freq_factor > m->rope_low_freq_factor))
        fail_at(ld, blame(ld, "model", "rope_high_freq_factor", "model", "rope_low_freq_factor"),
                "rope_high_freq_factor %g is not above rope_low_freq_factor %g (expected high > low: llama3 "
                "scaling divides by their difference)", m->rope_high_freq_factor, m->rope_low_freq_factor);
    if (c->train.seq_len > m->max_seq_len)
        fail_at(ld, blame(ld, "train", "seq_len", "model", "max_seq_len"),
                "seq_len %d is longer than max_seq_len %d (expected seq_len <= max_seq_len)", c->train.seq_len,
                m->max_seq_len);
    if (c->log.trace_last < c->log.trace_first)
        fail_at(ld, blame(ld, "log", "trace_last", "log", "trace_first"),
                "trace_last %d is before trace_first %d (expected trace_first <= trace_last: the steps log.trace "
                "records)", c->log.trace_last, c->log.trace_first);
    if (c->train.min_lr > c->train.lr)
        fail_at(ld, blame(ld, "train", "min_lr", "train", "lr"),
                "min_lr %g is above lr %g (expected 0 <= min_lr <= lr)", c->train.min_lr, c->train.lr);
    if (c->train.warmup_steps > c->train.steps && !ld->failed) {
        /* a short run (train.steps=10 on a config made for 400) just works: the warm-up is cut */
        char where[GT_PATH_MAX + 128];
        describe_origin(ld, blame(ld, "train", "warmup_steps", "train", "steps"), where, sizeof where);
        note(ld, "note: %s: warmup_steps %d is more than steps %d: the warm-up is shortened to %d steps", where,
             c->train.warmup_steps, c->train.steps, c->train.steps);
        ld->cfg->train.warmup_steps = c->train.steps;
    }
    if ((c->data.document_mask || c->data.reset_positions || !c->data.separator_loss) && c->data.separator < 0) {
        const char *k = c->data.document_mask ? "document_mask" : c->data.reset_positions ? "reset_positions"
                                                                                           : "separator_loss";
        fail_at(ld, blame(ld, "data", k, "data", "separator"),
                "%s needs data.separator (expected the token id that delimits the shards' documents, as the tool "
                "that made them printed it)", strcmp(k, "separator_loss") ? k : "separator_loss = false");
    }
    else if (c->data.separator >= m->vocab_size)
        fail_at(ld, blame(ld, "data", "separator", "model", "vocab_size"),
                "separator %d is outside [0, vocab_size %d) (expected a token id of the model's vocabulary)",
                c->data.separator, m->vocab_size);
    if (c->data.document_mask && c->train.cuda_attention != GT_CUDA_ATTENTION_DEFAULT &&
        c->train.device != GT_DEVICE_CPU)
        fail_at(ld, blame(ld, "data", "document_mask", "train", "cuda_attention"),
                "document_mask with cuda_attention %s (expected cuda_attention = default: the %s attention has no "
                "document masking)", cuda_attention_names[c->train.cuda_attention],
                cuda_attention_names[c->train.cuda_attention]);
    if (c->dist.comm == GT_COMM_NCCL && c->train.device == GT_DEVICE_CPU)
        fail_at(ld, blame(ld, "dist", "comm", "train", "device"),
                "comm nccl with device cpu (expected mpi or auto on cpu: NCCL needs GPUs)");

    /* the global batch: whatever depends on the world size is checked when it is known (gt_plan_resolve) */
    int B = c->train.micro_batch, A = c->train.grad_accum, G = c->train.global_batch;
    int accum_set = ld->where[key_index("train", "grad_accum")].kind != ORIGIN_DEFAULT;
    if (B == GT_INT_AUTO && G == 0)
        fail_at(ld, key_index("train", "micro_batch"),
                "micro_batch auto needs train.global_batch (expected global_batch = sequences per optimizer step "
                "over all ranks, or a number for micro_batch)");
    else if (G > 0 && B != GT_INT_AUTO && G % B != 0)
        fail_at(ld, blame(ld, "train", "global_batch", "train", "micro_batch"),
                "global_batch %d is not a multiple of micro_batch %d (expected global_batch = micro_batch x "
                "grad_accum x ranks)", G, B);
    else if (G > 0 && accum_set && G % A != 0) /* grad_accum beside global_batch: the one to blame */
        fail_at(ld, key_index("train", "grad_accum"),
                "global_batch %d is not a multiple of grad_accum %d (expected global_batch = micro_batch x "
                "grad_accum x ranks; leave grad_accum out and it follows from global_batch)", G, A);
    else if (G > 0 && accum_set && B != GT_INT_AUTO && G % ((long long)A * B) != 0)
        fail_at(ld, key_index("train", "grad_accum"),
                "global_batch %d is not a multiple of micro_batch %d x grad_accum %d (expected global_batch = "
                "micro_batch x grad_accum x ranks; leave grad_accum out and it follows from global_batch)", G, B, A);

    gt_policy policy;
    char msg[512] = "";
    if (gt_policy_parse(c->memory.recompute, m->n_layers, &policy, msg, sizeof msg) != 0) {
        /* recompute.c says what was expected (K's range included) */
        fail_at(ld, blame(ld, "memory", "recompute", "model", "n_layers"), "%s", msg);
    } else if (policy.kind == GT_POLICY_AUTO && c->memory.budget == 0) {
        fail_at(ld, blame(ld, "memory", "recompute", "memory", "budget"),
                "recompute auto needs memory.budget (expected budget = bytes per rank, e.g. 70GiB)");
    }
}

/* ------------------------------------------------------------------------------------------------
 * One key by name (hf_config.c's model.init merge reads and copies keys through these)
 * ---------------------------------------------------------------------------------------------- */

void gt_config_key_text(const gt_config *cfg, const char *section, const char *name, char *out, size_t len) {
    int k = key_index(section, name);
    if (k < 0) snprintf(out, len, "%s", "");
    else format_value(cfg, k, out, len);
}

void gt_config_key_copy(gt_config *dst, const gt_config *src, const char *section, const char *name) {
    int k = key_index(section, name);
    if (k >= 0) memcpy((char *)dst + keys[k].offset, (const char *)src + keys[k].offset, gt_key_field_size(&keys[k]));
}

int gt_config_key_in_range(const gt_config *cfg, const char *section, const char *name, char *expected, size_t len) {
    int k = key_index(section, name);
    if (k < 0) return 1;
    const char *field = (const char *)cfg + keys[k].offset;
    key_type type = keys[k].type;
    if (type != KEY_INT && type != KEY_FLOAT && type != KEY_DOUBLE) return 1;
    double number = type == KEY_INT ? *(const int *)field : type == KEY_FLOAT ? *(const float *)field
                                                                              : *(const double *)field;
    if (gt_key_in_range(&keys[k], number)) return 1;
    gt_key_expected(&keys[k], expected, len);
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * Public functions
 * ---------------------------------------------------------------------------------------------- */

static void remember_lines(gt_config *cfg, const loader *ld) {
    _Static_assert(N_KEYS <= GT_CONFIG_MAX_KEYS, "raise GT_CONFIG_MAX_KEYS");
    for (int k = 0; k < N_KEYS; k++) {
        const origin *o = &ld->where[k];
        cfg->key_line[k] = o->kind == ORIGIN_FILE ? o->line : o->kind == ORIGIN_CLI ? -1 : 0;
    }
}

int gt_config_key_line(const gt_config *cfg, const char *section, const char *name) {
    int k = key_index(section, name);
    return k < 0 ? 0 : cfg->key_line[k];
}

gt_resume gt_config_resume(const gt_config *cfg) {
    const char *r = cfg->checkpoint.resume;
    return strcmp(r, "auto") == 0 ? GT_RESUME_AUTO : strcmp(r, "never") == 0 ? GT_RESUME_NEVER : GT_RESUME_PATH;
}

void gt_config_where(const gt_config *cfg, const char *section, const char *name, char *out, size_t len) {
    int k = key_index(section, name);
    if (k < 0) {
        snprintf(out, len, "%s: [%s] %s", cfg->path, section, name);
        return;
    }
    int line = cfg->key_line[k];
    char value[GT_PATH_MAX + 64];
    format_value(cfg, k, value, sizeof value);
    if (line < 0)
        snprintf(out, len, "command line: %s.%s=%s", section, name, value);
    else if (line > 0)
        snprintf(out, len, "%s:%d: [%s] %s", cfg->path, line, section, name);
    else
        snprintf(out, len, "%s%s[%s] %s (default)", cfg->path, cfg->path[0] ? ": " : "", section, name);
}

/* model.init set in a config the user wrote: the [model] keys it leaves out come from config.json,
 * the ones it sets must agree (a stored /config sets every key, so this is for gt_config_load only).
 * A config.json that cannot be read is no error here when nothing needs taking: the import reports
 * it when it reads the weights, which a run that resumes from a state file never does. */
static void take_from_init(loader *ld) {
    gt_config *cfg = ld->cfg;
    char taken[1024], msg[4096];
    int all_set = 1;
    for (int k = 0; k < N_KEYS; k++) all_set &= !keys[k].changes_model || cfg->key_line[k] != 0;
    gt_model_config probe;
    if (all_set && gt_hf_read_config(cfg->model.init, &probe, msg, sizeof msg) != 0) return;
    if (gt_config_apply_init(cfg, 1, taken, sizeof taken, msg, sizeof msg) != 0) {
        fail(ld, "%s", msg);
        return;
    }
    if (taken[0])
        note(ld, "note: [model] init = %s: taken from its config.json (the INI leaves them out): %s", cfg->model.init,
             taken);
}

static int load(gt_config *cfg, const char *name, FILE *file, const char *text, int n_overrides,
                char *const *overrides, char *err, size_t err_len) {
    /* file: a config file the user named (text: a config from a state file, a test or a fuzzer) */
    loader ld;
    memset(&ld, 0, sizeof ld);
    ld.cfg = cfg;
    ld.name = name ? name : "";
    ld.err = err;
    ld.err_len = err_len;
    if (err_len) err[0] = '\0';
    gt_config_defaults(cfg);
    snprintf(cfg->path, sizeof cfg->path, "%s", ld.name);
    if (file || text) {
        ld.file = file;
        ld.text = text;
        parse_ini(&ld);
    }
    int keys_from_file = 0;
    for (int k = 0; k < N_KEYS; k++) keys_from_file += ld.where[k].kind == ORIGIN_FILE;
    if (file && !ld.failed && keys_from_file == 0)
        note(&ld, "warning: %s sets no keys: %s (configs/README.md lists them)", ld.name,
             n_overrides ? "every key not overridden on the command line has its default" : "every key has its default");
    for (int i = 0; i < n_overrides && !ld.failed; i++) apply_override(&ld, overrides[i]);
    remember_lines(cfg, &ld);
    if (!ld.failed && file && cfg->model.init[0]) take_from_init(&ld);
    if (!ld.failed) check_across(&ld);
    free(ld.full);
    if (!ld.failed && err_len) snprintf(err, err_len, "%s", ld.notes);
    return ld.failed ? GT_EXIT_BAD_INPUT : 0;
}

int gt_config_load(gt_config *cfg, const char *path, int n_overrides, char *const *overrides, char *err,
                   size_t err_len) {
    FILE *f = NULL;
    if (path) {
        struct stat st;
        f = fopen(path, "r");
        if (!f || (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode))) {
            const char *why = f ? "it is a directory" : strerror(errno);
            if (f) fclose(f);
            gt_config_defaults(cfg);
            snprintf(err, err_len, "%s: cannot open the config file: %s", path, why);
            return GT_EXIT_BAD_INPUT;
        }
    }
    int rc = load(cfg, path, f, NULL, n_overrides, overrides, err, err_len);
    if (f) fclose(f);
    return rc;
}

int gt_config_load_string(gt_config *cfg, const char *text, const char *name, int n_overrides,
                          char *const *overrides, char *err, size_t err_len) {
    return load(cfg, name ? name : "<config text>", NULL, text ? text : "", n_overrides, overrides, err,
                err_len);
}

/* data.train / data.val: every file of the spec must exist and be readable (gt_data_check_readable). */
static int check_one_file(const gt_config *cfg, const char *key, const char *spec, char *err, size_t err_len) {
    char where[GT_PATH_MAX * 2 + 64];
    gt_config_where(cfg, "data", key, where, sizeof where);
    if (strcmp(key, "val") == 0 && gt_data_spec_weighted(spec)) {
        snprintf(err, err_len, "%s: '%s': weights (PATTERN:WEIGHT) belong in data.train; data.val takes "
                 "files or globs, each source's validation loss is reported on its own", where, spec);
        return GT_EXIT_BAD_INPUT;
    }
    return gt_data_check_readable(spec, where, err, err_len);
}

int gt_config_check_metrics(const gt_config *cfg, char *err, size_t err_len) {
    const char *path = cfg->log.metrics;
    if (!path[0]) return 0;
    char where[GT_PATH_MAX * 2 + 64];
    gt_config_where(cfg, "log", "metrics", where, sizeof where);
    /* mkdir -p of the parent: "runs/x/metrics.jsonl" works before runs/x exists */
    char dir[GT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *why = NULL;
    struct stat st;
    if (slash && slash != dir) {
        *slash = '\0';
        if (gt_make_dirs(dir) != 0) why = strerror(errno);
        if (!why && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) why = "a part of the path is not a directory";
    }
    if (!why && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) why = "it is a directory";
    if (why) {
        snprintf(err, err_len, "%s: cannot write '%s': %s (expected a file path for the JSONL metrics)", where, path,
                 why);
        return GT_EXIT_BAD_INPUT;
    }
    return 0;
}

int gt_config_check_files(const gt_config *cfg, char *err, size_t err_len) {
    if (check_one_file(cfg, "train", cfg->data.train, err, err_len)) return GT_EXIT_BAD_INPUT;
    if (cfg->data.val[0] && check_one_file(cfg, "val", cfg->data.val, err, err_len))
        return GT_EXIT_BAD_INPUT;
    return 0;
}

void gt_config_changes(const gt_config *was, const gt_config *now, gt_config_change_fn *each, void *user) {
    for (int k = 0; k < N_KEYS; k++) {
        if (was->key_line[k] == 0) continue;
        char a[GT_PATH_MAX + 64], b[GT_PATH_MAX + 64], key[128];
        format_value(was, k, a, sizeof a);
        format_value(now, k, b, sizeof b);
        if (strcmp(a, b) == 0) continue;
        snprintf(key, sizeof key, "%s.%s", keys[k].section, keys[k].name);
        each(user, key, keys[k].changes_model, a, b);
    }
}

char *gt_config_to_ini(const gt_config *cfg) {
    size_t cap = 8192, used = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    out[0] = '\0';
    const char *section = "";
    for (int k = 0; k < N_KEYS; k++) {
        const key_spec *ks = &keys[k];
        char value[GT_PATH_MAX + 64];
        format_value(cfg, k, value, sizeof value);
        /* one section header per change, a key line per key; room for both */
        size_t need = strlen(ks->section) + strlen(ks->name) + strlen(value) + 16;
        if (used + need >= cap) {
            cap = 2 * cap + need;
            char *p = realloc(out, cap);
            if (!p) {
                free(out);
                return NULL;
            }
            out = p;
        }
        if (strcmp(section, ks->section) != 0) {
            used += (size_t)snprintf(out + used, cap - used, "%s[%s]\n", used ? "\n" : "", ks->section);
            section = ks->section;
        }
        used += (size_t)snprintf(out + used, cap - used, "%s = %s\n", ks->name, value);
    }
    return out;
}
