/*
 * runstate_files.c — the names and the housekeeping of the files in checkpoint.dir (runstate_loop.c names
 * the policies): step_N.h5 and its temporary, the rank-file directories of asynchronous saves and
 * which state file maps onto each, listing the complete files newest first, fsync of a path, and
 * deleting what no state file needs (a killed save's temporary file and rank files).
 */

#include "runstate_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "state.h"
#include "testhooks.h"

void gt_rs_state_path(char *out, size_t len, const char *dir, int64_t step, int tmp) {
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
long long gt_rs_list_state_files(const char *dir, int64_t **steps_out) {
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

int gt_rs_fsync_path(const char *path, int directory) {
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
void gt_rs_rank_dir_name(char *out, size_t len, int64_t step, int generation) {
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
int gt_rs_remove_rank_dir(const char *path) {
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

int gt_rs_path_exists(const char *path) {
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
    gt_rs_state_path(top, sizeof top, dir, step, 0);
    if (gt_rs_path_exists(top)) {
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
void gt_rs_remove_unused_rank_dirs(const char *dir, int64_t step, const char *why) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[GT_PATH_MAX + 64];
    while ((e = readdir(d)) != NULL) {
        int64_t s = parse_rank_dir_name(e->d_name);
        if (s < 0 || (step >= 0 && s != step) || rank_dir_in_use(dir, s, e->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (gt_rs_remove_rank_dir(path) == 0 && why) printf("gtrain: removed %s, %s\n", path, why);
        else if (gt_rs_path_exists(path)) fprintf(stderr, "gtrain: cannot delete %s: %s\n", path, strerror(errno));
    }
    closedir(d);
}

/* A temporary file of a save that was killed, or rank files no state file maps onto (a save killed
 * before its top file was published, or after a re-save of the same step published its own): never
 * a complete state, safe to delete. Rank 0. */
void gt_rs_remove_stale_temporaries(const char *dir) {
    gt_rs_remove_unused_rank_dirs(dir, -1, "left by a save that did not finish");
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

off_t gt_rs_file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : 0;
}

void gt_rs_probe_token(char *out, size_t len, int rank) {
    uint64_t r = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, &r, sizeof r) != (ssize_t)sizeof r)
        r = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 20 ^ (uint64_t)rank;
    if (fd >= 0) close(fd);
    snprintf(out, len, "%016llx", (unsigned long long)r);
}
