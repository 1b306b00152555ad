/*
 * state_write.c — writing a training-state file (state.c states the format's rules): the single
 * file, collectively over MPI-IO ("Writing"), and the split layout, one file per rank tied
 * together by a top file of virtual datasets.
 */
#define _GNU_SOURCE /* memfd_create */

#include "state.h"
#include "state_internal.h"

#include <errno.h>
#include <hdf5.h>
#include <signal.h>
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
        H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, gt_st_innermost_error, w->why);
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
    gt_st_chunk_dims(ndim, dims, chunk);
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
    gt_st_tensor_dims(t, dims);
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
            int nb = gt_st_flat_blocks(t->ndim, dims, start + a, n, b);
            for (int i = 0; i < nb; i++) { /* the same number of calls on every rank, empty or not */
                hid_t mspace = LOCAL_ID(w, gt_st_select_block(space, t->ndim, &b[i]));
                if (FILE_RC(w, "H5Dwrite", object, (test_slow_write(w->rank), H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, space,
                                                                                  w->dxpl, w->stage + b[i].at))) >= 0)
                    gt_watchdog_progress(gt_st_block_elems(t->ndim, &b[i]) * sizeof(float)); /* watchdog.h */
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
    writer w = {comm, path, 0, -1, opt->ops, NULL, 0, gt_st_max_io_elems(), 0, 0, 0, 0, "", ""};
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
 * "<group>/<name>.b0|.b1|.b2": the blocks of gt_st_flat_blocks (a partial first row, full rows, a partial
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
        gt_watchdog_progress(gt_st_block_elems(t->ndim, b) * sizeof(float)); /* a background writer's too */
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
            gt_st_tensor_dims(t, dims);
            block b[3];
            int nb = gt_st_flat_blocks(t->ndim, dims, start, n, b);
            const float *src = host[g] + (t->offset + start - begin);
            for (int k = 0; k < nb; k++)
                if (gt_st_block_elems(t->ndim, &b[k])) write_block(&w, group, GROUPS[g], t, k, &b[k], src + b[k].at);
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
    gt_st_tensor_dims(t, dims);
    hid_t space = LOCAL_ID(w, H5Screate_simple(t->ndim, dims, NULL));
    hid_t dcpl = LOCAL_ID(w, H5Pcreate(H5P_DATASET_CREATE));
    float nan = NAN;
    LOCAL(w, H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan));
    for (int r = 0; r < world; r++) {
        size_t start, n = tensor_part(t, begins[r], counts[r], &start);
        if (!n) continue;
        block b[3];
        int nb = gt_st_flat_blocks(t->ndim, dims, start, n, b);
        char file_name[512], source[400], name[300];
        snprintf(file_name, sizeof file_name, "%s/rank_%05d.h5", rank_dir, r);
        for (int k = 0; k < nb; k++) {
            if (!gt_st_block_elems(t->ndim, &b[k])) continue;
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
