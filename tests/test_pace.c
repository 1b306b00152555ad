/* The trainer's pace line (src/core/pace.c): the start's first step is left out; the line comes once,
 * after five more steps or at the run's last; its figure is their median (an even count: the mean of
 * the middle two); within 1.25x of the prediction either way it says the difference in per cent,
 * beyond it slower or faster than the time model said; a prediction from the defaults says so; no
 * prediction, no line. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "pace.h"

/* Feeds steps first..last (seconds[i] for step first + i) until a line comes; its step, or 0 */
static int feed(gt_pace *p, int first, int last, const double *seconds, double predicted, int measured, char *out,
                size_t len) {
    for (int s = first; s <= last; s++)
        if (gt_pace_step(p, s, first, last, seconds[s - first], predicted, measured, out, len)) return s;
    return 0;
}

static void window_and_median(void) {
    char out[1024];
    gt_pace p = {0};
    /* the first step's 9 s (warm-up) is not counted: steps 2-6, median 0.100 s */
    double s[] = {9.0, 0.100, 0.090, 0.300, 0.110, 0.095, 0.5, 0.5};
    int at = feed(&p, 1, 8, s, 0.100, 1, out, sizeof out);
    CHECK(at == 6, "the line after step %d, not 6", at);
    CHECK(strcmp(out, "steps 2-6 took a median 100 ms, +0% against the 100 ms predicted") == 0, "'%s'", out);
    CHECK(!gt_pace_step(&p, 7, 1, 8, 0.1, 0.1, 1, out, sizeof out), "a second line");
    /* a resumed start at 11 of a run to 14: steps 12-14 (3 of them), at the last */
    gt_pace q = {0};
    double r[] = {5.0, 0.2, 0.4, 0.3};
    at = feed(&q, 11, 14, r, 0.1, 1, out, sizeof out);
    CHECK(at == 14, "the resumed start's line after step %d, not 14", at);
    CHECK(strncmp(out, "steps 12-14 took a median 300 ms, 3.00x the 100 ms predicted: slower than the time model said",
                  90) == 0, "'%s'", out);
    /* an even count: the mean of the middle two (steps 2-5 of a 5-step run: 0.1, 0.2, 0.3, 0.4) */
    gt_pace e = {0};
    double v[] = {1.0, 0.4, 0.1, 0.3, 0.2};
    at = feed(&e, 1, 5, v, 0.25, 1, out, sizeof out);
    CHECK(at == 5 && strcmp(out, "steps 2-5 took a median 250 ms, +0% against the 250 ms predicted") == 0,
          "step %d: '%s'", at, out);
    /* one step after the first */
    gt_pace one = {0};
    double w[] = {1.0, 0.2};
    at = feed(&one, 1, 2, w, 0.2, 1, out, sizeof out);
    CHECK(at == 2 && strcmp(out, "step 2 took 200 ms, +0% against the 200 ms predicted") == 0, "'%s'", out);
    /* a run of its first step only: no line */
    gt_pace none = {0};
    CHECK(!gt_pace_step(&none, 1, 1, 1, 1.0, 0.2, 1, out, sizeof out), "a line for the first step alone");
}

static void bounds_and_sources(void) {
    char out[1024];
    double s[] = {1.0, 0.124, 0.124, 0.124, 0.124, 0.124};
    gt_pace a = {0};
    feed(&a, 1, 6, s, 0.1, 1, out, sizeof out); /* 1.24x: within */
    CHECK(strstr(out, "+24% against the 100 ms predicted") && !strstr(out, "slower"), "1.24x: '%s'", out);
    double t[] = {1.0, 0.126, 0.126, 0.126, 0.126, 0.126};
    gt_pace b = {0};
    feed(&b, 1, 6, t, 0.1, 1, out, sizeof out); /* 1.26x: slower */
    CHECK(strstr(out, "1.26x the 100 ms predicted: slower than the time model said") != NULL, "1.26x: '%s'", out);
    double u[] = {1.0, 0.079, 0.079, 0.079, 0.079, 0.079};
    gt_pace c = {0};
    feed(&c, 1, 6, u, 0.1, 1, out, sizeof out); /* 0.79x: faster */
    CHECK(strstr(out, "0.79x the 100 ms predicted: faster than the time model said") != NULL, "0.79x: '%s'", out);
    gt_pace d = {0};
    feed(&d, 1, 6, s, 0.1, 0, out, sizeof out);
    CHECK(strstr(out, "predicted, priced from defaults (no calibration of this machine)") != NULL, "defaults: '%s'", out);
    gt_pace e = {0};
    CHECK(feed(&e, 1, 6, s, 0, 1, out, sizeof out) == 0, "a line without a prediction");
}

int main(void) {
    window_and_median();
    bounds_and_sources();
    if (check_failures) {
        printf("test_pace: %d FAILURES\n", check_failures);
        return 1;
    }
    printf("test_pace: the window, its median, the bounds and the prediction's source as the line says them\n");
    return 0;
}
