/*
 * runstate_resume.c — where a run starts (runstate_loop.c, "where a run starts" and "the global
 * batch"): the saved config compared key by key, each candidate of the plan (runstate_lineage.c)
 * loaded in turn on every rank, the files that failed set aside, the lineage recorded; and the
 * global batch kept across world sizes by rescaling grad_accum before the run is built.
 */

#include "runstate_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "errmsg.h"
#include "startup.h"
#include "state.h"
#include "testhooks.h"
#include "exitcodes.h"

/* ------------------------------------------------------------------------------------------------
 * What changed since the save
 * ---------------------------------------------------------------------------------------------- */

/* What changed since the save, from gt_config_changes: the keys that change the model's function
 * (config.c's table says which) as the refusal names them and as the note names them, the rest. */
typedef struct changes {
    char refusal[2048], model[2048], other[4096];
} changes;

static void note_change(void *user, const char *key, int changes_model, const char *was, const char *now) {
    changes *c = user;
    was = was[0] ? was : "\"\"";
    now = now[0] ? now : "\"\"";
    if (changes_model) {
        gt_appendf(c->refusal, sizeof c->refusal, "%s%s: the state file has %s, the config %s", c->refusal[0] ? "; " : "",
               key, was, now);
        gt_appendf(c->model, sizeof c->model, "%s%s: %s -> %s", c->model[0] ? ", " : "", key, was, now);
    } else {
        gt_appendf(c->other, sizeof c->other, "%s%s: %s -> %s", c->other[0] ? ", " : "", key, was, now);
    }
}

/* Reads the file's /config (config.c's parser) and compares it with this run's, before any tensor is
 * read: a changed model key is named by key ("model.n_layers: the state file has 4, the config 6"),
 * all of them in one message, and refused unless checkpoint.allow_model_change = true. A /config
 * this gtrain cannot parse (a key since removed) is reported and not compared: the tensors' shapes
 * are still checked when they are read. */
static int compare_config(const gt_run_state *run, const char *path, changes *ch, char *err, size_t err_len) {
    memset(ch, 0, sizeof *ch);
    char *text = NULL;
    int code = gt_state_read_config(path, &text, err, err_len);
    if (code) return code;
    gt_config saved;
    char name[GT_PATH_MAX + 128], msg[2048];
    snprintf(name, sizeof name, "%s:/config", path);
    if (gt_config_load_string(&saved, text, name, 0, NULL, msg, sizeof msg) == 0)
        gt_config_changes(&saved, run->cfg, note_change, ch);
    else
        snprintf(ch->other, sizeof ch->other, "(the saved config is not compared: %s)", msg);
    free(text);
    if (ch->refusal[0] && !run->cfg->checkpoint.allow_model_change) {
        snprintf(err, err_len,
                 "%s: the model changed since the save: %s (these keys change what the model computes; set "
                 "checkpoint.allow_model_change = true to resume anyway)",
                 path, ch->refusal);
        return GT_STATE_INCOMPATIBLE;
    }
    return GT_STATE_OK;
}

/* A state file's bytes on disk: the file, and the rank files of a top file (path.d). */
static uint64_t state_bytes(const char *path) {
    uint64_t bytes = (uint64_t)gt_rs_file_size(path);
    char dir[GT_PATH_MAX + 80], file[GT_PATH_MAX + 340];
    snprintf(dir, sizeof dir, "%s.d", path);
    DIR *d = opendir(dir);
    if (!d) return bytes;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
        bytes += (uint64_t)gt_rs_file_size(file);
    }
    closedir(d);
    return bytes;
}

/* GTRAIN_TEST_READ_FAILS_ONCE=R (tests only): the first state file read on rank R fails, as a
 * transient I/O error (EIO, ESTALE) would. */
static int test_read_fails_once(int rank) {
    static int fired = 0;
    if (fired || gt_test_hooks_get()->read_fails_once_rank != rank) return 0;
    fired = 1;
    return 1;
}

