/* gtrain token data: shard file format, loader and writer.
 *
 * File format (version 1; all integers little-endian; docs/data-format.md has the long form):
 *
 *   offset size  field
 *        0    8  magic        "GTRNTOK\0" (the 7 ASCII letters and a NUL byte)
 *        8    4  version      u32, 1
 *       12    4  token_bytes  u32, 2 (u16 tokens) or 4 (u32 tokens)
 *       16    8  token_count  u64, number of tokens that follow
 *       24    4  vocab_size   u32, the tokenizer's vocabulary size (256 for gtrain-prep's bytes), > 0
 *       28    4  reserved     u32, 0
 *       32       token_count tokens, token_bytes each, little-endian, no padding
 *
 * The file size must be exactly 32 + token_count * token_bytes, and token_count >= 2.
 * With token_bytes 4 a token must be < 2^31 to be representable as int32_t; gt_data_max_token()
 * reports larger ids as INT32_MAX so that the caller's "max token < model vocab" check rejects them.
 *
 * Training samples live in one GLOBAL sample index space, independent of world size, grad_accum and
 * micro_batch: sample s (s = 0, 1, 2, ...) of a run with seed `seed` is the window of T+1 tokens
 * starting at
 *
 *     start(seed, s) = mix64(mix64(seed) + (s + 1) * 0x9E3779B97F4A7C15) mod (token_count - T)
 *
 * (mix64 = the splitmix64 finaliser; so start is uniform on [0, token_count - T - 1], up to a bias of
 * (token_count - T) / 2^64). inputs = window[0 .. T-1], targets = window[1 .. T]. It is a pure function:
 * resuming needs only the sample cursor (the number of samples consumed, = step * global_batch).
 * Suggested mapping for the trainer, G = micro_batch * grad_accum * world_size (global batch):
 *     first_sample(step k from 0, rank r, micro m) = k * G + (r * grad_accum + m) * micro_batch
 * Every optimizer step then consumes the same G samples whatever the world size.
 *
 * Validation uses fixed, non-overlapping windows: with nw = (token_count - 1) / T full windows,
 * window w covers tokens [ (w mod nw) * T, (w mod nw) * T + T ] (inputs the first T, targets shifted by
 * one), and validation batch b (from 0) holds windows b*n_seq .. b*n_seq + n_seq - 1. The same batches
 * are used at every evaluation, in every run and at every world size (split batches over ranks by b).
 */
#ifndef GTRAIN_DATA_H
#define GTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#define GT_DATA_MAGIC "GTRNTOK" /* + the terminating NUL: 8 bytes */
#define GT_DATA_VERSION 1u
#define GT_DATA_HEADER_BYTES 32

typedef struct gt_data gt_data;

/* Map a token file read-only and validate its header and size. On failure returns NULL and writes a
 * message naming the file and the problem into err (bad magic, unsupported version, token width,
 * size mismatch vs token_count, too few tokens, I/O errors); callers exit 2. */
gt_data *gt_data_open(const char *path, char *err, size_t err_len);
void gt_data_close(gt_data *d);                     /* NULL is fine */

const char *gt_data_path(const gt_data *d);
uint64_t gt_data_token_count(const gt_data *d);
uint32_t gt_data_vocab_size(const gt_data *d);      /* from the header */
int gt_data_token_bytes(const gt_data *d);          /* 2 or 4 */
int32_t gt_data_token(const gt_data *d, uint64_t i); /* token i (i < token_count), INT32_MAX if >= 2^31 */

/* Largest token id in the file (scans once, then cached; not thread-safe on the first call). */
int gt_data_max_token(const gt_data *d);

/* 0 if sequences of length T (T >= 1) can be drawn: token_count >= T + 1. Otherwise -1 and a message
 * naming the file, its token count and T. Call once at start-up, before the batch functions (which
 * assume it passed). */
int gt_data_check_seq(const gt_data *d, int T, char *err, size_t err_len);

/* Start position of training sample s (see the formula above). */
uint64_t gt_data_sample_start(const gt_data *d, uint64_t seed, uint64_t s, int T);

/* Fill inputs/targets, each n_seq x T (row-major), with samples first_sample .. first_sample+n_seq-1.
 * A batch of n samples equals n batches of one sample each. */
void gt_data_train_batch(const gt_data *d, uint64_t seed, uint64_t first_sample, int n_seq, int T,
                         int32_t *inputs, int32_t *targets);

/* Number of distinct validation windows for length T: (token_count - 1) / T (>= 1 after check_seq). */
uint64_t gt_data_val_windows(const gt_data *d, int T);

/* Fill inputs/targets (n_seq x T) with validation batch `batch` (windows batch*n_seq .. +n_seq-1,
 * wrapping modulo gt_data_val_windows). */
void gt_data_val_batch(const gt_data *d, int batch, int n_seq, int T, int32_t *inputs,
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
