/*
 * state.c — the training-state file format (see state.h and docs/state-format.md): the rules both
 * layouts follow, the chunking and the file's size, a flat range's blocks. state_write.c writes
 * (the single collective file, the rank files and their top file), state_read.c reads either;
 * state_internal.h declares what the three share.
 *
 * Writing is collective parallel HDF5 (MPI-IO driver). The rules it follows:
 *   - every metadata change (create a group, a dataset, an attribute) is made by all ranks with
 *     identical arguments, so the config text is broadcast from rank 0 first;
 *   - every tensor dataset gets the same number of collective H5Dwrite calls on every rank: a rank
 *     whose slice misses the tensor selects nothing and still takes part. Filtered (Fletcher32)
 *     datasets can only be written collectively (HDF5 >= 1.10.2), which this also satisfies;
 *   - no single transfer moves more than 1 GiB per rank (MPI-IO and some file systems fail on
 *     2 GiB requests): a larger slice of a tensor is written in rounds, and the number of rounds of
 *     a tensor is agreed with one all-reduce (max) over ranks;
 *   - allocations of 512 KiB or more (the chunks of large tensors) start on 1 MiB boundaries
 *     (H5Pset_alignment), which parallel file systems stripe on; small ones are packed;
 *   - a failed file operation (a full disk) is agreed over the ranks and returned, never a hang
 *     and never an abort (see "Writing" in state_write.c).
 * A rank's slice of the flat parameter vector cuts a [out, in] tensor at arbitrary elements, so a
 * piece is up to three blocks (a partial first row, full rows, a partial last row), each moved by
 * its own H5Dwrite/H5Dread with a memory dataspace of the block's own shape. (One call with the
 * three blocks OR'ed together, or a 1-D memory space against a 2-D block, is correct too but sends
 * HDF5 1.10 down its element-by-element chunk-mapping path, which was the bottleneck.) A collective
 * write therefore makes three calls per transfer for a matrix, one for a vector, on every rank.
 * Chunks are whole rows of just under 4 MiB, so that a chunk plus its 4-byte checksum fits a 4 MiB
 * aligned slot instead of spilling into a fifth MiB.
 *
 * Reading is per rank and independent (the sec2 driver, no collective calls): a rank that finds a
 * bad checksum returns an error instead of leaving the others hanging in a collective, and
 * runstate_resume.c makes the ranks agree. Tensors move through a host staging buffer
 * (ops->copy_to_host / copy_to_device), so the GPU backend works the same way; the staging buffer
 * is at most one transfer (1 GiB).
 */

#include "state.h"
#include "state_internal.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* GTRAIN_STATE_MAX_IO_BYTES (tests) lowers the 1 GiB transfer limit to exercise the split path. */
size_t gt_st_max_io_elems(void) {
    size_t bytes = MAX_IO_BYTES_DEFAULT;
    const char *env = getenv("GTRAIN_STATE_MAX_IO_BYTES");
    if (env && strtoull(env, NULL, 10) >= sizeof(float)) bytes = (size_t)strtoull(env, NULL, 10);
    return bytes / sizeof(float);
}

void gt_st_tensor_dims(const gt_tensor_info *t, hsize_t *dims) {
    for (int d = 0; d < t->ndim; d++) dims[d] = (hsize_t)t->shape[d];
}

/* Chunks of whole rows. Each chunk carries a 4-byte Fletcher32 sum and, when it is over the
 * alignment threshold (every chunk of a tensor larger than ALIGN_BYTES is), starts on an ALIGN_BYTES
 * boundary, so it occupies whole slots of ALIGN_BYTES; and a tensor's last chunk is stored full
 * size. Among chunks of up to CHUNK_BYTES that fill 1, 2, 3 or 4 slots exactly (less the checksum),
 * pick the one that wastes the least file space (ties: the larger chunk): a [2048, 2048] tensor
 * (16 MiB) takes 17 MiB, not 20. A tensor smaller than that is one chunk, packed when it is under
 * the threshold. */
void gt_st_chunk_dims(int ndim, const hsize_t *dims, hsize_t *chunk) {
    hsize_t len = dims[ndim - 1], outer = ndim == 2 ? dims[0] : 1;
    hsize_t row_bytes = ndim == 2 ? len * sizeof(float) : sizeof(float);
    hsize_t units = ndim == 2 ? outer : len; /* chunked along the first dimension */
    hsize_t best = 1, best_bytes = ~(hsize_t)0;
    for (hsize_t slots = 1; slots * ALIGN_BYTES <= CHUNK_BYTES; slots++) {
        hsize_t per = (slots * ALIGN_BYTES - 4) / row_bytes;
        if (per < 1) per = 1;
        if (per > units) per = units;
        hsize_t n_chunks = (units + per - 1) / per;
        hsize_t used = n_chunks * ((per * row_bytes + 4 + ALIGN_BYTES - 1) / ALIGN_BYTES) * ALIGN_BYTES;
        if (used <= best_bytes) best = per, best_bytes = used;
    }
    chunk[0] = best;
    if (ndim == 2) chunk[1] = len;
}

