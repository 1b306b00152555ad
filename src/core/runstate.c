/*
 * runstate.c — the training loop's side of training-state files and signals (see runstate.h);
 * state.c owns the file format, this file owns the policy around it:
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
 *                        names (see "The lineage": another run's files are never resumed, and a
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
 *                        file published last (see "Asynchronous saves" below). false: write
 *                        DIR/step_N.h5.tmp collectively, close, barrier; rank 0 fsyncs it,
 *                        renames it to step_N.h5 and fsyncs DIR, so a job killed at any moment
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
 *   stopping             SIGTERM/SIGUSR1 set a flag (signals.c); after each step the ranks agree on
 *                        it, save and return 75.
 *
 * Every decision is taken identically on all ranks: rank 0 lists the directory and broadcasts,
 * read failures are all-reduced, messages come from rank 0.
 */
#define _GNU_SOURCE /* fallocate */

#include "runstate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "agree.h"
#include "asyncsave.h"
#include "bytes.h"
#include "errmsg.h"
#include "signals.h"
#include "state.h"
#include "tbevents.h"
#include "testhooks.h"
#include "watchdog.h"
#include "exitcodes.h"

#define PERIODIC_THEN "training goes on and the next save tries again"

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

/* The steps of the complete state files in dir, newest first (malloc'd). Rank 0 only. -1 with errno
 * when the directory cannot be listed (EACCES, EIO, EMFILE): never "no files", which would start a
 * fresh run over the files it could not see. GTRAIN_TEST_LIST_DIR_EIO=1 (tests only) makes it fail. */
static long long list_state_files(const char *dir, int64_t **steps_out) {
    size_t n = 0, cap = 16;
    int64_t *steps = malloc(cap * sizeof *steps);
    if (!steps) abort();
    *steps_out = steps;
    DIR *d = gt_test_hooks_get()->list_dir_eio ? (errno = EIO, NULL) : opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    for (;;) {
        errno = 0;
        if ((e = readdir(d)) == NULL) break;
        int64_t s = parse_state_name(e->d_name, 0);
        if (s < 0) continue;
        if (n == cap) {
            cap *= 2;
            steps = realloc(steps, cap * sizeof *steps);
            if (!steps) abort();
        }
        steps[n++] = s;
    }
    int read_error = errno;
    closedir(d);
    *steps_out = steps;
    if (read_error) {
        errno = read_error;
        return -1;
    }
    qsort(steps, n, sizeof *steps, compare_desc);
    return (long long)n;
}

static int fsync_path(const char *path, int directory) {
    int fd = open(path, O_RDONLY | (directory ? O_DIRECTORY : 0));
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* The rank files of an asynchronous save of `step`: DIR/step_N.h5.d, or step_N.h5.d.K (K = 1, 2, ...)
 * when a save of the same step still holds that name. The top file names its directory (state.h:
 * gt_state_rank_dir), so a re-save writes into a fresh one while the old top file still maps onto
 * the old one, and a single rename replaces both. */
static void rank_dir_name(char *out, size_t len, int64_t step, int generation) {
    if (generation == 0) snprintf(out, len, "step_%08lld.h5.d", (long long)step);
    else snprintf(out, len, "step_%08lld.h5.d.%d", (long long)step, generation);
}

/* Parses step_<digits>.h5.d or step_<digits>.h5.d.<digits>; the step or -1. */
static int64_t parse_rank_dir_name(const char *name) {
    const char *d = strstr(name, ".h5.d");
    if (!d || d - name >= 48) return -1;
    const char *tail = d + 5;
    if (*tail == '.') {
        const char *digits = ++tail;
        while (*tail >= '0' && *tail <= '9') tail++;
        if (tail == digits || tail - digits > 9) return -1;
    }
    if (*tail) return -1;
    char base[64];
    snprintf(base, sizeof base, "%.*s", (int)(d - name) + 3, name);
    return parse_state_name(base, 0);
}

/* Deletes a rank-file directory and the files in it (gtrain puts no subdirectories there). */
static int remove_rank_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    char file[GT_PATH_MAX + 128];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        unlink(file);
    }
    closedir(d);
    return rmdir(path);
}

static int path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Is NAME a state file of `step` set aside: step_N.h5.bad, or step_N.h5.bad.K (K = 2, 3, ...) when an
 * earlier set-aside of the same step holds the first name? */
