/*
 * testhooks.c — the GTRAIN_TEST_* variables (see testhooks.h): the gate in front of them, their
 * parsing into gt_test_hooks, and the two hooks that act on a training step. gt_train calls
 * gt_test_hooks_check once before anything collective, so that a stray variable is refused at start,
 * an honoured one is announced, and the hooks are parsed before any thread (an asynchronous save's
 * writer) reads them.
 */
#include "testhooks.h"

#include "exitcodes.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

#define PREFIX "GTRAIN_TEST_"
#define ENABLE "GTRAIN_TEST_HOOKS"

static gt_test_hooks g_hooks;
static int g_parsed;

static int hooks_enabled(void) {
    const char *on = getenv(ENABLE);
    return on && strcmp(on, "1") == 0;
}

/* The value of hook NAME, or NULL when it is unset, empty, or hooks are not enabled. */
static const char *hook(const char *name) {
    const char *value = getenv(name);
    if (!value || !*value || !hooks_enabled()) return NULL;
    return value;
}

static void parse_nan_at(gt_test_hooks *h) {
    const char *env = hook("GTRAIN_TEST_NAN_AT");
    char kind[16] = "";
    if (env && sscanf(env, "%d:%d:%d:%15s", &h->nan_at.step, &h->nan_at.micro, &h->nan_at.rank, kind) >= 2) {
        h->nan_at.grad_only = strcmp(kind, "grad") == 0;
        h->nan_at.spike = strcmp(kind, "spike") == 0;
        h->nan_at.loss_spike = strcmp(kind, "lossspike") == 0;
    } else {
        memset(&h->nan_at, 0, sizeof h->nan_at);
    }
}

static void parse_hang_at(gt_test_hooks *h) {
    const char *env = hook("GTRAIN_TEST_HANG_AT");
    for (; env && *env && h->n_hang_at < GT_TEST_HANGS_MAX; env = strchr(env, ',') ? strchr(env, ',') + 1 : "") {
        int at = 0, who = 0;
        char how[8] = "";
        if (sscanf(env, "%d:%d:%7[a-z]", &at, &who, how) != 3) continue;
        h->hang_at[h->n_hang_at].step = at;
        h->hang_at[h->n_hang_at].rank = who;
        h->hang_at[h->n_hang_at].kind = strcmp(how, "slow") == 0   ? GT_TEST_HANG_SLOW
                                        : strcmp(how, "stop") == 0 ? GT_TEST_HANG_STOP
                                                                   : GT_TEST_HANG_SPIN;
        h->n_hang_at++;
    }
}

static void parse_saves(gt_test_hooks *h) {
    const char *env = hook("GTRAIN_TEST_SLOW_SAVE");
    h->slow_save_s = env ? atof(env) : 0.0;
    const char *colon = env ? strchr(env, ':') : NULL;
    h->slow_write_ms = colon ? atof(colon + 1) : 0.0;
    const char *who = colon ? strchr(colon + 1, ':') : NULL;
    h->slow_write_rank = who ? atoi(who + 1) : -1;
    env = hook("GTRAIN_TEST_HANG_IN_SAVE");
    h->hang_in_save.step = h->hang_in_save.rank = -1;
    char how[16] = "";
    if (!env || sscanf(env, "%ld:%ld:%15s", &h->hang_in_save.step, &h->hang_in_save.rank, how) < 2)
        h->hang_in_save.step = h->hang_in_save.rank = -1;
    h->hang_in_save.stop = strcmp(how, "stop") == 0;
    env = hook("GTRAIN_TEST_SAVE_EIO");
    char list[256], *save = NULL;
    snprintf(list, sizeof list, "%s", env ? env : "");
    for (char *r = strtok_r(list, ",", &save); r && h->n_save_eio_ranks < GT_TEST_EIO_RANKS_MAX;
         r = strtok_r(NULL, ",", &save))
        h->save_eio_ranks[h->n_save_eio_ranks++] = atoi(r);
}

