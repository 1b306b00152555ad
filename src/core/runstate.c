/*
 * runstate.c — the training loop's side of training-state files and signals (see runstate.h).
 * Until the HDF5 state files land this starts every run fresh and saves nothing.
 */
#include "runstate.h"

#include <string.h>

int gt_runstate_begin(gt_run_state *run, const gt_config *cfg, gt_comm *comm, gt_model *model, gt_optim *opt,
                      uint64_t global_batch) {
    memset(run, 0, sizeof *run);
    run->cfg = cfg;
    run->comm = comm;
    run->model = model;
    run->opt = opt;
    run->global_batch = global_batch;
    run->first_step = 1;
    return 0;
}

int gt_runstate_after_step(gt_run_state *run, int step) {
    (void)run;
    (void)step;
    return 0;
}

int gt_runstate_end(gt_run_state *run) {
    (void)run;
    return 0;
}

void gt_runstate_free(gt_run_state *run) { memset(run, 0, sizeof *run); }
