/*
 * ops_watch.h — the kernels table as the watchdog sees it: every op of a backend's table, and its
 * memory copies and synchronisation, reported to the watchdog as they begin and end
 * (gt_watchdog_kernel_begin/end, src/dist/watchdog.h), so that a training thread that computes
 * without ever finishing a kernel (a kernel that never returns) is told from one that computes
 * slowly. A relaxed store or two per call, from the training thread only.
 */
#ifndef GT_OPS_WATCH_H
#define GT_OPS_WATCH_H

#include "ops.h"

/* A table that calls `inner`'s members, each between the watchdog's kernel begin and end; the same
 * name, number formats and optional members (NULL stays NULL). One per process: a second call
 * replaces the first (the trainer opens one backend). */
const gt_ops *gt_ops_watched(const gt_ops *inner);

#endif
