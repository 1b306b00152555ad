/*
 * gtrain_main.c — the `gtrain` command line.
 *
 *   gtrain CONFIG.ini [section.key=value ...]           train
 *   gtrain --plan [--world N] [--ranks-per-node N] CONFIG.ini [overrides]    print the memory plan and exit
 *          [--trace FILE]                               ... and write the predicted step as a Chrome trace
 *   gtrain --calibrate [--out FILE] [CONFIG.ini]        measure the time model's rates (docs/planner.md)
 *   gtrain --version                                    versions of gtrain and of the libraries
 *   gtrain --help
 *
 * Exit codes (docs/reliability.md): 0 done; 2 bad invocation, config or data; 3 unusable training-state file;
 * 75 stopped by SIGTERM/SIGUSR1/SIGINT after saving; 76 a hang ended by the watchdog; 1 anything else. MPI is initialised before anything
 * else for training, so `gtrain` runs the same as a plain process and under mpirun/srun; --plan,
 * --version and --help need no MPI, no data and no GPU.
 *
 * Threads: with OMP_NUM_THREADS unset, each rank runs (cores of its node) / (ranks on its node)
 * OpenMP threads, never more than the cores it may run on (its affinity mask, e.g. when mpirun binds
 * it to one core), so a plain `mpirun -np 4` on 2 cores does not run 4 x 2 threads. OpenBLAS is told
 * the same number. A node with more ranks x threads than cores gets one warning line.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <hdf5.h>
#include <mpi.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agree.h"
#include "calib.h"
#include "calibrate.h"
#include "comm.h"
#include "config.h"
#include "exitcodes.h"
#include "mfu.h"
#include "ops.h"
#include "planner.h"
#include "preflight.h"
#include "trace.h"
#include "signals.h"
#include "startup.h"
#include "testhooks.h"
#include "train.h"

/* OpenBLAS (linked through the CPU kernels; its cblas.h is theirs to include) */
void openblas_set_num_threads(int n);
int openblas_get_num_threads(void);
char *openblas_get_config(void);

#ifndef GTRAIN_VERSION
#define GTRAIN_VERSION "unknown"
#endif
#ifndef GTRAIN_GIT_COMMIT
#define GTRAIN_GIT_COMMIT "unknown"
#endif

static void usage(FILE *out) {
    fprintf(out,
            "usage: gtrain CONFIG.ini [section.key=value ...]\n"
            "       gtrain --plan [--world N] [--ranks-per-node N] [--trace FILE] CONFIG.ini [section.key=value ...]\n"
            "       gtrain --show-config CONFIG.ini [section.key=value ...]\n"
            "       gtrain --calibrate [--out FILE] [CONFIG.ini [section.key=value ...]]\n"
            "       gtrain --version\n"
            "       gtrain --help\n"
            "\n"
            "Trains a LLaMA-family model as CONFIG.ini says (keys: configs/README.md); overrides after\n"
            "the file take the same validation. Start several ranks with mpirun -np N or srun.\n"
            "--plan prints the per-rank memory model (parameters, gradients, optimizer state, the\n"
            "activations of every recompute policy, their extra FLOPs and fit to memory.budget) for a\n"
            "world of N ranks (default: the launcher's, else 1) and exits without training; then the\n"
            "predicted step time from the calibration file (--calibration FILE, or docs/planner.md's) of\n"
            "its ranks per node (--ranks-per-node N, default: the launcher's, else the world's ranks on\n"
            "this host up to its cores, or up to 8 for a GPU plan; a larger world spans nodes);\n"
            "--trace FILE writes that step as Chrome trace JSON (Perfetto, chrome://tracing open it).\n"
            "--calibrate measures the matmul, attention, memory, optimizer and (under mpirun) collective\n"
            "rates at the config's shapes and writes the calibration file --plan and training read;\n"
            "under mpirun -np N all ranks measure at once, for runs of N ranks per node.\n"
            "--show-config prints the configuration a run would use, every key with the defaults\n"
            "filled in, in the INI form gtrain reads, and exits.\n"
            "\n"
            "exit codes: 0 done, 2 bad invocation/config/data, 3 unusable training-state file,\n"
            "            75 stopped by SIGTERM/SIGUSR1/SIGINT after saving state, 76 a rank hung\n"
            "            (dist.timeout; the watchdog names it), 1 other failure\n");
}

