/*
 * watchdog.c — the hang detector (see watchdog.h). The training thread only stores into `live`
 * (relaxed atomics: a torn view costs at most a second of staleness in a message); the watchdog
 * thread reads it, publishes it as one text line per rank, and on a timeout reads the others'
 * lines, writes the verdict and _exits. The flight recorder's ring is written by the training
 * thread itself, into memory mapped from a file. _exit, not MPI_Abort: this thread makes no MPI call, and
 * the launcher ends the remaining ranks when one exits non-zero (mpirun returns that rank's code).
 */
#define _GNU_SOURCE /* gethostname, O_CLOEXEC */

#include "watchdog.h"

#include "pathmax.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HEARTBEAT_S 1.0   /* at most: a quarter of dist.liveness_timeout when that is shorter */
#define STALE_S 5.0       /* a record older than this: its process is stopped or dead */
#define RECORD_BYTES 512
#define ABORT_GRACE_S 10  /* the most the on-fire hook (an NCCL abort) may take before the exit */

typedef struct live_state {
    const char *op;        /* the collective this rank is in or last was in (a string literal) */
    uint64_t started;      /* collectives started so far */
    uint64_t seq;          /* the one it is in (or last was in) */
    int in;                /* 1 while inside a collective */
    double in_since;       /* wall clock (CLOCK_REALTIME, comparable across nodes) */
    int step;              /* the step it is working on */
    int last_done;         /* the last step it finished */
    double last_done_at;   /* when (or when the watchdog started) */
    double slowest_step_s;
    const char *phase;     /* the long operation this rank is in (a save), or NULL */
    uint64_t phase_seq;    /* its sequence number */
    uint64_t phase_calls;  /* tracked calls started inside it so far */
    double phase_since;
    /* a save's progress: bytes written (by any thread of this rank, gt_watchdog_progress) and when
     * the last progress was made (bytes written, or a call of the phase completed) */
    uint64_t progress_bytes;
    uint64_t phase_bytes0; /* progress_bytes when the phase began */
    double progress_at;
    /* the training thread's progress, for the wedge clock (watchdog.h): bumped by every kernel begin
     * and end, collective, and step boundary */
    uint64_t ticks;
    int in_step;           /* between gt_watchdog_step_begin and _done */
    const char *kop;       /* the kernel it is in or last was in (a string literal), or NULL */
    int kin;               /* 1 while inside it */
} live_state;

static live_state live;
static int running;
static int stopping;
static pthread_t thread;
static pthread_mutex_t stop_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stop_cond = PTHREAD_COND_INITIALIZER;
#define DIR_BYTES (GT_PATH_MAX + 64)    /* checkpoint.dir/.watchdog, or /dev/shm/gtrain-watchdog-PID-TIME */
#define PATH_BYTES (DIR_BYTES + 128)    /* a file in it */
static char dir[DIR_BYTES];
static int my_rank, world_size;
static double timeout_s;
static double liveness_s, heartbeat_s;
/* the wedge clock, kept by the watchdog thread alone: the training thread's CPU time while it made
 * no progress inside a step, and the longest such stretch that ended */
static clockid_t main_cpu_clock;
static int have_main_cpu_clock;
static uint64_t quiet_ticks;
static double quiet_cpu_at, quiet_s, longest_quiet_s;
/* the neighbours' heartbeats as this rank saw them: their record's written-at stamp (a token that
 * changes with each write) and when, on this rank's monotonic clock, it last changed */
