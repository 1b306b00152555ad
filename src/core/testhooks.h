/*
 * testhooks.h — the GTRAIN_TEST_* variables: faults and pauses that tests inject into a real run
 * (a NaN gradient, a rank killed inside a gather, a slow save, ...). A release binary honours them
 * only when GTRAIN_TEST_HOOKS=1 says "this is a test", so that one left exported in a shell cannot
 * travel through sbatch or mpirun into a production job; without it the run refuses to start.
 *
 * Every variable is parsed here, once, into gt_test_hooks; the product reads one field of it where
 * the hook acts (train.c, zero.c, state.c, runstate*.c, memsnap.c, preflight.c, calibrate.c, gtrain_main.c), and the two hooks that act on a
 * training step (a NaN, a hang) are carried out by the functions below. Unset, empty, or not enabled:
 * the field is off (0, or as its comment says).
 */
#ifndef GT_TESTHOOKS_H
#define GT_TESTHOOKS_H

#include <stddef.h>
#include <stdint.h>

#define GT_TEST_HANGS_MAX 16
#define GT_TEST_EIO_RANKS_MAX 64

typedef enum gt_test_hang_kind { GT_TEST_HANG_SPIN, GT_TEST_HANG_STOP, GT_TEST_HANG_SLOW } gt_test_hang_kind;

