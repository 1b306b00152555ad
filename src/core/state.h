/*
 * state.h — training-state files: the HDF5 format, written collectively with parallel HDF5 and read
 * back slice by slice on any world size and shard stage. docs/state-format.md is the long form.
 *
 *   /                         attributes format="gtrain-state", format_version, step, tokens_seen,
 *                             world_size, shard, run_id, branch, branch_parents (the lineage: runstate_lineage.c)
 *   /config                   the effective config text (gt_config_to_ini) of the run that saved
 *   /model/<name>             fp32 master weights, one dataset per tensor, logical (Hugging Face) shape
 *   /optim/exp_avg/<name>     AdamW first moment, same shapes
 *   /optim/exp_avg_sq/<name>  AdamW second moment
 *   /train                    attributes: adam_step, data_cursor, seed, global_batch, micro_batch,
 *                             grad_accum, seq_len, lr, step, tokens_seen, skipped_steps
 *
 * A state file is one HDF5 file written collectively (checkpoint.async = false), or a top file of the
 * same layout whose tensors are virtual datasets over one file per rank, DIR/step_N.h5.d/rank_R.h5,
 * each written by its rank alone (gt_state_write_rank, gt_state_write_top); the readers read both.
 *
 * Every dataset is chunked with the Fletcher32 filter, and the file uses HDF5's newest format, whose
 * metadata (superblock, object headers with the attributes, chunk indexes) carries checksums too:
 * a flipped byte fails the read of what it hit, a truncated file fails to open.
 *
 * This file knows the format and nothing of directories, renames, resume policy or signals
 * (the runstate files own those). Reading needs no MPI: gtrain-sample reads /config and /model here too.
 */
#ifndef GT_STATE_H
#define GT_STATE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "optim.h"

#define GT_STATE_FORMAT "gtrain-state"
#define GT_STATE_FORMAT_VERSION 1

/* Everything besides the tensors that a run needs to continue exactly. */
typedef struct gt_state_info {
    int64_t step;           /* optimizer steps taken: the file holds the state after this step */
    uint64_t tokens_seen;   /* tokens trained on in those steps */
    uint64_t data_cursor;   /* the next global sample index (data.h): where step+1 starts */
    uint64_t global_batch;  /* G, sequences per step, of the run that saved */
    uint64_t seed;          /* train.seed: the data order and the initialisation */
    int64_t adam_step;      /* AdamW's t (bias correction) */
    int world_size;
    int micro_batch, grad_accum, seq_len;
    double lr;              /* learning rate of the last step taken */
    int64_t skipped_steps;  /* steps skipped for a non-finite loss or gradient (train.nonfinite = skip);
                               0 when the file predates the attribute */
    char shard[16];         /* dist.shard of the run that saved */
    /* The lineage (runstate_lineage.c, docs/state-format.md): the run identity made at a fresh start, carried
     * through every resume; the branch (a new one at every checkpoint.resume = PATH); the branches it
     * continues, "BRANCH@STEP ..." (their files up to STEP are its past). All "" in a file written
     * before they existed (a legacy lineage); attributes run_id, branch, branch_parents. */
    char run_id[24];
    char branch[24];
    char branch_parents[512];
} gt_state_info;

/* Collective over `comm` (every rank calls it with the same arguments but its own optimizer
 * slice): creates `path` (truncating it) and writes the state. With ZeRO-1 each rank writes the
 * hyperslabs of its own slice; with shard=none every rank holds everything and each writes the
 * slice it would own, so the writes are split across ranks either way. config_text is taken from
 * rank 0. Returns 0, or -1 on every rank when a file operation failed on any rank (a full disk, a
 * quota, an I/O error), with one line in err on every rank: every rank that failed, then the lowest
 * one's OS error (strerror) when there is one, else HDF5's reason, and its call, e.g. "ranks 0,1: No
 * space left on device (H5Dcreate2 /model/lm_head.weight)". The partial file is left for the caller to delete: it only ever exists
 * under the caller's temporary name. */
int gt_state_write(const char *path, MPI_Comm comm, const gt_optim *opt, const char *config_text,
                   const gt_state_info *info, char *err, size_t err_len);

/* The split layout (docs/state-format.md, "Asynchronous saves"): one process, no MPI call, so a
 * background thread may call it while no other thread of the process calls HDF5. Writes the rank
 * file `path` from a host copy of the flat elements [begin, begin + count) of the fp32 master
 * weights and both moments (host[0..2]): each tensor's piece as up to three datasets
 * <group>/<name>.b0|.b1|.b2 (partial first row, full rows, partial last row), chunked, Fletcher32,
 * every chunk written once (no fill). 0, or -1 and one line in err: the OS error (strerror) when
 * there is one, and the call. */
