/*
 * watchdog_runs_abort_hook — when the watchdog ends a hung rank, its on-fire hook (where the NCCL
 * communicator is aborted, comm_nccl.c) runs after the verdict line and before the exit, and a hook
 * that never returns does not keep the process from exiting 76: it gets 10 s. One rank (an MPI
 * singleton), dist.timeout 1 s, a step that never finishes. MODE returns: the hook prints "abort
 * hook ran" and returns; MODE hangs: it prints "abort hook entered" and sleeps for ever.
 *   watchdog_runs_abort_hook MODE DIR      (tests/fault.cmake checks the exit code and the output)
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#include "watchdog.h"

static void say(const char *s) {
    ssize_t w = write(STDERR_FILENO, s, strlen(s));
    (void)w;
}

static void hook_returns(void *arg) {
    (void)arg;
    say("abort hook ran\n");
}

static void hook_hangs(void *arg) {
    (void)arg;
    say("abort hook entered\n");
    for (;;) pause();
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    MPI_Init(&argc, &argv);
    mkdir(argv[2], 0755);
    char why[512];
    if (gt_watchdog_start(MPI_COMM_WORLD, argv[2], 1.0, 0, why, sizeof why) != 0) {
        fprintf(stderr, "cannot start the watchdog: %s\n", why);
        return 1;
    }
    gt_watchdog_on_fire(strcmp(argv[1], "hangs") == 0 ? hook_hangs : hook_returns, NULL);
    gt_watchdog_step_begin(1);
    for (;;) pause(); /* the hang: the watchdog thread ends the process */
}