typedef struct beat_seen {
    int known, pid;
    double token, changed_at;
} beat_seen;
static beat_seen seen[2];
/* the flight recorder's ring, mapped from DIR/flight_NNNNN (watchdog.h) */
typedef struct flight_entry {
    uint64_t seq, bytes;
    double t_issue, t_done;
    int32_t step, state;
    char op[24];
} flight_entry;
typedef struct flight_header {
    char magic[16];
    uint32_t entries;
    int32_t rank, pid;
    char pad[36];
} flight_header;
_Static_assert(sizeof(flight_entry) == 64 && sizeof(flight_header) == 64, "the file layout of watchdog.h");
static flight_header *flight;          /* NULL: no recorder */
static flight_entry *ring;
static size_t flight_bytes;
static int owns_tmp_dir;
static void (*on_fire)(void *);
static void *on_fire_arg;   /* the /dev/shm fallback (a killed job's is swept by the next job's start) */

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double load_double(const double *p) {
    double v;
    __atomic_load(p, &v, __ATOMIC_RELAXED);
    return v;
}
static void store_double(double *p, double v) { __atomic_store(p, &v, __ATOMIC_RELAXED); }

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the training thread's CPU seconds (the monotonic clock where the system cannot tell) */
static double main_cpu_now(void) {
    struct timespec ts;
    if (!have_main_cpu_clock || clock_gettime(main_cpu_clock, &ts) != 0) return mono_now();
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void flight_issue(uint64_t seq, const char *op, uint64_t bytes, double t) {
    if (!ring) return;
    flight_entry *e = &ring[seq % GT_FLIGHT_ENTRIES];
    e->state = 0;
    e->seq = seq;
    e->bytes = bytes;
    e->t_issue = t;
    e->t_done = 0;
    e->step = live.step;
    strncpy(e->op, op, sizeof e->op - 1);
    e->op[sizeof e->op - 1] = '\0';
    e->state = 1;
}

static void flight_done(uint64_t seq) {
    if (!ring) return;
    flight_entry *e = &ring[seq % GT_FLIGHT_ENTRIES];
    if (e->seq != seq) return; /* overwritten since it was started: K newer ones went by */
    e->t_done = wall_now();
    e->state = 2;
}

/* One record per rank, kept by the thread that started the watchdog (the training thread): calls
 * from any other thread (a background save writer) are not counted. */
static pthread_t owner;
static int tracking(void) { return LOAD(running) && pthread_equal(pthread_self(), owner); }

/* the training thread made progress (only it writes `ticks`) */
static void tick(void) { STORE(live.ticks, LOAD(live.ticks) + 1); }

void gt_watchdog_kernel_begin(const char *op) {
    if (!tracking()) return;
    STORE(live.kop, op);
    STORE(live.kin, 1);
    tick();
}

void gt_watchdog_kernel_end(void) {
    if (!tracking()) return;
    STORE(live.kin, 0);
    tick();
}

uint64_t gt_watchdog_enter(const char *op, uint64_t bytes) {
    if (!tracking()) return 0;
    tick();
    double t = wall_now();
    if (LOAD(live.phase)) { /* a call inside a save: numbered within it, not in the ring */
        uint64_t call = LOAD(live.phase_calls) + 1;
        STORE(live.phase_calls, call);
        STORE(live.op, op);
        store_double(&live.in_since, t);
        STORE(live.in, 1);
        return LOAD(live.phase_seq);
    }
    uint64_t seq = LOAD(live.started) + 1;
    flight_issue(seq, op, bytes, t);
    STORE(live.started, seq);
    STORE(live.op, op);
    STORE(live.seq, seq);
    store_double(&live.in_since, t);
    STORE(live.in, 1);
    return seq;
}

void gt_watchdog_leave(void) {
    if (!tracking()) return;
    tick();
    STORE(live.in, 0);
    if (!LOAD(live.phase)) flight_done(LOAD(live.seq));
    else store_double(&live.progress_at, wall_now()); /* a call of the save completed */
}

void gt_watchdog_progress(uint64_t bytes) {
    if (!LOAD(running)) return;
    __atomic_add_fetch(&live.progress_bytes, bytes, __ATOMIC_RELAXED);
    store_double(&live.progress_at, wall_now());
}

uint64_t gt_watchdog_phase_begin(const char *name, uint64_t bytes) {
    uint64_t seq = gt_watchdog_enter(name, bytes);
    if (!seq) return 0;
    STORE(live.in, 0); /* in the phase, not (yet) waiting in one of its calls */
    STORE(live.phase_calls, 0);
    STORE(live.phase_bytes0, LOAD(live.progress_bytes));
    store_double(&live.phase_since, load_double(&live.in_since));
    STORE(live.phase_seq, seq);
    STORE(live.phase, name);
    return seq;
}

void gt_watchdog_phase_end(void) {
    if (!tracking() || !LOAD(live.phase)) return;
    const char *name = LOAD(live.phase);
    STORE(live.phase, (const char *)NULL);
    STORE(live.in, 0);
    STORE(live.op, name);
    STORE(live.seq, LOAD(live.phase_seq));
    flight_done(LOAD(live.phase_seq));
}

void gt_watchdog_on_fire(void (*fn)(void *arg), void *arg) {
    on_fire_arg = arg;
    __atomic_store_n(&on_fire, fn, __ATOMIC_RELEASE);
}

uint64_t gt_watchdog_started(const char *op, uint64_t bytes) {
    uint64_t seq = gt_watchdog_enter(op, bytes);
    if (seq) STORE(live.in, 0); /* in flight until waited for: the ring entry stays open */
    return seq;
}

void gt_watchdog_enter_wait(const char *op, uint64_t seq) {
    if (!tracking()) return;
    tick();
    STORE(live.op, op);
    STORE(live.seq, seq);
    store_double(&live.in_since, wall_now());
    STORE(live.in, 1);
}

void gt_watchdog_step_begin(int step) {
    if (!tracking()) return;
    tick();
    STORE(live.step, step);
    STORE(live.in_step, 1);
}

void gt_watchdog_step_done(int step, double seconds) {
    if (!tracking()) return;
    tick();
    STORE(live.in_step, 0);
    int first = LOAD(live.last_done) == 0; /* it pays for allocation and cold caches: not a measure */
    STORE(live.last_done, step);
    store_double(&live.last_done_at, wall_now());
    if (!first && seconds > load_double(&live.slowest_step_s)) store_double(&live.slowest_step_s, seconds);
}

/* ---------------------------------------------------------------- records */

typedef struct record {
    int rank, pid, in, step, last_done;
    unsigned long long started, seq, phase_seq, phase_calls;
    double in_since, last_done_at, written_at, phase_since;
    unsigned long long phase_bytes; /* bytes this rank wrote in the phase */
    double progress_at;             /* its last progress (watchdog.h: gt_watchdog_progress) */
    char op[32], host[64], phase[32]; /* phase "none" outside a save */
    char kop[32];                     /* the kernel it is in (kin 1) or last was in; "none" */
    int kin;
    double quiet;                     /* the wedge clock's CPU seconds without progress */
    /* not in the file: what the reader found (a neighbour's silence, its process's state) */
    double silent_s;                  /* > 0: no new record for this long, on the reader's clock */
    const char *process;              /* "" or how /proc shows its process: " (its process is stopped)" */
} record;

static void record_path(int rank, char *out, size_t len) { snprintf(out, len, "%s/rank_%05d", dir, rank); }

static void snapshot(record *r) {
    memset(r, 0, sizeof *r);
    r->rank = my_rank;
    r->pid = (int)getpid();
    const char *op = LOAD(live.op);
    snprintf(r->op, sizeof r->op, "%s", op ? op : "none");
    r->started = LOAD(live.started);
    r->seq = LOAD(live.seq);
    r->in = LOAD(live.in);
    r->in_since = load_double(&live.in_since);
    r->step = LOAD(live.step);
    r->last_done = LOAD(live.last_done);
    r->last_done_at = load_double(&live.last_done_at);
    const char *phase = LOAD(live.phase);
    snprintf(r->phase, sizeof r->phase, "%s", phase ? phase : "none");
    r->phase_seq = LOAD(live.phase_seq);
    r->phase_calls = LOAD(live.phase_calls);
    r->phase_since = load_double(&live.phase_since);
    r->phase_bytes = LOAD(live.progress_bytes) - LOAD(live.phase_bytes0);
    r->progress_at = load_double(&live.progress_at);
    const char *kop = LOAD(live.kop);
    snprintf(r->kop, sizeof r->kop, "%s", kop ? kop : "none");
    r->kin = LOAD(live.kin);
    r->quiet = quiet_s;
    r->process = "";
    r->written_at = wall_now();
    gethostname(r->host, sizeof r->host - 1);
}

/* One line, padded to RECORD_BYTES and written in place: open, write, close each time, so a shared
 * file system's close-to-open consistency shows the other nodes the new line. */
static void publish(const record *r) {
    char line[RECORD_BYTES], path[PATH_BYTES];
    int n = snprintf(line, sizeof line,
                     "gtrain-watchdog 1 rank %d pid %d host %s step %d done %d at %.3f op %s seq %llu "
                     "started %llu in %d since %.3f written %.3f phase %s pseq %llu calls %llu psince %.3f "
                     "prog %.3f pbytes %llu kop %s kin %d quiet %.1f\n",
                     r->rank, r->pid, r->host, r->step, r->last_done, r->last_done_at, r->op, r->seq, r->started,
                     r->in, r->in_since, r->written_at, r->phase, r->phase_seq, r->phase_calls, r->phase_since,
                     r->progress_at, r->phase_bytes, r->kop, r->kin, r->quiet);
    if (n < 0 || n >= (int)sizeof line) return;
    memset(line + n, ' ', sizeof line - (size_t)n - 1);
    line[sizeof line - 1] = '\n';
    record_path(r->rank, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t w = pwrite(fd, line, sizeof line, 0);
    (void)w;
    close(fd);
}

static int read_record(int rank, record *r) {
    char line[RECORD_BYTES + 1], path[PATH_BYTES];
    record_path(rank, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = pread(fd, line, RECORD_BYTES, 0);
    close(fd);
    if (n <= 0) return -1;
    line[n] = '\0';
    memset(r, 0, sizeof *r);
    int got = sscanf(line,
                     "gtrain-watchdog 1 rank %d pid %d host %63s step %d done %d at %lf op %31s seq %llu "
                     "started %llu in %d since %lf written %lf phase %31s pseq %llu calls %llu psince %lf "
                     "prog %lf pbytes %llu kop %31s kin %d quiet %lf",
                     &r->rank, &r->pid, r->host, &r->step, &r->last_done, &r->last_done_at, r->op, &r->seq,
                     &r->started, &r->in, &r->in_since, &r->written_at, r->phase, &r->phase_seq, &r->phase_calls,
                     &r->phase_since, &r->progress_at, &r->phase_bytes, r->kop, &r->kin, &r->quiet);
    r->process = "";
    return got == 21 && r->rank == rank ? 0 : -1;
}

/* ---------------------------------------------------------------- the verdict */

static int in_phase(const record *r) { return strcmp(r->phase, "none") != 0; }

/* Where a rank is: "in all_reduce #42 at step 8", "computing step 8; last collective all_reduce #42",
 * and inside a save "in H5Dwrite (call 57 of the save of step 8, #44, 12.0 s into it)" or "in the
 * save of step 8 (#44) for 31.0 s, between its calls (the last, 56, was H5Dwrite): writing, or stuck". */
static void position(const record *r, double now, char *out, size_t len) {
    if (in_phase(r) && r->in)
        snprintf(out, len, "in %s (call %llu of the %s of step %d, #%llu, %.1f s into it)", r->op, r->phase_calls,
                 r->phase, r->step, r->phase_seq, now - r->phase_since);
    else if (in_phase(r))
        snprintf(out, len, "in the %s of step %d (#%llu) for %.1f s, between its calls (the last, %llu, was %s): "
                 "writing, or stuck", r->phase, r->step, r->phase_seq, now - r->phase_since, r->phase_calls, r->op);
    else if (r->in)
        snprintf(out, len, "in %s #%llu at step %d", r->op, r->seq, r->step);
    else
        snprintf(out, len, "computing step %d; last collective %s #%llu", r->step, r->op, r->seq);
}

/* stopped or dead: a neighbour saw no new record for dist.liveness_timeout, or (a rank no reader
 * watched) its record's own stamp is old */
static int is_stale(const record *r, double now) { return r->silent_s > 0 || now - r->written_at > STALE_S; }

static void describe_rank(const record *r, double now, char *out, size_t len) {
    char where[256], quiet[160] = "";
    position(r, now, where, sizeof where);
    if (!r->in && !in_phase(r) && r->quiet >= 2 * heartbeat_s)
        snprintf(quiet, sizeof quiet, ", %.1f s of CPU time with no kernel or collective beginning or ending (%s %s)",
                 r->quiet, r->kin ? "in" : "after", r->kop);
    if (is_stale(r, now))
        snprintf(out, len, "rank %d (pid %d on %s): no sign of life for %.0f s%s, stopped or dead; last seen %s", r->rank,
                 r->pid, r->host, r->silent_s > 0 ? r->silent_s : now - r->written_at, r->process, where);
    else if (r->in && !in_phase(r))
        snprintf(out, len, "rank %d (pid %d on %s): %s for %.1f s", r->rank, r->pid, r->host, where, now - r->in_since);
    else
        snprintf(out, len, "rank %d (pid %d on %s): %s%s", r->rank, r->pid, r->host, where, quiet);
}

static double effective_limit(void) {
    double by_steps = GT_WATCHDOG_STEP_FACTOR * load_double(&live.slowest_step_s);
    return by_steps > timeout_s ? by_steps : timeout_s;
}

/* Is rank r behind? Its record went stale (stopped or dead), or it never started the operation
 * `wanted` that some rank is blocked in, or, inside that same save, it started fewer of the save's
 * calls (a rank blocked in a collective call of the save has entered it; the one it waits for has
 * not). Only what blocked ranks wait for counts: with non-blocking gathers a rank may have started
 * a prefetch more than another and still wait for the same one. */
static int is_behind(const record *r, unsigned long long wanted, unsigned long long most_calls, double now) {
    if (now - r->written_at > STALE_S || r->started < wanted) return 1;
    return in_phase(r) && r->phase_seq == wanted && r->phase_calls < most_calls;
}

/* The hosts of the named ranks, one per line, for a batch script that leaves them out of the
 * requeued job: DIR/blamed_hosts, written (then renamed) by the rank that claimed the verdict. */
static void write_blamed_hosts(const record *all, const int *named, int n) {
    char path[PATH_BYTES], tmp[PATH_BYTES + 8];
    snprintf(path, sizeof path, "%s/blamed_hosts", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = strcmp(all[named[j]].host, all[named[i]].host) == 0;
        if (!seen) fprintf(f, "%s\n", all[named[i]].host);
    }
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
}

/* The on-fire hook (an NCCL communicator's abort) runs in a thread of its own, so that one that
 * never returns cannot keep the process from exiting: it gets ABORT_GRACE_S. */
static void *run_on_fire(void *done) {
    void (*fn)(void *) = __atomic_load_n(&on_fire, __ATOMIC_ACQUIRE);
    if (fn) fn(on_fire_arg);
    __atomic_store_n((int *)done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void run_on_fire_hook(void) {
    static int done;
    pthread_t t;
    if (!__atomic_load_n(&on_fire, __ATOMIC_ACQUIRE) || pthread_create(&t, NULL, run_on_fire, &done) != 0) return;
    for (int i = 0; i < ABORT_GRACE_S * 100 && !__atomic_load_n(&done, __ATOMIC_ACQUIRE); i++) {
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
}

/* Names the ranks behind (see is_behind), prints one line if this rank is the first to claim the
 * verdict, runs the on-fire hook and ends the process. `limit` seconds of the key `key` ran out;
 * culprit: NULL, or the record of the rank found stopped or dead (a neighbour, silent_s set: it is
 * named with any other stale rank) or wedged (this rank's own: it alone is named). */
static void fire(const record *me, const char *what, double limit, const char *key, const record *culprit) {
    double now = wall_now();
    record *all = calloc((size_t)world_size, sizeof *all);
    int *have = calloc((size_t)world_size, sizeof *have), *named_ranks = calloc((size_t)world_size, sizeof(int));
    size_t cap = 8192 + (size_t)world_size * 200;
    char *msg = malloc(cap), one[640];
    if (!all || !have || !named_ranks || !msg) _exit(GT_WATCHDOG_EXIT);
    unsigned long long wanted = 0, most_calls = 0; /* the newest operation a rank is blocked in */
    for (int r = 0; r < world_size; r++) {
        if (r == my_rank) all[r] = *me, have[r] = 1;
        else if (culprit && r == culprit->rank) all[r] = *culprit, have[r] = 1;
        else have[r] = read_record(r, &all[r]) == 0;
        if (have[r] && all[r].in && all[r].seq > wanted) wanted = all[r].seq;
    }
    for (int r = 0; r < world_size; r++)
        if (have[r] && in_phase(&all[r]) && all[r].phase_seq == wanted && all[r].phase_calls > most_calls)
            most_calls = all[r].phase_calls;
    size_t n = (size_t)snprintf(msg, cap, "gtrain: watchdog: rank %d %s (limit %.0f s, %s); not arrived: ", my_rank,
                                what, limit, key);
    /* a stopped or dead rank explains the others: a live rank that has not reached `wanted` may
     * itself be blocked on the dead one in an earlier operation (a ZeRO-3 prefetch), so when some
     * record is stale only the stale ranks are named */
    int any_stale = 0, wedged = culprit && culprit->rank == my_rank;
    for (int r = 0; r < world_size; r++) any_stale |= have[r] && is_stale(&all[r], now);
    int named = 0, unseen = 0;
    for (int r = 0; r < world_size && n < cap; r++) {
        if (!have[r]) {
            unseen++; /* on another node: /dev/shm, or a checkpoint.dir the nodes do not share */
            continue;
        }
        if (wedged ? r != my_rank
                   : any_stale ? !is_stale(&all[r], now) : !is_behind(&all[r], wanted, most_calls, now))
            continue;
        describe_rank(&all[r], now, one, sizeof one);
        n += (size_t)snprintf(msg + n, cap - n, "%s%s", named ? "; " : "", one);
        named_ranks[named++] = r;
    }
    /* every rank equally far: the late ones are those still computing (one rank alone: this one) */
    int behind = named;
    for (int r = 0; !behind && r < world_size && n < cap; r++)
        if (have[r] && !all[r].in) {
            describe_rank(&all[r], now, one, sizeof one);
            n += (size_t)snprintf(msg + n, cap - n, "%s%s", named ? "; " : "", one);
            named_ranks[named++] = r;
        }
    if (!named && n < cap)
        n += (size_t)snprintf(msg + n, cap - n, "none: every rank is in collective #%llu and alive (a stuck "
                              "communication library or network)", wanted);
    if (unseen && n < cap)
        n += (size_t)snprintf(msg + n, cap - n, "; %d rank(s) not seen: no record in %s (ranks on other nodes, "
                              "when it is not shared with them)", unseen, dir);
    if (n < cap) n += (size_t)snprintf(msg + n, cap - n, "; exit %d\n", GT_WATCHDOG_EXIT);
    if (n >= cap) n = cap - 1, msg[n - 1] = '\n';
    if (flight) msync(flight, flight_bytes, MS_SYNC); /* for readers on other nodes */
    char claim[PATH_BYTES];
    snprintf(claim, sizeof claim, "%s/verdict", dir);
    int fd = open(claim, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
        write_blamed_hosts(all, named_ranks, named);
        ssize_t w = write(fd, msg, n);
        close(fd);
        w = write(STDERR_FILENO, msg, n);
        (void)w;
    }
    run_on_fire_hook();
    _exit(GT_WATCHDOG_EXIT);
}

/* A rank whose record has not been refreshed for dist.timeout is stopped or dead, however slow the
 * steps are (its watchdog thread writes every second, whatever the rank computes). Looked for only
 * by the first and last ranks (each reads every record: a few per rank, not one per pair of ranks),
 * and only while this rank has waited in one call longer than dist.timeout. */
static int peer_gone(const record *me, double now) {
    static double checked_at;
    if (!me->in || now - me->in_since <= timeout_s || (my_rank != 0 && my_rank != world_size - 1) ||
        now - checked_at < 1.0)
        return 0;
    checked_at = now;
    record r;
    for (int i = 0; i < world_size; i++)
        if (i != my_rank && read_record(i, &r) == 0 && now - r.written_at > timeout_s) return 1;
    return 0;
}

/* Inside a save whose clocks ran out on this rank: is the save still alive elsewhere, some rank of
 * the same save (a fresh record) having progressed within the limit? A rank waiting for a slow
 * one (an asynchronous save whose writer on another node is slower: this rank waits in the save's
 * agreement) must not end a save that writes. Looked up from every rank's record, at most every 2 s,
 * by the first and the last rank, and by a rank that is not blocked in a call (its own writer may be
 * the one that stopped); another rank blocked in a call of the save leaves the verdict to the first
 * and last ranks while their records are fresh (two reads), so the reads stay a few per rank. */
static int save_alive_elsewhere(const record *me, double now, double limit) {
    static double checked_at = -1e30;
    static int alive;
    if (now - checked_at < 2.0) return alive;
    checked_at = now;
    record r;
    alive = 0;
    if (my_rank != 0 && my_rank != world_size - 1 && me->in) {
        int fresh = 1;
        for (int end = 0; end < 2 && fresh; end++)
            fresh = read_record(end ? world_size - 1 : 0, &r) == 0 && !is_stale(&r, now);
        if (fresh) return alive = 1;
    }
    for (int i = 0; i < world_size && !alive; i++)
        alive = i != my_rank && read_record(i, &r) == 0 && !is_stale(&r, now) && in_phase(&r) &&
                r.phase_seq == me->phase_seq && now - r.progress_at <= limit;
    return alive;
}

/* How /proc shows process `pid` of this host: its state letter (R, S, D, T, Z, ...), X when gone. */
static char proc_state(int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 'X';
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 'X';
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* "pid (command) S ...": the command may hold anything */
    return p && p[1] == ' ' && p[2] ? p[2] : '?';
}

/* The heartbeats of this rank's neighbours (rank - 1 and rank + 1 around the ring): 1 and the record
 * of one whose record has not changed for dist.liveness_timeout, as this rank's own monotonic clock
 * measures it (silent_s), and that /proc on this host does not show alive (watchdog.h). A missing
 * record (a rank that has stopped its watchdog, or not yet started) is no verdict. */
static int neighbour_gone(record *out) {
    if (world_size < 2) return 0;
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    for (int k = 0; k < 2; k++) {
        int n = (my_rank + (k ? world_size - 1 : 1)) % world_size;
        if (k && n == (my_rank + 1) % world_size) break; /* two ranks: one neighbour */
        beat_seen *b = &seen[k];
        record r;
        double m = mono_now();
        if (read_record(n, &r) != 0) {
            b->known = 0;
            continue;
        }
        if (!b->known || r.written_at != b->token || r.pid != b->pid) {
            *b = (beat_seen){1, r.pid, r.written_at, m};
            continue;
        }
        if (m - b->changed_at <= liveness_s) continue;
        if (strcmp(r.host, host) == 0) {
            char st = proc_state(r.pid);
            if (st == 'T' || st == 't') r.process = " (its process is stopped)";
            else if (st == 'X' || st == 'x' || st == 'Z') r.process = " (its process is gone)";
            else continue; /* alive: its watchdog thread is late (a slow file system), not the rank */
        }
        r.silent_s = m - b->changed_at;
        *out = r;
        return 1;
    }
    return 0;
}

/* The wedge clock (watchdog.h), sampled once a heartbeat: the training thread's CPU time while it
 * is inside a step, outside collectives and saves, and its progress count does not move. */
static void sample_quiet(void) {
    uint64_t t = LOAD(live.ticks);
    double cpu = main_cpu_now();
    int counting = LOAD(live.in_step) && !LOAD(live.in) && !LOAD(live.phase);
    if (t != quiet_ticks || !counting) {
        if (t != quiet_ticks && quiet_s > longest_quiet_s) longest_quiet_s = quiet_s; /* a stretch that ended */
        quiet_s = 0;
    } else {
        quiet_s += cpu - quiet_cpu_at;
    }
    quiet_ticks = t;
    quiet_cpu_at = cpu;
}

static double wedge_limit(void) {
    double by_kernels = GT_WATCHDOG_KERNEL_FACTOR * longest_quiet_s;
    return by_kernels > liveness_s ? by_kernels : liveness_s;
}

static void check(const record *me) {
    double limit = effective_limit(), now = wall_now();
    char what[400], where[256];
    position(me, now, where, sizeof where);
    if (liveness_s > 0) {
        record gone;
        if (neighbour_gone(&gone)) {
            snprintf(what, sizeof what, "has seen no new record of rank %d for %.1f s", gone.rank, gone.silent_s);
            fire(me, what, liveness_s, "dist.liveness_timeout", &gone);
        }
        /* armed once a step finished here: the first one's kernels pay for allocation, and set the limit */
        double wedge = wedge_limit();
        if (LOAD(live.last_done) != 0 && me->quiet > wedge) {
            snprintf(what, sizeof what, "is wedged: its training thread computed for %.1f s of CPU time in step %d "
                     "with no kernel or collective beginning or ending (%s %s)", me->quiet, me->step,
                     me->kin ? "inside" : "after", me->kop);
            fire(me, what, wedge, "dist.liveness_timeout", me);
        }
    }
    if (peer_gone(me, now)) {
        snprintf(what, sizeof what, "waited %.1f s %s, and a rank has shown no sign of life for longer than "
                 "dist.timeout", now - me->in_since, where);
        fire(me, what, limit, "dist.timeout", NULL);
    }
    /* inside a save, its progress counts as a step: a save that writes slowly is never ended; one
     * that stops progressing is, `limit` after its last progress (or the last step) */
    double alive_at = me->last_done_at;
    if (in_phase(me) && me->progress_at > alive_at) alive_at = me->progress_at;
    int over_in = me->in && now - me->in_since > limit, over_step = now - alive_at > limit;
    if ((over_in || over_step) && in_phase(me) && save_alive_elsewhere(me, now, limit)) return;
    if (over_in) {
        snprintf(what, sizeof what, "waited %.1f s %s", now - me->in_since, where);
        fire(me, what, limit, "dist.timeout", NULL);
    }
    if (over_step) {
        if (in_phase(me) && alive_at > me->last_done_at)
            snprintf(what, sizeof what, "made no progress for %.1f s in the %s of step %d (%llu bytes written in it; "
                     "now %s)", now - alive_at, me->phase, me->step, me->phase_bytes, where);
        else
            snprintf(what, sizeof what, "finished no step for %.1f s (last step %d; now %s)", now - me->last_done_at,
                     me->last_done, where);
        fire(me, what, limit, "dist.timeout", NULL);
    }
}

/* The heartbeat's wait is on the monotonic clock: a wait until a wall-clock time sleeps through a step
 * of that clock (NTP stepping it back, a virtual machine's clock set after a pause) for as long as the
 * step, and the watchdog with it. The condition's clock is set once, before the thread starts. */
static int cond_monotonic;
static void use_monotonic_cond(void) {
    pthread_condattr_t a;
    if (cond_monotonic || pthread_condattr_init(&a) != 0) return;
    if (pthread_condattr_setclock(&a, CLOCK_MONOTONIC) == 0) {
        pthread_cond_destroy(&stop_cond);
        cond_monotonic = pthread_cond_init(&stop_cond, &a) == 0;
        if (!cond_monotonic) pthread_cond_init(&stop_cond, NULL);
    }
    pthread_condattr_destroy(&a);
}

static void *watch(void *arg) {
    (void)arg;
    pthread_mutex_lock(&stop_lock);
    while (!stopping) {
        struct timespec until;
        clock_gettime(cond_monotonic ? CLOCK_MONOTONIC : CLOCK_REALTIME, &until);
        long ns = (long)(heartbeat_s * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000L);
        until.tv_nsec += ns % 1000000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&stop_cond, &stop_lock, &until);
        if (stopping) break;
        sample_quiet();
        record me;
        snapshot(&me);
        publish(&me);
        check(&me);
    }
    pthread_mutex_unlock(&stop_lock);
    return NULL;
}

/* ---------------------------------------------------------------- start, stop */

static int make_dir(const char *path, char *why, size_t why_len) {
    struct stat st;
    if (mkdir(path, 0755) == 0 || (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))) return 0;
    snprintf(why, why_len, "cannot create the watchdog's directory %s: %s", path,
             errno == EEXIST ? "a file of that name is in the way" : strerror(errno));
    return -1;
}

/* The /dev/shm directories of jobs that were killed (nobody removed them): one whose records of this
 * host all name processes that are gone. Other ranks may sweep at the same time; failures are fine. */
static void sweep_stale_tmp_dirs(void) {
    DIR *shm = opendir("/dev/shm");
    if (!shm) return;
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    struct dirent *e;
    while ((e = readdir(shm))) {
        if (strncmp(e->d_name, "gtrain-watchdog-", 16) != 0) continue;
        char sub[PATH_BYTES], path[PATH_BYTES + 256], line[RECORD_BYTES + 1];
        snprintf(sub, sizeof sub, "/dev/shm/%s", e->d_name);
        DIR *d = opendir(sub);
        if (!d) continue;
        int alive = 0, records = 0;
        struct dirent *f;
        while ((f = readdir(d)) && !alive) {
            if (strncmp(f->d_name, "rank_", 5) != 0) continue;
            snprintf(path, sizeof path, "%s/%s", sub, f->d_name);
            int fd = open(path, O_RDONLY | O_CLOEXEC), pid = 0;
            ssize_t n = fd >= 0 ? pread(fd, line, RECORD_BYTES, 0) : -1;
            if (fd >= 0) close(fd);
            char their_host[64] = "";
            line[n > 0 ? n : 0] = '\0';
            records++;
            if (sscanf(line, "gtrain-watchdog 1 rank %*d pid %d host %63s", &pid, their_host) != 2 ||
                strcmp(their_host, host) != 0 || pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH)
                alive = 1; /* unreadable, another host's, or running: leave it */
        }
        if (!alive && records) {
            rewinddir(d);
            while ((f = readdir(d)))
                if (f->d_name[0] != '.') {
                    snprintf(path, sizeof path, "%s/%s", sub, f->d_name);
                    unlink(path);
                }
            rmdir(sub);
        }
        closedir(d);
    }
    closedir(shm);
}

/* The ring's file, created afresh (a previous run's ring of this rank is replaced) and mapped; without
 * it the watchdog still works, with no ring. */
static void open_flight_recorder(void) {
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/flight_%05d", dir, my_rank);
    flight_bytes = sizeof(flight_header) + (size_t)GT_FLIGHT_ENTRIES * sizeof(flight_entry);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    void *p = ftruncate(fd, (off_t)flight_bytes) == 0
                  ? mmap(NULL, flight_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) return;
    flight = p;
    memcpy(flight->magic, "gtrain-flight 1", 16);
    flight->entries = GT_FLIGHT_ENTRIES;
    flight->rank = my_rank;
    flight->pid = (int32_t)getpid();
    ring = (flight_entry *)(flight + 1);
}

int gt_watchdog_start(MPI_Comm world, const char *ckpt_dir, double timeout, double liveness, char *why,
                      size_t why_len) {
    if (timeout <= 0) return 0;
    MPI_Comm_rank(world, &my_rank);
    MPI_Comm_size(world, &world_size);
    timeout_s = timeout;
    liveness_s = liveness > 0 ? liveness : 0;
    heartbeat_s = liveness_s > 0 && liveness_s / 4 < HEARTBEAT_S ? liveness_s / 4 : HEARTBEAT_S;
    if (heartbeat_s < 0.01) heartbeat_s = 0.01;
    memset(seen, 0, sizeof seen);
    have_main_cpu_clock = pthread_getcpuclockid(pthread_self(), &main_cpu_clock) == 0;
    quiet_ticks = 0;
    quiet_s = longest_quiet_s = 0;
    quiet_cpu_at = main_cpu_now();
    /* one name for the node-local fallback, chosen by rank 0 */
    long token[2] = {(long)getpid(), (long)time(NULL)};
    MPI_Bcast(token, 2, MPI_LONG, 0, world);
    /* checkpoint.dir/.watchdog, shared by the nodes; when there is no checkpoint.dir, or some rank
     * cannot make the directory there (a full disk: that run goes on, its saves retry), /dev/shm */
    int bad = 0;
    if (ckpt_dir[0]) {
        snprintf(dir, sizeof dir, "%s/.watchdog", ckpt_dir);
        bad = make_dir(dir, why, why_len);
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, world);
        if (bad && my_rank == 0)
            fprintf(stderr, "gtrain: watchdog: %s%s; the ranks' records go to /dev/shm instead, where ranks on "
                    "other nodes do not see them\n", why[0] ? why : "some rank cannot create ", why[0] ? "" : dir);
    }
    owns_tmp_dir = !ckpt_dir[0] || bad;
    if (owns_tmp_dir) {
        sweep_stale_tmp_dirs();
        snprintf(dir, sizeof dir, "/dev/shm/gtrain-watchdog-%ld-%ld", token[0], token[1]);
        why[0] = '\0';
        bad = make_dir(dir, why, why_len);
    }
    if (!bad && my_rank == 0) {
        char claim[PATH_BYTES];
        snprintf(claim, sizeof claim, "%s/verdict", dir); /* a previous run's */
        unlink(claim);
        snprintf(claim, sizeof claim, "%s/blamed_hosts", dir);
        unlink(claim);
    }
    memset(&live, 0, sizeof live);
    store_double(&live.last_done_at, wall_now());
    if (!bad) open_flight_recorder();
    record me;
    snapshot(&me);
    if (!bad) publish(&me);
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, world); /* every record is there before any check */
    if (bad) return -1;
    stopping = 0;
    owner = pthread_self();
    STORE(running, 1);
    use_monotonic_cond();
    if (pthread_create(&thread, NULL, watch, NULL) != 0) {
        STORE(running, 0);
        snprintf(why, why_len, "cannot start the watchdog thread");
        return -1;
    }
    return 0;
}

void gt_watchdog_stop(void) {
    if (!LOAD(running)) return;
    pthread_mutex_lock(&stop_lock);
    stopping = 1;
    pthread_cond_signal(&stop_cond);
    pthread_mutex_unlock(&stop_lock);
    pthread_join(thread, NULL);
    STORE(running, 0);
    char path[PATH_BYTES];
    record_path(my_rank, path, sizeof path);
    unlink(path);
    if (flight) {
        munmap(flight, flight_bytes);
        flight = NULL;
        ring = NULL;
        snprintf(path, sizeof path, "%s/flight_%05d", dir, my_rank); /* a run that ended well leaves none */
        unlink(path);
    }
    rmdir(dir); /* fails but for the last rank to leave, which removes it */
}
