/*
 * train.h — the training loop: micro-batches with gradient accumulation, one optimizer step per
 * global batch, validation, logging and metrics. Runs on every rank; rank 0 prints and writes.
 */
#ifndef GT_TRAIN_H
#define GT_TRAIN_H

#include <mpi.h>

#include "config.h"
#include "exitcodes.h"

/* Trains as the config says. Returns one of the exit codes of exitcodes.h (the same on every rank). */
int gt_train(const gt_config *cfg, MPI_Comm world);

#endif
