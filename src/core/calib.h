/*
 * calib.h — the rates the time model prices a step with (docs/planner.md, "Calibration").
 *
 * `gtrain --calibrate CONFIG` measures them on the backend at hand: the matrix products at the
 * model's own GEMM shapes (forward and backward apart), the attention kernels and each memory-bound
 * kernel at several sizes (the kernels' list), the optimizer's bytes per second, and, under mpirun
 * or srun, each collective's latency and bandwidth. It stores them as JSON in a file named after what they depend on (host,
 * CPU or GPU model, backend, precision, threads): gt_calib_path. `gtrain --plan` and the trainer read
 * that file when its key matches the run's; without one they price with stated defaults
 * (gt_calib_defaults), and every figure printed from them says so.
 */
#ifndef GT_CALIB_H
#define GT_CALIB_H

#include <stddef.h>

#define GT_CALIB_MAX_GEMMS 256
#define GT_CALIB_MAX_KERNELS 160
#define GT_CALIB_MAX_IN_STEP 32
/* The in-step factor of one model shape at one micro-batch size (calibrate.c): a micro-batch of that
 * model run whole over the sum of its kernels' calibrated seconds. micro_batch: its sequences; 0 in a
 * file of an older gtrain, which measured one size and did not record it (taken for every size). */
typedef struct gt_calib_in_step {
    int dim, ffn_dim, n_heads, vocab_size, seq_len;
    double factor;
    int micro_batch;
} gt_calib_in_step;

/* One kernel measured at one size: the op (ops.h's name), what the dry backend counts for that call
 * (ops_dry.c): its bytes for a memory-bound kernel, its FLOPs for attention; and the median seconds
 * of the call. A kernel's seconds are not its bytes over one bandwidth: a norm, rope, SwiGLU or the
 * loss does other work per byte than a residual add, and a small call is mostly its fixed cost (a
 * parallel region's start and end, a launch); attention's rate depends on its batch. */
typedef struct gt_calib_kernel {
    char op[32];
    double amount;
    double seconds;
} gt_calib_kernel;

typedef struct gt_calib_gemm {
    int n, ic, oc;           /* out (n, oc) = inp (n, ic) @ W^T, as matmul_forward */
    double fwd_flops_per_s;  /* 2 n ic oc per forward call */
    double bwd_flops_per_s;  /* 4 n ic oc per backward call (dinp and dweight) */
} gt_calib_gemm;

