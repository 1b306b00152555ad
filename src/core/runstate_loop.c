/*
 * runstate_loop.c — the training loop's side of training-state files and signals (see runstate.h);
 * state.c owns the file format, the runstate files own the policy around it. This file: the run's
 * start and end, when to save, what to rotate, the count of failed saves, stopping on a signal.
 * The others (runstate_internal.h declares what they share):
 *
 *   runstate_dir.c       the directory checks before the first step
 *   runstate_lineage.c   the lineage and rank 0's plan for the start (which files may be resumed)
 *   runstate_resume.c    where a run starts: each candidate loaded in turn; the global batch
 *   runstate_save.c      the collective writer and the asynchronous writers, publishing
 *   runstate_files.c     the names of DIR's files, listing them, fsync, removing leftovers
 *   runstate_memsnap.c   the last step in memory: memory snapshots (checkpoint.memory_every), when
 *                        they are refreshed, resumed from and deleted
 *
 * The policies:
 *
 *   the directory        before the first step the first rank of every node creates checkpoint.dir
 *                        and writes, fsyncs and deletes a probe file in it (the dir may be
 *                        node-local): a read-only mount or a path that is a file is exit 2 with the
 *                        path and the OS error, not a lost run at the first save. Less free space
 *                        than one state file (statvfs against gt_state_file_bytes) is a warning.
 *                        Then each node's first rank writes a file named by a random token into
 *                        it and, after all have, checks that it sees every node's: a directory
 *                        that is not the same on every node (a node-local path) is exit 2 naming
 *                        the hosts that disagree.
 *   the global batch     a resume on another world size keeps the saved global batch by rescaling
 *                        grad_accum (gt_runstate_keep_global_batch, before the run is built).
 *   where a run starts   checkpoint.resume = never: fresh (a new lineage), refused where DIR holds
 *                        state files. PATH: that file, or exit 3; a new branch of its lineage. auto:
 *                        the newest complete file DIR/step_%08d.h5 of the branch DIR/.gtrain-lineage
 *                        names (see "The lineage" in runstate_lineage.c: another run's files are never resumed, and a
 *                        start beside them is exit 2); one that fails to read (checksum,
 *                        truncation) is read once more, then reported and the next older one is
 *                        tried; none usable: fresh if DIR holds no state files at all, else exit 3;
 *                        a DIR that cannot be listed is exit 3. When an older file is used, the
 *                        newer ones that failed are renamed aside to step_N.h5.bad (the first free
 *                        step_N.h5.bad.K when that name is taken; one line says so): they no longer
 *                        count toward checkpoint.keep, and gtrain never deletes them or their rank
 *                        files. A file that reads but does not fit the model
 *                        (a tensor's shape) is exit 3 at once: an older file of the same run would
 *                        not fit either. So is one saved with another value of a key that changes
 *                        what the model computes (config.c's key table marks them), checked before
 *                        any tensor is read, unless checkpoint.allow_model_change = true; any
 *                        other changed key is a note.
 *   saving               every checkpoint.every steps, every checkpoint.every_minutes (rank 0's
 *                        clock, agreed at a step boundary), at the last step, and on a stop signal.
 *                        checkpoint.async = true: in the background, one file per rank and a top
 *                        file published last (see "Asynchronous saves" in runstate_save.c). false: write
 *                        DIR/step_N.h5.tmp collectively, close; every rank fsyncs the file it
 *                        wrote (each node's client holds the pages of its own ranks), barrier;
 *                        rank 0 renames it to step_N.h5 and fsyncs DIR, so a job killed at any moment
 *                        leaves the complete new file or none (a file of the same step saved
 *                        before stays readable until the rename replaces it); only then, and only
 *                        when that fsync of DIR succeeded, are files of this run's chain beyond
 *                        checkpoint.keep deleted (never newer ones: they may be the ones a fallback
 *                        skipped, and the run will overwrite them when it gets there). Files that
 *                        failed verification were renamed aside, so only files that verified (or
 *                        that no run has found fault with) count, and the file just saved, the
 *                        newest that verified, is never deleted.
 *   a failed save        (a full disk, a quota): state.c agrees on it over the ranks; rank 0 deletes
 *                        the .tmp and says so in one line with the OS error; older files are never
 *                        touched. A periodic save that fails costs only that save: training goes
 *                        on and the next save tries again, until checkpoint.max_failed_saves saves
 *                        in a row failed (a save whose fsync of DIR failed counts: it is not known
 *                        to last): then the run stops with exit 74 naming the newest good file.
 *                        A failed final save, or a failed save on a stop signal, is exit 1 (74
 *                        when it is the max_failed_saves-th in a row) (75 would tell a batch script to requeue a run
 *                        whose state was not saved); the message names the newest file there is.
 *   the last step in memory  every checkpoint.memory_every steps (auto, the default: the interval
 *                        that pays, autosave.h, agreed in the step boundary's all-reduce) each rank
 *                        refreshes its memory snapshot in node-local shared memory (memsnap.h); checkpoint.resume = auto
 *                        takes the newest step every rank holds and verifies when it is newer than
 *                        the newest state file; the clean end deletes them (runstate_memsnap.c).
 *   stopping             SIGTERM/SIGUSR1 set a flag (signals.c); after each step the ranks agree on
 *                        it, save and return 75.
 *
 * Every decision is taken identically on all ranks: rank 0 lists the directory and broadcasts,
 * read failures are all-reduced, messages come from rank 0.
 */