static void parse(gt_test_hooks *h) {
    uint64_t head_chunk_bytes = h->head_chunk_bytes; /* a unit test's, not the environment's */
    memset(h, 0, sizeof *h);
    h->head_chunk_bytes = head_chunk_bytes;
    parse_nan_at(h);
    parse_hang_at(h);
    const char *env = hook("GTRAIN_TEST_DIE_IN_GATHER");
    char when[16] = "";
    h->die_in_gather.rank = 1;
    if (env) sscanf(env, "%ld:%ld:%15s", &h->die_in_gather.at, &h->die_in_gather.rank, when);
    h->die_in_gather.started = strcmp(when, "started") == 0;
    parse_saves(h);
    h->list_dir_eio = (env = hook("GTRAIN_TEST_LIST_DIR_EIO")) != NULL && strcmp(env, "1") == 0;
    h->read_fails_once_rank = (env = hook("GTRAIN_TEST_READ_FAILS_ONCE")) != NULL ? atoi(env) : -1;
    h->dir_fsync_eio = (env = hook("GTRAIN_TEST_DIR_FSYNC_EIO")) != NULL && strcmp(env, "1") == 0;
    env = hook("GTRAIN_TEST_START_DELAY_MS");
    h->start_delay_ms = env ? atol(env) : 0;
    h->blas_generic = (env = hook("GTRAIN_TEST_BLAS_GENERIC")) != NULL && strcmp(env, "1") == 0;
    env = hook("GTRAIN_TEST_STEP_DELAY_MS");
    h->step_delay_ms = env ? atol(env) : 0;
    env = hook("GTRAIN_TEST_NO_RESERVE");
    h->no_reserve = env && strcmp(env, "1") == 0;
    h->rank_is_node = hook("GTRAIN_TEST_RANK_IS_NODE") != NULL;
    env = hook("GTRAIN_TEST_MEMSNAP_KILL");
    if (!env || sscanf(env, "%ld:%d", &h->memsnap_kill.step, &h->memsnap_kill.rank) != 2) h->memsnap_kill.step = 0;
    env = hook("GTRAIN_TEST_MEM_AVAILABLE");
    h->has_mem_available = env != NULL;
    h->mem_available = env ? (uint64_t)strtoull(env, NULL, 10) : 0;
    env = hook("GTRAIN_TEST_CALIB_SLOW_ROUND");
    h->calib_slow_round.rounds = 0;
    for (const char *c = env; c && *c;) { /* "1,3,5:30" */
        char *end;
        long r = strtol(c, &end, 10);
        if (end == c || r < 1 || r > 31) break;
        h->calib_slow_round.rounds |= 1u << (r - 1);
        if (*end == ':') {
            h->calib_slow_round.ms = strtod(end + 1, NULL);
            break;
        }
        if (*end != ',') {
            h->calib_slow_round.rounds = 0;
            break;
        }
        c = end + 1;
    }
    if (!env || !strchr(env, ':') || h->calib_slow_round.ms <= 0) h->calib_slow_round.rounds = 0;
    env = hook("GTRAIN_TEST_CALIB_ROUNDS");
    h->calib_rounds = env ? atoi(env) : 0;
    if (h->calib_rounds < 0) h->calib_rounds = 0;
    env = hook("GTRAIN_TEST_SHM_FREE");
    h->has_shm_free = env != NULL;
    h->shm_free = env ? (uint64_t)strtoull(env, NULL, 10) : 0;
}

gt_test_hooks *gt_test_hooks_for_tests(void) {
    if (!g_parsed) {
        parse(&g_hooks);
        g_parsed = 1;
    }
    return &g_hooks;
}

const gt_test_hooks *gt_test_hooks_get(void) { return gt_test_hooks_for_tests(); }

int gt_test_hooks_check(int rank) {
    int enabled = hooks_enabled();
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, PREFIX, strlen(PREFIX)) != 0 || strncmp(*e, ENABLE "=", strlen(ENABLE) + 1) == 0) continue;
        const char *eq = strchr(*e, '=');
        if (!eq || !eq[1]) continue; /* set but empty: off, as every hook reads it */
        int name_len = (int)(eq - *e);
        if (!enabled) {
            if (rank == 0)
                fprintf(stderr, "gtrain: %.*s is set: a test hook, honoured only with " ENABLE "=1 (unset %.*s)\n",
                        name_len, *e, name_len, *e);
            return GT_EXIT_BAD_INPUT;
        }
        if (rank == 0) fprintf(stderr, "gtrain: test hook active: %s\n", *e);
    }
    gt_test_hooks_get();
    return 0;
}

void gt_test_hang(int step, int rank) {
    const gt_test_hooks *h = gt_test_hooks_get();
    for (int i = 0; i < h->n_hang_at; i++) {
        if (h->hang_at[i].step != step || h->hang_at[i].rank != rank) continue;
        if (h->hang_at[i].kind == GT_TEST_HANG_SLOW) {
            sleep(3);
        } else if (h->hang_at[i].kind == GT_TEST_HANG_STOP) {
            raise(SIGSTOP);
        } else {
            for (volatile unsigned long spin = 0;; spin++) {
            }
        }
    }
}

double gt_test_nan(int step, int micro, int rank, void (*copy_to_device)(void *dst, const void *src, size_t bytes),
                   float *grads, double loss) {
    const gt_test_hooks *h = gt_test_hooks_get();
    if (h->nan_at.step == 0 || h->nan_at.step != step || h->nan_at.micro != micro || h->nan_at.rank != rank)
        return loss;
    if (h->nan_at.loss_spike) return 10 * loss;
    float value = h->nan_at.spike ? 1e4f : NAN;
    copy_to_device(grads, &value, sizeof value);
    return h->nan_at.grad_only || h->nan_at.spike ? loss : NAN;
}