/* OpenMP threads that finish a parallel region early spin before they sleep; libgomp's default is
 * about 300000 spins, and OpenBLAS (OpenMP build) calls into the same pool between our loops. On an
 * idle machine that costs little, but as soon as another process wants the cores (a second rank, a
 * data loader, another job) the spinning threads steal the time slices the working ones need, and
 * every barrier waits for a descheduled thread: the tiny config ran 4-7x slower here under a load of
 * 5 on 2 cores (docs/cpu-speed.md). A short spin (libgomp's own throttled value) loses almost nothing
 * when idle.
 *
 * libgomp reads its environment once, when it is loaded, before main; so when the user set neither
 * OMP_WAIT_POLICY nor GOMP_SPINCOUNT, gtrain sets GOMP_SPINCOUNT and re-executes itself once, before
 * MPI starts (same pid, same arguments, so MPI launchers see nothing); GTRAIN_SPIN_RESTARTED tells the
 * new image, whose rank 0 says so in one line of the log once the config is accepted (stdout, beside
 * the threads line: a bad config still gets its one line on stderr). launch/local.sh and
 * launch/gtrain.sbatch export the variable themselves, so their runs need no restart.
 * GTRAIN_OMP_SPIN=default keeps libgomp's default; under valgrind (its preload library in LD_PRELOAD)
 * nothing is done. */
#define GT_OMP_SPINCOUNT "1000"

/* OpenBLAS built with DYNAMIC_ARCH picks its kernels from the CPU's model number, and 0.3.21 (Debian
 * 12) does not know newer Xeons: on the machines this project runs on it falls back to "Prescott",
 * its SSE3 kernels, and sgemm runs at 26-66 GFLOP/s where its SkylakeX kernels reach 300+ (measured
 * in docs/cpu-speed.md). When the library chose such a generic core and the CPU has the instructions
 * of a better one, gtrain asks for that one by OPENBLAS_CORETYPE, which OpenBLAS also reads only when
 * it is loaded, so in the same single restart. A user's own OPENBLAS_CORETYPE always wins. */
char *openblas_get_corename(void); /* OpenBLAS's own extension, not in every cblas.h */

static const char *better_blas_core(void) {
#if defined(__x86_64__)
    static const char *const generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", NULL};
    if (getenv("OPENBLAS_CORETYPE")) return NULL;
    const char *core = openblas_get_corename();
    int forced = gt_test_hooks_get()->blas_generic, is_generic = forced;
    for (int i = 0; core && generic[i]; i++) is_generic |= strcmp(core, generic[i]) == 0;
    if (!is_generic) return NULL;
    __builtin_cpu_init();
    if (!forced && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

static int wants_short_omp_spin(void) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return 0;
    const char *opt = getenv("GTRAIN_OMP_SPIN");
    return !(opt && strcmp(opt, "default") == 0);
}

/* One restart for both variables: GTRAIN_SPIN_RESTARTED and GTRAIN_BLAS_CORE_WAS tell the new image
 * what was set, so that rank 0 can say so. */
static void restart_with_tuned_env(char **argv) {
    const char *pre = getenv("LD_PRELOAD");
    if (pre && strstr(pre, "vgpreload")) return;
    int spin = wants_short_omp_spin();
    const char *core = better_blas_core();
    if (!spin && !core) return;
    if (spin && (setenv("GOMP_SPINCOUNT", GT_OMP_SPINCOUNT, 1) != 0 || setenv("GTRAIN_SPIN_RESTARTED", "1", 1) != 0))
        return;
    if (core && (setenv("GTRAIN_BLAS_CORE_WAS", openblas_get_corename(), 1) != 0 ||
                 setenv("OPENBLAS_CORETYPE", core, 1) != 0))
        return;
    /* by the file's own name, not /proc/self/exe: the process name (comm, what ps, top and pgrep show)
     * is taken from it, and would read "exe" */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        gt_signals_before_exec();
        execv(self, argv);
    }
    gt_signals_before_exec();
    execv("/proc/self/exe", argv);
    /* exec failed (no /proc): carry on with the defaults, which are only slower (a stop received
     * meanwhile is pending: installing the handlers again delivers it) */
    gt_signals_install();
    unsetenv("GTRAIN_SPIN_RESTARTED");
    unsetenv("GTRAIN_BLAS_CORE_WAS");
}

