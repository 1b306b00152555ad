/* gtrain token data: shard file formats, the multi-shard loader and the writer.
 *
 * A data set is one or more shard files, named by a SPEC: paths separated by commas, each a plain
 * path or a glob pattern (*, ?, [...]) expanded in sorted order ("data/web.train.*.bin",
 * "a.bin,b.bin"). A pattern that matches nothing is an error. docs/data-format.md has the long form.
 * Each entry is a SOURCE; an entry may end in ":WEIGHT" (a positive number): "web.*.bin:0.7, code.bin:0.3".
 * Either every source has a weight or none. Without weights every window of every file is equally
 * likely (the rule below); with weights sample s first picks source j with probability
 * weight_j / sum(weights) and then a window of that source uniformly:
 *     w(s) = mix64(seed) + (s + 1) * 0x9E3779B97F4A7C15 (mod 2^64)
 *     source = the first j with w(s) < floor(2^64 * (weight_0 + ... + weight_j) / sum) (the last if none)
 *     window = (the source's first window) + mix64(w(s)) mod (the source's window count)
 * w(s) / 2^64 is a golden-ratio (Weyl) sequence, so any run of consecutive samples holds each source
 * in its share up to a few samples. Still a pure function of (seed, s).
 *
 * Two shard formats, told apart by their first bytes:
 *
 *   gtrain (version 1; all integers little-endian):
 *     offset size  field
 *          0    8  magic        "GTRNTOK\0" (the 7 ASCII letters and a NUL byte)
 *          8    4  version      u32, 1
 *         12    4  token_bytes  u32, 2 (u16 tokens) or 4 (u32 tokens)
 *         16    8  token_count  u64, number of tokens that follow
 *         24    4  vocab_size   u32, the tokenizer's vocabulary size (256 for gtrain-prep's bytes), > 0
 *         28    4  reserved     u32, 0
 *         32       token_count tokens, token_bytes each, little-endian, no padding
 *     The file size must be exactly 32 + token_count * token_bytes, and token_count >= 2.
 *
 *   llm.c (read as it is): 256 little-endian int32 header words, then the tokens.
 *     word 0 magic 20240520, word 1 version 1, word 2 token_count; u16 tokens (GPT-2 style), or
 *     word 0 magic 20240801, word 1 version 7, word 2 token_count; u32 tokens (llm.c's LLaMA-3 data).
 *     The file size must be exactly 1024 + token_count * token bytes. No vocabulary is recorded.
 *
 * With 4-byte tokens a token must be < 2^31 to be representable as int32_t; gt_data_token() reports
 * larger ids as INT32_MAX so that the caller's vocabulary check rejects them.
 *
 * Training samples live in one GLOBAL sample index space, independent of world size, grad_accum and
 * micro_batch. A window of T+1 tokens never crosses a shard boundary: shard i (count_i tokens) offers
 * n_i = count_i - T start positions (0 if count_i < T+1), N = sum n_i in all, numbered shard by shard.
 * Sample s (s = 0, 1, 2, ...) of a run with seed `seed` is window number
 *
 *     k(seed, s) = mix64(mix64(seed) + (s + 1) * 0x9E3779B97F4A7C15) mod N
 *
 * (mix64 = the splitmix64 finaliser; uniform over all N windows, up to a bias of N / 2^64), i.e. start
 * k - (n_0 + ... + n_{i-1}) of the shard i that holds window k. With one shard this is start = k.
 * inputs = window[0 .. T-1], targets = window[1 .. T]. It is a pure function: resuming needs only the
 * sample cursor (the number of samples consumed, = step * global_batch).
 * Mapping for the trainer, G = micro_batch * grad_accum * world_size (global batch):
 *     first_sample(step k from 0, rank r, micro m) = k * G + (r * grad_accum + m) * micro_batch
 * Every optimizer step then consumes the same G samples whatever the world size.
 *
 * Validation uses fixed, non-overlapping windows: shard i holds nw_i = (count_i - 1) / T of them,
 * window j of shard i covers its tokens [ j*T, j*T + T ]; windows are numbered shard by shard (NW in
 * all), and validation batch b (from 0) holds windows (b*n_seq .. b*n_seq + n_seq - 1) mod NW. The
 * same batches are used at every evaluation, in every run and at every world size.
 *
 * Token positions in this interface (gt_data_token, gt_data_sample_start) are GLOBAL: an index into
 * the concatenation of the shards in SPEC order.
 */
