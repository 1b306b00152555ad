/*
 * runstate_dir.c — the directory, usable before the first step (runstate_loop.c, "the directory"):
 * checkpoint.dir made and probed by the first rank of every node, one directory that every node
 * sees, and a warning when there is less free space than one state file.
 */

#include "runstate_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "agree.h"
#include "bytes.h"
#include "errmsg.h"
#include "testhooks.h"
#include "exitcodes.h"

/* ------------------------------------------------------------------------------------------------
 * The directory: usable before the first step
 * ---------------------------------------------------------------------------------------------- */

/* Creates dir, then creates, writes, fsyncs and deletes a probe file in it. One rank per node,
 * since the directory may be node-local. 0, or -1 with errno set and what failed in `what`. */
static int probe_dir(const char *dir, int rank, char *what, size_t what_len) {
    if (gt_make_dirs(dir) != 0) {
        snprintf(what, what_len, "cannot create");
        return -1;
    }
    char host[256] = "";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    char path[GT_PATH_MAX + 384];
    snprintf(path, sizeof path, "%s/.gtrain-probe.%s.%d.%ld", dir, host, rank, (long)getpid());
    errno = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        snprintf(what, what_len, "cannot create a file in");
        return -1;
    }
    char block[4096];
    memset(block, 0, sizeof block);
    errno = 0;
    int ok = write(fd, block, sizeof block) == (ssize_t)sizeof block && fsync(fd) == 0;
    int saved = ok ? 0 : (errno ? errno : ENOSPC); /* a short write without an error: no room */
    if (close(fd) != 0 && ok) ok = 0, saved = errno;
    unlink(path);
    if (!ok) {
        snprintf(what, what_len, "cannot write a file in");
        errno = saved;
        return -1;
    }
    return 0;
}

/* One node's probe of "is checkpoint.dir the same directory everywhere": the file it wrote, named
 * by a random token, and the host that wrote it. */
typedef struct node_probe {
    int leader; /* this rank wrote a probe (the first rank of its node) */
    char token[24];
    char host[64];
} node_probe;

static void node_probe_path(char *out, size_t len, const char *dir, const node_probe *p) {
    snprintf(out, len, "%s/.gtrain-node-probe.%s", dir, p->token);
}

/* checkpoint.dir must be one directory that every node sees (a shared file system): a node-local
 * path gives each node its own files, and a resume then reads whatever its node saw. The first rank
 * of each node writes a file named by a random token into it; after all have written, each checks
 * that it sees every node's file. Exit 2 naming the nodes that do not, by host name. With
 * GTRAIN_TEST_RANK_IS_NODE=1 every rank probes as if it were a node of its own, so that a test on
 * one machine can give each rank a private directory (a mount namespace) and see the refusal.
 * Collective. */
