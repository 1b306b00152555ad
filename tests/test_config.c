/*
 * test_config.c — the configuration contract: typed keys with ranges, checks across keys, overrides,
 * and error messages that name the file, the line and the key.
 *
 * Usage: test_config SOURCE_DIR   (to find the .ini files in configs/; the shipped configs are checked too)
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bytes.h"
#include "config.h"
#include "optim.h"

static int failures;
static const char *current;
static char tmpdir[] = "/tmp/gtrain-test-config-XXXXXX";
static const char *source_dir = ".";

#define CHECK(cond)                                                                                     \
    do {                                                                                                \
        if (!(cond)) {                                                                                  \
            fprintf(stderr, "%s:%d: %s: check failed: %s\n", __FILE__, __LINE__, current, #cond);       \
            failures++;                                                                                 \
        }                                                                                               \
    } while (0)

#define CHECK_STR(got, want)                                                                            \
    do {                                                                                                \
        if (strcmp((got), (want)) != 0) {                                                               \
            fprintf(stderr, "%s:%d: %s:\n  got  '%s'\n  want '%s'\n", __FILE__, __LINE__, current, (got), \
                    (want));                                                                            \
            failures++;                                                                                 \
        }                                                                                               \
    } while (0)

#define CHECK_PREFIX(got, want)                                                                         \
    do {                                                                                                \
        if (strncmp((got), (want), strlen(want)) != 0) {                                                \
            fprintf(stderr, "%s:%d: %s:\n  got         '%s'\n  want prefix '%s'\n", __FILE__, __LINE__, \
                    current, (got), (want));                                                            \
            failures++;                                                                                 \
        }                                                                                               \
    } while (0)

#define CHECK_HAS(got, want)                                                                            \
    do {                                                                                                \
        if (!strstr((got), (want))) {                                                                   \
            fprintf(stderr, "%s:%d: %s:\n  got           '%s'\n  want to contain '%s'\n", __FILE__,     \
                    __LINE__, current, (got), (want));                                                  \
            failures++;                                                                                 \
        }                                                                                               \
    } while (0)

/* Writes `text` to a file in the test's temporary directory and returns its path (static buffer
 * per call site is not needed: each test writes at most a few files, the names are unique). */
static const char *write_file(const char *name, const char *text) {
    static char paths[8][512];
    static int next;
    char *path = paths[next++ % 8];
    snprintf(path, 512, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return path;
}

static char err[4096];

/* Loads INI text written to NAME with overrides; returns gt_config_load's code. */
static int load_text(gt_config *cfg, const char *name, const char *text, int n, char *const *overrides) {
    const char *path = write_file(name, text);
    err[0] = '\0';
    return gt_config_load(cfg, path, n, overrides, err, sizeof err);
}

static char *fmt(const char *f, ...) {
    static char buf[4][2048];
    static int next;
    char *b = buf[next++ % 4];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, 2048, f, ap);
    va_end(ap);
    return b;
}

/* ------------------------------------------------------------------------------------------------ */

static void defaults_validate(void) {
    gt_config cfg, def;
    gt_config_defaults(&def);
    CHECK(gt_config_load_string(&cfg, "", "empty", 0, NULL, err, sizeof err) == 0);
    CHECK_STR(err, "");
    char *a = gt_config_to_ini(&cfg), *b = gt_config_to_ini(&def);
    CHECK_STR(a, b);
    free(a), free(b);
}

static void tiny_ini_is_the_defaults(void) {
    /* configs/tiny.ini spells out every default (config.c's key table and gt_config_defaults hold
     * them; tiny.ini and configs/README.md are copies: this test checks tiny.ini, and the test
     * config_keys_documented (tests/scripts/keys_documented.py) checks the README's every row) */
    gt_config cfg, def;
    gt_config_defaults(&def);
    const char *path = fmt("%s/configs/tiny.ini", source_dir);
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK_STR(err, "");
    char *a = gt_config_to_ini(&cfg), *b = gt_config_to_ini(&def);
    CHECK_STR(a, b);
    free(a), free(b);
}

static void shipped_configs_validate(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/configs", source_dir);
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) return;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".ini") != 0) continue;
        gt_config cfg;
        const char *path = fmt("%s/%s", dir, e->d_name);
        int rc = gt_config_load(&cfg, path, 0, NULL, err, sizeof err);
        if (rc != 0) fprintf(stderr, "  %s: %s\n", path, err);
        CHECK(rc == 0);
        n++;
    }
    closedir(d);
    CHECK(n >= 4);
}

static void file_values_are_typed(void) {
    gt_config cfg;
    CHECK(load_text(&cfg, "typed.ini",
                    "; a comment\n"
                    "# another\n"
                    "[model]\n"
                    "dim = 256\n"
                    "norm_eps = 1e-6\n"
                    "dropout = 0.25\n"
                    "[train]\n"
                    "lr = 0.001\n"
                    "seed = 18446744073709551615\n"
                    "lr_schedule = linear\n"
                    "[memory]\n"
                    "recompute = uniform:2\n"
                    "budget = 1.5GB\n"
                    "[data]\n"
                    "val =\n",
                    0, NULL) == 0);
    CHECK_STR(err, "");
    CHECK(cfg.model.dim == 256);
    CHECK(cfg.model.norm_eps == 1e-6f);
    CHECK(cfg.model.dropout == 0.25f);
    CHECK(cfg.train.lr == 0.001);
    CHECK(cfg.train.seed == UINT64_MAX);
    CHECK_STR(gt_lr_schedule_name(cfg.train.lr_schedule), "linear");
    CHECK_STR(cfg.memory.recompute, "uniform:2");
    CHECK(cfg.memory.budget == 1500000000ull);
    CHECK_STR(cfg.data.val, "");
    CHECK(cfg.model.n_layers == 4); /* untouched keys keep their defaults */
}

static void overrides_win_over_file(void) {
    gt_config cfg;
    char *ov[] = {"train.lr=0.5", "model.dim=256", "data.val=", "train.lr= 0.25 "};
    CHECK(load_text(&cfg, "ov.ini", "[train]\nlr = 0.001\n[model]\ndim = 64\n", 4, ov) == 0);
    CHECK_STR(err, "");
    CHECK(cfg.train.lr == 0.25); /* the last override of a key wins */
    CHECK(cfg.model.dim == 256);
    CHECK_STR(cfg.data.val, "");
}

