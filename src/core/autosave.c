/*
 * autosave.c — checkpoint.every = auto (see autosave.h): Young's interval, the lineage's history
 * record of starts, saves and ends, and rank 0's choice of the interval in steps.
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
    out->last_cost_s = -1;
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
            if (open) out->observed_s += last - first, out->faults += !clean;
            out->starts++;
            open = 1, clean = 0, first = last = t;
        } else if (open && strcmp(word, "save") == 0 && sscanf(line, "%*s %*f %*d %lf", &cost) == 1 &&
                   isfinite(cost) && cost >= 0) {
            if (t > last) last = t;
            out->last_cost_s = cost;
        } else if (open && strcmp(word, "end") == 0) {
            if (t > last) last = t;
            clean = 1;
        }
    }
    if (open) out->observed_s += last - first, out->faults += !clean;
}

double gt_autosave_mtbf(double prior_s, const gt_save_history *h, double current_s, char *why, size_t len) {
    double observed = h->observed_s + (current_s > 0 ? current_s : 0);
    if (h->faults > 0) {
        snprintf(why, len, "this run's history: %d fault%s in %.3g h", h->faults, h->faults == 1 ? "" : "s",
                 observed / 3600);
        return observed / h->faults;
    }
    if (observed > prior_s) {
        snprintf(why, len, "this run's history: no fault in %.3g h, longer than checkpoint.mtbf", observed / 3600);
        return observed;
    }
    snprintf(why, len, "the prior checkpoint.mtbf = %g h; no fault in this run's history", prior_s / 3600);
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
        fprintf(stderr, "gtrain: warning: cannot write %s (%s): checkpoint.every = auto goes on with what it "
                "knows\n", a->path, strerror(errno));
        fflush(stderr);
    }
    if (fd >= 0) close(fd);
}

void gt_autosave_begin(gt_autosave *a, int rank0_on, const char *dir, const char *run_id, double prior_hours,
                       double file_bytes, int start_step) {
    memset(a, 0, sizeof *a);
    a->history.last_cost_s = -1;
    if (!rank0_on) return;
    a->on = 1;
    a->prior_s = prior_hours * 3600;
    a->since = start_step;
    a->prior_cost_s = file_bytes / (double)(1u << 30);
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
    if (a->history.last_cost_s >= 0) a->prior_cost_s = a->history.last_cost_s;
    a->started = wall_now();
    char line[128];
    if (!exists) {
        snprintf(line, sizeof line, "gtrain-history 1 %s\n", run_id);
        append_line(a, line);
    }
    snprintf(line, sizeof line, "start %.3f %d\n", a->started, start_step);
    append_line(a, line);
}

static double mean_step(const gt_autosave *a) { return a->steps ? a->step_sum_s / a->steps : a->first_step_s; }

void gt_autosave_step(gt_autosave *a, int first_of_start, double now_s, double compute_s) {
    if (!a->on) return;
    /* the loop's period: from the last boundary to this one, less what the last boundary blocked for
     * saves (counted in the cost apart); a start's first step (its warm-up) by its own time only */
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

/* The interval now, in steps, and the line that tells why. */
static int choose(const gt_autosave *a, char *why, size_t len) {
    char mtbf_why[160], cost_why[96];
    double m = gt_autosave_mtbf(a->prior_s, &a->history, wall_now() - a->started, mtbf_why, sizeof mtbf_why);
    double c = a->costs ? a->cost_sum_s / a->costs : a->prior_cost_s;
    if (a->costs)
        snprintf(cost_why, sizeof cost_why, "measured: the mean of %d save%s", a->costs, a->costs == 1 ? "" : "s");
    else if (a->history.last_cost_s >= 0)
        snprintf(cost_why, sizeof cost_why, "this run's last measured save");
    else
        snprintf(cost_why, sizeof cost_why, "a prior: the state file at 1 GiB/s, until a save is measured");
    double tau = gt_autosave_seconds(c, m), step_s = mean_step(a);
    int n = gt_autosave_steps(tau, step_s);
    if (c >= 2 * m)
        snprintf(why, len, "%d steps (%.3g s at %.3g s a step): a save costs more than half the MTBF, so one per MTBF "
                 "(Daly); save cost %.3g s (%s), MTBF %.3g h (%s)", n, tau, step_s, c, cost_why, m / 3600, mtbf_why);
    else
        snprintf(why, len, "%d steps (%.3g s at %.3g s a step): Young's interval sqrt(2 x %.3g s x %.4g s); save cost "
                 "%.3g s (%s), MTBF %.3g h (%s)", n, tau, step_s, c, m, c, cost_why, m / 3600, mtbf_why);
    return n;
}

int gt_autosave_due(gt_autosave *a, int step) {
    if (!a->on) return 0;
    if (!a->every) {
        if (!a->steps) return 0; /* the first choice waits for a step past the start's first (its warm-up) */
        char why[768];
        a->every = choose(a, why, sizeof why);
        printf("gtrain: checkpoint.every = auto: a save every %s\n", why);
        fflush(stdout);
    }
    return step - a->since >= a->every;
}

/* A measured save: into the cost, onto the history, and the interval again (said when it moved by a
 * quarter or more, so that noise in the measurements does not print a line per save). */
static void measured(gt_autosave *a, int step, double cost_s) {
    a->cost_sum_s += cost_s;
    a->costs++;
    char line[128];
    snprintf(line, sizeof line, "save %.3f %d %.6f\n", wall_now(), step, cost_s);
    append_line(a, line);
    if (!a->every) return;
    char why[768];
    int n = choose(a, why, sizeof why);
    if (4 * abs(n - a->every) >= a->every) {
        printf("gtrain: checkpoint.every = auto: now a save every %s (was every %d steps)\n", why, a->every);
        fflush(stdout);
        a->every = n;
    }
}

void gt_autosave_after_saves(gt_autosave *a, int step, double blocked_s, double started_s, int attempted_step,
                             int pending_step, int last_saved_step) {
    if (!a->on) return;
    a->last_blocked_s = blocked_s;
    double other = blocked_s - started_s; /* the blocking that is not the start of a new asynchronous save */
    if (other < 0) other = 0;
    if (a->measuring) {
        a->lost_s += other;
        other = 0;
        if (pending_step != a->measuring) { /* it was published (or failed) here */
            if (last_saved_step == a->measuring) measured(a, a->measuring, a->lost_s);
            a->measuring = 0;
        }
    }
    if (!attempted_step) return;
    a->since = step;
    if (pending_step == attempted_step) { /* in flight: measured as it goes */
        a->measuring = attempted_step;
        a->lost_s = started_s + other;
    } else if (last_saved_step == attempted_step) {
        measured(a, attempted_step, blocked_s);
    }
}

void gt_autosave_end(gt_autosave *a, int step) {
    if (!a->on) return;
    char line[128];
    snprintf(line, sizeof line, "end %.3f %d\n", wall_now(), step);
    append_line(a, line);
}
