/*
 * fuzz_data.c — libFuzzer harness for token-shard files (src/core/data.c): the 32-byte header, the
 * size checks against token_count, the token scan and the batch functions on whatever passed.
 *
 * Input: the whole file. It is written to a temporary file (the loader maps a path), opened with
 * gt_data_open, and when accepted every public reader is driven for a few sequence lengths. Besides
 * memory errors, the harness aborts when a refused file comes without a message, or when a batch
 * breaks its contract: targets are the inputs shifted by one, every token is <= the file's maximum.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"

static char path[256];

static void cleanup(void) { unlink(path); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/gtrain-fuzz-data-%ld.bin", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    atexit(cleanup);
    return 0;
}

static void check_batch(const int32_t *in, const int32_t *tg, int n_seq, int T, int max_tok) {
    for (int s = 0; s < n_seq; s++)
        for (int t = 0; t < T; t++) {
            int32_t a = in[s * T + t], b = tg[s * T + t];
            if (a < 0 || b < 0 || a > max_tok || b > max_tok) abort();
            if (t + 1 < T && in[s * T + t + 1] != b) abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f) != 0) abort();

    char err[1024] = "";
    gt_data *d = gt_data_open(path, err, sizeof err);
    if (!d) {
        if (!err[0]) abort();
        return 0;
    }
    uint64_t count = gt_data_token_count(d);
    int max_tok = gt_data_max_token(d);
    if (count < 2 || max_tok < 0) abort();
    static const int lengths[] = {1, 2, 3, 7, 16};
    enum { N_SEQ = 3 };
    int32_t in[N_SEQ * 16], tg[N_SEQ * 16];
    for (int i = 0; i < (int)(sizeof lengths / sizeof lengths[0]); i++) {
        int T = lengths[i];
        if (gt_data_check_seq(d, T, err, sizeof err) != 0) {
            if (!err[0] || count >= (uint64_t)T + 1) abort();
            continue;
        }
        gt_data_train_batch(d, (uint64_t)size * 2654435761u, count, N_SEQ, T, in, tg);
        check_batch(in, tg, N_SEQ, T, max_tok);
        uint64_t windows = gt_data_val_windows(d, T);
        if (windows < 1) abort();
        gt_data_val_batch(d, (int)(count % 5), N_SEQ, T, in, tg);
        check_batch(in, tg, N_SEQ, T, max_tok);
    }
    gt_data_close(d);
    return 0;
}