static void overrides_alone_work_without_a_file(void) {
    gt_config cfg;
    char *ov[] = {"train.steps=70"};
    CHECK(gt_config_load(&cfg, NULL, 1, ov, err, sizeof err) == 0);
    CHECK(cfg.train.steps == 70);
}

static void unknown_key_names_file_line_key(void) {
    gt_config cfg;
    const char *path = write_file("unknown.ini", "[train]\nlr = 0.001\nstepz = 3\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: unknown key [train] stepz (did you mean steps? known keys: seq_len, ", path));
    CHECK(strchr(err, '\n') == NULL);
}

static void unknown_section_is_rejected(void) {
    gt_config cfg;
    const char *path = write_file("section.ini", "[model]\ndim = 64\n\n[trian]\nlr = 1\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:4: unknown section [trian] (did you mean train? known sections: model, train,", path));
    /* even one with no keys */
    path = write_file("section2.ini", "[model]\ndim = 64\n[optimizer]\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: unknown section [optimizer] (known sections: model, train,", path));
}

static void key_outside_a_section_is_rejected(void) {
    gt_config cfg;
    const char *path = write_file("nosection.ini", "dim = 64\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:1: key 'dim' outside any section (expected a [section] line before it: dim is a key of "
                       "[model])", path));
    /* a name two sections share gets both; one no section has gets no hint */
    path = write_file("nosection2.ini", "; run length\n\nevery = 5\n[train]\nsteps = 9\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_HAS(err, fmt("%s:3: key 'every' outside any section", path));
    CHECK_HAS(err, "every is a key of [checkpoint] or [log])");
    path = write_file("nosection3.ini", "colour = blue\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:1: key 'colour' outside any section (expected a [section] line before it)", path));
}

static void key_of_another_section_hints_at_the_missing_header(void) {
    /* [model] forgotten: its keys land in the section before */
    gt_config cfg;
    const char *path = write_file("lost.ini", "[train]\nsteps = 10\ndim = 64\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: unknown key [train] dim (dim is a key of [model]: is that section line missing "
                          "above it? known keys: seq_len,", path));
    char *ov[] = {"train.dim=64"};
    CHECK(gt_config_load(&cfg, NULL, 1, ov, err, sizeof err) == 2);
    CHECK_PREFIX(err, "command line: train.dim=64: unknown key [train] dim (dim is a key of [model]; known keys:");
    /* a plain misspelling keeps the plain message */
    path = write_file("typo.ini", "[train]\nstepz = 10\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:2: unknown key [train] stepz (did you mean steps?", path));
}

static void empty_file_warns_that_defaults_are_used(void) {
    gt_config cfg, def;
    gt_config_defaults(&def);
    const char *path = write_file("empty.ini", "");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK_STR(err, fmt("warning: %s sets no keys: every key has its default (configs/README.md lists them)", path));
    char *a = gt_config_to_ini(&cfg), *b = gt_config_to_ini(&def);
    CHECK_STR(a, b);
    free(a), free(b);
    /* comments and section lines alone set nothing either */
    path = write_file("comments.ini", "; nothing yet\n[model]\n\n[train]\n# later\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK_PREFIX(err, fmt("warning: %s sets no keys", path));
    char *ov[] = {"train.steps=50"};
    CHECK(gt_config_load(&cfg, path, 1, ov, err, sizeof err) == 0);
    CHECK_STR(err, fmt("warning: %s sets no keys: every key not overridden on the command line has its default "
                       "(configs/README.md lists them)", path));
    /* one key is enough to say nothing */
    path = write_file("one.ini", "[train]\nsteps = 50\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK_STR(err, "");
}

static void wrong_type_names_file_line_key(void) {
    gt_config cfg;
    const char *path = write_file("type.ini", "[train]\n\nlr = abc\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:3: [train] lr: 'abc' is not a number (expected a number > 0)", path));

    path = write_file("type2.ini", "[model]\ndim = 64.5\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:2: [model] dim: '64.5' is not an integer (expected an integer in 1..65536)", path));

    path = write_file("type3.ini", "[train]\nlr_schedule = cosin\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:2: [train] lr_schedule: 'cosin' is not a choice (expected one of cosine, linear, "
                       "constant)", path));
}