static int is_bad_name(const char *name, int64_t step) {
    char base[64];
    snprintf(base, sizeof base, "step_%08lld.h5.bad", (long long)step);
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0) return 0;
    if (!name[n]) return 1;
    if (name[n] != '.' || !name[n + 1]) return 0;
    for (const char *p = name + n + 1; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

/* Does a state file of `step` map onto the rank-file directory DIR/NAME: step_N.h5, or one set
 * aside as step_N.h5.bad[.K] (its rank files stay with it, every one of them)? A file whose rank_dir
 * attribute cannot be read, or a directory that cannot be listed, keeps every directory of its step:
 * what cannot be read is never a reason to delete. */
static int rank_dir_in_use(const char *dir, int64_t step, const char *name) {
    char top[GT_PATH_MAX + 64], file[GT_PATH_MAX + 320], used[256];
    state_path(top, sizeof top, dir, step, 0);
    if (path_exists(top)) {
        int rc = gt_state_rank_dir(top, used, sizeof used);
        if (rc < 0 || (rc == 1 && strcmp(used, name) == 0)) return 1;
    }
    DIR *d = opendir(dir);
    if (!d) return 1;
    struct dirent *e;
    int in_use = 0;
    while (!in_use && (e = readdir(d)) != NULL) {
        if (!is_bad_name(e->d_name, step)) continue;
        snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
        int rc = gt_state_rank_dir(file, used, sizeof used);
        if (rc < 0 || (rc == 1 && strcmp(used, name) == 0)) in_use = 1;
    }
    closedir(d);
    return in_use;
}

/* Deletes the rank-file directories of `step` (every step: -1) that no state file maps onto: those
 * of a save killed before its top file was published, and those a newer save of the same step
 * replaced (a rename published it; the old directory goes after). `why`: print a line per
 * directory ending in it; NULL: quietly. Rank 0, with no save in flight. */
static void remove_unused_rank_dirs(const char *dir, int64_t step, const char *why) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[GT_PATH_MAX + 64];
    while ((e = readdir(d)) != NULL) {
        int64_t s = parse_rank_dir_name(e->d_name);
        if (s < 0 || (step >= 0 && s != step) || rank_dir_in_use(dir, s, e->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (remove_rank_dir(path) == 0 && why) printf("gtrain: removed %s, %s\n", path, why);
        else if (path_exists(path)) fprintf(stderr, "gtrain: cannot delete %s: %s\n", path, strerror(errno));
    }
    closedir(d);
}

/* A temporary file of a save that was killed, or rank files no state file maps onto (a save killed
 * before its top file was published, or after a re-save of the same step published its own): never
 * a complete state, safe to delete. Rank 0. */
static void remove_stale_temporaries(const char *dir) {
    remove_unused_rank_dirs(dir, -1, "left by a save that did not finish");
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

/* ------------------------------------------------------------------------------------------------
 * The directory: usable before the first step
 * ---------------------------------------------------------------------------------------------- */

/* Creates dir, then creates, writes, fsyncs and deletes a probe file in it. One rank per node,
 * since the directory may be node-local. 0, or -1 with errno set and what failed in `what`. */
static int probe_dir(const char *dir, int rank, char *what, size_t what_len) {
    if (gt_make_dirs(dir) != 0) {
        snprintf(what, what_len, "cannot create");
        return -1;
    }
    char host[256] = "";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    char path[GT_PATH_MAX + 384];
    snprintf(path, sizeof path, "%s/.gtrain-probe.%s.%d.%ld", dir, host, rank, (long)getpid());
    errno = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        snprintf(what, what_len, "cannot create a file in");
        return -1;
    }
    char block[4096];
    memset(block, 0, sizeof block);
    errno = 0;
    int ok = write(fd, block, sizeof block) == (ssize_t)sizeof block && fsync(fd) == 0;
    int saved = ok ? 0 : (errno ? errno : ENOSPC); /* a short write without an error: no room */
    if (close(fd) != 0 && ok) ok = 0, saved = errno;
    unlink(path);
    if (!ok) {
        snprintf(what, what_len, "cannot write a file in");
        errno = saved;
        return -1;
    }
    return 0;
}

/* One node's probe of "is checkpoint.dir the same directory everywhere": the file it wrote, named
 * by a random token, and the host that wrote it. */
typedef struct node_probe {
    int leader; /* this rank wrote a probe (the first rank of its node) */
    char token[24];
    char host[64];
} node_probe;

static void probe_token(char *out, size_t len, int rank) {
    uint64_t r = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, &r, sizeof r) != (ssize_t)sizeof r)
        r = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 20 ^ (uint64_t)rank;
    if (fd >= 0) close(fd);
    snprintf(out, len, "%016llx", (unsigned long long)r);
}

static void node_probe_path(char *out, size_t len, const char *dir, const node_probe *p) {
    snprintf(out, len, "%s/.gtrain-node-probe.%s", dir, p->token);
}

/* checkpoint.dir must be one directory that every node sees (a shared file system): a node-local
 * path gives each node its own files, and a resume then reads whatever its node saw. The first rank
 * of each node writes a file named by a random token into it; after all have written, each checks
 * that it sees every node's file. Exit 2 naming the nodes that do not, by host name. With
 * GTRAIN_TEST_RANK_IS_NODE=1 every rank probes as if it were a node of its own, so that a test on
 * one machine can give each rank a private directory (a mount namespace) and see the refusal.
 * Collective. */
static int check_same_dir(gt_run_state *run, int node_rank, const char *host) {
    const char *dir = run->cfg->checkpoint.dir;
    int rank = rank_of(run), world = gt_comm_size(run->comm);
    node_probe mine;
    memset(&mine, 0, sizeof mine);
    mine.leader = node_rank == 0 || gt_test_hooks_get()->rank_is_node;
    snprintf(mine.host, sizeof mine.host, "%s", host);
    char path[GT_PATH_MAX + 64];
    if (mine.leader) {
        probe_token(mine.token, sizeof mine.token, rank);
        node_probe_path(path, sizeof path, dir, &mine);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) close(fd); /* a failure shows as a probe that no node sees, its own included */
    }
    node_probe *all = calloc((size_t)world, sizeof *all);
    if (!all) abort();
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, run->mpi_comm);
    int verdict[2] = {0, -1}; /* probes seen, the first one missing (a rank) */
    int leaders = 0;
    for (int r = 0; r < world; r++) {
        if (!all[r].leader) continue;
        leaders++;
        if (!mine.leader) continue;
        node_probe_path(path, sizeof path, dir, &all[r]);
        if (access(path, F_OK) == 0) verdict[0]++;
        else if (verdict[1] < 0) verdict[1] = r;
    }
    int *verdicts = calloc((size_t)world * 2, sizeof *verdicts);
    if (!verdicts) abort();
    MPI_Allgather(verdict, 2, MPI_INT, verdicts, 2, MPI_INT, run->mpi_comm);
    if (mine.leader) { /* every node has looked: the probes can go */
        node_probe_path(path, sizeof path, dir, &mine);
        unlink(path);
    }
    char nodes[2048] = "";
    int disagree = 0;
    for (int r = 0; r < world; r++) {
        if (!all[r].leader || verdicts[2 * r] == leaders) continue;
        disagree++;
        gt_appendf(nodes, sizeof nodes, "%s%s (rank %d) sees %d of the %d nodes' probe files, not %s's",
               disagree > 1 ? "; " : "", all[r].host, r, verdicts[2 * r], leaders, all[verdicts[2 * r + 1]].host);
    }
    free(all);
    free(verdicts);
    if (!disagree) return 0;
    if (rank == 0) {
        char where[GT_PATH_MAX + 128];
        gt_config_where(run->cfg, "checkpoint", "dir", where, sizeof where);
        fprintf(stderr, "gtrain: %s: '%s' is not the same directory on every node: %s (expected a directory on a "
                "file system every node shares; each node's first rank wrote a probe file into it)\n", where, dir,
                nodes);
        fflush(stderr);
    }
    return GT_EXIT_BAD_INPUT;
}

