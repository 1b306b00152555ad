/*
 * signals.c — the stop flag (see signals.h). The handler stores the signal number into a
 * sig_atomic_t and returns; everything else happens at the next step boundary, outside the handler.
 *
 * The handlers are installed first thing in main, before MPI starts: a launcher forwards a stop to
 * ranks that may still be in MPI_Init, and a signal's default action would end them unsaved. exec
 * resets caught signals to their default action but keeps the signal mask and the pending signals,
 * so across gtrain's one restart of itself the three are blocked, and a stop already received is
 * raised again to wait, pending, for the new image's handlers.
 */
#define _POSIX_C_SOURCE 200809L

#include "signals.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t stop_signal = 0;

static void on_stop_signal(int sig) {
    if (!stop_signal) stop_signal = sig;
}

static void stop_set(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGINT);
}

void gt_signals_install(void) {
    stop_signal = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* a signal during a write or an MPI wait must not fail the call */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL); /* Ctrl-C saves too, on every rank count (one rank gets it directly) */
    /* blocked across an exec (gt_signals_before_exec), or by whoever started us: a stop that waits
     * pending is delivered here, to the handler */
    sigset_t set;
    stop_set(&set);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}

void gt_signals_before_exec(void) {
    sigset_t set;
    stop_set(&set);
    sigprocmask(SIG_BLOCK, &set, NULL);
    if (stop_signal) raise(stop_signal); /* blocked: stays pending through exec */
}

int gt_signals_pending(void) { return (int)stop_signal; }
