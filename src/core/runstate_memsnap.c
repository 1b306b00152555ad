/*
 * runstate_memsnap.c — the memory snapshots' policy (runstate_loop.c, "the last step in memory"):
 * when each rank refreshes its snapshot (memsnap.h), which step a restart resumes from memory and
 * when it uses the files on disk instead, and when the snapshots are deleted.
 *
 *   refresh   every checkpoint.memory_every steps, after the step's metrics line, on every rank (no
 *             collective but the partner copy below): not at a step that saves a state file by
 *             checkpoint.every, nor at the last step (the final save follows). auto (the default):
 *             the interval that pays (autosave.h: Young/Daly from the measured refresh and the fault
 *             rate), chosen by rank 0 and agreed in the step boundary's all-reduce
 *             (run->memsnap_due), so that every rank refreshes at the same steps.
 *   resume    checkpoint.resume = auto with a lineage recorded in checkpoint.dir: the first rank of
 *             each directory of slots (each node's) lists the lineage's slots and copies there at this
 *             world size and reads their headers; the ranks gather them and take the newest step of
 *             which every rank's slice is held somewhere (in its own slots or a copy, on any node of
 *             the job: the ranks of a restart may land on other nodes, or in another order) and that
 *             is newer than the newest state file of the plan (and before train.steps); each rank
 *             then loads its slice, from its own directory when it is there, else sent over MPI by
 *             the first rank of a directory that holds it, into the optimizer and verifies its
 *             checksum in the same pass (rank 0 also that the saved config changes no model key,
 *             unless checkpoint.allow_model_change, and the global batch), and they agree
 *             (gt_agree_on_failure): all take it, or the loaded bytes are cleared (forget_load) and
 *             the next older step is tried, or the files on disk are used, with one line saying why.
 *             A snapshot of another run or branch is never read past its header and never deleted.
 *   partners  across nodes, each rank's partner (the rank of its index on the next node) keeps a
 *             copy of its snapshot, sent over MPI after each refresh (a collective step: every rank
 *             refreshes at the same steps), so that a node lost takes no slice with it.
 *   sweep     before the slots open, the first rank of each directory deletes the lineage's files
 *             there that no rank of this start keeps there (another world size; a slice whose rank,
 *             or whose partner, now runs elsewhere): a restart on other nodes leaves nothing behind.
 *   delete    at the run's clean end and after a stop signal's save, each rank deletes its two
 *             slots (also those it resumed from when it keeps none of its own); a run that ends with
 *             an error keeps them for its restart. A start that does not
 *             resume from memory empties its slots (nothing of an earlier life of the lineage is
 *             used later); one that does keeps the slot it resumed from until the next refresh.
 */

#include "runstate_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agree.h"
#include "config.h"
#include "memsnap.h"
#include "startup.h"
#include "testhooks.h"
#include "watchdog.h"
#include "errmsg.h"
#include "exitcodes.h"

#define COPY_TAG 7301                    /* the partner copies' messages on run->mpi_comm */
#define CHUNK ((uint64_t)1 << 30)        /* bytes per message */


/* The partners (collective, once): rank r's partner is the rank of the same index among its node's
 * ranks on the next node (nodes in the order of their first rank; GTRAIN_TEST_RANK_IS_NODE makes every
 * rank a node), so that a node lost takes no snapshot with it. With one node, or nodes of unequal
 * rank counts, there are none (-1). run->memsnap_ranges: every rank's flat range (begin, count).
 * run->memsnap_dir: the ranks that see the same slots' directory (the same host, and the same
 * directory there: GTRAIN_SHM_DIR may differ between a host's ranks) have the first of them as theirs;
 * it alone reads that directory's slots for the others and sends them where they are needed. */
