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
 *   - objects of 1 MiB or more start on 1 MiB boundaries (H5Pset_alignment), which parallel file
 *     systems stripe on.
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
#define _POSIX_C_SOURCE 200809L

#include "state.h"

#include <errno.h>
#include <hdf5.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "shard.h"

#define MAX_IO_BYTES_DEFAULT ((size_t)1 << 30) /* per rank per transfer */
#define CHUNK_BYTES ((size_t)4 << 20)         /* per chunk with its checksum: one Fletcher32 sum each */
#define ALIGN_BYTES ((hsize_t)1 << 20)      /* file-system stripe friendly */
#define ALIGN_THRESHOLD ((hsize_t)64 << 10) /* objects of this size or more are aligned */

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

/* Chunks of whole rows. Each chunk carries a 4-byte Fletcher32 sum and, being over the alignment
 * threshold, starts on an ALIGN_BYTES boundary, so it occupies whole slots of ALIGN_BYTES; and a
 * tensor's last chunk is stored full size. Among chunks of up to CHUNK_BYTES that fill 1, 2, 3 or
 * 4 slots exactly (less the checksum), pick the one that wastes the least file space (ties: the
 * larger chunk): a [2048, 2048] tensor (16 MiB) takes 17 MiB, not 20. */
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
} writer;

static void write_failed(const writer *w, const char *what, const char *file, int line) {
    H5Eprint2(H5E_DEFAULT, stderr);
    fprintf(stderr, "gtrain: rank %d: %s:%d: %s failed while writing %s\n", w->rank, file, line, what, w->path);
    fflush(stderr);
    MPI_Abort(w->comm, 1);
}

#define WCHECK(w, call)                                                   \
    do {                                                                  \
        if ((call) < 0) write_failed((w), #call, __FILE__, __LINE__);     \
    } while (0)

static hid_t wcheck_id(const writer *w, hid_t id, const char *what, int line) {
    if (id < 0) write_failed(w, what, __FILE__, line);
    return id;
}
#define WID(w, call) wcheck_id((w), (call), #call, __LINE__)

static void write_attr(writer *w, hid_t obj, const char *name, hid_t file_type, hid_t mem_type, const void *value) {
    hid_t space = WID(w, H5Screate(H5S_SCALAR));
    hid_t attr = WID(w, H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT));
    WCHECK(w, H5Awrite(attr, mem_type, value));
    WCHECK(w, H5Aclose(attr));
    WCHECK(w, H5Sclose(space));
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
    hid_t type = WID(w, H5Tcopy(H5T_C_S1));
    WCHECK(w, H5Tset_size(type, strlen(s) + 1));
    WCHECK(w, H5Tset_strpad(type, H5T_STR_NULLTERM));
    write_attr(w, obj, name, type, type, s);
    WCHECK(w, H5Tclose(type));
}

/* A chunked, Fletcher32-checked dataset creation property list for dims. */
static hid_t checked_dcpl(writer *w, int ndim, const hsize_t *dims) {
    hsize_t chunk[2];
    chunk_dims(ndim, dims, chunk);
    hid_t dcpl = WID(w, H5Pcreate(H5P_DATASET_CREATE));
    WCHECK(w, H5Pset_chunk(dcpl, ndim, chunk));
    WCHECK(w, H5Pset_fletcher32(dcpl));
    WCHECK(w, H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER)); /* every element gets written */
    return dcpl;
}

