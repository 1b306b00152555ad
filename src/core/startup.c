/*
 * startup.c — GTRAIN_STARTUP_TIMES=1: the phases of a start with their times (see startup.h).
 */
#define _GNU_SOURCE /* CLOCK_BOOTTIME */

#include "startup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank_known = 0, rank_value = -1, enabled = -1;
static double last_ms = -1, last_cpu_ms = 0;

/* The process's CPU time (every thread), ms: on a loaded machine a phase's share of it says more
 * than its wall time. */
static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The process's start time on the CLOCK_BOOTTIME scale, ms: /proc/self/stat's field 22 (clock ticks
 * since boot). -1 when it does not read: then the first line counts from itself. */
static double process_start_ms(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[2048];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces: count fields after it */
    if (!p) return -1;
    p++;
    unsigned long long start = 0;
    for (int field = 3; field <= 22; field++) {
        while (*p == ' ') p++;
        if (field == 22) {
            start = strtoull(p, NULL, 10);
            break;
        }
        while (*p && *p != ' ') p++;
    }
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)start * 1e3 / (double)hz : -1;
}

static double boot_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void gt_startup_rank(int rank) {
    rank_known = 1;
    rank_value = rank;
}

/* The marks of this start, kept whether or not they are printed: the split of gt_startup_split. */
enum { MAX_MARKS = 32 };
static struct {
    const char *phase;
    double ms;
} marks[MAX_MARKS];
static int n_marks;

void gt_startup_mark(const char *phase) {
    if (enabled < 0) {
        const char *v = getenv("GTRAIN_STARTUP_TIMES");
        enabled = v && strcmp(v, "1") == 0;
    }
    static double origin = -2;
    if (origin == -2) {
        origin = process_start_ms();
        if (origin < 0) origin = boot_ms();
    }
    double t = boot_ms() - origin;
    if (n_marks < MAX_MARKS) marks[n_marks].phase = phase, marks[n_marks++].ms = t;
    if (!enabled) return;
    char who[32];
    const char *env = getenv("OMPI_COMM_WORLD_RANK");
    if (!env) env = getenv("PMI_RANK");
    if (rank_known) snprintf(who, sizeof who, "%d", rank_value);
    else snprintf(who, sizeof who, "%s", env ? env : "-");
    double cpu = cpu_ms();
    fprintf(stderr, "gtrain: startup: rank %s: %s: %.0f ms since the process started (+%.0f ms; CPU +%.0f ms)\n", who,
            phase, t, last_ms < 0 ? t : t - last_ms, cpu - last_cpu_ms);
    fflush(stderr);
    last_ms = t;
    last_cpu_ms = cpu;
}

/* The parts of the split: each ends at the mark of that name (the marks between two of them belong
 * to the later one), in the order a start passes them. */
static const struct {
    const char *ends_at, *label;
} parts[] = {
    {GT_STARTUP_MPI, "MPI start"},
    {GT_STARTUP_CHECKED, "checks and plan"},
    {GT_STARTUP_ALLOCATED, "allocation"},
    {GT_STARTUP_RESUMED, "directory and resume"},
    {GT_STARTUP_BUFFERS, "save and snapshot buffers"},
    {GT_STARTUP_READY, "weights and banner"},
    {GT_STARTUP_FIRST_STEP, "first step"},
};

int gt_startup_split(char *out, size_t len) {
    int at = -1; /* the mark of the first step */
    for (int i = 0; i < n_marks; i++)
        if (strcmp(marks[i].phase, GT_STARTUP_FIRST_STEP) == 0) at = i;
    if (at < 0 || len == 0) return -1;
    int n = snprintf(out, len, "%.2f s from the process's start to the end of the first step (", marks[at].ms / 1e3);
    double from = 0;
    int first = 1;
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
        for (int i = 0; i <= at; i++) {
            if (strcmp(marks[i].phase, parts[p].ends_at) != 0) continue;
            if (n >= 0 && (size_t)n < len)
                n += snprintf(out + n, len - (size_t)n, "%s%s %.2f", first ? "" : ", ", parts[p].label,
                              (marks[i].ms - from) / 1e3);
            from = marks[i].ms;
            first = 0;
            break;
        }
    }
    if (n >= 0 && (size_t)n < len) snprintf(out + n, len - (size_t)n, " s)");
    return 0;
}