static void topology(gt_run_state *run) {
    if (run->memsnap_partner) return;
    int rank = rank_of(run), world = gt_comm_size(run->comm);
    MPI_Comm node;
    gt_node_comm(run->mpi_comm, &node);
    int local = 0, size = 1, leader = rank;
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &size);
    MPI_Bcast(&leader, 1, MPI_INT, 0, node);
    MPI_Comm_free(&node);
    int host = leader; /* the host's first rank, whatever the test hook makes of nodes */
    if (gt_test_hooks_get()->rank_is_node) leader = rank, local = 0, size = 1;
    struct stat st;
    long long dir_id[2] = {0, 0};
    if (stat(gt_memsnap_dir(), &st) == 0) dir_id[0] = (long long)st.st_dev, dir_id[1] = (long long)st.st_ino;
    long long mine[6] = {leader, local, size, host, dir_id[0], dir_id[1]};
    long long *all = malloc(6 * (size_t)world * sizeof *all);
    run->memsnap_partner = malloc((size_t)world * sizeof(int));
    run->memsnap_dir = malloc((size_t)world * sizeof(int));
    run->memsnap_ranges = malloc(2 * (size_t)world * sizeof(uint64_t));
    if (!all || !run->memsnap_partner || !run->memsnap_dir || !run->memsnap_ranges) abort();
    MPI_Allgather(mine, 6, MPI_LONG_LONG, all, 6, MPI_LONG_LONG, run->mpi_comm);
    uint64_t range[2] = {run->opt->shard.begin, run->opt->shard.end - run->opt->shard.begin};
    MPI_Allgather(range, 2, MPI_UINT64_T, run->memsnap_ranges, 2, MPI_UINT64_T, run->mpi_comm);
    int nodes = 0, equal = 1;
    for (int r = 0; r < world; r++) {
        run->memsnap_partner[r] = -1;
        nodes += all[6 * r] == r; /* a node's leader is its first rank */
        equal &= all[6 * r + 2] == all[2];
        run->memsnap_dir[r] = r;
        for (int q = 0; q < r; q++)
            if (all[6 * q + 3] == all[6 * r + 3] && all[6 * q + 4] == all[6 * r + 4] && all[6 * q + 5] == all[6 * r + 5]) {
                run->memsnap_dir[r] = q;
                break;
            }
    }
    if (nodes >= 2 && equal)
        for (int r = 0; r < world; r++) {
            int next = -1; /* the next node's leader, wrapping around */
            for (int q = (int)all[6 * r] + 1; q < world && next < 0; q++)
                if (all[6 * q] == q) next = q;
            for (int q = 0; q < world && next < 0; q++)
                if (all[6 * q] == q) next = q;
            for (int q = 0; q < world; q++)
                if (all[6 * q] == next && all[6 * q + 1] == all[6 * r + 1]) run->memsnap_partner[r] = q;
        }
    free(all);
}

/* The rank whose partner `rank` is, or -1. */
static int ward_of(const gt_run_state *run, int rank) {
    for (int r = 0; r < gt_comm_size(run->comm); r++)
        if (run->memsnap_partner[r] == rank) return r;
    return -1;
}

/* Rank r's snapshot identity in the lineage. */
static void rank_id(const gt_run_state *run, const char *run_id, const char *branch, int r, gt_memsnap_id *id) {
    memset(id, 0, sizeof *id);
    snprintf(id->run_id, sizeof id->run_id, "%s", run_id);
    snprintf(id->branch, sizeof id->branch, "%s", branch);
    id->world = gt_comm_size(run->comm);
    id->rank = r;
    id->n_params = gt_model_layout(run->model)->n_params;
    id->begin = run->memsnap_ranges[2 * r];
    id->count = run->memsnap_ranges[2 * r + 1];
}

/* Sends or receives `bytes` at p in chunks: requests appended to req (*n of them). */
static void post(int send, void *p, uint64_t bytes, int peer, MPI_Comm comm, MPI_Request *req, int *n) {
    for (uint64_t at = 0; at < bytes; at += CHUNK) {
        int len = (int)(bytes - at < CHUNK ? bytes - at : CHUNK);
        if (send) MPI_Isend((char *)p + at, len, MPI_BYTE, peer, COPY_TAG, comm, &req[(*n)++]);
        else MPI_Irecv((char *)p + at, len, MPI_BYTE, peer, COPY_TAG, comm, &req[(*n)++]);
    }
}

#define MAX_REQ 256 /* 128 GiB per copy and direction */

static void flag_model_change(void *user, const char *key, int changes_model, const char *was, const char *now) {
    (void)was;
    (void)now;
    char *out = user;
    if (changes_model && !out[0]) snprintf(out, 128, "%s", key);
}

