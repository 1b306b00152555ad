/*
 * comm_error_ends_the_job — an MPI call that returns an error inside the communicator ends the job
 * with gtrain's own line ("[rank R] file:line: CALL failed: MPI error string") and a non-zero exit,
 * instead of going on with a buffer MPI did not fill. gt_comm runs MPI with MPI_ERRORS_RETURN, so
 * that line comes only from checking each return code; a dead peer cannot show it (Open MPI's
 * launcher ends the job first, or the survivors wait), a mismatched broadcast can: rank 0 sends 64
 * bytes, rank 1 posts room for 4, and MPI returns MPI_ERR_TRUNCATE to rank 1.
 * Run with 2 ranks; tests/dist.cmake checks the exit code and the output.
 */
#include <stdio.h>

#include <mpi.h>

#include "comm.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    gt_comm *comm = gt_comm_create_mpi(MPI_COMM_WORLD);
    int rank = gt_comm_rank(comm);
    char buf[64] = {0};
    gt_comm_broadcast(comm, buf, rank == 0 ? sizeof buf : 4, 0);
    printf("[rank %d] the mismatched broadcast returned\n", rank);
    fflush(stdout);
    gt_comm_destroy(comm);
    MPI_Finalize();
    return 0;
}
