/* agree.c — see agree.h. */
#define _GNU_SOURCE /* gethostname, readlink */
#include "agree.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* "0,2,5-9": the ranks whose flag is set, runs of three or more as a range; "..." when out is full. */
static int rank_list(const int *flags, int world, char *out, size_t len) {
    int n = 0;
    size_t at = 0;
    out[0] = '\0';
    for (int r = 0; r < world; r++) {
        if (!flags[r]) continue;
        int last = r;
        while (last + 1 < world && flags[last + 1]) last++;
        n += last - r + 1;
        char one[32];
        if (last - r >= 2) snprintf(one, sizeof one, "%s%d-%d", at ? "," : "", r, last);
        else if (last > r) snprintf(one, sizeof one, "%s%d,%d", at ? "," : "", r, last);
        else snprintf(one, sizeof one, "%s%d", at ? "," : "", r);
        if (at + strlen(one) + 4 >= len) {
            snprintf(out + at, len - at, ",...");
            for (int k = last + 1; k < world; k++) n += flags[k] != 0;
            break;
        }
        at += (size_t)snprintf(out + at, len - at, "%s", one);
        r = last;
    }
    return n;
}

int gt_agree_on_failed_ranks(MPI_Comm comm, int failed, char *msg, size_t msg_len) {
    int world, rank;
    MPI_Comm_size(comm, &world);
    MPI_Comm_rank(comm, &rank);
    int mine = failed != 0, *flags = malloc((size_t)world * sizeof *flags);
    if (!flags) abort();
    gt_watchdog_enter("agree", sizeof mine);
    MPI_Allgather(&mine, 1, MPI_INT, flags, 1, MPI_INT, comm);
    int first = 0;
    while (first < world && !flags[first]) first++;
    if (first < world) MPI_Bcast(msg, (int)msg_len, MPI_CHAR, first, comm);
    gt_watchdog_leave();
    if (first < world) {
        char list[256], *text = malloc(msg_len);
        if (!text) abort();
        snprintf(text, msg_len, "%s", msg);
        int n = rank_list(flags, world, list, sizeof list);
        snprintf(msg, msg_len, "%s %s: %s", n == 1 ? "rank" : "ranks", list, text);
        free(text);
    }
    free(flags);
    return first < world;
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

/* FNV-1a over the executable file and the MPI library's version string: a different build, a
 * stale copy on one node or another Open MPI gives another value. Read once at start-up (a few MB). */
static uint64_t build_hash(char *exe, size_t exe_len) {
    uint64_t h = 1469598103934665603ull;
    ssize_t n = readlink("/proc/self/exe", exe, exe_len - 1);
    exe[n > 0 ? n : 0] = '\0';
    FILE *f = fopen("/proc/self/exe", "rb");
    if (f) {
        unsigned char buf[65536];
        size_t got;
        while ((got = fread(buf, 1, sizeof buf, f)) > 0)
            for (size_t i = 0; i < got; i++) h = (h ^ buf[i]) * 1099511628211ull;
        fclose(f);
    }
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    for (int i = 0; i < len; i++) h = (h ^ (unsigned char)lib[i]) * 1099511628211ull;
    return h;
}

int gt_agree_same_binary(MPI_Comm comm, char *msg, size_t msg_len) {
    typedef struct {
        unsigned long long hash;
        char host[64];
        char exe[192];
    } build;
    build mine = {0};
    gethostname(mine.host, sizeof mine.host - 1);
    mine.hash = build_hash(mine.exe, sizeof mine.exe);
    int rank, world;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    build *all = rank == 0 ? calloc((size_t)world, sizeof *all) : NULL;
    if (rank == 0 && !all) MPI_Abort(comm, 1);
    gt_watchdog_enter("agree_build", sizeof mine);
    MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, comm);
    int differ = 0;
    if (rank == 0) {
        for (int r = 1; r < world; r++) {
            if (all[r].hash == mine.hash) continue;
            if (!differ++)
                snprintf(msg, msg_len, "rank %d on %s runs another gtrain build than rank 0 on %s (%s, build hash "
                         "%016llx vs %016llx, the executable and its MPI library): every node must run the same "
                         "binary (docs/launch.md, how the binary reaches the nodes)", r, all[r].host, mine.host,
                         all[r].exe, all[r].hash, mine.hash);
        }
        if (differ > 1) {
            size_t n = strlen(msg);
            snprintf(msg + n, msg_len - n, "; %d ranks in all differ", differ);
        }
        free(all);
    }
    MPI_Bcast(&differ, 1, MPI_INT, 0, comm);
    if (differ) MPI_Bcast(msg, (int)msg_len, MPI_CHAR, 0, comm);
    gt_watchdog_leave();
    return differ ? 2 : 0;
}
