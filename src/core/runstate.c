/*
 * runstate.c — the training loop's side of training-state files and signals (see runstate.h);
 * state.c owns the file format, this file owns the policy around it:
 *
 *   where a run starts   checkpoint.resume = never: fresh. PATH: that file, or exit 3. auto: the
 *                        newest complete file DIR/step_%08d.h5; one that fails to read (checksum,
 *                        truncation) is reported and the next older one is tried; none usable:
 *                        fresh if DIR holds no state files at all, else exit 3. A file that reads
 *                        but does not fit the model (a tensor's shape) is exit 3 at once: an older
 *                        file of the same run would not fit either.
 *   saving               every checkpoint.every steps, at the last step, and on a stop signal:
 *                        write DIR/step_N.h5.tmp collectively, close, barrier; rank 0 fsyncs it,
 *                        renames it to step_N.h5 and fsyncs DIR, so a job killed at any moment
 *                        leaves the complete new file or none; only then are files beyond
 *                        checkpoint.keep deleted (never newer ones: they may be the ones a fallback
 *                        skipped, and the run will overwrite them when it gets there).
 *   stopping             SIGTERM/SIGUSR1 set a flag (signals.c); after each step the ranks agree on
 *                        it, save and return 75.
 *
 * Every decision is taken identically on all ranks: rank 0 lists the directory and broadcasts,
 * read failures are all-reduced, messages come from rank 0.
 */
#define _POSIX_C_SOURCE 200809L

#include "runstate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "signals.h"
#include "state.h"
#include "train.h"

static int rank_of(const gt_run_state *run) { return gt_comm_rank(run->comm); }

static void state_path(char *out, size_t len, const char *dir, int64_t step, int tmp) {
    snprintf(out, len, "%s/step_%08lld.h5%s", dir, (long long)step, tmp ? ".tmp" : "");
}

/* Parses a complete state file name, step_<digits>.h5; returns the step or -1. With `tmp`, matches
 * step_<digits>.h5.tmp instead. */
static int64_t parse_state_name(const char *name, int tmp) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *p = name + 5, *digits = p;
    while (*p >= '0' && *p <= '9') p++;
    if (p == digits || p - digits > 18) return -1;
    if (strcmp(p, tmp ? ".h5.tmp" : ".h5") != 0) return -1;
    return strtoll(digits, NULL, 10);
}

static int compare_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The steps of the complete state files in dir, newest first (malloc'd). Rank 0 only. */
static size_t list_state_files(const char *dir, int64_t **steps_out) {
    size_t n = 0, cap = 16;
    int64_t *steps = malloc(cap * sizeof *steps);
    if (!steps) abort();
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            int64_t s = parse_state_name(e->d_name, 0);
            if (s < 0) continue;
            if (n == cap) {
                cap *= 2;
                steps = realloc(steps, cap * sizeof *steps);
                if (!steps) abort();
            }
            steps[n++] = s;
        }
        closedir(d);
    }
    qsort(steps, n, sizeof *steps, compare_desc);
    *steps_out = steps;
    return n;
}

