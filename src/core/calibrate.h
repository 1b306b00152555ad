/*
 * calibrate.h — gtrain --calibrate's measurements (calibrate.c; the file: calib.h).
 */
#ifndef GT_CALIBRATE_H
#define GT_CALIBRATE_H

#include <mpi.h>
#include <stdio.h>

#include "calib.h"
#include "config.h"
#include "ops.h"

struct gt_comm;

/* Measures the rates of *c (its key set by the caller) on `ops` at cfg's model and micro-batch shapes;
 * with comm on more than one rank (collective: every rank calls it), the collectives too, else their
 * defaults stay. world (MPI_COMM_NULL: this rank alone): the ranks that measure the compute together,
 * each measurement started on all at once after a barrier, each figure the slowest rank's
 * (c->ranks_measured, c->rank_spread say how they compared). The compute's measurements run in up to
 * five rounds, each figure its fastest round's. log (may be NULL) gets one line per measurement
 * (its kept figure) and one on the rounds. 0. */
int gt_calibrate(const gt_config *cfg, const gt_ops *ops, int gpu, struct gt_comm *comm, MPI_Comm world, gt_calib *c,
                 FILE *log);

/* How many blocks the in-step factor's micro-batch of model m has (calibrate.c): all of m's, or as
 * many as leave the largest size measured (8 sequences or micro_batch) within the cap (2 GiB, 8 GiB
 * with gpu) by the calibration's rough count of weights, gradients and stash, at least 2 (fewer only
 * when m has fewer). */
int gt_calibrate_in_step_blocks(const gt_model_config *m, size_t act_bytes, int seq_len, int micro_batch, int gpu);

/* gt_calib_select_in_step for cfg's model and sequence; when c was measured, appends "; " and its
 * words to note (the rates' note of gt_calib_for_run) */
void gt_calib_note_in_step(gt_calib *c, const gt_config *cfg, char *note, size_t note_len);

#endif
