/*
 * preflight.c — the memory check before the first allocation (see preflight.h).
 *
 * Every rank measures its own limit (ranks on different nodes see different machines), the ranks
 * agree on the outcome (gt_agree_on_failure), and rank 0 prints the failing rank's line. The plan
 * is per rank, so it is compared with a per-rank share: on the CPU the node's memory divided by
 * the ranks that share it; a GPU belongs to one rank.
 */
#define _POSIX_C_SOURCE 200809L

#include "preflight.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "agree.h"
#include "bytes.h"
#include "exitcodes.h"
#include "memsnap.h"
#include "testhooks.h"

#define NO_LIMIT UINT64_MAX

/* MemAvailable of /proc/meminfo in bytes, or NO_LIMIT when it cannot be read. */
static uint64_t mem_available(void) {
    const gt_test_hooks *h = gt_test_hooks_get();
    if (h->has_mem_available) return h->mem_available; /* GTRAIN_TEST_MEM_AVAILABLE: a node with this much */
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return NO_LIMIT;
    char line[256];
    unsigned long long kib = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    fclose(f);
    return found ? (uint64_t)kib * 1024 : NO_LIMIT;
}

/* A number from a cgroup file ("max", or a v1 "unlimited" near 2^63, mean none). */
static uint64_t read_limit(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NO_LIMIT;
    unsigned long long v = 0;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    return ok && v < (1ull << 60) ? (uint64_t)v : NO_LIMIT;
}

/* The smallest memory limit on the way from this process's cgroup up to the root (a batch system
 * may set it on the job and start the ranks in a child): cgroup v2 memory.max, or v1
 * memory.limit_in_bytes. NO_LIMIT when there is none. */
static uint64_t cgroup_limit(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return NO_LIMIT;
    char line[4096], path[4096] = "";
    const char *root = NULL, *file = NULL;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = '\0';
        const char *controllers = c1 + 1;
        if (controllers[0] == '\0' && !root) { /* v2: "0::/path" */
            root = "/sys/fs/cgroup", file = "memory.max";
            snprintf(path, sizeof path, "%s", c2 + 1);
        } else if (strstr(controllers, "memory")) { /* v1: "N:memory:/path" (or "cpu,memory") */
            root = "/sys/fs/cgroup/memory", file = "memory.limit_in_bytes";
            snprintf(path, sizeof path, "%s", c2 + 1);
            break;
        }
    }
    fclose(f);
    if (!root) return NO_LIMIT;
    uint64_t limit = NO_LIMIT;
    for (;;) {
        char name[8192 + 64];
        snprintf(name, sizeof name, "%s%s/%s", root, strcmp(path, "/") == 0 ? "" : path, file);
        uint64_t v = read_limit(name);
        if (v < limit) limit = v;
        char *slash = strrchr(path, '/');
        if (!slash || slash == path) {
            if (strcmp(path, "/") == 0 || path[0] == '\0') break;
            snprintf(path, sizeof path, "/");
        } else {
            *slash = '\0';
        }
    }
    return limit;
}

/* This rank's share of the node's memory (MemAvailable or the cgroup limit, split over the node's
 * ranks), and in `what` what it is; NO_LIMIT when neither can be read. */
static uint64_t host_share(int node_ranks, char *what, size_t what_len) {
    char a[32], b[32];
    uint64_t avail = mem_available(), cgroup = cgroup_limit();
    uint64_t node_bytes = avail < cgroup ? avail : cgroup;
    if (node_bytes == NO_LIMIT) return NO_LIMIT;
    uint64_t share = node_bytes / (uint64_t)node_ranks;
    gt_format_bytes(share, a, sizeof a);
    gt_format_bytes(node_bytes, b, sizeof b);
    snprintf(what, what_len, "%s: %s %s shared by %d rank%s on this node", a,
             avail <= cgroup ? "MemAvailable" : "the cgroup memory limit", b, node_ranks, node_ranks == 1 ? "" : "s");
    return share;
}

/* Whether `need` bytes (of which `part` are the copy being checked) exceed this rank's share of the
 * host's memory; when they do, the two sizes formatted (32 bytes each) and the share's story (512). */
