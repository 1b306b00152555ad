/*
 * safetensors.h — the header of a safetensors file, parsed and checked (safetensors.c).
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
 * name to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets into the data that follows
 * the header; an optional "__metadata__" entry is skipped), then the raw little-endian tensors. The
 * parser trusts nothing: the length against the file size, every range against the data area and
 * against shape x dtype. It depends on nothing but jansson and errmsg.c, so a fuzzer links it alone
 * (tests/fuzz/fuzz_safetensors.c).
 */
#ifndef GT_SAFETENSORS_H
#define GT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum gt_st_dtype { GT_ST_F32, GT_ST_F16, GT_ST_BF16 } gt_st_dtype;

typedef struct gt_st_tensor {
    char *name;
    gt_st_dtype dtype;
    int ndim;               /* 0..8 */
    uint64_t shape[8];
    uint64_t begin, end;    /* byte range relative to the start of the data (after the header) */
} gt_st_tensor;

typedef struct gt_st_header {
    uint64_t data_start;    /* 8 + header length */
    uint64_t file_size;
    int n_tensors;
    gt_st_tensor *tensors;
} gt_st_header;

/* Parses the header of a safetensors file named `file` (for messages) of file_size bytes, given
 * its first len bytes (at least 8 + the header length, or the whole file). Checks that every entry
 * has a supported dtype, a shape and data_offsets that hold exactly shape x dtype bytes inside the
 * file. 0 with *out filled (free with gt_st_free), or 2 with err. */
int gt_st_parse(const char *file, const unsigned char *bytes, size_t len, uint64_t file_size, gt_st_header *out,
                char *err, size_t err_len);
void gt_st_free(gt_st_header *h);

/* Bytes per element of a dtype. */
size_t gt_st_dtype_bytes(gt_st_dtype dtype);

/* The 8-byte little-endian header length at the start of a file. */
uint64_t gt_st_le64(const unsigned char *p);

/* The format's own limit on the JSON header. */
#define GT_ST_HEADER_MAX (100u << 20)

#endif