static void say_restart(int rank) {
    if (rank != 0) return;
    const char *restarted = getenv("GTRAIN_SPIN_RESTARTED");
    if (restarted && strcmp(restarted, "1") == 0)
        printf("gtrain: GOMP_SPINCOUNT=%s (a short OpenMP spin): set by gtrain, which restarted itself once for it; "
               "set it or OMP_WAIT_POLICY yourself to skip that (launch/ does), GTRAIN_OMP_SPIN=default for libgomp's\n",
               GT_OMP_SPINCOUNT);
    const char *was = getenv("GTRAIN_BLAS_CORE_WAS");
    if (was && *was)
        printf("gtrain: OPENBLAS_CORETYPE=%s: OpenBLAS chose its generic %s kernels for this CPU, which has the "
               "instructions of %s; set OPENBLAS_CORETYPE yourself to choose\n",
               openblas_get_corename(), was, openblas_get_corename());
    fflush(stdout);
}

/* Prints the notes of an accepted config (one per line), each as "gtrain: ...". */
static void print_notes(const char *notes) {
    for (const char *p = notes; *p;) {
        size_t n = strcspn(p, "\n");
        fprintf(stderr, "gtrain: %.*s\n", (int)n, p);
        p += n;
        if (*p) p++;
    }
}

static int world_from_env(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 1;
}

static int host_cores(void) {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    int cores = sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores;
}

/* The ranks of a planned run on each node: --ranks-per-node N (given: > 0), else the launcher's count
 * of this node's ranks (Open MPI, MPICH/Hydra, Slurm's --ntasks-per-node), else the world's ranks on
 * this host as far as its cores go, or for a GPU plan as far as 8 GPUs (an HGX or DGX node's; a plan is
 * often made on a login node without GPUs). The calibration file is looked up by it, and a world larger
 * spans nodes (its collectives priced between nodes: gt_calib_select_links). */
static int plan_ranks_per_node(int world, int given, int gpu) {
    if (given > 0) return given < world ? given : world;
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v) < world ? atoi(v) : world;
    }
    int cores = gpu ? 8 : host_cores();
    return world < cores ? world : cores;
}

/* The threads a rank gets (set_threads): OMP_NUM_THREADS, else this host's cores over its ranks on it.
 * The calibration file is looked up by it. */
static int plan_threads(int local) {
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0) return atoi(env);
    int cores = host_cores();
    if (local < 1) local = 1;
    return cores / local > 0 ? cores / local : 1;
}