/* mkdir -p; 0 or -1 with errno. */
static int make_dirs(const char *path) {
    char buf[GT_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

static int fsync_path(const char *path, int directory) {
    int fd = open(path, O_RDONLY | (directory ? O_DIRECTORY : 0));
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* A temporary file of a save that was killed: never a complete state, safe to delete. Rank 0. */
static void remove_stale_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[GT_PATH_MAX + 64];
    while ((e = readdir(d)) != NULL) {
        if (parse_state_name(e->d_name, 1) < 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0) printf("gtrain: removed %s, left by a save that did not finish\n", path);
    }
    closedir(d);
}

/* Prints, on rank 0, every key whose value differs between the saved config and this run's. Both
 * texts come from gt_config_to_ini: `[section]` lines, then `key = value` lines. */
static void report_config_changes(const char *saved, const char *now) {
    char *a = strdup(saved), *b = strdup(now);
    if (!a || !b) abort();
    int printed = 0;
    char sec_a[64] = "", *save_a = NULL;
    for (char *line = strtok_r(a, "\n", &save_a); line; line = strtok_r(NULL, "\n", &save_a)) {
        if (line[0] == '[') {
            snprintf(sec_a, sizeof sec_a, "%.*s", (int)strcspn(line + 1, "]"), line + 1);
            continue;
        }
        char *eq = strstr(line, " = ");
        if (!eq) continue;
        *eq = '\0';
        const char *key = line, *old_value = eq + 3;
        /* the same key in the current config */
        char *copy = strdup(b), *save_b = NULL, sec_b[64] = "";
        const char *new_value = NULL;
        if (!copy) abort();
        for (char *l = strtok_r(copy, "\n", &save_b); l && !new_value; l = strtok_r(NULL, "\n", &save_b)) {
            if (l[0] == '[') {
                snprintf(sec_b, sizeof sec_b, "%.*s", (int)strcspn(l + 1, "]"), l + 1);
                continue;
            }
            char *e = strstr(l, " = ");
            if (e && strcmp(sec_a, sec_b) == 0 && (size_t)(e - l) == strlen(key) && strncmp(l, key, strlen(key)) == 0)
                new_value = e + 3;
        }
        if (new_value && strcmp(old_value, new_value) != 0) {
            printf("%s %s.%s: %s -> %s", printed ? "," : "gtrain: changed since the save:", sec_a, key,
                   old_value[0] ? old_value : "\"\"", new_value[0] ? new_value : "\"\"");
            printed = 1;
        }
        free(copy);
    }
    if (printed) printf("\n");
    free(a);
    free(b);
}

static off_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : 0;
}

/* Tries to load one file on every rank. Returns GT_STATE_* (agreed) and the message in err. */
static int try_load(gt_run_state *run, const char *path, gt_state_info *info, char *err, size_t err_len) {
    char *saved_config = NULL;
    double t0 = MPI_Wtime();
    int code = gt_state_read(path, run->opt, info, &saved_config, err, err_len);
    code = gt_agree_on_failure(run->mpi_comm, code, err, err_len);
    if (code) {
        free(saved_config);
        return code;
    }
    gt_optim_publish_params(run->opt);
    run->opt->ops->synchronize();
    MPI_Barrier(run->mpi_comm);
    double seconds = MPI_Wtime() - t0;

    const gt_config *cfg = run->cfg;
    int world = gt_comm_size(run->comm);
    if (rank_of(run) == 0) {
        double gb = (double)file_size(path) / 1e9;
        printf("gtrain: resumed from %s (step %lld): %.3f GB read in %.2f s (%.2f GB/s)\n", path,
               (long long)info->step, gb, seconds, seconds > 0 ? gb / seconds : 0.0);
        if (info->world_size != world || strcmp(info->shard, cfg->dist.shard) != 0)
            printf("gtrain: saved by %d rank%s with shard %s, now %d rank%s with shard %s: each rank read its own "
                   "slice of the logical tensors\n",
                   info->world_size, info->world_size == 1 ? "" : "s", info->shard, world, world == 1 ? "" : "s",
                   cfg->dist.shard);
        if (info->global_batch != run->global_batch)
            printf("gtrain: global batch %llu -> %llu sequences per step: the data continues at sample %llu of "
                   "the global order\n",
                   (unsigned long long)info->global_batch, (unsigned long long)run->global_batch,
                   (unsigned long long)info->data_cursor);
        if (saved_config) report_config_changes(saved_config, run->config_text);
        fflush(stdout);
    }
    free(saved_config);
    return GT_STATE_OK;
}

/* Picks and loads the file to resume from. Returns 0 (resumed, or nothing to resume) or 3. */
static int resume(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run);
    int explicit_path = strcmp(cfg->checkpoint.resume, "auto") != 0;
    if (!explicit_path && !cfg->checkpoint.dir[0]) return 0; /* no directory: nothing to look at */

    /* the candidates, newest first; rank 0 looks, everyone gets the same list */
    int64_t *steps = NULL;
    long long n = 0;
    if (explicit_path) {
        n = 1;
    } else if (rank == 0) {
        n = (long long)list_state_files(cfg->checkpoint.dir, &steps);
    }
    MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, run->mpi_comm);
    if (!explicit_path) {
        if (rank != 0) {
            steps = malloc((size_t)(n ? n : 1) * sizeof *steps);
            if (!steps) abort();
        }
        if (n) MPI_Bcast(steps, (int)n, MPI_INT64_T, 0, run->mpi_comm);
    }
    if (n == 0) {
        free(steps);
        return 0; /* a fresh run */
    }

    char path[GT_PATH_MAX + 64], err[2048];
    gt_state_info info;
    int code = GT_STATE_UNREADABLE;
    for (long long i = 0; i < n; i++) {
        if (explicit_path) snprintf(path, sizeof path, "%s", cfg->checkpoint.resume);
        else state_path(path, sizeof path, cfg->checkpoint.dir, steps[i], 0);
        code = try_load(run, path, &info, err, sizeof err);
        if (code == GT_STATE_OK) break;
        if (rank == 0) {
            if (code == GT_STATE_INCOMPATIBLE)
                fprintf(stderr, "gtrain: cannot resume: %s\n", err);
            else if (i + 1 < n)
                fprintf(stderr, "gtrain: unusable state file: %s; trying the next older one\n", err);
            else
                fprintf(stderr, "gtrain: unusable state file: %s\n", err);
            fflush(stderr);
        }
        if (code == GT_STATE_INCOMPATIBLE) break;
    }
    free(steps);
    if (code != GT_STATE_OK) {
        if (rank == 0 && code == GT_STATE_UNREADABLE && !explicit_path)
            fprintf(stderr, "gtrain: no usable state file in %s (remove them, or set checkpoint.resume = never, to "
                    "start fresh)\n", cfg->checkpoint.dir);
        return GT_EXIT_BAD_STATE;
    }

    run->opt->t = (int)info.adam_step;
    run->first_step = (int)info.step + 1;
    run->first_sample = info.data_cursor;
    run->tokens_seen = info.tokens_seen;
    /* the final save is skipped when it would rewrite the file we came from */
    char own[GT_PATH_MAX + 64];
    state_path(own, sizeof own, cfg->checkpoint.dir, info.step, 0);
    if (cfg->checkpoint.dir[0] && strcmp(own, path) == 0) run->last_saved_step = (int)info.step;
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

