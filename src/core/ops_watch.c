/*
 * ops_watch.c — see ops_watch.h. The wrappers are generated from ops.h's op list.
 */
#include "ops_watch.h"

#include "watchdog.h"

static const gt_ops *inner;
static gt_ops watched;

/* watched_<op>: the op between the watchdog's kernel begin and end */
#define WATCH_OP(kind, op, ret, params, args, shapes)                                                      \
    static ret watched_##op params {                                                                        \
        gt_watchdog_kernel_begin(#op);                                                                      \
        WATCH_BODY_##ret(inner->op args)                                                                    \
    }
#define WATCH_BODY_void(call) call; gt_watchdog_kernel_end();
#define WATCH_BODY_double(call) double result_ = call; gt_watchdog_kernel_end(); return result_;
GT_OPS(WATCH_OP)
#undef WATCH_OP

static void watched_zero(void *ptr, size_t bytes) {
    gt_watchdog_kernel_begin("zero");
    inner->zero(ptr, bytes);
    gt_watchdog_kernel_end();
}
static void watched_copy_to_device(void *dst, const void *src, size_t bytes) {
    gt_watchdog_kernel_begin("copy_to_device");
    inner->copy_to_device(dst, src, bytes);
    gt_watchdog_kernel_end();
}
static void watched_copy_to_host(void *dst, const void *src, size_t bytes) {
    gt_watchdog_kernel_begin("copy_to_host");
    inner->copy_to_host(dst, src, bytes);
    gt_watchdog_kernel_end();
}
static void watched_copy(void *dst, const void *src, size_t bytes) {
    gt_watchdog_kernel_begin("copy");
    inner->copy(dst, src, bytes);
    gt_watchdog_kernel_end();
}
static void watched_synchronize(void) {
    gt_watchdog_kernel_begin("synchronize");
    inner->synchronize();
    gt_watchdog_kernel_end();
}

const gt_ops *gt_ops_watched(const gt_ops *ops) {
    inner = ops;
    watched = *ops;
#define WATCH_ENTRY(kind, op, ret, params, args, shapes) watched.op = watched_##op;
    GT_OPS(WATCH_ENTRY)
#undef WATCH_ENTRY
    watched.zero = watched_zero;
    watched.copy_to_device = watched_copy_to_device;
    watched.copy_to_host = watched_copy_to_host;
    watched.copy = watched_copy;
    watched.synchronize = watched_synchronize;
    return &watched;
}
