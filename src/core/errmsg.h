/*
 * errmsg.h — the one way gtrain's readers (token data, safetensors, Hugging Face import) write an
 * error message into a caller's buffer.
 *
 * Those readers never print: they fill `char *err, size_t err_len` with one line that names the file
 * (and the tensor or key), and the caller decides whether it becomes exit code 2 or a message on
 * rank 0. gt_errorf is that fill, with a NULL or empty buffer allowed (the message is then dropped).
 */
#ifndef GTRAIN_ERRMSG_H
#define GTRAIN_ERRMSG_H

#include <stddef.h>

/* Formats into err[0..len) (truncating, always NUL-terminated when len > 0). Returns 2, the exit
 * code for bad input, so a reader whose errors are all bad input can `return gt_errorf(...)`. */
int gt_errorf(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Appends to the NUL-terminated text in out[0..len) (truncating), for messages that list several
 * problems at once (every mismatching key of a config, say). */
void gt_appendf(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
