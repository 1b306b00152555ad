/* spike.c — see spike.h. */
#include "spike.h"

#include <math.h>
#include <stdio.h>

/* Mean and standard deviation of the window; the deviation is floored at 1e-6 of the mean, so that
 * a window of equal values does not call every different value a spike. */
static void stats(const double *v, int n, double *mean, double *sd) {
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    *mean = sum / n;
    for (int i = 0; i < n; i++) sq += (v[i] - *mean) * (v[i] - *mean);
    *sd = sqrt(sq / n);
    double floor = 1e-6 * fabs(*mean);
    if (*sd < floor) *sd = floor;
}

int gt_spike_check_loss(const gt_spike_window *w, double zscore, int step, double loss, double *max_norm, char *why,
                        size_t why_len) {
    *max_norm = 0;
    if (zscore <= 0 || w->count < GT_SPIKE_MIN) return 0;
    double mean, sd;
    stats(w->loss, w->count, &mean, &sd);
    if (loss > mean + zscore * sd) {
        snprintf(why, why_len, "step %d: the loss %.4f is %.1f standard deviations above the mean %.4f of the last %d "
                 "steps", step, loss, (loss - mean) / sd, mean, w->count);
        return 1;
    }
    stats(w->norm, w->count, &mean, &sd);
    *max_norm = mean + zscore * sd;
    return 0;
}

void gt_spike_describe_norm(const gt_spike_window *w, int step, double norm, char *why, size_t why_len) {
    double mean, sd;
    stats(w->norm, w->count, &mean, &sd);
    snprintf(why, why_len, "step %d: the gradient norm %.4g is %.1f standard deviations above the mean %.4g of the "
             "last %d steps", step, norm, (norm - mean) / sd, mean, w->count);
}

void gt_spike_record(gt_spike_window *w, double loss, double norm) {
    w->loss[w->next] = loss;
    w->norm[w->next] = norm;
    w->next = (w->next + 1) % GT_SPIKE_WINDOW;
    if (w->count < GT_SPIKE_WINDOW) w->count++;
}
