/*
 * fuzz_safetensors.c — libFuzzer harness for the safetensors header parser (src/core/safetensors.c).
 *
 * The input is a whole safetensors file: an 8-byte little-endian header length, the JSON header, the
 * data. gt_st_parse must either accept it, with every tensor's byte range inside the data and equal
 * to shape x dtype, or return 2 with a message; never crash, read out of bounds or leak. The harness
 * re-checks the accepted ranges itself, so a parser that let a lying offset through would abort here.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc/core \
 *         tests/fuzz/fuzz_safetensors.c src/core/safetensors.c -ljansson -o fuzz_safetensors
 *   ./fuzz_safetensors tests/fuzz/corpus/safetensors
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gt_st_header h;
    char err[512];
    if (gt_st_parse("fuzz.safetensors", data, size, (uint64_t)size, &h, err, sizeof err) != 0) return 0;
    uint64_t data_len = h.file_size - h.data_start;
    if (h.data_start > h.file_size) abort();
    for (int i = 0; i < h.n_tensors; i++) {
        const gt_st_tensor *t = &h.tensors[i];
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        uint64_t bytes = numel * (t->dtype == GT_ST_F32 ? 4 : 2);
        if (t->begin > t->end || t->end > data_len || t->end - t->begin != bytes || !t->name) abort();
    }
    gt_st_free(&h);
    return 0;
}
