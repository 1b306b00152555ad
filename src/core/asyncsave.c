/*
 * asyncsave.c — a rank's background writer of training-state saves (see asyncsave.h).
 *
 * The host buffer holds three copies of the rank's slice (master, exp_avg, exp_avg_sq) and is
 * allocated before step 1 and kept: on the CPU backend the copy is a memcpy; on a GPU it is one
 * device-to-host copy per buffer into pinned memory (the backend's host_alloc, cudaHostAlloc), so
 * that the copy is a DMA at the link's speed (never run on a GPU yet). The writer thread runs at normal priority: measured on 2 cores
 * busy with compute (docs/state-format.md), nice +10 made the write 4x slower (43% of the disk's rate,
 * and a next save then waited for it) while the compute it spared was about the same as the ~0.4 s a
 * full-speed write takes from the steps it overlaps; the write is mostly copies into the page cache
 * and the Fletcher32 sums, about one core for a second per GB. The finished flag is the only state
 * the two threads share before the join.
 */
#define _GNU_SOURCE /* SCHED_BATCH, gettid */

#include "asyncsave.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "model.h"

struct gt_async_save {
    const gt_ops *ops;
    float *host;           /* (3 x capacity) fp32: master, exp_avg, exp_avg_sq of the slice */
    int pinned;            /* host came from ops->host_alloc */
    size_t mapped_bytes;   /* else: host was mapped (this many bytes; 0 = malloc'd) */
    size_t capacity;       /* elements per copy */
    const gt_layout *layout;
    uint64_t begin, count;
    gt_state_info info;
    int rank;
    char path[4096];
    pthread_t thread;
    int started, joinable;
    int finished;          /* __atomic: the thread is done */
    int failed;
    char err[4096 + 1100];
    uint64_t bytes;
    double write_s;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

gt_async_save *gt_async_save_new(const gt_ops *ops) {
    gt_async_save *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->ops = ops;
    return s;
}

static void free_host(gt_async_save *s) {
    if (s->pinned) s->ops->host_free(s->host);
    else if (s->mapped_bytes) munmap(s->host, s->mapped_bytes);
    else free(s->host);
    s->host = NULL;
    s->pinned = 0;
    s->mapped_bytes = 0;
}

/* GTRAIN_SAVE_NICE=N (1..19; for bench/state_bench.sh) moves the writer out of the compute threads'
 * way (that niceness and SCHED_BATCH); unset or 0 keeps the normal priority (see the file comment).
 * Failures only cost speed. */
static void lower_priority(void) {
    const char *env = getenv("GTRAIN_SAVE_NICE");
    int nice = env && env[0] ? atoi(env) : 0;
    if (nice <= 0) return;
    struct sched_param none = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice > 19 ? 19 : nice);
}

static void *write_thread(void *arg) {
    gt_async_save *s = arg;
    lower_priority();
    double t0 = now_s();
    const float *host[3] = {s->host, s->host + s->capacity, s->host + 2 * s->capacity};
    char why[1024];
    int rc = gt_state_write_rank(s->path, s->layout, s->begin, s->count, host, &s->info, s->rank, why, sizeof why);
    if (rc == 0) { /* durable before the top file may point at it */
        int fd = open(s->path, O_RDONLY);
        if (fd < 0 || fsync(fd) != 0) {
            snprintf(why, sizeof why, "%s (fsync)", strerror(errno));
            rc = -1;
        }
        if (fd >= 0) close(fd);
    }
    if (rc != 0) {
        snprintf(s->err, sizeof s->err, "%s: %s", s->path, why); /* the agreement adds the ranks */
        s->failed = 1;
    } else {
        struct stat st;
        s->bytes = stat(s->path, &st) == 0 ? (uint64_t)st.st_size : 0;
    }
    s->write_s = now_s() - t0;
    __atomic_store_n(&s->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* The host buffer for `count` elements per copy, its pages faulted in now, so that the first save
 * does not pay the page faults inside the loop (measured: 2.2 s for 2 x 560 MB under load): mapped
 * with MAP_POPULATE (the kernel faults them in in one call, about a third less CPU time than
 * touching them one by one), else malloc'd and touched page by page. */
static void reserve(gt_async_save *s, size_t count) {
    if (count <= s->capacity && s->host) return;
    free_host(s);
    s->capacity = count ? count : 1;
    size_t bytes = 3 * s->capacity * sizeof(float);
    if (s->ops->host_alloc) {
        s->host = s->ops->host_alloc(bytes);
        s->pinned = s->host != NULL;
        if (!s->pinned)
            fprintf(stderr, "gtrain: the asynchronous save's host copy (%.2f GiB) could not be pinned: each save's "
                            "copy from the device runs at pageable speed\n", (double)bytes / (1 << 30));
    }
    if (!s->host && bytes >= ((size_t)32 << 20)) { /* a small one is not worth a map of its own */
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p != MAP_FAILED) s->host = p, s->mapped_bytes = bytes;
    }
    if (!s->host) {
        s->host = malloc(bytes);
        if (!s->host) abort();
        memset(s->host, 0xff, bytes); /* not 0: malloc + memset 0 may become calloc, untouched */
    }
}

void gt_async_save_reserve(gt_async_save *s, size_t count) { reserve(s, count); }

void gt_async_save_start(gt_async_save *s, const gt_optim *opt, uint64_t begin, uint64_t count,
                         const gt_state_info *info, int rank, const char *path) {
    if (s->started) abort(); /* runstate_save.c joins before it starts another: never two writers */
    gt_state_library_open(); /* HDF5 starts here, on the main thread, not in the writer */
    reserve(s, count);
    const float *src[3] = {opt->master, opt->exp_avg, opt->exp_avg_sq};
    size_t at = (size_t)(begin - opt->shard.begin); /* the slice's place in the optimizer's buffers */
    opt->ops->synchronize();
    for (int g = 0; g < 3; g++)
        if (count) opt->ops->copy_to_host(s->host + g * s->capacity, src[g] + at, count * sizeof(float));
    opt->ops->synchronize();
    s->layout = gt_model_layout(opt->model);
    s->begin = begin;
    s->count = count;
    s->info = *info;
    s->rank = rank;
    snprintf(s->path, sizeof s->path, "%s", path);
    s->failed = 0;
    s->err[0] = '\0';
    s->bytes = 0;
    s->write_s = 0;
    s->started = 1;
    __atomic_store_n(&s->finished, 0, __ATOMIC_RELEASE);
    int rc = pthread_create(&s->thread, NULL, write_thread, s);
    s->joinable = rc == 0;
    if (rc != 0) {
        snprintf(s->err, sizeof s->err, "%s: cannot start the writer thread: %s", path, strerror(rc));
        s->failed = 1;
        __atomic_store_n(&s->finished, 1, __ATOMIC_RELEASE);
    }
}

int gt_async_save_finished(const gt_async_save *s) { return __atomic_load_n(&s->finished, __ATOMIC_ACQUIRE); }

int gt_async_save_join(gt_async_save *s, uint64_t *bytes, double *write_s, char *err, size_t err_len) {
    if (!s->started) abort();
    if (s->joinable) pthread_join(s->thread, NULL);
    s->started = s->joinable = 0;
    if (bytes) *bytes = s->bytes;
    if (write_s) *write_s = s->write_s;
    snprintf(err, err_len, "%s", s->err);
    return s->failed ? -1 : 0;
}

void gt_async_save_free(gt_async_save *s) {
    if (!s) return;
    if (s->joinable) pthread_join(s->thread, NULL);
    free_host(s);
    free(s);
}
