/*
 * spike.h — loss-spike skipping (train.spike_zscore): an update whose loss or global gradient norm
 * lies far above the recent steps' is not applied, as a NaN is not with train.nonfinite = skip.
 * The trainer keeps a window of the last GT_SPIKE_WINDOW applied steps' losses and norms; once it
 * holds GT_SPIKE_MIN of them, a step whose loss is more than zscore standard deviations above the
 * window's mean is skipped before the optimizer runs, and the optimizer is told the largest norm it
 * may apply (gt_optim_step's max_grad_norm). Both values are global (all-reduced), so every rank
 * decides the same. The window lives in memory only: after a resume it fills again.
 */
#ifndef GT_SPIKE_H
#define GT_SPIKE_H

#include <stddef.h>

#define GT_SPIKE_WINDOW 100
#define GT_SPIKE_MIN 20

typedef struct gt_spike_window {
    double loss[GT_SPIKE_WINDOW], norm[GT_SPIKE_WINDOW];
    int count, next;
} gt_spike_window;

/* Returns 1 when `loss` is a spike (why: one sentence naming the step, the loss and the window);
 * else 0 and *max_norm: the largest gradient norm not a spike (0: no limit yet). */
int gt_spike_check_loss(const gt_spike_window *w, double zscore, int step, double loss, double *max_norm, char *why,
                        size_t why_len);

/* The sentence for a step whose norm was above *max_norm. */
void gt_spike_describe_norm(const gt_spike_window *w, int step, double norm, char *why, size_t why_len);

/* An applied step's loss and norm join the window. */
void gt_spike_record(gt_spike_window *w, double loss, double norm);

#endif
