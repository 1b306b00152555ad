/*
 * runstate_save.c — how a save is written and published (runstate_loop.c, "saving" and "a failed
 * save"): the collective writer (a temporary file, every rank's fsync, rank 0's rename and fsync of
 * DIR), the asynchronous writers (one file per rank, the top file published last), the one line of
 * a failed save and the record of a completed one.
 */
#define _GNU_SOURCE /* fallocate */

#include "runstate_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "agree.h"
#include "asyncsave.h"
#include "bytes.h"
#include "state.h"
#include "tbevents.h"
#include "testhooks.h"
#include "watchdog.h"

/* Rank 0, before HDF5 writes the file: reserves its planned size under its temporary name, so that
 * a disk or quota without room fails here, cleanly, and not inside HDF5's collective calls (HDF5
 * 1.10 leaves the other ranks waiting in a barrier when one rank's write fails while it allocates
 * a dataset's chunks). HDF5 truncates the file and writes it right after. Where the file system
 * cannot reserve space (EOPNOTSUPP), statvfs stands in. GTRAIN_TEST_NO_RESERVE=1 (tests only)
 * skips it, to reach the failure path inside the writer. 0, or -1 with errno set. */
static int reserve_space(const char *path, const char *dir, uint64_t bytes) {
    if (gt_test_hooks_get()->no_reserve) return 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    int rc = fallocate(fd, 0, 0, (off_t)bytes);
    int err = rc ? errno : 0;
    if (rc != 0 && (err == EOPNOTSUPP || err == ENOSYS)) {
        struct statvfs st;
        rc = 0;
        if (statvfs(dir, &st) == 0 && (uint64_t)st.f_bavail * st.f_frsize < bytes) rc = -1, err = ENOSPC;
    }
    close(fd);
    if (rc != 0) {
        unlink(path);
        errno = err;
    }
    return rc;
}

/* What a state file of `step` says besides the tensors. */
void gt_rs_save_info(const gt_run_state *run, int step, gt_state_info *out) {
    const gt_config *cfg = run->cfg;
    gt_state_info info = {0};
    info.step = step;
    info.tokens_seen = run->tokens_seen;
    info.data_cursor = run->first_sample + (uint64_t)(step - run->first_step + 1) * run->global_batch;
    info.global_batch = run->global_batch;
    info.seed = cfg->train.seed;
    info.adam_step = run->opt->t;
    info.world_size = gt_comm_size(run->comm);
    info.micro_batch = cfg->train.micro_batch;
    info.grad_accum = cfg->train.grad_accum;
    info.seq_len = cfg->train.seq_len;
    info.lr = gt_lr_at(cfg, step);
    info.skipped_steps = run->skipped_steps;
    snprintf(info.shard, sizeof info.shard, "%s", gt_shard_stage_name(cfg->dist.shard));
    snprintf(info.run_id, sizeof info.run_id, "%s", run->lineage.run_id);
    snprintf(info.branch, sizeof info.branch, "%s", run->lineage.branch);
    snprintf(info.branch_parents, sizeof info.branch_parents, "%s", run->lineage.parents);
    *out = info;
}

/* After a save's rename, rank 0: the fsync of DIR that makes the new name last. When it fails the
 * file is complete but the directory may come back without it (or with a replaced file's old name):
 * the save is not known good, so it counts as a failed one (checkpoint.max_failed_saves) and nothing
 * is rotated or cleaned up after it; err says so. GTRAIN_TEST_DIR_FSYNC_EIO=1 (tests only) fails it
 * with EIO. 1 when synced, else 0. */
static int dir_synced_after_save(const char *dir, const char *path, char *err, size_t err_len) {
    int rc = gt_test_hooks_get()->dir_fsync_eio ? (errno = EIO, -1) : gt_rs_fsync_path(dir, 1);
    if (rc == 0) return 1;
    snprintf(err, err_len, "rank 0: %s: %s (fsync of the directory after the rename: %s is complete but may not "
             "last, so it is not counted as saved and no older file is deleted)", dir, strerror(errno), path);
    return 0;
}

/* The one line of a save that failed, from either writer: the step, its file, what failed (err:
 * the ranks, the file, the OS error), what was cleaned up (NULL: nothing was written), that older
 * files are untouched and which is the newest, and what the run does next (`then`). Rank 0. */