typedef struct gt_calib {
    /* what the rates depend on: a file is used only when all of these match the run's */
    char host[64], device[128], backend[16], precision[8], versions[256];
    int threads;
    int ranks_per_node;            /* the ranks that shared the host while it measured (each running
                                      the same kernels at the same time): they share its memory
                                      bandwidth, caches and clocks, so a kernel's rate depends on it */
    /* where the figures come from: 1 measured by --calibrate, 0 the defaults below */
    int measured;
    char source[256];              /* one line: the defaults' sources, or when and where measured */
    double matmul_flops_per_s;     /* a GEMM shape not measured: the median of those measured */
    gt_calib_gemm gemm[GT_CALIB_MAX_GEMMS];
    int n_gemm;
    double attn_fwd_flops_per_s;   /* causal attention at the config's micro-batch (the kernels' list has
                                      more), 4 B NH HD T(T+1)/2 FLOPs forward */
    double attn_bwd_flops_per_s;   /* 2.5 x the forward's FLOPs backward (ops_dry.c) */
    double mem_bytes_per_s;        /* a memory-bound kernel not measured below: bytes per second of the
                                      residual add */
    gt_calib_kernel kernel[GT_CALIB_MAX_KERNELS]; /* the memory-bound kernels and attention, measured one
                                                     by one at several sizes */
    int n_kernel;                  /* 0 in a file written before they were (priced at the single rates) */
    double optim_bytes_per_s;      /* AdamW: 28 bytes per element (4 read, 3 written fp32) */
    double coll_latency_s;         /* alpha of one collective call */
    double coll_bytes_per_s;       /* beta: bus bandwidth, bytes a rank sends per second (ring model);
                                      the pair the time model prices with: gt_calib_select_links sets it
                                      to the link kind a run's collectives cross (in a file: the widest
                                      kind measured) */
    /* The collectives per link kind (calibrate.c): among the ranks of one node (shared memory, NVLink)
     * and between nodes (one rank per node: the network). 0: that kind was not measured. */
    double node_latency_s, node_bytes_per_s;
    double net_latency_s, net_bytes_per_s;
    int overlap_between_nodes;     /* 1: the overlap pair below was measured on ranks of several nodes */
    /* Collectives that run while the compute runs (ZeRO-3's gathers, per-unit reduce-scatters, buckets):
     * measured by starting them back to back beside a loop of matrix products (calibrate.c). On a CPU the
     * transfers' copies, the MPI progress thread and the kernel's network stack take cores the compute
     * needs; on a GPU, NCCL's kernels share the SMs. overlap_bytes_per_s: their bus bandwidth then (0:
     * as coll_bytes_per_s); overlap_compute_s_per_byte: the compute's seconds lost per byte such a
     * collective moves (its ring-model bytes, as gt_time_collective counts them; 0: none) */
    double overlap_bytes_per_s;
    double overlap_compute_s_per_byte;
    double peak_flops;             /* MFU's peak: the datasheet's on a GPU, 0 (unknown) on the CPU */
    gt_calib_in_step in_step[GT_CALIB_MAX_IN_STEP]; /* per model shape and micro-batch size calibrated
                                                       into the file */
    int n_in_step;
    gt_calib_in_step in_step_sel[GT_CALIB_MAX_IN_STEP]; /* the chosen model shape's, by micro_batch
                                                           ascending (gt_calib_select_in_step) */
    int n_in_step_sel;
    double in_step_factor;         /* the factor the time model applies: a micro-batch of the model run
                                      whole (forward and backward) over the sum of its kernels' seconds
                                      above, how much slower kernels run one after another in a step
                                      than each alone in a loop; it multiplies the compute kernels'
                                      seconds. Chosen for the run's model by gt_calib_select_in_step;
                                      1: not measured (the defaults, a file of an older gtrain) */
    /* how the ranks' figures compared (calibrate.c): each figure kept is the slowest rank's */
    int ranks_measured;            /* the fewest ranks that reported a figure for a measurement */
    double rank_spread;            /* the median over the measurements of slowest / fastest rank (1 on
                                      one rank) */
} gt_calib;

/* The run's key: host name, CPU model (or GPU name when gpu), backend "cpu" or "cuda", precision
 * "fp32" or "bf16", the threads OpenMP runs, 1 rank per node (the caller sets the run's), and the
 * library versions. The rates stay 0. */
void gt_calib_key(gt_calib *c, int gpu, int bf16);

/* Stated defaults for the key's backend. GPU: NVIDIA H100/H200 SXM datasheet figures (989 TFLOP/s
 * dense bf16 tensor cores, 67 TFLOP/s fp32; HBM3e 4.8 TB/s on the H200, 3.35 TB/s on the H100;
 * NVLink 4 900 GB/s total, 450 GB/s per direction; between nodes 400 Gb/s InfiniBand NDR per GPU,
 * 50 GB/s, as a DGX H100's ConnectX-7 adapters), peaks that a real kernel does not reach. CPU:
 * guesses (50 GFLOP/s fp32 GEMM, 10 GB/s memory-bound, 20 us and 5 GB/s collectives between ranks
 * of one host, 50 us and 1.25 GB/s, 10 Gbit/s Ethernet, between hosts), not measurements.
 * measured = 0. */
void gt_calib_defaults(gt_calib *c, int gpu, int bf16);

/* The file of a key: $GTRAIN_CALIBRATION when set, else $XDG_CACHE_HOME/gtrain (or
 * ~/.cache/gtrain)/calibration-<host>-<backend>-<precision>-t<threads>-r<ranks per node>.json. 0, or
 * -1 when no directory can be named ($HOME unset). */
int gt_calib_path(const gt_calib *key, char *path, size_t len);

/* Reads `path` into *c when its key matches `key` (host, device, backend, precision, threads, ranks
 * per node, versions). 0; 1 when there is no file; -1 when it does not parse or its key differs (err says
 * which); *c is then left unchanged. */
int gt_calib_load(const char *path, const gt_calib *key, gt_calib *c, char *err, size_t err_len);

/* Writes *c as JSON to path (through path.tmp and a rename), making its directory. 0 or -1 (err). */
int gt_calib_save(const char *path, const gt_calib *c, char *err, size_t err_len);

/* Keeps what an earlier calibration of the same key measured and this one did not, so that
 * calibrating for several configs builds one file that prices them all: the GEMM shapes (ic, oc) of
 * another model (the newer measurement of a shape replaces the older; the shape-free fallback rate is
 * then the median over every entry) and the kernels' sizes (an entry of the same op and amount is
 * this one's). A table already full keeps this calibration's entries. */
