/* agree.c — see agree.h. */
#include "agree.h"

#include "watchdog.h"

int gt_agree_on_failure(MPI_Comm comm, int code, char *msg, size_t msg_len) {
    int worst = 0, world, rank;
    MPI_Comm_size(comm, &world);
    MPI_Comm_rank(comm, &rank);
    gt_watchdog_enter("agree", sizeof code);
    MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, comm);
    if (worst) {
        int mine = code == worst ? rank : world, who = 0;
        MPI_Allreduce(&mine, &who, 1, MPI_INT, MPI_MIN, comm);
        MPI_Bcast(msg, (int)msg_len, MPI_CHAR, who, comm);
    }
    gt_watchdog_leave();
    return worst;
}

int gt_node_comm(MPI_Comm comm, MPI_Comm *node) {
    int rank = 0, rc = MPI_Comm_rank(comm, &rank);
    if (rc != MPI_SUCCESS) return rc;
    return MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, node);
}

int gt_node_ranks(MPI_Comm comm, int *local_rank, int *local_size) {
    MPI_Comm node;
    int rc = gt_node_comm(comm, &node);
    if (rc != MPI_SUCCESS) return rc;
    if (local_rank && (rc = MPI_Comm_rank(node, local_rank)) != MPI_SUCCESS) return rc;
    if (local_size && (rc = MPI_Comm_size(node, local_size)) != MPI_SUCCESS) return rc;
    return MPI_Comm_free(&node);
}
