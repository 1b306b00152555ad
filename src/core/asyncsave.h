/*
 * asyncsave.h — one rank's background writer of a training-state save (checkpoint.async = true).
 * The main thread copies the rank's slice of the fp32 master weights and both Adam moments into a
 * host buffer kept from one save to the next (the only time the loop waits), then a thread writes
 * that copy to the rank's own file with serial HDF5 (gt_state_write_rank) and fsyncs it. The thread
 * makes no MPI call; runstate_loop.c asks gt_async_save_finished at step boundaries and agrees over the
 * ranks, and only then joins. At most one save is in flight per rank.
 */
#ifndef GT_ASYNCSAVE_H
#define GT_ASYNCSAVE_H

#include <stddef.h>
#include <stdint.h>

#include "optim.h"
#include "state.h"

typedef struct gt_async_save gt_async_save;

/* A writer whose host buffer comes from `ops` (pinned memory where the backend has it, ops.h's
 * host_alloc) and whose copies are ops->copy_to_host. */
gt_async_save *gt_async_save_new(const gt_ops *ops);

/* Allocates the host buffer for a slice of `count` elements and touches it: at the start of a run,
 * so that the first save's copy does not pay the page faults. Where pinning is refused, the buffer
 * is pageable and this says so in one line (the copies then run slower, nothing else changes). */
void gt_async_save_reserve(gt_async_save *s, size_t count);

/* Copies the flat range [begin, begin + count) of opt's master weights and moments into the host
 * buffer and starts the thread that writes it to `path` (a rank file). The caller makes sure no
 * save is in flight and that no thread of the process calls HDF5 until gt_async_save_join. A
 * thread that cannot start is a failed save (reported by join), not an abort. */
void gt_async_save_start(gt_async_save *s, const gt_optim *opt, uint64_t begin, uint64_t count,
                         const gt_state_info *info, int rank, const char *path);

/* The thread has finished (written and fsynced, or failed): join will not wait. */
int gt_async_save_finished(const gt_async_save *s);

/* Waits for the thread. 0, or -1 with one line in err naming the file and the OS error (the
 * agreement over the ranks puts the rank in front: gt_agree_on_failed_ranks).
 * *bytes: the rank file's size; *write_s: seconds from the start of the write to the end of its
 * fsync. */
int gt_async_save_join(gt_async_save *s, uint64_t *bytes, double *write_s, char *err, size_t err_len);

/* Joins a save still in flight, then frees the host buffer. */
void gt_async_save_free(gt_async_save *s);

#endif
