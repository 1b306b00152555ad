/*
 * exitcodes.h — the exit codes of the command line (docs/reliability.md lists them), which every part
 * of a run may return and the batch scripts act on (75 and 76 requeue).
 */
#ifndef GT_EXITCODES_H
#define GT_EXITCODES_H

enum {
    GT_EXIT_OK = 0,
    GT_EXIT_FAILURE = 1,
    GT_EXIT_BAD_INPUT = 2,
    GT_EXIT_BAD_STATE = 3,
    GT_EXIT_SAVES_FAILING = 74, /* checkpoint.max_failed_saves saves in a row failed (a full disk, a read-only
                                   remount): the run stopped; its newest good state file is named. Not requeued
                                   blindly: the storage needs a person */
    GT_EXIT_PREEMPTED = 75,
    GT_EXIT_HUNG = 76, /* the watchdog ended a hang (dist.timeout); src/dist/watchdog.h, requeued like 75 */
};

#endif
