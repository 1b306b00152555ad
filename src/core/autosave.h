/*
 * autosave.h — checkpoint.every = auto and checkpoint.memory_every = auto: the save (and memory
 * snapshot) interval that pays, from the cost of a save (a refresh) and the rate of faults (Young 1974, "A first order approximation to the optimum checkpoint interval";
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
 * has no end line ended in a fault (also one before the lineage's first save: the next start begins
 * again under the recorded identity). Observed time: each earlier start's span to its last line, plus
 * the current start's time so far. With k faults in an observed time T: M = T / k; with none,
 * M = max(prior, T). A start that resumed from memory snapshots says so ("start T STEP memory"):
 * while snapshots are taken, the state files' k leaves out the faults they resumed (those needed no
 * file); the snapshots' k counts every fault.
 *
 * C: measured from the run's own saves. A synchronous save blocks the loop for all of it; an
 * asynchronous one blocks it for the copy of the state slice (and for any wait for the writer) and
 * slows the steps it overlaps (the writer takes memory bandwidth and a core): C = the blocking time +
 * the sum, over the steps while it is written, of each step's time beyond the mean time of the steps
 * with no save in flight. The mean over the saves measured in this start; before one is measured,
 * the last cost the history holds; before any, the state file's bytes at 1 GiB/s (a prior, replaced
 * at the first measured save).
 *
 * checkpoint.memory_every = auto chooses the memory snapshots' interval the same way, with the same
 * M and step time: C is the time a refresh blocks the step loop (rank 0's copy into its slot, its
 * checksum and the partner copy), measured at each refresh; before the first, the history's last
 * measured refresh ("snap T STEP COST_S" lines, one a minute at most), else the slot's bytes at
 * GT_AUTOSAVE_REFRESH_BYTES_PER_S (a stated prior: no early refresh is taken to measure it). A step
 * that tries a state file save takes no snapshot, and the snapshots' count starts again from it.
 *
 * A refresh costs a small share of a save (a copy within host memory against a write to a file
 * system) and its interval is chosen against an MTBF that, before a run's first fault, is only a
 * prior. When the prior is too long (faults far more frequent than 4 h), Young's interval on it
 * loses tau / 2 of work per fault, many times the interval that pays. checkpoint.memory_share bounds
 * that risk at a cost the run states: refreshes are taken at least every C / share seconds, so that
 * at most that share of the time goes to them (0.01 by default: 1%). The interval is the shorter of
 * the two; the state files' interval is Young's alone (a save costs too much to take by a share).
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
    int memory_faults;   /* of those faults, the ones the next start resumed from memory snapshots
                          * (its start line says "memory"): they needed no state file */
    double observed_s;   /* the sum of their spans: a clean start's to its end line, a faulted start's to
                          * the next start (the fault lies in between; finding it and restarting are
                          * part of the time between faults) */
    double unended_last_s; /* the newest start had no end: its last line's time (its span then runs to
                            * the start reading the record: gt_autosave_history_until); else 0 */
    double last_cost_s;  /* the cost of the newest save line; < 0 when none */
    double last_snap_cost_s; /* the cost of the newest snap line (a memory snapshot's refresh); < 0 when none */
} gt_save_history;

/* Parses a history record's text; a line that does not parse (a torn last line) is skipped.
 * A record whose first line names another run identity than run_id is not used (all zero). */
void gt_autosave_parse_history(const char *text, const char *run_id, gt_save_history *out);

/* The start reading the record began at now_s: a newest start without an end spans to it. */
void gt_autosave_history_until(gt_save_history *h, double now_s);

/* M in seconds from the prior and the history, with current_s = the current start's time so far;
 * why gets how it was found ("the prior checkpoint.mtbf = 4 h" or "this run's history: 3 faults in
 * 0.25 h"). files_only: the faults a memory snapshot resumed are left out (the state files' interval
 * while snapshots are taken: only the other faults need a file). */
double gt_autosave_mtbf(double prior_s, const gt_save_history *h, double current_s, int files_only, char *why,
                        size_t len);

/* One interval that pays: the saves' (checkpoint.every) or the memory snapshots'
 * (checkpoint.memory_every), each from its own measured cost and the same MTBF and step time. */
