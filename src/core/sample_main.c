/*
 * sample_main.c — `gtrain-sample`: text from a training-state file, to see what a run has learned.
 *
 *   gtrain-sample STATE.h5 [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]
 *                 [--tokenizer tokenizer.json [--python PY] [--doc-start TOKEN|auto|none]]
 *                 [--prompt-ids "ID ..."] [--ids]
 *
 * Reads the effective config (/config, parsed by gt_config_load_string) and the fp32 master weights
 * (/model/<Hugging Face name>, logical shapes) of a state file written by gtrain (docs/state-format.md), builds the model on the CPU backend and generates token by token: every
 * new token runs a full forward over the context (the last max_seq_len tokens) and samples from the
 * last position's logits. There is no KV cache, so a token costs O(T^2) attention — fine for the
 * small models this is for, slow for big ones.
 *
 * Tokens. Without --tokenizer they are bytes (vocab_size 256, as gtrain-prep writes them); a model
 * whose vocabulary is over 256 is refused then, rather than printing bytes for its ids. With
 * --tokenizer (a Hugging Face tokenizer.json, the one tools/prep_tokenized.py prepared the data
 * with) the prompt is encoded and the output decoded by the `tokenizers` Python package, in a
 * helper process running the short program HELPER below (C has no tokenizer library of the same
 * fidelity; encoding and decoding are the library's, not ours). The prompt is preceded by the
 * document separator prep_tokenized.py put at document starts (its BOS token, else its EOS token;
 * the same name lists), so the model continues it as the start of a document. --prompt-ids and
 * --ids pass token ids in and out as numbers, with or without a tokenizer.
 *
 * stdout receives the prompt followed by the generated text (exactly --tokens bytes in byte mode),
 * or with --ids one line of ids (the model's input: separator, prompt, generated); messages go to
 * stderr. The same file, prompt and seed give the same tokens; temperature 0 is greedy decoding.
 * Exit codes: 0 done, 2 bad arguments, a file that is not a usable state file, or a tokenizer that
 * cannot be used.
 *
 * It reads the file through state_read.c's readers for one process (the sec2 driver, no MPI calls), so it
 * needs no MPI start-up and no optimizer, and runs as one process.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "exitcodes.h"
#include "memtrack.h"
#include "model.h"
#include "ops.h"
#include "state.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: gtrain-sample STATE.h5 [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]\n"
            "                     [--seed S] [--tokenizer tokenizer.json [--python PY] [--doc-start TOKEN]]\n"
            "                     [--prompt-ids \"ID ...\"] [--ids]\n"
            "\n"
            "Generates text from a gtrain training-state file (DIR/step_XXXXXXXX.h5) on the CPU.\n"
            "  --prompt TEXT      text to continue (default: a newline)\n"
            "  --tokens N         tokens to generate (default 200)\n"
            "  --temperature T    softmax temperature; 0 = greedy, always the likeliest token (default 0.8)\n"
            "  --top-k K          sample only among the K likeliest tokens; 0 = all (default 40)\n"
            "  --seed S           random seed; the same seed gives the same text (default 1)\n"
            "  --tokenizer FILE   a Hugging Face tokenizer.json (the one the data was prepared with):\n"
            "                     encodes the prompt and decodes the output; needed for a vocabulary\n"
            "                     over 256 unless --ids\n"
            "  --python PY        the Python with the `tokenizers` package (default: $GTRAIN_PYTHON,\n"
            "                     else /opt/gtrain-venv/bin/python if present, else python3)\n"
            "  --doc-start TOKEN  the token put before the prompt: auto (default: the tokenizer's BOS\n"
            "                     token, else its EOS, as tools/prep_tokenized.py separates documents),\n"
            "                     none, or a token of the tokenizer\n"
            "  --prompt-ids IDS   the prompt as token ids (spaces or commas), instead of --prompt\n"
            "  --ids              print token ids (one line: the model's input and the generated ids)\n"
            "\n"
            "stdout gets the prompt (not with --prompt-ids) followed by the generated text. Without\n"
            "--tokenizer, tokens are bytes\n"
            "(vocab_size 256). No KV cache: each token re-runs the forward over the whole context (up to\n"
            "max_seq_len), O(T^2) per token — meant for small models.\n"
            "exit codes: 0 done, 2 bad arguments, not a usable gtrain state file, or an unusable tokenizer\n");
}

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gtrain-sample: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return GT_EXIT_BAD_INPUT;
}

/* ---------------------------------------------------------------- reading the state file */

/* Parses STATE.h5's /config into cfg and reads its weights into *params (malloc'd): state_read.c's
 * readers, which need neither MPI nor an optimizer. */
