/*
 * trace.c — Chrome trace JSON of the predicted and the measured step (see trace.h). Each event is
 * made and encoded by jansson (names escaped by it); the file is the object form, written as the
 * events come: the header, the events separated by commas, the closing brackets at the end.
 */
#define _POSIX_C_SOURCE 200809L

#include "trace.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "exitcodes.h"
#include "pathmax.h"
#include "paths.h"
#include "timemodel.h"

struct gt_trace {
    FILE *f;
    int n;          /* events written */
    int failed;     /* a write failed (errno kept in err) */
    int err;
};

gt_trace *gt_trace_open(const char *path, char *why, size_t why_len) {
    char dir[GT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    struct stat st;
    if (slash && slash != dir) {
        *slash = '\0';
        if (gt_make_dirs(dir) != 0) {
            snprintf(why, why_len, "%s", strerror(errno));
            return NULL;
        }
    }
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(why, why_len, "it is a directory");
        return NULL;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(why, why_len, "%s", strerror(errno));
        return NULL;
    }
    gt_trace *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->f = f;
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
    return t;
}

static void put(gt_trace *t, json_t *ev) {
    if (!ev) abort(); /* jansson allocates: out of memory */
    if (t->n++) fputs(",\n", t->f);
    if (json_dumpf(ev, t->f, JSON_COMPACT | JSON_REAL_PRECISION(15)) != 0 || ferror(t->f)) {
        if (!t->failed) t->err = errno ? errno : EIO;
        t->failed = 1;
    }
    json_decref(ev);
}

void gt_trace_name(gt_trace *t, int pid, int tid, const char *name) {
    put(t, json_pack("{s:s,s:s,s:i,s:i,s:{s:s}}", "name", tid < 0 ? "process_name" : "thread_name", "ph", "M", "pid",
                     pid, "tid", tid < 0 ? 0 : tid, "args", "name", name));
}

void gt_trace_write(gt_trace *t, const gt_trace_event *e) {
    json_t *args = json_object();
    if (!args) abort();
    if (e->step >= 0) json_object_set_new(args, "step", json_integer(e->step));
    if (e->micro >= 0) json_object_set_new(args, "micro", json_integer(e->micro));
    if (e->flops > 0) json_object_set_new(args, "flops", json_real(e->flops));
    if (e->bytes > 0) json_object_set_new(args, "bytes", json_integer((json_int_t)e->bytes));
    put(t, json_pack("{s:s,s:s,s:s,s:i,s:i,s:f,s:f,s:o}", "name", e->name, "cat", e->cat, "ph", "X", "pid", e->pid,
                     "tid", e->tid, "ts", e->ts_us, "dur", e->dur_us > 0 ? e->dur_us : 0.0, "args", args));
}

int gt_trace_close(gt_trace *t, char *why, size_t why_len) {
    if (!t) return 0;
    fputs("\n]}\n", t->f);
    if (ferror(t->f) && !t->failed) t->failed = 1, t->err = errno ? errno : EIO;
    if (fclose(t->f) != 0 && !t->failed) t->failed = 1, t->err = errno;
    int failed = t->failed, err = t->err;
    free(t);
    if (failed) snprintf(why, why_len, "%s", strerror(err));
    return failed ? -1 : 0;
}

/* ---------------------------------------------------------------- the predicted step */

static void plan_span(void *ctx, const gt_time_span *s) {
    gt_trace_event e = {.cat = s->cat, .pid = 0, .tid = s->stream ? GT_TRACE_TID_COMM : GT_TRACE_TID_COMPUTE,
                        .ts_us = s->start_s * 1e6, .dur_us = (s->end_s - s->start_s) * 1e6, .flops = s->flops,
                        .bytes = s->bytes, .step = -1, .micro = s->micro};
    snprintf(e.name, sizeof e.name, "%s", s->name);
    if (strcmp(s->cat, "step") == 0) e.step = 1;
    gt_trace_write(ctx, &e);
}

int gt_trace_plan(const char *path, const gt_plan_choice *choice, const gt_calib *calib, char *why, size_t why_len) {
    char err[512];
    gt_trace *t = gt_trace_open(path, err, sizeof err);
    if (!t) {
        snprintf(why, why_len, "--trace: cannot write '%s': %s (expected a file path for the Chrome trace)", path, err);
        return GT_EXIT_BAD_INPUT;
    }
    gt_trace_name(t, 0, -1, "rank 0 (predicted)");
    gt_trace_name(t, 0, GT_TRACE_TID_COMPUTE, "compute");
    if (choice->shape.world > 1) gt_trace_name(t, 0, GT_TRACE_TID_COMM, "communication");
    gt_time_estimate est;
    gt_time_set_span_listener(plan_span, t);
    gt_plan_time(&choice->shape, &choice->plan, calib, &est);
    gt_time_set_span_listener(NULL, NULL);
    if (gt_trace_close(t, err, sizeof err) != 0) {
        snprintf(why, why_len, "--trace: writing '%s' failed: %s", path, err);
        return GT_EXIT_BAD_INPUT;
    }
    return 0;
}

