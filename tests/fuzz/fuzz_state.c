/*
 * fuzz_state.c — libFuzzer harness for the training-state reader (gt_state_read in src/core/state.c):
 * HDF5 files with wrong shapes, wrong attribute types, missing groups and damaged bytes.
 *
 * The model is the small one of tests/fuzz/state_model.ini (its path is compiled in as
 * GTRAIN_FUZZ_STATE_INI); the seed corpus holds real state files of that model saved by gtrain and
 * variants of them made with h5py (tests/fuzz/make_state_seeds.py). Each input is written to a
 * temporary file and read as one rank of a world of 1, 2 or 3 (picked from the input size), so the
 * slice arithmetic of every rank is exercised too. Besides memory errors, the harness aborts when a
 * refused file comes without a message or with a code other than the two documented ones, or when
 * an HDF5 handle is left open (a file, group, dataset, attribute or type: every path must close what
 * it opened, or a long run that retries damaged files keeps them open).
 */
#define _POSIX_C_SOURCE 200809L
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "memtrack.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "shard.h"
#include "state.h"

#ifndef GTRAIN_FUZZ_STATE_INI
#error "GTRAIN_FUZZ_STATE_INI (the path of tests/fuzz/state_model.ini) must be defined"
#endif

static char path[256];
static gt_mem mem;
static gt_model *model;

static void cleanup(void) { unlink(path); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    static gt_config cfg;
    char err[2048];
    if (gt_config_load(&cfg, GTRAIN_FUZZ_STATE_INI, 0, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_state: %s\n", err);
        exit(1);
    }
    gt_mem_init(&mem, gt_ops_cpu());
    model = gt_model_create(gt_ops_cpu(), &mem, &cfg.model);
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/gtrain-fuzz-state-%ld.h5", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f) != 0) abort();

    /* the optimizer slice of rank `rank` of `world`, as gt_optim_init lays it out */
    const gt_layout *layout = gt_model_layout(model);
    int world = 1 + (int)(size % 3), rank = (int)((size / 3) % (size_t)world);
    gt_optim opt;
    memset(&opt, 0, sizeof opt);
    opt.ops = gt_ops_cpu();
    opt.mem = &mem;
    opt.model = model;
    opt.sharded = world > 1;
    gt_shard_init(&opt.shard, layout->n_params, world, rank);
    opt.state_len = opt.shard.slice_len;
    size_t bytes = (opt.state_len ? opt.state_len : 1) * sizeof(float);
    opt.master = malloc(bytes);
    opt.exp_avg = malloc(bytes);
    opt.exp_avg_sq = malloc(bytes);
    gt_tensor_extent *ext = malloc((size_t)layout->n_tensors * sizeof *ext);
    if (!opt.master || !opt.exp_avg || !opt.exp_avg_sq || !ext) abort();
    for (int i = 0; i < layout->n_tensors; i++)
        ext[i] = (gt_tensor_extent){layout->tensors[i].offset, layout->tensors[i].numel};
    opt.n_pieces = gt_shard_pieces(&opt.shard, ext, layout->n_tensors, NULL, 0);
    opt.pieces = malloc((opt.n_pieces ? opt.n_pieces : 1) * sizeof *opt.pieces);
    if (!opt.pieces) abort();
    gt_shard_pieces(&opt.shard, ext, layout->n_tensors, opt.pieces, opt.n_pieces);
    free(ext);

    gt_state_info info;
    char *config_text = NULL, err[2048];
    int code = gt_state_read(path, &opt, &info, &config_text, err, sizeof err);
    if (code != GT_STATE_OK) {
        if ((code != GT_STATE_UNREADABLE && code != GT_STATE_INCOMPATIBLE) || !err[0] || config_text) abort();
    } else {
        static gt_config saved;
        if (!config_text) abort();
        /* what resume and gtrain-sample do next: the saved config is parsed like a file */
        (void)gt_config_load_string(&saved, config_text, "state:/config", 0, NULL, err, sizeof err);
        free(config_text);
    }
    ssize_t open_handles = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open_handles != 0) {
        fprintf(stderr, "fuzz_state: %zd HDF5 handles left open (code %d: %s)\n", open_handles, code, err);
        abort();
    }
    free(opt.master);
    free(opt.exp_avg);
    free(opt.exp_avg_sq);
    free(opt.pieces);
    return 0;
}
