/*
 * watchdog.h — ends a job that hangs, and names the rank(s) it waits for.
 *
 * Every rank keeps a small record of where it is: the collective it is in (operation name and
 * sequence number: the n-th collective this rank started), since when, the last step it finished.
 * The communicator's public wrappers (comm_mpi.c) and the trainer update it with a few stores; a
 * thread per rank wakes once a second, writes the record to DIR/rank_NNNNN (a line of text, readable
 * by every other rank without a collective: DIR is checkpoint.dir/.watchdog, shared by the nodes, or
 * a node-local directory under /dev/shm when the run has no checkpoint.dir) and checks two clocks:
 * time inside the current collective, and time since the last finished step. When either passes the
 * limit, it reads every rank's record, names the ranks that did not arrive (they started fewer
 * collectives than the most advanced rank, or their record stopped being refreshed: a stopped or
 * dead process), prints ONE line (the first rank to claim DIR/verdict prints; others stay silent;
 * the same rank writes the named ranks' hosts to DIR/blamed_hosts, one per line, for a batch script
 * that leaves them out of the requeued job) and ends the process with GT_WATCHDOG_EXIT (76): the
 * launcher then ends the other ranks.
 *
 * The flight recorder: the same calls also fill a ring of the last GT_FLIGHT_ENTRIES operations
 * (sequence number, name, bytes, step, issue and completion times) that lives in a file mapped
 * into memory, DIR/flight_NNNNN: no system call per operation, and the kernel keeps the file's
 * contents when the process is stopped or killed, so after a hang tools/flight_recorder.py reads
 * every rank's ring and says where the ranks diverge. Its layout is GT_FLIGHT_* below.
 *
 * The limit is max(dist.timeout, 10 x the slowest step so far, the first step after the start not
 * counted: it pays for allocation): the configured seconds are a floor that covers start-up and the
 * first step; steps that are slow by nature raise it. Inside a save (a phase, below) the clock of
 * "finished no step" runs from the save's last progress instead: a save may take any time while it
 * writes, and only a call that never returns, or a rank that stops progressing, ends it.
 *
 * Liveness, apart from progress (dist.liveness_timeout, a few seconds): dist.timeout must cover a
 * start's first step, slow collectives and saves, so it cannot be short; a rank that is stopped,
 * dead or wedged is named sooner by two signs that a slow rank never shows:
 *   - its heartbeat stops: every rank reads the records of its two neighbours (rank - 1 and
 *     rank + 1, around the ring: two reads a second per rank, however many ranks) and notes, on its
 *     own monotonic clock, when each record last changed (no comparison of clocks across nodes).
 *     One unchanged for longer than the limit is a stopped or dead process (its watchdog thread,
 *     which writes whatever the rank computes, is frozen or gone). On the same host the verdict is
 *     checked in /proc: a process that exists and is not stopped is alive (its watchdog thread is
 *     late, say in a write to a slow file system), and is left to dist.timeout.
 *   - its training thread computes without progress: the kernels table (core/ops_watch.h), the
 *     collectives and the step boundaries count progress; the watchdog thread adds up the training
 *     thread's own CPU time (pthread_getcpuclockid) while it is inside a step, outside any
 *     collective or save, and none of these began or ended. A kernel that never returns spins on
 *     its CPU; a stopped, starved or throttled rank consumes none, and is never called wedged. The
 *     limit is the larger of dist.liveness_timeout and GT_WATCHDOG_KERNEL_FACTOR x the longest such
 *     quiet stretch seen in this run's steps so far (a backend whose single kernels are slow raises
 *     it), and it is armed once a step has finished in this process (the first step pays for
 *     allocation). A kernel that blocks without computing (a deadlock, a device the host sleeps on)
 *     and a collective that never completes are dist.timeout's.
 * The rank named either way ends the job with exit 76 and one line, as above. 0 turns both off.
 * Everything here is a no-op until gt_watchdog_start and after gt_watchdog_stop.
 */
#ifndef GT_WATCHDOG_H
#define GT_WATCHDOG_H