static int load_state(const char *path, gt_config *cfg, gt_layout *layout, float **params) {
    char err[2048], name[GT_PATH_MAX + 16], *text = NULL;
    if (gt_state_read_config(path, &text, err, sizeof err) != 0) return fail("%s", err);
    snprintf(name, sizeof name, "%s:/config", path);
    int rc = gt_config_load_string(cfg, text, name, 0, NULL, err, sizeof err);
    free(text);
    if (rc != 0) return fail("%s", err);
    gt_layout_init(layout, &cfg->model);
    *params = malloc(layout->n_params * sizeof **params);
    if (!*params) abort();
    if (gt_state_read_model(path, layout, *params, err, sizeof err) != 0)
        return fail("%s (is it a state file of this [model] config?)", err);
    return 0;
}

/* ---------------------------------------------------------------- the tokenizer helper */

/* Run by PY -c HELPER MODE TOKENIZER DOC_START. The BOS/EOS name lists are those of
 * tools/prep_tokenized.py (keep them equal).
 *   encode: stdin = the prompt (UTF-8); stdout = "VOCAB SEP\n" then the ids on one line
 *           (VOCAB = largest id + 1, SEP = the doc-start id or -1).
 *   decode: stdin = the prompt ids on one line, then one generated id per line; stdout = the text of
 *           the generated ids, printed as it becomes stable (never half a UTF-8 character). */
static const char HELPER[] =
    "import sys\n"
    "mode, path, start = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "BOS = ['<|begin_of_text|>', '<s>', '<bos>', '[BOS]', '<|startoftext|>']\n"
    "EOS = ['<|endoftext|>', '<|end_of_text|>', '</s>', '<eos>', '[EOS]']\n"
    "def die(msg):\n"
    "    sys.stderr.write('gtrain-sample: ' + msg + '\\n')\n"
    "    sys.exit(2)\n"
    "try:\n"
    "    from tokenizers import Tokenizer\n"
    "except ImportError:\n"
    "    die('the Python package tokenizers is missing from ' + sys.executable +\n"
    "        ' (pip install tokenizers, or --python /opt/gtrain-venv/bin/python)')\n"
    "try:\n"
    "    tok = Tokenizer.from_file(path)\n"
    "except Exception as e:\n"
    "    die(path + ': cannot load the tokenizer: ' + (str(e).splitlines() or [''])[0])\n"
    "if mode == 'encode':\n"
    "    vocab = max(tok.get_vocab(with_added_tokens=True).values()) + 1\n"
    "    sep = -1\n"
    "    if start == 'auto':\n"
    "        for name in BOS + EOS:\n"
    "            if tok.token_to_id(name) is not None:\n"
    "                sep = tok.token_to_id(name)\n"
    "                break\n"
    "    elif start != 'none':\n"
    "        if tok.token_to_id(start) is None:\n"
    "            die(path + ': --doc-start ' + repr(start) + ' is not a token of this tokenizer')\n"
    "        sep = tok.token_to_id(start)\n"
    "    text = sys.stdin.buffer.read().decode('utf-8', 'replace')\n"
    "    ids = tok.encode(text, add_special_tokens=False).ids\n"
    "    print(vocab, sep)\n"
    "    print(' '.join(map(str, ids)))\n"
    "else:\n"
    "    prompt = [int(x) for x in sys.stdin.readline().split()]\n"
    "    base = tok.decode(prompt, skip_special_tokens=False)\n"
    "    gen, shown = [], ''\n"
    "    def show(final):\n"
    "        global shown\n"
    "        text = tok.decode(prompt + gen, skip_special_tokens=False)\n"
    "        if not text.startswith(base) or (text.endswith('\\ufffd') and not final):\n"
    "            return\n"
    "        text = text[len(base):]\n"
    "        if text.startswith(shown):\n"
    "            sys.stdout.write(text[len(shown):])\n"
    "            sys.stdout.flush()\n"
    "            shown = text\n"
    "    try:\n"
    "        for line in sys.stdin:\n"
    "            gen.append(int(line))\n"
    "            show(False)\n"
    "        show(True)\n"
    "    except BrokenPipeError:\n"
    "        import os\n"
    "        os._exit(0)\n";

/* The interpreter: --python, $GTRAIN_PYTHON, the tests' venv, python3. */
static const char *choose_python(const char *given) {
    if (given) return given;
    const char *env = getenv("GTRAIN_PYTHON");
    if (env && *env) return env;
    if (access("/opt/gtrain-venv/bin/python", X_OK) == 0) return "/opt/gtrain-venv/bin/python";
    return "python3";
}