/* Rank 0: may the snapshot's config and attributes continue this run? 0, or -1 with why. */
static int fits_run(const gt_run_state *run, const gt_state_info *info, const char *text, char *why, size_t len) {
    gt_config saved;
    char msg[1024], changed[128] = "";
    if (gt_config_load_string(&saved, text, "the memory snapshot's config", 0, NULL, msg, sizeof msg) != 0) {
        snprintf(why, len, "its config does not read (%s)", msg);
        return -1;
    }
    gt_config_changes(&saved, run->cfg, flag_model_change, changed);
    if (changed[0] && !run->cfg->checkpoint.allow_model_change) {
        snprintf(why, len, "the model changed since it was taken (%s)", changed);
        return -1;
    }
    if (info->global_batch != run->global_batch) {
        snprintf(why, len, "the global batch changed since it was taken (%llu -> %llu)",
                 (unsigned long long)info->global_batch, (unsigned long long)run->global_batch);
        return -1;
    }
    return 0;
}

/* The optimizer's master weights and moments as a start without a resume has them (zeros): after a
 * snapshot that was loaded while it was verified and then not taken, the older step, the state file
 * or a fresh start's draw that comes next finds none of its bytes. */
static void forget_load(gt_run_state *run) {
    gt_optim *opt = run->opt;
    size_t bytes = opt->state_len * sizeof(float); /* as gt_optim_init zeroed them */
    if (!bytes) return;
    opt->ops->zero(opt->master, bytes);
    opt->ops->zero(opt->exp_avg, bytes);
    opt->ops->zero(opt->exp_avg_sq, bytes);
    opt->ops->synchronize();
}

/* What the directories hold: every slot file of the lineage at this world size whose header is the
 * slice's (gt_memsnap_peek), as the rank that reads its directory found it (run->memsnap_dir),
 * gathered on every rank. A slice's snapshot can be in its rank's own slots or in a partner's copy,
 * and after a restart whose ranks landed on other nodes (or in another order) on any node of the job. */
typedef struct held {
    int64_t step;
    int32_t reader; /* the rank that reads the file's directory: it loads it there, or sends it */
    int32_t rank;   /* whose slice */
    int32_t slot;   /* 0, 1: that rank's own slots; 2, 3: a partner's copies (gt_memsnap_path) */
    int32_t pad;
} held;

typedef struct scan_ctx {
    gt_run_state *run;
    const char *run_id, *branch;
    held *h;
    int n, cap;
} scan_ctx;

static void scan_held(void *user, int world, int r, int slot, const char *name) {
    (void)name;
    scan_ctx *c = user;
    if (world != gt_comm_size(c->run->comm)) return;
    gt_memsnap_id id;
    rank_id(c->run, c->run_id, c->branch, r, &id);
    int64_t step = 0;
    char why[4400];
    if (gt_memsnap_peek(&id, slot, &step, why, sizeof why) != 1 || step <= 0) return;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->h = realloc(c->h, (size_t)c->cap * sizeof *c->h);
        if (!c->h) abort();
    }
    c->h[c->n++] = (held){step, rank_of(c->run), r, slot, 0};
}

/* Every directory's slots of the lineage, on every rank (collective); *n of them, malloc'd. */
static held *gather_held(gt_run_state *run, const char *run_id, const char *branch, int *n) {
    int rank = rank_of(run), world = gt_comm_size(run->comm);
    scan_ctx c = {run, run_id, branch, NULL, 0, 0};
    if (run->memsnap_dir[rank] == rank) gt_memsnap_scan(run_id, branch, scan_held, &c);
    int *counts = malloc((size_t)world * sizeof *counts), *displs = malloc((size_t)world * sizeof *displs);
    if (!counts || !displs) abort();
    int bytes = c.n * (int)sizeof(held), total = 0;
    MPI_Allgather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, run->mpi_comm);
    for (int r = 0; r < world; r++) displs[r] = total, total += counts[r];
    held *all = malloc(total ? (size_t)total : 1);
    if (!all) abort();
    MPI_Allgatherv(c.h, bytes, MPI_BYTE, all, counts, displs, MPI_BYTE, run->mpi_comm);
    free(c.h);
    free(counts);
    free(displs);
    *n = total / (int)sizeof(held);
    return all;
}

/* Where each rank's slice of step S comes from (every rank computes the same): src[r], the entry of h
 * it loads: one in its own directory when there is one (its own slots before a copy), else one in
 * another node's (its reader sends it). Returns the first rank without any, or -1. */