int gt_state_write_rank(const char *path, const gt_layout *layout, uint64_t begin, uint64_t count,
                        const float *const host[3], const gt_state_info *info, int rank, char *err, size_t err_len);

/* Starts the HDF5 library (H5open) if it is not yet: on the main thread before a writer thread calls
 * gt_state_write_rank, since parallel HDF5's start registers a callback with MPI. */
void gt_state_library_open(void);

/* The top file of the split layout, one process: the attributes, /config and /train of a state file,
 * and every tensor a virtual dataset over the rank files rank_dir/rank_%05d.h5 (rank_dir relative
 * to path's directory), rank r holding the flat range [begins[r], begins[r] + counts[r]). Root
 * attributes rank_dir and rank_files name them for readers. 0, or -1 with err. */
int gt_state_write_top(const char *path, const char *rank_dir, const gt_layout *layout, int world,
                       const uint64_t *begins, const uint64_t *counts, const char *config_text,
                       const gt_state_info *info, char *err, size_t err_len);

enum {
    GT_STATE_OK = 0,
    GT_STATE_UNREADABLE = 1,   /* not HDF5, truncated, a checksum failed, not a gtrain state file */
    GT_STATE_INCOMPATIBLE = 2, /* a readable file that does not fit this model (shapes, names) */
};

/* Per rank, not collective: opens `path` read-only, checks the format and that every tensor of the
 * model is there with the model's shape (and nothing else), then reads the slice this rank owns
 * (opt->shard) of /model, /optim/exp_avg and /optim/exp_avg_sq into opt->master, opt->exp_avg and
 * opt->exp_avg_sq, verifying the checksum of every chunk it reads. Returns GT_STATE_* and, unless
 * OK, a message in err; on OK *config_text is the saved config (malloc'd). On failure the optimizer
 * buffers may hold part of the file. Every chunk of every tensor lies in some rank's slice, so
 * together the ranks verify the whole file. */
int gt_state_read(const char *path, gt_optim *opt, gt_state_info *info, char **config_text, char *err,
                  size_t err_len);

/* For a run before its optimizer exists and for tools (gtrain-sample): one process, no MPI calls
 * (the sec2 driver; parallel HDF5 opens a file so without MPI being initialised). Opens `path`,
 * checks the format and reads /config into *config_text (malloc'd). GT_STATE_* and err. */
int gt_state_read_config(const char *path, char **config_text, char *err, size_t err_len);

/* The same, reading the attributes only (gt_state_info: step, world size, global batch, ...), no
 * tensor and no checksum: what a run needs to know before it is built. GT_STATE_* and err. */
int gt_state_read_info(const char *path, gt_state_info *info, char *err, size_t err_len);

/* The same as gt_state_read_config, and checks /model against `layout` (every tensor with its
 * shape, nothing else) and reads each tensor whole into params (layout->n_params fp32, flat layout order); the optimizer's moments
 * are not read. GT_STATE_* and err. */
int gt_state_read_model(const char *path, const gt_layout *layout, float *params, char *err, size_t err_len);

/* The root attributes step, run_id, branch and branch_parents only (the lineage: "" when absent), into
 * info (the rest zero): one process, no MPI, no tensor, and the rank files are not opened, so a
 * start can tell whose every file of a directory is cheaply. GT_STATE_OK, or GT_STATE_UNREADABLE when
 * the file does not open or is not a gtrain state file. */
int gt_state_read_lineage(const char *path, gt_state_info *info);

/* The directory of rank files a top file of the split layout maps onto (its root attribute
 * rank_dir, relative to the file's directory): 1 with it in rank_dir; 0 for a single file (no
 * rank files); -1 when the file does not open or the attribute does not read. One process, no MPI;
 * no tensor is read and the rank files are not opened. */
int gt_state_rank_dir(const char *path, char *rank_dir, size_t len);

/* The size a state file of this layout will have on disk, from the same chunking and alignment
 * rules the writer uses, plus an allowance for metadata: for the free-space check at start. */
uint64_t gt_state_file_bytes(const gt_layout *layout);

/* Bytes of tensor data in a state file for n parameters: master + two moments, fp32. */
static inline uint64_t gt_state_tensor_bytes(size_t n_params) { return 3 * (uint64_t)n_params * 4; }

#endif