static int run_plan(int argc, char **argv) {
    int world = world_from_env(), per_node = 0;
    const char *calib_path = NULL, *trace_path = NULL;
    /* --world N may stand anywhere among the arguments; the rest is CONFIG then overrides */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    int n_rest = 0;
    for (int a = 0; a < argc; a++) {
        if (strcmp(argv[a], "--world") == 0) {
            if (a + 1 >= argc || atoi(argv[a + 1]) < 1) {
                fprintf(stderr, "gtrain: --world needs a positive number of ranks\n");
                free(rest);
                return GT_EXIT_BAD_INPUT;
            }
            world = atoi(argv[++a]);
        } else if (strcmp(argv[a], "--ranks-per-node") == 0) {
            if (a + 1 >= argc || atoi(argv[a + 1]) < 1) {
                fprintf(stderr, "gtrain: --ranks-per-node needs a positive number of ranks\n");
                free(rest);
                return GT_EXIT_BAD_INPUT;
            }
            per_node = atoi(argv[++a]);
        } else if (strcmp(argv[a], "--calibration") == 0) {
            if (a + 1 >= argc) {
                fprintf(stderr, "gtrain: --calibration needs a file\n");
                free(rest);
                return GT_EXIT_BAD_INPUT;
            }
            calib_path = argv[++a];
        } else if (strcmp(argv[a], "--trace") == 0) {
            if (a + 1 >= argc) {
                fprintf(stderr, "gtrain: --trace needs a file\n");
                free(rest);
                return GT_EXIT_BAD_INPUT;
            }
            trace_path = argv[++a];
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
        return GT_EXIT_BAD_INPUT;
    }
    gt_config cfg;
    char err[8192]; /* room for every model.init mismatch */
    int loaded = gt_config_load(&cfg, argv[i], argc - i - 1, argv + i + 1, err, sizeof err);
    free(rest);
    if (loaded != 0) {
        fprintf(stderr, "gtrain: %s\n", err);
        return GT_EXIT_BAD_INPUT;
    }
    print_notes(err);
    /* the plan is for the backend the config asks for; auto means the GPU when bf16 is asked */
    int gpu = cfg.train.device == GT_DEVICE_CUDA ||
              (cfg.train.device == GT_DEVICE_AUTO && cfg.train.precision == GT_PRECISION_BF16);
    /* on the CPU, auto is what the trainer would take on this machine (bf16 where it has bf16 instructions) */
    char why[512];
    int bf16 = gpu ? cfg.train.precision != GT_PRECISION_FP32
                   : cfg.train.precision == GT_PRECISION_BF16 ||
                         (cfg.train.precision == GT_PRECISION_AUTO && gt_cpu_bf16_native(why, sizeof why));
    /* whether attention probabilities are kept: the CPU table's own flag; the CUDA backend never keeps them */
    int keep_probs = gpu ? 0 : gt_ops_cpu()->can_keep_attention_probs;
    gt_mem_shape shape = gt_plan_shape(&cfg, gpu, bf16 ? 2 : 4, keep_probs, world);
    gt_calib calib; /* the rates auto ranks by and the prediction prices with */
    char note[8192];
    int local = plan_ranks_per_node(world, per_node, gpu);
    gt_calib_for_run(&calib, gpu, bf16, plan_threads(local), local, calib_path, note, sizeof note);
    gt_calib_note_in_step(&calib, &cfg, note, sizeof note);
    gt_calib_select_links(&calib, gpu, world, local, note, sizeof note);
    if (cfg.train.peak_tflops > 0) calib.peak_flops = cfg.train.peak_tflops * 1e12;
    gt_plan_choice choice; /* auto resolved as the trainer resolves it */
    if (gt_plan_resolve(&cfg, &shape, &calib, &choice, err, sizeof err) != 0) {
        fprintf(stderr, "gtrain: %s\n", err);
        return GT_EXIT_BAD_INPUT;
    }
    /* checkpoint.memory_every = auto: off when the slots do not fit on this machine, as the run decides
     * it before step 1 (the world's ranks on this node) */
    uint64_t memsnap = gt_plan_memsnap_bytes(&cfg, &choice.shape, 0);
    if (memsnap && cfg.checkpoint.memory_every == GT_INT_AUTO)
        (void)gt_preflight_memsnap_fits(world, memsnap,
                                        gt_plan_snapshot_bytes(&cfg, &choice.shape) + (gpu ? 0 : choice.predicted.total_bytes),
                                        choice.memsnap_off, sizeof choice.memsnap_off);
    printf("(%s backend assumed: %s activations%s)\n", gpu ? "cuda" : "cpu", bf16 ? "bf16" : "fp32",
           !gpu && cfg.train.precision == GT_PRECISION_AUTO ? ", which precision = auto takes on this CPU" : "");
    gt_plan_report(stdout, &cfg, &choice);
    gt_plan_report_time(stdout, &choice, &calib, note);
    if (trace_path) { /* the same simulation, span by span (trace.h) */
        if (gt_trace_plan(trace_path, &choice, &calib, err, sizeof err) != 0) {
            fprintf(stderr, "gtrain: %s\n", err);
            return GT_EXIT_BAD_INPUT;
        }
        printf("predicted step written to %s (Chrome trace JSON: Perfetto and chrome://tracing open it)\n",
               trace_path);
    }
    return 0;
}

static void set_threads(int rank);

/* gtrain --calibrate [--out FILE] [CONFIG [overrides]]: measures the time model's rates on this
 * machine's backend (the config's, as --plan chooses it) at the config's model shapes (the default
 * model without one), and writes them to FILE or gt_calib_path's file. Runs under mpirun or srun too:
 * every rank measures, all at once (each figure the slowest rank's), rank 0 writes the file of its
 * node's count of ranks, and the collectives between the ranks are measured. */
static int run_calibrate(int argc, char **argv) {
    const char *out_path = NULL;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    int n_rest = 0;
    for (int a = 0; a < argc; a++) {
        if (strcmp(argv[a], "--out") == 0) {
            if (a + 1 >= argc) {
                fprintf(stderr, "gtrain: --out needs a file\n");
                free(rest);
                return GT_EXIT_BAD_INPUT;
            }
            out_path = argv[++a];
        } else {
            rest[n_rest++] = argv[a];
        }
    }
    gt_config cfg;
    char err[8192] = "";
    int code = 0;
    if (n_rest > 0) code = gt_config_load(&cfg, rest[0], n_rest - 1, rest + 1, err, sizeof err);
    else gt_config_defaults(&cfg);
    free(rest);
    if (code != 0) {
        fprintf(stderr, "gtrain: %s\n", err);
        return GT_EXIT_BAD_INPUT;
    }
    int provided = MPI_THREAD_SINGLE; /* MULTIPLE for the progress thread, as the trainer (comm.h) */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (gt_test_hooks_check(rank) != 0) { /* a stray GTRAIN_TEST_* variable: refused */
        MPI_Finalize();
        return GT_EXIT_BAD_INPUT;
    }
    set_threads(rank);
    int gpu = cfg.train.device == GT_DEVICE_CUDA ||
              (cfg.train.device == GT_DEVICE_AUTO && cfg.train.precision == GT_PRECISION_BF16);
    char why[512] = "";
    int bf16 = gpu ? cfg.train.precision != GT_PRECISION_FP32
                   : cfg.train.precision == GT_PRECISION_BF16 ||
                         (cfg.train.precision == GT_PRECISION_AUTO && gt_cpu_bf16_native(why, sizeof why));
    const gt_ops *ops = NULL;
    gt_comm *comm = NULL;
    if (gpu) {
        if (gt_cuda_select_device(MPI_COMM_WORLD, why, sizeof why) == 0)
            ops = gt_ops_cuda(bf16, cfg.train.cuda_attention, why, sizeof why);
        if (ops && size > 1) comm = gt_comm_create_nccl(MPI_COMM_WORLD, why, sizeof why);
    } else {
        ops = bf16 ? gt_ops_cpu_bf16() : gt_ops_cpu();
        if (size > 1) comm = gt_comm_create_mpi(MPI_COMM_WORLD);
    }
    if (!ops) {
        if (rank == 0) fprintf(stderr, "gtrain: --calibrate: no %s backend: %s\n", gpu ? "cuda" : "cpu bf16", why);
        MPI_Finalize();
        return GT_EXIT_BAD_INPUT;
    }
    gt_calib c;
    gt_calib_key(&c, gpu, bf16);
    gt_calib_defaults(&c, gpu, bf16);
    /* the ranks sharing rank 0's host while they measure: the key's ranks per node */
    int local = 1;
    gt_node_ranks(MPI_COMM_WORLD, NULL, &local);
    MPI_Bcast(&local, 1, MPI_INT, 0, MPI_COMM_WORLD);
    c.ranks_per_node = local;
    char path[4096];
    if (out_path) snprintf(path, sizeof path, "%s", out_path);
    else if (gt_calib_path(&c, path, sizeof path) != 0) {
        if (rank == 0) fprintf(stderr, "gtrain: --calibrate: neither GTRAIN_CALIBRATION, XDG_CACHE_HOME nor HOME is set; use --out FILE\n");
        MPI_Finalize();
        return GT_EXIT_BAD_INPUT;
    }
    if (rank == 0)
        printf("gtrain: calibrating the %s backend (%s, %d threads, %d rank%s per node) on %s for %s\n", c.backend,
               c.precision, c.threads, c.ranks_per_node, c.ranks_per_node == 1 ? "" : "s", c.host,
               n_rest > 0 ? cfg.path : "the default model");
    gt_calibrate(&cfg, ops, gpu, comm, size > 1 ? MPI_COMM_WORLD : MPI_COMM_NULL, &c, rank == 0 ? stdout : NULL);
    if (gpu && c.peak_flops <= 0) c.peak_flops = gt_gpu_peak_flops(gt_cuda_device_name(), bf16, NULL, 0);
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(c.source, sizeof c.source, "measured by gtrain --calibrate %s on %d rank%s, %d per node", when, size,
             size == 1 ? "" : "s", c.ranks_per_node);
    code = 0;
    if (rank == 0) {
        /* another config's GEMM shapes and kernel sizes measured earlier into this key's file stay
         * (calib.h) */
        gt_calib previous;
        char prev_err[512];
        int kept_gemm = c.n_gemm, kept_kernel = c.n_kernel;
        if (gt_calib_load(path, &c, &previous, prev_err, sizeof prev_err) == 0) gt_calib_merge_previous(&c, &previous);
        if (c.n_gemm > kept_gemm)
            printf("gtrain: kept %d matrix shapes of the earlier calibration in that file (other models' GEMMs)\n",
                   c.n_gemm - kept_gemm);
        if (c.n_kernel > kept_kernel)
            printf("gtrain: kept %d kernel sizes of the earlier calibration in that file (other models')\n",
                   c.n_kernel - kept_kernel);
        if (gt_calib_save(path, &c, err, sizeof err) != 0) {
            fprintf(stderr, "gtrain: %s\n", err);
            code = 1;
        } else {
            printf("gtrain: wrote %s\n", path);
        }
    }
    gt_comm_destroy(comm);
    MPI_Finalize();
    return code;
}

/* gtrain --show-config CONFIG [overrides]: the effective configuration, every key, as a state file
 * stores it under /config; the notes of loading go to stderr, so stdout can be loaded again. */
static int show_config(int argc, char **argv) {
    if (argc < 1) {
        usage(stderr);
        return 2;
    }
    gt_config cfg;
    char err[8192];
    if (gt_config_load(&cfg, argv[0], argc - 1, argv + 1, err, sizeof err) != 0) {
        fprintf(stderr, "gtrain: %s\n", err);
        return 2;
    }
    print_notes(err);
    char *ini = gt_config_to_ini(&cfg);
    if (!ini) return 1;
    fputs(ini, stdout);
    free(ini);
    return 0;
}

/* gtrain --version: what to paste into a bug report. MPI_Get_library_version may be called before
 * MPI_Init; nothing here starts MPI or touches a GPU. */
static int print_version(void) {
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(mpi, &len);
    mpi[strcspn(mpi, "\n")] = '\0'; /* Open MPI adds its repository and date on more lines */
    unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
    H5get_libversion(&h5_major, &h5_minor, &h5_release);
    char cuda[256];
    gt_cuda_versions(cuda, sizeof cuda);
    printf("gtrain %s (git %s)\n", GTRAIN_VERSION, GTRAIN_GIT_COMMIT);
#ifdef GTRAIN_HAVE_CUDA
    printf("backends: cpu, cuda\n");
#else
    printf("backends: cpu (built without CUDA)\n");
#endif
    printf("BLAS: %s\n", openblas_get_config());
    char why[512];
    printf("CPU bf16: %s (precision = auto takes %s on this CPU)\n", gt_cpu_bf16_isa(),
           gt_cpu_bf16_native(why, sizeof why) ? "bf16" : "fp32");
    printf("MPI: %s\n", mpi);
    printf("HDF5: %u.%u.%u\n", h5_major, h5_minor, h5_release);
    printf("%s\n", cuda);
    return 0;
}

/* Sets the OpenMP and OpenBLAS threads of this rank (see the top of the file). Collective. */
static void set_threads(int rank) {
    MPI_Comm node;
    gt_node_comm(MPI_COMM_WORLD, &node);
    int local_ranks = 1;
    MPI_Comm_size(node, &local_ranks);
    /* the cores of the node: every core some rank on it may run on */
    cpu_set_t mine, node_cores;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        for (long c = 0; c < n && c < CPU_SETSIZE; c++) CPU_SET((int)c, &mine);
    }
    MPI_Allreduce(&mine, &node_cores, (int)sizeof mine, MPI_BYTE, MPI_BOR, node);
    MPI_Comm_free(&node);
    int allowed = CPU_COUNT(&mine), cores = CPU_COUNT(&node_cores);
    if (allowed < 1) allowed = 1;
    if (cores < 1) cores = 1;

    const char *env = getenv("OMP_NUM_THREADS");
    int from_env = env && *env;
    int threads = omp_get_max_threads();
    if (!from_env) {
        threads = cores / local_ranks;
        if (threads > allowed) threads = allowed;
        if (threads < 1) threads = 1;
        omp_set_num_threads(threads);
    }
    openblas_set_num_threads(threads);

    /* the most oversubscribed node's numbers, for one warning */
    int over[3] = {0, 0, 0};
    if (local_ranks * threads > cores) over[0] = local_ranks, over[1] = threads, over[2] = cores;
    MPI_Allreduce(MPI_IN_PLACE, over, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank != 0) return;
    printf("gtrain: threads: %d per rank (OpenMP %d, OpenBLAS %d), %d rank%s on the %d core%s of this node; %s%s\n",
           threads, omp_get_max_threads(), openblas_get_num_threads(), local_ranks, local_ranks == 1 ? "" : "s",
           cores, cores == 1 ? "" : "s", from_env ? "OMP_NUM_THREADS=" : "OMP_NUM_THREADS unset: cores / ranks",
           from_env ? env : "");
    if (over[0])
        fprintf(stderr,
                "gtrain: warning: %d rank%s x %d thread%s on a node with %d core%s: oversubscribed, which can slow "
                "training many times (%s)\n",
                over[0], over[0] == 1 ? "" : "s", over[1], over[1] == 1 ? "" : "s", over[2], over[2] == 1 ? "" : "s",
                from_env ? "unset OMP_NUM_THREADS for cores / ranks each" : "start fewer ranks per node");
    fflush(stdout);
}

