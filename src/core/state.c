/*
 * state.c — the training-state file format (see state.h and docs/state-format.md).
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
 *     and never an abort (see "Writing" below).
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
 * runstate.c makes the ranks agree. Tensors move through a host staging buffer (ops->copy_to_host /
 * copy_to_device), so the GPU backend works the same way; the staging buffer is at most one
 * transfer (1 GiB).
 */
#define _GNU_SOURCE /* memfd_create */

#include "state.h"

#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "shard.h"
#include "agree.h"
#include "testhooks.h"
#include "watchdog.h"

#define MAX_IO_BYTES_DEFAULT ((size_t)1 << 30) /* per rank per transfer */
#define CHUNK_BYTES ((size_t)4 << 20)         /* per chunk with its checksum: one Fletcher32 sum each */
#define ALIGN_BYTES ((hsize_t)1 << 20)       /* file-system stripe friendly */
/* Only allocations of this size or more are aligned: the chunks of large tensors (every chunk of a
 * tensor over 1 MiB is at least ALIGN_BYTES - one row, see chunk_dims). Small tensors (norm weights,
 * a tiny model's matrices) and metadata are packed; aligning them wasted up to 1 MiB each, which
 * made a 9.6 MB tiny model's file 69 MB. */
#define ALIGN_THRESHOLD ((hsize_t)512 << 10)

static const char *const GROUPS[3] = {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"};

/* GTRAIN_STATE_MAX_IO_BYTES (tests) lowers the 1 GiB transfer limit to exercise the split path. */
static size_t max_io_elems(void) {
    size_t bytes = MAX_IO_BYTES_DEFAULT;
    const char *env = getenv("GTRAIN_STATE_MAX_IO_BYTES");
    if (env && strtoull(env, NULL, 10) >= sizeof(float)) bytes = (size_t)strtoull(env, NULL, 10);
    return bytes / sizeof(float);
}

static void tensor_dims(const gt_tensor_info *t, hsize_t *dims) {
    for (int d = 0; d < t->ndim; d++) dims[d] = (hsize_t)t->shape[d];
}

/* Chunks of whole rows. Each chunk carries a 4-byte Fletcher32 sum and, when it is over the
 * alignment threshold (every chunk of a tensor larger than ALIGN_BYTES is), starts on an ALIGN_BYTES
 * boundary, so it occupies whole slots of ALIGN_BYTES; and a tensor's last chunk is stored full
 * size. Among chunks of up to CHUNK_BYTES that fill 1, 2, 3 or 4 slots exactly (less the checksum),
 * pick the one that wastes the least file space (ties: the larger chunk): a [2048, 2048] tensor
 * (16 MiB) takes 17 MiB, not 20. A tensor smaller than that is one chunk, packed when it is under
 * the threshold. */
static void chunk_dims(int ndim, const hsize_t *dims, hsize_t *chunk) {
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
    chunk_dims(ndim, dims, chunk);
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
        tensor_dims(&layout->tensors[i], dims);
        bytes += 3 * dataset_file_bytes(layout->tensors[i].ndim, dims, &aligned);
        any_aligned |= aligned;
        small += !aligned;
    }
    return bytes + (any_aligned ? 3 * small * ALIGN_BYTES : 0);
}

/* One rectangular block of a tensor: file offset `start`, shape `size` (ndim 1 or 2), and where its
 * first element sits in the flat range it came from. */
typedef struct block {
    hsize_t start[2], size[2];
    size_t at;
} block;

/* Splits the elements [first, first+count) of a row-major tensor into blocks; returns how many
 * slots (1 for a vector, 3 for a matrix: a partial first row, full rows, a partial last row). Absent
 * blocks keep their slot with size 0, so that every rank makes the same calls. */