#include "runstate_internal.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "asyncsave.h"
#include "memsnap.h"
#include "signals.h"
#include "startup.h"
#include "state.h"
#include "testhooks.h"
#include "watchdog.h"
#include "exitcodes.h"

int gt_runstate_begin(gt_run_state *run, const gt_config *cfg, gt_comm *comm, MPI_Comm world, gt_model *model,
                      gt_optim *opt, uint64_t global_batch) {
    memset(run, 0, sizeof *run);
    run->cfg = cfg;
    run->comm = comm;
    run->model = model;
    run->opt = opt;
    run->global_batch = global_batch;
    run->first_step = 1;
    run->memsnap_kept = -1;
    MPI_Comm_dup(world, &run->mpi_comm);
    run->config_text = gt_config_to_ini(cfg);
    if (!run->config_text) abort();
    run->file_bytes = gt_state_file_bytes(gt_model_layout(model));

    int rc = 0;
    if (cfg->checkpoint.dir[0]) rc = gt_rs_check_dir(run);
    gt_startup_mark("checkpoint.dir checked");
    if (!rc) rc = gt_rs_resume(run); /* also the lineage, and the refusal of a fresh start over another's files */
    gt_startup_mark(GT_STARTUP_RESUMED);
    /* after the resume: a run refused there (another lineage's files) leaves the directory as it was */
    if (!rc && cfg->checkpoint.dir[0] && rank_of(run) == 0) gt_rs_remove_stale_temporaries(cfg->checkpoint.dir);
    if (!rc && cfg->checkpoint.dir[0] && cfg->checkpoint.async) { /* the snapshot buffer, before step 1 */
        const gt_layout *layout = gt_model_layout(model);
        gt_shard mine = opt->shard;
        if (!opt->sharded) gt_shard_init(&mine, layout->n_params, gt_comm_size(comm), rank_of(run));
        run->writer = gt_async_save_new(opt->ops);
        gt_async_save_reserve(run->writer, mine.end - mine.begin);
        gt_startup_mark("the asynchronous writer's snapshot buffer");
    }
    if (!rc) gt_rs_memsnap_begin(run); /* the memory snapshots' slots, before step 1 */
    run->last_save_time = MPI_Wtime();
    if (!rc) /* after the resume: the history is the lineage's, and the interval counts from its step */
        gt_autosave_begin(&run->autosave, rank_of(run) == 0, cfg->checkpoint.dir, run->lineage.run_id, cfg->checkpoint.mtbf,
                          cfg->checkpoint.every == GT_INT_AUTO, (double)run->file_bytes,
                          cfg->checkpoint.memory_every == GT_INT_AUTO && run->memsnap, gt_rs_memsnap_slot_bytes(run),
                          run->first_step - 1, run->memsnap != NULL, run->memsnap_resumed);
    if (!rc) run->autosave.snap.share = cfg->checkpoint.memory_share;
    if (rc) gt_runstate_free(run);
    return rc;
}

/* Drops the oldest files beyond checkpoint.keep, counting the one just saved. Only files of this
 * run's chain (its branch and its past: "the lineage") count and go: another lineage's, an abandoned
 * branch's and one whose attributes do not read are never deleted. Files that failed verification
 * were renamed aside at the resume, so they are not counted; the one just saved is the newest that
 * verified and always among the kept. Rank 0, only after a save known to be durable. */