/* /config: one fixed-length string, chunked so that Fletcher32 covers it; rank 0 writes it. */
static void write_config(writer *w, hid_t file, const char *text) {
    hsize_t one = 1;
    hid_t type = WID(w, H5Tcopy(H5T_C_S1));
    WCHECK(w, H5Tset_size(type, strlen(text) + 1));
    WCHECK(w, H5Tset_strpad(type, H5T_STR_NULLTERM));
    hid_t space = WID(w, H5Screate_simple(1, &one, NULL));
    hid_t dcpl = checked_dcpl(w, 1, &one);
    hid_t dset = WID(w, H5Dcreate2(file, "config", type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    hid_t mspace = WID(w, H5Screate_simple(1, &one, NULL));
    if (w->rank != 0) {
        WCHECK(w, H5Sselect_none(space));
        WCHECK(w, H5Sselect_none(mspace));
    }
    WCHECK(w, H5Dwrite(dset, type, mspace, space, w->dxpl, text));
    WCHECK(w, H5Sclose(mspace));
    WCHECK(w, H5Dclose(dset));
    WCHECK(w, H5Pclose(dcpl));
    WCHECK(w, H5Sclose(space));
    WCHECK(w, H5Tclose(type));
}

/* One tensor of one group. `mine` is the part of the flat vector this rank writes; src (device)
 * holds the flat elements [src_begin, ...). rounds: collective writes, agreed over ranks. */
static void write_tensor(writer *w, hid_t group, const gt_tensor_info *t, const gt_shard *mine, const float *src,
                         size_t src_begin, int rounds) {
    hsize_t dims[2];
    tensor_dims(t, dims);
    hid_t space = WID(w, H5Screate_simple(t->ndim, dims, NULL));
    hid_t dcpl = checked_dcpl(w, t->ndim, dims);
    hid_t dset = WID(w, H5Dcreate2(group, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    size_t start = 0, count = 0;
    gt_shard_intersect(mine, t->offset, t->numel, &start, &count);
    for (int k = 0; k < rounds; k++) {
        size_t a = (size_t)k * w->max_elems;
        size_t n = a < count ? (count - a < w->max_elems ? count - a : w->max_elems) : 0;
        if (n) w->ops->copy_to_host(w->stage, src + (t->offset + start + a - src_begin), n * sizeof(float));
        block b[3];
        int nb = flat_blocks(t->ndim, dims, start + a, n, b);
        for (int i = 0; i < nb; i++) { /* the same number of calls on every rank, empty or not */
            hid_t mspace = WID(w, select_block(space, t->ndim, &b[i]));
            WCHECK(w, H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, space, w->dxpl, w->stage + b[i].at));
            WCHECK(w, H5Sclose(mspace));
        }
    }
    WCHECK(w, H5Dclose(dset));
    WCHECK(w, H5Pclose(dcpl));
    WCHECK(w, H5Sclose(space));
}

/* GTRAIN_TEST_SLOW_SAVE=S (tests only): sleep S seconds in the middle of every save, after /model
 * and before /optim, so that a test can kill the job while the temporary file is half written. */
static void test_slow_save(void) {
    const char *env = getenv("GTRAIN_TEST_SLOW_SAVE");
    double s = env ? atof(env) : 0.0;
    if (s > 0) {
        struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

void gt_state_write(const char *path, MPI_Comm comm, const gt_optim *opt, const char *config_text,
                    const gt_state_info *info) {
    writer w = {comm, path, 0, -1, opt->ops, NULL, 0, max_io_elems()};
    int world;
    MPI_Comm_rank(comm, &w.rank);
    MPI_Comm_size(comm, &world);
    const gt_layout *layout = gt_model_layout(opt->model);

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

    hid_t fapl = WID(&w, H5Pcreate(H5P_FILE_ACCESS));
    WCHECK(&w, H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
    WCHECK(&w, H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST)); /* checksummed metadata */
    WCHECK(&w, H5Pset_alignment(fapl, ALIGN_THRESHOLD, ALIGN_BYTES));
    WCHECK(&w, H5Pset_all_coll_metadata_ops(fapl, 1));
    WCHECK(&w, H5Pset_coll_metadata_write(fapl, 1));
    hid_t file = WID(&w, H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
    w.dxpl = WID(&w, H5Pcreate(H5P_DATASET_XFER));
    WCHECK(&w, H5Pset_dxpl_mpio(w.dxpl, H5FD_MPIO_COLLECTIVE));

    write_attr_str(&w, file, "format", GT_STATE_FORMAT);
    write_attr_i64(&w, file, "format_version", GT_STATE_FORMAT_VERSION);
    write_attr_i64(&w, file, "step", info->step);
    write_attr_u64(&w, file, "tokens_seen", info->tokens_seen);
    write_attr_i64(&w, file, "world_size", info->world_size);
    write_attr_str(&w, file, "shard", info->shard);
    write_config(&w, file, text);

    hid_t train = WID(&w, H5Gcreate2(file, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    write_attr_i64(&w, train, "step", info->step);
    write_attr_i64(&w, train, "adam_step", info->adam_step);
    write_attr_u64(&w, train, "data_cursor", info->data_cursor);
    write_attr_u64(&w, train, "tokens_seen", info->tokens_seen);
    write_attr_u64(&w, train, "seed", info->seed);
    write_attr_u64(&w, train, "global_batch", info->global_batch);
    write_attr_i64(&w, train, "micro_batch", info->micro_batch);
    write_attr_i64(&w, train, "grad_accum", info->grad_accum);
    write_attr_i64(&w, train, "seq_len", info->seq_len);
    write_attr_f64(&w, train, "lr", info->lr);
    WCHECK(&w, H5Gclose(train));
    hid_t optim = WID(&w, H5Gcreate2(file, "optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    WCHECK(&w, H5Gclose(optim));

    const float *buffers[3] = {opt->master, opt->exp_avg, opt->exp_avg_sq};
    for (int g = 0; g < 3; g++) {
        if (g == 1) test_slow_save();
        hid_t group = WID(&w, H5Gcreate2(file, GROUPS[g], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
        for (int i = 0; i < layout->n_tensors; i++)
            write_tensor(&w, group, &layout->tensors[i], &mine, buffers[g], opt->shard.begin, rounds[i]);
        WCHECK(&w, H5Gclose(group));
    }

    WCHECK(&w, H5Pclose(w.dxpl));
    WCHECK(&w, H5Fclose(file));
    WCHECK(&w, H5Pclose(fapl));
    free(text);
    free(w.stage);
    free(rounds);
}

/* ------------------------------------------------------------------------------------------------
 * Reading
 * ---------------------------------------------------------------------------------------------- */

typedef struct reader {
    const char *path;
    hid_t file;
    char *err;
    size_t err_len;
    char why[256];  /* the HDF5 reason of the first failed call, captured before anything clears it */
} reader;

/* The innermost message of the HDF5 error stack: the one that says what was wrong. */
static herr_t innermost_error(unsigned n, const H5E_error2_t *e, void *data) {
    if (n == 0 && e->desc) snprintf((char *)data, 256, "%s", e->desc);
    return 0;
}

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
        hsize_t dims[2] = {0, 0};
        tensor_dims(t, dims);
        hid_t dset = H5Dopen2(group, t->name, H5P_DEFAULT);
        hid_t space = dset < 0 ? -1 : H5Dget_space(dset);
        if (space < 0) capture(r);
        if (space < 0) code = fail(r, GT_STATE_UNREADABLE, 1, "cannot open %s/%s", group_name, t->name);
        for (size_t a = 0; !code && a < pc->count; a += max_elems) {
            hsize_t n = pc->count - a < max_elems ? pc->count - a : max_elems;
            block b[3];
            int nb = flat_blocks(t->ndim, dims, pc->start_in_tensor + a, n, b);
            for (int i = 0; i < nb && !code; i++) {
                if (block_elems(t->ndim, &b[i]) == 0) continue;
                hid_t mspace = select_block(space, t->ndim, &b[i]);
                herr_t rc = mspace < 0 ? -1 : H5Dread(dset, H5T_NATIVE_FLOAT, mspace, space, H5P_DEFAULT, stage + b[i].at);
                if (rc < 0) capture(r);
                if (mspace >= 0) H5Sclose(mspace);
                if (rc < 0) code = fail(r, GT_STATE_UNREADABLE, 1, "reading %s/%s failed", group_name, t->name);
            }
            if (!code) opt->ops->copy_to_device(dst + pc->start_in_slice + a, stage, n * sizeof(float));
        }
        if (space >= 0) H5Sclose(space);
        if (dset >= 0) H5Dclose(dset);
    }
    H5Gclose(group);
    return code;
}

static int read_all(reader *r, gt_optim *opt, gt_state_info *info, char **config_text) {
    memset(info, 0, sizeof *info);
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
    int64_t version = 0, step = 0, world = 0;
    int code = read_attr_str(r, r->file, "/", "format", format, sizeof format);
    if (!code && strcmp(format, GT_STATE_FORMAT) != 0)
        code = fail(r, GT_STATE_UNREADABLE, 0, "format is '%s', not '%s'", format, GT_STATE_FORMAT);
    if (!code) code = read_attr(r, r->file, "/", "format_version", H5T_NATIVE_INT64, &version);
    if (!code && version != GT_STATE_FORMAT_VERSION)
        code = fail(r, GT_STATE_INCOMPATIBLE, 0, "format_version %lld; this gtrain reads version %d",
                    (long long)version, GT_STATE_FORMAT_VERSION);
    if (!code) code = read_attr(r, r->file, "/", "step", H5T_NATIVE_INT64, &step);
    if (!code) code = read_attr(r, r->file, "/", "world_size", H5T_NATIVE_INT64, &world);
    if (!code) code = read_attr(r, r->file, "/", "tokens_seen", H5T_NATIVE_UINT64, &info->tokens_seen);
    if (!code) code = read_attr_str(r, r->file, "/", "shard", info->shard, sizeof info->shard);
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
        info->micro_batch = (int)mb;
        info->grad_accum = (int)ga;
        info->seq_len = (int)sl;
        H5Gclose(train);
    }
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

int gt_state_read(const char *path, gt_optim *opt, gt_state_info *info, char **config_text, char *err,
                  size_t err_len) {
    /* Failures are expected here (a corrupt file is a case, not a bug): report them as one line
     * instead of HDF5's error stack. */
    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    reader r = {path, -1, err, err_len, ""};
    err[0] = '\0';
    *config_text = NULL;
    int code = read_all(&r, opt, info, config_text);
    if (r.file >= 0 && H5Fclose(r.file) < 0 && !code) code = fail(&r, GT_STATE_UNREADABLE, 1, "closing failed");
    if (code) {
        free(*config_text);
        *config_text = NULL;
    }
    H5Eclear2(H5E_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    return code;
}