static int host_short(int node_ranks, uint64_t part, uint64_t need, char *part_s, char *need_s, char *what) {
    what[0] = 0;
    if (need <= host_share(node_ranks, what, 512)) return 0;
    gt_format_bytes(part, part_s, 32);
    gt_format_bytes(need, need_s, 32);
    return 1;
}

/* The smallest limit of this rank (see preflight.h), and in `what` what it is. */
static uint64_t rank_limit(const gt_config *cfg, const gt_ops *ops, int node_ranks, char *what, size_t what_len) {
    uint64_t limit = NO_LIMIT;
    char a[32], b[32];
    if (ops->memory_available) {
        size_t free_bytes = 0, total_bytes = 0;
        if (ops->memory_available(&free_bytes, &total_bytes) == 0) {
            limit = free_bytes;
            gt_format_bytes(free_bytes, a, sizeof a);
            gt_format_bytes(total_bytes, b, sizeof b);
            snprintf(what, what_len, "%s free of %s on its %s device", a, b, ops->name);
        }
    } else {
        limit = host_share(node_ranks, what, what_len);
    }
    if (cfg->memory.budget && cfg->memory.budget < limit) {
        limit = cfg->memory.budget;
        gt_format_bytes(limit, a, sizeof a);
        snprintf(what, what_len, "%s: memory.budget", a);
    }
    return limit;
}

/* The free bytes of the shared-memory file system of the slots (statvfs; GTRAIN_TEST_SHM_FREE: that
 * many), or 0 with why when it cannot be read (no such directory). */
static uint64_t shm_free(const char *dir, char *why, size_t len) {
    const gt_test_hooks *h = gt_test_hooks_get();
    if (h->has_shm_free) return h->shm_free;
    struct statvfs st;
    if (statvfs(dir, &st) != 0) {
        snprintf(why, len, "%s: %s", dir, strerror(errno));
        return 0;
    }
    return (uint64_t)st.f_bavail * st.f_frsize;
}

int gt_preflight_memsnap_fits(int node_ranks, uint64_t memsnap_bytes, uint64_t beside_bytes, char *why, size_t len) {
    char need[32], have[32], hwhat[512];
    const char *dir = gt_memsnap_dir();
    why[0] = '\0';
    uint64_t node_need = memsnap_bytes * (uint64_t)(node_ranks > 0 ? node_ranks : 1);
    uint64_t free_bytes = shm_free(dir, why, len);
    if (why[0]) return 0;
    if (node_need > free_bytes) {
        gt_format_bytes(node_need, need, sizeof need);
        gt_format_bytes(free_bytes, have, sizeof have);
        snprintf(why, len, "the slots of the node's %d rank%s need %s of shared memory and %s has %s free", node_ranks,
                 node_ranks == 1 ? "" : "s", need, dir, have);
        return 0;
    }
    if (host_short(node_ranks, memsnap_bytes, memsnap_bytes + beside_bytes, have, need, hwhat)) {
        snprintf(why, len, "the slots need %s per rank, %s with the rest of the rank's host memory, which can have %s",
                 have, need, hwhat);
        return 0;
    }
    return 1;
}

/* checkpoint.memory_every = auto (collective, after the other checks agreed): 1 on every rank when
 * the slots do not fit on some rank's node, rank 0 having said so in one warning line. */
static int memsnap_auto_off(const gt_ops *ops, MPI_Comm comm, int rank, const char *host, int node_ranks,
                            const gt_mem_estimate *plan, uint64_t snapshot_bytes, uint64_t memsnap_bytes) {
    char why[1024], line[1400] = "";
    int off = !gt_preflight_memsnap_fits(node_ranks, memsnap_bytes,
                                         snapshot_bytes + (ops->memory_available ? 0 : plan->total_bytes), why, sizeof why);
    if (off) snprintf(line, sizeof line, "rank %d on %s: %s", rank, host, why);
    off = gt_agree_on_failure(comm, off, line, sizeof line) != 0;
    if (off && rank == 0) {
        fprintf(stderr, "gtrain: warning: memory snapshots are off for this run (checkpoint.memory_every = auto: %s); "
                "the state files on disk remain (to have them: room for the slots in shared memory, a larger /dev/shm "
                "or GTRAIN_SHM_DIR on a larger tmpfs, and in host memory, fewer ranks per node; checkpoint.memory_every "
                "= 0 turns them off without this line)\n", line);
        fflush(stderr);
    }
    return off;
}