#ifndef GTRAIN_DATA_H
#define GTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#define GT_DATA_MAGIC "GTRNTOK" /* + the terminating NUL: 8 bytes */
#define GT_DATA_VERSION 1u
#define GT_DATA_HEADER_BYTES 32
#define GT_MASK_MAGIC "GTRNMSK" /* + NUL: a loss mask file */
#define GT_LLMC_MAGIC 20240520u        /* llm.c, u16 tokens, version 1 */
#define GT_LLMC_MAGIC_U32 20240801u    /* llm.c's LLaMA-3 data, u32 tokens, version 7 */
#define GT_LLMC_HEADER_BYTES 1024      /* 256 int32 */

typedef struct gt_data gt_data;

/* Expands SPEC (see above) into file paths: *paths (malloc'd array of malloc'd strings) and *n.
 * 0, or -1 and a message (a pattern matching nothing, an empty entry, out of memory). Nothing is
 * opened; literal paths are not checked for existence. Free with gt_data_free_paths. */
int gt_data_expand(const char *spec, char ***paths, int *n, char *err, size_t err_len);
void gt_data_free_paths(char **paths, int n);

/* Before training: every file of the spec exists and is readable, and a pattern matches something
 * (headers are checked later, by gt_data_open). 0, or 2 (GT_EXIT_BAD_INPUT) with one line in err that
 * starts with `where` (the config key, file and line) and names the file. */
int gt_data_check_readable(const char *spec, const char *where, char *err, size_t err_len);

/* Maps every file of SPEC read-only and validates each header and size. On failure returns NULL
 * and writes a message naming the file and the problem into err (bad magic, unsupported version,
 * token width, size mismatch vs token_count (truncated), too few tokens, a pattern matching
 * nothing, I/O errors); callers exit 2. */
gt_data *gt_data_open(const char *spec, char *err, size_t err_len);
void gt_data_close(gt_data *d);                     /* NULL is fine */

int gt_data_n_files(const gt_data *d);
const char *gt_data_file_path(const gt_data *d, int i);
const char *gt_data_file_format(const gt_data *d, int i); /* "gtrain" or "llm.c" */
uint64_t gt_data_token_count(const gt_data *d);     /* all files together */
/* The largest vocab_size recorded in a gtrain header; 0 when every file is an llm.c shard. */
uint32_t gt_data_vocab_size(const gt_data *d);
int gt_data_token_bytes(const gt_data *d);          /* the widest: 2 or 4 */
int32_t gt_data_token(const gt_data *d, uint64_t i); /* global token i, INT32_MAX if >= 2^31 */

/* Largest token id in all files (scans each file once, then cached; not thread-safe). */
int gt_data_max_token(const gt_data *d);

/* 0 if every token can index an embedding of model_vocab rows. A gtrain file whose header
 * vocab_size <= model_vocab passes without a scan, and so does a u16 llm.c file when
 * model_vocab >= 65536; any other file is scanned for its largest id. Otherwise -1 and a message
 * naming the file, its largest id (and header vocabulary) and model_vocab. */
int gt_data_check_vocab(const gt_data *d, int model_vocab, char *err, size_t err_len);

/* 0 if sequences of length T (T >= 1) can be drawn: some file has at least T + 1 tokens.
 * Otherwise -1 and a message naming the file(s), the token count and T. Call once at start-up,
 * before the batch functions (which assume it passed). */
int gt_data_check_seq(const gt_data *d, int T, char *err, size_t err_len);

/* One line for start-up logs: "PATH (N tokens)" for one file, "K files, N tokens: A, B, C, ..."
 * for several (the first few names). */
void gt_data_describe(const gt_data *d, char *out, size_t len);

/* Loss masks. A shard PATH.bin (or PATH) may have a mask beside it, PATH.mask (or PATH.mask): the
 * gtrain header with magic "GTRNMSK\0", version 1, token_bytes 1, token_count = the shard's,
 * vocab_size 0, reserved 0, then one byte per token: 0 = the token is not a target of the loss
 * (a prompt), anything else = it is. With masks loaded, a target the mask does not count is -1 in the
 * batches (the loss ignores targets < 0). mode: GT_DATA_MASK_OFF (no masks), _AUTO (those that are
 * there), _ON (every file must have one; else -1 and a message starting with `where`). 0, or -1 + a
 * message naming the bad or missing mask file. */