static void out_of_range_values_are_rejected(void) {
    static const struct {
        const char *section, *key, *value, *expected;
    } cases[] = {
        {"model", "dim", "0", "(expected an integer in 1..65536)"},
        {"model", "n_layers", "1025", "(expected an integer in 1..1024)"},
        {"model", "dropout", "1", "(expected a number in [0, 1))"},
        {"model", "dropout", "-0.1", "(expected a number in [0, 1))"},
        {"model", "norm_eps", "0", "(expected a number > 0)"},
        {"model", "norm_eps", "1e-50", "(expected a number > 0)"}, /* 0 once stored as a float */
        {"model", "rope_theta", "-1", "(expected a number > 0)"},
        {"model", "tie_word_embeddings", "yes", "(expected true or false)"},
        {"model", "rope_type", "yarn", "(expected one of default, llama3)"},
        {"model", "rope_factor", "0", "(expected a number > 0)"},
        {"model", "rope_original_max_position_embeddings", "0", "(expected an integer in 1..16777216)"},
        {"train", "lr", "0", "(expected a number > 0)"},
        {"train", "min_lr", "-1e-4", "(expected a number >= 0)"},
        {"train", "beta1", "1", "(expected a number in [0, 1))"},
        {"train", "beta2", "1.5", "(expected a number in [0, 1))"},
        {"train", "adam_eps", "0", "(expected a number > 0)"},
        {"train", "grad_clip", "-1", "(expected a number >= 0)"},
        {"train", "micro_batch", "0", "(expected auto or an integer in 1..65536)"},
        {"train", "warmup_steps", "-1", "(expected an integer >= 0)"},
        {"train", "steps", "99999999999", "(expected an integer >= 1)"},
        {"train", "lr", "inf", "(expected a number > 0)"},
        {"train", "seed", "-1", "(expected an integer in 0..18446744073709551615)"},
        {"train", "device", "gpu", "(expected one of auto, cpu, cuda)"},
        {"train", "precision", "fp16", "(expected one of auto, fp32, bf16)"},
        {"dist", "shard", "zero3", "(expected one of none, optimizer, gradients, parameters, auto)"},
        {"dist", "comm", "gloo", "(expected one of auto, nccl, mpi)"},
        {"memory", "budget", "lots", "(expected a size in bytes"},
        {"data", "train", "", "must not be empty"},
        {"checkpoint", "resume", "", "must not be empty"},
        {"log", "every", "0", "(expected an integer >= 1)"},
        {"checkpoint", "memory_every", "soon", "(expected auto or an integer >= 0)"},
        {"checkpoint", "memory_every", "-1", "(expected auto or an integer >= 0)"},
        {"dist", "bucket_mb", "soon", "(expected auto or a number in [0, 1024])"},
        {"dist", "bucket_mb", "-1", "(expected auto or a number in [0, 1024])"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gt_config cfg;
        const char *path = write_file("range.ini", fmt("[%s]\n%s = %s\n", cases[i].section, cases[i].key,
                                                        cases[i].value));
        CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
        CHECK_PREFIX(err, fmt("%s:2: [%s] %s: ", path, cases[i].section, cases[i].key));
        CHECK_HAS(err, cases[i].expected);
        /* the same through an override */
        char *ov[] = {fmt("%s.%s=%s", cases[i].section, cases[i].key, cases[i].value)};
        CHECK(gt_config_load(&cfg, NULL, 1, ov, err, sizeof err) == 2);
        CHECK_PREFIX(err, fmt("command line: %s: ", ov[0]));
        CHECK_HAS(err, cases[i].expected);
    }
}

static void override_error_names_the_override(void) {
    gt_config cfg;
    char *ov[] = {"train.lr=abc"};
    CHECK(load_text(&cfg, "fine.ini", "[train]\nlr = 0.001\n", 1, ov) == 2);
    CHECK_STR(err, "command line: train.lr=abc: 'abc' is not a number (expected a number > 0)");
}

static void malformed_overrides_are_rejected(void) {
    const char *bad[] = {"foo", "train.=3", ".lr=3", "train.lr", "=3", "trainlr=3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gt_config cfg;
        char *ov[] = {(char *)bad[i]};
        CHECK(gt_config_load(&cfg, NULL, 1, ov, err, sizeof err) == 2);
        CHECK_STR(err, fmt("command line: %s: not an override (expected section.key=value, e.g. train.lr=1e-3)",
                           bad[i]));
    }
    gt_config cfg;
    char *ov[] = {"train.stepz=3"};
    CHECK(gt_config_load(&cfg, NULL, 1, ov, err, sizeof err) == 2);
    CHECK_PREFIX(err, "command line: train.stepz=3: unknown key [train] stepz (did you mean steps?");
    char *ov2[] = {"optim.lr=3"};
    CHECK(gt_config_load(&cfg, NULL, 1, ov2, err, sizeof err) == 2);
    CHECK_PREFIX(err, "command line: optim.lr=3: unknown section [optim]");
}

static void dim_not_divisible_by_heads_is_rejected(void) {
    gt_config cfg;
    const char *path = write_file("heads.ini", "[model]\ndim = 64\nn_layers = 2\nn_heads = 6\nn_kv_heads = 6\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:4: [model] n_heads: n_heads 6 does not divide dim 64 (expected dim to be a multiple "
                       "of n_heads)", path));
}

static void cross_key_error_blames_the_key_set_last(void) {
    /* n_heads from the file, dim from the command line: the command line is named */
    gt_config cfg;
    char *ov[] = {"model.dim=100"};
    CHECK(load_text(&cfg, "blame.ini", "[model]\nn_heads = 8\nn_kv_heads = 8\n", 1, ov) == 2);
    CHECK_PREFIX(err, "command line: model.dim=100: n_heads 8 does not divide dim 100");
    /* dim from the file, n_heads left at its default (4): the file's dim line is named */
    const char *path = write_file("blame2.ini", "[model]\n\ndim = 66\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: [model] dim: n_heads 4 does not divide dim 66", path));
}

static void odd_head_size_is_rejected(void) {
    gt_config cfg;
    const char *path = write_file("odd.ini", "[model]\ndim = 60\nn_heads = 4\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: [model] n_heads: head size dim/n_heads = 60/4 = 15 is odd", path));
}

static void kv_heads_must_divide_heads(void) {
    gt_config cfg;
    const char *path = write_file("kv.ini", "[model]\nn_heads = 4\nn_kv_heads = 3\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:3: [model] n_kv_heads: n_kv_heads 3 does not divide n_heads 4 (expected n_heads to be "
                       "a multiple of n_kv_heads)", path));
}

static void seq_len_longer_than_max_seq_len_is_rejected(void) {
    gt_config cfg;
    const char *path = write_file("seq.ini", "[model]\nmax_seq_len = 256\n[train]\nseq_len = 512\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:4: [train] seq_len: seq_len 512 is longer than max_seq_len 256 (expected seq_len <= "
                       "max_seq_len)", path));
}

static void schedule_keys_must_agree(void) {
    gt_config cfg;
    const char *path = write_file("sched.ini", "[train]\nlr = 1e-3\nmin_lr = 1e-2\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: [train] min_lr: min_lr 0.01 is above lr 0.001", path));
}

static void trace_window_must_be_in_order(void) {
    gt_config cfg;
    const char *path = write_file("tracewin.ini", "[log]\ntrace = t.json\ntrace_last = 4\ntrace_first = 5\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: [log] trace_last: trace_last 4 is before trace_first 5", path));
    path = write_file("tracewin.ini", "[log]\ntrace = t.json\ntrace_first = 3\ntrace_last = 3\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK(cfg.log.trace_first == 3 && cfg.log.trace_last == 3);
}

