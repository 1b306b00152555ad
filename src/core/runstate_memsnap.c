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
 *   resume    checkpoint.resume = auto with a lineage recorded in checkpoint.dir: each rank reads
 *             the headers of its two slots of that lineage, world size, rank and slice; the ranks
 *             gather them and take the newest step that every rank holds and that is newer than the
 *             newest state file of the plan (and before train.steps); each rank then loads its slot
 *             into the optimizer and verifies its checksum in the same pass (rank 0 also that the
 *             saved config changes no model key, unless checkpoint.allow_model_change, and the
 *             global batch), and they agree (gt_agree_on_failure): all take it, or the loaded bytes
 *             are cleared (forget_load) and the next older common step is tried, or the files on
 *             disk are used, with one line saying why. A snapshot of another run or branch
 *             is never read past its header and never deleted.
 *   partners  across nodes, each rank's partner (the rank of its index on the next node) keeps a
 *             copy of its snapshot, sent over MPI after each refresh (a collective step: every rank
 *             refreshes at the same steps); a restart counts a step as held by a rank when its own
 *             slot or its partner's copy has it, and a rank without its own fetches the copy.
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
 * rank counts, there are none (-1). run->memsnap_ranges: every rank's flat range (begin, count). */
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
    if (gt_test_hooks_get()->rank_is_node) leader = rank, local = 0, size = 1;
    int mine[3] = {leader, local, size};
    int *all = malloc(3 * (size_t)world * sizeof *all);
    run->memsnap_partner = malloc((size_t)world * sizeof(int));
    run->memsnap_ranges = malloc(2 * (size_t)world * sizeof(uint64_t));
    if (!all || !run->memsnap_partner || !run->memsnap_ranges) abort();
    MPI_Allgather(mine, 3, MPI_INT, all, 3, MPI_INT, run->mpi_comm);
    uint64_t range[2] = {run->opt->shard.begin, run->opt->shard.end - run->opt->shard.begin};
    MPI_Allgather(range, 2, MPI_UINT64_T, run->memsnap_ranges, 2, MPI_UINT64_T, run->mpi_comm);
    int nodes = 0, equal = 1;
    for (int r = 0; r < world; r++) {
        run->memsnap_partner[r] = -1;
        nodes += all[3 * r] == r; /* a node's leader is its first rank */
        equal &= all[3 * r + 2] == all[2];
    }
    if (nodes >= 2 && equal)
        for (int r = 0; r < world; r++) {
            int next = -1; /* the next node's leader, wrapping around */
            for (int q = all[3 * r] + 1; q < world && next < 0; q++)
                if (all[3 * q] == q) next = q;
            for (int q = 0; q < world && next < 0; q++)
                if (all[3 * q] == q) next = q;
            for (int q = 0; q < world; q++)
                if (all[3 * q] == next && all[3 * q + 1] == all[3 * r + 1]) run->memsnap_partner[r] = q;
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

/* all: 4 steps per rank by the headers: its own two slots, then the two copies it keeps of its ward.
 * Does rank r have step s itself? Through its partner's copy? */
static int own_has(const int64_t *all, int r, int64_t s) { return all[4 * r] == s || all[4 * r + 1] == s; }
static int copy_has(const gt_run_state *run, const int64_t *all, int r, int64_t s) {
    int p = run->memsnap_partner[r];
    return p >= 0 && (all[4 * p + 2] == s || all[4 * p + 3] == s);
}

/* Step S from the partner: the holder (whose ward needs it) sends its copy's size and image, the
 * needy rank receives it into *image (malloc'd; *size 0 when the holder could not map it).
 * Collective in the sense that every rank calls it with the same need[]. */
static void fetch_copies(gt_run_state *run, const gt_memsnap_id *ward_id, const int64_t *all, int64_t S,
                         const int *need, void **image, uint64_t *size) {
    int rank = rank_of(run), ward = ward_of(run, rank), partner = run->memsnap_partner[rank];
    MPI_Request req[2 * MAX_REQ + 2];
    int n = 0;
    uint64_t have = 0;
    void *map = NULL;
    *image = NULL;
    *size = 0;
    if (ward >= 0 && need[ward]) { /* send ward its copy */
        int slot = all[4 * rank + 2] == S ? 2 : 3;
        char why[512];
        map = gt_memsnap_map(ward_id, slot, &have, why, sizeof why);
        if (!map) have = 0;
        MPI_Isend(&have, 1, MPI_UINT64_T, ward, COPY_TAG, run->mpi_comm, &req[n++]); /* no rank blocks in a send */
        if (have) post(1, map, have, ward, run->mpi_comm, req, &n);
    }
    if (need[rank] && partner >= 0) {
        MPI_Recv(size, 1, MPI_UINT64_T, partner, COPY_TAG, run->mpi_comm, MPI_STATUS_IGNORE);
        if (*size) {
            *image = malloc((size_t)*size);
            if (!*image) abort();
            post(0, *image, *size, partner, run->mpi_comm, req, &n);
        }
    }
    gt_watchdog_enter("memsnap_fetch", have + *size);
    MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
    gt_watchdog_leave();
    gt_memsnap_unmap(map, have);
}

/* The candidate steps: those rank 0 has (itself or through its partner), newest first; their count. */
static int candidates(const gt_run_state *run, const int64_t *all, int64_t cand[4]) {
    int nc = 0;
    for (int k = 0; k < 2; k++) cand[nc++] = all[k];
    if (run->memsnap_partner[0] >= 0)
        for (int k = 2; k < 4; k++) cand[nc++] = all[4 * run->memsnap_partner[0] + k];
    for (int a = 0; a < nc; a++) /* descending */
        for (int b = a + 1; b < nc; b++)
            if (cand[b] > cand[a]) {
                int64_t t = cand[a];
                cand[a] = cand[b], cand[b] = t;
            }
    return nc;
}

/* Whether step S cannot be resumed from: a rank that has it neither itself nor through its partner's
 * copy (own_why: why this rank's own slots did not verify), not newer than the newest state file, or
 * not before train.steps; the first reason goes into verdict (if it is still empty). need[r]: rank r must fetch S from its partner; *fetched: how many. */
static int unusable(const gt_run_state *run, const int64_t *all, int64_t S, int64_t newest_file, const char *own_why,
                    int *need, int *fetched, char *verdict, size_t len) {
    int rank = rank_of(run), world = gt_comm_size(run->comm);
    *fetched = 0;
    for (int r = 0; r < world; r++) {
        need[r] = !own_has(all, r, S);
        *fetched += need[r];
        if (need[r] && !copy_has(run, all, r, S)) {
            if (!verdict[0]) {
                const char *w = rank == r ? own_why : "";
                snprintf(verdict, len, "rank %d has no snapshot of step %lld%s%s%s", r, (long long)S,
                         run->memsnap_partner[r] >= 0 ? ", nor its partner a copy" : "", w[0] ? ": " : "", w);
            }
            return 1;
        }
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

/* Rank 0's line after a resume from the memory snapshot of step S. */
static void say_resumed(const gt_run_state *run, int64_t S, int64_t newest_file, const int *need, int fetched,
                        uint64_t bytes, double seconds) {
    char newest[GT_PATH_MAX + 96], from[1024] = "";
    if (newest_file) {
        char path[GT_PATH_MAX + 64];
        gt_rs_state_path(path, sizeof path, run->cfg->checkpoint.dir, newest_file, 0);
        snprintf(newest, sizeof newest, "the newest state file, %s", path);
    } else {
        snprintf(newest, sizeof newest, "any state file");
    }
    for (int r = 0; r < gt_comm_size(run->comm); r++)
        if (need[r])
            gt_appendf(from, sizeof from, "%s%d", from[0] ? "," : fetched == 1 ? "; the slice of rank "
                                                                                : "; the slices of ranks ", r);
    if (from[0]) gt_appendf(from, sizeof from, fetched == 1 ? " from its partner's copy" : " from their partners' copies");
    printf("gtrain: resumed from the memory snapshot of step %lld (every rank's slice in %s verified%s, "
           "%.3f GB per rank copied in %.2f s): newer than %s\n", (long long)S, gt_memsnap_dir(), from,
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
    int ward = ward_of(run, rank);
    gt_memsnap_id id, ward_id;
    rank_id(run, head.run_id, head.branch, rank, &id);
    if (ward >= 0) rank_id(run, head.run_id, head.branch, ward, &ward_id);

    /* the headers: this rank's two slots, and the two copies it keeps of its ward (0: none) */
    int64_t mine[4] = {0, 0, 0, 0};
    char why[2][4400] = {"", ""};
    int found = 0;
    for (int s = 0; s < 4; s++) {
        char other[4400];
        int rc = s < 2 || ward >= 0 ? gt_memsnap_peek(s < 2 ? &id : &ward_id, s, &mine[s], s < 2 ? why[s] : other,
                                                       s < 2 ? sizeof why[s] : sizeof other)
                                    : 0;
        if (rc != 1) mine[s] = 0;
        found |= rc != 0;
    }
    int64_t *all = malloc(4 * (size_t)world * sizeof *all);
    int *need = malloc((size_t)world * sizeof *need);
    if (!all || !need) abort();
    MPI_Allgather(mine, 4, MPI_INT64_T, all, 4, MPI_INT64_T, run->mpi_comm);
    int any_found = found;
    MPI_Allreduce(&found, &any_found, 1, MPI_INT, MPI_MAX, run->mpi_comm);
    gt_startup_mark("resume: the memory snapshots' headers read and gathered");
    if (!any_found) {
        free(all);
        free(need);
        return 0;
    }

    int64_t cand[4];
    int nc = candidates(run, all, cand);
    char verdict[4800] = "";
    int resumed = 0;
    for (int c = 0; c < nc && !resumed; c++) {
        int64_t S = cand[c];
        if (S <= 0 || (c > 0 && S == cand[c - 1])) continue;
        int fetched = 0;
        if (unusable(run, all, S, head.newest_file, why[0][0] ? why[0] : why[1], need, &fetched, verdict, sizeof verdict))
            continue;
        double t0 = MPI_Wtime();
        void *image = NULL;
        uint64_t image_size = 0;
        if (fetched) fetch_copies(run, &ward_id, all, S, need, &image, &image_size);
        int slot = mine[0] == S ? 0 : 1;
        char msg[4600] = "";
        char *text = NULL;
        gt_state_info got;
        int bad;
        /* verified and loaded in one pass; a rank whose slice does not verify, or a veto below,
         * leaves bytes in the optimizer that no rank may train on: forget_load then clears them */
        if (need[rank]) {
            bad = !image || gt_memsnap_verify_load_image(&id, image, image_size, S, run->opt, &got, &text, msg,
                                                         sizeof msg) != 0;
            if (!image) snprintf(msg, sizeof msg, "its partner could not send its copy");
            else if (bad) {
                char tmp[4600];
                snprintf(tmp, sizeof tmp, "the copy from its partner rank %d: %s", run->memsnap_partner[rank], msg);
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
        run->memsnap_kept = need[rank] ? -1 : slot;
        run->memsnap_resumed = 1;
        resumed = 1;
        if (rank == 0) say_resumed(run, S, head.newest_file, need, fetched, 12 * id.count, seconds);
    }
    if (!resumed && rank == 0) {
        if (!verdict[0]) snprintf(verdict, sizeof verdict, "%s", why[0][0] ? why[0] : why[1][0] ? why[1] : "none verifies");
        printf("gtrain: the memory snapshots in %s are not used (%s): resuming from the files on disk\n",
               gt_memsnap_dir(), verdict);
        fflush(stdout);
    }
    free(all);
    free(need);
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

void gt_rs_memsnap_begin(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    if (!cfg->checkpoint.dir[0] || cfg->checkpoint.memory_every == 0) return;
    topology(run);
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
