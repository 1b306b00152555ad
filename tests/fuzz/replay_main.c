/*
 * replay_main.c — the CTest side of a fuzz harness: feeds every file of a corpus directory, in name
 * order, to the harness's LLVMFuzzerTestOneInput, exactly as libFuzzer would replay it. Linked with
 * the normal compiler (and, in the sanitizer build, with ASan+UBSan), so every committed corpus
 * input (including each one that once crashed) is run by every CI build.
 *
 *   fuzz_replay_<name> CORPUS_DIR     exit 0 when every file ran; 1 when the directory is empty or
 *                                     unreadable; a crash is the harness's own abort.
 */
#define _DEFAULT_SOURCE /* scandir, alphasort, DT_* */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* optional in libFuzzer, so weak here: a harness without it links and simply has no set-up */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            unsigned char *p = realloc(buf, cap *= 2);
            if (!p) free(buf);
            buf = p;
        }
    }
    fclose(f);
    *size = n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    struct dirent **names = NULL;
    int n = scandir(argv[1], &names, NULL, alphasort);
    if (n < 0) {
        perror(argv[1]);
        return 1;
    }
    int replayed = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], names[i]->d_name);
        struct stat st;
        if (names[i]->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(names[i]);
            continue;
        }
        size_t size = 0;
        unsigned char *data = read_all(path, &size);
        if (!data) {
            perror(path);
            return 1;
        }
        LLVMFuzzerTestOneInput(data, size);
        free(data);
        free(names[i]);
        replayed++;
    }
    free(names);
    printf("%s: replayed %d inputs\n", argv[1], replayed);
    return replayed > 0 ? 0 : 1;
}
