/*
 * runstate_lineage.c — which runs' files a start may resume and rotate (runstate_loop.c, "where a run
 * starts"): the lineage of state files, DIR/.gtrain-lineage, and rank 0's plan for the start
 * (which files to try, newest first, or the refusal of another lineage's files).
 */

#include "runstate_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state.h"
#include "exitcodes.h"

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
 * file, or the file it started from while it has saved none (a branch begun fresh that has saved
 * none begins again under the same identity); never the newer files of the branch a rollback
 * abandoned. Without the record (a directory written before it existed, or copied without
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
int gt_rs_in_chain(const gt_lineage *l, const gt_state_info *f) {
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
    else gt_rs_probe_token(out->run_id, sizeof out->run_id, rank);
    gt_rs_probe_token(out->branch, sizeof out->branch, rank + 1);
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

void gt_rs_fresh_lineage(int rank, gt_lineage *out) {
    memset(out, 0, sizeof *out);
    gt_rs_probe_token(out->run_id, sizeof out->run_id, rank);
    gt_rs_probe_token(out->branch, sizeof out->branch, rank + 1);
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
int gt_rs_write_lineage_record(const char *dir, const gt_lineage *l, char *msg, size_t len) {
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
    if (ok) ok = gt_rs_fsync_path(dir, 1) == 0;
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

/* Lists DIR's state files with their attributes. -1 with errno when it cannot be listed. */
static long long list_with_info(const char *dir, listed_file **out) {
    int64_t *steps = NULL;
    long long n = gt_rs_list_state_files(dir, &steps);
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
        gt_rs_state_path(path, sizeof path, dir, steps[i], 0);
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
    gt_rs_state_path(path, sizeof path, cfg->checkpoint.dir, other->step, 0);
    snprintf(p->msg, sizeof p->msg,
             "%s: '%s' holds the state files of another run (its newest: %s, %s%s); %s would write over "
             "them (their names are step_N.h5): set checkpoint.dir to a directory of its own, or "
             "checkpoint.resume = auto (or that file's path) to continue that run", where, cfg->checkpoint.dir,
             path, other->info.run_id[0] ? "run_id " : "written without a run identity", other->info.run_id, what);
    p->code = GT_EXIT_BAD_INPUT;
}

/* Rank 0: the plan (start_plan) for checkpoint.resume and checkpoint.dir. */
void gt_rs_plan_start(const gt_config *cfg, int rank, start_plan *p) {
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
        gt_rs_fresh_lineage(rank, &p->lineage);
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
    p->has_record = has == 1;
    if (p->has_record) p->recorded = p->lineage;
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
        if (gt_rs_in_chain(&p->lineage, &files[i].info)) p->steps[p->n++] = files[i].step;
    }
    free(files);
    if (p->from_record && p->lineage.from[0]) { /* unless it is one of DIR's candidates */
        char own[GT_PATH_MAX + 64], real[PATH_MAX];
        int listed = 0;
        for (long long i = 0; i < p->n && !listed; i++) {
            gt_rs_state_path(own, sizeof own, dir, p->steps[i], 0);
            listed = strcmp(realpath(own, real) ? real : own, p->lineage.from) == 0;
        }
        if (!listed) snprintf(p->from, sizeof p->from, "%s", p->lineage.from);
    }
    if (p->n == 0 && !p->from[0]) {
        p->fresh = 1;
        /* nothing saved yet: a recorded branch that began fresh begins again, in the same run (a fault
         * before its first save stays in its history, and a memory snapshot of it is its own) */
        if (p->from_record && !p->lineage.from[0] && !p->lineage.parents[0]) return;
        gt_rs_fresh_lineage(rank, &p->lineage);
        p->from_record = 0;
    }
}

/* The lineage a run writes after it resumed file f (at `path`) of the plan. */
void gt_rs_lineage_after_resume(const start_plan *p, const gt_state_info *f, const char *path, int rank,
                                 gt_lineage *out) {
    *out = p->lineage;
    if (!out->run_id[0]) branch_from(f, path, rank, out); /* a legacy file: an identity whose past it is */
}