/* Tries to load one file on every rank. Returns GT_STATE_* (agreed) and the message in err. */
static int try_load(gt_run_state *run, const char *path, gt_state_info *info, char *err, size_t err_len) {
    changes ch;
    double t0 = MPI_Wtime();
    /* every rank reads the same /config, so every rank reaches the same verdict */
    int code = gt_agree_on_failure(run->mpi_comm, compare_config(run, path, &ch, err, err_len), err, err_len);
    if (code) return code;
    gt_startup_mark("resume: the saved config compared");
    char *saved_config = NULL;
    code = gt_state_read(path, run->opt, info, &saved_config, err, err_len);
    free(saved_config);
    gt_startup_mark("resume: the slice read and verified (rank files, checksums, finite values)");
    if (!code && test_read_fails_once(rank_of(run))) {
        snprintf(err, err_len, "%s: rank %d: an injected read error (GTRAIN_TEST_READ_FAILS_ONCE)", path, rank_of(run));
        code = GT_STATE_UNREADABLE;
    }
    code = gt_agree_on_failure(run->mpi_comm, code, err, err_len);
    if (code) return code;
    const gt_config *cfg = run->cfg;

    gt_optim_publish_params(run->opt);
    run->opt->ops->synchronize();
    MPI_Barrier(run->mpi_comm);
    double seconds = MPI_Wtime() - t0;
    gt_startup_mark("resume: the parameters published (and every rank done reading)");

    int world = gt_comm_size(run->comm);
    if (rank_of(run) == 0) {
        double gb = (double)state_bytes(path) / 1e9;
        printf("gtrain: resumed from %s (step %lld): %.3f GB read in %.2f s (%.2f GB/s)\n", path,
               (long long)info->step, gb, seconds, seconds > 0 ? gb / seconds : 0.0);
        if (info->world_size != world || strcmp(info->shard, gt_shard_stage_name(cfg->dist.shard)) != 0)
            printf("gtrain: saved by %d rank%s with shard %s, now %d rank%s with shard %s: each rank read its own "
                   "slice of the logical tensors\n",
                   info->world_size, info->world_size == 1 ? "" : "s", info->shard, world, world == 1 ? "" : "s",
                   gt_shard_stage_name(cfg->dist.shard));
        if (info->global_batch != run->global_batch)
            printf("gtrain: global batch %llu -> %llu sequences per step: the data continues at sample %llu of "
                   "the global order\n",
                   (unsigned long long)info->global_batch, (unsigned long long)run->global_batch,
                   (unsigned long long)info->data_cursor);
        if (ch.model[0])
            printf("gtrain: the model changed since the save (checkpoint.allow_model_change = true): %s\n",
                   ch.model);
        if (ch.other[0]) printf("gtrain: changed since the save: %s\n", ch.other);
        fflush(stdout);
    }
    return GT_STATE_OK;
}

/* Files that failed verification while an older one was usable: renamed aside to step_N.h5.bad,
 * out of checkpoint.keep's count and out of every later resume's way; reported in one line. An
 * earlier set-aside of the same step keeps its name: this one takes the first free step_N.h5.bad.K
 * (K = 2, 3, ...), so no .bad file is ever replaced. Rank 0 (the only rank that renames in DIR). */
static void move_aside(const char *dir, const int64_t *steps, size_t n) {
    if (!n) return;
    char line[4096] = "";
    for (size_t i = 0; i < n; i++) {
        char path[GT_PATH_MAX + 64], bad[GT_PATH_MAX + 96];
        gt_rs_state_path(path, sizeof path, dir, steps[i], 0);
        snprintf(bad, sizeof bad, "%s.bad", path);
        for (int k = 2; gt_rs_path_exists(bad) && k < 1000000; k++) snprintf(bad, sizeof bad, "%s.bad.%d", path, k);
        if (!gt_rs_path_exists(bad) && rename(path, bad) == 0)
            gt_appendf(line, sizeof line, "%s%s -> %s", line[0] ? ", " : "", path, bad);
        else
            gt_appendf(line, sizeof line, "%s%s (cannot rename: %s)", line[0] ? ", " : "", path,
                       gt_rs_path_exists(bad) ? "no free .bad name" : strerror(errno));
    }
    if (gt_rs_fsync_path(dir, 1) != 0)
        gt_appendf(line, sizeof line, " (fsync of %s: %s)", dir, strerror(errno));
    fprintf(stderr, "gtrain: set aside %zu state file%s that failed verification: %s (not counted toward "
            "checkpoint.keep; gtrain never deletes them)\n", n, n == 1 ? "" : "s", line);
    fflush(stderr);
}

