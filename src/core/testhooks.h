/*
 * testhooks.h — the GTRAIN_TEST_* variables: faults and pauses that tests inject into a real run
 * (a NaN gradient, a rank killed inside a gather, a slow save, ...). A release binary honours them
 * only when GTRAIN_TEST_HOOKS=1 says "this is a test", so that one left exported in a shell cannot
 * travel through sbatch or mpirun into a production job; without it the run refuses to start.
 */
#ifndef GT_TESTHOOKS_H
#define GT_TESTHOOKS_H

/* The value of hook NAME (e.g. "GTRAIN_TEST_NAN_AT"), or NULL when it is unset, empty, or hooks are
 * not enabled by GTRAIN_TEST_HOOKS=1. */
const char *gt_test_hook(const char *name);

/* Before training, on every rank: any GTRAIN_TEST_* variable set without GTRAIN_TEST_HOOKS=1 is
 * one line on rank 0 naming it and 2 (GT_EXIT_BAD_INPUT); with it, rank 0 prints one line per active
 * hook and this returns 0. Every rank sees the same environment, so every rank returns the same. */
int gt_test_hooks_check(int rank);

#endif
