/*
 * train.h — the training loop: micro-batches with gradient accumulation, one optimizer step per
 * global batch, validation, logging and metrics. Runs on every rank; rank 0 prints and writes.
 */
#ifndef GT_TRAIN_H
#define GT_TRAIN_H

#include <mpi.h>

#include "config.h"

/* Exit codes of the CLI contract (DESIGN.md). */
enum {
    GT_EXIT_OK = 0,
    GT_EXIT_FAILURE = 1,
    GT_EXIT_BAD_INPUT = 2,
    GT_EXIT_BAD_STATE = 3,
    GT_EXIT_PREEMPTED = 75,
};

/* Trains as the config says. Returns one of the exit codes above (the same on every rank). */
int gt_train(const gt_config *cfg, MPI_Comm world);

#endif