#include <mpi.h>
#include <stdint.h>

#define GT_WATCHDOG_EXIT 76      /* == GT_EXIT_HUNG (core/exitcodes.h); dist cannot include core */
#define GT_WATCHDOG_STEP_FACTOR 10.0
#define GT_WATCHDOG_KERNEL_FACTOR 4.0

/* flight_NNNNN: a 64-byte header {char magic[16] = "gtrain-flight 1", uint32 entries, int32 rank,
 * int32 pid, 36 bytes zero}, then `entries` records of 64 bytes, little-endian as the host writes them:
 * {uint64 seq, uint64 bytes, double t_issue, double t_done (0 while in flight), int32 step,
 *  int32 state (0 empty, 1 in flight, 2 done), char op[24]}; operation seq is at index seq % entries. */
#define GT_FLIGHT_ENTRIES 1024

/* Collective over world. dir: checkpoint.dir, or "" for a node-local record directory.
 * timeout_s <= 0: off (returns 0 and does nothing). liveness_s: dist.liveness_timeout (0: no
 * liveness checks; the heartbeat is then once a second, else as often as a quarter of it). Returns 0, or -1 with a reason (the record
 * directory cannot be made) — the same on every rank is not guaranteed; the caller agrees. */
int gt_watchdog_start(MPI_Comm world, const char *dir, double timeout_s, double liveness_s, char *why,
                      size_t why_len);

/* Stops the thread and removes this rank's record. Not collective. */
void gt_watchdog_stop(void);

/* A blocking collective of `bytes` (this rank's buffer): enter returns its sequence number; leave
 * marks it complete. */
uint64_t gt_watchdog_enter(const char *op, uint64_t bytes);
void gt_watchdog_leave(void);

/* A non-blocking collective: started (counts it and returns its number), then later waited for. */
uint64_t gt_watchdog_started(const char *op, uint64_t bytes);
void gt_watchdog_enter_wait(const char *op, uint64_t seq);

/* A long operation made of many calls that every rank makes in the same order: a save. It counts as
 * one operation `name` (one ring entry); the enter/leave calls inside it are numbered within it
 * (not in the ring), so that the verdict compares ranks by how far into it they got: one blocked in
 * the save's 57th call waits for one that has not entered it, which is named, with `name`. Not
 * nested. The synchronous save (core/runstate_save.c) brackets itself; an asynchronous writer's wait
 * for its thread belongs in one too. One record per rank, kept by the thread that called
 * gt_watchdog_start: enter/leave/phase calls from any other thread (a background writer running
 * state_write.c's tracked HDF5 calls) are ignored. */
uint64_t gt_watchdog_phase_begin(const char *name, uint64_t bytes);
void gt_watchdog_phase_end(void);

/* A save's progress: `bytes` more of it written by this rank. From any thread (a background
 * writer's count too); a no-op while the watchdog is off. Inside a phase, its progress (these calls,
 * and each of its calls that completes) restarts the clock of "finished no step": a save that is
 * slow but writing is never ended, however much longer than the limit it takes; one whose rank
 * stops progressing is, the limit after its last progress, and that rank is named. */
void gt_watchdog_progress(uint64_t bytes);

/* fn(arg) runs when this rank's watchdog ends the job, after the verdict is written and before the
 * exit, in a thread of its own with ABORT_GRACE_S (10 s) to finish: the NCCL communicator aborts
 * there (comm_nccl.c), so that no kernel waits on a peer forever. One hook; NULL removes it. */
void gt_watchdog_on_fire(void (*fn)(void *arg), void *arg);

/* A kernel (an op of the kernels table, a copy, a synchronisation) begins and ends on the training
 * thread (core/ops_watch.c); `op` is a string literal. Calls from other threads are ignored. */
void gt_watchdog_kernel_begin(const char *op);
void gt_watchdog_kernel_end(void);

/* The trainer: step `step` begins; step finished after `seconds` of work (saves excluded). */
void gt_watchdog_step_begin(int step);
void gt_watchdog_step_done(int step, double seconds);

#endif
