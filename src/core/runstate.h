/*
 * runstate.h — what the training loop needs from training-state files and signals: where a run
 * starts (fresh or resumed), periodic and final saves, and stopping early on SIGTERM/SIGUSR1.
 * state.c owns the HDF5 file format; this is the loop's side of it, in the runstate_*.c files
 * (runstate_loop.c's top comment names the policies and the file of each).
 */
#ifndef GT_RUNSTATE_H
#define GT_RUNSTATE_H

#include <mpi.h>
#include <stdint.h>

#include "autosave.h"
#include "comm.h"
#include "config.h"
#include "model.h"
#include "optim.h"
#include "paths.h"
#include "state.h"
#include <stdio.h>

/* A run's lineage (runstate_lineage.c, "the lineage"): the identity made at its fresh start, the branch it
 * writes (a new one at every checkpoint.resume = PATH), the branches it continues ("BRANCH@STEP ...",
 * "-" for files without an identity), and the file its branch started from (its path; "" for a
 * fresh start). Every state file it saves records the first three. */
typedef struct gt_lineage {
    char run_id[24], branch[24], parents[512], from[GT_PATH_MAX];
} gt_lineage;

typedef struct gt_run_state {
    const gt_config *cfg;
    gt_comm *comm;
    MPI_Comm mpi_comm;       /* a duplicate of the trainer's communicator: MPI-IO and messages */
    gt_model *model;
    gt_optim *opt;
    uint64_t global_batch;   /* sequences per optimizer step, all ranks */
    int first_step;          /* 1 for a fresh run, saved step + 1 after a resume */
    uint64_t first_sample;   /* global sample index where step first_step starts: 0 for a fresh run,
                                the saved data cursor after a resume (which stays right when the
                                global batch changed); step s starts at
                                first_sample + (s - first_step) * global_batch */
    uint64_t tokens_seen;    /* tokens trained on before the current step */
    int last_saved_step;     /* the step of the newest state file of this run (or resumed from), 0 if none */
    int64_t skipped_steps;   /* steps skipped for a non-finite loss (train.nonfinite = skip), saved in files */
    uint64_t file_bytes;     /* the planned size of one state file (gt_state_file_bytes) */
    double last_save_time;   /* rank 0's MPI_Wtime of the start or the last save: checkpoint.every_minutes */
    int failed_saves;        /* saves in a row that failed (a full disk) or are not known to last (the
                                directory's fsync failed); checkpoint.max_failed_saves stops the run */
    gt_lineage lineage;      /* what every file this run saves records; rotation deletes only its chain */
    char *config_text;       /* gt_config_to_ini of the run, stored in every file */
    /* checkpoint.async: the save being written in the background (runstate_loop.c, asyncsave.h) */
    struct gt_async_save *writer; /* this rank's writer, made at the first asynchronous save */
    int pending_step;        /* the step it is writing; 0 when none is in flight */
    char pending_dir[64];    /* its directory of rank files in checkpoint.dir: step_N.h5.d[.K] */
    gt_state_info pending_info;
    uint64_t *pending_begins, *pending_counts; /* (world) every rank's flat range in it */
    double pending_blocked_ms; /* how long its start blocked the loop (this rank) */
    double save_blocking_ms; /* how long the last gt_runstate_after_step blocked the loop for saves started
                                or waited for in it (metrics: save_blocking_ms) */
    /* checkpoint.memory_every: this rank's memory snapshot (memsnap.h, runstate_memsnap.c) */
    struct gt_memsnap *memsnap; /* the writer; NULL when off */
    int memsnap_due;         /* checkpoint.memory_every = auto: the step boundary agreed on a snapshot after it */
    int memsnap_resumed;     /* this start resumed from memory snapshots */
    int memsnap_kept;        /* the slot the run resumed from (0, 1), kept until the next refresh; -1: none */
    int *memsnap_partner;    /* (world) each rank's partner, keeping a copy of its snapshot on the next node; -1 */
    uint64_t *memsnap_ranges; /* (2 x world) every rank's flat range (begin, count) */
    int *memsnap_dir;        /* (world) the first rank that sees the same slots' directory as each rank
                                (its node's, as the files are node-local): it reads and sends them */
    double step_seconds;     /* the time of the step gt_runstate_after_step follows (the loop sets it) */
    gt_autosave autosave;    /* rank 0: checkpoint.every = auto (autosave.h) */
    FILE *metrics;           /* rank 0: log.metrics, for one record per completed save; NULL = none */
    struct gt_tb *tb;        /* rank 0: log.tensorboard, the same record as scalars; NULL = none */
} gt_run_state;