/* exit 2 (agreed) when checkpoint.dir is not usable on some node (the first rank of each node
 * probes it) or is not the same directory on every node; a warning when some rank sees less free
 * space than one state file. Collective. */
static int check_dir(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run), node_rank = 0;
    gt_node_ranks(run->mpi_comm, &node_rank, NULL);
    char msg[2 * GT_PATH_MAX + 1024] = "", what[64], host[256] = "";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    int code = 0;
    if (node_rank == 0 && probe_dir(cfg->checkpoint.dir, rank, what, sizeof what) != 0) {
        char where[GT_PATH_MAX + 128];
        int os_error = errno;
        gt_config_where(cfg, "checkpoint", "dir", where, sizeof where);
        snprintf(msg, sizeof msg, "%s: %s '%s' (rank %d on %s): %s (expected a writable directory)", where, what,
                 cfg->checkpoint.dir, rank, host, strerror(os_error));
        code = GT_EXIT_BAD_INPUT;
    }
    code = gt_agree_on_failure(run->mpi_comm, code, msg, sizeof msg);
    if (code) {
        if (rank == 0) fprintf(stderr, "gtrain: %s\n", msg);
        return code;
    }
    if ((code = check_same_dir(run, node_rank, host))) return code;

    struct statvfs st;
    int low = 0;
    msg[0] = '\0';
    if (statvfs(cfg->checkpoint.dir, &st) == 0 && (uint64_t)st.f_bavail * st.f_frsize < run->file_bytes) {
        char free_s[32], need_s[32];
        gt_format_bytes((uint64_t)st.f_bavail * st.f_frsize, free_s, sizeof free_s);
        gt_format_bytes(run->file_bytes, need_s, sizeof need_s);
        snprintf(msg, sizeof msg,
                 "warning: checkpoint.dir '%s' has %s free (rank %d on %s), less than one state file (about %s): "
                 "saves will fail until there is room; the run goes on and each save tries again",
                 cfg->checkpoint.dir, free_s, rank, host, need_s);
        low = 1;
    }
    if (gt_agree_on_failure(run->mpi_comm, low, msg, sizeof msg) && rank == 0) {
        fprintf(stderr, "gtrain: %s\n", msg);
        fflush(stderr);
    }
    return 0;
}

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

static off_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : 0;
}

/* A state file's bytes on disk: the file, and the rank files of a top file (path.d). */
static uint64_t state_bytes(const char *path) {
    uint64_t bytes = (uint64_t)file_size(path);
    char dir[GT_PATH_MAX + 80], file[GT_PATH_MAX + 340];
    snprintf(dir, sizeof dir, "%s.d", path);
    DIR *d = opendir(dir);
    if (!d) return bytes;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
        bytes += (uint64_t)file_size(file);
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
    char *saved_config = NULL;
    code = gt_state_read(path, run->opt, info, &saved_config, err, err_len);
    free(saved_config);
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
        state_path(path, sizeof path, dir, steps[i], 0);
        snprintf(bad, sizeof bad, "%s.bad", path);
        for (int k = 2; path_exists(bad) && k < 1000000; k++) snprintf(bad, sizeof bad, "%s.bad.%d", path, k);
        if (!path_exists(bad) && rename(path, bad) == 0)
            gt_appendf(line, sizeof line, "%s%s -> %s", line[0] ? ", " : "", path, bad);
        else
            gt_appendf(line, sizeof line, "%s%s (cannot rename: %s)", line[0] ? ", " : "", path,
                       path_exists(bad) ? "no free .bad name" : strerror(errno));
    }
    if (fsync_path(dir, 1) != 0)
        gt_appendf(line, sizeof line, " (fsync of %s: %s)", dir, strerror(errno));
    fprintf(stderr, "gtrain: set aside %zu state file%s that failed verification: %s (not counted toward "
            "checkpoint.keep; gtrain never deletes them)\n", n, n == 1 ? "" : "s", line);
    fflush(stderr);
}