static void report_failed_save(const gt_run_state *run, int step, const char *err, const char *cleaned,
                               const char *then) {
    char path[GT_PATH_MAX + 64], newest[GT_PATH_MAX + 128];
    gt_rs_state_path(path, sizeof path, run->cfg->checkpoint.dir, step, 0);
    gt_runstate_describe_newest(run, newest, sizeof newest);
    fprintf(stderr, "gtrain: cannot save step %d to %s: %s; %s%solder state files are untouched and %s; %s\n", step,
            path, err, cleaned ? cleaned : "", cleaned ? ", " : "", newest, then);
    fflush(stderr);
}

/* One record per completed save in log.metrics (rank 0). */
static void save_record(const gt_run_state *run, int step, int async, double blocked_ms, double write_s,
                        uint64_t bytes) {
    if (run->tb) {
        gt_tb_scalar(run->tb, step, "save/write_s", write_s);
        if (write_s > 0) gt_tb_scalar(run->tb, step, "save/GB_per_s", (double)bytes / 1e9 / write_s);
        gt_tb_flush(run->tb);
    }
    if (!run->metrics) return;
    fprintf(run->metrics,
            "{\"save_step\":%d,\"save_async\":%s,\"save_blocking_ms\":%.3f,\"save_write_s\":%.3f,"
            "\"save_bytes\":%llu,\"save_gb_per_s\":%.4f}\n",
            step, async ? "true" : "false", blocked_ms, write_s, (unsigned long long)bytes,
            write_s > 0 ? (double)bytes / 1e9 / write_s : 0.0);
    fflush(run->metrics);
}

/* Writes DIR/step_N.h5 atomically and collectively (checkpoint.async = false). Collective. Returns
 * 0, or -1 when it failed on some rank (a full disk): then the .tmp is deleted, older files are
 * untouched, and rank 0 has printed one line ending in `then` (what the run does next). */