/* Before the run is built, when it will resume: keeps the global batch (micro_batch x grad_accum x
 * world, sequences per optimizer step) of the state file it resumes from on this world size by
 * setting cfg->train.grad_accum, with one line saying so. A train.grad_accum given on the command
 * line wins, with a warning that the global batch changes; the config file's is rescaled. When micro_batch x world does not divide the saved global
 * batch: exit 2 with the numbers and the keys that would keep it. Collective over world; returns 0
 * or 2, the same on every rank, and cfg the same on every rank. With train.global_batch set it does
 * nothing: the config states the global batch, and grad_accum follows from it (gt_plan_resolve). */
int gt_runstate_keep_global_batch(gt_config *cfg, MPI_Comm world);

/* Checks checkpoint.dir (one rank per node creates it and writes a probe file in it: exit 2 with the path
 * and the OS error when it cannot; a warning when it has less free space than one state file),
 * then resumes (checkpoint.resume) or starts fresh, in the run's lineage (recorded in
 * DIR/.gtrain-lineage). Collective over world (the trainer's MPI communicator, which comm wraps).
 * Returns 0 or an exit code (2 bad config, an unusable directory, or state files of another run in
 * it; 3 unusable state file, a changed model, or a directory that cannot be listed), the same on
 * every rank. */
int gt_runstate_begin(gt_run_state *run, const gt_config *cfg, gt_comm *comm, MPI_Comm world, gt_model *model,
                      gt_optim *opt, uint64_t global_batch);

/* After optimizer step `step`: the periodic save (checkpoint.every steps, or checkpoint.every_minutes
 * since the last save by rank 0's clock, agreed), and the collective check for a stop signal, which
 * also tells whether every rank's background save has finished (then it is published here).
 * run->save_blocking_ms: how long this call blocked the loop for saves.
 * A periodic save that fails (a full disk) is reported in one line and the run goes on: the next
 * save tries again, until checkpoint.max_failed_saves saves in a row have failed: then one line names
 * the newest good file and this returns 74 (GT_EXIT_SAVES_FAILING). Returns 0 to go on, 75
 * (GT_EXIT_PREEMPTED) after saving when a signal arrived, or 1 when a signal arrived and that save
 * failed (74 when it was the max_failed_saves-th in a row). */
int gt_runstate_after_step(gt_run_state *run, int step);

/* After step `step` and its metrics line, when the run goes on: this rank's memory snapshot
 * (checkpoint.memory_every, runstate_memsnap.c) when one is due: at a multiple of a number, or under
 * auto when the step boundary agreed on it (so every rank refreshes at the same steps). No collective
 * but the partner copy: after the metrics line, so that a restart from the snapshot never misses a
 * step's line. */
void gt_runstate_snapshot(gt_run_state *run, int step);

/* After the last step: the final save. Returns 0, or 1 when it failed (the message names the
 * newest state file that is there), 74 when it was the checkpoint.max_failed_saves-th in a row. */
int gt_runstate_end(gt_run_state *run);

/* A run that stops with an error after its steps agreed on it (a non-finite loss, a failed
 * validation): completes the background save in flight, which holds an earlier, good step.
 * Collective. */
void gt_runstate_settle(gt_run_state *run);

/* "the newest state file is DIR/step_N.h5" (of this run or the one it resumed from), or that there
 * is none yet: for messages about a run that stops. */
void gt_runstate_describe_newest(const gt_run_state *run, char *out, size_t len);

void gt_runstate_free(gt_run_state *run);


#endif
