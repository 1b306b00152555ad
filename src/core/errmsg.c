/* errmsg.c — gt_errorf (see errmsg.h). */
#include "errmsg.h"

#include <stdarg.h>
#include <stdio.h>

int gt_errorf(char *err, size_t len, const char *fmt, ...) {
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return 2;
}