static int flat_blocks(int ndim, const hsize_t *dims, hsize_t first, hsize_t count, block b[3]) {
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

static hsize_t block_elems(int ndim, const block *b) { return ndim == 1 ? b->size[0] : b->size[0] * b->size[1]; }

/* Selects block b in the file space and returns a memory space of the same shape (all selected);
 * for an empty block, selects none in both. -1 on failure. */
static hid_t select_block(hid_t file_space, int ndim, const block *b) {
    hsize_t n = block_elems(ndim, b), one[2] = {1, 1};
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

/* ------------------------------------------------------------------------------------------------
 * Writing
 *
 * A save can fail for reasons outside the program (a full disk, a quota, a file system that went
 * away). Such a failure costs that save, never the run, and must never leave one rank waiting in a
 * collective call that another rank skipped. So the calls come in two kinds:
 *   - in-memory calls (dataspaces, property lists, types) fail only on a bug or without memory:
 *     they abort the job with file:line, as every broken invariant does;
 *   - calls that touch the file are checked: a rank records its first failure (the call, the
 *     object, errno right after it, HDF5's innermost message) and goes on. After every call that
 *     creates an object (the file, a group, an attribute, a dataset) and after each tensor's
 *     writes the ranks agree with one all-reduce, because a rank without the object could not make
 *     the collective calls that follow. Once any rank failed, every rank stops writing, closes
 *     what it has open, and gt_state_write returns the failure (the lowest failing rank's message)
 *     on every rank. A failed H5Dwrite leaves the ids valid, so the tensor's remaining writes are
 *     still made by everyone and the agreement comes after them.
 * HDF5's automatic error printing is off while writing; GTRAIN_HDF5_DEBUG=1 prints the error stack
 * of a failure.
 * ---------------------------------------------------------------------------------------------- */

typedef struct writer {
    MPI_Comm comm;
    const char *path;
    int rank;
    hid_t dxpl;            /* collective transfers */
    const gt_ops *ops;
    float *stage;          /* host staging buffer */
    size_t stage_len;
    size_t max_elems;      /* per transfer */
    int debug;             /* GTRAIN_HDF5_DEBUG: print HDF5's error stack at a failure */
    int failed;            /* this rank: a file operation failed (the first one is described below) */
    int abandoned;         /* agreed over the ranks: some rank failed, nobody writes any more */
    int err_no;            /* errno right after the first failure (0: the call set none) */
    char what[480];        /* the first failed call and its object */
    char why[256];         /* HDF5's innermost message for it */
} writer;

/* The innermost message of the HDF5 error stack: the one that says what was wrong. */
static herr_t innermost_error(unsigned n, const H5E_error2_t *e, void *data) {
    if (n == 0 && e->desc) snprintf((char *)data, 256, "%s", e->desc);
    return 0;
}

/* An in-memory HDF5 call failed: a bug or no memory, not a property of the file. */
static void local_failed(const writer *w, const char *what, int line) {
    H5Eprint2(H5E_DEFAULT, stderr);
    fprintf(stderr, "gtrain: rank %d: %s:%d: %s failed while writing %s\n", w->rank, __FILE__, line, what, w->path);
    fflush(stderr);
    if (w->comm == MPI_COMM_NULL) abort(); /* a writer thread (gt_state_write_rank) makes no MPI calls */
    MPI_Abort(w->comm, 1);
}

#define LOCAL(w, call)                                          \
    do {                                                        \
        if ((call) < 0) local_failed((w), #call, __LINE__);     \
    } while (0)

static hid_t local_id(const writer *w, hid_t id, const char *what, int line) {
    if (id < 0) local_failed(w, what, line);
    return id;
}
#define LOCAL_ID(w, call) local_id((w), (call), #call, __LINE__)

/* Records a failed file operation: the first one on this rank is the one reported. */
static void file_failed(writer *w, const char *call, const char *object) {
    int saved_errno = errno;
    if (!w->failed) {
        w->failed = 1;
        w->err_no = saved_errno;
        snprintf(w->what, sizeof w->what, "%s %s", call, object);
        H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, w->why);
        if (w->debug) H5Eprint2(H5E_DEFAULT, stderr);
    }
    H5Eclear2(H5E_DEFAULT);
}

static herr_t file_rc(writer *w, herr_t rc, const char *call, const char *object) {
    gt_watchdog_leave();
    if (rc < 0) file_failed(w, call, object);
    return rc;
}
static hid_t file_id(writer *w, hid_t id, const char *call, const char *object) {
    gt_watchdog_leave();
    if (id < 0) file_failed(w, call, object);
    return id;
}
/* errno is cleared before the call, so that after a failure it holds what this call set. Every file
 * call is made by all ranks in the same order, so each is a watchdog call of the save (watchdog.h):
 * a rank stuck inside the save is told apart from the ranks blocked in the call it has not made. */
#define FILE_RC(w, name, object, call) (gt_watchdog_enter(name, 0), errno = 0, file_rc((w), (call), (name), (object)))
#define FILE_ID(w, name, object, call) (gt_watchdog_enter(name, 0), errno = 0, file_id((w), (call), (name), (object)))

/* Did a file operation fail on any rank? Collective while nothing has failed; once the ranks
 * agreed that something did, every rank returns 1 without communicating. */
static int agree(writer *w) {
    if (w->abandoned) return 1;
    int any = w->failed;
    if (w->comm == MPI_COMM_NULL) { /* one process writing its own file: nothing to agree with */
        w->abandoned = any;
        return any;
    }
    gt_watchdog_enter("save_agree", sizeof any);
    MPI_Allreduce(&w->failed, &any, 1, MPI_INT, MPI_MAX, w->comm);
    gt_watchdog_leave();
    w->abandoned = any;
    return any;
}

static void write_attr(writer *w, hid_t obj, const char *name, hid_t file_type, hid_t mem_type, const void *value) {
    if (w->abandoned) return;
    hid_t space = LOCAL_ID(w, H5Screate(H5S_SCALAR));
    hid_t attr = FILE_ID(w, "H5Acreate2", name, H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT));
    if (!agree(w)) FILE_RC(w, "H5Awrite", name, H5Awrite(attr, mem_type, value));
    if (attr >= 0) FILE_RC(w, "H5Aclose", name, H5Aclose(attr));
    LOCAL(w, H5Sclose(space));
}

static void write_attr_i64(writer *w, hid_t obj, const char *name, int64_t v) {
    write_attr(w, obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}
static void write_attr_u64(writer *w, hid_t obj, const char *name, uint64_t v) {
    write_attr(w, obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v);
}
static void write_attr_f64(writer *w, hid_t obj, const char *name, double v) {
    write_attr(w, obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}
/* Fixed-length strings: variable-length ones live in the global heap, which has no checksum. */
static void write_attr_str(writer *w, hid_t obj, const char *name, const char *s) {
    hid_t type = LOCAL_ID(w, H5Tcopy(H5T_C_S1));
    LOCAL(w, H5Tset_size(type, strlen(s) + 1));
    LOCAL(w, H5Tset_strpad(type, H5T_STR_NULLTERM));
    write_attr(w, obj, name, type, type, s);
    LOCAL(w, H5Tclose(type));
}

/* A group, or -1 (then w->abandoned is set on every rank). Collective. */
static hid_t create_group(writer *w, hid_t parent, const char *name) {
    if (w->abandoned) return -1;
    hid_t group = FILE_ID(w, "H5Gcreate2", name, H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    agree(w);
    return group;
}

static void close_group(writer *w, hid_t group, const char *name) {
    if (group >= 0) FILE_RC(w, "H5Gclose", name, H5Gclose(group));
}

/* A chunked, Fletcher32-checked dataset creation property list for dims. */
static hid_t checked_dcpl(writer *w, int ndim, const hsize_t *dims) {
    hsize_t chunk[2];
    chunk_dims(ndim, dims, chunk);
    hid_t dcpl = LOCAL_ID(w, H5Pcreate(H5P_DATASET_CREATE));
    LOCAL(w, H5Pset_chunk(dcpl, ndim, chunk));
    LOCAL(w, H5Pset_fletcher32(dcpl));
    LOCAL(w, H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER)); /* every element gets written */
    return dcpl;
}

/* /config: one fixed-length string, chunked so that Fletcher32 covers it; rank 0 writes it. */
static void write_config(writer *w, hid_t file, const char *text) {
    if (w->abandoned) return;
    hsize_t one = 1;
    hid_t type = LOCAL_ID(w, H5Tcopy(H5T_C_S1));
    LOCAL(w, H5Tset_size(type, strlen(text) + 1));
    LOCAL(w, H5Tset_strpad(type, H5T_STR_NULLTERM));
    hid_t space = LOCAL_ID(w, H5Screate_simple(1, &one, NULL));
    hid_t dcpl = checked_dcpl(w, 1, &one);
    hid_t mspace = LOCAL_ID(w, H5Screate_simple(1, &one, NULL));
    hid_t dset = FILE_ID(w, "H5Dcreate2", "/config", H5Dcreate2(file, "config", type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    if (!agree(w)) {
        if (w->rank != 0) {
            LOCAL(w, H5Sselect_none(space));
            LOCAL(w, H5Sselect_none(mspace));
        }
        FILE_RC(w, "H5Dwrite", "/config", H5Dwrite(dset, type, mspace, space, w->dxpl, text));
    }
    if (dset >= 0) FILE_RC(w, "H5Dclose", "/config", H5Dclose(dset));
    LOCAL(w, H5Sclose(mspace));
    LOCAL(w, H5Pclose(dcpl));
    LOCAL(w, H5Sclose(space));
    LOCAL(w, H5Tclose(type));
    agree(w);
}

static void test_slow_write(int rank);

/* One tensor of one group. `mine` is the part of the flat vector this rank writes; src (device)
 * holds the flat elements [src_begin, ...). rounds: collective writes, agreed over ranks. */
static void write_tensor(writer *w, hid_t group, const char *group_name, const gt_tensor_info *t,
                         const gt_shard *mine, const float *src, size_t src_begin, int rounds) {
    if (w->abandoned) return;
    char object[320];
    snprintf(object, sizeof object, "%s/%s", group_name, t->name);
    hsize_t dims[2];
    tensor_dims(t, dims);
    hid_t space = LOCAL_ID(w, H5Screate_simple(t->ndim, dims, NULL));
    hid_t dcpl = checked_dcpl(w, t->ndim, dims);
    hid_t dset = FILE_ID(w, "H5Dcreate2", object,
                         H5Dcreate2(group, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    if (!agree(w)) {
        size_t start = 0, count = 0;
        gt_shard_intersect(mine, t->offset, t->numel, &start, &count);
        for (int k = 0; k < rounds; k++) {
            size_t a = (size_t)k * w->max_elems;
            size_t n = a < count ? (count - a < w->max_elems ? count - a : w->max_elems) : 0;
            if (n) w->ops->copy_to_host(w->stage, src + (t->offset + start + a - src_begin), n * sizeof(float));
            block b[3];
            int nb = flat_blocks(t->ndim, dims, start + a, n, b);
            for (int i = 0; i < nb; i++) { /* the same number of calls on every rank, empty or not */
                hid_t mspace = LOCAL_ID(w, select_block(space, t->ndim, &b[i]));
                if (FILE_RC(w, "H5Dwrite", object, (test_slow_write(w->rank), H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, space,
                                                                                  w->dxpl, w->stage + b[i].at))) >= 0)
                    gt_watchdog_progress(block_elems(t->ndim, &b[i]) * sizeof(float)); /* watchdog.h */
                LOCAL(w, H5Sclose(mspace));
            }
        }
    }
    if (dset >= 0) FILE_RC(w, "H5Dclose", object, H5Dclose(dset));
    LOCAL(w, H5Pclose(dcpl));
    LOCAL(w, H5Sclose(space));
    agree(w);
}

/* GTRAIN_TEST_SLOW_SAVE=S (tests only): sleep S seconds in the middle of every save, after /model
 * and before /optim, so that a test can kill the job while the temporary file is half written.
 * GTRAIN_TEST_HANG_IN_SAVE=STEP:RANK: there, in the save of step STEP, rank RANK enters a write that
 * never returns (a dead file server) while the others go on into the save's next collective call;
 * STEP:RANK:stop: it stops there instead (SIGSTOP: a frozen process, all its threads too). */
static void test_slow_save(int rank, int64_t step) {
    const gt_test_hooks *h = gt_test_hooks_get();
    if (h->hang_in_save.step == step && h->hang_in_save.rank == rank) {
        if (h->hang_in_save.stop) raise(SIGSTOP);
        else for (gt_watchdog_enter("hung_write", 0);;) pause();
    }
    double s = h->slow_save_s;
    if (s > 0) {
        struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* GTRAIN_TEST_SLOW_SAVE=S:MS[:RANK] (tests only): besides the pause of S seconds, every tensor write
 * of every save takes MS milliseconds more, inside the write: a slow file system that keeps writing
 * (with RANK: only that rank's writes, one slow node). */
static void test_slow_write(int rank) {
    const gt_test_hooks *h = gt_test_hooks_get();
    double ms = h->slow_write_rank < 0 || h->slow_write_rank == rank ? h->slow_write_ms : 0.0;
    if (ms > 0) {
        struct timespec ts = {(time_t)(ms / 1e3), (long)((ms - 1e3 * (double)(time_t)(ms / 1e3)) * 1e6)};
        nanosleep(&ts, NULL);
    }
}

/* GTRAIN_TEST_SAVE_EIO=R[,R...] (tests only): in every save, the writers of these ranks fail as a
 * disk returning EIO would, at the creation of /optim/exp_avg, so that a test can make several
 * given ranks fail at once. The call then goes on, and the failure is agreed, as a real one is. */
static void test_injected_eio(writer *w) {
    const gt_test_hooks *h = gt_test_hooks_get();
    for (int i = 0; i < h->n_save_eio_ranks; i++) {
        if (h->save_eio_ranks[i] != w->rank) continue;
        errno = EIO;
        file_failed(w, "H5Gcreate2", "/optim/exp_avg (GTRAIN_TEST_SAVE_EIO)");
        return;
    }
}

/* The lineage attributes (gt_state_info.run_id ...): a file of a legacy lineage gets none. */
static void write_lineage(writer *w, hid_t file, const gt_state_info *info, int parents) {
    if (!info->run_id[0]) return;
    write_attr_str(w, file, "run_id", info->run_id);
    write_attr_str(w, file, "branch", info->branch);
    if (parents) write_attr_str(w, file, "branch_parents", info->branch_parents);
}

/* The root attributes, /config, /train and /optim: everything but the tensors. */
static void write_header(writer *w, hid_t file, const char *text, const gt_state_info *info) {
    write_attr_str(w, file, "format", GT_STATE_FORMAT);
    write_attr_i64(w, file, "format_version", GT_STATE_FORMAT_VERSION);
    write_attr_i64(w, file, "step", info->step);
    write_attr_u64(w, file, "tokens_seen", info->tokens_seen);
    write_attr_i64(w, file, "world_size", info->world_size);
    write_attr_str(w, file, "shard", info->shard);
    write_lineage(w, file, info, 1);
    write_config(w, file, text);

    hid_t train = create_group(w, file, "train");
    write_attr_i64(w, train, "step", info->step);
    write_attr_i64(w, train, "adam_step", info->adam_step);
    write_attr_u64(w, train, "data_cursor", info->data_cursor);
    write_attr_u64(w, train, "tokens_seen", info->tokens_seen);
    write_attr_u64(w, train, "seed", info->seed);
    write_attr_u64(w, train, "global_batch", info->global_batch);
    write_attr_i64(w, train, "micro_batch", info->micro_batch);
    write_attr_i64(w, train, "grad_accum", info->grad_accum);
    write_attr_i64(w, train, "seq_len", info->seq_len);
    write_attr_f64(w, train, "lr", info->lr);
    write_attr_i64(w, train, "skipped_steps", info->skipped_steps);
    close_group(w, train, "/train");
    close_group(w, create_group(w, file, "optim"), "/optim");
}

/* Everything inside the open file. Each helper does nothing once the ranks agreed on a failure. */
static void write_contents(writer *w, hid_t file, const gt_optim *opt, const char *text, const gt_state_info *info,
                           const gt_shard *mine, const int *rounds) {
    const gt_layout *layout = gt_model_layout(opt->model);
    write_header(w, file, text, info);
    const float *buffers[3] = {opt->master, opt->exp_avg, opt->exp_avg_sq};
    for (int g = 0; g < 3 && !w->abandoned; g++) {
        if (g == 1) test_slow_save(w->rank, info->step), test_injected_eio(w);
        hid_t group = create_group(w, file, GROUPS[g]);
        for (int i = 0; i < layout->n_tensors; i++)
            write_tensor(w, group, GROUPS[g], &layout->tensors[i], mine, buffers[g], opt->shard.begin, rounds[i]);
        close_group(w, group, GROUPS[g]);
    }
}

/* The message of a failed save: what the OS said when it said anything. A write that ran out of
 * room often says nothing (MPI-IO reports a short write, HDF5 "file write failed", errno stays 0),
 * so when the file's directory has less than ALIGN_BYTES free, that is named as the cause. Else
 * HDF5's reason. */
static void describe_failure(const writer *w, char *err, size_t err_len) {
    const char *why = w->why[0] ? w->why : "an HDF5 call failed";
    if (w->err_no) {
        snprintf(err, err_len, "%s (%s)", strerror(w->err_no), w->what);
        return;
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", w->path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    struct statvfs st;
    if (statvfs(dir, &st) == 0 && (uint64_t)st.f_bavail * st.f_frsize < ALIGN_BYTES)
        snprintf(err, err_len, "%s: %llu bytes free (%s: %s)", strerror(ENOSPC),
                 (unsigned long long)st.f_bavail * st.f_frsize, w->what, why);
    else
        snprintf(err, err_len, "%s (%s)", why, w->what);
}

int gt_state_write(const char *path, MPI_Comm comm, const gt_optim *opt, const char *config_text,
                   const gt_state_info *info, char *err, size_t err_len) {
    writer w = {comm, path, 0, -1, opt->ops, NULL, 0, max_io_elems(), 0, 0, 0, 0, "", ""};
    const char *debug = getenv("GTRAIN_HDF5_DEBUG");
    w.debug = debug && debug[0] && strcmp(debug, "0") != 0;
    int world;
    MPI_Comm_rank(comm, &w.rank);
    MPI_Comm_size(comm, &world);
    const gt_layout *layout = gt_model_layout(opt->model);
    err[0] = '\0';

    /* The part each rank writes: its own slice with ZeRO-1, else the slice it would own. */
    gt_shard mine = opt->shard;
    if (!opt->sharded) gt_shard_init(&mine, layout->n_params, world, w.rank);

    /* Rounds per tensor (the same on all ranks), and the staging buffer for the largest transfer. */
    int *rounds = calloc((size_t)layout->n_tensors, sizeof *rounds);
    if (!rounds) abort();
    size_t largest = 0;
    for (int i = 0; i < layout->n_tensors; i++) {
        size_t start, count;
        gt_shard_intersect(&mine, layout->tensors[i].offset, layout->tensors[i].numel, &start, &count);
        rounds[i] = count ? (int)((count + w.max_elems - 1) / w.max_elems) : 1;
        size_t biggest = count < w.max_elems ? count : w.max_elems;
        if (biggest > largest) largest = biggest;
    }
    MPI_Allreduce(MPI_IN_PLACE, rounds, layout->n_tensors, MPI_INT, MPI_MAX, comm);
    w.stage_len = largest ? largest : 1;
    w.stage = malloc(w.stage_len * sizeof(float));
    if (!w.stage) abort();

    /* The config text must be identical everywhere: its length is part of a collective create. */
    unsigned long long text_len = w.rank == 0 ? strlen(config_text) : 0;
    MPI_Bcast(&text_len, 1, MPI_UNSIGNED_LONG_LONG, 0, comm);
    char *text = malloc(text_len + 1);
    if (!text) abort();
    if (w.rank == 0) memcpy(text, config_text, text_len + 1);
    MPI_Bcast(text, (int)text_len + 1, MPI_CHAR, 0, comm);

    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);

    hid_t fapl = LOCAL_ID(&w, H5Pcreate(H5P_FILE_ACCESS));
    LOCAL(&w, H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
    LOCAL(&w, H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST)); /* checksummed metadata */
    LOCAL(&w, H5Pset_alignment(fapl, ALIGN_THRESHOLD, ALIGN_BYTES));
    LOCAL(&w, H5Pset_all_coll_metadata_ops(fapl, 1));
    LOCAL(&w, H5Pset_coll_metadata_write(fapl, 1));
    w.dxpl = LOCAL_ID(&w, H5Pcreate(H5P_DATASET_XFER));
    LOCAL(&w, H5Pset_dxpl_mpio(w.dxpl, H5FD_MPIO_COLLECTIVE));
    hid_t file = FILE_ID(&w, "H5Fcreate", "", H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
    if (!agree(&w)) write_contents(&w, file, opt, text, info, &mine, rounds);
    if (file >= 0) FILE_RC(&w, "H5Fclose", "", H5Fclose(file)); /* the metadata is written here */
    LOCAL(&w, H5Pclose(w.dxpl));
    LOCAL(&w, H5Pclose(fapl));

    /* one verdict for all ranks, naming every rank that failed, with the lowest one's message */
    char msg[1024] = "";
    if (w.failed) describe_failure(&w, msg, sizeof msg);
    int failed = gt_agree_on_failed_ranks(comm, w.failed, msg, sizeof msg);
    if (failed) snprintf(err, err_len, "%s", msg);
    H5Eclear2(H5E_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    free(text);
    free(w.stage);
    free(rounds);
    return failed ? -1 : 0;
}

/* ------------------------------------------------------------------------------------------------
 * The split layout: one file per rank, tied together by a top file of virtual datasets
 *
 * A rank file holds, for every tensor its slice touches and every group, up to three datasets
 * "<group>/<name>.b0|.b1|.b2": the blocks of flat_blocks (a partial first row, full rows, a partial
 * last row), each in its own shape, chunked and Fletcher32-checked like the single file's tensors.
 * It is written by one thread with serial HDF5 (sec2) and no MPI call, so a rank whose disk fails
 * reports it and no other rank waits for it. The top file has the single file's attributes and
 * /config, and each tensor is a virtual dataset (HDF5 >= 1.10) whose mappings are exactly those
 * blocks, the source and the virtual selection of the same shape, with source file names relative
 * to the top file's directory. Its fill value is NaN: a rank file gone missing reads as NaN in h5py,
 * never as zeros; gtrain's reader checks that every rank file opens before it reads a tensor.
 * ---------------------------------------------------------------------------------------------- */

void gt_state_library_open(void) {
    if (H5open() < 0) abort();
}

static void block_name(char *out, size_t len, const char *tensor, int i) { snprintf(out, len, "%s.b%d", tensor, i); }

/* The part of tensor t in the flat range [begin, begin + count): its first element in the tensor
 * and how many; 0 when they do not meet. */
static size_t tensor_part(const gt_tensor_info *t, uint64_t begin, uint64_t count, size_t *start) {
    uint64_t lo = begin > t->offset ? begin : t->offset;
    uint64_t hi = begin + count < t->offset + t->numel ? begin + count : t->offset + t->numel;
    *start = lo < hi ? (size_t)(lo - t->offset) : 0;
    return lo < hi ? (size_t)(hi - lo) : 0;
}

static hid_t split_fapl(writer *w) {
    hid_t fapl = LOCAL_ID(w, H5Pcreate(H5P_FILE_ACCESS));
    LOCAL(w, H5Pset_fapl_sec2(fapl));
    LOCAL(w, H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST)); /* checksummed metadata */
    LOCAL(w, H5Pset_alignment(fapl, ALIGN_THRESHOLD, ALIGN_BYTES));
#if H5_VERSION_GE(1, 10, 7)
    LOCAL(w, H5Pset_file_locking(fapl, 0, 1)); /* a new file no one else opens; some file systems refuse flock */
#endif
    return fapl;
}

/* A file of the split layout whose writing failed is deleted by the caller, but its H5Fclose must
 * still succeed: HDF5 1.10.8 keeps a file whose close failed in its tables half torn down, and
 * crashes closing it again when MPI_Finalize ends the library (seen on a full tmpfs, and with EIO
 * from a file system that failed). So the file's descriptor (the sec2 driver's) is pointed at an
 * anonymous in-memory file first: the close writes the metadata it holds there and succeeds,
 * whatever the disk does. Where that cannot be done, the file is truncated, which frees the room
 * a full disk needs for the metadata. */
static void detach_failed_file(const writer *w, hid_t file) {
    if (!w->failed || file < 0) return;
    int *fd = NULL, mem = memfd_create("gtrain-failed-save", MFD_CLOEXEC);
    hid_t fapl = H5Fget_access_plist(file);
    int sec2 = fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2;
    if (fapl >= 0) H5Pclose(fapl);
    if (mem >= 0 && sec2 && H5Fget_vfd_handle(file, H5P_DEFAULT, (void **)&fd) >= 0 && fd && dup2(mem, *fd) >= 0) {
        close(mem);
        return;
    }
    if (mem >= 0) close(mem);
    H5Eclear2(H5E_DEFAULT);
    if (truncate(w->path, 0) != 0) { /* nothing more to free */ }
}

/* A file of the split layout (a rank file or the top file) as one process writes it alone: HDF5's
 * own error printing is off until split_close (the writer reports failures itself, in one line), and
 * the file is created with split_fapl's properties. */
typedef struct split_file {
    hid_t fapl, file;
    H5E_auto2_t old_func;
    void *old_data;
} split_file;

static split_file split_create(writer *w, char *err) {
    split_file f;
    const char *debug = getenv("GTRAIN_HDF5_DEBUG");
    w->debug = debug && debug[0] && strcmp(debug, "0") != 0;
    err[0] = '\0';
    H5Eget_auto2(H5E_DEFAULT, &f.old_func, &f.old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    f.fapl = split_fapl(w);
    f.file = FILE_ID(w, "H5Fcreate", "", H5Fcreate(w->path, H5F_ACC_TRUNC, H5P_DEFAULT, f.fapl));
    return f;
}

/* Closes the file (its metadata is written here; a failed file is detached first), restores HDF5's
 * error printing and returns 0, or -1 with the writer's one line in err. */
static int split_close(writer *w, split_file *f, char *err, size_t err_len) {
    detach_failed_file(w, f->file);
    if (f->file >= 0) FILE_RC(w, "H5Fclose", "", H5Fclose(f->file));
    LOCAL(w, H5Pclose(f->fapl));
    if (w->failed) describe_failure(w, err, err_len);
    H5Eclear2(H5E_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, f->old_func, f->old_data);
    return w->failed ? -1 : 0;
}

/* One block of one tensor as a dataset of its own shape, written whole from src. */
static void write_block(writer *w, hid_t group, const char *group_name, const gt_tensor_info *t, int i,
                        const block *b, const float *src) {
    if (w->abandoned) return;
    char name[300], object[400];
    block_name(name, sizeof name, t->name, i);
    snprintf(object, sizeof object, "%s/%s", group_name, name);
    hid_t space = LOCAL_ID(w, H5Screate_simple(t->ndim, b->size, NULL));
    hid_t dcpl = checked_dcpl(w, t->ndim, b->size);
    hid_t dset = FILE_ID(w, "H5Dcreate2", object,
                         H5Dcreate2(group, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    if (dset >= 0 && FILE_RC(w, "H5Dwrite", object, (test_slow_write(w->rank), H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL,
                                                                                 H5S_ALL, H5P_DEFAULT, src))) >= 0)
        gt_watchdog_progress(block_elems(t->ndim, b) * sizeof(float)); /* a background writer's too */
    if (dset >= 0) FILE_RC(w, "H5Dclose", object, H5Dclose(dset));
    LOCAL(w, H5Pclose(dcpl));
    LOCAL(w, H5Sclose(space));
    agree(w);
}

int gt_state_write_rank(const char *path, const gt_layout *layout, uint64_t begin, uint64_t count,
                        const float *const host[3], const gt_state_info *info, int rank, char *err, size_t err_len) {
    writer w = {MPI_COMM_NULL, path, rank, H5P_DEFAULT, NULL, NULL, 0, 0, 0, 0, 0, 0, "", ""};
    split_file f = split_create(&w, err);
    hid_t file = f.file;
    if (!agree(&w)) {
        write_attr_str(&w, file, "format", GT_STATE_FORMAT "-rank");
        write_attr_i64(&w, file, "format_version", GT_STATE_FORMAT_VERSION);
        write_attr_i64(&w, file, "step", info->step);
        write_attr_i64(&w, file, "rank", rank);
        write_attr_i64(&w, file, "world_size", info->world_size);
        write_attr_u64(&w, file, "begin", begin);
        write_attr_u64(&w, file, "count", count);
        write_lineage(&w, file, info, 0);
        close_group(&w, create_group(&w, file, "optim"), "/optim");
    }
    for (int g = 0; g < 3 && !w.abandoned; g++) {
        if (g == 1) test_slow_save(rank, info->step), test_injected_eio(&w);
        hid_t group = create_group(&w, file, GROUPS[g]);
        for (int i = 0; i < layout->n_tensors && !w.abandoned; i++) {
            const gt_tensor_info *t = &layout->tensors[i];
            size_t start, n = tensor_part(t, begin, count, &start);
            if (!n) continue;
            hsize_t dims[2] = {1, 1};
            tensor_dims(t, dims);
            block b[3];
            int nb = flat_blocks(t->ndim, dims, start, n, b);
            const float *src = host[g] + (t->offset + start - begin);
            for (int k = 0; k < nb; k++)
                if (block_elems(t->ndim, &b[k])) write_block(&w, group, GROUPS[g], t, k, &b[k], src + b[k].at);
        }
        close_group(&w, group, GROUPS[g]);
    }
    return split_close(&w, &f, err, err_len);
}

/* One tensor of the top file: a virtual dataset mapping every rank's blocks onto their rank files. */
static void write_virtual(writer *w, hid_t group, const char *group_name, const gt_tensor_info *t,
                          const char *rank_dir, int world, const uint64_t *begins, const uint64_t *counts) {
    if (w->abandoned) return;
    char object[320];
    snprintf(object, sizeof object, "%s/%s", group_name, t->name);
    hsize_t dims[2] = {1, 1};
    tensor_dims(t, dims);
    hid_t space = LOCAL_ID(w, H5Screate_simple(t->ndim, dims, NULL));
    hid_t dcpl = LOCAL_ID(w, H5Pcreate(H5P_DATASET_CREATE));
    float nan = NAN;
    LOCAL(w, H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan));
    for (int r = 0; r < world; r++) {
        size_t start, n = tensor_part(t, begins[r], counts[r], &start);
        if (!n) continue;
        block b[3];
        int nb = flat_blocks(t->ndim, dims, start, n, b);
        char file_name[512], source[400], name[300];
        snprintf(file_name, sizeof file_name, "%s/rank_%05d.h5", rank_dir, r);
        for (int k = 0; k < nb; k++) {
            if (!block_elems(t->ndim, &b[k])) continue;
            block_name(name, sizeof name, t->name, k);
            snprintf(source, sizeof source, "%s/%s", group_name, name);
            hid_t vspace = LOCAL_ID(w, H5Screate_simple(t->ndim, dims, NULL));
            LOCAL(w, H5Sselect_hyperslab(vspace, H5S_SELECT_SET, b[k].start, NULL, b[k].size, NULL));
            hid_t sspace = LOCAL_ID(w, H5Screate_simple(t->ndim, b[k].size, NULL));
            LOCAL(w, H5Pset_virtual(dcpl, vspace, file_name, source, sspace));
            LOCAL(w, H5Sclose(sspace));
            LOCAL(w, H5Sclose(vspace));
        }
    }
    hid_t dset = FILE_ID(w, "H5Dcreate2", object,
                         H5Dcreate2(group, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    if (dset >= 0) FILE_RC(w, "H5Dclose", object, H5Dclose(dset));
    LOCAL(w, H5Pclose(dcpl));
    LOCAL(w, H5Sclose(space));
    agree(w);
}

int gt_state_write_top(const char *path, const char *rank_dir, const gt_layout *layout, int world,
                       const uint64_t *begins, const uint64_t *counts, const char *config_text,
                       const gt_state_info *info, char *err, size_t err_len) {
    writer w = {MPI_COMM_NULL, path, 0, H5P_DEFAULT, NULL, NULL, 0, 0, 0, 0, 0, 0, "", ""};
    split_file f = split_create(&w, err);
    hid_t file = f.file;
    if (!agree(&w)) {
        write_header(&w, file, config_text, info);
        write_attr_str(&w, file, "rank_dir", rank_dir);
        write_attr_i64(&w, file, "rank_files", world);
    }
    for (int g = 0; g < 3 && !w.abandoned; g++) {
        hid_t group = create_group(&w, file, GROUPS[g]);
        for (int i = 0; i < layout->n_tensors; i++)
            write_virtual(&w, group, GROUPS[g], &layout->tensors[i], rank_dir, world, begins, counts);
        close_group(&w, group, GROUPS[g]);
    }
    return split_close(&w, &f, err, err_len);
}

/* ------------------------------------------------------------------------------------------------
 * Reading
 * ---------------------------------------------------------------------------------------------- */

#define RANK_FILES_OPEN 8 /* rank files a reader keeps open: a rank's slice maps onto one or two */

typedef struct reader {
    const char *path;
    hid_t file;
    char *err;
    size_t err_len;
    char why[256];  /* the HDF5 reason of the first failed call, captured before anything clears it */
    /* the split layout (check_rank_files): the rank files' directory, relative to path's, and how
     * many there are; 0 for a single file */
    char rank_dir[512];
    int64_t rank_files;
    int n_open, next_close;          /* the rank files open for reading: index and id */
    int64_t open_k[RANK_FILES_OPEN];
    hid_t open_f[RANK_FILES_OPEN];
} reader;

/* Call right after a failed HDF5 call: any later call clears the error stack. */
static void capture(reader *r) {
    if (!r->why[0]) H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, r->why);
}

/* Records a failure (with the captured HDF5 reason when asked) and returns code. */
static int fail(reader *r, int code, int with_h5_reason, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (with_h5_reason) capture(r);
    H5Eclear2(H5E_DEFAULT);
    if (with_h5_reason && r->why[0]) snprintf(r->err, r->err_len, "%s: %s (%s)", r->path, what, r->why);
    else snprintf(r->err, r->err_len, "%s: %s", r->path, what);
    return code;
}

static int read_attr(reader *r, hid_t obj, const char *obj_name, const char *name, hid_t mem_type, void *value) {
    if (H5Aexists(obj, name) <= 0) return fail(r, GT_STATE_UNREADABLE, 1, "attribute %s%s is missing", obj_name, name);
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    /* one value: H5Aread writes every element, and an array attribute would overrun `value` */
    hid_t space = attr < 0 ? -1 : H5Aget_space(attr);
    hssize_t n = space < 0 ? -1 : H5Sget_simple_extent_npoints(space);
    herr_t rc = n != 1 ? -1 : H5Aread(attr, mem_type, value);
    if (rc < 0) capture(r);
    if (space >= 0) H5Sclose(space);
    if (attr >= 0) H5Aclose(attr);
    if (n >= 0 && n != 1)
        return fail(r, GT_STATE_UNREADABLE, 0, "attribute %s%s holds %lld values (expected one)", obj_name, name,
                    (long long)n);
    if (rc < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot read attribute %s%s", obj_name, name);
    return 0;
}

/* Elements in a dataspace (closed here): a string attribute or /config must hold exactly one, since
 * a read writes every element into a buffer sized for one. */
static hssize_t n_points(hid_t space) {
    hssize_t n = space < 0 ? -1 : H5Sget_simple_extent_npoints(space);
    if (space >= 0) H5Sclose(space);
    return n;
}

static int read_attr_str(reader *r, hid_t obj, const char *obj_name, const char *name, char *out, size_t len) {
    out[0] = '\0';
    if (H5Aexists(obj, name) <= 0) return fail(r, GT_STATE_UNREADABLE, 1, "attribute %s%s is missing", obj_name, name);
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t ftype = attr < 0 ? -1 : H5Aget_type(attr);
    int ok = ftype >= 0 && H5Tget_class(ftype) == H5T_STRING && !H5Tis_variable_str(ftype) &&
             n_points(H5Aget_space(attr)) == 1;
    size_t size = ok ? H5Tget_size(ftype) : 0;
    char *buf = ok ? calloc(size + 1, 1) : NULL;
    hid_t mtype = ok ? H5Tcopy(H5T_C_S1) : -1;
    if (ok) ok = buf && H5Tset_size(mtype, size) >= 0 && H5Aread(attr, mtype, buf) >= 0;
    if (!ok) capture(r);
    if (ok) snprintf(out, len, "%s", buf);
    free(buf);
    if (mtype >= 0) H5Tclose(mtype);
    if (ftype >= 0) H5Tclose(ftype);
    if (attr >= 0) H5Aclose(attr);
    return ok ? 0 : fail(r, GT_STATE_UNREADABLE, 1, "cannot read the string attribute %s%s", obj_name, name);
}

static int read_config_text(reader *r, char **text) {
    *text = NULL;
    hid_t dset = H5Dopen2(r->file, "/config", H5P_DEFAULT);
    if (dset < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open /config");
    hid_t ftype = H5Dget_type(dset);
    int ok = ftype >= 0 && H5Tget_class(ftype) == H5T_STRING && !H5Tis_variable_str(ftype) &&
             n_points(H5Dget_space(dset)) == 1;
    size_t size = ok ? H5Tget_size(ftype) : 0;
    char *buf = ok ? calloc(size + 1, 1) : NULL;
    hid_t mtype = ok ? H5Tcopy(H5T_C_S1) : -1;
    if (ok) ok = buf && H5Tset_size(mtype, size) >= 0 && H5Dread(dset, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0;
    if (!ok) capture(r);
    if (mtype >= 0) H5Tclose(mtype);
    if (ftype >= 0) H5Tclose(ftype);
    H5Dclose(dset);
    if (!ok) {
        free(buf);
        return fail(r, GT_STATE_UNREADABLE, 1, "cannot read /config");
    }
    *text = buf;
    return 0;
}

static void format_shape(char *out, size_t len, int ndim, const hsize_t *dims) {
    if (ndim == 1) snprintf(out, len, "[%llu]", (unsigned long long)dims[0]);
    else if (ndim == 2) snprintf(out, len, "[%llu, %llu]", (unsigned long long)dims[0], (unsigned long long)dims[1]);
    else snprintf(out, len, "(%d dimensions)", ndim);
}

typedef struct extra_search {
    const gt_layout *layout;
    char name[256];
} extra_search;

static herr_t find_extra_tensor(hid_t group, const char *name, const H5L_info_t *info, void *data) {
    extra_search *s = data;
    if (!gt_layout_find(s->layout, name)) {
        snprintf(s->name, sizeof s->name, "%s", name);
        return 1; /* stop */
    }
    return 0;
}

/* Every tensor of the layout is in `group_name` with its shape and fp32, and nothing else is. */
static int check_tensors(reader *r, const gt_layout *layout, const char *group_name) {
    hid_t group = H5Gopen2(r->file, group_name, H5P_DEFAULT);
    if (group < 0) capture(r);
    if (group < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open the group %s", group_name);
    int code = 0;
    for (int i = 0; i < layout->n_tensors && !code; i++) {
        const gt_tensor_info *t = &layout->tensors[i];
        htri_t exists = H5Lexists(group, t->name, H5P_DEFAULT);
        if (exists < 0) {
            capture(r);
            code = fail(r, GT_STATE_UNREADABLE, 1, "cannot look up %s/%s", group_name, t->name);
            break;
        }
        if (!exists) {
            code = fail(r, GT_STATE_INCOMPATIBLE, 0,
                        "tensor %s of the model is not in the file (%s); is it the same model?", t->name, group_name);
            break;
        }
        hid_t dset = H5Dopen2(group, t->name, H5P_DEFAULT);
        hid_t space = dset < 0 ? -1 : H5Dget_space(dset);
        hid_t type = dset < 0 ? -1 : H5Dget_type(dset);
        int ndim = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
        if (dset < 0 || space < 0 || type < 0 || ndim < 0) capture(r);
        hsize_t dims[H5S_MAX_RANK] = {0}, want[2];
        tensor_dims(t, want);
        if (dset < 0 || space < 0 || type < 0 || ndim < 0) {
            code = fail(r, GT_STATE_UNREADABLE, 1, "cannot open %s/%s", group_name, t->name);
        } else {
            H5Sget_simple_extent_dims(space, dims, NULL);
            int same = ndim == t->ndim;
            for (int d = 0; same && d < ndim; d++) same = dims[d] == want[d];
            if (!same) {
                char have_s[64], want_s[64];
                format_shape(have_s, sizeof have_s, ndim, dims);
                format_shape(want_s, sizeof want_s, t->ndim, want);
                code = fail(r, GT_STATE_INCOMPATIBLE, 0, "tensor %s: shape %s in the file, %s in the model", t->name,
                            have_s, want_s);
            } else if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) != 4) {
                code = fail(r, GT_STATE_INCOMPATIBLE, 0, "%s/%s is not fp32", group_name, t->name);
            }
        }
        if (type >= 0) H5Tclose(type);
        if (space >= 0) H5Sclose(space);
        if (dset >= 0) H5Dclose(dset);
    }
    if (!code) {
        H5G_info_t ginfo;
        if (H5Gget_info(group, &ginfo) < 0) {
            capture(r);
            code = fail(r, GT_STATE_UNREADABLE, 1, "cannot list %s", group_name);
        } else if (ginfo.nlinks != (hsize_t)layout->n_tensors) {
            extra_search s = {layout, ""};
            H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, NULL, find_extra_tensor, &s);
            code = fail(r, GT_STATE_INCOMPATIBLE, 0, "tensor %s is in the file (%s) but not in the model", s.name,
                        group_name);
        }
    }
    H5Gclose(group);
    return code;
}

/* The path of rank file k of the split layout: rank_dir is relative to the top file's directory. */
static void rank_file_path(const reader *r, int64_t k, char *out, size_t len) {
    const char *slash = strrchr(r->path, '/');
    int dir_len = slash ? (int)(slash - r->path) : 1;
    const char *dir = slash ? r->path : ".";
    snprintf(out, len, "%.*s/%s/rank_%05lld.h5", dir_len, dir, r->rank_dir, (long long)k);
}

/* Opens a rank file read-only (sec2, no locking); -1 with the failure recorded. */
static hid_t open_rank_file(reader *r, const char *path) {
    FILE *probe = fopen(path, "rb");
    if (!probe) return fail(r, GT_STATE_UNREADABLE, 0, "its rank file %s: %s", path, strerror(errno)), -1;
    fclose(probe);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_sec2(fapl);
#if H5_VERSION_GE(1, 10, 7)
    H5Pset_file_locking(fapl, 0, 1);
#endif
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (f < 0) fail(r, GT_STATE_UNREADABLE, 1, "its rank file %s does not open as HDF5", path);
    return f;
}

/* Rank file k, opened on first use and kept open with a few others (the oldest is closed to make
 * room); -1 with the failure recorded. */
static hid_t rank_file(reader *r, int64_t k) {
    for (int i = 0; i < r->n_open; i++)
        if (r->open_k[i] == k) return r->open_f[i];
    char path[4096];
    rank_file_path(r, k, path, sizeof path);
    hid_t f = open_rank_file(r, path);
    if (f < 0) return -1;
    int slot;
    if (r->n_open < RANK_FILES_OPEN) {
        slot = r->n_open++;
    } else {
        slot = r->next_close;
        r->next_close = (slot + 1) % RANK_FILES_OPEN;
        H5Fclose(r->open_f[slot]);
    }
    r->open_k[slot] = k;
    r->open_f[slot] = f;
    return f;
}

static void close_rank_files(reader *r) {
    for (int i = 0; i < r->n_open; i++) H5Fclose(r->open_f[i]);
    r->n_open = 0;
}

/* ---------------------------------------------------------------- reading a block of a tensor
 *
 * A tensor of the top file of the split layout is a virtual dataset, and HDF5 reads a part of one
 * whose source it cannot open (a rank file that lost the dataset, a damaged object header, an EIO
 * on open) as the fill value, without an error. So gtrain never reads through it: it reads the
 * virtual dataset's mappings, checks that each is one block of the tensor filled whole from a
 * dataset of that shape in one of the rank files the top file names, and reads each part of a block
 * from its source dataset itself, where every such failure is an error; the mappings must cover
 * the block exactly. Every value read (either layout) must be finite: a state file never holds a
 * NaN or an infinity (train.nonfinite stops or skips before a save). */

typedef struct mapping {
    hsize_t start[2], size[2]; /* the block of the tensor it fills */
    int64_t k;                 /* from rank file k */
    char source[320];          /* its dataset there */
} mapping;

static int mapping_failed(reader *r, hid_t dcpl, const char *object, size_t i, const char *what) {
    capture(r);
    if (dcpl >= 0) H5Pclose(dcpl);
    return fail(r, GT_STATE_UNREADABLE, 1, "%s: mapping %zu of its virtual dataset %s", object, i, what);
}

/* The mappings of tensor dataset dset (object: its name, for messages) into *maps (malloc'd, *n of
 * them); *n = 0 when it is an ordinary dataset, read directly. */
static int virtual_mappings(reader *r, hid_t dset, const char *object, int ndim, mapping **maps, size_t *n) {
    *maps = NULL;
    *n = 0;
    hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) return mapping_failed(r, dcpl, object, 0, "cannot be read");
    H5D_layout_t layout = H5Pget_layout(dcpl);
    if (layout != H5D_VIRTUAL) {
        H5Pclose(dcpl);
        return layout < 0 ? fail(r, GT_STATE_UNREADABLE, 1, "%s: its layout cannot be read", object) : 0;
    }
    if (!r->rank_files) {
        H5Pclose(dcpl);
        return fail(r, GT_STATE_UNREADABLE, 0, "%s is a virtual dataset in a file without rank files", object);
    }
    size_t count = 0;
    if (H5Pget_virtual_count(dcpl, &count) < 0 || count == 0) return mapping_failed(r, dcpl, object, 0, "is missing");
    mapping *m = calloc(count, sizeof *m);
    if (!m) abort();
    for (size_t i = 0; i < count; i++) {
        hid_t vspace = H5Pget_virtual_vspace(dcpl, i), sspace = H5Pget_virtual_srcspace(dcpl, i);
        hsize_t lo[H5S_MAX_RANK], hi[H5S_MAX_RANK];
        int ok = vspace >= 0 && sspace >= 0 && H5Sget_select_bounds(vspace, lo, hi) >= 0 &&
                 H5Sget_simple_extent_ndims(vspace) == ndim;
        hssize_t elems = 1;
        for (int d = 0; ok && d < ndim; d++) {
            m[i].start[d] = lo[d];
            m[i].size[d] = hi[d] - lo[d] + 1;
            elems *= (hssize_t)m[i].size[d];
        }
        /* its selection is all of its bounding box (one block), filled from all of the source (whose
         * shape read_block checks: the property list does not hold it) */
        ok = ok && H5Sget_select_npoints(vspace) == elems && H5Sget_select_type(sspace) == H5S_SEL_ALL;
        if (vspace >= 0) H5Sclose(vspace);
        if (sspace >= 0) H5Sclose(sspace);
        char file_name[600] = "", expect[600], tail;
        long long k = -1;
        ssize_t name_len = ok ? H5Pget_virtual_filename(dcpl, i, file_name, sizeof file_name) : -1;
        size_t dir_len = strlen(r->rank_dir);
        ok = name_len > 0 && (size_t)name_len < sizeof file_name && strncmp(file_name, r->rank_dir, dir_len) == 0 &&
             sscanf(file_name + dir_len, "/rank_%lld.h5%c", &k, &tail) == 1 && k >= 0 && k < r->rank_files;
        if (ok) snprintf(expect, sizeof expect, "%s/rank_%05lld.h5", r->rank_dir, k);
        ok = ok && strcmp(expect, file_name) == 0; /* one of the rank files the top file names */
        ssize_t src_len = ok ? H5Pget_virtual_dsetname(dcpl, i, m[i].source, sizeof m[i].source) : -1;
        if (!ok || src_len <= 0 || (size_t)src_len >= sizeof m[i].source) {
            free(m);
            return mapping_failed(r, dcpl, object, i, "is not one block of the tensor from one of its rank files");
        }
        m[i].k = k;
    }
    H5Pclose(dcpl);
    *maps = m;
    *n = count;
    return 0;
}

/* Where block b of tensor `object` holds a value that is not finite, if anywhere: its index (in
 * the block), else -1. */
static long long first_nonfinite(const float *x, hsize_t n) {
    for (hsize_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return (long long)i;
    return -1;
}

/* Block b (ndim 1 or 2) of the tensor whose dataset is dset into dst (the block's own shape): read
 * directly (n_maps == 0), or part by part from the sources of the mappings it meets. Then every
 * value must be finite. */
static int read_block(reader *r, hid_t dset, hid_t space, const char *object, int ndim, const mapping *maps,
                      size_t n_maps, const block *b, float *dst) {
    hsize_t elems = block_elems(ndim, b);
    if (!n_maps) {
        hid_t mspace = select_block(space, ndim, b);
        herr_t rc = mspace < 0 ? -1 : H5Dread(dset, H5T_NATIVE_FLOAT, mspace, space, H5P_DEFAULT, dst);
        if (rc < 0) capture(r);
        if (mspace >= 0) H5Sclose(mspace);
        if (rc < 0) return fail(r, GT_STATE_UNREADABLE, 1, "reading %s failed", object);
    }
    hsize_t covered = 0;
    for (size_t i = 0; i < n_maps; i++) {
        const mapping *m = &maps[i];
        hsize_t cnt[2], at_src[2], at_mem[2], part = 1;
        for (int d = 0; d < ndim; d++) {
            hsize_t a = b->start[d] > m->start[d] ? b->start[d] : m->start[d];
            hsize_t e_b = b->start[d] + b->size[d], e_m = m->start[d] + m->size[d];
            hsize_t z = e_b < e_m ? e_b : e_m;
            cnt[d] = z > a ? z - a : 0;
            at_src[d] = a - m->start[d];
            at_mem[d] = a - b->start[d];
            part *= cnt[d];
        }
        if (!part) continue;
        char path[4096];
        rank_file_path(r, m->k, path, sizeof path);
        hid_t f = rank_file(r, m->k);
        if (f < 0) return GT_STATE_UNREADABLE;
        htri_t there = H5Lexists(f, m->source, H5P_DEFAULT);
        if (there == 0)
            return fail(r, GT_STATE_UNREADABLE, 0, "%s: its part %s is not in its rank file %s", object, m->source, path);
        hid_t src = there < 0 ? -1 : H5Dopen2(f, m->source, H5P_DEFAULT);
        hid_t sspace = src < 0 ? -1 : H5Dget_space(src);
        hid_t type = src < 0 ? -1 : H5Dget_type(src);
        hsize_t sdims[H5S_MAX_RANK] = {0};
        int ok = sspace >= 0 && type >= 0 && H5Sget_simple_extent_ndims(sspace) == ndim &&
                 H5Sget_simple_extent_dims(sspace, sdims, NULL) >= 0;
        if (!ok) capture(r);
        for (int d = 0; ok && d < ndim; d++) ok = sdims[d] == m->size[d];
        int fp32 = ok && H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 4;
        hid_t mspace = fp32 ? H5Screate_simple(ndim, b->size, NULL) : -1;
        herr_t rc = mspace < 0 || H5Sselect_hyperslab(sspace, H5S_SELECT_SET, at_src, NULL, cnt, NULL) < 0 ||
                            H5Sselect_hyperslab(mspace, H5S_SELECT_SET, at_mem, NULL, cnt, NULL) < 0
                        ? -1
                        : H5Dread(src, H5T_NATIVE_FLOAT, mspace, sspace, H5P_DEFAULT, dst);
        if (fp32 && rc < 0) capture(r);
        if (mspace >= 0) H5Sclose(mspace);
        if (type >= 0) H5Tclose(type);
        if (sspace >= 0) H5Sclose(sspace);
        if (src >= 0) H5Dclose(src);
        if (src < 0 || !ok)
            return fail(r, GT_STATE_UNREADABLE, 1, "%s: cannot open its part %s in its rank file %s", object, m->source,
                        path);
        if (!fp32)
            return fail(r, GT_STATE_UNREADABLE, 0, "%s: its part %s in its rank file %s is not fp32 of the block's "
                        "shape", object, m->source, path);
        if (rc < 0)
            return fail(r, GT_STATE_UNREADABLE, 1, "%s: reading its part %s in its rank file %s failed", object,
                        m->source, path);
        covered += part;
    }
    if (n_maps && covered != elems)
        return fail(r, GT_STATE_UNREADABLE, 0, "%s: its virtual dataset maps %llu of the %llu values read onto its "
                    "rank files", object, (unsigned long long)covered, (unsigned long long)elems);
    long long bad = first_nonfinite(dst, elems);
    if (bad >= 0) {
        hsize_t at[2] = {b->start[0], b->start[1]};
        if (ndim == 2) at[0] += (hsize_t)bad / b->size[1], at[1] += (hsize_t)bad % b->size[1];
        else at[0] += (hsize_t)bad;
        char where[4500] = "";
        for (size_t i = 0; i < n_maps; i++) {
            const mapping *m = &maps[i];
            int in = 1;
            for (int d = 0; d < ndim; d++) in &= at[d] >= m->start[d] && at[d] < m->start[d] + m->size[d];
            if (!in) continue;
            char path[4096];
            rank_file_path(r, m->k, path, sizeof path);
            snprintf(where, sizeof where, " (from %s in its rank file %s)", m->source, path);
            break;
        }
        char idx[64];
        if (ndim == 2) snprintf(idx, sizeof idx, "[%llu, %llu]", (unsigned long long)at[0], (unsigned long long)at[1]);
        else snprintf(idx, sizeof idx, "[%llu]", (unsigned long long)at[0]);
        return fail(r, GT_STATE_UNREADABLE, 0, "%s%s = %g is not finite%s", object, idx, (double)dst[bad], where);
    }
    return 0;
}

/* Reads this rank's slice of every tensor of one group into dst (device, slice-relative). */
static int read_group(reader *r, const gt_optim *opt, const char *group_name, float *dst, float *stage,
                      size_t max_elems) {
    const gt_layout *layout = gt_model_layout(opt->model);
    hid_t group = H5Gopen2(r->file, group_name, H5P_DEFAULT);
    if (group < 0) capture(r);
    if (group < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open the group %s", group_name);
    int code = 0;
    for (size_t p = 0; p < opt->n_pieces && !code; p++) {
        const gt_shard_piece *pc = &opt->pieces[p];
        const gt_tensor_info *t = &layout->tensors[pc->tensor];
        char object[320];
        snprintf(object, sizeof object, "%s/%s", group_name, t->name);
        hsize_t dims[2] = {0, 0};
        tensor_dims(t, dims);
        hid_t dset = H5Dopen2(group, t->name, H5P_DEFAULT);
        hid_t space = dset < 0 ? -1 : H5Dget_space(dset);
        if (space < 0) capture(r);
        if (space < 0) code = fail(r, GT_STATE_UNREADABLE, 1, "cannot open %s", object);
        mapping *maps = NULL;
        size_t n_maps = 0;
        if (!code) code = virtual_mappings(r, dset, object, t->ndim, &maps, &n_maps);
        for (size_t a = 0; !code && a < pc->count; a += max_elems) {
            hsize_t n = pc->count - a < max_elems ? pc->count - a : max_elems;
            block b[3];
            int nb = flat_blocks(t->ndim, dims, pc->start_in_tensor + a, n, b);
            for (int i = 0; i < nb && !code; i++)
                if (block_elems(t->ndim, &b[i]))
                    code = read_block(r, dset, space, object, t->ndim, maps, n_maps, &b[i], stage + b[i].at);
            if (!code) opt->ops->copy_to_device(dst + pc->start_in_slice + a, stage, n * sizeof(float));
        }
        free(maps);
        if (space >= 0) H5Sclose(space);
        if (dset >= 0) H5Dclose(dset);
    }
    H5Gclose(group);
    return code;
}

/* A top file of the split layout: every rank file it maps onto must be there, open as HDF5 and be
 * a rank file of the same step. (Every tensor read from it is then read from its rank file itself,
 * read_block, never through the virtual dataset, which would fill what it cannot read.) */
static int check_rank_files(reader *r, int64_t step) {
    int64_t n = 0;
    int code = read_attr_str(r, r->file, "/", "rank_dir", r->rank_dir, sizeof r->rank_dir);
    if (!code) code = read_attr(r, r->file, "/", "rank_files", H5T_NATIVE_INT64, &n);
    if (!code && n < 1) code = fail(r, GT_STATE_UNREADABLE, 0, "attribute /rank_files is %lld", (long long)n);
    if (code) return code;
    r->rank_files = n;
    for (int64_t k = 0; k < n && !code; k++) {
        char path[4096], format[64];
        rank_file_path(r, k, path, sizeof path);
        hid_t f = open_rank_file(r, path);
        if (f < 0) return GT_STATE_UNREADABLE;
        int64_t its_step = -1;
        code = read_attr_str(r, f, "/", "format", format, sizeof format);
        if (!code && strcmp(format, GT_STATE_FORMAT "-rank") != 0)
            code = fail(r, GT_STATE_UNREADABLE, 0, "%s is not a gtrain rank file (format '%s')", path, format);
        if (!code) code = read_attr(r, f, "/", "step", H5T_NATIVE_INT64, &its_step);
        if (!code && its_step != step)
            code = fail(r, GT_STATE_UNREADABLE, 0, "its rank file %s holds step %lld, not %lld", path,
                        (long long)its_step, (long long)step);
        H5Fclose(f);
    }
    return code;
}

/* Opens r->path read-only and checks the format attributes; the root's `step` and `world_size` are
 * returned for read_all. */
static int open_checked(reader *r, int64_t *step, int64_t *world) {
    FILE *probe = fopen(r->path, "rb");
    if (!probe) return fail(r, GT_STATE_UNREADABLE, 0, "cannot read: %s", strerror(errno));
    fclose(probe);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_sec2(fapl);
#if H5_VERSION_GE(1, 10, 7)
    H5Pset_file_locking(fapl, 0, 1); /* read-only; some parallel file systems refuse flock */
#endif
    r->file = H5Fopen(r->path, H5F_ACC_RDONLY, fapl);
    if (r->file < 0) capture(r);
    H5Pclose(fapl);
    if (r->file < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open as HDF5");

    char format[64];
    int64_t version = 0;
    int code = read_attr_str(r, r->file, "/", "format", format, sizeof format);
    if (!code && strcmp(format, GT_STATE_FORMAT) != 0)
        code = fail(r, GT_STATE_UNREADABLE, 0, "format is '%s', not '%s'", format, GT_STATE_FORMAT);
    if (!code) code = read_attr(r, r->file, "/", "format_version", H5T_NATIVE_INT64, &version);
    if (!code && version != GT_STATE_FORMAT_VERSION)
        code = fail(r, GT_STATE_INCOMPATIBLE, 0, "format_version %lld; this gtrain reads version %d",
                    (long long)version, GT_STATE_FORMAT_VERSION);
    if (!code) code = read_attr(r, r->file, "/", "step", H5T_NATIVE_INT64, step);
    if (!code) code = read_attr(r, r->file, "/", "world_size", H5T_NATIVE_INT64, world);
    if (!code && H5Aexists(r->file, "rank_dir") > 0) code = check_rank_files(r, *step);
    return code;
}

/* The root and /train attributes: everything in gt_state_info. */
static int read_info(reader *r, gt_state_info *info) {
    memset(info, 0, sizeof *info);
    int64_t step = 0, world = 0;
    int code = open_checked(r, &step, &world);
    if (!code) code = read_attr(r, r->file, "/", "tokens_seen", H5T_NATIVE_UINT64, &info->tokens_seen);
    if (!code) code = read_attr_str(r, r->file, "/", "shard", info->shard, sizeof info->shard);
    /* the lineage: added after format_version 1 was first written, all "" when absent (a legacy file) */
    if (!code && H5Aexists(r->file, "run_id") > 0) {
        code = read_attr_str(r, r->file, "/", "run_id", info->run_id, sizeof info->run_id);
        if (!code) code = read_attr_str(r, r->file, "/", "branch", info->branch, sizeof info->branch);
        if (!code) code = read_attr_str(r, r->file, "/", "branch_parents", info->branch_parents,
                                        sizeof info->branch_parents);
    }
    if (!code) {
        info->step = step;
        info->world_size = (int)world;
        hid_t train = H5Gopen2(r->file, "/train", H5P_DEFAULT);
        if (train < 0) capture(r);
        if (train < 0) return fail(r, GT_STATE_UNREADABLE, 1, "cannot open the group /train");
        int64_t mb = 0, ga = 0, sl = 0;
        code = read_attr(r, train, "/train/", "adam_step", H5T_NATIVE_INT64, &info->adam_step);
        if (!code) code = read_attr(r, train, "/train/", "data_cursor", H5T_NATIVE_UINT64, &info->data_cursor);
        if (!code) code = read_attr(r, train, "/train/", "seed", H5T_NATIVE_UINT64, &info->seed);
        if (!code) code = read_attr(r, train, "/train/", "global_batch", H5T_NATIVE_UINT64, &info->global_batch);
        if (!code) code = read_attr(r, train, "/train/", "micro_batch", H5T_NATIVE_INT64, &mb);
        if (!code) code = read_attr(r, train, "/train/", "grad_accum", H5T_NATIVE_INT64, &ga);
        if (!code) code = read_attr(r, train, "/train/", "seq_len", H5T_NATIVE_INT64, &sl);
        if (!code) code = read_attr(r, train, "/train/", "lr", H5T_NATIVE_DOUBLE, &info->lr);
        /* added after format_version 1 was first written: optional, 0 when absent */
        if (!code && H5Aexists(train, "skipped_steps") > 0)
            code = read_attr(r, train, "/train/", "skipped_steps", H5T_NATIVE_INT64, &info->skipped_steps);
        info->micro_batch = (int)mb;
        info->grad_accum = (int)ga;
        info->seq_len = (int)sl;
        H5Gclose(train);
    }
    return code;
}

static int read_all(reader *r, gt_optim *opt, gt_state_info *info, char **config_text) {
    int code = read_info(r, info);
    if (!code) code = read_config_text(r, config_text);

    const gt_layout *layout = gt_model_layout(opt->model);
    for (int g = 0; g < 3 && !code; g++) code = check_tensors(r, layout, GROUPS[g]);
    if (code) return code;

    size_t max_elems = max_io_elems(), largest = 1;
    for (size_t p = 0; p < opt->n_pieces; p++)
        if (opt->pieces[p].count > largest) largest = opt->pieces[p].count;
    float *stage = malloc((largest < max_elems ? largest : max_elems) * sizeof(float));
    if (!stage) abort();
    float *buffers[3] = {opt->master, opt->exp_avg, opt->exp_avg_sq};
    for (int g = 0; g < 3 && !code; g++) code = read_group(r, opt, GROUPS[g], buffers[g], stage, max_elems);
    free(stage);
    return code;
}

/* /model/<name> of every tensor of the layout, whole, into params at the tensor's flat offset. */
static int read_model_whole(reader *r, const gt_layout *layout, float *params) {
    int code = check_tensors(r, layout, "/model");
    for (int i = 0; i < layout->n_tensors && !code; i++) {
        const gt_tensor_info *t = &layout->tensors[i];
        char name[300];
        snprintf(name, sizeof name, "/model/%s", t->name);
        hsize_t dims[2] = {1, 1};
        tensor_dims(t, dims);
        hid_t dset = H5Dopen2(r->file, name, H5P_DEFAULT);
        hid_t space = dset < 0 ? -1 : H5Dget_space(dset);
        if (space < 0) capture(r);
        if (space < 0) code = fail(r, GT_STATE_UNREADABLE, 1, "cannot open %s", name);
        mapping *maps = NULL;
        size_t n_maps = 0;
        if (!code) code = virtual_mappings(r, dset, name, t->ndim, &maps, &n_maps);
        /* whole: the blocks of the flat range [0, numel) */
        block b[3];
        int nb = flat_blocks(t->ndim, dims, 0, t->numel, b);
        for (int k = 0; k < nb && !code; k++)
            if (block_elems(t->ndim, &b[k]))
                code = read_block(r, dset, space, name, t->ndim, maps, n_maps, &b[k], params + t->offset + b[k].at);
        free(maps);
        if (space >= 0) H5Sclose(space);
        if (dset >= 0) H5Dclose(dset);
    }
    return code;
}

/* What the readers share: failures are expected here (a corrupt file is a case, not a bug), so
 * they are reported as one line instead of HDF5's error stack. Reads the config when config_text
 * is given, the optimizer's slice when opt is, and the whole /model when layout is. */
static int read_file(const char *path, gt_optim *opt, gt_state_info *info, const gt_layout *layout, float *params,
                     char **config_text, char *err, size_t err_len) {
    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    reader r = {.path = path, .file = -1, .err = err, .err_len = err_len};
    err[0] = '\0';
    if (config_text) *config_text = NULL;
    int code;
    if (opt) {
        code = read_all(&r, opt, info, config_text);
    } else if (info) {
        code = read_info(&r, info);
    } else {
        int64_t step = 0, world = 0;
        code = open_checked(&r, &step, &world);
        if (!code && config_text) code = read_config_text(&r, config_text);
        if (!code && layout) code = read_model_whole(&r, layout, params);
    }
    close_rank_files(&r);
    if (r.file >= 0 && H5Fclose(r.file) < 0 && !code) code = fail(&r, GT_STATE_UNREADABLE, 1, "closing failed");
    if (code && config_text) {
        free(*config_text);
        *config_text = NULL;
    }
    H5Eclear2(H5E_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    return code;
}

int gt_state_read(const char *path, gt_optim *opt, gt_state_info *info, char **config_text, char *err,
                  size_t err_len) {
    return read_file(path, opt, info, NULL, NULL, config_text, err, err_len);
}

int gt_state_read_config(const char *path, char **config_text, char *err, size_t err_len) {
    return read_file(path, NULL, NULL, NULL, NULL, config_text, err, err_len);
}

int gt_state_read_info(const char *path, gt_state_info *info, char *err, size_t err_len) {
    return read_file(path, NULL, info, NULL, NULL, NULL, err, err_len);
}

int gt_state_read_lineage(const char *path, gt_state_info *info) {
    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    char err[1024], format[64];
    reader r = {.path = path, .file = -1, .err = err, .err_len = sizeof err};
    memset(info, 0, sizeof *info);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_sec2(fapl);
#if H5_VERSION_GE(1, 10, 7)
    H5Pset_file_locking(fapl, 0, 1);
#endif
    r.file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    int code = GT_STATE_UNREADABLE;
    if (r.file >= 0) {
        code = read_attr_str(&r, r.file, "/", "format", format, sizeof format);
        if (!code && strcmp(format, GT_STATE_FORMAT) != 0) code = GT_STATE_UNREADABLE;
        if (!code) code = read_attr(&r, r.file, "/", "step", H5T_NATIVE_INT64, &info->step);
        if (!code && H5Aexists(r.file, "run_id") > 0) {
            code = read_attr_str(&r, r.file, "/", "run_id", info->run_id, sizeof info->run_id);
            if (!code) code = read_attr_str(&r, r.file, "/", "branch", info->branch, sizeof info->branch);
            if (!code) code = read_attr_str(&r, r.file, "/", "branch_parents", info->branch_parents,
                                            sizeof info->branch_parents);
        }
        H5Fclose(r.file);
    }
    H5Eclear2(H5E_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    return code ? GT_STATE_UNREADABLE : GT_STATE_OK;
}

int gt_state_rank_dir(const char *path, char *rank_dir, size_t len) {
    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    char err[1024];
    reader r = {.path = path, .file = -1, .err = err, .err_len = sizeof err};
    rank_dir[0] = '\0';
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_sec2(fapl);
#if H5_VERSION_GE(1, 10, 7)
    H5Pset_file_locking(fapl, 0, 1);
#endif
    r.file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    int rc = -1;
    if (r.file >= 0) {
        htri_t has = H5Aexists(r.file, "rank_dir");
        if (has == 0) rc = 0;
        else if (has > 0 && read_attr_str(&r, r.file, "/", "rank_dir", rank_dir, len) == 0) rc = 1;
        H5Fclose(r.file);
    }
    H5Eclear2(H5E_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    return rc;
}

int gt_state_read_model(const char *path, const gt_layout *layout, float *params, char *err, size_t err_len) {
    return read_file(path, NULL, NULL, layout, params, NULL, err, err_len);
}
