/*
 * check.h — the assertion of the C tests: CHECK(cond, fmt, ...) reports a failed condition with
 * file:line (and the rank, in MPI tests that set check_rank) and counts it, but never stops, so one
 * run shows every failure. A test exits non-zero when check_failures > 0.
 */
#ifndef GT_TEST_CHECK_H
#define GT_TEST_CHECK_H

#include <stdio.h>

static int check_failures = 0;
static int check_rank = -1; /* >= 0: prefix messages with the MPI rank */

#define CHECK(cond, ...)                                                                \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            if (check_failures < 30) {                                                  \
                if (check_rank >= 0) fprintf(stderr, "[rank %d] ", check_rank);         \
                fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #cond);         \
                fprintf(stderr, __VA_ARGS__);                                           \
                fprintf(stderr, "\n");                                                  \
            }                                                                           \
            check_failures++;                                                           \
        }                                                                               \
    } while (0)

#endif
