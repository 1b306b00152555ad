/*
 * pathmax.h — the longest path gtrain handles, GT_PATH_MAX bytes with its terminator: every path
 * key of the config (config.h) and the buffers built from one (the watchdog's files under
 * checkpoint.dir, the state files' names). Here, below core and dist both, so that one constant
 * sizes them without an include ring.
 */
#ifndef GT_PATHMAX_H
#define GT_PATHMAX_H

#define GT_PATH_MAX 1024

#endif
