/*
 * agree.h — what the ranks of a communicator settle among themselves outside the training
 * collectives: one verdict on a check whose outcome may differ between ranks, and which ranks share
 * a node (MPI_COMM_TYPE_SHARED), for thread counts, GPU choice, memory shares and per-node probes,
 * and that every rank runs the same binary (a node with another build fails at start-up, by name,
 * instead of later with a mismatched message or a hang).
 */
#ifndef GT_AGREE_H
#define GT_AGREE_H

#include <stddef.h>

#include <mpi.h>

/* For a check whose outcome may differ between ranks (a file only some nodes see, a GPU only some
 * have): every rank passes its own code (0 = fine) and message; all get back the worst code and, in
 * msg, the message of the lowest rank that had it. Collective over comm; msg_len equal on all ranks. */
int gt_agree_on_failure(MPI_Comm comm, int code, char *msg, size_t msg_len);

/* For a failure that may hit several ranks at once (a save's writers): every rank passes whether it
 * failed and, if so, its message; all get back 1 when any failed, and in msg "rank R: TEXT" or
 * "ranks 0,2,5-9: TEXT" (every failing rank, runs of three or more as a range), TEXT being the
 * message of the lowest failing rank. Collective over comm; msg_len equal on all ranks. */
int gt_agree_on_failed_ranks(MPI_Comm comm, int failed, char *msg, size_t msg_len);

/* The ranks of comm that share this node, ordered as in comm; the caller frees *node
 * (MPI_Comm_free). Collective over comm. Returns MPI's error code (MPI_SUCCESS). */
int gt_node_comm(MPI_Comm comm, MPI_Comm *node);

/* This rank's index among the ranks of comm on its node, and their count (either may be NULL).
 * Collective over comm. Returns MPI's error code (MPI_SUCCESS). */
int gt_node_ranks(MPI_Comm comm, int *local_rank, int *local_size);

/* Every rank must run the same build: a 64-bit hash of this process's executable file
 * (/proc/self/exe) and of the MPI library's version string is compared with rank 0's. Returns 0,
 * or 2 on every rank with, in msg (equal on all ranks), one line naming the first rank and host
 * that differ. Collective over comm. */
int gt_agree_same_binary(MPI_Comm comm, char *msg, size_t msg_len);

#endif