/* Starts PY -c HELPER mode tokenizer doc_start with pipes: *to_child (its stdin), and *from_child
 * (its stdout) unless from_child is NULL (then it shares ours). The child's pid, or -1. */
static pid_t start_helper(const char *py, const char *mode, const char *tokenizer, const char *doc_start,
                          FILE **to_child, FILE **from_child) {
    int in[2], out[2] = {-1, -1};
    signal(SIGPIPE, SIG_IGN); /* a helper that died is noticed by its exit status, not by a signal */
    if (pipe(in) != 0 || (from_child && pipe(out) != 0)) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(in[0], 0);
        close(in[0]);
        close(in[1]);
        if (from_child) {
            dup2(out[1], 1);
            close(out[0]);
            close(out[1]);
        }
        execlp(py, py, "-c", HELPER, mode, tokenizer, doc_start, (char *)NULL);
        fprintf(stderr, "gtrain-sample: cannot run the Python interpreter %s: %s (give --python, a Python with "
                "the tokenizers package)\n", py, strerror(errno));
        _exit(GT_EXIT_BAD_INPUT);
    }
    close(in[0]);
    *to_child = fdopen(in[1], "w");
    if (from_child) {
        close(out[1]);
        *from_child = fdopen(out[0], "r");
    }
    return pid;
}

static int wait_helper(pid_t pid) { /* its exit status, GT_EXIT_BAD_INPUT if it died otherwise */
    int st = 0;
    if (waitpid(pid, &st, 0) < 0) return GT_EXIT_BAD_INPUT;
    return WIFEXITED(st) ? WEXITSTATUS(st) : GT_EXIT_BAD_INPUT;
}

/* Encodes prompt: *ids (malloc'd, n_ids), the tokenizer's vocabulary size and doc-start id (-1). */
static int tokenizer_encode(const char *py, const char *tokenizer, const char *doc_start, const char *prompt,
                            int32_t **ids, size_t *n_ids, long *vocab, long *sep) {
    FILE *to = NULL, *from = NULL;
    pid_t pid = start_helper(py, "encode", tokenizer, doc_start, &to, &from);
    if (pid < 0) return fail("cannot start the tokenizer helper: %s", strerror(errno));
    fputs(prompt, to);
    fclose(to);
    int ok = fscanf(from, "%ld %ld", vocab, sep) == 2;
    size_t cap = 64, n = 0;
    int32_t *v = malloc(cap * sizeof *v);
    long x;
    while (ok && v && fscanf(from, "%ld", &x) == 1) {
        if (n == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) abort();
            v = nv;
        }
        v[n++] = (int32_t)x;
    }
    fclose(from);
    int rc = wait_helper(pid);
    if (rc != 0 || !ok) {
        free(v);
        return rc ? rc : fail("%s: the tokenizer helper (%s) gave no answer", tokenizer, py);
    }
    *ids = v;
    *n_ids = n;
    return 0;
}

/* Parses "1 2 3" or "1,2,3" into ids, each in [0, V). */
static int parse_ids(const char *text, int V, int32_t **ids, size_t *n_ids) {
    size_t cap = strlen(text) / 2 + 1, n = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) abort();
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x >= V) {
            free(v);
            return fail("--prompt-ids: '%.20s' is not a token id in [0, %d) (the model's vocab_size)", p, V);
        }
        v[n++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n_ids = n;
    return 0;
}

/* ---------------------------------------------------------------- sampling */

static uint64_t rng_state;
static double rng_uniform(void) { /* [0, 1), splitmix64 */
    rng_state += 0x9E3779B97F4A7C15ull;
    return (double)(gt_mix64(rng_state) >> 11) * (1.0 / 9007199254740992.0);
}

/* Picks the next byte from logits (V) over the ids < n_ok. */
static int pick(const float *logits, int n_ok, double temperature, int top_k, double *probs, int *order) {
    int best = 0;
    for (int i = 1; i < n_ok; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0.0) return best;
    /* the top_k likeliest ids (ties broken by id, so the order is deterministic) */
    int k = top_k > 0 && top_k < n_ok ? top_k : n_ok;
    for (int i = 0; i < n_ok; i++) order[i] = i;
    for (int i = 0; i < k; i++) { /* partial selection sort: k is small */
        int m = i;
        for (int j = i + 1; j < n_ok; j++)
            if (logits[order[j]] > logits[order[m]]) m = j;
        int t = order[i];
        order[i] = order[m];
        order[m] = t;
    }
    double sum = 0.0;
    for (int i = 0; i < k; i++) {
        probs[i] = exp(((double)logits[order[i]] - (double)logits[best]) / temperature);
        sum += probs[i];
    }
    double u = rng_uniform() * sum;
    for (int i = 0; i < k; i++) {
        u -= probs[i];
        if (u < 0.0) return order[i];
    }
    return order[k - 1];
}

