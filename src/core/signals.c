/*
 * signals.c — the stop flag (see signals.h). The handler stores the signal number into a
 * sig_atomic_t and returns; everything else happens at the next step boundary, outside the handler.
 */
#define _POSIX_C_SOURCE 200809L

#include "signals.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t stop_signal = 0;

static void on_stop_signal(int sig) {
    if (!stop_signal) stop_signal = sig;
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
}

int gt_signals_pending(void) { return (int)stop_signal; }