void gt_rs_prune(const gt_run_state *run, int64_t saved_step) {
    const gt_config *cfg = run->cfg;
    if (cfg->checkpoint.keep <= 0) return;
    int64_t *steps = NULL;
    long long n = gt_rs_list_state_files(cfg->checkpoint.dir, &steps);
    size_t kept = 0;
    char path[GT_PATH_MAX + 64];
    for (long long i = 0; i < n; i++) {
        if (steps[i] >= saved_step) { /* ours, and newer ones: see the header comment */
            if (steps[i] == saved_step) kept++;
            continue;
        }
        gt_rs_state_path(path, sizeof path, cfg->checkpoint.dir, steps[i], 0);
        gt_state_info f;
        if (gt_state_read_lineage(path, &f) != GT_STATE_OK || !gt_rs_in_chain(&run->lineage, &f)) continue;
        if (kept++ < (size_t)cfg->checkpoint.keep) continue;
        if (unlink(path) != 0) fprintf(stderr, "gtrain: cannot delete %s: %s\n", path, strerror(errno));
        gt_rs_remove_unused_rank_dirs(cfg->checkpoint.dir, steps[i], NULL); /* its rank files, if any */
    }
    free(steps);
}

/* "the newest state file is DIR/step_N.h5" or "there is no state file of this run yet". */
void gt_runstate_describe_newest(const gt_run_state *run, char *out, size_t len) {
    if (run->last_saved_step > 0) {
        char path[GT_PATH_MAX + 64];
        gt_rs_state_path(path, sizeof path, run->cfg->checkpoint.dir, run->last_saved_step, 0);
        snprintf(out, len, "the newest state file is %s", path);
    } else {
        snprintf(out, len, "there is no state file of this run yet");
    }
}

/* Saves in a row that failed: checkpoint.max_failed_saves. */
void gt_rs_count_save(gt_run_state *run, int ok) { run->failed_saves = ok ? 0 : run->failed_saves + 1; }

static int saves_failing(const gt_run_state *run) {
    int max = run->cfg->checkpoint.max_failed_saves;
    return max > 0 && run->failed_saves >= max;
}

/* What a failed save at the end or on a stop signal means: `usual`, or exit 74 when it is the
 * checkpoint.max_failed_saves-th in a row. */
static const char *last_save_then(const gt_run_state *run, const char *usual) {
    int max = run->cfg->checkpoint.max_failed_saves;
    return max > 0 && run->failed_saves + 1 >= max
               ? "exit 74 (checkpoint.max_failed_saves saves in a row failed: the storage needs a look)"
               : usual;
}

/* The run stops: checkpoint.max_failed_saves saves in a row failed. One line from rank 0 naming the
 * newest good state file. Returns 74. */
static int stop_saves_failing(const gt_run_state *run, int step) {
    if (rank_of(run) == 0) {
        char newest[GT_PATH_MAX + 128];
        gt_runstate_describe_newest(run, newest, sizeof newest);
        fprintf(stderr, "gtrain: stopping after step %d: the last %d saves failed (checkpoint.max_failed_saves = %d); "
                "%s; exit %d (make room or fix the storage, then start the run again: it resumes from there)\n",
                step, run->failed_saves, run->cfg->checkpoint.max_failed_saves, newest, GT_EXIT_SAVES_FAILING);
        fflush(stderr);
    }
    return GT_EXIT_SAVES_FAILING;
}

/* GTRAIN_TEST_STEP_DELAY_MS (tests only): a pause after every step, so that a test can kill or
 * signal a tiny run between two given steps. */
