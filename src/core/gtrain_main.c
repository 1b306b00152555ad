/*
 * gtrain_main.c — the `gtrain` command line.
 *
 *   gtrain CONFIG.ini [section.key=value ...]           train
 *   gtrain --plan [--world N] CONFIG.ini [overrides]    print the memory plan and exit
 *   gtrain --help
 *
 * Exit codes (DESIGN.md): 0 done; 2 bad invocation, config or data; 3 unusable training-state file;
 * 75 stopped by SIGTERM/SIGUSR1 after saving; 1 anything else. MPI is initialised before anything
 * else for training, so `gtrain` runs the same as a plain process and under mpirun/srun; --plan and
 * --help need no MPI, no data and no GPU.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ops.h"
#include "planner.h"
#include "zero.h"
#include "signals.h"
#include "train.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: gtrain CONFIG.ini [section.key=value ...]\n"
            "       gtrain --plan [--world N] CONFIG.ini [section.key=value ...]\n"
            "       gtrain --help\n"
            "\n"
            "Trains a LLaMA-family model as CONFIG.ini says (keys: configs/README.md); overrides after\n"
            "the file take the same validation. Start several ranks with mpirun -np N or srun.\n"
            "--plan prints the per-rank memory model (parameters, gradients, optimizer state, the\n"
            "activations of every recompute policy, their extra FLOPs and fit to memory.budget) for a\n"
            "world of N ranks (default: the launcher's, else 1) and exits without training.\n"
            "\n"
            "exit codes: 0 done, 2 bad invocation/config/data, 3 unusable training-state file,\n"
            "            75 stopped by SIGTERM/SIGUSR1 after saving state, 1 other failure\n");
}

static int world_from_env(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 1;
}

static int run_plan(int argc, char **argv) {
    int world = world_from_env();
    /* --world N may stand anywhere among the arguments; the rest is CONFIG then overrides */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    int n_rest = 0;
    for (int a = 0; a < argc; a++) {
        if (strcmp(argv[a], "--world") == 0) {
            if (a + 1 >= argc || atoi(argv[a + 1]) < 1) {
                fprintf(stderr, "gtrain: --world needs a positive number of ranks\n");
                free(rest);
                return 2;
            }
            world = atoi(argv[++a]);
        } else {
            rest[n_rest++] = argv[a];
        }
    }
    argv = rest;
    argc = n_rest;
    int i = 0;
    if (i >= argc) {
        usage(stderr);
        free(rest);
        return 2;
    }
    gt_config cfg;
    char err[2048];
    int loaded = gt_config_load(&cfg, argv[i], argc - i - 1, argv + i + 1, err, sizeof err);
    free(rest);
    if (loaded != 0) {
        fprintf(stderr, "gtrain: %s\n", err);
        return 2;
    }
    /* the plan is for the backend the config asks for; auto means the GPU when bf16 is asked */
    int gpu = strcmp(cfg.train.device, "cuda") == 0 ||
              (strcmp(cfg.train.device, "auto") == 0 && strcmp(cfg.train.precision, "bf16") == 0);
    int bf16 = gpu && strcmp(cfg.train.precision, "fp32") != 0;
    int stage = gt_zero_stage(cfg.dist.shard); /* auto: 0 here; the report's auto line chooses */
    gt_mem_shape shape = {cfg.model, cfg.train.micro_batch, cfg.train.seq_len, bf16 ? 2 : 4, gpu ? 0 : 1, world,
                          stage >= 1, stage, strcmp(cfg.dist.grad_sync, "micro") == 0, cfg.train.grad_accum,
                          cfg.dist.prefetch};
    printf("(%s backend assumed: %s activations%s)\n", gpu ? "cuda" : "cpu", bf16 ? "bf16" : "fp32",
           gpu ? ", attention probabilities never stored" : "");
    gt_plan_report(stdout, &cfg, &shape);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--plan") == 0) return run_plan(argc - 2, argv + 2);
    if (argv[1][0] == '-') {
        fprintf(stderr, "gtrain: unknown option '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }

    MPI_Init(&argc, &argv);
    /* from here on a stop signal only sets the flag: one during start-up (loading a big state file
     * can take minutes) is acted on after the first step, instead of killing the rank unsaved */
    gt_signals_install();
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    gt_config cfg;
    char err[2048];
    int code = gt_config_load(&cfg, argv[1], argc - 2, argv + 2, err, sizeof err);
    if (code == 0) code = gt_config_check_files(&cfg, err, sizeof err);
    /* the config and data files may be missing on some nodes only: no rank may go on alone */
    code = gt_agree_on_failure(MPI_COMM_WORLD, code, err, sizeof err);
    if (code != 0) {
        if (rank == 0) fprintf(stderr, "gtrain: %s\n", err);
    } else {
        code = gt_train(&cfg, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return code;
}
