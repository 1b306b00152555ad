/*
 * runstate_memsnap.c — the memory snapshots' policy (runstate_loop.c, "the last step in memory"):
 * when each rank refreshes its snapshot (memsnap.h), which step a restart resumes from memory and
 * when it uses the files on disk instead, and when the snapshots are deleted.
 *
 *   refresh   every checkpoint.memory_every steps (auto: every AUTO_EVERY steps), after the step,
 *             on every rank by itself (no collective): not at a step that saves a state file by
 *             checkpoint.every, nor at the last step (the final save follows).
 *   resume    checkpoint.resume = auto with a lineage recorded in checkpoint.dir: each rank reads
 *             the headers of its two slots of that lineage, world size, rank and slice; the ranks
 *             gather them and take the newest step that every rank holds and that is newer than the
 *             newest state file of the plan (and before train.steps); each rank then verifies its
 *             slot's checksum (rank 0 also that the saved config changes no model key, unless
 *             checkpoint.allow_model_change, and the global batch), and they agree
 *             (gt_agree_on_failure): all load it, or the next older common step is tried, or the
 *             files on disk are used, with one line saying why. A snapshot of another run or branch
 *             is never read past its header and never deleted.
 *   delete    at the run's clean end and after a stop signal's save, each rank deletes its two
 *             slots; a run that ends with an error keeps them for its restart. A start that does not
 *             resume from memory empties its slots (nothing of an earlier life of the lineage is
 *             used later); one that does keeps the slot it resumed from until the next refresh.
 */

#include "runstate_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "config.h"
#include "memsnap.h"
#include "exitcodes.h"

/* checkpoint.memory_every = auto: a fixed interval until the time model chooses it from the
 * measured cost of a refresh and the fault rate (docs/reliability.md). */
#define AUTO_EVERY 5

static int memory_every(const gt_config *cfg) {
    return cfg->checkpoint.memory_every < 0 ? AUTO_EVERY : cfg->checkpoint.memory_every;
}

/* This rank's snapshot identity in lineage (run_id, branch). */
static void my_id(const gt_run_state *run, const char *run_id, const char *branch, gt_memsnap_id *id) {
    memset(id, 0, sizeof *id);
    snprintf(id->run_id, sizeof id->run_id, "%s", run_id);
    snprintf(id->branch, sizeof id->branch, "%s", branch);
    id->world = gt_comm_size(run->comm);
    id->rank = rank_of(run);
    id->n_params = gt_model_layout(run->model)->n_params;
    id->begin = run->opt->shard.begin;
    id->count = run->opt->shard.end - run->opt->shard.begin;
}

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

