/*
 * runstate_internal.h — what the files of runstate (runstate_*.c) share; not for
 * the rest of the trainer, which includes runstate.h. runstate_loop.c's top comment names the policies
 * and the file that holds each.
 */
#ifndef GT_RUNSTATE_INTERNAL_H
#define GT_RUNSTATE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "runstate.h"

#define PERIODIC_THEN "training goes on and the next save tries again"

static inline int rank_of(const gt_run_state *run) { return gt_comm_rank(run->comm); }

/* runstate_files.c: the names and housekeeping of checkpoint.dir's files */
void gt_rs_state_path(char *out, size_t len, const char *dir, int64_t step, int tmp);
long long gt_rs_list_state_files(const char *dir, int64_t **steps_out);
int gt_rs_fsync_path(const char *path, int directory);
void gt_rs_rank_dir_name(char *out, size_t len, int64_t step, int generation);
int gt_rs_remove_rank_dir(const char *path);
int gt_rs_path_exists(const char *path);
void gt_rs_remove_unused_rank_dirs(const char *dir, int64_t step, const char *why);
void gt_rs_remove_stale_temporaries(const char *dir);
off_t gt_rs_file_size(const char *path);
void gt_rs_probe_token(char *out, size_t len, int rank);

/* runstate_dir.c: checkpoint.dir usable and the same on every node. Collective. */
int gt_rs_check_dir(gt_run_state *run);

/* runstate_lineage.c: the lineage and rank 0's plan for the start */
/* Rank 0's plan for the start: which lineage, which files to try (newest first), or an exit code. */
typedef struct start_plan {
    int code;            /* 0, 2 (another lineage's files), 3 (the directory or its record does not read) */
    char msg[GT_PATH_MAX * 4 + 1024];
    gt_lineage lineage;  /* auto: the lineage continued; PATH: the new branch; fresh: a new one */
    int fresh;           /* nothing to resume: a new lineage */
    int from_record;     /* lineage is DIR/.gtrain-lineage's, unchanged */
    int64_t *steps;      /* auto: the files of DIR to try, newest first */
    long long n;
    char from[GT_PATH_MAX]; /* auto: then this file (the branch's start outside DIR), "" = none */
    int has_record;      /* auto: DIR/.gtrain-lineage was read into `recorded` (kept when the plan is fresh) */
    gt_lineage recorded;
} start_plan;

void gt_rs_plan_start(const gt_config *cfg, int rank, start_plan *p);
void gt_rs_lineage_after_resume(const start_plan *p, const gt_state_info *f, const char *path, int rank,
                                gt_lineage *out);
void gt_rs_fresh_lineage(int rank, gt_lineage *out);
int gt_rs_write_lineage_record(const char *dir, const gt_lineage *l, char *msg, size_t len);
int gt_rs_in_chain(const gt_lineage *l, const gt_state_info *f);

/* runstate_resume.c: where the run starts. Collective. */
int gt_rs_resume(gt_run_state *run);

/* runstate_save.c: what a state file (or a memory snapshot) of `step` records besides the tensors */
void gt_rs_save_info(const gt_run_state *run, int step, gt_state_info *out);

/* runstate_memsnap.c: the memory snapshots (checkpoint.memory_every; memsnap.h) */
/* Collective, after rank 0's plan: resumes from the newest step whose snapshot every rank has and
 * verifies, when it is newer than the newest state file of the plan. 1 (resumed: *info, the
 * optimizer, one line said so) or 0 (not: one line said why when there were snapshots of the run;
 * the optimizer's master weights and moments as allocated, zeros). plan: rank 0's. */
int gt_rs_memsnap_resume(gt_run_state *run, const start_plan *plan, gt_state_info *info);
/* After the resume: the writer (when memory_every is not 0). Collective. */
void gt_rs_memsnap_begin(gt_run_state *run);
/* The bytes of one of this rank's slots (0 without snapshots). */
double gt_rs_memsnap_slot_bytes(const gt_run_state *run);
/* After step `step` (not the last): refreshes the snapshot when it is due. Per rank. */
void gt_rs_memsnap_after_step(gt_run_state *run, int step, int file_save_due);
/* The run ended cleanly (or stopped with its state saved): the slots are deleted. Per rank. */
void gt_rs_memsnap_finish(gt_run_state *run);

/* runstate_loop.c: rotation and the count of failed saves */
void gt_rs_prune(const gt_run_state *run, int64_t saved_step);
void gt_rs_count_save(gt_run_state *run, int ok);

/* runstate_save.c: the writers. Collective. */
int gt_rs_save(gt_run_state *run, int step, const char *then, int complete);
int gt_rs_finish_async(gt_run_state *run, const char *then);
int gt_rs_wait_async(gt_run_state *run, const char *why, const char *then);

#endif