void gt_trace_rank_path(const char *file, int rank, char *out, size_t len) {
    size_t n = strlen(file);
    if (n > 5 && strcmp(file + n - 5, ".json") == 0) snprintf(out, len, "%.*s.rank%d.json", (int)(n - 5), file, rank);
    else snprintf(out, len, "%s.rank%d", file, rank);
}

/* ---------------------------------------------------------------- the measured steps */

enum { LANES = 8 };

static struct {
    gt_trace *out;
    int rank, first, last;
    int recording;         /* a step in the window is running: ops and collectives are drawn */
    int step;              /* the step recorded last */
    pthread_t thread;      /* the training thread: the only one drawn */
    double t0;             /* the run's start on the monotonic clock */
    double step_start, micro_start;
    int micro;
    double lane_end[LANES]; /* communication lanes: the end of the last collective drawn in each */
    int lane_named[LANES];
    gt_trace_event *ev;    /* the recorded step's events, written at its end */
    int n, cap;
    char path[GT_PATH_MAX + 32]; /* log.trace with .rankN */
    const gt_ops *inner;
    gt_ops traced;
} g;

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double gt_trace_clock(void) { return g.out ? mono() : 0; }

static void add(const char *name, const char *prefix, const char *cat, int tid, double start, double end,
                double bytes) {
    if (g.n == g.cap) {
        g.cap = g.cap ? 2 * g.cap : 1024;
        g.ev = realloc(g.ev, (size_t)g.cap * sizeof *g.ev);
        if (!g.ev) abort();
    }
    gt_trace_event *e = &g.ev[g.n++];
    e->cat = cat;
    e->pid = g.rank;
    e->tid = tid;
    e->ts_us = (start - g.t0) * 1e6;
    e->dur_us = (end - start) * 1e6;
    e->flops = 0;
    e->bytes = bytes;
    e->step = -1;
    e->micro = -1;
    snprintf(e->name, sizeof e->name, "%s%s", prefix, name);
}

static int drawn(void) { return g.recording && pthread_equal(pthread_self(), g.thread); }

int gt_trace_run_open(const gt_config *cfg, int rank, char *msg, size_t msg_len) {
    if (!cfg->log.trace[0]) return 0;
    gt_trace_rank_path(cfg->log.trace, rank, g.path, sizeof g.path);
    char why[512], where[8192];
    g.out = gt_trace_open(g.path, why, sizeof why);
    if (!g.out) {
        gt_config_where(cfg, "log", "trace", where, sizeof where);
        snprintf(msg, msg_len, "%s: cannot write '%s': %s (expected a file path for rank %d's Chrome trace)", where,
                 g.path, why, rank);
        return GT_EXIT_BAD_INPUT;
    }
    g.rank = rank;
    g.first = cfg->log.trace_first;
    g.last = cfg->log.trace_last;
    g.thread = pthread_self();
    g.t0 = mono();
    char name[32];
    snprintf(name, sizeof name, "rank %d", rank);
    gt_trace_name(g.out, rank, -1, name);
    gt_trace_name(g.out, rank, GT_TRACE_TID_COMPUTE, "compute");
    return 0;
}

/* traced_<op>: the op between two readings of the clock while a step is recorded */
#define TRACE_OP(kind, op, ret, params, args, shapes)                                                      \
    static ret traced_##op params {                                                                         \
        if (!drawn()) TRACE_PASS_##ret(g.inner->op args)                                                   \
        double t0_ = mono();                                                                                \
        TRACE_BODY_##ret(g.inner->op args, #op)                                                            \
    }
#define TRACE_PASS_void(call) { call; return; }
#define TRACE_PASS_double(call) return call;
#define TRACE_BODY_void(call, name) call; add(name, "", "op", GT_TRACE_TID_COMPUTE, t0_, mono(), 0);
#define TRACE_BODY_double(call, name) \
    double result_ = call; add(name, "", "op", GT_TRACE_TID_COMPUTE, t0_, mono(), 0); return result_;
GT_OPS(TRACE_OP)
#undef TRACE_OP

#define TRACE_MEM(name, params, call)                                          \
    static void traced_##name params {                                         \
        if (!drawn()) {                                                        \
            g.inner->call;                                                     \
            return;                                                            \
        }                                                                      \
        double t0_ = mono();                                                   \
        g.inner->call;                                                         \
        add(#name, "", "op", GT_TRACE_TID_COMPUTE, t0_, mono(), 0);            \
    }
