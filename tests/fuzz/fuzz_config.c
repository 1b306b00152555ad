/*
 * fuzz_config.c — libFuzzer harness for the configuration parser: INI text through libinih and our
 * line reader, every key's typed parse and range check, the checks across keys, and command-line
 * overrides (gt_config_load_string, as a config file and overrides go through gt_config_load).
 *
 * Input: INI text, then optionally a NUL byte and up to 8 NUL-separated overrides
 * ("train.lr=1e-3"). Besides memory errors (sanitizers), the harness checks two properties and
 * aborts when one fails:
 *   - a refused config always comes with a message;
 *   - an accepted config round-trips: gt_config_to_ini of it loads again, with no error, to the same
 *     text (the text stored in every training-state file is what resume and gtrain-sample read).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) { return 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *overrides[8];
    int n = 0;
    for (char *p = buf + strlen(buf); p < buf + size && n < 8; p += strlen(p)) overrides[n++] = ++p;

    static gt_config cfg, again; /* large (paths): keep them off the stack */
    static char err[4096];
    int rc = gt_config_load_string(&cfg, buf, "fuzz.ini", n, overrides, err, sizeof err);
    if (rc != 0) {
        if (rc != 2 || !err[0]) {
            fprintf(stderr, "fuzz_config: refused (%d) without a message\n", rc);
            abort();
        }
    } else {
        char *text = gt_config_to_ini(&cfg);
        if (!text) abort();
        if (gt_config_load_string(&again, text, "round-trip", 0, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_config: the effective config does not load again: %s\n--\n%s", err, text);
            abort();
        }
        char *text2 = gt_config_to_ini(&again);
        if (!text2 || strcmp(text, text2) != 0) {
            fprintf(stderr, "fuzz_config: the effective config changed on reload:\n%s--\n%s", text, text2);
            abort();
        }
        free(text2);
        free(text);
    }
    free(buf);
    return 0;
}