/* ------------------------------------------------------------------------------------------------
 * The lineage
 *
 * State files are named by their step alone (step_N.h5), so two runs in one directory would write
 * over each other's files, resume from each other's and rotate each other's away. Every run
 * therefore has a lineage (gt_lineage): a fresh start makes a random run identity, and every state
 * file records it (root attributes run_id, branch, branch_parents; rank files run_id and branch).
 * A resume carries it on, on any world size. checkpoint.resume = PATH (a rollback to an older file,
 * or a file from elsewhere) starts a new branch of it, whose past is the file's branch up to the
 * file's step ("BRANCH@STEP"), and that branch's past. The directory records the branch being
 * written in DIR/.gtrain-lineage (rank 0, at the start: a temporary file, fsync, rename, fsync of
 * the directory), so that checkpoint.resume = auto (every requeue) continues the branch: its newest
 * file, or the file it started from while it has saved none; never the newer files of the branch a
 * rollback abandoned. Without the record (a directory written before it existed, or copied without
 * it) auto continues the lineage of the newest file whose attributes read. Files without a run
 * identity (written before it existed) are one legacy lineage ("-"): a run that resumes one gets an
 * identity whose past is them.
 *
 * A directory holds one lineage: a fresh start where state files exist, or a resume whose lineage
 * is not that of every state file there, is refused (exit 2, before step 1), since its saves would
 * replace the other's files of the same steps. Rotation (checkpoint.keep) deletes only files of the
 * branch and its past; files set aside as .bad, files of an abandoned branch and files whose
 * attributes do not read are never deleted by it (a save of the same step replaces an abandoned
 * branch's file, as a rename does).
 * ---------------------------------------------------------------------------------------------- */

#define LINEAGE_NAME ".gtrain-lineage"
#define LEGACY_BRANCH "-"

/* The lineage a file records ("-" for the branch of a file that records none). */
static void file_lineage(const gt_state_info *f, gt_lineage *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->run_id, sizeof out->run_id, "%s", f->run_id);
    snprintf(out->branch, sizeof out->branch, "%s", f->run_id[0] ? f->branch : LEGACY_BRANCH);
    snprintf(out->parents, sizeof out->parents, "%s", f->run_id[0] ? f->branch_parents : "");
}

/* Does the lineage's past (parents) hold BRANCH up to a step >= step? step < 0: at any step. */
static int in_parents(const gt_lineage *l, const char *branch, int64_t step) {
    const char *p = l->parents;
    size_t blen = strlen(branch);
    while (*p) {
        while (*p == ' ') p++;
        const char *at = strchr(p, '@');
        if (!at) break;
        long long cap = strtoll(at + 1, NULL, 10);
        if ((size_t)(at - p) == blen && strncmp(p, branch, blen) == 0 && (step < 0 || step <= cap)) return 1;
        p = at + 1;
        while (*p && *p != ' ') p++;
    }
    return 0;
}

/* Is the file of this lineage (any branch)? A legacy file is when the lineage continues one. */
static int same_lineage(const gt_lineage *l, const gt_state_info *f) {
    if (f->run_id[0]) return strcmp(f->run_id, l->run_id) == 0;
    return !l->run_id[0] || in_parents(l, LEGACY_BRANCH, -1);
}

/* Is the file on the lineage's current chain: its branch, or its past up to the step it was left at? */
static int in_chain(const gt_lineage *l, const gt_state_info *f) {
    if (!same_lineage(l, f)) return 0;
    const char *b = f->run_id[0] ? f->branch : LEGACY_BRANCH;
    if (strcmp(b, l->branch) == 0) return 1;
    return in_parents(l, b, f->step);
}

/* A new branch from file f (its lineage) at its step: a new identity too when f has none. */
static void branch_from(const gt_state_info *f, const char *path, int rank, gt_lineage *out) {
    gt_lineage was;
    file_lineage(f, &was);
    memset(out, 0, sizeof *out);
    if (f->run_id[0]) snprintf(out->run_id, sizeof out->run_id, "%s", f->run_id);
    else probe_token(out->run_id, sizeof out->run_id, rank);
    probe_token(out->branch, sizeof out->branch, rank + 1);
    char parents[sizeof out->parents + 64];
    snprintf(parents, sizeof parents, "%s@%lld%s%s", was.branch, (long long)f->step, was.parents[0] ? " " : "",
             was.parents);
    while (strlen(parents) >= sizeof out->parents) { /* very many rollbacks: the oldest past drops */
        char *cut = strrchr(parents, ' ');
        if (!cut) break;
        *cut = '\0';
    }
    memcpy(out->parents, parents, sizeof out->parents - 1);
    char real[PATH_MAX]; /* the absolute path: a requeue may start in another working directory */
    const char *from = path ? path : "";
    if (path && realpath(path, real) && strlen(real) < sizeof out->from) from = real;
    size_t len = strlen(from) < sizeof out->from ? strlen(from) : sizeof out->from - 1;
    memcpy(out->from, from, len);
    out->from[len] = '\0';
}

static void fresh_lineage(int rank, gt_lineage *out) {
    memset(out, 0, sizeof *out);
    probe_token(out->run_id, sizeof out->run_id, rank);
    probe_token(out->branch, sizeof out->branch, rank + 1);
}

/* Reads DIR/.gtrain-lineage: 1 (read), 0 (there is none), -1 (it is there and does not read: msg). */
static int read_lineage_record(const char *dir, gt_lineage *l, char *msg, size_t len) {
    char path[GT_PATH_MAX + 32], line[GT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, LINEAGE_NAME);
    memset(l, 0, sizeof *l);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return 0;
        snprintf(msg, len, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    int version = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *value = strchr(line, ' ');
        if (!value) continue;
        *value++ = '\0';
        if (strcmp(line, "gtrain-lineage") == 0) version = atoi(value);
        else if (strcmp(line, "run_id") == 0) snprintf(l->run_id, sizeof l->run_id, "%s", value);
        else if (strcmp(line, "branch") == 0) snprintf(l->branch, sizeof l->branch, "%s", value);
        else if (strcmp(line, "parents") == 0) snprintf(l->parents, sizeof l->parents, "%s", value);
        else if (strcmp(line, "from") == 0) snprintf(l->from, sizeof l->from, "%s", value);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad || version != 1 || !l->run_id[0] || !l->branch[0]) {
        snprintf(msg, len, "%s does not read as a lineage record (expected the lines gtrain-lineage 1, run_id, "
                 "branch, parents, from)", path);
        return -1;
    }
    return 1;
}

