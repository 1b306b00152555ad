/*
 * testhooks.c — the gate in front of the GTRAIN_TEST_* variables (see testhooks.h). The hooks
 * themselves stay where they act (train.c, zero.c, state.c, runstate.c); each reads its variable
 * through gt_test_hook, which answers NULL unless GTRAIN_TEST_HOOKS=1, and gt_train calls
 * gt_test_hooks_check once before anything collective, so that a stray variable is refused at
 * start and an honoured one is announced.
 */
#include "testhooks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

#define PREFIX "GTRAIN_TEST_"
#define ENABLE "GTRAIN_TEST_HOOKS"

static int hooks_enabled(void) {
    const char *on = getenv(ENABLE);
    return on && strcmp(on, "1") == 0;
}

const char *gt_test_hook(const char *name) {
    const char *value = getenv(name);
    if (!value || !*value || !hooks_enabled()) return NULL;
    return value;
}

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
            return 2;
        }
        if (rank == 0) fprintf(stderr, "gtrain: test hook active: %s\n", *e);
    }
    return 0;
}
