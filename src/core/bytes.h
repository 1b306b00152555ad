/*
 * bytes.h — byte counts as people read and write them: messages, the banner and `gtrain --plan`, and
 * the byte-size config values (memory.budget).
 */
#ifndef GT_BYTES_H
#define GT_BYTES_H

#include <stddef.h>
#include <stdint.h>

/* Formats bytes as "1.23 GiB" (binary units; below 1 KiB as "123 B"). */
void gt_format_bytes(uint64_t bytes, char *out, size_t out_len);

/* Formats bytes as a config value: exact multiples of a binary unit with it ("70GiB"), everything
 * else in bytes ("123"); gt_parse_bytes reads it back. */
void gt_format_bytes_exact(uint64_t bytes, char *out, size_t out_len);

/* Parses a byte size: "123", "64KiB", "70GiB", "1.5GB", "2TiB". 0 on success, -1 on bad input. */
int gt_parse_bytes(const char *text, uint64_t *bytes);

#endif