void gt_calib_merge_previous(gt_calib *c, const gt_calib *previous);

/* The rates for pricing: the file of the run's key when there is one that matches, else the defaults.
 * `note` gets one line saying which ("calibrated: FILE" or "defaults: ... (no calibration file FILE)").
 * threads: the run's OpenMP threads per rank (0: this process's); ranks_per_node: the run's ranks on
 * this host (0: 1). Without the file of that count, the file of the same key measured with the
 * nearest other count of ranks per node (on a tie the larger) is used, and the note says so
 * ("calibrated with R ranks per node; this run has N: compute rates may be optimistic"); so does a
 * named file (explicit_path, or $GTRAIN_CALIBRATION) measured with another count. explicit_path (may
 * be NULL) replaces gt_calib_path. */
void gt_calib_for_run(gt_calib *c, int gpu, int bf16, int threads, int ranks_per_node, const char *explicit_path,
                      char *note, size_t note_len);

/* Sets coll_latency_s and coll_bytes_per_s to the widest link kind measured (between nodes, else within
 * a node; neither: unchanged): what a collective over the calibrating job's whole world crossed. */
void gt_calib_price_widest(gt_calib *c);

/* Sets the pair the time model prices collectives with (coll_latency_s, coll_bytes_per_s) for a run of
 * `world` ranks, `ranks_per_node` on each node: the between-nodes figures when the run spans nodes
 * (world > ranks_per_node: a ring's slowest link is then the network), else the within-node ones; a
 * kind the file does not have is priced at the defaults' figures for it (gt_calib_defaults). The
 * bandwidth beside compute, measured on one kind, is scaled to the other by their bandwidths' ratio.
 * `note` (may be NULL) gets "; collectives between nodes: calibrated" or "...: not calibrated, the
 * defaults' ..." appended. One rank: nothing to set. */
void gt_calib_select_links(gt_calib *c, int gpu, int world, int ranks_per_node, char *note, size_t note_len);

/* Chooses the in-step factors for a model of (dim, ffn_dim, n_heads, vocab_size) at seq_len tokens:
 * those measured on that shape, else those of the shape of the nearest dim (on a tie the larger), each
 * at the micro-batch sizes measured (c->in_step_sel); c->in_step_factor is then the one at micro_batch
 * (gt_calib_in_step_at; <= 0: 1 sequence), 1 when none was measured. `note` (may be NULL) gets a few
 * words saying which: "in-step factor 1.12 (this model)", "... (measured on dim 256, ffn 704)", with
 * ", 0.90-1.06 over micro-batches 1-8" where the sizes' factors differ; "in-step factor not measured (1)". */
void gt_calib_select_in_step(gt_calib *c, int dim, int ffn_dim, int n_heads, int vocab_size, int seq_len,
                             int micro_batch, char *note, size_t note_len);
/* The chosen shape's in-step factor at a micro-batch of that many sequences: the measured size's, else
 * interpolated on log2 of the size between the two nearest measured, else the nearest's (beyond the
 * ends, or an older file's one size); c->in_step_factor when none was chosen. A micro-batch's kernels
 * run slower against each alone the larger it is (its inputs come from further away): 0.90 at 1
 * sequence, 1.03 at 4 and 1.06 at 8 for a model of dim 256 on one Xeon (docs/planner.md). */
double gt_calib_in_step_at(const gt_calib *c, int micro_batch);
/* The rate of a GEMM of shape (n, ic, oc), forward (backward = 0) or backward: the measured entry of
 * that (ic, oc) (nearest n), else matmul_flops_per_s. */
double gt_calib_gemm_rate(const gt_calib *c, int n, int ic, int oc, int backward);

/* Seconds of one call of the kernel `op` of `amount` (bytes, or FLOPs for attention), from its
 * measured sizes (a, s): between two of them, the straight line through the two; beyond the largest,
 * its seconds scaled by amount (large calls run at their rate); below the smallest, the line through
 * the two smallest, at most the smallest's seconds and at least its seconds scaled by amount (one size
 * measured: scaled by amount). -1 when `op` was not measured (the caller prices at the single rate:
 * mem_bytes_per_s, or the attention rates). */
double gt_calib_kernel_seconds(const gt_calib *c, const char *op, double amount);

#endif