static int check_same_dir(gt_run_state *run, int node_rank, const char *host) {
    const char *dir = run->cfg->checkpoint.dir;
    int rank = rank_of(run), world = gt_comm_size(run->comm);
    node_probe mine;
    memset(&mine, 0, sizeof mine);
    mine.leader = node_rank == 0 || gt_test_hooks_get()->rank_is_node;
    snprintf(mine.host, sizeof mine.host, "%s", host);
    char path[GT_PATH_MAX + 64];
    if (mine.leader) {
        gt_rs_probe_token(mine.token, sizeof mine.token, rank);
        node_probe_path(path, sizeof path, dir, &mine);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) close(fd); /* a failure shows as a probe that no node sees, its own included */
    }
    node_probe *all = calloc((size_t)world, sizeof *all);
    if (!all) abort();
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, run->mpi_comm);
    int verdict[2] = {0, -1}; /* probes seen, the first one missing (a rank) */
    int leaders = 0;
    for (int r = 0; r < world; r++) {
        if (!all[r].leader) continue;
        leaders++;
        if (!mine.leader) continue;
        node_probe_path(path, sizeof path, dir, &all[r]);
        if (access(path, F_OK) == 0) verdict[0]++;
        else if (verdict[1] < 0) verdict[1] = r;
    }
    int *verdicts = calloc((size_t)world * 2, sizeof *verdicts);
    if (!verdicts) abort();
    MPI_Allgather(verdict, 2, MPI_INT, verdicts, 2, MPI_INT, run->mpi_comm);
    if (mine.leader) { /* every node has looked: the probes can go */
        node_probe_path(path, sizeof path, dir, &mine);
        unlink(path);
    }
    char nodes[2048] = "";
    int disagree = 0;
    for (int r = 0; r < world; r++) {
        if (!all[r].leader || verdicts[2 * r] == leaders) continue;
        disagree++;
        gt_appendf(nodes, sizeof nodes, "%s%s (rank %d) sees %d of the %d nodes' probe files, not %s's",
               disagree > 1 ? "; " : "", all[r].host, r, verdicts[2 * r], leaders, all[verdicts[2 * r + 1]].host);
    }
    free(all);
    free(verdicts);
    if (!disagree) return 0;
    if (rank == 0) {
        char where[GT_PATH_MAX + 128];
        gt_config_where(run->cfg, "checkpoint", "dir", where, sizeof where);
        fprintf(stderr, "gtrain: %s: '%s' is not the same directory on every node: %s (expected a directory on a "
                "file system every node shares; each node's first rank wrote a probe file into it)\n", where, dir,
                nodes);
        fflush(stderr);
    }
    return GT_EXIT_BAD_INPUT;
}

/* exit 2 (agreed) when checkpoint.dir is not usable on some node (the first rank of each node
 * probes it) or is not the same directory on every node; a warning when some rank sees less free
 * space than one state file. Collective. */
int gt_rs_check_dir(gt_run_state *run) {
    const gt_config *cfg = run->cfg;
    int rank = rank_of(run), node_rank = 0;
    gt_node_ranks(run->mpi_comm, &node_rank, NULL);
    char msg[2 * GT_PATH_MAX + 1024] = "", what[64], host[256] = "";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    int code = 0;
    if (node_rank == 0 && probe_dir(cfg->checkpoint.dir, rank, what, sizeof what) != 0) {
        char where[GT_PATH_MAX + 128];
        int os_error = errno;
        gt_config_where(cfg, "checkpoint", "dir", where, sizeof where);
        snprintf(msg, sizeof msg, "%s: %s '%s' (rank %d on %s): %s (expected a writable directory)", where, what,
                 cfg->checkpoint.dir, rank, host, strerror(os_error));
        code = GT_EXIT_BAD_INPUT;
    }
    code = gt_agree_on_failure(run->mpi_comm, code, msg, sizeof msg);
    if (code) {
        if (rank == 0) fprintf(stderr, "gtrain: %s\n", msg);
        return code;
    }
    if ((code = check_same_dir(run, node_rank, host))) return code;

    struct statvfs st;
    int low = 0;
    msg[0] = '\0';
    if (statvfs(cfg->checkpoint.dir, &st) == 0 && (uint64_t)st.f_bavail * st.f_frsize < run->file_bytes) {
        char free_s[32], need_s[32];
        gt_format_bytes((uint64_t)st.f_bavail * st.f_frsize, free_s, sizeof free_s);
        gt_format_bytes(run->file_bytes, need_s, sizeof need_s);
        snprintf(msg, sizeof msg,
                 "warning: checkpoint.dir '%s' has %s free (rank %d on %s), less than one state file (about %s): "
                 "saves will fail until there is room; the run goes on and each save tries again",
                 cfg->checkpoint.dir, free_s, rank, host, need_s);
        low = 1;
    }
    if (gt_agree_on_failure(run->mpi_comm, low, msg, sizeof msg) && rank == 0) {
        fprintf(stderr, "gtrain: %s\n", msg);
        fflush(stderr);
    }
    return 0;
}