/* Writes DIR/.gtrain-lineage durably: a temporary file, fsync, rename, fsync of DIR. 0 or -1 (msg). */
static int write_lineage_record(const char *dir, const gt_lineage *l, char *msg, size_t len) {
    char path[GT_PATH_MAX + 32], tmp[GT_PATH_MAX + 40];
    snprintf(path, sizeof path, "%s/%s", dir, LINEAGE_NAME);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int ok = f != NULL;
    if (ok) {
        fprintf(f, "gtrain-lineage 1\nrun_id %s\nbranch %s\nparents %s\nfrom %s\n", l->run_id, l->branch,
                l->parents, l->from);
        ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
        if (fclose(f) != 0) ok = 0;
    }
    if (ok) ok = rename(tmp, path) == 0;
    if (ok) ok = fsync_path(dir, 1) == 0;
    if (!ok) {
        snprintf(msg, len, "cannot record the run's lineage in %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* One state file of the directory, as the plan sees it. */
typedef struct listed_file {
    int64_t step;
    int readable; /* its attributes read (gt_state_read_info) */
    gt_state_info info;
} listed_file;

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
} start_plan;

/* Lists DIR's state files with their attributes. -1 with errno when it cannot be listed. */
static long long list_with_info(const char *dir, listed_file **out) {
    int64_t *steps = NULL;
    long long n = list_state_files(dir, &steps);
    *out = NULL;
    if (n < 0) {
        int e = errno;
        free(steps);
        errno = e;
        return -1;
    }
    listed_file *files = calloc((size_t)(n ? n : 1), sizeof *files);
    if (!files) abort();
    char path[GT_PATH_MAX + 64];
    for (long long i = 0; i < n; i++) {
        files[i].step = steps[i];
        state_path(path, sizeof path, dir, steps[i], 0);
        files[i].readable = gt_state_read_lineage(path, &files[i].info) == GT_STATE_OK ||
                            gt_state_read_lineage(path, &files[i].info) == GT_STATE_OK; /* once more */
    }
    free(steps);
    *out = files;
    return n;
}

/* The refusal of a start beside another lineage's files: the newest of them, and what to do. */
static void refuse_other(start_plan *p, const gt_config *cfg, const listed_file *other, const char *what) {
    char where[GT_PATH_MAX + 128], path[GT_PATH_MAX + 64];
    gt_config_where(cfg, "checkpoint", "dir", where, sizeof where);
    state_path(path, sizeof path, cfg->checkpoint.dir, other->step, 0);
    snprintf(p->msg, sizeof p->msg,
             "%s: '%s' holds the state files of another run (its newest: %s, %s%s); %s would write over "
             "them (their names are step_N.h5): set checkpoint.dir to a directory of its own, or "
             "checkpoint.resume = auto (or that file's path) to continue that run", where, cfg->checkpoint.dir,
             path, other->info.run_id[0] ? "run_id " : "written without a run identity", other->info.run_id, what);
    p->code = GT_EXIT_BAD_INPUT;
}

/* Rank 0: the plan (start_plan) for checkpoint.resume and checkpoint.dir. */
static void plan_start(const gt_config *cfg, int rank, start_plan *p) {
    memset(p, 0, sizeof *p);
    int mode = gt_config_resume(cfg);
    const char *dir = cfg->checkpoint.dir;
    listed_file *files = NULL;
    long long n = 0;
    if (dir[0]) {
        n = list_with_info(dir, &files);
        if (n < 0) {
            snprintf(p->msg, sizeof p->msg, "cannot list checkpoint.dir '%s': %s (nothing is resumed or started "
                     "over state files that cannot be seen)", dir, strerror(errno));
            p->code = GT_EXIT_BAD_STATE;
            return;
        }
    }
    if (mode == GT_RESUME_NEVER) {
        fresh_lineage(rank, &p->lineage);
        p->fresh = 1;
        if (n > 0) refuse_other(p, cfg, &files[0], "a fresh start (checkpoint.resume = never)");
        free(files);
        return;
    }
    if (mode == GT_RESUME_PATH) {
        gt_state_info f;
        /* a file that does not read: the resume reports it (exit 3); the lineage does not matter then */
        if (gt_state_read_lineage(cfg->checkpoint.resume, &f) == GT_STATE_OK) {
            branch_from(&f, cfg->checkpoint.resume, rank, &p->lineage);
            for (long long i = 0; i < n && !p->code; i++)
                if (files[i].readable && !same_lineage(&p->lineage, &files[i].info))
                    refuse_other(p, cfg, &files[i], "resuming another run's file here");
        }
        free(files);
        return;
    }
    /* auto: the recorded branch, else the lineage of the newest file whose attributes read */
    int has = dir[0] ? read_lineage_record(dir, &p->lineage, p->msg, sizeof p->msg) : 0;
    if (has < 0) {
        p->code = GT_EXIT_BAD_STATE;
        free(files);
        return;
    }
    p->from_record = has == 1;
    for (long long i = 0; i < n && !has; i++)
        if (files[i].readable) {
            file_lineage(&files[i].info, &p->lineage);
            has = 1;
        }
    p->steps = malloc((size_t)(n ? n : 1) * sizeof *p->steps);
    if (!p->steps) abort();
    for (long long i = 0; i < n; i++) {
        if (!files[i].readable) { /* tried, and set aside when it fails and an older one works */
            p->steps[p->n++] = files[i].step;
            continue;
        }
        if (!same_lineage(&p->lineage, &files[i].info)) {
            refuse_other(p, cfg, &files[i], "continuing this directory's run beside them");
            free(files);
            return;
        }
        if (in_chain(&p->lineage, &files[i].info)) p->steps[p->n++] = files[i].step;
    }
    free(files);
    if (p->from_record && p->lineage.from[0]) { /* unless it is one of DIR's candidates */
        char own[GT_PATH_MAX + 64], real[PATH_MAX];
        int listed = 0;
        for (long long i = 0; i < p->n && !listed; i++) {
            state_path(own, sizeof own, dir, p->steps[i], 0);
            listed = strcmp(realpath(own, real) ? real : own, p->lineage.from) == 0;
        }
        if (!listed) snprintf(p->from, sizeof p->from, "%s", p->lineage.from);
    }
    if (p->n == 0 && !p->from[0]) {
        fresh_lineage(rank, &p->lineage);
        p->fresh = 1;
        p->from_record = 0;
    }
}

/* The lineage a run writes after it resumed file f (at `path`) of the plan. */
static void lineage_after_resume(const start_plan *p, const gt_state_info *f, const char *path, int rank,
                                 gt_lineage *out) {
    *out = p->lineage;
    if (!out->run_id[0]) branch_from(f, path, rank, out); /* a legacy file: an identity whose past it is */
}

/* Where the run starts and in which lineage: rank 0 plans (plan_start), every rank loads the
 * candidates in turn (each that fails to read is read once more before the next older one is
 * tried: a transient error on one rank must not demote the newest file), rank 0 records the
 * lineage. Returns 0 (resumed, or a fresh start), 2 (another lineage's files; the record cannot be
 * written) or 3, the same on every rank. */
static int resume(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run);
    int explicit_path = gt_config_resume(cfg) == GT_RESUME_PATH;
    const char *dir = cfg->checkpoint.dir;
    start_plan *plan = calloc(1, sizeof *plan);
    if (!plan) abort();
    if (rank == 0 && (dir[0] || explicit_path)) plan_start(cfg, rank, plan);
    else if (rank == 0) fresh_lineage(rank, &plan->lineage), plan->fresh = 1;
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
    if (!fresh) {
        code = GT_STATE_UNREADABLE;
        for (; i < candidates; i++) {
            if (explicit_path) snprintf(path, sizeof path, "%s", cfg->checkpoint.resume);
            else if (i < n) state_path(path, sizeof path, dir, plan->steps[i], 0);
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
    if (code == GT_STATE_OK && !fresh && !explicit_path && rank == 0)
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
    if (rank == 0) {
        if (fresh) run->lineage = plan->lineage;
        else lineage_after_resume(plan, &info, path, rank, &run->lineage);
        int same = plan->from_record && memcmp(&run->lineage, &plan->lineage, sizeof run->lineage) == 0;
        if (dir[0] && !same && write_lineage_record(dir, &run->lineage, msg, sizeof msg) != 0) rc = GT_EXIT_BAD_INPUT;
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
    state_path(own, sizeof own, dir, info.step, 0);
    if (dir[0] && strcmp(own, path) == 0) run->last_saved_step = (int)info.step;
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
 * file in checkpoint.dir whose attributes read (the one resume() will try first unless its tensors
 * then fail). 0, or -1 when there is none to look at. Rank 0. */
static int peek_resume_file(const gt_config *cfg, gt_state_info *info, char *path, size_t path_len) {
    char err[GT_PATH_MAX + 1024];
    if (gt_config_resume(cfg) == GT_RESUME_PATH) {
        snprintf(path, path_len, "%s", cfg->checkpoint.resume);
        return gt_state_read_info(path, info, err, sizeof err) == GT_STATE_OK ? 0 : -1;
    }
    start_plan *plan = calloc(1, sizeof *plan);
    if (!plan) abort();
    plan_start(cfg, 0, plan); /* a refusal (another lineage's files) is reported by the resume */
    int found = -1;
    for (long long i = 0; !plan->code && !plan->fresh && i <= plan->n && found; i++) {
        if (i < plan->n) state_path(path, path_len, cfg->checkpoint.dir, plan->steps[i], 0);
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
    run->file_bytes = gt_state_file_bytes(gt_model_layout(model));

    int rc = 0;
    if (cfg->checkpoint.dir[0]) rc = check_dir(run);
    if (!rc) rc = resume(run); /* also the lineage, and the refusal of a fresh start over another's files */
    /* after the resume: a run refused there (another lineage's files) leaves the directory as it was */
    if (!rc && cfg->checkpoint.dir[0] && rank_of(run) == 0) remove_stale_temporaries(cfg->checkpoint.dir);
    if (!rc && cfg->checkpoint.dir[0] && cfg->checkpoint.async) { /* the snapshot buffer, before step 1 */
        const gt_layout *layout = gt_model_layout(model);
        gt_shard mine = opt->shard;
        if (!opt->sharded) gt_shard_init(&mine, layout->n_params, gt_comm_size(comm), rank_of(run));
        run->writer = gt_async_save_new(opt->ops);
        gt_async_save_reserve(run->writer, mine.end - mine.begin);
    }
    run->last_save_time = MPI_Wtime();
    if (rc) gt_runstate_free(run);
    return rc;
}

/* Drops the oldest files beyond checkpoint.keep, counting the one just saved. Only files of this
 * run's chain (its branch and its past: "the lineage") count and go: another lineage's, an abandoned
 * branch's and one whose attributes do not read are never deleted. Files that failed verification
 * were renamed aside at the resume, so they are not counted; the one just saved is the newest that
 * verified and always among the kept. Rank 0, only after a save known to be durable. */
static void prune(const gt_run_state *run, int64_t saved_step) {
    const gt_config *cfg = run->cfg;
    if (cfg->checkpoint.keep <= 0) return;
    int64_t *steps = NULL;
    long long n = list_state_files(cfg->checkpoint.dir, &steps);
    size_t kept = 0;
    char path[GT_PATH_MAX + 64];
    for (long long i = 0; i < n; i++) {
        if (steps[i] >= saved_step) { /* ours, and newer ones: see the header comment */
            if (steps[i] == saved_step) kept++;
            continue;
        }
        state_path(path, sizeof path, cfg->checkpoint.dir, steps[i], 0);
        gt_state_info f;
        if (gt_state_read_lineage(path, &f) != GT_STATE_OK || !in_chain(&run->lineage, &f)) continue;
        if (kept++ < (size_t)cfg->checkpoint.keep) continue;
        if (unlink(path) != 0) fprintf(stderr, "gtrain: cannot delete %s: %s\n", path, strerror(errno));
        remove_unused_rank_dirs(cfg->checkpoint.dir, steps[i], NULL); /* its rank files, if any */
    }
    free(steps);
}

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

/* "the newest state file is DIR/step_N.h5" or "there is no state file of this run yet". */
void gt_runstate_describe_newest(const gt_run_state *run, char *out, size_t len) {
    if (run->last_saved_step > 0) {
        char path[GT_PATH_MAX + 64];
        state_path(path, sizeof path, run->cfg->checkpoint.dir, run->last_saved_step, 0);
        snprintf(out, len, "the newest state file is %s", path);
    } else {
        snprintf(out, len, "there is no state file of this run yet");
    }
}

/* What a state file of `step` says besides the tensors. */
static void save_info(const gt_run_state *run, int step, gt_state_info *out) {
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
    int rc = gt_test_hooks_get()->dir_fsync_eio ? (errno = EIO, -1) : fsync_path(dir, 1);
    if (rc == 0) return 1;
    snprintf(err, err_len, "rank 0: %s: %s (fsync of the directory after the rename: %s is complete but may not "
             "last, so it is not counted as saved and no older file is deleted)", dir, strerror(errno), path);
    return 0;
}

/* Saves in a row that failed: checkpoint.max_failed_saves. */
static void count_save(gt_run_state *run, int ok) { run->failed_saves = ok ? 0 : run->failed_saves + 1; }

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

/* The one line of a save that failed, from either writer: the step, its file, what failed (err:
 * the ranks, the file, the OS error), what was cleaned up (NULL: nothing was written), that older
 * files are untouched and which is the newest, and what the run does next (`then`). Rank 0. */
static void report_failed_save(const gt_run_state *run, int step, const char *err, const char *cleaned,
                               const char *then) {
    char path[GT_PATH_MAX + 64], newest[GT_PATH_MAX + 128];
    state_path(path, sizeof path, run->cfg->checkpoint.dir, step, 0);
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
    state_path(tmp, sizeof tmp, cfg->checkpoint.dir, step, 1);
    state_path(final_path, sizeof final_path, cfg->checkpoint.dir, step, 0);
    gt_state_info info;
    save_info(run, step, &info);

    run->opt->ops->synchronize();
    gt_watchdog_phase_begin("save", run->file_bytes); /* a rank stuck in it is named (watchdog.h) */
    double t0 = MPI_Wtime();
    char err[1024] = "", cleaned[GT_PATH_MAX + 160] = "its temporary file is deleted";
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
        int failed = fsync_path(tmp, 0) != 0;
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
        if (ok == 1) remove_unused_rank_dirs(cfg->checkpoint.dir, step, NULL); /* an asynchronous save it replaced */
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, run->mpi_comm);
    gt_watchdog_phase_end();
    double seconds = MPI_Wtime() - t0;
    run->last_save_time = MPI_Wtime();
    count_save(run, ok == 1);
    if (ok != 1) {
        if (rank == 0) report_failed_save(run, step, err, ok ? NULL : cleaned, then);
        return -1;
    }
    run->last_saved_step = step;
    if (rank == 0) {
        double gb = (double)file_size(final_path) / 1e9;
        printf("gtrain: saved %s: %.3f GB in %.2f s (%.2f GB/s)\n", final_path, gb, seconds,
               seconds > 0 ? gb / seconds : 0.0);
        fflush(stdout);
        save_record(run, step, 0, seconds * 1e3, seconds, (uint64_t)file_size(final_path));
        prune(run, step);
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
            rank_dir_name(run->pending_dir, sizeof run->pending_dir, step, generation++);
            snprintf(dir, sizeof dir, "%s/%s", cfg->checkpoint.dir, run->pending_dir);
        } while (path_exists(dir) && generation < 1000);
        if (mkdir(dir, 0777) != 0) {
            snprintf(err, sizeof err, "rank 0: %s: %s (mkdir)", dir, strerror(errno));
            ok = 0;
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, run->mpi_comm);
    if (!ok) {
        if (rank == 0) report_failed_save(run, step, err, NULL, then);
        count_save(run, 0);
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

    save_info(run, step, &run->pending_info);
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
    state_path(tmp, sizeof tmp, cfg->checkpoint.dir, step, 1);
    state_path(top, sizeof top, cfg->checkpoint.dir, step, 0);
    snprintf(dir, sizeof dir, "%s/%s", cfg->checkpoint.dir, rel);
    if (fsync_path(dir, 1) != 0) { /* the rank files' names, before a top file names them */
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
    if (fsync_path(tmp, 0) != 0 || rename(tmp, top) != 0) {
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
    state_path(top, sizeof top, cfg->checkpoint.dir, step, 0);
    snprintf(dir, sizeof dir, "%s/%s", cfg->checkpoint.dir, run->pending_dir);
    count_save(run, code == 0); /* (checkpoint.every_minutes counts from the copy: start_async) */
    if (code) {
        if (rank == 0 && published) report_failed_save(run, step, err, NULL, then); /* its files stay */
        else if (rank == 0) {
            char cleaned[GT_PATH_MAX + 160] = "its partial files are deleted";
            if (remove_rank_dir(dir) != 0) /* only its own: an older save of this step maps onto its directory */
                snprintf(cleaned, sizeof cleaned, "its partial files in %s could not be deleted (%s; the next start "
                         "deletes them)", dir, strerror(errno));
            report_failed_save(run, step, err, cleaned, then);
        }
        return -1;
    }
    run->last_saved_step = step;
    if (rank == 0) {
        uint64_t all_bytes = (uint64_t)totals[0] + (uint64_t)file_size(top);
        double gb = (double)all_bytes / 1e9;
        printf("gtrain: saved %s (%d rank files in %s): %.3f GB written in the background in %.2f s (%.2f GB/s); "
               "the loop was blocked %.0f ms\n", top, gt_comm_size(run->comm), dir, gb, totals[1],
               totals[1] > 0 ? gb / totals[1] : 0.0, run->pending_blocked_ms);
        fflush(stdout);
        save_record(run, step, 1, run->pending_blocked_ms, totals[1], all_bytes);
        remove_unused_rank_dirs(cfg->checkpoint.dir, step, NULL); /* an older save of this step it replaced */
        prune(run, step);
    }
    return 0;
}

/* The wait for the writers and the publish are one watchdog operation "save", like a synchronous
 * save: a rank whose writer never returns (a hung file system) is named with it, by the others
 * blocked in the agreement. */
static int finish_async(gt_run_state *run, const char *then) {
    gt_watchdog_phase_begin("save", run->file_bytes);
    int rc = finish_async_unwatched(run, then);
    gt_watchdog_phase_end();
    return rc;
}

/* A save in flight must be complete before the next starts, the run stops or ends: waits for it
 * and says how long, when it made the loop wait. Collective; finish_async's result (0 when none). */
static int wait_async(gt_run_state *run, const char *why, const char *then) {
    if (!run->pending_step) return 0;
    double t0 = MPI_Wtime();
    int pending = run->pending_step, rc = finish_async(run, then);
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
static int save(gt_run_state *run, int step, const char *then, int complete) {
    if (!run->cfg->checkpoint.async) return save_sync(run, step, then);
    char why[96];
    snprintf(why, sizeof why, "the save of step %d is due", step);
    wait_async(run, why, PERIODIC_THEN); /* never two writers on one rank */
    if (start_async(run, step, then) != 0) return -1;
    return complete ? wait_async(run, "the run ends or stops here", then) : 0;
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
    test_step_delay();
    if (step >= cfg->train.steps) return 0; /* the last step: gt_runstate_end saves, the run ends with 0 */
    /* one agreement per step: a stop signal on any rank, rank 0's clock for every_minutes, and
     * whether any rank's background save is still being written */
    int busy = run->pending_step && !gt_async_save_finished(run->writer);
    int mine[3] = {gt_signals_pending(), 0, busy}, all[3] = {0, 0, 0};
    if (has_dir && cfg->checkpoint.every_minutes > 0 && rank_of(run) == 0)
        mine[1] = MPI_Wtime() - run->last_save_time >= cfg->checkpoint.every_minutes * 60.0;
    gt_watchdog_enter("stop_agreement", sizeof mine);
    MPI_Allreduce(mine, all, 3, MPI_INT, MPI_MAX, run->mpi_comm);
    gt_watchdog_leave();
    if (run->pending_step && !all[2]) finish_async(run, PERIODIC_THEN); /* every writer is done: publish */
    int sig = all[0];
    if (!sig) {
        if (!saves_failing(run) && (by_steps || all[1])) save(run, step, PERIODIC_THEN, 0);
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
    wait_async(run, why, PERIODIC_THEN);
    if (run->last_saved_step != step &&
        save(run, step, last_save_then(run, "exit 1 (not 75: there is no new state to resume from)"), 1) != 0)
        return saves_failing(run) ? GT_EXIT_SAVES_FAILING : GT_EXIT_FAILURE;
    if (rank_of(run) == 0) {
        printf("gtrain: stopped by %s after step %d; the state is saved, exit %d\n", name, step, GT_EXIT_PREEMPTED);
        fflush(stdout);
    }
    return GT_EXIT_PREEMPTED;
}

int gt_runstate_end(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    if (!cfg->checkpoint.dir[0]) return 0;
    wait_async(run, "the run ends", PERIODIC_THEN); /* complete before exit */
    if (run->first_step > cfg->train.steps) return 0;    /* resumed at or past the end: nothing new */
    if (run->last_saved_step == cfg->train.steps) return 0; /* the periodic save was the last step */
    if (save(run, cfg->train.steps, last_save_then(run, "exit 1"), 1) == 0) return 0;
    return saves_failing(run) ? GT_EXIT_SAVES_FAILING : GT_EXIT_FAILURE;
}

void gt_runstate_settle(gt_run_state *run) {
    if (run->cfg && run->cfg->checkpoint.dir[0]) wait_async(run, "the run stops here", PERIODIC_THEN);
}

void gt_runstate_free(gt_run_state *run) {
    gt_async_save_free(run->writer); /* a run that ends with an error: its writer is joined, not published */
    free(run->pending_begins);
    free(run->pending_counts);
    if (run->mpi_comm != MPI_COMM_NULL && run->mpi_comm != 0) MPI_Comm_free(&run->mpi_comm);
    free(run->config_text);
    memset(run, 0, sizeof *run);
}
