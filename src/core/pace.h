/*
 * pace.h — the trainer's pace line: once a start, the median of the GT_PACE_STEPS steps after its
 * first (the first is its warm-up: first calls, page faults, a resume's loads) against the time
 * model's predicted step (docs/planner.md, "Predicted against measured"). Out of [1/GT_PACE_OFF,
 * GT_PACE_OFF] of the prediction the line says which way it missed and what to do. A run of fewer
 * steps says it at its last. The steps' own time (the trainer's step_ms): saves and refreshes after a
 * step are not in it, and the prediction leaves them out too.
 */
#ifndef GT_PACE_H
#define GT_PACE_H

#include <stddef.h>

#define GT_PACE_STEPS 5
#define GT_PACE_OFF 1.25 /* the accuracy target's worst error (docs/planner.md) */

typedef struct gt_pace {
    double seconds[GT_PACE_STEPS];
    int n, said;
} gt_pace;

/* Step `step` of a start that began at first_step took `seconds`; the run ends at last_step. Returns 1
 * once, with the line (without "gtrain: pace: " and without a newline) in out, when the window is full
 * or the run's last step has come; else 0. predicted_s <= 0 (no prediction): never. measured: the
 * prediction's rates came from a calibration, not the defaults. */
int gt_pace_step(gt_pace *p, int step, int first_step, int last_step, double seconds, double predicted_s,
                 int measured, char *out, size_t len);

#endif
