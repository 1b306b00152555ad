/*
 * runstate.h — what the training loop needs from training-state files and signals: where a run
 * starts (fresh or resumed), periodic and final saves, and stopping early on SIGTERM/SIGUSR1.
 * state.c owns the HDF5 file format; this is the loop's side of it.
 */
#ifndef GT_RUNSTATE_H
#define GT_RUNSTATE_H

#include <mpi.h>
#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "model.h"
#include "optim.h"

typedef struct gt_run_state {
    const gt_config *cfg;
    gt_comm *comm;
    MPI_Comm mpi_comm;       /* a duplicate of the trainer's communicator: MPI-IO and messages */
    gt_model *model;
    gt_optim *opt;
    uint64_t global_batch;   /* sequences per optimizer step, all ranks */
    int first_step;          /* 1 for a fresh run, saved step + 1 after a resume */
    uint64_t first_sample;   /* global sample index where step first_step starts: 0 for a fresh run,
                                the saved data cursor after a resume (which stays right when the
                                global batch changed); step s starts at
                                first_sample + (s - first_step) * global_batch */
    uint64_t tokens_seen;    /* tokens trained on before the current step */
    int last_saved_step;     /* the step of the newest state file of this run (or resumed from), 0 if none */
    char *config_text;       /* gt_config_to_ini of the run, stored in every file */
} gt_run_state;

/* Resumes (checkpoint.resume) or starts fresh. Collective over
 * world (the trainer's MPI communicator, which comm wraps). Returns 0 or an exit code (2 bad config,
 * 3 unusable state file), the same on every rank. */
int gt_runstate_begin(gt_run_state *run, const gt_config *cfg, gt_comm *comm, MPI_Comm world, gt_model *model,
                      gt_optim *opt, uint64_t global_batch);

/* After optimizer step `step`: periodic save, and the collective check for a stop signal.
 * Returns 0 to go on, or 75 (GT_EXIT_PREEMPTED) after saving when a signal arrived. */
int gt_runstate_after_step(gt_run_state *run, int step);

/* After the last step: the final save. Returns 0 or an exit code. */
int gt_runstate_end(gt_run_state *run);

void gt_runstate_free(gt_run_state *run);

#endif
