/*
 * autosave.h — checkpoint.every = auto: the save interval that pays, from the cost of a save and the
 * rate of faults (Young 1974, "A first order approximation to the optimum checkpoint interval";
 * Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps").
 *
 * A run that saves every tau seconds loses C per save (C: the time the step loop loses to one save)
 * and, at each fault, the work since the last save (tau / 2 on average, plus what does not depend on
 * tau: the restart, and with asynchronous saves the time a save takes to be published). With a fault
 * every M seconds on average the time lost per second is about C / tau + tau / (2 M), least at
 * tau = sqrt(2 C M) (Young's interval). Daly's analysis bounds it: when C >= 2 M a save costs more
 * than the work it keeps, and tau = M. The interval in steps is tau over the measured step time,
 * rounded, at least 1.
 *
 * M: checkpoint.mtbf (hours), a stated prior, until the run's own history says better. The history
 * is DIR/.gtrain-history-RUN_ID, named by the lineage's run identity (runstate_lineage.c), so a run
 * opens only its own lineage's record; rank 0 appends a line at each start ("start T STEP"), each
 * measured save ("save T STEP COST_S") and each clean end ("end T STEP": the last step, or a stop on
 * a signal with the state saved), T in seconds of the wall clock. An earlier start of the lineage that
 * has no end line ended in a fault (a fault before the lineage's first save is in no history: the
 * next start, with nothing to resume, is a fresh one, a new lineage). Observed time: each earlier start's span to its last line, plus
 * the current start's time so far. With k faults in an observed time T: M = T / k; with none,
 * M = max(prior, T).
 *
 * C: measured from the run's own saves. A synchronous save blocks the loop for all of it; an
 * asynchronous one blocks it for the copy of the state slice (and for any wait for the writer) and
 * slows the steps it overlaps (the writer takes memory bandwidth and a core): C = the blocking time +
 * the sum, over the steps while it is written, of each step's time beyond the mean time of the steps
 * with no save in flight. The mean over the saves measured in this start; before one is measured,
 * the last cost the history holds; before any, the state file's bytes at 1 GiB/s (a prior, replaced
 * at the first measured save).
 */
#ifndef GT_AUTOSAVE_H
#define GT_AUTOSAVE_H

#include <stddef.h>

/* Young's interval sqrt(2 x cost x mtbf), seconds; mtbf when cost >= 2 x mtbf (Daly). */
double gt_autosave_seconds(double cost_s, double mtbf_s);

/* The interval in steps: seconds / step_s rounded to the nearest, at least 1 (also for step_s <= 0). */
int gt_autosave_steps(double interval_s, double step_s);

/* What a lineage's history record says about its earlier starts. */
typedef struct gt_save_history {
    int starts;          /* earlier starts recorded */
    int faults;          /* of them, those without an end line */
    double observed_s;   /* the sum of their spans (start to the last line) */
    double last_cost_s;  /* the cost of the newest save line; < 0 when none */
} gt_save_history;

/* Parses a history record's text; a line that does not parse (a torn last line) is skipped.
 * A record whose first line names another run identity than run_id is not used (all zero). */
void gt_autosave_parse_history(const char *text, const char *run_id, gt_save_history *out);

/* M in seconds from the prior and the history, with current_s = the current start's time so far;
 * why gets how it was found ("the prior checkpoint.mtbf = 4 h" or "this run's history: 3 faults in
 * 0.25 h"). */
double gt_autosave_mtbf(double prior_s, const gt_save_history *h, double current_s, char *why, size_t len);

/* Rank 0's state for checkpoint.every = auto (runstate_loop.c drives it). */
typedef struct gt_autosave {
    int on;                 /* checkpoint.every = auto with a checkpoint.dir, on rank 0 */
    char path[4200];        /* DIR/.gtrain-history-RUN_ID */
    double prior_s;         /* checkpoint.mtbf in seconds */
    double started;         /* the wall clock at this start */
    gt_save_history history;
    double cost_sum_s;      /* the saves measured in this start */
    int costs;
    double prior_cost_s;    /* before one is measured */
    double step_sum_s;      /* steps with no save in flight (not a start's first) */
    int steps;
    double first_step_s;    /* the start's first step, until another is measured */
    int every;              /* the chosen interval in steps; 0 before the choice */
    int since;              /* the step of the last save, or the start's */
    double last_mark_s;     /* the clock at the last boundary; 0 = none yet */
    double last_blocked_s;  /* what that boundary blocked for saves */
    int measuring;          /* the step of the asynchronous save being measured; 0 = none */
    double lost_s;          /* what it has cost so far */
} gt_autosave;

/* Opens the history of run_id in dir and appends this start's line. rank0_on: 1 on rank 0 when
 * checkpoint.every = auto and a dir is set, else it stays off. file_bytes: the planned state file. */
void gt_autosave_begin(gt_autosave *a, int rank0_on, const char *dir, const char *run_id, double prior_hours,
                       double file_bytes, int start_step);

/* At each step boundary (rank 0), first: now_s a monotonic clock, compute_s the step's own time (used
 * for a start's first step). A step's time is the loop's period between two boundaries, less the
 * saves' blocking at the earlier one; a step during which a save was written adds what it took
 * beyond the mean of the others to that save's cost. */
void gt_autosave_step(gt_autosave *a, int first_of_start, double now_s, double compute_s);

/* Is a save due after `step`? Makes the first choice (one line) when there is none yet. */
int gt_autosave_due(gt_autosave *a, int step);

/* After the saving part of a step boundary: blocked_s the loop blocked for saves there, started_s
 * the part of it that started a new asynchronous save; attempted_step the step of a save tried there
 * (0: none); pending_step the save in flight after it (0: none); last_saved_step the newest saved.
 * Completed measurements go into the cost, the history gets a line, and a changed interval is said
 * in one line. */
void gt_autosave_after_saves(gt_autosave *a, int step, double blocked_s, double started_s, int attempted_step,
                             int pending_step, int last_saved_step);

/* The run ends cleanly or stops with its state saved: the history's end line. */
void gt_autosave_end(gt_autosave *a, int step);

#endif
