/*
 * runclaim.c — one run per checkpoint.dir (see runclaim.h).
 *
 * The claim is the file DIR/.gtrain-claim, a few "key = value" lines naming its owner. Rank 0 writes
 * its record completely into a private temporary name (O_CREAT|O_EXCL, fsync) and link(2)s it to the
 * claim's name: link never replaces, so of two runs only one can succeed, on a local disk and on NFS
 * alike, where flock is often missing. It then reads the claim back and compares the token, since
 * an NFS link retried after a lost reply reports EEXIST for a link that did succeed.
 *
 * A claim that is there is judged by its owner. An owner on this host is judged by its process alone,
 * whatever Slurm job or step it is: stale when the process no longer exists (kill(pid, 0), checked
 * against the process's start time and the boot id so that a reused pid is not taken for the owner),
 * else live and refused, even with checkpoint.takeover. An owner on another host is stale when it is a
 * start of the same Slurm job before a requeue (a lower restart count); an earlier step of the same
 * job and start, once squeue no longer lists that step; another Slurm job (this run being one too)
 * that squeue says has ended. "The same job" is the same job id on the same cluster (SLURM_CLUSTER_NAME,
 * recorded in the claim): job ids are the cluster's own, and a claim of another cluster is asked about
 * with squeue -M CLUSTER, so that this cluster's "Invalid job id" is not read as its end. Any other
 * claim from another host, whose liveness cannot be seen from here, is refused unless
 * checkpoint.takeover = true. A stale claim is moved aside by rename, read again and deleted only if
 * it is still the one judged stale (else it is put back), so two runs that both found it stale cannot
 * both take it. The claim costs nothing per step; it is removed at the run's end.
 */
#define _GNU_SOURCE /* gethostname */

#include "runclaim.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agree.h"
#include "errmsg.h"
#include "exitcodes.h"
#include "runstate.h"

#define CLAIM_NAME ".gtrain-claim"
#define READ_TRIES 10      /* a claim being written (the no-link fallback) is re-read, 100 ms apart */
#define CLAIM_ATTEMPTS 5   /* link, judge, remove a stale claim, link again */

typedef struct owner {
    char host[256];
    long pid;
    unsigned long long pid_start; /* clock ticks after boot, /proc/PID/stat field 22; 0 unknown */
    char boot_id[64];
    char slurm_job[64];           /* "" outside Slurm */
    char slurm_cluster[64];       /* SLURM_CLUSTER_NAME; "" when unset (or a claim of an older gtrain) */
    long slurm_restart;
    long slurm_step;              /* SLURM_STEP_ID; -1 outside a step */
    char since[32];               /* UTC, ISO 8601 */
    char token[40];
    char config[GT_PATH_MAX];
} owner;

/* The claim this process holds (one run per process), for gt_runclaim_release and atexit. */
static struct {
    int held;
    char path[GT_PATH_MAX + 64];
    char token[40];
} held_claim;

/* ------------------------------------------------------------------------------------------------
 * This process, and the owner record
 * ---------------------------------------------------------------------------------------------- */

static void read_line_file(const char *path, char *out, size_t len) {
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(out, (int)len, f)) out[strcspn(out, "\n")] = '\0';
    fclose(f);
}

/* Field 22 of /proc/PID/stat (start time in clock ticks after boot), and whether the process is a
 * zombie (dead, not yet reaped: kill(pid, 0) still succeeds). 0 when it cannot be read. */
static unsigned long long process_start(long pid, int *zombie) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    *zombie = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold blanks and parentheses */
    if (!p) return 0;
    char state = 0;
    unsigned long long start = 0;
    /* after ")": state, then fields 4..21, then starttime */
    if (sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &state,
               &start) != 2)
        return 0;
    *zombie = state == 'Z' || state == 'X';
    return start;
}