static void warmup_longer_than_steps_is_shortened_with_a_note(void) {
    gt_config cfg;
    const char *path = write_file("warm.ini", "[train]\nsteps = 10\nwarmup_steps = 11\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK_STR(err, fmt("note: %s:3: [train] warmup_steps: warmup_steps 11 is more than steps 10: the warm-up is "
                       "shortened to 10 steps", path));
    CHECK(cfg.train.warmup_steps == 10 && cfg.train.steps == 10);
    /* the schedule then warms up over the whole run and ends at lr */
    CHECK(gt_lr_at(&cfg, 1) == cfg.train.lr / 10 && gt_lr_at(&cfg, 10) == cfg.train.lr);

    /* gtrain configs/tiny.ini train.steps=10: the note names the override, set last */
    char *ov[] = {"train.steps=10"};
    CHECK(gt_config_load(&cfg, fmt("%s/configs/tiny.ini", source_dir), 1, ov, err, sizeof err) == 0);
    CHECK_STR(err, "note: command line: train.steps=10: warmup_steps 20 is more than steps 10: the warm-up is "
                   "shortened to 10 steps");
    CHECK(cfg.train.warmup_steps == 10);

    /* equal is fine and silent; a negative warm-up is still an error */
    char *ov2[] = {"train.steps=20"};
    CHECK(gt_config_load(&cfg, fmt("%s/configs/tiny.ini", source_dir), 1, ov2, err, sizeof err) == 0);
    CHECK_STR(err, "");
    CHECK(cfg.train.warmup_steps == 20);
    char *ov3[] = {"train.steps=10", "train.warmup_steps=-1"};
    CHECK(gt_config_load(&cfg, NULL, 2, ov3, err, sizeof err) == 2);
    CHECK_PREFIX(err, "command line: train.warmup_steps=-1: -1 is out of range (expected an integer >= 0)");
}

/* bf16 with device cpu is a valid config (the CPU's bf16 table; whether this machine has it is the
 * trainer's question, train.c); NCCL with device cpu is not. */
static void nccl_needs_a_gpu_and_bf16_does_not(void) {
    gt_config cfg;
    const char *path = write_file("bf16.ini", "[train]\ndevice = cpu\nprecision = bf16\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK(cfg.train.precision == GT_PRECISION_BF16);
    path = write_file("nccl.ini", "[train]\ndevice = cpu\n[dist]\ncomm = nccl\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:4: [dist] comm: comm nccl with device cpu", path));
}

/* document masking needs the separator, a token of the vocabulary, and on CUDA the default attention */
static void document_mask_needs_separator_and_default_attention(void) {
    gt_config cfg;
    const char *path = write_file("docs.ini", "[data]\ndocument_mask = true\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:2: [data] document_mask: document_mask needs data.separator", path));
    path = write_file("reset.ini", "[data]\nreset_positions = true\nseparator = 256\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: [data] separator: separator 256 is outside [0, vocab_size 256)", path));
    path = write_file("eod.ini", "[data]\nseparator_loss = false\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:2: [data] separator_loss: separator_loss = false needs data.separator", path));
    path = write_file("eod.ini", "[data]\nseparator_loss = false\nseparator = 5\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0 && cfg.data.separator_loss == 0);
    path = write_file("mma.ini", "[train]\ncuda_attention = mma\n[data]\ndocument_mask = true\nseparator = 0\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:4: [data] document_mask: document_mask with cuda_attention mma (expected "
                          "cuda_attention = default", path));
    CHECK(strchr(err, '\n') == NULL);
    path = write_file("cpu.ini", "[train]\ndevice = cpu\ncuda_attention = cudnn\n[data]\ndocument_mask = true\n"
                                 "separator = 10\nseparator_role = bos\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK(cfg.data.document_mask == 1 && cfg.data.separator == 10 && cfg.data.separator_before == 1);
}

static void bad_recompute_policy_is_rejected(void) {
    gt_config cfg;
    const char *path = write_file("policy.ini", "[model]\nn_layers = 4\n[memory]\nrecompute = uniform:9\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:4: [memory] recompute: ", path));
    CHECK_HAS(err, "1..4");
    path = write_file("policy2.ini", "[memory]\nrecompute = sometimes\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:2: [memory] recompute: ", path));
    CHECK_HAS(err, "sometimes");
    /* every documented policy is accepted */
    const char *good[] = {"none", "full", "selective", "sqrt", "uniform:2", "blocks:0", "blocks:4"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char *ov[] = {fmt("memory.recompute=%s", good[i])};
        CHECK(gt_config_load(&cfg, NULL, 1, ov, err, sizeof err) == 0);
    }
}

static void auto_without_budget_is_rejected(void) {
    gt_config cfg;
    const char *path = write_file("auto.ini", "[memory]\nrecompute = auto\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:2: [memory] recompute: recompute auto needs memory.budget (expected budget = bytes per "
                       "rank, e.g. 70GiB)", path));
    char *ov[] = {"memory.budget=70GiB"};
    CHECK(gt_config_load(&cfg, path, 1, ov, err, sizeof err) == 0);
    CHECK(cfg.memory.budget == 70ull << 30);
}

/* train.global_batch and micro_batch = auto: what can be checked before the world size is known
 * (planner.c's settle_batch checks the rest, test_timemodel.c) */
static void global_batch_keys_are_checked(void) {
    gt_config cfg;
    const char *path = write_file("gb.ini", "[train]\nmicro_batch = auto\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:2: [train] micro_batch: micro_batch auto needs train.global_batch", path));
    char *ov[] = {"train.global_batch=64"};
    CHECK(gt_config_load(&cfg, path, 1, ov, err, sizeof err) == 0);
    CHECK(cfg.train.micro_batch == GT_INT_AUTO && cfg.train.global_batch == 64);
    path = write_file("gb2.ini", "[train]\nmicro_batch = 4\nglobal_batch = 10\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: [train] global_batch: global_batch 10 is not a multiple of micro_batch 4", path));
    path = write_file("gb3.ini", "[train]\nmicro_batch = 2\nglobal_batch = 16\ngrad_accum = 3\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:4: [train] grad_accum: global_batch 16 is not a multiple of grad_accum 3", path));
    path = write_file("gb4.ini", "[train]\nmicro_batch = 2\nglobal_batch = 16\n[dist]\nprefetch = auto\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK(cfg.dist.prefetch == GT_INT_AUTO && cfg.train.grad_accum == 1); /* grad_accum follows at the run */
}

static void duplicate_key_is_rejected(void) {
    gt_config cfg;
    const char *path = write_file("dup.ini", "[train]\nlr = 1e-3\n[model]\n[train]\nlr = 2e-3\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:5: [train] lr: set twice (first on line 2)", path));
}

static void syntax_error_names_the_line(void) {
    gt_config cfg;
    const char *path = write_file("syntax.ini", "[train]\nlr = 1e-3\nthis line has no equals sign\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:3: cannot parse this line (expected [section], key = value or a comment)", path));
    /* a syntax error before a bad key is the one reported */
    path = write_file("syntax2.ini", "[train\nlr = abc\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:1: cannot parse", path));
}

