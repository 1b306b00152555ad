/*
 * fixture_io.h — reader for the "GTFX" numerical fixtures written by the scripts in tests/fixtures/.
 *
 * Format (version 1, every integer and value little-endian):
 *   char[4] "GTFX" ; u32 version (1) ; u32 count ; then count records:
 *     u32 name_len ; name_len bytes of name (ASCII, no terminator)
 *     u32 dtype (0 = f32, 1 = i32, 2 = u8 text) ; u32 ndim (0 = scalar, one element) ; u32 dims[ndim]
 *     prod(dims) elements of dtype, row-major.
 * The whole file is read into memory; each record's data is an aligned copy. The reader assumes a
 * little-endian host (every platform gtrain builds on).
 */
#ifndef GT_FIXTURE_IO_H
#define GT_FIXTURE_IO_H

#include <stddef.h>
#include <stdint.h>

enum { GT_FX_F32 = 0, GT_FX_I32 = 1, GT_FX_U8 = 2 };
#define GT_FX_MAX_DIMS 8

typedef struct gt_fx_record {
    char *name;                     /* NUL-terminated copy */
    int dtype;                      /* GT_FX_* */
    int ndim;
    uint32_t dims[GT_FX_MAX_DIMS];
    size_t numel;                   /* 1 for a scalar */
    const void *data;               /* aligned, owned by the fixture; float / int32_t / uint8_t */
} gt_fx_record;

typedef struct gt_fixture {
    unsigned char *buf;
    size_t size;
    int count;
    gt_fx_record *records;
} gt_fixture;

/* Reads and validates the whole file. 0, or -1 with a message in err. */
int gt_fx_open(gt_fixture *fx, const char *path, char *err, size_t err_len);
void gt_fx_close(gt_fixture *fx);
/* The record of that name, or NULL. */
const gt_fx_record *gt_fx_find(const gt_fixture *fx, const char *name);
/* Scalar helpers: return the value, or abort() with a message if the record is missing or not a
 * one-element record of that type. */
int32_t gt_fx_i32(const gt_fixture *fx, const char *name);
float gt_fx_f32(const gt_fixture *fx, const char *name);

#endif