static int parse_number(const char *opt, const char *text, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "gtrain-sample: %s %s: expected a number in [%g, %g]\n", opt, text, lo, hi);
        return GT_EXIT_BAD_INPUT;
    }
    *out = v;
    return 0;
}

/* ---------------------------------------------------------------- the program */

typedef struct options {
    const char *path, *prompt, *tokenizer, *python, *doc_start, *prompt_ids;
    int print_ids;
    double tokens, temperature, top_k, seed;
} options;

/* -1 to go on, else the exit code. */
static int parse_options(int argc, char **argv, options *o) {
    *o = (options){NULL, "\n", NULL, NULL, "auto", NULL, 0, 200, 0.8, 40, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        int has_value = i + 1 < argc;
        int rc = 0;
        if (strcmp(a, "--prompt") == 0 && has_value) o->prompt = argv[++i];
        else if (strcmp(a, "--tokens") == 0 && has_value) rc = parse_number(a, argv[++i], 0, 1e9, &o->tokens);
        else if (strcmp(a, "--temperature") == 0 && has_value) rc = parse_number(a, argv[++i], 0, 100, &o->temperature);
        else if (strcmp(a, "--top-k") == 0 && has_value) rc = parse_number(a, argv[++i], 0, 1e9, &o->top_k);
        else if (strcmp(a, "--seed") == 0 && has_value) rc = parse_number(a, argv[++i], 0, 1.8e19, &o->seed);
        else if (strcmp(a, "--tokenizer") == 0 && has_value) o->tokenizer = argv[++i];
        else if (strcmp(a, "--python") == 0 && has_value) o->python = argv[++i];
        else if (strcmp(a, "--doc-start") == 0 && has_value) o->doc_start = argv[++i];
        else if (strcmp(a, "--prompt-ids") == 0 && has_value) o->prompt_ids = argv[++i];
        else if (strcmp(a, "--ids") == 0) o->print_ids = 1;
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "gtrain-sample: unknown option or missing value: %s\n", a);
            usage(stderr);
            return GT_EXIT_BAD_INPUT;
        } else if (!o->path) o->path = a;
        else {
            fprintf(stderr, "gtrain-sample: more than one state file given (%s, %s)\n", o->path, a);
            return GT_EXIT_BAD_INPUT;
        }
        if (rc) return rc;
    }
    if (!o->path) {
        usage(stderr);
        return GT_EXIT_BAD_INPUT;
    }
    if (o->tokens != floor(o->tokens) || o->top_k != floor(o->top_k) || o->seed != floor(o->seed)) {
        fprintf(stderr, "gtrain-sample: --tokens, --top-k and --seed take whole numbers\n");
        return GT_EXIT_BAD_INPUT;
    }
    if (!o->prompt[0]) o->prompt = "\n";
    if (o->tokenizer && access(o->tokenizer, R_OK) != 0)
        return fail("--tokenizer %s: %s", o->tokenizer, strerror(errno));
    return -1;
}

/* The model's input after the doc-start token: the prompt's ids (*ids, malloc'd), the ids that may
 * be sampled (*n_ok: the bytes, the tokenizer's vocabulary, or all) and the doc-start id (*sep, -1). */
typedef struct input {
    int32_t *ids;
    size_t n;
    int n_ok;
    long sep;
} input;

static int model_input(const options *o, const char *py, int V, input *in) {
    *in = (input){NULL, 0, V < 256 ? V : 256, -1};
    int rc = 0;
    long tok_vocab = 0;
    if (o->prompt_ids) {
        rc = parse_ids(o->prompt_ids, V, &in->ids, &in->n);
        in->n_ok = V;
    } else if (o->tokenizer) {
        rc = tokenizer_encode(py, o->tokenizer, o->doc_start, o->prompt, &in->ids, &in->n, &tok_vocab, &in->sep);
        if (!rc && tok_vocab > V)
            rc = fail("%s has %ld tokens, more than the model's vocab_size %d: not the tokenizer this model was "
                      "trained with", o->tokenizer, tok_vocab, V);
        if (!rc) in->n_ok = (int)tok_vocab; /* ids of a padded vocabulary beyond the tokenizer's are never sampled */
    } else if (V > 256) {
        rc = fail("%s: a vocabulary of %d tokens: give the prompt as --prompt-ids, or --tokenizer to encode "
                  "--prompt", o->path, V);
    } else {
        size_t len = strlen(o->prompt);
        in->ids = malloc((len ? len : 1) * sizeof *in->ids);
        if (!in->ids) abort();
        for (size_t i = 0; i < len && !rc; i++) {
            if ((unsigned char)o->prompt[i] >= (unsigned)V)
                rc = fail("the prompt has byte %u, outside [model] vocab_size = %d", (unsigned char)o->prompt[i], V);
            in->ids[i] = (unsigned char)o->prompt[i];
        }
        in->n = len;
    }
    if (!rc && (in->sep >= 0 ? 1 : 0) + in->n == 0) /* an empty --prompt-ids, or a prompt encoded as nothing */
        rc = fail("empty prompt; give --prompt or --prompt-ids");
    return rc;
}