static void missing_config_file_is_an_error(void) {
    gt_config cfg;
    const char *path = fmt("%s/no-such.ini", tmpdir);
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s: cannot open the config file: ", path));
    CHECK(gt_config_load(&cfg, tmpdir, 0, NULL, err, sizeof err) == 2);
}

static void indented_keys_and_comments_are_plain(void) {
    /* libinih would take an indented line as a continuation of the previous value; we do not */
    gt_config cfg;
    CHECK(load_text(&cfg, "indent.ini",
                    "[train]\r\n"
                    "  lr = 0.002   ; inline comment\r\n"
                    "\tsteps = 300  # another kind\r\n"
                    "    # an indented comment\n"
                    "[data]\n"
                    "  val = # nothing: no validation\n",
                    0, NULL) == 0);
    CHECK_STR(err, "");
    CHECK(cfg.train.lr == 0.002);
    CHECK(cfg.train.steps == 300);
    CHECK_STR(cfg.data.val, "");
}

static void long_lines_keep_values_and_line_numbers(void) {
    /* libinih's line buffer is 200 bytes; longer paths still work and later lines keep their numbers */
    char longpath[700];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = '\0';
    memcpy(longpath, "/scratch/", 9);
    char comment[400];
    memset(comment, 'c', sizeof comment - 1);
    comment[0] = ';';
    comment[sizeof comment - 1] = '\0';
    gt_config cfg;
    const char *path = write_file("long.ini", fmt("[checkpoint]\n%s\ndir = %s ; trailing\n[train]\nlr = x\n",
                                                  comment, longpath));
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:5: [train] lr: 'x'", path));
    path = write_file("long2.ini", fmt("[checkpoint]\n%s\ndir = %s ; trailing\n", comment, longpath));
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK_STR(cfg.checkpoint.dir, longpath);
}

static void text_values_read_back_as_themselves(void) {
    /* found by fuzzing (tests/fuzz/corpus/config/crash_control_chars_in_path): the effective config
     * goes into every state file as INI text, so a value that would not read back is refused */
    gt_config cfg;
    const char *path = write_file("ctl.ini", "[data]\ntrain = tok\vens.bin\n");
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s:2: [data] train: the value contains a control character (byte 0x0b) (expected printable "
                       "text)", path));
    char *ov[] = {"checkpoint.dir=runs/a ;b"};
    CHECK(gt_config_load(&cfg, NULL, 1, ov, err, sizeof err) == 2);
    CHECK_PREFIX(err, "command line: checkpoint.dir=runs/a ;b: 'runs/a ;b': ';' at the start or after a space begins "
                      "a comment");
    char *ov2[] = {"log.metrics=#m.jsonl"};
    CHECK(gt_config_load(&cfg, NULL, 1, ov2, err, sizeof err) == 2);
    /* inside a word they are plain characters, and round-trip */
    char *ov3[] = {"checkpoint.dir=runs/a;b#c"};
    CHECK(gt_config_load(&cfg, NULL, 1, ov3, err, sizeof err) == 0);
    char *text = gt_config_to_ini(&cfg);
    gt_config again;
    CHECK(gt_config_load_string(&again, text, "round", 0, NULL, err, sizeof err) == 0);
    CHECK_STR(again.checkpoint.dir, "runs/a;b#c");
    free(text);
}

