/*
 * autosave.c — checkpoint.every = auto and checkpoint.memory_every = auto (see autosave.h): Young's
 * interval, the lineage's history record of starts, saves, refreshes and ends, and rank 0's choice of
 * each interval in steps (one arithmetic for both).
 */
#define _POSIX_C_SOURCE 200809L

#include "autosave.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HISTORY_MAX_BYTES (16u << 20) /* a record longer than this is read from its start only */

double gt_autosave_seconds(double cost_s, double mtbf_s) {
    if (cost_s >= 2.0 * mtbf_s) return mtbf_s; /* Daly: a save costs more than the work it keeps */
    return sqrt(2.0 * cost_s * mtbf_s);
}

int gt_autosave_steps(double interval_s, double step_s) {
    if (!(step_s > 0)) return 1;
    double n = floor(interval_s / step_s + 0.5);
    if (!(n >= 1)) return 1;
    return n > 1e9 ? 1000000000 : (int)n;
}

void gt_autosave_parse_history(const char *text, const char *run_id, gt_save_history *out) {
    memset(out, 0, sizeof *out);
    out->last_cost_s = out->last_snap_cost_s = -1;
    const char *p = text;
    int header = 0, open = 0, clean = 0;
    double first = 0, last = 0;
    while (p && *p) {
        const char *end = strchr(p, '\n');
        if (!end) break; /* a line without its newline: torn by a kill, skipped */
        char line[256];
        size_t len = (size_t)(end - p) < sizeof line - 1 ? (size_t)(end - p) : sizeof line - 1;
        memcpy(line, p, len);
        line[len] = '\0';
        p = end + 1;
        char word[16], id[64];
        double t, cost;
        long long step;
        if (!header) { /* the first line names the lineage; another's record is not used at all */
            if (sscanf(line, "gtrain-history 1 %63s", id) != 1 || strcmp(id, run_id) != 0) return;
            header = 1;
            continue;
        }
        if (sscanf(line, "%15s %lf %lld", word, &t, &step) != 3 || !isfinite(t)) continue;
        if (strcmp(word, "start") == 0) {
            char from[16] = "";
            int from_memory = sscanf(line, "%*s %*f %*d %15s", from) == 1 && strcmp(from, "memory") == 0;
            if (open) {
                out->observed_s += (clean ? last : fmax(t, last)) - first;
                out->faults += !clean;
                out->memory_faults += !clean && from_memory;
            }
            out->starts++;
            open = 1, clean = 0, first = last = t;
        } else if (open && (strcmp(word, "save") == 0 || strcmp(word, "snap") == 0) &&
                   sscanf(line, "%*s %*f %*d %lf", &cost) == 1 && isfinite(cost) && cost >= 0) {
            if (t > last) last = t;
            *(word[1] == 'a' ? &out->last_cost_s : &out->last_snap_cost_s) = cost;
        } else if (open && strcmp(word, "end") == 0) {
            if (t > last) last = t;
            clean = 1;
        }
    }
    if (open) out->observed_s += last - first, out->faults += !clean;
    if (open && !clean) out->unended_last_s = last;
}

void gt_autosave_history_until(gt_save_history *h, double now_s) {
    if (h->unended_last_s > 0 && now_s > h->unended_last_s) h->observed_s += now_s - h->unended_last_s;
    h->unended_last_s = 0;
}

