/*
 * trace.h — a picture of the step: Chrome trace JSON (the Trace Event Format's object form,
 * {"traceEvents": [...]}, complete events "ph":"X" with ts and dur in microseconds), which Perfetto
 * (ui.perfetto.dev) and chrome://tracing open. Two sources write it, in one scheme (docs/planner.md,
 * "A picture of the step"):
 *
 *   gtrain --plan --trace FILE   the predicted step (timemodel.h's simulation, span by span), as rank 0
 *   log.trace = FILE             the measured steps log.trace_first..log.trace_last of a run, each rank
 *                                its own file (gt_trace_rank_path: FILE.rankN, before a trailing .json)
 *
 * The scheme: pid = the rank; tid 1 = compute (the training thread: ops, and the waits for
 * communication, named "wait_" and the collective), tid 2 = communication (collectives as comm.h names
 * its calls; a measured run draws collectives that were in flight together in further lanes, tid 3,
 * 4, ...). Names: ops as ops.h names them; "step" (args.step) holds a step's "micro_batch" events
 * (args.micro), which hold its ops; "save" is the blocking part of a save after its step. args carry
 * FLOPs and bytes where they are known (the prediction's ops; every collective).
 */
#ifndef GT_TRACE_H
#define GT_TRACE_H

#include <stddef.h>

#include "calib.h"
#include "comm.h"
#include "config.h"
#include "ops.h"
#include "planner.h"

#define GT_TRACE_TID_COMPUTE 1
#define GT_TRACE_TID_COMM 2

/* One complete event. args: flops and bytes when > 0, step and micro when >= 0. */
typedef struct gt_trace_event {
    char name[48];
    const char *cat;
    int pid, tid;
    double ts_us, dur_us;
    double flops, bytes;
    int step, micro;
} gt_trace_event;

/* The writer: a file opened for writing (its missing parent directories made), events appended as
 * they come, the closing brackets at gt_trace_close. NULL and why (strerror) when it cannot be made. */
typedef struct gt_trace gt_trace;
gt_trace *gt_trace_open(const char *path, char *why, size_t why_len);
/* A metadata event: the name of process pid (tid < 0) or of its thread tid. */
void gt_trace_name(gt_trace *t, int pid, int tid, const char *name);
void gt_trace_write(gt_trace *t, const gt_trace_event *e);
/* 0, or -1 with why when a write failed (the file is closed and freed either way; NULL: 0). */
int gt_trace_close(gt_trace *t, char *why, size_t why_len);

/* `gtrain --plan --trace PATH`: the predicted step of choice's plan at calib's rates (the simulation
 * gt_plan_report_time prints), written to path. 0, or 2 with why. */
int gt_trace_plan(const char *path, const gt_plan_choice *choice, const gt_calib *calib, char *why, size_t why_len);

/* FILE of log.trace for `rank`: "run/t.json" -> "run/t.rank0.json", "run/t" -> "run/t.rank0". */
void gt_trace_rank_path(const char *file, int rank, char *out, size_t len);

/* ---- log.trace: the measured steps. One recorder per process, driven by the training thread. ----
 * Off (log.trace empty) nothing is installed: the ops table and the communicator are not wrapped, and
 * every call below returns at its first test. */

/* Opens this rank's file (each rank its own). 0; or 2 with msg naming the key, the file and why. */
int gt_trace_run_open(const gt_config *cfg, int rank, char *msg, size_t msg_len);
/* The ops table to run on: `inner` with each op, copy and synchronisation timed while a step is
 * recorded (CPU-side timestamps: on a GPU an op's span is its launch, not its kernel); `inner` itself
 * when log.trace is off. */
const gt_ops *gt_trace_run_ops(const gt_ops *inner);
/* Listens to comm's collectives and waits (comm.h gt_comm_set_span_fn) when log.trace is on. */
void gt_trace_run_comm(gt_comm *comm);
void gt_trace_step_begin(int step);
void gt_trace_step_end(int step);
void gt_trace_micro_begin(int micro);
void gt_trace_micro_end(int micro);
/* The clock the recorder draws with (seconds; 0 when off), and a save of `step` from `start` to now:
 * drawn when the step was recorded. */
double gt_trace_clock(void);
void gt_trace_save(int step, double start, double blocking_ms);
/* Writes the closing brackets; a write error is said on stderr once. */
void gt_trace_run_close(void);

#endif