static void bytes_parse(void) {
    static const struct {
        const char *text;
        uint64_t bytes;
    } good[] = {
        {"0", 0},
        {"123", 123},
        {"123B", 123},
        {"64KiB", 64ull << 10},
        {"512MiB", 512ull << 20},
        {"70GiB", 70ull << 30},
        {"70 GiB", 70ull << 30},
        {"70G", 70ull << 30},
        {"1.5GB", 1500000000ull},
        {"1.5GiB", 3ull << 29},
        {"2TiB", 2ull << 40},
        {"1TB", 1000000000000ull},
        {"18446744073709551615", UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t b = 7;
        int rc = gt_parse_bytes(good[i].text, &b);
        if (rc != 0 || b != good[i].bytes)
            fprintf(stderr, "  gt_parse_bytes(\"%s\") = %d, %llu\n", good[i].text, rc, (unsigned long long)b);
        CHECK(rc == 0 && b == good[i].bytes);
    }
    const char *bad[] = {"", "GiB", "-1", "1.", ".5GiB", "1.5.2GB", "12 parsecs", "70gib", "20000000TiB",
                         "18446744073709551616"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t b;
        int rc = gt_parse_bytes(bad[i], &b);
        if (rc != -1) fprintf(stderr, "  gt_parse_bytes(\"%s\") accepted\n", bad[i]);
        CHECK(rc == -1);
    }
}

static void to_ini_round_trips(void) {
    /* every key away from its default, including values that need care to print exactly */
    char *ov[] = {
        "model.dim=96", "model.n_layers=3", "model.n_heads=6", "model.n_kv_heads=3", "model.vocab_size=300",
        "model.ffn_dim=250", "model.norm_eps=1e-6", "model.rope_theta=500000", "model.max_seq_len=96",
        "model.dropout=0.1", "model.tie_word_embeddings=true", "model.rope_type=llama3", "model.rope_factor=32",
        "model.rope_low_freq_factor=0.5", "model.rope_high_freq_factor=2",
        "model.rope_original_max_position_embeddings=4096", "model.init=hf/llama", "train.seq_len=64", "train.micro_batch=3", "train.grad_accum=5", "train.global_batch=30", "train.steps=77",
        "train.lr=0.1", "train.min_lr=0.03", "train.warmup_steps=7", "train.lr_schedule=linear",
        "train.weight_decay=0.01", "train.beta1=0.8", "train.beta2=0.999", "train.adam_eps=1e-7",
        "train.grad_clip=0", "train.seed=18446744073709551615", "train.precision=fp32", "train.device=cpu",
        "memory.recompute=uniform:3", "memory.budget=1000001", "dist.shard=gradients", "dist.comm=mpi", "dist.grad_sync=micro", "dist.prefetch=auto", "dist.bucket_mb=2.5", "dist.progress_us=250", "dist.overlap_param_gather=true", "dist.timeout=12.5", "dist.liveness_timeout=2.5",
        "data.train=a b/train.bin", "data.val=", "data.val_every=0", "data.val_batches=9",
        "data.loss_mask=on",
        "checkpoint.dir=runs/x", "checkpoint.every=10", "checkpoint.keep=0", "checkpoint.resume=runs/x/s.h5",
        "log.every=5", "log.metrics=runs/x/metrics.jsonl",
        "train.nonfinite=skip", "checkpoint.every_minutes=2.5", "checkpoint.allow_model_change=true",
        "checkpoint.takeover=true",
        "checkpoint.async=false", "checkpoint.max_failed_saves=7", "checkpoint.memory_every=3",
        "checkpoint.mtbf=0.25", "checkpoint.memory_share=0.05",
        "train.spike_zscore=4.5",
        "log.tensorboard=runs/x/tb",
        "log.trace=runs/x/trace.json", "log.trace_first=3", "log.trace_last=5",
        "train.peak_tflops=312.5",
        "train.cuda_attention=mma",
        "data.document_mask=true", "data.reset_positions=true", "data.separator=7", "data.separator_role=bos",
        "data.separator_loss=false",
    };
    int n = (int)(sizeof ov / sizeof ov[0]);
    gt_config a, b, def;
    gt_config_defaults(&def);
    CHECK(gt_config_load(&a, NULL, n, ov, err, sizeof err) == 0);
    CHECK_STR(err, "");
    char *text = gt_config_to_ini(&a);
    char *text_def = gt_config_to_ini(&def);
    /* every key line differs from the defaults' */
    int differ = 0, lines = 0;
    for (char *p = text, *q = text_def; *p && *q;) {
        char *pe = strchr(p, '\n'), *qe = strchr(q, '\n');
        if (!pe || !qe) break;
        if (strchr(p, '=') < pe) lines++, differ += (pe - p != qe - q) || strncmp(p, q, (size_t)(pe - p)) != 0;
        p = pe + 1, q = qe + 1;
    }
    CHECK(lines == n);
    CHECK(differ == n);
    CHECK(gt_config_load_string(&b, text, "round-trip", 0, NULL, err, sizeof err) == 0);
    CHECK_STR(err, "");
    char *again = gt_config_to_ini(&b);
    CHECK_STR(again, text);
    CHECK(memcmp(&a.model, &b.model, sizeof a.model) == 0);
    CHECK(memcmp(&a.train, &b.train, sizeof a.train) == 0);
    CHECK(memcmp(&a.memory, &b.memory, sizeof a.memory) == 0);
    CHECK(a.train.lr == b.train.lr && a.model.norm_eps == b.model.norm_eps);
    CHECK_STR(b.data.train, "a b/train.bin");
    /* and through a file, the way --plan output or a state file's /config is read back */
    CHECK(load_text(&b, "round.ini", text, 0, NULL) == 0);
    char *from_file = gt_config_to_ini(&b);
    CHECK_STR(from_file, text);
    free(text), free(text_def), free(again), free(from_file);

    /* awkward doubles print exactly */
    char *ov2[] = {"train.lr=0.1", "train.min_lr=0.030000000000000002"};
    CHECK(gt_config_load(&a, NULL, 2, ov2, err, sizeof err) == 0);
    text = gt_config_to_ini(&a);
    CHECK(gt_config_load_string(&b, text, "round-trip", 0, NULL, err, sizeof err) == 0);
    CHECK(b.train.min_lr == a.train.min_lr);
    CHECK_HAS(text, "\nlr = 0.1\n");          /* the shortest exact text, not 0.10000000000000001 */
    CHECK_HAS(text, "\nrope_theta = 10000\n"); /* not 1e+04 */
    free(text);
}

static void check_files_names_missing_file_line_key(void) {
    gt_config cfg;
    char missing[600];
    snprintf(missing, sizeof missing, "%s/no-such-train.bin", tmpdir);
    const char *path = write_file("data.ini", fmt("[data]\n\ntrain = %s\nval =\n", missing));
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    CHECK(gt_config_check_files(&cfg, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("%s:3: [data] train: cannot read '%s': No such file or directory", path, missing));

    /* present files pass; an empty val is skipped */
    const char *present = write_file("train.bin", "tokens");
    char *ov[] = {fmt("data.train=%s", present)};
    CHECK(gt_config_load(&cfg, path, 1, ov, err, sizeof err) == 0);
    CHECK(gt_config_check_files(&cfg, err, sizeof err) == 0);

    /* a missing val given on the command line names the override */
    char train_ov[700], val_ov[700];
    snprintf(train_ov, sizeof train_ov, "data.train=%s", present);
    snprintf(val_ov, sizeof val_ov, "data.val=%s", missing);
    char *ov2[] = {train_ov, val_ov};
    CHECK(gt_config_load(&cfg, path, 2, ov2, err, sizeof err) == 0);
    CHECK(gt_config_check_files(&cfg, err, sizeof err) == 2);
    CHECK_PREFIX(err, fmt("command line: data.val=%s: cannot read", missing));

    /* a directory is not a data file */
    char *ov3[] = {fmt("data.train=%s", tmpdir)};
    CHECK(gt_config_load(&cfg, path, 1, ov3, err, sizeof err) == 0);
    CHECK(gt_config_check_files(&cfg, err, sizeof err) == 2);
    CHECK_HAS(err, "it is a directory");
}


/* checkpoint.memory_every takes `auto` (kept as -1) or a step count, and writes back what it read. */
static void memory_every_takes_auto(void) {
    gt_config cfg;
    char *ov[] = {"checkpoint.memory_every=auto"};
    CHECK(gt_config_load(&cfg, NULL, 1, ov, err, sizeof err) == 0);
    CHECK(cfg.checkpoint.memory_every == -1);
    char text[64];
    gt_config_key_text(&cfg, "checkpoint", "memory_every", text, sizeof text);
    CHECK_STR(text, "auto");
    char *ov2[] = {"checkpoint.memory_every=7"};
    CHECK(gt_config_load(&cfg, NULL, 1, ov2, err, sizeof err) == 0);
    gt_config_key_text(&cfg, "checkpoint", "memory_every", text, sizeof text);
    CHECK(cfg.checkpoint.memory_every == 7);
    CHECK_STR(text, "7");
}

/* Every choice setting is an enum whose name table parses and prints each value (banners and the
 * /config text of state files print the names). */
static void choice_settings_are_enums_with_their_names(void) {
    gt_config cfg;
    char *ov[] = {"train.device=cuda", "train.precision=bf16", "train.nonfinite=skip", "train.lr_schedule=constant",
                  "dist.shard=auto", "dist.comm=nccl", "dist.grad_sync=micro", "model.rope_type=llama3",
                  "checkpoint.allow_model_change=true"};
    CHECK(gt_config_load(&cfg, NULL, 9, ov, err, sizeof err) == 0);
    CHECK(cfg.train.device == GT_DEVICE_CUDA && cfg.train.precision == GT_PRECISION_BF16);
    CHECK(cfg.train.nonfinite == GT_NONFINITE_SKIP && cfg.train.lr_schedule == GT_LR_CONSTANT);
    CHECK(cfg.dist.shard == GT_SHARD_AUTO && cfg.dist.comm == GT_COMM_NCCL && cfg.dist.grad_sync == GT_GRAD_SYNC_MICRO);
    CHECK(cfg.model.rope_type == GT_ROPE_LLAMA3 && cfg.checkpoint.allow_model_change == 1);
    CHECK_STR(gt_device_name(cfg.train.device), "cuda");
    CHECK_STR(gt_precision_name(cfg.train.precision), "bf16");
    CHECK_STR(gt_nonfinite_name(cfg.train.nonfinite), "skip");
    CHECK_STR(gt_lr_schedule_name(cfg.train.lr_schedule), "constant");
    CHECK_STR(gt_shard_stage_name(cfg.dist.shard), "auto");
    CHECK_STR(gt_comm_choice_name(cfg.dist.comm), "nccl");
    CHECK_STR(gt_grad_sync_name(cfg.dist.grad_sync), "micro");
    CHECK_STR(gt_rope_type_name(cfg.model.rope_type), "llama3");
    /* the shard values are the ZeRO stages the trainer and planner use */
    CHECK(GT_SHARD_NONE == 0 && GT_SHARD_OPTIMIZER == 1 && GT_SHARD_GRADIENTS == 2 && GT_SHARD_PARAMETERS == 3);
    CHECK(gt_config_resume(&cfg) == GT_RESUME_AUTO);
    char *resume_ov[] = {"checkpoint.resume=never", "checkpoint.resume=runs/x/step_00000010.h5"};
    gt_config other;
    CHECK(gt_config_load(&other, NULL, 1, resume_ov, err, sizeof err) == 0 && gt_config_resume(&other) == GT_RESUME_NEVER);
    CHECK(gt_config_load(&other, NULL, 1, resume_ov + 1, err, sizeof err) == 0 && gt_config_resume(&other) == GT_RESUME_PATH);
    char *text = gt_config_to_ini(&cfg);
    CHECK_HAS(text, "\nshard = auto\n");
    CHECK_HAS(text, "\ndevice = cuda\n");
    CHECK_HAS(text, "\nallow_model_change = true\n");
    free(text);
}

/* gt_config_where names a value's origin the way messages about it begin: a file's line, the
 * override as given (never the INI for a value from the command line), or the default. */
static void where_names_file_line_override_or_default(void) {
    gt_config cfg;
    const char *path = write_file("where.ini", "[checkpoint]\n\ndir = runs/a\n");
    char *ov[] = {"checkpoint.dir=runs/b", "log.metrics=m.jsonl"};
    char where[2048];
    CHECK(gt_config_load(&cfg, path, 0, NULL, err, sizeof err) == 0);
    gt_config_where(&cfg, "checkpoint", "dir", where, sizeof where);
    CHECK_STR(where, fmt("%s:3: [checkpoint] dir", path));
    CHECK(gt_config_load(&cfg, path, 2, ov, err, sizeof err) == 0);
    gt_config_where(&cfg, "checkpoint", "dir", where, sizeof where);
    CHECK_STR(where, "command line: checkpoint.dir=runs/b");
    gt_config_where(&cfg, "train", "lr", where, sizeof where);
    CHECK_STR(where, fmt("%s: [train] lr (default)", path));
}

typedef struct seen_changes {
    char text[2048];
} seen_changes;

static void collect_change(void *user, const char *key, int changes_model, const char *was, const char *now) {
    seen_changes *s = user;
    size_t used = strlen(s->text);
    snprintf(s->text + used, sizeof s->text - used, "%s%s%s %s->%s", used ? "; " : "", changes_model ? "FN " : "",
             key, was, now);
}

/* What resume compares: every changed key, in table order, with the key table's FN column; keys a
 * stored config does not set (an older gtrain's) are not compared. */
static void changes_name_every_key_and_whether_it_changes_the_model(void) {
    gt_config was, now;
    char *ov[] = {"model.n_layers=6", "train.lr=0.001", "model.rope_theta=500000", "model.max_seq_len=128",
                  "dist.shard=parameters"};
    CHECK(gt_config_load_string(&was, "[model]\nn_layers = 4\nrope_theta = 10000\nmax_seq_len = 256\n"
                                      "[train]\nlr = 0.003\n[dist]\nshard = optimizer\n",
                                "saved", 0, NULL, err, sizeof err) == 0);
    CHECK(gt_config_load_string(&now, "", "now", 5, ov, err, sizeof err) == 0);
    now.model.dim = 96; /* a key the saved text does not set: not compared */
    seen_changes s = {""};
    gt_config_changes(&was, &now, collect_change, &s);
    CHECK_STR(s.text, "FN model.n_layers 4->6; FN model.rope_theta 10000->500000; model.max_seq_len 256->128; "
                      "train.lr 0.003->0.001; dist.shard optimizer->parameters");
}

/* model.init: a config.json in DIR. */
static const char *hf_dir(const char *name, const char *json) {
    static char dir[4][600];
    static int next;
    char *d = dir[next++ % 4];
    snprintf(d, 600, "%s/%s", tmpdir, name);
    mkdir(d, 0777);
    char file[700];
    snprintf(file, sizeof file, "%s/config.json", name);
    write_file(file, json);
    return d;
}

static const char HF_JSON[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,\n"
    " \"num_key_value_heads\": 2, \"vocab_size\": 320, \"intermediate_size\": 160, \"rms_norm_eps\": 1e-06,\n"
    " \"rope_theta\": 500000.0, \"max_position_embeddings\": 512, \"tie_word_embeddings\": true}\n";

/* With model.init set, the [model] keys the INI leaves out come from config.json, with one note
 * listing them; the ones it sets are still checked, and every mismatch is named in one message. */
static void init_takes_unset_model_keys_and_names_every_mismatch(void) {
    const char *dir = hf_dir("hf", HF_JSON);
    gt_config cfg;
    CHECK(load_text(&cfg, "init.ini", fmt("[model]\ninit = %s\nn_heads = 4\n", dir), 0, NULL) == 0);
    CHECK(cfg.model.dim == 64 && cfg.model.n_layers == 2 && cfg.model.n_kv_heads == 2 && cfg.model.vocab_size == 320);
    CHECK(cfg.model.ffn_dim == 160 && cfg.model.norm_eps == 1e-6f && cfg.model.rope_theta == 500000.0f);
    CHECK(cfg.model.tie_word_embeddings == 1 && cfg.model.rope_type == GT_ROPE_DEFAULT);
    CHECK(cfg.model.max_seq_len == 256); /* the run's choice: not taken */
    CHECK_STR(err, fmt("note: [model] init = %s: taken from its config.json (the INI leaves them out): dim = 64, "
                       "n_layers = 2, vocab_size = 320, ffn_dim = 160, norm_eps = 1e-06, rope_theta = 500000, "
                       "tie_word_embeddings = true", dir));
    /* the effective config, as a state file stores it, sets them all: reading it back takes nothing */
    char *text = gt_config_to_ini(&cfg);
    gt_config again;
    CHECK(load_text(&again, "init_again.ini", text, 0, NULL) == 0);
    CHECK_STR(err, "");
    CHECK(memcmp(&again.model, &cfg.model, sizeof cfg.model) == 0);
    free(text);

    /* explicit values are checked, all at once: the file's and the command line's */
    char *ov[] = {"model.n_layers=3"};
    const char *path = write_file("init_bad.ini", fmt("[model]\ninit = %s\ndim = 128\nffn_dim = 160\n", dir));
    CHECK(gt_config_load(&cfg, path, 1, ov, err, sizeof err) == 2);
    CHECK_STR(err, fmt("%s/config.json: hidden_size = 64, but %s:3 [model] dim = 128; num_hidden_layers = 2, but "
                       "[model] n_layers (set on the command line) = 3 (expected the same values, or the keys left "
                       "out of [model] so that they are taken from config.json)", dir, path));
    /* and gt_hf_check_config's comparison of a loaded config agrees: nothing left to mismatch */
    CHECK(load_text(&cfg, "init.ini", fmt("[model]\ninit = %s\n", dir), 0, NULL) == 0);
    CHECK(gt_config_apply_init(&cfg, 0, NULL, 0, err, sizeof err) == 0);
}

/* A config.json that cannot be read is an error when keys would be taken from it; when the INI sets
 * every model key it is left to the import (a run resuming from a state file never reads it). */
static void init_unreadable_is_an_error_only_when_keys_are_taken(void) {
    gt_config cfg;
    char missing[700];
    snprintf(missing, sizeof missing, "%s/no_such_hf", tmpdir);
    CHECK(load_text(&cfg, "init_missing.ini", fmt("[model]\ninit = %s\n", missing), 0, NULL) == 2);
    CHECK_HAS(err, "[model] init = ");
    CHECK_HAS(err, "No such file or directory");
    gt_config full;
    gt_config_defaults(&full);
    snprintf(full.model.init, sizeof full.model.init, "%s", missing);
    char *text = gt_config_to_ini(&full);
    CHECK(load_text(&cfg, "init_missing_full.ini", text, 0, NULL) == 0);
    free(text);
}

/* ------------------------------------------------------------------------------------------------ */

#define RUN(test)                                                                                      \
    do {                                                                                               \
        current = #test;                                                                               \
        int before = failures;                                                                         \
        test();                                                                                        \
        printf("%s %s\n", failures == before ? "ok  " : "FAIL", #test);                               \
    } while (0)

int main(int argc, char **argv) {
    if (argc > 1) source_dir = argv[1];
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(defaults_validate);
    RUN(tiny_ini_is_the_defaults);
    RUN(shipped_configs_validate);
    RUN(file_values_are_typed);
    RUN(overrides_win_over_file);
    RUN(overrides_alone_work_without_a_file);
    RUN(unknown_key_names_file_line_key);
    RUN(unknown_section_is_rejected);
    RUN(key_outside_a_section_is_rejected);
    RUN(key_of_another_section_hints_at_the_missing_header);
    RUN(empty_file_warns_that_defaults_are_used);
    RUN(wrong_type_names_file_line_key);
    RUN(out_of_range_values_are_rejected);
    RUN(memory_every_takes_auto);
    RUN(override_error_names_the_override);
    RUN(malformed_overrides_are_rejected);
    RUN(dim_not_divisible_by_heads_is_rejected);
    RUN(cross_key_error_blames_the_key_set_last);
    RUN(odd_head_size_is_rejected);
    RUN(kv_heads_must_divide_heads);
    RUN(seq_len_longer_than_max_seq_len_is_rejected);
    RUN(schedule_keys_must_agree);
    RUN(trace_window_must_be_in_order);
    RUN(warmup_longer_than_steps_is_shortened_with_a_note);
    RUN(nccl_needs_a_gpu_and_bf16_does_not);
    RUN(document_mask_needs_separator_and_default_attention);
    RUN(bad_recompute_policy_is_rejected);
    RUN(auto_without_budget_is_rejected);
    RUN(global_batch_keys_are_checked);
    RUN(duplicate_key_is_rejected);
    RUN(syntax_error_names_the_line);
    RUN(missing_config_file_is_an_error);
    RUN(indented_keys_and_comments_are_plain);
    RUN(long_lines_keep_values_and_line_numbers);
    RUN(text_values_read_back_as_themselves);
    RUN(bytes_parse);
    RUN(to_ini_round_trips);
    RUN(check_files_names_missing_file_line_key);
    RUN(choice_settings_are_enums_with_their_names);
    RUN(where_names_file_line_override_or_default);
    RUN(changes_name_every_key_and_whether_it_changes_the_model);
    RUN(init_takes_unset_model_keys_and_names_every_mismatch);
    RUN(init_unreadable_is_an_error_only_when_keys_are_taken);

    /* leave nothing behind */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
