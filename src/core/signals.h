/*
 * signals.h — the stop flag for preemption: SIGTERM and SIGUSR1 (what Slurm and most schedulers send
 * before they kill a job) and SIGINT (Ctrl-C, so that a 1-rank run stops like a launched one) only set
 * a flag here. The training loop looks at it at each step boundary,
 * all ranks agree on it (a max all-reduce in runstate_loop.c, since the signal may reach only some ranks), and
 * the run saves its state and exits 75. A second signal during that save changes nothing: the handler
 * never does more than set the flag.
 */
#ifndef GT_SIGNALS_H
#define GT_SIGNALS_H

/* Installs the handlers for SIGTERM, SIGUSR1 and SIGINT (sigaction, SA_RESTART), clears the flag and
 * unblocks the three, so that one pending (kept through an exec) sets the flag now. Called first
 * thing in main: from then on a stop during start-up is kept and acted on after the first step. */
void gt_signals_install(void);

/* Just before the process execs itself: blocks the three signals (the mask and pending signals
 * survive exec, the handlers do not) and raises again a stop already received, so that the new
 * image's gt_signals_install receives it. If the exec fails, gt_signals_install undoes this. */
void gt_signals_before_exec(void);

/* The number of the first stop signal received since gt_signals_install, or 0. */
int gt_signals_pending(void);

#endif