static void test_step_delay(void) {
    long ms = gt_test_hooks_get()->step_delay_ms;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int gt_runstate_after_step(gt_run_state *run, int step) {
    const gt_config *cfg = run->cfg;
    int has_dir = cfg->checkpoint.dir[0] != '\0';
    int by_steps = has_dir && cfg->checkpoint.every > 0 && step % cfg->checkpoint.every == 0;
    run->save_blocking_ms = 0;
    run->memsnap_due = 0;
    gt_autosave_step(&run->autosave, step == run->first_step, MPI_Wtime(), run->step_seconds);
    test_step_delay();
    if (step >= cfg->train.steps) return 0; /* the last step: gt_runstate_end saves, the run ends with 0 */
    /* one agreement per step: a stop signal on any rank, rank 0's clock for every_minutes, whether
     * any rank's background save is still being written, and rank 0's memory_every = auto choice */
    int busy = run->pending_step && !gt_async_save_finished(run->writer);
    int mine[4] = {gt_signals_pending(), 0, busy, 0}, all[4] = {0, 0, 0, 0};
    if (has_dir && cfg->checkpoint.every_minutes > 0 && rank_of(run) == 0)
        mine[1] = MPI_Wtime() - run->last_save_time >= cfg->checkpoint.every_minutes * 60.0;
    if (gt_autosave_due(&run->autosave, step)) mine[1] = 1; /* rank 0's choice, agreed like its clock */
    if (gt_autosave_snap_due(&run->autosave, step)) mine[3] = 1; /* every rank refreshes, or none */
    gt_watchdog_enter("stop_agreement", sizeof mine);
    MPI_Allreduce(mine, all, 4, MPI_INT, MPI_MAX, run->mpi_comm);
    gt_watchdog_leave();
    if (run->pending_step && !all[2]) gt_rs_finish_async(run, PERIODIC_THEN); /* every writer is done: publish */
    int sig = all[0];
    if (!sig) {
        int attempted = !saves_failing(run) && (by_steps || all[1]);
        double started_ms = 0;
        if (attempted) {
            gt_rs_save(run, step, PERIODIC_THEN, 0);
            if (run->pending_step == step) started_ms = run->pending_blocked_ms;
        }
        gt_autosave_after_saves(&run->autosave, step, run->save_blocking_ms / 1e3, started_ms / 1e3,
                                attempted ? step : 0, run->pending_step, run->last_saved_step);
        run->memsnap_due = all[3] && !attempted; /* a step that saves a state file takes no snapshot */
        return saves_failing(run) ? stop_saves_failing(run, step) : 0;
    }
    const char *name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGUSR1";
    if (!has_dir) {
        if (rank_of(run) == 0)
            fprintf(stderr, "gtrain: stopped by %s after step %d; checkpoint.dir is empty, so nothing was saved\n",
                    name, step);
        return GT_EXIT_FAILURE;
    }
    char why[96];
    snprintf(why, sizeof why, "stopped by %s", name);
    gt_rs_wait_async(run, why, PERIODIC_THEN);
    if (run->last_saved_step != step &&
        gt_rs_save(run, step, last_save_then(run, "exit 1 (not 75: there is no new state to resume from)"), 1) != 0)
        return saves_failing(run) ? GT_EXIT_SAVES_FAILING : GT_EXIT_FAILURE;
    gt_rs_memsnap_finish(run); /* the state file holds this step */
    if (rank_of(run) == 0) {
        printf("gtrain: stopped by %s after step %d; the state is saved, exit %d\n", name, step, GT_EXIT_PREEMPTED);
        fflush(stdout);
    }
    gt_autosave_end(&run->autosave, step); /* a stop that lost nothing: no fault in the history */
    return GT_EXIT_PREEMPTED;
}

static int end_unsnapped(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    if (!cfg->checkpoint.dir[0]) return 0;
    gt_rs_wait_async(run, "the run ends", PERIODIC_THEN); /* complete before exit */
    if (run->first_step > cfg->train.steps) return 0;    /* resumed at or past the end: nothing new */
    if (run->last_saved_step != cfg->train.steps && gt_rs_save(run, cfg->train.steps, last_save_then(run, "exit 1"), 1) != 0)
        return saves_failing(run) ? GT_EXIT_SAVES_FAILING : GT_EXIT_FAILURE;
    gt_autosave_end(&run->autosave, cfg->train.steps);
    return 0;
}

/* The final save, then (when it holds) the memory snapshots go: they never outlive the run. */
int gt_runstate_end(gt_run_state *run) {
    int rc = end_unsnapped(run);
    if (rc == 0) gt_rs_memsnap_finish(run);
    return rc;
}

void gt_runstate_snapshot(gt_run_state *run, int step) {
    const gt_config *cfg = run->cfg;
    int file_due = cfg->checkpoint.dir[0] && cfg->checkpoint.every > 0 && step % cfg->checkpoint.every == 0;
    gt_rs_memsnap_after_step(run, step, file_due); /* not at the last step: the final save follows */
}

void gt_runstate_settle(gt_run_state *run) {
    if (run->cfg && run->cfg->checkpoint.dir[0]) gt_rs_wait_async(run, "the run stops here", PERIODIC_THEN);
}

void gt_runstate_free(gt_run_state *run) {
    gt_async_save_free(run->writer); /* a run that ends with an error: its writer is joined, not published */
    gt_memsnap_close(run->memsnap);  /* its snapshots stay for the restart */
    free(run->memsnap_partner);
    free(run->memsnap_ranges);
    free(run->memsnap_dir);
    free(run->pending_begins);
    free(run->pending_counts);
    if (run->mpi_comm != MPI_COMM_NULL && run->mpi_comm != 0) MPI_Comm_free(&run->mpi_comm);
    free(run->config_text);
    memset(run, 0, sizeof *run);
}