/* Does rank r hold step s (by its headers)? */
static int holds(const int64_t *all, int r, int64_t s) { return all[2 * r] == s || all[2 * r + 1] == s; }

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
    gt_memsnap_id id;
    my_id(run, head.run_id, head.branch, &id);

    /* the headers of this rank's two slots: their steps (0: none or unusable) */
    int64_t mine[2] = {0, 0};
    char why[2][4400] = {"", ""};
    int found = 0;
    for (int s = 0; s < 2; s++) {
        int rc = gt_memsnap_peek(&id, s, &mine[s], why[s], sizeof why[s]);
        if (rc != 1) mine[s] = 0;
        found |= rc != 0;
    }
    int64_t *all = malloc(2 * (size_t)world * sizeof *all);
    if (!all) abort();
    MPI_Allgather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, run->mpi_comm);
    int any_found = found;
    MPI_Allreduce(&found, &any_found, 1, MPI_INT, MPI_MAX, run->mpi_comm);
    if (!any_found) {
        free(all);
        return 0;
    }

    /* the candidates: rank 0's steps held by every rank, newer than the newest file, newest first */
    int64_t cand[2] = {all[0] > all[1] ? all[0] : all[1], all[0] > all[1] ? all[1] : all[0]};
    char verdict[4800] = "";
    int resumed = 0;
    for (int c = 0; c < 2 && !resumed; c++) {
        int64_t S = cand[c];
        if (S <= 0 || (c == 1 && S == cand[0])) continue;
        int everyone = 1;
        for (int r = 0; r < world && everyone; r++)
            if (!holds(all, r, S)) {
                everyone = 0;
                if (!verdict[0]) {
                    const char *w = rank == r ? (why[0][0] ? why[0] : why[1][0] ? why[1] : "") : "";
                    snprintf(verdict, sizeof verdict, "rank %d has no snapshot of step %lld%s%s", r, (long long)S,
                             w[0] ? ": " : "", w);
                }
            }
        if (!everyone) continue;
        if (S <= head.newest_file) {
            if (!verdict[0])
                snprintf(verdict, sizeof verdict, "the snapshot of step %lld is not newer than the newest state file "
                         "(step %lld)", (long long)S, (long long)head.newest_file);
            continue;
        }
        if (S >= cfg->train.steps) {
            if (!verdict[0])
                snprintf(verdict, sizeof verdict, "the snapshot of step %lld is not before train.steps = %d",
                         (long long)S, cfg->train.steps);
            continue;
        }
        int slot = mine[0] == S ? 0 : 1;
        char msg[4600] = "";
        char *text = NULL;
        gt_state_info got;
        int bad = gt_memsnap_verify(&id, slot, S, &got, &text, msg, sizeof msg) != 0;
        if (!bad && rank == 0) bad = fits_run(run, &got, text, msg, sizeof msg) != 0;
        free(text);
        char line[4700];
        snprintf(line, sizeof line, "rank %d: %s", rank, msg);
        if (gt_agree_on_failure(run->mpi_comm, bad, line, sizeof line)) {
            snprintf(verdict, sizeof verdict, "step %lld: %s", (long long)S, line);
            continue;
        }
        double t0 = MPI_Wtime();
        bad = gt_memsnap_load(&id, slot, run->opt, msg, sizeof msg) != 0;
        snprintf(line, sizeof line, "rank %d: %s", rank, msg);
        if (gt_agree_on_failure(run->mpi_comm, bad, line, sizeof line)) {
            if (rank == 0) {
                fprintf(stderr, "gtrain: the verified memory snapshot of step %lld did not load (%s): the optimizer "
                        "holds part of it; start again to resume from the files on disk\n", (long long)S, line);
                fflush(stderr);
            }
            free(all);
            return -1;
        }
        gt_optim_publish_params(run->opt);
        run->opt->ops->synchronize();
        MPI_Barrier(run->mpi_comm);
        double seconds = MPI_Wtime() - t0;
        *info = got;
        run->memsnap_kept = slot;
        resumed = 1;
        if (rank == 0) {
            char newest[GT_PATH_MAX + 96];
            if (head.newest_file) {
                char path[GT_PATH_MAX + 64];
                gt_rs_state_path(path, sizeof path, cfg->checkpoint.dir, head.newest_file, 0);
                snprintf(newest, sizeof newest, "the newest state file, %s", path);
            } else {
                snprintf(newest, sizeof newest, "any state file");
            }
            printf("gtrain: resumed from the memory snapshot of step %lld (every rank's slice in %s verified, "
                   "%.3f GB per rank copied in %.2f s): newer than %s\n", (long long)S, gt_memsnap_dir(),
                   (double)(12 * id.count) / 1e9, seconds, newest);
            fflush(stdout);
        }
    }
    if (!resumed && rank == 0) {
        if (!verdict[0]) snprintf(verdict, sizeof verdict, "%s", why[0][0] ? why[0] : why[1][0] ? why[1] : "none verifies");
        printf("gtrain: the memory snapshots in %s are not used (%s): resuming from the files on disk\n",
               gt_memsnap_dir(), verdict);
        fflush(stdout);
    }
    free(all);
    return resumed;
}

void gt_rs_memsnap_begin(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    if (!cfg->checkpoint.dir[0] || cfg->checkpoint.memory_every == 0) return;
    gt_memsnap_id id;
    my_id(run, run->lineage.run_id, run->lineage.branch, &id);
    char err[4600] = "";
    run->memsnap = gt_memsnap_open(&id, run->memsnap_kept, run->config_text, err, sizeof err);
    char line[4700];
    snprintf(line, sizeof line, "rank %d: %s", rank_of(run), err);
    if (gt_agree_on_failure(run->mpi_comm, run->memsnap == NULL, line, sizeof line)) {
        gt_memsnap_remove(run->memsnap); /* one rank without snapshots makes every rank's useless */
        run->memsnap = NULL;
        if (rank_of(run) == 0) {
            fprintf(stderr, "gtrain: warning: memory snapshots are off for this run: %s (checkpoint.memory_every; "
                    "the state files on disk remain)\n", line);
            fflush(stderr);
        }
        return;
    }
    if (rank_of(run) == 0) {
        printf("gtrain: memory snapshots every %d steps%s in %s: 2 slots of %.3f GB per rank\n", memory_every(cfg),
               cfg->checkpoint.memory_every < 0 ? " (auto)" : "", gt_memsnap_dir(),
               (double)gt_memsnap_slot_bytes(id.count, strlen(run->config_text)) / 1e9);
        fflush(stdout);
    }
}

void gt_rs_memsnap_after_step(gt_run_state *run, int step, int file_save_due) {
    if (!run->memsnap || file_save_due || step >= run->cfg->train.steps || step % memory_every(run->cfg) != 0) return;
    gt_state_info info;
    gt_rs_save_info(run, step, &info);
    char err[4600];
    if (gt_memsnap_refresh(run->memsnap, run->opt, &info, err, sizeof err) != 0) {
        fprintf(stderr, "gtrain: rank %d: the memory snapshot of step %d failed: %s (the older one stays)\n",
                rank_of(run), step, err);
        fflush(stderr);
    }
}

void gt_rs_memsnap_finish(gt_run_state *run) {
    gt_memsnap_remove(run->memsnap);
    run->memsnap = NULL;
}
