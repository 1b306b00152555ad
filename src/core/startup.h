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

/* The rank in the lines, once known (before it: the launcher's rank variable, else "-"). */
void gt_startup_rank(int rank);

/* One line "gtrain: startup: rank R: PHASE: T ms since the process started (+D ms; CPU +C ms)" when
 * GTRAIN_STARTUP_TIMES=1; to stderr, flushed. */
void gt_startup_mark(const char *phase);

#endif