/* Bytes one dataset of dims takes in the file: its chunks, aligned ones rounded up to whole
 * slots, plus an allowance for its object header and chunk index. *aligned: whether its chunks are. */
static uint64_t dataset_file_bytes(int ndim, const hsize_t *dims, int *aligned) {
    hsize_t chunk[2];
    gt_st_chunk_dims(ndim, dims, chunk);
    hsize_t units = dims[0], per = chunk[0];
    hsize_t row_bytes = ndim == 2 ? dims[1] * sizeof(float) : sizeof(float);
    hsize_t chunk_bytes = per * row_bytes + 4, n_chunks = (units + per - 1) / per;
    *aligned = chunk_bytes >= ALIGN_THRESHOLD;
    if (*aligned) chunk_bytes = (chunk_bytes + ALIGN_BYTES - 1) / ALIGN_BYTES * ALIGN_BYTES;
    return (uint64_t)(n_chunks * chunk_bytes) + 1024;
}

/* An upper bound: a packed (small) dataset between aligned ones can leave a gap of up to
 * ALIGN_BYTES before the next aligned chunk, so each is counted as that much more. Measured: a
 * dim-512, 2-block, vocab-8192 model's file is 195.00 MiB, this says 207.15 MiB; configs/tiny.ini's
 * (no aligned chunks) is 9.25 MiB, this says 9.38 MiB. */
uint64_t gt_state_file_bytes(const gt_layout *layout) {
    uint64_t bytes = 64 << 10, small = 0; /* superblock, groups, attributes, /config */
    int any_aligned = 0;
    for (int i = 0; i < layout->n_tensors; i++) {
        hsize_t dims[2] = {1, 1};
        int aligned = 0;
        gt_st_tensor_dims(&layout->tensors[i], dims);
        bytes += 3 * dataset_file_bytes(layout->tensors[i].ndim, dims, &aligned);
        any_aligned |= aligned;
        small += !aligned;
    }
    return bytes + (any_aligned ? 3 * small * ALIGN_BYTES : 0);
}

/* Splits the elements [first, first+count) of a row-major tensor into blocks; returns how many
 * slots (1 for a vector, 3 for a matrix: a partial first row, full rows, a partial last row). Absent
 * blocks keep their slot with size 0, so that every rank makes the same calls. */
int gt_st_flat_blocks(int ndim, const hsize_t *dims, hsize_t first, hsize_t count, block b[3]) {
    memset(b, 0, 3 * sizeof *b);
    if (ndim == 1) {
        b[0] = (block){{first, 0}, {count, 0}, 0};
        return 1;
    }
    hsize_t cols = dims[1], end = first + count, at = 0;
    if (count && first % cols != 0) { /* partial first row */
        hsize_t n = cols - first % cols;
        if (n > count) n = count;
        b[0] = (block){{first / cols, first % cols}, {1, n}, 0};
        first += n;
        at += n;
    }
    if (end - first >= cols) { /* full rows */
        hsize_t rows = (end - first) / cols;
        b[1] = (block){{first / cols, 0}, {rows, cols}, at};
        first += rows * cols;
        at += rows * cols;
    }
    if (first < end) b[2] = (block){{first / cols, 0}, {1, end - first}, at}; /* partial last row */
    return 3;
}

hsize_t gt_st_block_elems(int ndim, const block *b) { return ndim == 1 ? b->size[0] : b->size[0] * b->size[1]; }

/* Selects block b in the file space and returns a memory space of the same shape (all selected);
 * for an empty block, selects none in both. -1 on failure. */
hid_t gt_st_select_block(hid_t file_space, int ndim, const block *b) {
    hsize_t n = gt_st_block_elems(ndim, b), one[2] = {1, 1};
    hid_t mem = H5Screate_simple(ndim, n ? b->size : one, NULL);
    if (mem < 0) return -1;
    herr_t rc = n ? H5Sselect_hyperslab(file_space, H5S_SELECT_SET, b->start, NULL, b->size, NULL)
                  : (H5Sselect_none(file_space) < 0 ? -1 : H5Sselect_none(mem));
    if (rc < 0) {
        H5Sclose(mem);
        return -1;
    }
    return mem;
}

/* The innermost message of the HDF5 error stack: the one that says what was wrong. */
herr_t gt_st_innermost_error(unsigned n, const H5E_error2_t *e, void *data) {
    if (n == 0 && e->desc) snprintf((char *)data, 256, "%s", e->desc);
    return 0;
}
