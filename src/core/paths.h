/*
 * paths.h — directories on disk: mkdir -p, used for checkpoint.dir (runstate_dir.c, runclaim.c) and the
 * parent of log.metrics (config.c).
 */
#ifndef GT_PATHS_H
#define GT_PATHS_H

/* mkdir -p: PATH and every missing parent (mode 0777 before the umask); 0 or -1 with errno. */
int gt_make_dirs(const char *path);

#endif
