/*
 * runclaim.h — one run per checkpoint.dir. Before step 1 a run takes the directory for itself by
 * creating DIR/.gtrain-claim (its owner: host, pid, Slurm job, cluster and step, start time, a random
 * token); a second run on the same directory is refused with exit 2 naming the owner, instead of both
 * overwriting each other's state files. A claim whose run is gone (on this host: its process no longer
 * exists, whatever Slurm says; on another: the same Slurm job restarted, an earlier step of it that
 * squeue no longer lists, or another Slurm job that squeue, asked on the claim's cluster, says has
 * ended) is taken over with one line. Works
 * without flock: atomic create and link(2), then re-read. docs/reliability.md, "One run per
 * directory", has the rules.
 */
#ifndef GT_RUNCLAIM_H
#define GT_RUNCLAIM_H

#include <mpi.h>

#include "config.h"

/* Collective over comm: rank 0 claims cfg->checkpoint.dir (creating it), the others learn the verdict.
 * Returns 0 (claimed, or nothing to claim: no checkpoint.dir, or a directory that cannot be written,
 * which the directory check reports), or 2 (GT_EXIT_BAD_INPUT) on every rank when another run holds
 * it; rank 0 has then printed one line naming the owner. A process holds at most one claim. */
int gt_runclaim_take(const gt_config *cfg, MPI_Comm comm);

/* Removes this process's claim if it holds one and the claim file is still its own; any rank,
 * any number of times (also registered with atexit, for an exit() on a failure path). */
void gt_runclaim_release(void);

#endif
