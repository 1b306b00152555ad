/* bytes.c — see bytes.h. */
#include "bytes.h"

#include <stdio.h>

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
