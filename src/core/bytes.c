/* bytes.c — see bytes.h. */
#include "bytes.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

void gt_format_bytes(uint64_t bytes, char *out, size_t out_len) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(out, out_len, "%llu B", (unsigned long long)bytes);
    else snprintf(out, out_len, "%.2f %s", v, units[u]);
}

/* Exact multiples of a binary unit print with it ("70GiB"); everything else in bytes. */
void gt_format_bytes_exact(uint64_t bytes, char *out, size_t len) {
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    for (int u = 0; u < 4; u++) {
        uint64_t unit = 1ull << (10 * (4 - u));
        if (bytes && bytes % unit == 0) {
            snprintf(out, len, "%llu%s", (unsigned long long)(bytes / unit), units[u]);
            return;
        }
    }
    snprintf(out, len, "%llu", (unsigned long long)bytes);
}

int gt_parse_bytes(const char *text, uint64_t *bytes) {
    static const struct {
        const char *suffix;
        uint64_t scale;
    } units[] = {
        {"", 1},
        {"B", 1},
        {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000ull}, {"kB", 1000ull},
        {"M", 1ull << 20}, {"MiB", 1ull << 20}, {"MB", 1000000ull},
        {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000ull},
        {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull},
    };
    if (!text) return -1;
    while (blank(*text)) text++;
    if (*text < '0' || *text > '9') return -1; /* no signs, no ".5" */
    char *end = NULL;
    errno = 0;
    unsigned long long whole = strtoull(text, &end, 10);
    if (errno == ERANGE) return -1;
    const char *frac = NULL;
    size_t frac_len = 0;
    if (*end == '.') {
        frac = end + 1;
        while (frac[frac_len] >= '0' && frac[frac_len] <= '9') frac_len++;
        if (frac_len == 0) return -1;
        end = (char *)frac + frac_len;
    }
    while (*end == ' ') end++;
    size_t n = strlen(end);
    while (n > 0 && blank(end[n - 1])) n--;
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        if (strlen(units[u].suffix) != n || strncmp(units[u].suffix, end, n) != 0) continue;
        uint64_t scale = units[u].scale;
        if (whole > UINT64_MAX / scale) return -1;
        uint64_t total = (uint64_t)whole * scale;
        if (frac) {
            /* the fraction in exact integer steps: 1.5GB = 1 GB + 5 * GB / 10, rounded to a byte */
            long double part = 0.0L, place = 1.0L;
            for (size_t i = 0; i < frac_len; i++) {
                place /= 10.0L;
                part += (frac[i] - '0') * place;
            }
            long double extra = part * (long double)scale + 0.5L;
            if ((long double)(UINT64_MAX - total) < extra) return -1;
            total += (uint64_t)extra;
        }
        *bytes = total;
        return 0;
    }
    return -1;
}