int gt_runstate_begin(gt_run_state *run, const gt_config *cfg, gt_comm *comm, MPI_Comm world, gt_model *model,
                      gt_optim *opt, uint64_t global_batch) {
    memset(run, 0, sizeof *run);
    run->cfg = cfg;
    run->comm = comm;
    run->model = model;
    run->opt = opt;
    run->global_batch = global_batch;
    run->first_step = 1;
    MPI_Comm_dup(world, &run->mpi_comm);
    run->config_text = gt_config_to_ini(cfg);
    if (!run->config_text) abort();

    int rank = rank_of(run), bad = 0;
    if (cfg->checkpoint.dir[0] && rank == 0) {
        if (make_dirs(cfg->checkpoint.dir) != 0) {
            fprintf(stderr, "gtrain: %s: [checkpoint] dir: cannot create '%s': %s\n", cfg->path, cfg->checkpoint.dir,
                    strerror(errno));
            bad = 1;
        } else {
            remove_stale_temporaries(cfg->checkpoint.dir);
        }
    }
    MPI_Bcast(&bad, 1, MPI_INT, 0, run->mpi_comm);
    int rc = bad ? GT_EXIT_BAD_INPUT : 0;
    if (!rc && strcmp(cfg->checkpoint.resume, "never") != 0) rc = resume(run);
    if (rc) gt_runstate_free(run);
    return rc;
}

/* Drops the oldest files beyond checkpoint.keep, counting the one just saved. Rank 0. */
static void prune(const gt_config *cfg, int64_t saved_step) {
    if (cfg->checkpoint.keep <= 0) return;
    int64_t *steps = NULL;
    size_t n = list_state_files(cfg->checkpoint.dir, &steps);
    size_t kept = 0;
    char path[GT_PATH_MAX + 64];
    for (size_t i = 0; i < n; i++) {
        if (steps[i] > saved_step) continue; /* newer than ours: see the header comment */
        if (kept++ < (size_t)cfg->checkpoint.keep) continue;
        state_path(path, sizeof path, cfg->checkpoint.dir, steps[i], 0);
        if (unlink(path) != 0) fprintf(stderr, "gtrain: cannot delete %s: %s\n", path, strerror(errno));
    }
    free(steps);
}

