/*
 * optim.c — reduction, clipping, AdamW on the owned slice, gather (see optim.h).
 *
 * The one gradient collective of a step happens here, after the last micro-batch: a reduce-scatter
 * of the padded gradient buffer for ZeRO-1, an all-reduce for shard=none. Micro-batches before it
 * never communicate (tests/test_dist_step.c counts the calls).
 */
#include "optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t gt_optim_padded_len(size_t n_params, int world, int sharded) {
    if (!sharded || world <= 1) return n_params;
    gt_shard s;
    gt_shard_init(&s, n_params, world, 0);
    return s.n_pad;
}

void gt_optim_init(gt_optim *opt, const gt_ops *ops, gt_mem *mem, gt_comm *comm, gt_model *model,
                   int sharded, const float *initial_params_host) {
    memset(opt, 0, sizeof *opt);
    opt->ops = ops;
    opt->mem = mem;
    opt->comm = comm;
    opt->model = model;
    const gt_layout *layout = gt_model_layout(model);
    int world = gt_comm_size(comm);
    opt->sharded = sharded && world > 1;
    if (opt->sharded) gt_shard_init(&opt->shard, layout->n_params, world, gt_comm_rank(comm));
    else gt_shard_init(&opt->shard, layout->n_params, 1, 0);
    opt->state_len = opt->shard.slice_len;
    size_t bytes = opt->state_len * sizeof(float);
    opt->master = gt_mem_alloc(mem, GT_MEM_OPTIM, bytes);
    opt->exp_avg = gt_mem_alloc(mem, GT_MEM_OPTIM, bytes);
    opt->exp_avg_sq = gt_mem_alloc(mem, GT_MEM_OPTIM, bytes);
    ops->zero(opt->master, bytes);
    ops->zero(opt->exp_avg, bytes);
    ops->zero(opt->exp_avg_sq, bytes);
    size_t count = gt_shard_count(&opt->shard);
    if (count && initial_params_host)
        ops->copy_to_device(opt->master, initial_params_host + opt->shard.begin, count * sizeof(float));

    gt_tensor_extent *ext = malloc((size_t)layout->n_tensors * sizeof *ext);
    if (!ext) abort();
    for (int i = 0; i < layout->n_tensors; i++)
        ext[i] = (gt_tensor_extent){layout->tensors[i].offset, layout->tensors[i].numel};
    opt->n_pieces = gt_shard_pieces(&opt->shard, ext, layout->n_tensors, NULL, 0);
    opt->pieces = malloc((opt->n_pieces ? opt->n_pieces : 1) * sizeof *opt->pieces);
    if (!opt->pieces) abort();
    gt_shard_pieces(&opt->shard, ext, layout->n_tensors, opt->pieces, opt->n_pieces);
    free(ext);
}

void gt_optim_free(gt_optim *opt) {
    size_t bytes = opt->state_len * sizeof(float);
    gt_mem_free(opt->mem, GT_MEM_OPTIM, opt->master, bytes);
    gt_mem_free(opt->mem, GT_MEM_OPTIM, opt->exp_avg, bytes);
    gt_mem_free(opt->mem, GT_MEM_OPTIM, opt->exp_avg_sq, bytes);
    free(opt->pieces);
    memset(opt, 0, sizeof *opt);
}

uint64_t gt_optim_bytes(const gt_optim *opt) { return 3 * (uint64_t)opt->state_len * sizeof(float); }

double gt_lr_at(const gt_config *cfg, int step) {
    double lr = cfg->train.lr, min_lr = cfg->train.min_lr;
    int warmup = cfg->train.warmup_steps, steps = cfg->train.steps;
    if (warmup > 0 && step <= warmup) return lr * step / warmup;
    if (cfg->train.lr_schedule == GT_LR_CONSTANT || steps <= warmup) return lr;
    double progress = (double)(step - warmup) / (double)(steps - warmup);
    if (progress > 1.0) progress = 1.0;
    if (cfg->train.lr_schedule == GT_LR_LINEAR) return lr - (lr - min_lr) * progress;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress));
}

