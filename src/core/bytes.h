/*
 * bytes.h — byte counts as people read them, for messages, the banner and `gtrain --plan`.
 */
#ifndef GT_BYTES_H
#define GT_BYTES_H

#include <stddef.h>
#include <stdint.h>

/* Formats bytes as "1.23 GiB" (binary units; below 1 KiB as "123 B"). */
void gt_format_bytes(uint64_t bytes, char *out, size_t out_len);

#endif