/* Writes DIR/step_N.h5 atomically. Collective. Returns 0 or GT_EXIT_FAILURE. */
static int save(gt_run_state *run, int step) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run);
    char tmp[GT_PATH_MAX + 64], final_path[GT_PATH_MAX + 64];
    state_path(tmp, sizeof tmp, cfg->checkpoint.dir, step, 1);
    state_path(final_path, sizeof final_path, cfg->checkpoint.dir, step, 0);
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
    snprintf(info.shard, sizeof info.shard, "%s", cfg->dist.shard);

    run->opt->ops->synchronize();
    MPI_Barrier(run->mpi_comm);
    double t0 = MPI_Wtime();
    gt_state_write(tmp, run->mpi_comm, run->opt, run->config_text, &info);
    MPI_Barrier(run->mpi_comm); /* every rank has closed the file */
    int ok = 1;
    if (rank == 0) {
        /* data first, then the name: after a crash the name never points at missing data */
        if (fsync_path(tmp, 0) != 0 || rename(tmp, final_path) != 0 || fsync_path(cfg->checkpoint.dir, 1) != 0) {
            fprintf(stderr, "gtrain: cannot make %s durable: %s\n", final_path, strerror(errno));
            ok = 0;
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, run->mpi_comm);
    double seconds = MPI_Wtime() - t0;
    if (!ok) return GT_EXIT_FAILURE;
    run->last_saved_step = step;
    if (rank == 0) {
        double gb = (double)file_size(final_path) / 1e9;
        printf("gtrain: saved %s: %.3f GB in %.2f s (%.2f GB/s)\n", final_path, gb, seconds,
               seconds > 0 ? gb / seconds : 0.0);
        fflush(stdout);
        prune(cfg, step);
    }
    return 0;
}

/* GTRAIN_TEST_STEP_DELAY_MS (tests only): a pause after every step, so that a test can kill or
 * signal a tiny run between two given steps. */
static void test_step_delay(void) {
    const char *env = getenv("GTRAIN_TEST_STEP_DELAY_MS");
    long ms = env ? atol(env) : 0;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int gt_runstate_after_step(gt_run_state *run, int step) {
    const gt_config *cfg = run->cfg;
    if (cfg->checkpoint.dir[0] && cfg->checkpoint.every > 0 && step % cfg->checkpoint.every == 0) {
        int rc = save(run, step);
        if (rc) return rc;
    }
    test_step_delay();
    if (step >= cfg->train.steps) return 0; /* the last step: gt_runstate_end saves, the run ends with 0 */
    int sig = gt_comm_all_reduce_int_max(run->comm, gt_signals_pending());
    if (!sig) return 0;
    const char *name = sig == SIGTERM ? "SIGTERM" : "SIGUSR1";
    if (!cfg->checkpoint.dir[0]) {
        if (rank_of(run) == 0)
            fprintf(stderr, "gtrain: stopped by %s after step %d; checkpoint.dir is empty, so nothing was saved\n",
                    name, step);
        return GT_EXIT_FAILURE;
    }
    if (run->last_saved_step != step) {
        int rc = save(run, step);
        if (rc) return rc;
    }
    if (rank_of(run) == 0) {
        printf("gtrain: stopped by %s after step %d; the state is saved, exit %d\n", name, step, GT_EXIT_PREEMPTED);
        fflush(stdout);
    }
    return GT_EXIT_PREEMPTED;
}

int gt_runstate_end(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    if (!cfg->checkpoint.dir[0]) return 0;
    if (run->first_step > cfg->train.steps) return 0;    /* resumed at or past the end: nothing new */
    if (run->last_saved_step == cfg->train.steps) return 0; /* the periodic save was the last step */
    return save(run, cfg->train.steps);
}

void gt_runstate_free(gt_run_state *run) {
    if (run->mpi_comm != MPI_COMM_NULL && run->mpi_comm != 0) MPI_Comm_free(&run->mpi_comm);
    free(run->config_text);
    memset(run, 0, sizeof *run);
}