static void random_token(char *out, size_t len) {
    unsigned long long r[2] = {0, 0};
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r[0] = (unsigned long long)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (unsigned long long)getpid();
        r[1] = (unsigned long long)ts.tv_sec;
    }
    if (fd >= 0) close(fd);
    snprintf(out, len, "%016llx%016llx", r[0], r[1]);
}

static void this_process(owner *me, const gt_config *cfg) {
    memset(me, 0, sizeof *me);
    gethostname(me->host, sizeof me->host);
    me->host[sizeof me->host - 1] = '\0';
    me->pid = (long)getpid();
    int zombie;
    me->pid_start = process_start(me->pid, &zombie);
    read_line_file("/proc/sys/kernel/random/boot_id", me->boot_id, sizeof me->boot_id);
    const char *job = getenv("SLURM_JOB_ID");
    const char *restart = getenv("SLURM_RESTART_COUNT"); /* set only after a requeue: unset is 0 */
    snprintf(me->slurm_job, sizeof me->slurm_job, "%s", job ? job : "");
    const char *cluster = getenv("SLURM_CLUSTER_NAME");
    snprintf(me->slurm_cluster, sizeof me->slurm_cluster, "%s", job && cluster ? cluster : "");
    me->slurm_restart = restart ? atol(restart) : 0;
    const char *step = getenv("SLURM_STEP_ID");
    me->slurm_step = step ? atol(step) : -1;
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(me->since, sizeof me->since, "%Y-%m-%dT%H:%M:%SZ", &utc);
    random_token(me->token, sizeof me->token);
    snprintf(me->config, sizeof me->config, "%s", cfg->path);
}

static int format_owner(const owner *o, char *out, size_t len) {
    return snprintf(out, len,
                    "gtrain run claim: this directory is in use by the run below (docs/reliability.md)\n"
                    "host = %s\npid = %ld\npid_start = %llu\nboot_id = %s\nslurm_job = %s\nslurm_cluster = %s\n"
                    "slurm_restart = %ld\nslurm_step = %ld\nsince = %s\ntoken = %s\nconfig = %s\n",
                    o->host, o->pid, o->pid_start, o->boot_id, o->slurm_job, o->slurm_cluster, o->slurm_restart,
                    o->slurm_step, o->since, o->token, o->config);
}

/* 0 when the record has at least a host, a pid and a token; -1 with errno ENOENT when there is no
 * file; -1 with errno 0 when it does not parse (being written, or not gtrain's). */
static int parse_owner(const char *path, owner *o) {
    memset(o, 0, sizeof *o);
    o->slurm_step = -1; /* a record without the key names no step */
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[GT_PATH_MAX + 64];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *eq = strstr(line, " = ");
        if (!eq) continue;
        *eq = '\0';
        const char *k = line, *v = eq + 3;
        if (!strcmp(k, "host")) snprintf(o->host, sizeof o->host, "%s", v);
        else if (!strcmp(k, "pid")) o->pid = atol(v);
        else if (!strcmp(k, "pid_start")) o->pid_start = strtoull(v, NULL, 10);
        else if (!strcmp(k, "boot_id")) snprintf(o->boot_id, sizeof o->boot_id, "%s", v);
        else if (!strcmp(k, "slurm_job")) snprintf(o->slurm_job, sizeof o->slurm_job, "%s", v);
        else if (!strcmp(k, "slurm_cluster")) snprintf(o->slurm_cluster, sizeof o->slurm_cluster, "%s", v);
        else if (!strcmp(k, "slurm_restart")) o->slurm_restart = atol(v);
        else if (!strcmp(k, "slurm_step")) o->slurm_step = atol(v);
        else if (!strcmp(k, "since")) snprintf(o->since, sizeof o->since, "%s", v);
        else if (!strcmp(k, "token")) snprintf(o->token, sizeof o->token, "%s", v);
        else if (!strcmp(k, "config")) snprintf(o->config, sizeof o->config, "%s", v);
    }
    fclose(f);
    errno = 0;
    return o->host[0] && o->pid > 0 && o->token[0] ? 0 : -1;
}