/* Where the run starts and in which lineage: rank 0 plans (plan_start), every rank loads the
 * candidates in turn (each that fails to read is read once more before the next older one is
 * tried: a transient error on one rank must not demote the newest file), rank 0 records the
 * lineage. Returns 0 (resumed, or a fresh start), 2 (another lineage's files; the record cannot be
 * written) or 3, the same on every rank. */
int gt_rs_resume(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run);
    int explicit_path = gt_config_resume(cfg) == GT_RESUME_PATH;
    const char *dir = cfg->checkpoint.dir;
    start_plan *plan = calloc(1, sizeof *plan);
    if (!plan) abort();
    if (rank == 0 && (dir[0] || explicit_path)) gt_rs_plan_start(cfg, rank, plan);
    else if (rank == 0) gt_rs_fresh_lineage(rank, &plan->lineage), plan->fresh = 1;
    long long head[3] = {plan->code, plan->fresh, plan->n};
    MPI_Bcast(head, 3, MPI_LONG_LONG, 0, run->mpi_comm);
    if (head[0]) {
        if (rank == 0) {
            fprintf(stderr, "gtrain: %s\n", plan->msg);
            fflush(stderr);
        }
        free(plan->steps);
        free(plan);
        return (int)head[0];
    }
    int fresh = (int)head[1];
    long long n = head[2];
    if (rank != 0) {
        plan->steps = malloc((size_t)(n ? n : 1) * sizeof *plan->steps);
        if (!plan->steps) abort();
    }
    if (n) MPI_Bcast(plan->steps, (int)n, MPI_INT64_T, 0, run->mpi_comm);
    MPI_Bcast(plan->from, (int)sizeof plan->from, MPI_CHAR, 0, run->mpi_comm);

    char path[GT_PATH_MAX + 64], err[GT_PATH_MAX + 4096];
    gt_state_info info;
    memset(&info, 0, sizeof info);
    int code = GT_STATE_OK;
    long long i = 0, candidates = explicit_path ? 1 : n + (plan->from[0] ? 1 : 0);
    gt_startup_mark("resume: the lineage and the state files listed");
    /* a memory snapshot newer than the newest file (runstate_memsnap.c) comes first */
    int from_memory = explicit_path ? 0 : gt_rs_memsnap_resume(run, plan, &info);
    if (from_memory) fresh = 0;
    if (!fresh && !from_memory) {
        code = GT_STATE_UNREADABLE;
        for (; i < candidates; i++) {
            if (explicit_path) snprintf(path, sizeof path, "%s", cfg->checkpoint.resume);
            else if (i < n) gt_rs_state_path(path, sizeof path, dir, plan->steps[i], 0);
            else snprintf(path, sizeof path, "%s", plan->from);
            code = try_load(run, path, &info, err, sizeof err);
            if (code == GT_STATE_UNREADABLE) { /* once more: a transient error is no reason to demote it */
                if (rank == 0) {
                    fprintf(stderr, "gtrain: unusable state file: %s; reading it once more\n", err);
                    fflush(stderr);
                }
                code = try_load(run, path, &info, err, sizeof err);
            }
            if (code == GT_STATE_OK) break;
            if (rank == 0) {
                if (code == GT_STATE_INCOMPATIBLE)
                    fprintf(stderr, "gtrain: cannot resume: %s\n", err);
                else if (i + 1 < candidates)
                    fprintf(stderr, "gtrain: unusable state file: %s; trying the next older one\n", err);
                else
                    fprintf(stderr, "gtrain: unusable state file: %s\n", err);
                fflush(stderr);
            }
            if (code == GT_STATE_INCOMPATIBLE) break;
        }
    }
    /* the files of DIR before the usable one all failed to read: set them aside (when none is usable
     * they stay where they are, and the run stops with exit 3 for a person to look) */
    if (code == GT_STATE_OK && !fresh && !explicit_path && !from_memory && rank == 0)
        move_aside(dir, plan->steps, (size_t)(i < n ? i : n));
    if (code != GT_STATE_OK) {
        if (rank == 0 && code == GT_STATE_UNREADABLE && !explicit_path)
            fprintf(stderr, "gtrain: no usable state file in %s (remove them, or set checkpoint.dir to a new "
                    "directory, to start fresh)\n", dir);
        free(plan->steps);
        free(plan);
        return GT_EXIT_BAD_STATE;
    }

    /* the lineage this run writes, recorded in DIR before any save */
    int rc = 0;
    char msg[GT_PATH_MAX + 512] = "";
    int64_t newest_file = n ? plan->steps[0] : 0; /* (rank 0's plan; broadcast with the steps) */
    if (rank == 0) {
        if (from_memory) run->lineage = plan->recorded;
        else if (fresh) run->lineage = plan->lineage;
        else gt_rs_lineage_after_resume(plan, &info, path, rank, &run->lineage);
        int same = plan->from_record && memcmp(&run->lineage, &plan->lineage, sizeof run->lineage) == 0;
        if (dir[0] && !same && gt_rs_write_lineage_record(dir, &run->lineage, msg, sizeof msg) != 0) rc = GT_EXIT_BAD_INPUT;
        if (rc) fprintf(stderr, "gtrain: %s\n", msg);
        else if (explicit_path && dir[0])
            printf("gtrain: a new branch of run %s from %s (step %lld): checkpoint.resume = auto continues it, not "
                   "the newer files of the branch it leaves\n", run->lineage.run_id, path, (long long)info.step);
        fflush(stdout);
        fflush(stderr);
    }
    free(plan->steps);
    free(plan);
    MPI_Bcast(&rc, 1, MPI_INT, 0, run->mpi_comm);
    MPI_Bcast(&run->lineage, (int)sizeof run->lineage, MPI_BYTE, 0, run->mpi_comm);
    if (rc || fresh) return rc;

    run->opt->t = (int)info.adam_step;
    run->first_step = (int)info.step + 1;
    run->first_sample = info.data_cursor;
    run->tokens_seen = info.tokens_seen;
    run->skipped_steps = info.skipped_steps;
    /* the final save is skipped when it would rewrite the file we came from */
    char own[GT_PATH_MAX + 64];
    gt_rs_state_path(own, sizeof own, dir, info.step, 0);
    if (from_memory) run->last_saved_step = (int)newest_file; /* the files on disk are as they were */
    else if (dir[0] && strcmp(own, path) == 0) run->last_saved_step = (int)info.step;
    if (rank == 0) {
        if (run->first_step > cfg->train.steps)
            printf("gtrain: the state is at step %lld, train.steps = %d: nothing left to train\n", (long long)info.step,
                   cfg->train.steps);
        else
            printf("gtrain: continuing at step %d, sample %llu\n", run->first_step,
                   (unsigned long long)run->first_sample);
        fflush(stdout);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * The global batch across world sizes
 * ---------------------------------------------------------------------------------------------- */

/* The file a resume would start from, its attributes only: checkpoint.resume = PATH, or the newest
 * file in checkpoint.dir whose attributes read (the one gt_rs_resume() will try first unless its tensors
 * then fail). 0, or -1 when there is none to look at. Rank 0. */
static int peek_resume_file(const gt_config *cfg, gt_state_info *info, char *path, size_t path_len) {
    char err[GT_PATH_MAX + 1024];
    if (gt_config_resume(cfg) == GT_RESUME_PATH) {
        snprintf(path, path_len, "%s", cfg->checkpoint.resume);
        return gt_state_read_info(path, info, err, sizeof err) == GT_STATE_OK ? 0 : -1;
    }
    start_plan *plan = calloc(1, sizeof *plan);
    if (!plan) abort();
    gt_rs_plan_start(cfg, 0, plan); /* a refusal (another lineage's files) is reported by the resume */
    int found = -1;
    for (long long i = 0; !plan->code && !plan->fresh && i <= plan->n && found; i++) {
        if (i < plan->n) gt_rs_state_path(path, path_len, cfg->checkpoint.dir, plan->steps[i], 0);
        else if (plan->from[0]) snprintf(path, path_len, "%s", plan->from);
        else break;
        if (gt_state_read_info(path, info, err, sizeof err) == GT_STATE_OK) found = 0;
    }
    free(plan->steps);
    free(plan);
    return found;
}

/* What keeps the global batch G on `world` ranks when micro_batch x world does not divide it: the
 * largest micro_batch up to the current one that divides G / world (so no more activation memory),
 * with the grad_accum that completes it. 0 when G is not a multiple of world: nothing keeps it. */
static int fitting_micro_batch(uint64_t G, int world, int micro_batch) {
    if (G % (uint64_t)world) return 0;
    uint64_t per_rank = G / (uint64_t)world;
    for (int b = micro_batch; b >= 1; b--)
        if (per_rank % (uint64_t)b == 0) return b;
    return 0;
}

/* Rank 0's verdict for gt_runstate_keep_global_batch: 0 with *grad_accum set, or 2 with msg. */
static int decide_grad_accum(const gt_config *cfg, int world, int *grad_accum, char *msg, size_t len) {
    gt_state_info info;
    char path[GT_PATH_MAX + 64], where[GT_PATH_MAX + 128];
    *grad_accum = cfg->train.grad_accum;
    if (peek_resume_file(cfg, &info, path, sizeof path) != 0 || info.global_batch == 0) return 0;
    uint64_t G = info.global_batch, B = (uint64_t)cfg->train.micro_batch, A = (uint64_t)cfg->train.grad_accum;
    if (B * A * (uint64_t)world == G) return 0;
    char saved[256];
    snprintf(saved, sizeof saved, "%d rank%s x micro_batch %d x grad_accum %d", info.world_size,
             info.world_size == 1 ? "" : "s", info.micro_batch, info.grad_accum);
    gt_config_where(cfg, "train", "grad_accum", where, sizeof where);
    /* Only the command line is a choice made for this run. A config file is the job's description,
     * reused as-is when the job comes back on fewer or more ranks (shipped configs write every key),
     * and its grad_accum cannot tell a deliberate edit from a value an earlier resume rescaled. */
    if (gt_config_key_line(cfg, "train", "grad_accum") < 0) {
        printf("gtrain: warning: %s: the global batch changes from %llu to %llu sequences per step (%s saved "
               "%s); the run will not follow the saved one's losses\n",
               where, (unsigned long long)G, (unsigned long long)(B * A * (uint64_t)world), path, saved);
        fflush(stdout);
        return 0;
    }
    if (G % (B * (uint64_t)world) == 0) {
        *grad_accum = (int)(G / (B * (uint64_t)world));
        printf("gtrain: keeping the global batch of %s, %llu sequences per step (saved %s): train.grad_accum %d "
               "-> %d on %d rank%s\n", path, (unsigned long long)G, saved, cfg->train.grad_accum, *grad_accum,
               world, world == 1 ? "" : "s");
        fflush(stdout);
        return 0;
    }
    char fit[256];
    int b = fitting_micro_batch(G, world, cfg->train.micro_batch);
    if (b)
        snprintf(fit, sizeof fit, "train.micro_batch=%d train.grad_accum=%llu keep it", b,
                 (unsigned long long)(G / (uint64_t)world / (uint64_t)b));
    else
        snprintf(fit, sizeof fit, "no micro_batch x grad_accum keeps it on %d ranks (run on a number of ranks that "
                 "divides %llu)", world, (unsigned long long)G);
    snprintf(msg, len,
             "%s: cannot keep the global batch of %s, %llu sequences per step (saved %s): micro_batch %llu x %d "
             "rank%s = %llu does not divide it; %s, or set train.grad_accum on the command line to train with "
             "another global batch", where, path, (unsigned long long)G, saved, (unsigned long long)B, world,
             world == 1 ? "" : "s", (unsigned long long)(B * (uint64_t)world), fit);
    return GT_EXIT_BAD_INPUT;
}

int gt_runstate_keep_global_batch(gt_config *cfg, MPI_Comm world) {
    if (cfg->train.global_batch > 0) return 0; /* the config states it: grad_accum follows (gt_plan_resolve) */
    if (gt_config_resume(cfg) == GT_RESUME_NEVER ||
        (gt_config_resume(cfg) == GT_RESUME_AUTO && !cfg->checkpoint.dir[0]))
        return 0;
    int rank = 0, size = 1;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    char msg[2 * GT_PATH_MAX + 1024] = "";
    int verdict[2] = {0, cfg->train.grad_accum}; /* exit code, grad_accum */
    if (rank == 0) {
        verdict[0] = decide_grad_accum(cfg, size, &verdict[1], msg, sizeof msg);
        if (verdict[0]) {
            fprintf(stderr, "gtrain: %s\n", msg);
            fflush(stderr);
        }
    }
    MPI_Bcast(verdict, 2, MPI_INT, 0, world);
    cfg->train.grad_accum = verdict[1];
    return verdict[0];
}
