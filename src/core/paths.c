/* paths.c — see paths.h. */
#include "paths.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int gt_make_dirs(const char *path) {
    char *buf = strdup(path);
    if (!buf) return -1;
    int rc = 0;
    for (char *p = buf + 1; *p && rc == 0; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) rc = -1;
        *p = '/';
    }
    if (rc == 0 && mkdir(buf, 0777) != 0 && errno != EEXIST) rc = -1;
    int err = errno;
    free(buf);
    errno = err;
    return rc;
}