/* parse_owner, re-read while a record is incomplete (a writer of the no-link fallback, mid-write). */
static int read_owner(const char *path, owner *o) {
    for (int i = 0; i < READ_TRIES; i++) {
        if (parse_owner(path, o) == 0) return 0;
        if (errno == ENOENT) return -1;
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    errno = 0;
    return -1;
}

static void describe_owner(const owner *o, char *out, size_t len) {
    snprintf(out, len, "pid %ld on host %s", o->pid, o->host);
    if (o->slurm_job[0] && o->slurm_cluster[0])
        gt_appendf(out, len, " (Slurm job %s of cluster %s, restart %ld)", o->slurm_job, o->slurm_cluster, o->slurm_restart);
    else if (o->slurm_job[0]) gt_appendf(out, len, " (Slurm job %s, restart %ld)", o->slurm_job, o->slurm_restart);
    gt_appendf(out, len, ", since %s", o->since[0] ? o->since : "(unknown)");
}

/* ------------------------------------------------------------------------------------------------
 * Judging a claim that is there
 * ---------------------------------------------------------------------------------------------- */

enum verdict { OWNER_LIVE, OWNER_ELSEWHERE, OWNER_UNREADABLE, OWNER_GONE };

/* Runs a squeue command line (no shell text in it: every word is checked by the caller) for at most
 * 10 s; its output (stderr too) in out, the lines "CLUSTER: NAME" that squeue -M prints first left
 * out and the lines joined by "; ". Returns the exit status: 0 when squeue answered. */
static int ask_squeue(const char *args, char *out, size_t len) {
    char cmd[256], line[256];
    snprintf(cmd, sizeof cmd, "timeout 10 squeue %s 2>&1", args);
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0] || !strncmp(line, "CLUSTER: ", 9)) continue;
        gt_appendf(out, len, "%s%s", out[0] ? "; " : "", line);
    }
    int status = pclose(p);
    return status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* A name read from a claim file that may go on squeue's command line: no shell text. */
static int plain_word(const char *s, const char *allowed) { return s[0] && strspn(s, allowed) == strlen(s); }
#define JOB_CHARS "0123456789_"
#define CLUSTER_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-."

/* The claim's job and this run's are one Slurm job: the same job id on the same cluster (a claim of
 * an older gtrain, with no cluster, matches a run whose SLURM_CLUSTER_NAME is unset alone). */
static int same_slurm_job(const owner *o, const owner *me) {
    return o->slurm_job[0] && !strcmp(o->slurm_job, me->slurm_job) && !strcmp(o->slurm_cluster, me->slurm_cluster);
}

/* A claim of another Slurm job, held on another host: Slurm knows whether that job still runs, asked
 * on the claim's cluster (squeue -M when it is not this run's). 1 when it has ended (a state after
 * the end, or a job that cluster no longer knows), with `why` filled; 0 when it runs, when Slurm
 * cannot be asked (no squeue, no answer in 10 s, a cluster squeue -M cannot reach), or when the claim
 * names no cluster while this run has one: another cluster's job ids are not this cluster's. */
static int slurm_job_ended(const owner *o, const owner *me, char *why, size_t why_len) {
    if (!plain_word(o->slurm_job, JOB_CHARS)) return 0; /* read from a file: no shell text */
    int here = !strcmp(o->slurm_cluster, me->slurm_cluster);
    if (!here && !plain_word(o->slurm_cluster, CLUSTER_CHARS)) return 0; /* which cluster: unknown */
    char args[160], out[512];
    if (here) snprintf(args, sizeof args, "-h -j %s -o %%T", o->slurm_job);
    else snprintf(args, sizeof args, "-M %s -h -j %s -o %%T", o->slurm_cluster, o->slurm_job);
    ask_squeue(args, out, sizeof out);
    static const char *const ended[] = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL",
                                        "DEADLINE", "OUT_OF_MEMORY", "PREEMPTED"};
    int gone = strstr(out, "Invalid job id") != NULL;
    for (size_t i = 0; !gone && i < sizeof ended / sizeof ended[0]; i++) gone = strcmp(out, ended[i]) == 0;
    if (gone) {
        char job[160];
        snprintf(job, sizeof job, "%s", o->slurm_job);
        if (!here) gt_appendf(job, sizeof job, " of cluster %s", o->slurm_cluster);
        /* out is one of the states above here, or the "Invalid job id" text */
        snprintf(why, why_len, "a run that is gone: Slurm job %s has ended (squeue: %.32s)", job,
                 strstr(out, "Invalid job id") ? "no such job any more" : out);
    }
    return gone;
}

