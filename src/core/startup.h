/*
 * startup.h — what a start's time to its first step is made of: with GTRAIN_STARTUP_TIMES=1 each rank
 * prints one line per phase of its start-up (MPI start, config, claim, backend and communicator, plan
 * and data, model allocation, the directory checks, the state file's read, the writer's buffer, the
 * watchdog, the first step), with the milliseconds since the process started (the kernel's start time
 * of the process, so the loading of the binary and gtrain's own restart for the OpenMP spin count too)
 * and since the previous line, on a monotonic clock, and the process's CPU time since the previous
 * line (on a loaded machine the phases' shares of CPU time are the steadier measure). Without the
 * variable nothing is printed.
 */
#ifndef GT_STARTUP_H
#define GT_STARTUP_H

#include <stddef.h>

/* The marks that end the parts of gt_startup_split (the phases the start passes, in order). */
#define GT_STARTUP_MPI "MPI_Init"
#define GT_STARTUP_CHECKED "backend, communicator, global batch, plan, data"
#define GT_STARTUP_ALLOCATED "model and optimizer allocated"
#define GT_STARTUP_RESUMED "lineage and resume (the state file or memory snapshot read and verified)"
#define GT_STARTUP_BUFFERS "state begun (the writer's buffer, the memory snapshots' slots)"
#define GT_STARTUP_READY "metrics, banner, watchdog"
#define GT_STARTUP_FIRST_STEP "first step"

/* The rank in the lines, once known (before it: the launcher's rank variable, else "-"). */
void gt_startup_rank(int rank);

/* One line "gtrain: startup: rank R: PHASE: T ms since the process started (+D ms; CPU +C ms)" when
 * GTRAIN_STARTUP_TIMES=1; to stderr, flushed. */
void gt_startup_mark(const char *phase);

/* After the first step's mark: this start's time split into its parts, one phrase ("3.21 s from the
 * process's start to the end of the first step (MPI start 0.31, checks and plan 0.02, allocation
 * 0.45, directory and resume 0.30, save and snapshot buffers 0.31, weights and banner 0.00, first
 * step 1.70 s)"); the marks are kept whether or not GTRAIN_STARTUP_TIMES prints them. 0, or -1
 * before the first step. */
int gt_startup_split(char *out, size_t len);

#endif