/* Generates o->tokens tokens after the input and writes them out: as bytes to stdout, through the
 * decode helper (a tokenizer), or as ids at the end. The exit code. */
static int generate(gt_model *model, const gt_model_config *mc, const options *o, const char *py, const input *in) {
    int V = mc->vocab_size, window = mc->max_seq_len;
    size_t n_sep = in->sep >= 0 ? 1 : 0, n_in = n_sep + in->n, n_all = n_in + (size_t)o->tokens;
    int32_t *seq = malloc(n_all * sizeof *seq), *targets = calloc((size_t)window, sizeof *targets);
    float *logits = malloc((size_t)window * V * sizeof *logits);
    double *probs = malloc((size_t)V * sizeof *probs);
    int *order = malloc((size_t)V * sizeof *order);
    if (!seq || !targets || !logits || !probs || !order) abort();
    if (n_sep) seq[0] = (int32_t)in->sep;
    memcpy(seq + n_sep, in->ids, in->n * sizeof *seq);
    rng_state = (uint64_t)o->seed;

    FILE *decoder = NULL;
    pid_t decoder_pid = -1;
    if (!o->print_ids && o->tokenizer) {
        if (!o->prompt_ids) fputs(o->prompt, stdout);
        decoder_pid = start_helper(py, "decode", o->tokenizer, o->doc_start, &decoder, NULL);
        if (decoder_pid < 0) abort();
        for (size_t i = 0; i < in->n; i++) fprintf(decoder, "%s%d", i ? " " : "", (int)in->ids[i]);
        fputc('\n', decoder);
        fflush(decoder);
    } else if (!o->print_ids) {
        for (size_t i = 0; i < in->n; i++) putchar((int)in->ids[i]);
    }
    fflush(stdout);
    for (size_t n = n_in; n < n_all; n++) {
        int T = n < (size_t)window ? (int)n : window; /* the newest `window` tokens */
        gt_model_eval(model, seq + (n - (size_t)T), targets, 1, T, logits);
        int next = pick(logits + (size_t)(T - 1) * V, in->n_ok, o->temperature, (int)o->top_k, probs, order);
        seq[n] = next;
        if (decoder) {
            fprintf(decoder, "%d\n", next);
            if (fflush(decoder) != 0) break; /* the helper is gone (its status says why) */
        } else if (!o->print_ids) {
            putchar(next);
            if (next == '\n') fflush(stdout);
        }
    }
    if (o->print_ids)
        for (size_t i = 0; i < n_all; i++) printf("%d%s", (int)seq[i], i + 1 < n_all ? " " : "\n");
    fflush(stdout);
    int rc = 0;
    if (decoder) {
        fclose(decoder);
        rc = wait_helper(decoder_pid);
    }
    free(seq), free(targets), free(logits), free(probs), free(order);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc >= 0) return rc;

    gt_config cfg;
    gt_layout layout = {0};
    float *params = NULL;
    input in = {0};
    rc = load_state(o.path, &cfg, &layout, &params);
    const gt_model_config *mc = &cfg.model;
    if (!rc && !o.tokenizer && !o.print_ids && mc->vocab_size > 256)
        rc = fail("%s: the model's vocabulary has %d tokens, not 256 bytes, so its output is not text "
                  "without its tokenizer: give --tokenizer tokenizer.json (the one the data was prepared "
                  "with), or --ids to print token ids", o.path, mc->vocab_size);
    const char *py = choose_python(o.python);
    if (!rc) rc = model_input(&o, py, mc->vocab_size, &in);
    if (!rc) {
        const gt_ops *ops = gt_ops_cpu();
        gt_mem mem;
        gt_mem_init(&mem, ops);
        gt_model *model = gt_model_create(ops, &mem, mc);
        gt_model_set_params(model, params);
        rc = generate(model, mc, &o, py, &in);
        gt_model_destroy(model);
    }
    free(in.ids);
    free(params);
    gt_layout_free(&layout);
    return rc;
}