/* An earlier step of this run's own job (same job, same start), held on another host: gone once
 * squeue, asked for that step alone, answers with no line (a step that ended is no longer listed;
 * this job itself runs, so Slurm knows it). 0 when it lists the step or cannot be asked. */
static int slurm_step_ended(const owner *o, const owner *me, char *why, size_t why_len) {
    if (!plain_word(o->slurm_job, JOB_CHARS)) return 0;
    char args[160], out[512];
    snprintf(args, sizeof args, "-h -s%s.%ld -o %%i", o->slurm_job, o->slurm_step);
    if (ask_squeue(args, out, sizeof out) != 0 || out[0]) return 0;
    snprintf(why, why_len, "a run that is gone: a later step of the same Slurm job %s (step %ld after %ld), and Slurm "
             "lists step %s.%ld no more", o->slurm_job, me->slurm_step, o->slurm_step, o->slurm_job, o->slurm_step);
    return 1;
}

/* Whether the owner is gone, and why (for the takeover line). */
static enum verdict judge(const owner *o, int readable, const owner *me, char *why, size_t why_len) {
    if (!readable) return OWNER_UNREADABLE;
    if (strcmp(o->host, me->host) != 0) {
        /* a requeued job: Slurm ended every step of the start before */
        if (same_slurm_job(o, me) && me->slurm_restart > o->slurm_restart) {
            snprintf(why, why_len, "a run that is gone: the same Slurm job %s restarted, restart %ld after %ld",
                     o->slurm_job, me->slurm_restart, o->slurm_restart);
            return OWNER_GONE;
        }
        /* launch/gtrain.sbatch re-runs the step inside the same allocation after a node is lost (same
         * job, same restart), and rank 0 may now run elsewhere; but steps of one job may also run side
         * by side (a sweep of srun steps): gone only once Slurm says the earlier step ended */
        if (same_slurm_job(o, me) && me->slurm_restart == o->slurm_restart && o->slurm_step >= 0 &&
            me->slurm_step > o->slurm_step)
            return slurm_step_ended(o, me, why, why_len) ? OWNER_GONE : OWNER_ELSEWHERE;
        if (o->slurm_job[0] && me->slurm_job[0] && !same_slurm_job(o, me) && slurm_job_ended(o, me, why, why_len))
            return OWNER_GONE;
        return OWNER_ELSEWHERE;
    }
    /* this host: the process tells, whatever Slurm job or step it belongs to */
    if (o->boot_id[0] && me->boot_id[0] && strcmp(o->boot_id, me->boot_id) != 0) {
        snprintf(why, why_len, "a run that is gone: this host has rebooted since");
        return OWNER_GONE;
    }
    if (kill((pid_t)o->pid, 0) != 0 && errno == ESRCH) {
        snprintf(why, why_len, "a run that is gone: pid %ld no longer exists", o->pid);
        return OWNER_GONE;
    }
    int zombie;
    unsigned long long start = process_start(o->pid, &zombie);
    if (zombie) {
        snprintf(why, why_len, "a run that is gone: pid %ld has exited", o->pid);
        return OWNER_GONE;
    }
    if (o->pid_start && start && start != o->pid_start) {
        snprintf(why, why_len, "a run that is gone: pid %ld is now another process", o->pid);
        return OWNER_GONE;
    }
    return OWNER_LIVE; /* kill succeeded, or EPERM: another user's live process */
}