static int sources(const gt_run_state *run, const held *h, int nh, int64_t S, int *src) {
    for (int r = 0; r < gt_comm_size(run->comm); r++) {
        int best = -1, score = 0;
        for (int i = 0; i < nh; i++) {
            if (h[i].rank != r || h[i].step != S) continue;
            int here = h[i].reader == run->memsnap_dir[r];
            int sc = here ? (h[i].slot < 2 ? 4 : 3) : (h[i].slot < 2 ? 2 : 1);
            if (sc > score) best = i, score = sc;
        }
        src[r] = best;
        if (best < 0) return r;
    }
    return -1;
}

/* Whether rank r loads its slice from another directory (its src entry's reader sends it). */
static int sent(const gt_run_state *run, const held *h, const int *src, int r) {
    return h[src[r]].reader != run->memsnap_dir[r];
}

/* The slices that come from another node: each reader sends every slice it holds for a rank elsewhere
 * (its size, then the slot image), and a rank that needs one receives it into *image (malloc'd; *size
 * 0 when the reader could not map it). Collective in the sense that every rank calls it with the same
 * h and src. */
static void fetch_slices(gt_run_state *run, const char *run_id, const char *branch, const held *h, const int *src,
                         void **image, uint64_t *size) {
    int rank = rank_of(run), world = gt_comm_size(run->comm);
    void **maps = calloc((size_t)world, sizeof *maps);
    uint64_t *have = calloc((size_t)world, sizeof *have), total = 0;
    if (!maps || !have) abort();
    int nreq = 0;
    for (int r = 0; r < world; r++) {
        if (!sent(run, h, src, r) || h[src[r]].reader != rank) continue;
        gt_memsnap_id id;
        char why[4400];
        rank_id(run, run_id, branch, r, &id);
        maps[r] = gt_memsnap_map(&id, h[src[r]].slot, &have[r], why, sizeof why);
        if (!maps[r]) have[r] = 0;
        nreq += 1 + (int)((have[r] + CHUNK - 1) / CHUNK);
        total += have[r];
    }
    MPI_Request *out = malloc((size_t)(nreq ? nreq : 1) * sizeof *out);
    if (!out) abort();
    int n = 0;
    for (int r = 0; r < world; r++) {
        if (!sent(run, h, src, r) || h[src[r]].reader != rank) continue;
        MPI_Isend(&have[r], 1, MPI_UINT64_T, r, COPY_TAG, run->mpi_comm, &out[n++]); /* no rank blocks in a send */
        if (have[r]) post(1, maps[r], have[r], r, run->mpi_comm, out, &n);
    }
    MPI_Request in[MAX_REQ];
    int m = 0;
    *image = NULL;
    *size = 0;
    if (sent(run, h, src, rank)) {
        int from = h[src[rank]].reader;
        MPI_Recv(size, 1, MPI_UINT64_T, from, COPY_TAG, run->mpi_comm, MPI_STATUS_IGNORE);
        if (*size > (uint64_t)MAX_REQ * CHUNK) abort(); /* 128 GiB of one rank's slice */
        if (*size) {
            *image = malloc((size_t)*size);
            if (!*image) abort();
            post(0, *image, *size, from, run->mpi_comm, in, &m);
        }
    }
    gt_watchdog_enter("memsnap_fetch", total + *size);
    MPI_Waitall(n, out, MPI_STATUSES_IGNORE);
    MPI_Waitall(m, in, MPI_STATUSES_IGNORE);
    gt_watchdog_leave();
    for (int r = 0; r < world; r++) gt_memsnap_unmap(maps[r], have[r]);
    free(maps);
    free(have);
    free(out);
}

static int by_step_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The candidate steps: those of rank 0's slice anywhere, newest first; their count (cand malloc'd). */
static int candidates(const held *h, int nh, int64_t **cand) {
    *cand = malloc((size_t)(nh ? nh : 1) * sizeof **cand);
    if (!*cand) abort();
    int nc = 0;
    for (int i = 0; i < nh; i++)
        if (h[i].rank == 0) (*cand)[nc++] = h[i].step;
    qsort(*cand, (size_t)nc, sizeof **cand, by_step_desc);
    return nc;
}

/* Whether step S cannot be resumed from: a rank whose slice of it no directory of the job holds
 * (own_why: why this rank's own slots did not read), not newer than the newest state file, or not
 * before train.steps; the first reason goes into verdict (if it is still empty). src as sources(). */
