/* errmsg.c — gt_errorf and gt_appendf (see errmsg.h). */
#include "errmsg.h"
#include "exitcodes.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int gt_errorf(char *err, size_t len, const char *fmt, ...) {
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return GT_EXIT_BAD_INPUT;
}

void gt_appendf(char *out, size_t len, const char *fmt, ...) {
    size_t used = strlen(out);
    if (used + 1 >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + used, len - used, fmt, ap);
    va_end(ap);
}