typedef struct gt_test_hooks {
    /* GTRAIN_TEST_NAN_AT=STEP:MICRO[:RANK[:grad|spike|lossspike]]: at optimizer step STEP, after
     * micro-batch MICRO of rank RANK (default 0), one gradient element becomes NaN and, unless `grad`
     * is given, so does that micro-batch's loss, as an overflow in the forward pass would make them.
     * `spike`: the element becomes 1e4 instead (a finite gradient-norm spike); `lossspike`: only the
     * micro-batch's loss is multiplied by 10 (train.spike_zscore). step 0: off. */
    struct {
        int step, micro, rank, grad_only, spike, loss_spike;
    } nan_at;
    /* GTRAIN_TEST_HANG_AT=STEP:RANK:stop|spin|slow[,...]: rank RANK hangs as step STEP begins, before
     * its first collective of the step: stopped by SIGSTOP (a frozen process), or in an endless loop
     * (compute that never ends; its own threads keep running; any word but stop and slow). What the
     * watchdog must catch. `slow`: that step takes 3 s longer (on every rank, the others waiting). */
    struct {
        int step, rank;
        gt_test_hang_kind kind;
    } hang_at[GT_TEST_HANGS_MAX];
    int n_hang_at;
    /* GTRAIN_TEST_DIE_IN_GATHER=K[:RANK[:started]]: rank RANK (default 1) kills itself (SIGKILL) as it
     * enters its K-th ZeRO-3 gather, or with `started` right after it started that gather (zero.c).
     * at 0: off. */
    struct {
        long at, rank;
        int started;
    } die_in_gather;
    /* GTRAIN_TEST_SLOW_SAVE=S[:MS[:RANK]]: sleep S seconds in the middle of every save, and make every
     * tensor write of every save MS milliseconds slower (with RANK: only that rank's) (state_write.c). */
    double slow_save_s;
    double slow_write_ms;
    int slow_write_rank; /* -1: every rank */
    /* GTRAIN_TEST_HANG_IN_SAVE=STEP:RANK[:stop]: in the save of step STEP, rank RANK enters a write
     * that never returns, or with `stop` stops itself (SIGSTOP) there (state_write.c). step -1: off. */
    struct {
        long step, rank;
        int stop;
    } hang_in_save;
    /* GTRAIN_TEST_SAVE_EIO=R[,R...]: in every save, the writers of these ranks fail as EIO (state_write.c). */
    int save_eio_ranks[GT_TEST_EIO_RANKS_MAX];
    int n_save_eio_ranks;
    /* GTRAIN_TEST_LIST_DIR_EIO=1: listing checkpoint.dir fails with EIO (runstate_files.c). */
    int list_dir_eio;
    /* GTRAIN_TEST_READ_FAILS_ONCE=R: the first read of a state file fails on rank R, as a transient
     * EIO/ESTALE would (runstate_resume.c). -1: off. */
    int read_fails_once_rank;
    /* GTRAIN_TEST_DIR_FSYNC_EIO=1: the fsync of checkpoint.dir after a save's rename fails with EIO
     * (runstate_save.c). */
    int dir_fsync_eio;
    /* GTRAIN_TEST_START_DELAY_MS=N: a pause of N ms first thing in main, after the stop handlers are
     * installed and before MPI starts (gtrain_main.c). */
    long start_delay_ms;
    /* GTRAIN_TEST_BLAS_GENERIC=1: the BLAS core OpenBLAS chose counts as a generic one, which gtrain
     * replaces before it starts (gtrain_main.c), as on CPUs OpenBLAS does not know; by Haswell (AVX2),
     * so that the core changes on any x86 CPU that runs the tests, whatever OpenBLAS chose there. */
    int blas_generic;
    /* GTRAIN_TEST_STEP_DELAY_MS=N: a pause of N ms after every step (runstate_loop.c). */
    long step_delay_ms;
    /* GTRAIN_TEST_NO_RESERVE=1: no space reservation before a save (runstate_save.c). */
    int no_reserve;
    /* GTRAIN_TEST_RANK_IS_NODE (any value): every rank probes checkpoint.dir as a node (runstate_dir.c),
     * keeps its memory snapshots' partner copies as one (runstate_memsnap.c), and is measured as one by
     * gtrain --calibrate (its collectives between nodes; calibrate.c). */
    int rank_is_node;
    /* GTRAIN_TEST_MEMSNAP_KILL=STEP:RANK: rank RANK kills itself (SIGKILL) in the middle of writing the
     * memory snapshot of step STEP, its header written and a third of its payload (memsnap.c). step 0: off. */
    struct {
        long step;
        int rank;
    } memsnap_kill;
    /* GTRAIN_TEST_MEM_AVAILABLE=BYTES: the memory preflight sees a node with this much (preflight.c). */
    int has_mem_available;
    uint64_t mem_available;
    /* GTRAIN_TEST_SHM_FREE=BYTES: the shared-memory directory of the memory snapshots has this much
     * free, for checkpoint.memory_every = auto's check (preflight.c). */
    int has_shm_free;
    uint64_t shm_free;
    /* GTRAIN_TEST_CALIB_SLOW_ROUND=R[,R...]:MS: in rounds R (1 to 5) of gtrain --calibrate, every timed
     * call takes MS milliseconds longer, as a burst of another process's load would make it
     * (calibrate.c). rounds: bit R-1 for round R; 0: off. */
    struct {
        unsigned rounds;
        double ms;
    } calib_slow_round;
    /* GTRAIN_TEST_CALIB_ROUNDS=N: gtrain --calibrate runs at most N rounds of its list (1 to 5), as it
     * does by itself when a round of a large model takes most of its time (calibrate.c). Tests that
     * check what the file holds and how --plan reads it, not the choice among rounds, take 1. 0: off. */
    int calib_rounds;
    /* Not a variable: unit tests set it directly (gt_test_hooks_for_tests) to make the loss head's
     * chunks this many bytes (model.c's gt_head_rows; 0: the built-in size). */
    uint64_t head_chunk_bytes;
} gt_test_hooks;

/* The hooks, parsed from the environment on the first call. */
const gt_test_hooks *gt_test_hooks_get(void);

/* The same, writable: for unit tests that set head_chunk_bytes. */
gt_test_hooks *gt_test_hooks_for_tests(void);

/* Before training, on every rank: any GTRAIN_TEST_* variable set without GTRAIN_TEST_HOOKS=1 is
 * one line on rank 0 naming it and 2 (GT_EXIT_BAD_INPUT); with it, rank 0 prints one line per active
 * hook and this returns 0. Every rank sees the same environment, so every rank returns the same. */
int gt_test_hooks_check(int rank);

/* GTRAIN_TEST_HANG_AT, at the start of step `step` on rank `rank`. */
void gt_test_hang(int step, int rank);

/* GTRAIN_TEST_NAN_AT, after micro-batch `micro` of step `step` on rank `rank`: writes the hook's
 * value into the first element of the fp32 gradient buffer `grads` (copy_to_device: the backend's
 * copy) when it says so, and returns the micro-batch's loss as the hook makes it. */
double gt_test_nan(int step, int micro, int rank, void (*copy_to_device)(void *dst, const void *src, size_t bytes),
                   float *grads, double loss);

#endif