TRACE_MEM(zero, (void *ptr, size_t bytes), zero(ptr, bytes))
TRACE_MEM(copy_to_device, (void *dst, const void *src, size_t bytes), copy_to_device(dst, src, bytes))
TRACE_MEM(copy_to_host, (void *dst, const void *src, size_t bytes), copy_to_host(dst, src, bytes))
TRACE_MEM(copy, (void *dst, const void *src, size_t bytes), copy(dst, src, bytes))
TRACE_MEM(synchronize, (void), synchronize())
#undef TRACE_MEM

const gt_ops *gt_trace_run_ops(const gt_ops *inner) {
    if (!g.out) return inner;
    g.inner = inner;
    g.traced = *inner;
#define TRACE_ENTRY(kind, op, ret, params, args, shapes) g.traced.op = traced_##op;
    GT_OPS(TRACE_ENTRY)
#undef TRACE_ENTRY
    g.traced.zero = traced_zero;
    g.traced.copy_to_device = traced_copy_to_device;
    g.traced.copy_to_host = traced_copy_to_host;
    g.traced.copy = traced_copy;
    g.traced.synchronize = traced_synchronize;
    return &g.traced;
}

/* A collective: in the first communication lane free since its start; a blocking one (or a wait)
 * is the training thread's wait too. */
static void comm_span(void *ctx, int kind, const char *name, double t0, double t1, uint64_t bytes) {
    (void)ctx;
    if (!drawn()) return;
    /* t1 is a moment ago on MPI_Wtime's clock: the span ends now on ours (no offset between the
     * two clocks to drift or to misplace it before the op that came before it) */
    double b = mono(), a = b - (t1 - t0);
    if (kind != GT_COMM_SPAN_WAIT) {
        int lane = 0;
        while (lane < LANES - 1 && g.lane_end[lane] > a) lane++;
        if (g.lane_end[lane] < b) g.lane_end[lane] = b;
        if (!g.lane_named[lane]) {
            char lname[32];
            if (lane) snprintf(lname, sizeof lname, "communication %d", lane + 1);
            else snprintf(lname, sizeof lname, "communication");
            gt_trace_name(g.out, g.rank, GT_TRACE_TID_COMM + lane, lname);
            g.lane_named[lane] = 1;
        }
        add(name, "", "collective", GT_TRACE_TID_COMM + lane, a, b, (double)bytes);
    }
    if (kind == GT_COMM_SPAN_BLOCKING) add(name, "wait_", "wait", GT_TRACE_TID_COMPUTE, a, b, 0);
    if (kind == GT_COMM_SPAN_WAIT) add(name, "", "wait", GT_TRACE_TID_COMPUTE, a, b, 0);
}

void gt_trace_run_comm(gt_comm *comm) {
    if (g.out) gt_comm_set_span_fn(comm, comm_span, NULL);
}

void gt_trace_step_begin(int step) {
    if (!g.out || step < g.first || step > g.last) return;
    g.recording = 1;
    g.step = step;
    g.n = 0;
    memset(g.lane_end, 0, sizeof g.lane_end);
    g.step_start = mono();
}

void gt_trace_micro_begin(int micro) {
    if (!g.recording) return;
    g.micro = micro;
    g.micro_start = mono();
}

void gt_trace_micro_end(int micro) {
    if (!g.recording) return;
    add("micro_batch", "", "micro_batch", GT_TRACE_TID_COMPUTE, g.micro_start, mono(), 0);
    g.ev[g.n - 1].micro = micro;
}

void gt_trace_step_end(int step) {
    if (!g.recording || step != g.step) return;
    add("step", "", "step", GT_TRACE_TID_COMPUTE, g.step_start, mono(), 0);
    g.ev[g.n - 1].step = step;
    g.recording = 0;
    for (int i = 0; i < g.n; i++) {
        if (g.ev[i].step < 0) g.ev[i].step = step;
        gt_trace_write(g.out, &g.ev[i]);
    }
    g.n = 0;
    fflush(g.out->f); /* a step on disk as soon as it is done */
}

void gt_trace_save(int step, double start, double blocking_ms) {
    if (!g.out || step < g.first || step > g.last || blocking_ms <= 0) return;
    gt_trace_event e = {.name = "save", .cat = "save", .pid = g.rank, .tid = GT_TRACE_TID_COMPUTE,
                        .ts_us = (start - g.t0) * 1e6, .dur_us = (mono() - start) * 1e6, .step = step, .micro = -1};
    gt_trace_write(g.out, &e);
}

void gt_trace_run_close(void) {
    if (!g.out) return;
    char why[512];
    if (gt_trace_close(g.out, why, sizeof why) != 0) fprintf(stderr, "gtrain: log.trace: writing '%s' failed: %s\n", g.path, why);
    g.out = NULL;
    g.recording = 0;
    free(g.ev);
    g.ev = NULL;
    g.n = g.cap = 0;
}