static int unusable(const gt_run_state *run, const held *h, int nh, int64_t S, int64_t newest_file,
                    const char *own_why, int *src, char *verdict, size_t len) {
    int r = sources(run, h, nh, S, src);
    if (r >= 0) {
        if (!verdict[0]) {
            const char *w = rank_of(run) == r ? own_why : "";
            snprintf(verdict, len, "rank %d has no snapshot of step %lld on any node of the job%s%s", r, (long long)S,
                     w[0] ? ": " : "", w);
        }
        return 1;
    }
    if (S <= newest_file) {
        if (!verdict[0])
            snprintf(verdict, len, "the snapshot of step %lld is not newer than the newest state file (step %lld)",
                     (long long)S, (long long)newest_file);
        return 1;
    }
    if (S >= run->cfg->train.steps) {
        if (!verdict[0])
            snprintf(verdict, len, "the snapshot of step %lld is not before train.steps = %d", (long long)S,
                     run->cfg->train.steps);
        return 1;
    }
    return 0;
}

/* Rank 0's line after a resume from the memory snapshot of step S (src as sources()). */
static void say_resumed(const gt_run_state *run, int64_t S, int64_t newest_file, const held *h, const int *src,
                        uint64_t bytes, double seconds) {
    char newest[GT_PATH_MAX + 96], from[1024] = "", by[512] = "", copies[512] = "";
    if (newest_file) {
        char path[GT_PATH_MAX + 64];
        gt_rs_state_path(path, sizeof path, run->cfg->checkpoint.dir, newest_file, 0);
        snprintf(newest, sizeof newest, "the newest state file, %s", path);
    } else {
        snprintf(newest, sizeof newest, "any state file");
    }
    int n_sent = 0, n_copies = 0;
    for (int r = 0; r < gt_comm_size(run->comm); r++) {
        if (sent(run, h, src, r)) {
            gt_appendf(from, sizeof from, "%s%d", n_sent ? "," : "", r);
            gt_appendf(by, sizeof by, "%s%d", n_sent ? "," : "", h[src[r]].reader);
            n_sent++;
        } else if (h[src[r]].slot >= 2) { /* a partner's copy in the rank's own directory */
            gt_appendf(copies, sizeof copies, "%s%d", n_copies ? "," : "", r);
            n_copies++;
        }
    }
    char where[2048] = "";
    if (n_sent)
        snprintf(where, sizeof where, n_sent == 1 ? "; the slice of rank %s from another node (sent by rank %s)"
                                                  : "; the slices of ranks %s from other nodes (sent by ranks %s)",
                 from, by);
    if (n_copies)
        gt_appendf(where, sizeof where, n_copies == 1 ? "; rank %s's from a partner's copy on its node"
                                                      : "; ranks %s's from partners' copies on their nodes", copies);
    printf("gtrain: resumed from the memory snapshot of step %lld (every rank's slice in %s verified%s, "
           "%.3f GB per rank copied in %.2f s): newer than %s\n", (long long)S, gt_memsnap_dir(), where,
           (double)bytes / 1e9, seconds, newest);
    fflush(stdout);
}