typedef struct gt_auto_interval {
    int on;                 /* its key is auto (and rank 0 has a checkpoint.dir) */
    const char *key;        /* "checkpoint.every", "checkpoint.memory_every" */
    const char *what;       /* "a save", "a memory snapshot": what is taken every N steps */
    const char *noun;       /* "save", "refresh": what is measured */
    const char *nouns;      /* the plural */
    const char *word;       /* its history lines' first word: "save", "snap" */
    const char *prior_why;  /* where the cost comes from before one is measured and none is in the history */
    double prior_cost_s;    /* that prior, or the history's last measured cost */
    int from_history;       /* prior_cost_s is the history's */
    double cost_sum_s;      /* measured in this start */
    int costs;
    int every;              /* the chosen interval in steps; 0 before the choice */
    int since;              /* the step it counts from: the last one taken, or the start's */
    double share;           /* > 0: taken at least every cost / share seconds (the memory snapshots'
                             * checkpoint.memory_share, set after gt_autosave_begin); 0: Young's alone */
} gt_auto_interval;

/* Rank 0's state for checkpoint.every = auto and checkpoint.memory_every = auto (runstate_loop.c and
 * runstate_memsnap.c drive it): the history, the step time, and the two intervals. */
typedef struct gt_autosave {
    int on;                 /* either interval is auto, with a checkpoint.dir, on rank 0 */
    char path[4200];        /* DIR/.gtrain-history-RUN_ID */
    double prior_s;         /* checkpoint.mtbf in seconds */
    double started;         /* the wall clock at this start */
    gt_save_history history;
    double step_sum_s;      /* steps with no save in flight (not a start's first) */
    int steps;
    double first_step_s;    /* the start's first step, until another is measured */
    double last_mark_s;     /* the clock at the last boundary; 0 = none yet */
    double last_blocked_s;  /* what that boundary blocked for saves and the refresh after it */
    gt_auto_interval save;  /* checkpoint.every */
    gt_auto_interval snap;  /* checkpoint.memory_every */
    int measuring;          /* the step of the asynchronous save being measured; 0 = none */
    double lost_s;          /* what it has cost so far */
    double last_snap_line_s; /* the wall clock of the history's last snap line; 0 = none yet */
    int snapshots;          /* memory snapshots are taken in this start (auto or a number) */
} gt_autosave;

/* The memory-copy rate a refresh's cost is estimated at before one is measured: the slot's bytes at
 * 1 GiB/s (a copy into shared memory and its checksum on one core, with room to spare: the first
 * measured refresh replaces it). */
#define GT_AUTOSAVE_REFRESH_BYTES_PER_S ((double)(1u << 30))

/* Opens the history of run_id in dir and appends this start's line. rank0: 1 on rank 0 when a dir
 * is set; files_auto: checkpoint.every = auto (file_bytes: the planned state file); memory_auto:
 * checkpoint.memory_every = auto with its slots open (slot_bytes: one slot). Neither: it stays off.
 * snapshots: memory snapshots are taken in this start (then the state files' interval counts only
 * the faults no snapshot resumed); from_memory: this start resumed from them (its line says so). */
void gt_autosave_begin(gt_autosave *a, int rank0, const char *dir, const char *run_id, double prior_hours,
                       int files_auto, double file_bytes, int memory_auto, double slot_bytes, int start_step,
                       int snapshots, int from_memory);

/* At each step boundary (rank 0), first: now_s a monotonic clock, compute_s the step's own time (used
 * for a start's first step). A step's time is the loop's period between two boundaries, less the
 * saves' blocking at the earlier one and the refresh after it; a step during which a save was
 * written adds what it took beyond the mean of the others to that save's cost. */
void gt_autosave_step(gt_autosave *a, int first_of_start, double now_s, double compute_s);

/* Is a save due after `step`? Makes the first choice (one line) when there is none yet. */
int gt_autosave_due(gt_autosave *a, int step);

/* Is a memory snapshot due after `step`? The same for checkpoint.memory_every = auto. Rank 0's
 * answer: the step boundary's all-reduce makes it every rank's. */
int gt_autosave_snap_due(gt_autosave *a, int step);

/* After the saving part of a step boundary: blocked_s the loop blocked for saves there, started_s
 * the part of it that started a new asynchronous save; attempted_step the step of a save tried there
 * (0: none); pending_step the save in flight after it (0: none); last_saved_step the newest saved.
 * Completed measurements go into the cost, the history gets a line, and a changed interval is said
 * in one line. A save tried at a step also restarts the memory snapshots' count. */
void gt_autosave_after_saves(gt_autosave *a, int step, double blocked_s, double started_s, int attempted_step,
                             int pending_step, int last_saved_step);

/* After the memory snapshot of `step` (every rank took it): blocked_s the loop blocked for it (this
 * rank's refresh and the partner copy). Not part of the next step's time; under memory_every = auto
 * its cost, onto the history (a line a minute at most), and a changed interval said in one line. */
void gt_autosave_snapped(gt_autosave *a, int step, double blocked_s);

/* The run ends cleanly or stops with its state saved: the history's end line. */
void gt_autosave_end(gt_autosave *a, int step);

#endif
