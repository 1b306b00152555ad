/*
 * stages.h — the names of the ZeRO stages (zero.h), as dist.shard spells them: 0 none, 1 optimizer,
 * 2 gradients, 3 parameters. gt_zero_stage (zero.h) reads them; messages, the banner and
 * `gtrain --plan` write them with gt_stage_name.
 */
#ifndef GT_STAGES_H
#define GT_STAGES_H

static inline const char *gt_stage_name(int stage) {
    static const char *const names[] = {"none", "optimizer", "gradients", "parameters"};
    return stage >= 0 && stage <= 3 ? names[stage] : "?";
}

#endif