double gt_autosave_mtbf(double prior_s, const gt_save_history *h, double current_s, int files_only, char *why,
                        size_t len) {
    double observed = h->observed_s + (current_s > 0 ? current_s : 0);
    int faults = files_only ? h->faults - h->memory_faults : h->faults;
    char besides[96] = "";
    if (files_only && h->memory_faults)
        snprintf(besides, sizeof besides, " (besides %d resumed from memory snapshots, which needed no file)",
                 h->memory_faults);
    if (faults > 0) {
        snprintf(why, len, "this run's history: %d fault%s in %.3g h%s", faults, faults == 1 ? "" : "s",
                 observed / 3600, besides);
        return observed / faults;
    }
    if (observed > prior_s) {
        snprintf(why, len, "this run's history: no fault in %.3g h%s, longer than checkpoint.mtbf", observed / 3600,
                 besides);
        return observed;
    }
    snprintf(why, len, "the prior checkpoint.mtbf = %g h; no fault in this run's history%s", prior_s / 3600, besides);
    return prior_s;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One line onto the history (O_APPEND, one write). The record guides a choice and guards nothing:
 * no fsync, and a line lost or torn by a crash only leaves the estimate a little off. */
static void append_line(gt_autosave *a, const char *line) {
    int fd = open(a->path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    ssize_t n = fd >= 0 ? write(fd, line, strlen(line)) : -1;
    if (fd < 0 || n != (ssize_t)strlen(line)) {
        fprintf(stderr, "gtrain: warning: cannot write %s (%s): checkpoint.every = auto and memory_every = auto go "
                "on with what they know\n", a->path, strerror(errno));
        fflush(stderr);
    }
    if (fd >= 0) close(fd);
}

/* An interval's names and its cost before one is measured: the history's last, else the prior. */
static void interval_init(gt_auto_interval *iv, int on, const char *key, const char *what, const char *noun,
                          const char *nouns, const char *word, const char *prior_why, double prior_cost_s,
                          double history_cost_s, int start_step) {
    iv->on = on;
    iv->key = key, iv->what = what, iv->noun = noun, iv->nouns = nouns, iv->word = word, iv->prior_why = prior_why;
    iv->prior_cost_s = prior_cost_s;
    if (history_cost_s >= 0) iv->prior_cost_s = history_cost_s, iv->from_history = 1;
    iv->since = start_step;
}

void gt_autosave_begin(gt_autosave *a, int rank0, const char *dir, const char *run_id, double prior_hours,
                       int files_auto, double file_bytes, int memory_auto, double slot_bytes, int start_step,
                       int snapshots, int from_memory) {
    memset(a, 0, sizeof *a);
    a->history.last_cost_s = a->history.last_snap_cost_s = -1;
    if (!rank0 || !dir[0] || (!files_auto && !memory_auto)) return;
    a->on = 1;
    a->prior_s = prior_hours * 3600;
    snprintf(a->path, sizeof a->path, "%s/.gtrain-history-%s", dir, run_id);
    FILE *f = fopen(a->path, "r");
    int exists = f != NULL;
    if (f) {
        char *text = malloc(HISTORY_MAX_BYTES + 1);
        if (!text) abort();
        size_t n = fread(text, 1, HISTORY_MAX_BYTES, f);
        text[n] = '\0';
        fclose(f);
        gt_autosave_parse_history(text, run_id, &a->history);
        free(text);
    }
    a->started = wall_now();
    a->snapshots = snapshots;
    if (a->history.unended_last_s > 0 && from_memory) a->history.memory_faults++; /* the last life's fault */
    gt_autosave_history_until(&a->history, a->started);
    interval_init(&a->save, files_auto, "checkpoint.every", "a save", "save", "saves", "save",
                  "a prior: the state file at 1 GiB/s, until a save is measured", file_bytes / (double)(1u << 30),
                  a->history.last_cost_s, start_step);
    interval_init(&a->snap, memory_auto, "checkpoint.memory_every", "a memory snapshot", "refresh", "refreshes", "snap",
                  "a prior: the slot at 1 GiB/s, until a refresh is measured",
                  slot_bytes / GT_AUTOSAVE_REFRESH_BYTES_PER_S, a->history.last_snap_cost_s, start_step);
    char line[128];
    if (!exists) {
        snprintf(line, sizeof line, "gtrain-history 1 %s\n", run_id);
        append_line(a, line);
    }
    snprintf(line, sizeof line, "start %.3f %d%s\n", a->started, start_step, from_memory ? " memory" : "");
    append_line(a, line);
}

static double mean_step(const gt_autosave *a) { return a->steps ? a->step_sum_s / a->steps : a->first_step_s; }

void gt_autosave_step(gt_autosave *a, int first_of_start, double now_s, double compute_s) {
    if (!a->on) return;
    /* the loop's period: from the last boundary to this one, less what the last boundary blocked for
     * saves and the refresh after it (counted in their costs apart); a start's first step (its
     * warm-up) by its own time only */
    double step_s = first_of_start || !a->last_mark_s ? compute_s : now_s - a->last_mark_s - a->last_blocked_s;
    a->last_mark_s = now_s;
    a->last_blocked_s = 0;
    if (!(step_s >= 0)) return;
    if (a->measuring) { /* a save was written while this step ran: what it took beyond a step's usual time */
        double extra = step_s - mean_step(a);
        if (extra > 0) a->lost_s += extra;
    } else if (first_of_start) {
        a->first_step_s = step_s;
    } else {
        a->step_sum_s += step_s;
        a->steps++;
    }
}

/* An interval now, in steps, and the line that tells why. */
static int choose(const gt_autosave *a, const gt_auto_interval *iv, char *why, size_t len) {
    char mtbf_why[256], cost_why[96];
    double m = gt_autosave_mtbf(a->prior_s, &a->history, wall_now() - a->started, iv == &a->save && a->snapshots,
                                mtbf_why, sizeof mtbf_why);
    double c = iv->costs ? iv->cost_sum_s / iv->costs : iv->prior_cost_s;
    if (iv->costs)
        snprintf(cost_why, sizeof cost_why, "measured: the mean of %d %s", iv->costs, iv->costs == 1 ? iv->noun : iv->nouns);
    else if (iv->from_history)
        snprintf(cost_why, sizeof cost_why, "this run's last measured %s", iv->noun);
    else
        snprintf(cost_why, sizeof cost_why, "%s", iv->prior_why);
    double young = gt_autosave_seconds(c, m), step_s = mean_step(a);
    int shared = iv->share > 0 && c / iv->share < young;
    double tau = shared ? c / iv->share : young;
    int n = gt_autosave_steps(tau, step_s);
    if (shared)
        snprintf(why, len, "%d steps (%.3g s at %.3g s a step): checkpoint.memory_share = %.3g of the time on %s, "
                 "sooner than Young's interval sqrt(2 x %.3g s x %.4g s) = %.3g s; %s cost %.3g s (%s), MTBF %.3g h (%s)",
                 n, tau, step_s, iv->share, iv->nouns, c, m, young, iv->noun, c, cost_why, m / 3600, mtbf_why);
    else if (c >= 2 * m)
        snprintf(why, len, "%d steps (%.3g s at %.3g s a step): a %s costs more than half the MTBF, so one per MTBF "
                 "(Daly); %s cost %.3g s (%s), MTBF %.3g h (%s)", n, tau, step_s, iv->noun, iv->noun, c, cost_why,
                 m / 3600, mtbf_why);
    else
        snprintf(why, len, "%d steps (%.3g s at %.3g s a step): Young's interval sqrt(2 x %.3g s x %.4g s); %s cost "
                 "%.3g s (%s), MTBF %.3g h (%s)", n, tau, step_s, c, m, iv->noun, c, cost_why, m / 3600, mtbf_why);
    return n;
}

static int due(gt_autosave *a, gt_auto_interval *iv, int step) {
    if (!a->on || !iv->on) return 0;
    if (!iv->every) {
        if (!a->steps) return 0; /* the first choice waits for a step past the start's first (its warm-up) */
        char why[768];
        iv->every = choose(a, iv, why, sizeof why);
        printf("gtrain: %s = auto: %s every %s\n", iv->key, iv->what, why);
        fflush(stdout);
    }
    return step - iv->since >= iv->every;
}

int gt_autosave_due(gt_autosave *a, int step) { return due(a, &a->save, step); }

int gt_autosave_snap_due(gt_autosave *a, int step) { return due(a, &a->snap, step); }

/* A measured save or refresh: into the cost, onto the history (with `line_due`), and the interval
 * again (said when it moved by a quarter or more, so that noise in the measurements does not print a
 * line per save). */
static void measured(gt_autosave *a, gt_auto_interval *iv, int step, double cost_s, int line_due) {
    iv->cost_sum_s += cost_s;
    iv->costs++;
    if (line_due) {
        char line[128];
        snprintf(line, sizeof line, "%s %.3f %d %.6f\n", iv->word, wall_now(), step, cost_s);
        append_line(a, line);
    }
    if (!iv->every) return;
    char why[768];
    int n = choose(a, iv, why, sizeof why);
    if (4 * abs(n - iv->every) >= iv->every) {
        printf("gtrain: %s = auto: now %s every %s (was every %d steps)\n", iv->key, iv->what, why, iv->every);
        fflush(stdout);
        iv->every = n;
    }
}

void gt_autosave_after_saves(gt_autosave *a, int step, double blocked_s, double started_s, int attempted_step,
                             int pending_step, int last_saved_step) {
    if (!a->on) return;
    a->last_blocked_s = blocked_s;
    if (!a->save.on) {
        if (attempted_step) a->snap.since = step;
        return;
    }
    double other = blocked_s - started_s; /* the blocking that is not the start of a new asynchronous save */
    if (other < 0) other = 0;
    if (a->measuring) {
        a->lost_s += other;
        other = 0;
        if (pending_step != a->measuring) { /* it was published (or failed) here */
            if (last_saved_step == a->measuring) measured(a, &a->save, a->measuring, a->lost_s, 1);
            a->measuring = 0;
        }
    }
    if (!attempted_step) return;
    a->save.since = a->snap.since = step;
    if (pending_step == attempted_step) { /* in flight: measured as it goes */
        a->measuring = attempted_step;
        a->lost_s = started_s + other;
    } else if (last_saved_step == attempted_step) {
        measured(a, &a->save, attempted_step, blocked_s, 1);
    }
}

/* The history's snap lines: the first measured refresh, then one a minute at most (they keep the
 * record's spans and the next start's prior cost without a line per step). */
#define SNAP_LINE_EVERY_S 60.0

void gt_autosave_snapped(gt_autosave *a, int step, double blocked_s) {
    if (!a->on) return;
    a->last_blocked_s += blocked_s; /* not the next step's time */
    if (!a->snap.on) return;
    a->snap.since = step;
    double now = wall_now();
    int line_due = !a->last_snap_line_s || now - a->last_snap_line_s >= SNAP_LINE_EVERY_S;
    if (line_due) a->last_snap_line_s = now;
    measured(a, &a->snap, step, blocked_s, line_due);
}

void gt_autosave_end(gt_autosave *a, int step) {
    if (!a->on) return;
    char line[128];
    snprintf(line, sizeof line, "end %.3f %d\n", wall_now(), step);
    append_line(a, line);
}