static int save_sync(gt_run_state *run, int step, const char *then) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run);
    char tmp[GT_PATH_MAX + 64], final_path[GT_PATH_MAX + 64];
    gt_rs_state_path(tmp, sizeof tmp, cfg->checkpoint.dir, step, 1);
    gt_rs_state_path(final_path, sizeof final_path, cfg->checkpoint.dir, step, 0);
    gt_state_info info;
    gt_rs_save_info(run, step, &info);

    run->opt->ops->synchronize();
    gt_watchdog_phase_begin("save", run->file_bytes); /* a rank stuck in it is named (watchdog.h) */
    double t0 = MPI_Wtime();
    char err[3 * GT_PATH_MAX] = "", cleaned[GT_PATH_MAX + 160] = "its temporary file is deleted";
    int ok = 1;
    if (rank == 0 && reserve_space(tmp, cfg->checkpoint.dir, run->file_bytes) != 0) {
        char need[32];
        gt_format_bytes(run->file_bytes, need, sizeof need);
        snprintf(err, sizeof err, "%s (reserving %s for it)", strerror(errno), need);
        ok = 0;
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, run->mpi_comm);
    if (ok) ok = gt_state_write(tmp, run->mpi_comm, run->opt, run->config_text, &info, err, sizeof err) == 0;
    /* Data first, then the name: after a crash the name never points at missing data. Every rank
     * fsyncs the file it wrote: on a parallel file system (Lustre, GPFS) each node's client holds
     * the pages its own ranks wrote, rank 0's fsync reaches only its own, and MPI-IO's close syncs
     * nothing. A failure on any rank is the save's, naming the ranks. */
    if (ok) {
        char mine[1024] = "";
        int failed = gt_rs_fsync_path(tmp, 0) != 0;
        if (failed) snprintf(mine, sizeof mine, "%s (fsync of the temporary file)", strerror(errno));
        if (gt_agree_on_failed_ranks(run->mpi_comm, failed, mine, sizeof mine)) {
            snprintf(err, sizeof err, "%s", mine);
            ok = 0;
        }
    }
    MPI_Barrier(run->mpi_comm); /* every rank has closed the file and made its pages durable */
    if (rank == 0) {
        if (ok && rename(tmp, final_path) != 0) {
            snprintf(err, sizeof err, "%s (making it durable: rename)", strerror(errno));
            ok = 0;
        }
        if (!ok && unlink(tmp) != 0 && errno != ENOENT)
            snprintf(cleaned, sizeof cleaned, "its temporary file %s could not be deleted (%s; the next start "
                     "deletes it)", tmp, strerror(errno));
        if (ok && !dir_synced_after_save(cfg->checkpoint.dir, final_path, err, sizeof err))
            ok = -1; /* the file is complete; only its rename may not last */
        if (ok == 1) gt_rs_remove_unused_rank_dirs(cfg->checkpoint.dir, step, NULL); /* an asynchronous save it replaced */
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, run->mpi_comm);
    gt_watchdog_phase_end();
    double seconds = MPI_Wtime() - t0;
    run->last_save_time = MPI_Wtime();
    gt_rs_count_save(run, ok == 1);
    if (ok != 1) {
        if (rank == 0) report_failed_save(run, step, err, ok ? NULL : cleaned, then);
        return -1;
    }
    run->last_saved_step = step;
    if (rank == 0) {
        double gb = (double)gt_rs_file_size(final_path) / 1e9;
        printf("gtrain: saved %s: %.3f GB in %.2f s (%.2f GB/s)\n", final_path, gb, seconds,
               seconds > 0 ? gb / seconds : 0.0);
        fflush(stdout);
        save_record(run, step, 0, seconds * 1e3, seconds, (uint64_t)gt_rs_file_size(final_path));
        gt_rs_prune(run, step);
    }
    run->save_blocking_ms += seconds * 1e3;
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * Asynchronous saves (checkpoint.async = true)
 *
 * start_async: rank 0 makes DIR/step_N.h5.d (step_N.h5.d.K when an older save of the same step
 * still uses that name: it stays intact until the new top file replaces it, by a rename, and its
 * directory is deleted after); every rank copies its slice into its host buffer and starts its
 * writer thread (asyncsave.h) on that directory's rank_R.h5: the copy is all the loop waits for.
 * At each later step boundary one all-reduce (in gt_runstate_after_step, with the stop flag) tells
 * whether every writer has finished; then finish_async joins, agrees on failures, naming every
 * failing rank (gt_agree_on_failed_ranks), and rank 0 writes the top file DIR/step_N.h5.tmp (virtual
 * datasets over the rank files), fsyncs it, renames it to step_N.h5 and fsyncs DIR: the top file
 * appears last, so a reader never sees a half-written state. A writer that fails (a full disk on one
 * rank) only finishes early: nobody waits in a collective for it, and its save is reported and its
 * rank files deleted. A save due while one is in flight waits for it (one line says how long).
 * ---------------------------------------------------------------------------------------------- */

/* Starts the save of `step`. Collective. -1 (with one line from rank 0) when DIR/step_N.h5.d cannot
 * be made; else 0, with the save in flight on every rank. */