/* The refusal: one line naming the owner and what to do. */
static void refusal(const gt_config *cfg, const char *path, enum verdict v, const owner *o, const owner *me,
                    char *msg, size_t len) {
    char where[GT_PATH_MAX + 128], who[512];
    gt_config_where(cfg, "checkpoint", "dir", where, sizeof where);
    describe_owner(o, who, sizeof who);
    if (v == OWNER_UNREADABLE) {
        snprintf(msg, len, "%s: '%s' holds a claim file %s that does not read as gtrain's run claim (expected "
                 "no other run on this directory; if none uses it, delete that file or set "
                 "checkpoint.takeover=true)", where, cfg->checkpoint.dir, path);
    } else if (v == OWNER_LIVE) {
        snprintf(msg, len, "%s: '%s' is in use by another run: %s (its claim: %s); two runs on one directory "
                 "overwrite each other's state files (expected another checkpoint.dir, or that run stopped "
                 "first: kill -TERM %ld saves and ends it)", where, cfg->checkpoint.dir, who, path, o->pid);
    } else {
        snprintf(msg, len, "%s: '%s' is in use by another run: %s (its claim: %s), and whether a process on "
                 "another host is alive cannot be seen from %s; two runs on one directory overwrite each "
                 "other's state files (expected another checkpoint.dir; if that run is gone, set "
                 "checkpoint.takeover=true once, or delete %s)", where, cfg->checkpoint.dir, who, path, me->host,
                 path);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Creating, moving and removing the claim file
 * ---------------------------------------------------------------------------------------------- */

/* Writes text into a new file (O_EXCL: never someone else's) and fsyncs it. 0 or -1 with errno. */
static int write_new_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    size_t n = strlen(text);
    errno = 0;
    int ok = write(fd, text, n) == (ssize_t)n && fsync(fd) == 0;
    int saved = ok ? 0 : (errno ? errno : ENOSPC);
    if (close(fd) != 0 && ok) ok = 0, saved = errno;
    if (!ok) {
        unlink(path);
        errno = saved;
        return -1;
    }
    return 0;
}

/* Makes the claim file from the complete temporary one: link(2), which never replaces; where the
 * file system has no hard links, an O_EXCL create of the claim itself (a reader may then see it
 * half written, and re-reads). 0, or -1 with errno (EEXIST: there is a claim). */
static int publish(const char *tmp, const char *path, const char *text) {
    if (link(tmp, path) == 0) return 0;
    if (errno == EEXIST) return -1;
    if (errno != EPERM && errno != EOPNOTSUPP && errno != ENOSYS && errno != EMLINK) return -1;
    return write_new_file(path, text);
}

/* Removes the stale claim `stale` unless another run replaced it meanwhile: move it aside, read it,
 * delete it if it is the one judged, else put it back. */
static void remove_stale(const char *path, const char *aside, const owner *stale) {
    if (rename(path, aside) != 0) return; /* gone already: another run removed it */
    owner moved;
    if (parse_owner(aside, &moved) == 0 ? strcmp(moved.token, stale->token) == 0 : !stale->token[0]) {
        unlink(aside);
        return;
    }
    if (link(aside, path) == 0) unlink(aside); /* a live run's claim, taken by mistake: back it goes */
    else if (errno != EEXIST) rename(aside, path);
}

static void release_at_exit(void) { gt_runclaim_release(); }

/* Rank 0: the claim loop. Returns 0 (held, or nothing to hold) or 2 with msg filled. */
static int claim(const gt_config *cfg, char *msg, size_t len) {
    const char *dir = cfg->checkpoint.dir;
    if (gt_make_dirs(dir) != 0) return 0; /* the directory check names the path and the error */
    owner me, o;
    this_process(&me, cfg);
    char path[GT_PATH_MAX + 64], tmp[GT_PATH_MAX + 128], aside[GT_PATH_MAX + 128], text[GT_PATH_MAX + 1024];
    snprintf(path, sizeof path, "%s/" CLAIM_NAME, dir);
    snprintf(tmp, sizeof tmp, "%s/" CLAIM_NAME ".new.%s", dir, me.token);
    snprintf(aside, sizeof aside, "%s/" CLAIM_NAME ".old.%s", dir, me.token);
    format_owner(&me, text, sizeof text);
    if (write_new_file(tmp, text) != 0) {
        int e = errno;
        if (e != EACCES && e != EROFS && e != ENOTDIR && e != ENOENT && e != EPERM) /* those: the dir check */
            fprintf(stderr, "gtrain: warning: cannot claim checkpoint.dir '%s' for this run (%s: %s): another run "
                    "started on it would not be refused\n", dir, tmp, strerror(e));
        return 0;
    }
    int code = 0, warned = 0;
    for (int attempt = 0; attempt < CLAIM_ATTEMPTS; attempt++) {
        int linked = publish(tmp, path, text) == 0, e = errno;
        if (!linked && e != EEXIST) {
            fprintf(stderr, "gtrain: warning: cannot claim checkpoint.dir '%s' for this run (%s: %s): another run "
                    "started on it would not be refused\n", dir, path, strerror(e));
            warned = 1;
            break;
        }
        int readable = read_owner(path, &o) == 0;
        if (!readable && errno == ENOENT) continue; /* removed meanwhile (a release, a takeover): again */
        if (readable && strcmp(o.token, me.token) == 0) {
            held_claim.held = 1;
            snprintf(held_claim.path, sizeof held_claim.path, "%s", path);
            snprintf(held_claim.token, sizeof held_claim.token, "%s", me.token);
            break;
        }
        char why[512] = "";
        enum verdict v = judge(&o, readable, &me, why, sizeof why);
        if (v != OWNER_GONE && v != OWNER_LIVE && cfg->checkpoint.takeover) {
            snprintf(why, sizeof why, "checkpoint.takeover = true, so gtrain does not ask whether it is alive");
            v = OWNER_GONE;
        }
        if (v != OWNER_GONE) {
            refusal(cfg, path, v, &o, &me, msg, len);
            code = GT_EXIT_BAD_INPUT;
            break;
        }
        char who[512];
        if (readable) describe_owner(&o, who, sizeof who);
        else snprintf(who, sizeof who, "an unreadable claim");
        printf("gtrain: checkpoint.dir '%s' was claimed by %s (%s): this run takes it over\n", dir, who, why);
        fflush(stdout);
        remove_stale(path, aside, readable ? &o : &(owner){0});
    }
    unlink(tmp);
    if (held_claim.held) {
        static int registered;
        if (!registered) registered = atexit(release_at_exit) == 0;
    } else if (!code && !warned) { /* the claim changed hands on every attempt: safer to stop than to share */
        char where[GT_PATH_MAX + 128];
        gt_config_where(cfg, "checkpoint", "dir", where, sizeof where);
        snprintf(msg, len, "%s: '%s': its claim %s changed hands on each of %d attempts to take it (expected "
                 "one run starting on it at a time; start this one again)", where, dir, path, CLAIM_ATTEMPTS);
        code = GT_EXIT_BAD_INPUT;
    }
    return code;
}

int gt_runclaim_take(const gt_config *cfg, MPI_Comm comm) {
    if (!cfg->checkpoint.dir[0]) return 0;
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    char msg[6 * GT_PATH_MAX] = "";
    int code = rank == 0 ? claim(cfg, msg, sizeof msg) : 0;
    code = gt_agree_on_failure(comm, code, msg, sizeof msg);
    if (code && rank == 0) {
        fprintf(stderr, "gtrain: %s\n", msg);
        fflush(stderr);
    }
    return code;
}

void gt_runclaim_release(void) {
    if (!held_claim.held) return;
    held_claim.held = 0;
    owner o;
    if (parse_owner(held_claim.path, &o) == 0 && strcmp(o.token, held_claim.token) == 0) unlink(held_claim.path);
}