gt_step_outcome gt_optim_step(gt_optim *opt, const gt_config *cfg, int step, double max_grad_norm,
                              double *grad_norm) {
    const gt_ops *ops = opt->ops;
    gt_model *model = opt->model;
    float *grads = gt_model_grads(model);
    int rank = gt_comm_rank(opt->comm), world = gt_comm_size(opt->comm);
    size_t count = gt_shard_count(&opt->shard);

    /* 1. the step's one gradient reduction: afterwards `slice` holds the summed gradient of ours */
    float *slice = grads;
    if (opt->grad_slice) {
        slice = opt->grad_slice; /* reduced micro-batch by micro-batch (zero.c) */
    } else if (opt->sharded) {
        slice = grads + (size_t)rank * opt->shard.slice_len;
        if (!opt->reduced_in_backward) /* else reduced bucket by bucket during backward (zero.h) */
            gt_comm_reduce_scatter_sum(opt->comm, grads, slice, opt->shard.slice_len, GT_DTYPE_F32);
    } else if (world > 1) {
        gt_comm_all_reduce_sum(opt->comm, grads, opt->shard.n, GT_DTYPE_F32);
    }

    /* 2. global norm from the slices' sums of squares, then clip */
    double sumsq = count ? ops->sumsq(slice, count) : 0.0;
    if (opt->sharded) sumsq = gt_comm_all_reduce_scalar_sum(opt->comm, sumsq);
    double norm = sqrt(sumsq);
    *grad_norm = norm;
    if (!isfinite(norm)) return GT_STEP_SKIPPED_NONFINITE; /* one NaN would spread into every weight it touches */
    if (max_grad_norm > 0 && norm > max_grad_norm) return GT_STEP_SKIPPED_SPIKE; /* the trainer skips it */
    double clip = cfg->train.grad_clip;
    if (clip > 0 && norm > clip && count) ops->scale(slice, count, (float)(clip / (norm + 1e-6)));

    /* 3. AdamW per tensor piece (weight decay differs per tensor) */
    double lr = gt_lr_at(cfg, step);
    opt->t++;
    const gt_layout *layout = gt_model_layout(model);
    for (size_t p = 0; p < opt->n_pieces; p++) {
        const gt_shard_piece *pc = &opt->pieces[p];
        const gt_tensor_info *t = &layout->tensors[pc->tensor];
        size_t at = pc->start_in_slice;
        ops->adamw(opt->master + at, opt->exp_avg + at, opt->exp_avg_sq + at, slice + at, pc->count, (float)lr,
                   (float)cfg->train.beta1, (float)cfg->train.beta2, (float)cfg->train.adam_eps,
                   t->decay ? (float)cfg->train.weight_decay : 0.0f, opt->t);
    }

    /* 4. new working parameters of the slice, then everyone's (started only: the next forward waits) */
    if (opt->gather_start) {
        char *params = gt_model_params(model);
        size_t eb = (size_t)ops->act_bytes;
        if (count) ops->to_working(params + opt->shard.begin * eb, opt->master, count);
        opt->gather_start(opt->gather_ctx);
    } else {
        gt_optim_publish_params(opt);
    }
    return GT_STEP_APPLIED;
}

void gt_optim_publish_params(gt_optim *opt) {
    const gt_ops *ops = opt->ops;
    if (opt->gather_finish) opt->gather_finish(opt->gather_ctx); /* nothing may still write the buffer */
    char *params = gt_model_params(opt->model);
    size_t eb = (size_t)ops->act_bytes, count = gt_shard_count(&opt->shard);
    if (opt->param_shard) { /* ZeRO-3: the shard is all this rank holds; units are gathered on use */
        if (count) ops->to_working(opt->param_shard, opt->master, count);
        return;
    }
    if (count) ops->to_working(params + opt->shard.begin * eb, opt->master, count);
    if (opt->sharded)
        gt_comm_all_gather(opt->comm, params + (size_t)gt_comm_rank(opt->comm) * opt->shard.slice_len * eb, params,
                           opt->shard.slice_len, eb == 2 ? GT_DTYPE_BF16 : GT_DTYPE_F32);
}