static int start_async(gt_run_state *run, int step, const char *then) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run), world = gt_comm_size(run->comm);
    double t0 = MPI_Wtime();
    char dir[GT_PATH_MAX + 64], file[GT_PATH_MAX + 96], err[GT_PATH_MAX + 256] = "";
    int ok = 1;
    if (rank == 0) {
        /* A save of this step may be there already (a run resumed from an older file): it stays
         * usable until the new top file replaces it by a rename, so the rank files go into a
         * directory no state file names yet. */
        int generation = 0;
        do {
            gt_rs_rank_dir_name(run->pending_dir, sizeof run->pending_dir, step, generation++);
            snprintf(dir, sizeof dir, "%s/%s", cfg->checkpoint.dir, run->pending_dir);
        } while (gt_rs_path_exists(dir) && generation < 1000);
        if (mkdir(dir, 0777) != 0) {
            snprintf(err, sizeof err, "rank 0: %s: %s (mkdir)", dir, strerror(errno));
            ok = 0;
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, run->mpi_comm);
    if (!ok) {
        if (rank == 0) report_failed_save(run, step, err, NULL, then);
        gt_rs_count_save(run, 0);
        return -1;
    }
    MPI_Bcast(run->pending_dir, (int)sizeof run->pending_dir, MPI_CHAR, 0, run->mpi_comm);
    snprintf(dir, sizeof dir, "%s/%s", cfg->checkpoint.dir, run->pending_dir);
    /* the part of the flat vector each rank writes: its own slice with ZeRO, else the one it would own */
    const gt_layout *layout = gt_model_layout(run->model);
    gt_shard mine = run->opt->shard;
    if (!run->opt->sharded) gt_shard_init(&mine, layout->n_params, world, rank);
    uint64_t range[2] = {mine.begin, mine.end - mine.begin};
    if (!run->pending_begins) {
        run->pending_begins = calloc((size_t)world, sizeof(uint64_t));
        run->pending_counts = calloc((size_t)world, sizeof(uint64_t));
        if (!run->pending_begins || !run->pending_counts) abort();
    }
    uint64_t *all = malloc(2 * (size_t)world * sizeof *all);
    if (!all) abort();
    MPI_Allgather(range, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, run->mpi_comm);
    for (int r = 0; r < world; r++) run->pending_begins[r] = all[2 * r], run->pending_counts[r] = all[2 * r + 1];
    free(all);

    gt_rs_save_info(run, step, &run->pending_info);
    if (!run->writer) run->writer = gt_async_save_new(run->opt->ops);
    snprintf(file, sizeof file, "%s/rank_%05d.h5", dir, rank);
    gt_async_save_start(run->writer, run->opt, range[0], range[1], &run->pending_info, rank, file);
    run->pending_step = step;
    run->last_save_time = MPI_Wtime();
    run->pending_blocked_ms = (MPI_Wtime() - t0) * 1e3;
    run->save_blocking_ms += run->pending_blocked_ms;
    return 0;
}

/* Rank 0: the top file, durably, under its final name. 0, -1 with err, or 1 with err when it is there
 * but the fsync of the directory failed (dir_synced_after_save). */
