/*
 * preflight.h — before a run allocates anything: does the memory plan (planner.h, the numbers
 * `gtrain --plan` prints) fit what this rank can have?
 *
 * What a rank can have is the smallest of:
 *   - on the CPU backend: MemAvailable (/proc/meminfo), capped by the memory limit of the
 *     process's cgroup (v2 memory.max or v1 memory.limit_in_bytes) when one is set, divided by
 *     the ranks on this node (MPI_Comm_split_type shared);
 *   - on a GPU backend: the free device memory (gt_ops.memory_available, cudaMemGetInfo);
 *   - memory.budget, when set.
 * A plan larger than that is refused with exit 2 before the first allocation, naming the plan's
 * parts and the limit, instead of a crash (or the kernel's OOM killer) minutes later.
 */
#ifndef GT_PREFLIGHT_H
#define GT_PREFLIGHT_H

#include <mpi.h>

#include "config.h"
#include "ops.h"
#include "planner.h"

/* Collective over comm. Returns 0, or 2 (GT_EXIT_BAD_INPUT) on every rank when the plan does not
 * fit on some rank, or when snapshot_bytes (the asynchronous save's host copy of the rank's state
 * slice; 0 when there is none) does not fit in the rank's share of the node's memory beside what the
 * plan keeps there (all of it on the CPU), or when memsnap_bytes (the memory snapshots' slots in
 * node-local shared memory, checkpoint.memory_every; 0 when off) does not fit beside both; rank 0
 * then has printed one line with the numbers. With checkpoint.memory_every = auto, slots that do not
 * fit (gt_preflight_memsnap_fits on some rank) are no refusal: *memsnap_off is 1 on every rank and
 * rank 0 has printed one warning line saying why and how to have them. */
int gt_preflight_memory(const gt_config *cfg, const gt_ops *ops, MPI_Comm comm, const gt_mem_estimate *plan,
                        uint64_t snapshot_bytes, uint64_t memsnap_bytes, int *memsnap_off);

/* Do memsnap_bytes of slots per rank fit on this node: node_ranks x memsnap_bytes within the free
 * space of the shared-memory directory (gt_memsnap_dir; GTRAIN_TEST_SHM_FREE fakes it), and
 * memsnap_bytes + beside_bytes (the rest of the rank's host memory) within the rank's share of the
 * node's memory? 1, or 0 with why (one phrase). What checkpoint.memory_every = auto decides by, in
 * the run and in `gtrain --plan`. Not collective. */
int gt_preflight_memsnap_fits(int node_ranks, uint64_t memsnap_bytes, uint64_t beside_bytes, char *why, size_t len);

#endif