int gt_preflight_memory(const gt_config *cfg, const gt_ops *ops, MPI_Comm comm, const gt_mem_estimate *plan,
                        uint64_t snapshot_bytes, uint64_t memsnap_bytes, int *memsnap_off) {
    *memsnap_off = 0;
    int memsnap_auto = cfg->checkpoint.memory_every == GT_INT_AUTO;
    int rank;
    MPI_Comm_rank(comm, &rank);
    int node_ranks;
    gt_node_ranks(comm, NULL, &node_ranks);
    char host[256] = "";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    char what[512] = "";
    uint64_t limit = rank_limit(cfg, ops, node_ranks, what, sizeof what);

    int code = 0;
    char msg[2048] = "";
    if (plan->total_bytes > limit) {
        char total[32], params[32], grads[32], optim[32], act[32], work[32], stage[64] = "";
        gt_format_bytes(plan->total_bytes, total, sizeof total);
        gt_format_bytes(plan->params_bytes, params, sizeof params);
        gt_format_bytes(plan->grads_bytes, grads, sizeof grads);
        gt_format_bytes(plan->optim_bytes, optim, sizeof optim);
        gt_format_bytes(plan->act_peak_bytes, act, sizeof act);
        gt_format_bytes(plan->workspace_bytes, work, sizeof work);
        if (plan->staging_bytes) { /* the MPI reduce-scatters' host staging (planner.h) */
            char b[32];
            gt_format_bytes(plan->staging_bytes, b, sizeof b);
            snprintf(stage, sizeof stage, ", reduce-scatter staging %s", b);
        }
        snprintf(msg, sizeof msg,
                 "%s: the memory plan needs %s per rank (params %s, grads %s, optimizer %s, activations %s with "
                 "memory.recompute = %s, workspace %s%s) but rank %d on %s can have %s (expected a smaller "
                 "train.micro_batch or train.seq_len, more memory.recompute, or more ranks; gtrain --plan shows "
                 "the options)",
                 cfg->path, total, params, grads, optim, act, cfg->memory.recompute, work, stage, rank, host, what);
        code = GT_EXIT_BAD_INPUT;
    }
    if (!code && snapshot_bytes) { /* the asynchronous save's copy is host memory on every backend */
        char snap[32], all[32], hwhat[512];
        if (host_short(node_ranks, snapshot_bytes, snapshot_bytes + (ops->memory_available ? 0 : plan->total_bytes), snap,
                       all, hwhat)) {
            snprintf(msg, sizeof msg,
                     "%s: [checkpoint] async = true keeps a host copy of each rank's state slice to write it in "
                     "the background: %s per rank, %s with the rest of the rank's host memory, but rank %d on %s "
                     "can have %s (expected checkpoint.async = false, which saves without the copy and stops "
                     "training for the write, or more ranks)",
                     cfg->path, snap, all, rank, host, hwhat);
            code = GT_EXIT_BAD_INPUT;
        }
    }
    if (!code && memsnap_bytes && !memsnap_auto) { /* shared memory is host memory too */
        char snap[32], all[32], hwhat[512];
        if (host_short(node_ranks, memsnap_bytes,
                       memsnap_bytes + snapshot_bytes + (ops->memory_available ? 0 : plan->total_bytes), snap, all, hwhat)) {
            snprintf(msg, sizeof msg,
                     "%s: [checkpoint] memory_every keeps memory snapshots of each rank's state slice (2 slots, and "
                     "2 copies of a partner's across nodes) in shared memory: %s per rank, %s with the rest of the "
                     "rank's host memory, but rank %d on %s can have %s (expected checkpoint.memory_every = 0, which "
                     "keeps no snapshot in memory, or more ranks)",
                     cfg->path, snap, all, rank, host, hwhat);
            code = GT_EXIT_BAD_INPUT;
        }
    }
    code = gt_agree_on_failure(comm, code, msg, sizeof msg);
    if (code && rank == 0) {
        fprintf(stderr, "gtrain: %s\n", msg);
        fflush(stderr);
    }
    if (!code && memsnap_bytes && memsnap_auto) /* auto: off when they do not fit, not a refusal */
        *memsnap_off = memsnap_auto_off(ops, comm, rank, host, node_ranks, plan, snapshot_bytes, memsnap_bytes);
    return code;
}