enum { GT_DATA_MASK_AUTO = 0, GT_DATA_MASK_ON = 1, GT_DATA_MASK_OFF = 2 };
void gt_data_mask_path(const char *path, char *out, size_t len);
int gt_data_load_masks(gt_data *d, int mode, const char *where, char *err, size_t err_len);
int gt_data_has_masks(const gt_data *d);
/* data.separator_loss = false: the target at every position whose input token is sep (the prediction
 * made at a separator: with an eos separator the next document's first token) is not counted either,
 * -1 in the batches like a masked one; sep < 0 counts them again. */
void gt_data_uncount_separator(gt_data *d, int32_t sep);
/* 1 when some target may be uncounted (masks, or the separator's): the loss is then the mean over the
 * counted targets of the batch. */
int gt_data_counts_targets(const gt_data *d);
/* Targets counted by the loss in training samples first .. first+n-1 (n * T when every one counts). */
uint64_t gt_data_train_counted(const gt_data *d, uint64_t seed, uint64_t first_sample, uint64_t n, int T);

/* Sources (the spec's entries, in order), their names (the file name up to its first '.', made
 * unique: "data/web.*.bin" -> "web"), weights (normalised; 0 when unweighted) and token counts. */
int gt_data_n_sources(const gt_data *d);
const char *gt_data_source_name(const gt_data *d, int j);
int gt_data_weighted(const gt_data *d);
double gt_data_source_weight(const gt_data *d, int j);
uint64_t gt_data_source_tokens(const gt_data *d, int j);
/* 1 if SPEC's sources carry weights (0 for an unweighted or a bad spec). */
int gt_data_spec_weighted(const char *spec);
/* The source training sample s is drawn from (weighted sets; -1 when unweighted). */
int gt_data_sample_source(const gt_data *d, uint64_t seed, uint64_t s);
/* One line: each source's share of samples first .. first+n-1 next to its weight (empty when
 * unweighted). */
void gt_data_describe_mix(const gt_data *d, uint64_t seed, uint64_t first, uint64_t n, char *out, size_t len);

/* Global start position of training sample s (see the formula above). */
uint64_t gt_data_sample_start(const gt_data *d, uint64_t seed, uint64_t s, int T);

/* Fill inputs/targets, each n_seq x T (row-major), with samples first_sample .. first_sample+n_seq-1.
 * A batch of n samples equals n batches of one sample each. */
void gt_data_train_batch(const gt_data *d, uint64_t seed, uint64_t first_sample, int n_seq, int T,
                         int32_t *inputs, int32_t *targets);

/* Number of distinct validation windows for length T (all files; >= 1 after check_seq). */
uint64_t gt_data_val_windows(const gt_data *d, int T);

/* Fill inputs/targets (n_seq x T) with validation batch `batch` (windows batch*n_seq .. +n_seq-1,
 * wrapping modulo gt_data_val_windows). */
void gt_data_val_batch(const gt_data *d, int batch, int n_seq, int T, int32_t *inputs,
                       int32_t *targets);

/* The same for source src alone (src = -1: all sources, as above): its windows, numbered from 0. */
uint64_t gt_data_val_windows_source(const gt_data *d, int src, int T);
void gt_data_val_batch_source(const gt_data *d, int src, int batch, int n_seq, int T, int32_t *inputs,
                              int32_t *targets);

/* Writer: streams tokens into PATH.tmp.<pid>, and on finish writes the header, fsyncs and renames it
 * to PATH (then fsyncs the directory), so PATH is either absent/old or complete. */
typedef struct gt_data_writer gt_data_writer;

gt_data_writer *gt_data_writer_open(const char *path, int token_bytes, uint32_t vocab_size, char *err,
                                    size_t err_len);
/* Append n tokens; each must be in [0, vocab_size). 0 on success, -1 + message. */
int gt_data_writer_append(gt_data_writer *w, const int32_t *tokens, size_t n, char *err,
                          size_t err_len);
uint64_t gt_data_writer_count(const gt_data_writer *w);
/* Finish and publish the file; frees w whatever the outcome. 0 on success, -1 + message (the
 * temporary file is removed). Writing fewer than 2 tokens is allowed here, but gt_data_open rejects
 * such a file. */
int gt_data_writer_finish(gt_data_writer *w, char *err, size_t err_len);
/* Drop the temporary file and free w (NULL is fine). */
void gt_data_writer_abort(gt_data_writer *w);

/* Encode a version-1 header into out[32] (for writers and tests). */
void gt_data_encode_header(unsigned char out[GT_DATA_HEADER_BYTES], uint32_t token_bytes,
                           uint64_t token_count, uint32_t vocab_size);

#endif
