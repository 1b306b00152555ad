/*
 * runstate.h — what the training loop needs from training-state files and signals: where a run
 * starts (fresh or resumed), periodic and final saves, and stopping early on SIGTERM/SIGUSR1.
 * state.c owns the HDF5 file format; this is the loop's side of it.
 */
#ifndef GT_RUNSTATE_H
#define GT_RUNSTATE_H

#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "model.h"
#include "optim.h"

typedef struct gt_run_state {
    const gt_config *cfg;
    gt_comm *comm;
    gt_model *model;
    gt_optim *opt;
    uint64_t global_batch;   /* sequences per optimizer step, all ranks */
    int first_step;          /* 1 for a fresh run, saved step + 1 after a resume */
    uint64_t tokens_seen;    /* tokens trained on before the current step */
    int last_saved_step;     /* 0 when nothing saved by this run */
} gt_run_state;

/* Resumes (checkpoint.resume) or starts fresh; installs the signal handlers. Returns 0 or an exit
 * code (2 bad config, 3 unusable state file). */
int gt_runstate_begin(gt_run_state *run, const gt_config *cfg, gt_comm *comm, gt_model *model, gt_optim *opt,
                      uint64_t global_batch);

/* After optimizer step `step`: periodic save, and the collective check for a stop signal.
 * Returns 0 to go on, or 75 (GT_EXIT_PREEMPTED) after saving when a signal arrived. */
int gt_runstate_after_step(gt_run_state *run, int step);

/* After the last step: the final save. Returns 0 or an exit code. */
int gt_runstate_end(gt_run_state *run);

void gt_runstate_free(gt_run_state *run);

#endif