int gt_rs_memsnap_resume(gt_run_state *run, const start_plan *plan, gt_state_info *info) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run), world = gt_comm_size(run->comm);
    struct {
        int has;
        int64_t newest_file;
        char run_id[24], branch[24];
    } head;
    memset(&head, 0, sizeof head);
    if (rank == 0 && !plan->code && plan->has_record && gt_config_resume(cfg) == GT_RESUME_AUTO) {
        head.has = 1;
        head.newest_file = plan->n ? plan->steps[0] : 0;
        snprintf(head.run_id, sizeof head.run_id, "%s", plan->recorded.run_id);
        snprintf(head.branch, sizeof head.branch, "%s", plan->recorded.branch);
    }
    MPI_Bcast(&head, (int)sizeof head, MPI_BYTE, 0, run->mpi_comm);
    if (!head.has) return 0;
    topology(run);
    gt_memsnap_id id;
    rank_id(run, head.run_id, head.branch, rank, &id);

    /* why this rank's own slots do not read (for the one line), and every directory's holdings */
    char why[2][4400] = {"", ""};
    int found = 0;
    for (int s = 0; s < 2; s++) {
        int64_t step = 0;
        found |= gt_memsnap_peek(&id, s, &step, why[s], sizeof why[s]) < 0;
    }
    int nh = 0;
    held *h = gather_held(run, head.run_id, head.branch, &nh);
    found |= nh > 0;
    int any_found = found;
    MPI_Allreduce(&found, &any_found, 1, MPI_INT, MPI_MAX, run->mpi_comm);
    gt_startup_mark("resume: the memory snapshots' headers read and gathered");
    if (!any_found) {
        free(h);
        return 0;
    }

    int *src = malloc((size_t)world * sizeof *src);
    int64_t *cand = NULL;
    if (!src) abort();
    int nc = candidates(h, nh, &cand);
    char verdict[4800] = "";
    int resumed = 0;
    for (int c = 0; c < nc && !resumed; c++) {
        int64_t S = cand[c];
        if (S <= 0 || (c > 0 && S == cand[c - 1])) continue;
        if (unusable(run, h, nh, S, head.newest_file, why[0][0] ? why[0] : why[1], src, verdict, sizeof verdict))
            continue;
        double t0 = MPI_Wtime();
        void *image = NULL;
        uint64_t image_size = 0;
        fetch_slices(run, head.run_id, head.branch, h, src, &image, &image_size);
        int slot = h[src[rank]].slot, far = sent(run, h, src, rank);
        char msg[4600] = "";
        char *text = NULL;
        gt_state_info got;
        int bad;
        /* verified and loaded in one pass; a rank whose slice does not verify, or a veto below,
         * leaves bytes in the optimizer that no rank may train on: forget_load then clears them */
        if (far) {
            bad = !image || gt_memsnap_verify_load_image(&id, image, image_size, S, run->opt, &got, &text, msg,
                                                         sizeof msg) != 0;
            if (!image) snprintf(msg, sizeof msg, "rank %d could not send its copy", h[src[rank]].reader);
            else if (bad) {
                char tmp[4600];
                snprintf(tmp, sizeof tmp, "the copy sent by rank %d: %s", h[src[rank]].reader, msg);
                snprintf(msg, sizeof msg, "%s", tmp);
            }
        } else {
            bad = gt_memsnap_verify_load(&id, slot, S, run->opt, &got, &text, msg, sizeof msg) != 0;
        }
        free(image);
        if (!bad && rank == 0) bad = fits_run(run, &got, text, msg, sizeof msg) != 0;
        free(text);
        char line[4700];
        snprintf(line, sizeof line, "rank %d: %s", rank, msg);
        if (gt_agree_on_failure(run->mpi_comm, bad, line, sizeof line)) {
            snprintf(verdict, sizeof verdict, "step %lld: %s", (long long)S, line);
            forget_load(run);
            continue;
        }
        gt_startup_mark("resume: the memory snapshot verified and loaded (every rank)");
        gt_optim_publish_params(run->opt);
        run->opt->ops->synchronize();
        MPI_Barrier(run->mpi_comm);
        gt_startup_mark("resume: the parameters published (and every rank done loading)");
        double seconds = MPI_Wtime() - t0;
        *info = got;
        run->memsnap_kept = !far && slot < 2 ? slot : -1; /* its own slot stays until the next refresh */
        run->memsnap_resumed = 1;
        resumed = 1;
        if (rank == 0) say_resumed(run, S, head.newest_file, h, src, 12 * id.count, seconds);
    }
    if (!resumed && rank == 0) {
        if (!verdict[0]) snprintf(verdict, sizeof verdict, "%s", why[0][0] ? why[0] : why[1][0] ? why[1] : "none verifies");
        printf("gtrain: the memory snapshots in %s are not used (%s): resuming from the files on disk\n",
               gt_memsnap_dir(), verdict);
        fflush(stdout);
    }
    free(cand);
    free(src);
    free(h);
    return resumed;
}

/* A start without snapshots of its own (memory_every = 0, or auto without room) that resumed from
 * one: at its clean end this rank's slots and copies of the lineage go too (no writer deletes them). */
static void remove_resumed(gt_run_state *run) {
    int rank = rank_of(run), ward = ward_of(run, rank);
    gt_memsnap_id id;
    char path[4200];
    for (int s = 0; s < 4; s++) {
        if (s >= 2 && ward < 0) break;
        rank_id(run, run->lineage.run_id, run->lineage.branch, s < 2 ? rank : ward, &id);
        gt_memsnap_path(path, sizeof path, &id, s);
        unlink(path);
    }
}

double gt_rs_memsnap_slot_bytes(const gt_run_state *run) {
    if (!run->memsnap) return 0;
    return (double)gt_memsnap_slot_bytes(run->opt->shard.end - run->opt->shard.begin, strlen(run->config_text));
}

