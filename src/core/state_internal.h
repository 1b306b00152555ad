/*
 * state_internal.h — what the files of the training-state format (state.c, state_write.c,
 * state_read.c) share; the rest of gtrain includes state.h (which this does not include: no ring).
 */
#ifndef GT_STATE_INTERNAL_H
#define GT_STATE_INTERNAL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h" /* gt_tensor_info */

#define MAX_IO_BYTES_DEFAULT ((size_t)1 << 30) /* per rank per transfer */
#define CHUNK_BYTES ((size_t)4 << 20)         /* per chunk with its checksum: one Fletcher32 sum each */
#define ALIGN_BYTES ((hsize_t)1 << 20)       /* file-system stripe friendly */
/* Only allocations of this size or more are aligned: the chunks of large tensors (every chunk of a
 * tensor over 1 MiB is at least ALIGN_BYTES - one row, see chunk_dims). Small tensors (norm weights,
 * a tiny model's matrices) and metadata are packed; aligning them wasted up to 1 MiB each, which
 * made a 9.6 MB tiny model's file 69 MB. */
#define ALIGN_THRESHOLD ((hsize_t)512 << 10)

static const char *const GROUPS[3] = {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"};

/* One rectangular block of a tensor: file offset `start`, shape `size` (ndim 1 or 2), and where its
 * first element sits in the flat range it came from. */
typedef struct block {
    hsize_t start[2], size[2];
    size_t at;
} block;

size_t gt_st_max_io_elems(void);
void gt_st_tensor_dims(const gt_tensor_info *t, hsize_t *dims);
void gt_st_chunk_dims(int ndim, const hsize_t *dims, hsize_t *chunk);
int gt_st_flat_blocks(int ndim, const hsize_t *dims, hsize_t first, hsize_t count, block b[3]);
hsize_t gt_st_block_elems(int ndim, const block *b);
hid_t gt_st_select_block(hid_t file_space, int ndim, const block *b);
/* H5Ewalk2's callback: copies the innermost HDF5 error message into data (char[256]). */
herr_t gt_st_innermost_error(unsigned n, const H5E_error2_t *e, void *data);

#endif