static int publish_top(gt_run_state *run, char *err, size_t err_len) {
    const gt_config *cfg = run->cfg;
    int step = run->pending_step;
    char tmp[GT_PATH_MAX + 64], top[GT_PATH_MAX + 64], dir[GT_PATH_MAX + 64];
    const char *rel = run->pending_dir;
    gt_rs_state_path(tmp, sizeof tmp, cfg->checkpoint.dir, step, 1);
    gt_rs_state_path(top, sizeof top, cfg->checkpoint.dir, step, 0);
    snprintf(dir, sizeof dir, "%s/%s", cfg->checkpoint.dir, rel);
    if (gt_rs_fsync_path(dir, 1) != 0) { /* the rank files' names, before a top file names them */
        snprintf(err, err_len, "rank 0: %s: %s (fsync)", dir, strerror(errno));
        return -1;
    }
    char why[900];
    if (gt_state_write_top(tmp, rel, gt_model_layout(run->model), gt_comm_size(run->comm), run->pending_begins,
                           run->pending_counts, run->config_text, &run->pending_info, why, sizeof why) != 0) {
        snprintf(err, err_len, "rank 0: %s: %s", tmp, why);
        unlink(tmp);
        return -1;
    }
    if (gt_rs_fsync_path(tmp, 0) != 0 || rename(tmp, top) != 0) {
        snprintf(err, err_len, "rank 0: %s: %s (fsync and rename)", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return dir_synced_after_save(cfg->checkpoint.dir, top, err, err_len) ? 0 : 1;
}

/* Completes the save in flight: waits for this rank's writer (at once when the step-boundary
 * agreement said all have finished), agrees, publishes or cleans up. Collective. 0 or -1 (reported
 * in one line ending in `then`). */
static int finish_async_unwatched(gt_run_state *run, const char *then) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run), step = run->pending_step;
    uint64_t bytes = 0;
    double write_s = 0;
    char err[6144];
    int code = gt_agree_on_failed_ranks(run->mpi_comm,
                                        gt_async_save_join(run->writer, &bytes, &write_s, err, sizeof err) != 0, err,
                                        sizeof err);
    int published = 0; /* rank 0: the top file is there (1), and may not last (fsync of DIR failed) */
    if (!code && rank == 0) {
        int rc = publish_top(run, err, sizeof err);
        code = rc != 0, published = rc == 1;
    }
    run->pending_step = 0;
    int failed_on_0 = code;
    MPI_Bcast(&failed_on_0, 1, MPI_INT, 0, run->mpi_comm);
    code |= failed_on_0;
    double sums[2] = {(double)bytes, write_s}, totals[2];
    MPI_Allreduce(&sums[0], &totals[0], 1, MPI_DOUBLE, MPI_SUM, run->mpi_comm);
    MPI_Allreduce(&sums[1], &totals[1], 1, MPI_DOUBLE, MPI_MAX, run->mpi_comm);
    char top[GT_PATH_MAX + 64], dir[GT_PATH_MAX + 64];
    gt_rs_state_path(top, sizeof top, cfg->checkpoint.dir, step, 0);
    snprintf(dir, sizeof dir, "%s/%s", cfg->checkpoint.dir, run->pending_dir);
    gt_rs_count_save(run, code == 0); /* (checkpoint.every_minutes counts from the copy: start_async) */
    if (code) {
        if (rank == 0 && published) report_failed_save(run, step, err, NULL, then); /* its files stay */
        else if (rank == 0) {
            char cleaned[GT_PATH_MAX + 160] = "its partial files are deleted";
            if (gt_rs_remove_rank_dir(dir) != 0) /* only its own: an older save of this step maps onto its directory */
                snprintf(cleaned, sizeof cleaned, "its partial files in %s could not be deleted (%s; the next start "
                         "deletes them)", dir, strerror(errno));
            report_failed_save(run, step, err, cleaned, then);
        }
        return -1;
    }
    run->last_saved_step = step;
    if (rank == 0) {
        uint64_t all_bytes = (uint64_t)totals[0] + (uint64_t)gt_rs_file_size(top);
        double gb = (double)all_bytes / 1e9;
        printf("gtrain: saved %s (%d rank files in %s): %.3f GB written in the background in %.2f s (%.2f GB/s); "
               "the loop was blocked %.0f ms\n", top, gt_comm_size(run->comm), dir, gb, totals[1],
               totals[1] > 0 ? gb / totals[1] : 0.0, run->pending_blocked_ms);
        fflush(stdout);
        save_record(run, step, 1, run->pending_blocked_ms, totals[1], all_bytes);
        gt_rs_remove_unused_rank_dirs(cfg->checkpoint.dir, step, NULL); /* an older save of this step it replaced */
        gt_rs_prune(run, step);
    }
    return 0;
}

/* The wait for the writers and the publish are one watchdog operation "save", like a synchronous
 * save: a rank whose writer never returns (a hung file system) is named with it, by the others
 * blocked in the agreement. */
int gt_rs_finish_async(gt_run_state *run, const char *then) {
    gt_watchdog_phase_begin("save", run->file_bytes);
    int rc = finish_async_unwatched(run, then);
    gt_watchdog_phase_end();
    return rc;
}

/* A save in flight must be complete before the next starts, the run stops or ends: waits for it
 * and says how long, when it made the loop wait. Collective; finish_async's result (0 when none). */
int gt_rs_wait_async(gt_run_state *run, const char *why, const char *then) {
    if (!run->pending_step) return 0;
    double t0 = MPI_Wtime();
    int pending = run->pending_step, rc = gt_rs_finish_async(run, then);
    double waited = MPI_Wtime() - t0;
    run->save_blocking_ms += waited * 1e3;
    if (rank_of(run) == 0 && waited >= 0.001) {
        printf("gtrain: %s: waited %.2f s for the save of step %d to finish\n", why, waited, pending);
        fflush(stdout);
    }
    return rc;
}

/* Saves `step`: collectively at once (checkpoint.async = false), or in the background; with
 * `complete`, returns only when the asynchronous save is published too. Collective. 0 or -1. */
int gt_rs_save(gt_run_state *run, int step, const char *then, int complete) {
    if (!run->cfg->checkpoint.async) return save_sync(run, step, then);
    char why[96];
    snprintf(why, sizeof why, "the save of step %d is due", step);
    gt_rs_wait_async(run, why, PERIODIC_THEN); /* never two writers on one rank */
    if (start_async(run, step, then) != 0) return -1;
    return complete ? gt_rs_wait_async(run, "the run ends or stops here", then) : 0;
}
