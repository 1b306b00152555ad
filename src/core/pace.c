/*
 * pace.c — the trainer's pace line (see pace.h).
 */
#include "pace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int gt_pace_step(gt_pace *p, int step, int first_step, int last_step, double seconds, double predicted_s,
                 int measured, char *out, size_t len) {
    if (p->said || step == first_step || !(predicted_s > 0)) return 0;
    p->seconds[p->n++] = seconds;
    if (p->n < GT_PACE_STEPS && step < last_step) return 0;
    p->said = 1;
    int n = p->n;
    double v[GT_PACE_STEPS];
    memcpy(v, p->seconds, (size_t)n * sizeof *v);
    qsort(v, (size_t)n, sizeof *v, by_value);
    double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), ratio = median / predicted_s;
    char steps[48];
    if (n == 1) snprintf(steps, sizeof steps, "step %d took", step);
    else snprintf(steps, sizeof steps, "steps %d-%d took a median", step - n + 1, step);
    const char *from = measured ? "" : ", priced from defaults (no calibration of this machine)";
    if (ratio > GT_PACE_OFF)
        snprintf(out, len, "%s %.3g ms, %.2fx the %.3g ms predicted%s: slower than the time model said. A machine "
                 "busier than when it was calibrated, a calibration of other hardware, or steps so short that the "
                 "per-step costs the model leaves out weigh; gtrain --calibrate re-measures",
                 steps, median * 1e3, ratio, predicted_s * 1e3, from);
    else if (ratio < 1 / GT_PACE_OFF)
        snprintf(out, len, "%s %.3g ms, %.2fx the %.3g ms predicted%s: faster than the time model said. A "
                 "calibration taken while the machine was busy, or of slower hardware; gtrain --calibrate re-measures",
                 steps, median * 1e3, ratio, predicted_s * 1e3, from);
    else
        snprintf(out, len, "%s %.3g ms, %+.0f%% against the %.3g ms predicted%s", steps, median * 1e3,
                 (ratio - 1) * 100, predicted_s * 1e3, from);
    return 1;
}
