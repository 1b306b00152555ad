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

/* For a check whose outcome may differ between ranks (a file only some nodes see, a GPU only some
 * have): every rank passes its own code (0 = fine) and message; all get back the worst code and, in
 * msg, the message of the lowest rank that had it. Collective over comm; msg_len equal on all ranks. */
int gt_agree_on_failure(MPI_Comm comm, int code, char *msg, size_t msg_len);

/* Trains as the config says. Returns one of the exit codes above (the same on every rank). */
int gt_train(const gt_config *cfg, MPI_Comm world);

#endif