/* The sweep before the slots open: the first rank of each directory deletes every slot file of the
 * lineage there that no rank of this start keeps in it: of another world size, or (after a restart
 * whose ranks landed on other nodes, or in another order) a slice whose rank, or whose partner with the
 * copies, now runs on another node. By then every rank has loaded what it resumed from (the resume's
 * agreement, a collective, follows every load and every transfer). Slots on a node the job no longer
 * runs on stay until a start of this run runs there again. */
typedef struct sweep_ctx {
    gt_run_state *run;
    int copies; /* the ranks keep partner copies (snapshots on): those are kept too */
    int removed;
} sweep_ctx;

static void sweep_one(void *user, int world, int r, int slot, const char *name) {
    sweep_ctx *c = user;
    gt_run_state *run = c->run;
    int me = rank_of(run);
    if (world == gt_comm_size(run->comm)) {
        if (slot < 2 && run->memsnap_dir[r] == me) return; /* a rank here: its own slots */
        int p = run->memsnap_partner[r];
        if (slot >= 2 && c->copies && p >= 0 && run->memsnap_dir[p] == me) return; /* the copies a rank here keeps */
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", gt_memsnap_dir(), name);
    if (unlink(path) == 0) c->removed++;
}

static void sweep(gt_run_state *run, int copies) { /* collective: rank 0 says how many went */
    sweep_ctx c = {run, copies, 0};
    if (run->memsnap_dir[rank_of(run)] == rank_of(run))
        gt_memsnap_scan(run->lineage.run_id, run->lineage.branch, sweep_one, &c);
    int removed[2] = {c.removed, c.removed > 0}, sum[2] = {0, 0};
    MPI_Reduce(removed, sum, 2, MPI_INT, MPI_SUM, 0, run->mpi_comm);
    if (rank_of(run) == 0 && sum[0]) {
        printf("gtrain: %d memory snapshot file(s) of this run's earlier starts removed from the shared memory of %d "
               "node(s): no rank of this start keeps them there\n", sum[0], sum[1]);
        fflush(stdout);
    }
}

void gt_rs_memsnap_begin(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    if (!cfg->checkpoint.dir[0]) return;
    topology(run);
    sweep(run, cfg->checkpoint.memory_every != 0);
    if (cfg->checkpoint.memory_every == 0) return;
    int rank = rank_of(run), ward = ward_of(run, rank);
    gt_memsnap_id id, ward_id;
    rank_id(run, run->lineage.run_id, run->lineage.branch, rank, &id);
    if (ward >= 0) rank_id(run, run->lineage.run_id, run->lineage.branch, ward, &ward_id);
    char err[4600] = "";
    run->memsnap = gt_memsnap_open(&id, run->memsnap_kept, ward >= 0 ? &ward_id : NULL, run->config_text, err, sizeof err);
    char line[4700];
    snprintf(line, sizeof line, "rank %d: %s", rank, err);
    if (gt_agree_on_failure(run->mpi_comm, run->memsnap == NULL, line, sizeof line)) {
        gt_memsnap_remove(run->memsnap); /* one rank without snapshots makes every rank's useless */
        run->memsnap = NULL;
        if (rank == 0) {
            fprintf(stderr, "gtrain: warning: memory snapshots are off for this run: %s (checkpoint.memory_every; "
                    "the state files on disk remain)\n", line);
            fflush(stderr);
        }
        return;
    }
    if (rank == 0) {
        int p = run->memsnap_partner[0];
        char partners[128];
        if (p >= 0) snprintf(partners, sizeof partners, "; each rank's also kept by a partner on the next node (rank 0's by rank %d)", p);
        else snprintf(partners, sizeof partners, "; no partner copies (one node)");
        char every[128];
        if (cfg->checkpoint.memory_every < 0)
            snprintf(every, sizeof every, "(checkpoint.memory_every = auto: the interval follows the first steps)");
        else
            snprintf(every, sizeof every, "every %d steps", cfg->checkpoint.memory_every);
        printf("gtrain: memory snapshots %s in %s: 2 slots of %.3f GB per rank%s\n", every, gt_memsnap_dir(),
               (double)gt_memsnap_slot_bytes(id.count, strlen(run->config_text)) / 1e9, partners);
        fflush(stdout);
    }
}

/* The refresh's copy to the partner: this rank sends its new image to its partner and receives its
 * ward's into a copy slot (its checksum last). Every rank refreshes at the same steps, so every rank
 * is here together. A rank whose refresh failed says so first and sends nothing. */
static void exchange(gt_run_state *run, int ok) {
    int rank = rank_of(run), partner = run->memsnap_partner[rank], ward = ward_of(run, rank);
    if (partner < 0 || ward < 0) return;
    uint64_t bytes = 0, copy = gt_memsnap_copy_bytes(run->memsnap);
    const void *image = ok ? gt_memsnap_last_image(run->memsnap, &bytes) : NULL;
    ok = image != NULL;
    int ward_ok = 0;
    MPI_Sendrecv(&ok, 1, MPI_INT, partner, COPY_TAG, &ward_ok, 1, MPI_INT, ward, COPY_TAG, run->mpi_comm,
                 MPI_STATUS_IGNORE);
    char err[4600] = "";
    unsigned char head[GT_MEMSNAP_HEADER_BYTES];
    unsigned char *dst = NULL, *spare = NULL;
    if (ward_ok) {
        dst = gt_memsnap_copy_begin(run->memsnap, err, sizeof err);
        if (!dst) dst = spare = malloc((size_t)copy); /* received and dropped */
        if (!dst) abort();
    }
    MPI_Request req[2 * MAX_REQ + 4];
    int n = 0;
    if (ok) {
        post(1, (void *)image, GT_MEMSNAP_HEADER_BYTES, partner, run->mpi_comm, req, &n);
        post(1, (unsigned char *)image + GT_MEMSNAP_HEADER_BYTES, bytes - GT_MEMSNAP_HEADER_BYTES, partner,
             run->mpi_comm, req, &n);
    }
    if (ward_ok) {
        post(0, head, GT_MEMSNAP_HEADER_BYTES, ward, run->mpi_comm, req, &n);
        post(0, dst + GT_MEMSNAP_HEADER_BYTES, copy - GT_MEMSNAP_HEADER_BYTES, ward, run->mpi_comm, req, &n);
    }
    gt_watchdog_enter("memsnap_copy", bytes + copy);
    MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
    gt_watchdog_leave();
    int kept = ward_ok && !spare && gt_memsnap_copy_end(run->memsnap, head, err, sizeof err) == 0;
    if (ward_ok && !kept) { /* the copy slot stays invalid: the ward's own slots remain */
        fprintf(stderr, "gtrain: rank %d: the copy of rank %d's memory snapshot is not kept: %s\n", rank, ward, err);
        fflush(stderr);
    }
    free(spare);
}

void gt_rs_memsnap_after_step(gt_run_state *run, int step, int file_save_due) {
    int every = run->cfg->checkpoint.memory_every;
    int due = every < 0 ? run->memsnap_due /* auto: agreed at the step boundary */
                        : every > 0 && !file_save_due && step % every == 0;
    if (!run->memsnap || !due || step >= run->cfg->train.steps) return;
    gt_state_info info;
    gt_rs_save_info(run, step, &info);
    char err[4600];
    double t0 = MPI_Wtime();
    int ok = gt_memsnap_refresh(run->memsnap, run->opt, &info, err, sizeof err) == 0;
    if (!ok) {
        fprintf(stderr, "gtrain: rank %d: the memory snapshot of step %d failed: %s (the older one stays)\n",
                rank_of(run), step, err);
        fflush(stderr);
    }
    double t1 = MPI_Wtime();
    exchange(run, ok);
    double t2 = MPI_Wtime();
    gt_autosave_snapped(&run->autosave, step, t2 - t0); /* rank 0: the refresh's cost (memory_every = auto) */
    if (run->metrics) { /* rank 0: what a refresh costs the loop (its own slot; the partner copy) */
        fprintf(run->metrics, "{\"memsnap_step\":%d,\"memsnap_ms\":%.3f,\"memsnap_copy_ms\":%.3f,\"memsnap_bytes\":%llu}\n",
                step, (t1 - t0) * 1e3, (t2 - t1) * 1e3,
                (unsigned long long)gt_memsnap_slot_bytes(run->opt->shard.end - run->opt->shard.begin,
                                                          strlen(run->config_text)));
        fflush(run->metrics);
    }
}

void gt_rs_memsnap_finish(gt_run_state *run) {
    if (!run->memsnap && run->memsnap_resumed) remove_resumed(run);
    gt_memsnap_remove(run->memsnap);
    run->memsnap = NULL;
}