/* GTRAIN_TEST_START_DELAY_MS (tests only): a pause as start-up begins, before the restart above and
 * before MPI starts, so that a test can send a stop signal to the ranks while they start. */
static void test_start_delay(void) {
    long ms = gt_test_hooks_get()->start_delay_ms;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return GT_EXIT_BAD_INPUT;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    /* --version and --plan say what a run would use: the BLAS kernels training takes (a generic core
     * swapped for a better one, above) name the calibration file's key that --plan must match */
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "--plan") == 0) restart_with_tuned_env(argv);
    if (strcmp(argv[1], "--version") == 0) return print_version();
    if (strcmp(argv[1], "--plan") == 0) return run_plan(argc - 2, argv + 2);
    if (strcmp(argv[1], "--calibrate") == 0) {
        restart_with_tuned_env(argv); /* the OpenMP spin training runs with (above), for the same rates */
        return run_calibrate(argc - 2, argv + 2);
    }
    if (strcmp(argv[1], "--show-config") == 0) return show_config(argc - 2, argv + 2);
    if (argv[1][0] == '-') {
        fprintf(stderr, "gtrain: unknown option '%s'\n", argv[1]);
        usage(stderr);
        return GT_EXIT_BAD_INPUT;
    }

    /* from here on a stop signal only sets the flag: one during start-up (a launcher forwards it to
     * ranks still in MPI_Init; loading a big state file can take minutes) is acted on after the first
     * step, instead of killing the rank unsaved (src/core/signals.c: also across the restart below) */
    gt_signals_install();
    test_start_delay();
    restart_with_tuned_env(argv);
    gt_startup_mark("main (after any restart for the OpenMP spin)");
    int provided = MPI_THREAD_SINGLE; /* MULTIPLE for the progress thread (comm.h); checked there */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    gt_startup_rank(rank);
    gt_startup_mark(GT_STARTUP_MPI);
    gt_config cfg;
    char err[8192]; /* room for every model.init mismatch */
    /* first: a node with another build may read the config differently or hang in a collective */
    int code = gt_agree_same_binary(MPI_COMM_WORLD, err, sizeof err);
    if (code == 0) code = gt_config_load(&cfg, argv[1], argc - 2, argv + 2, err, sizeof err);
    if (code == 0 && rank == 0) code = gt_config_check_metrics(&cfg, err, sizeof err);
    if (code == 0) code = gt_config_check_files(&cfg, err, sizeof err);
    /* the config and data files may be missing on some nodes only: no rank may go on alone */
    code = gt_agree_on_failure(MPI_COMM_WORLD, code, err, sizeof err);
    gt_startup_mark("same binary, config and data files checked");
    if (code != 0) {
        if (rank == 0) fprintf(stderr, "gtrain: %s\n", err);
    } else {
        if (rank == 0) print_notes(err);
        set_threads(rank);
        say_restart(rank);
        code = gt_train(&cfg, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return code;
}
