/*
 * shard.c — ZeRO slice arithmetic (see shard.h). Pure integer arithmetic: no MPI, no memory.
 */
#include <stdio.h>
#include <stdlib.h>

#include "shard.h"

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

void gt_shard_init(gt_shard *s, size_t n, int world, int rank) {
    if (world < 1 || rank < 0 || rank >= world) {
        fprintf(stderr, "%s:%d: gt_shard_init: rank %d of world %d is not a rank\n", __FILE__, __LINE__,
                rank, world);
        abort();
    }
    size_t W = (size_t)world;
    s->n = n;
    s->world = world;
    s->rank = rank;
    s->slice_len = n / W + (n % W != 0);   /* ceil(n/W) */
    s->n_pad = s->slice_len * W;
    s->begin = min_size((size_t)rank * s->slice_len, n);
    s->end = min_size((size_t)(rank + 1) * s->slice_len, n);
}

int gt_shard_intersect(const gt_shard *s, size_t tensor_offset, size_t tensor_numel,
                       size_t *start_in_tensor, size_t *count) {
    size_t lo = max_size(s->begin, tensor_offset);
    size_t hi = min_size(s->end, tensor_offset + tensor_numel);
    if (lo >= hi) {
        *start_in_tensor = 0;
        *count = 0;
        return 0;
    }
    *start_in_tensor = lo - tensor_offset;
    *count = hi - lo;
    return 1;
}

size_t gt_shard_pieces(const gt_shard *s, const gt_tensor_extent *tensors, int n_tensors,
                       gt_shard_piece *pieces, size_t max_pieces) {
    size_t found = 0;
    for (int t = 0; t < n_tensors; t++) {
        if (tensors[t].offset > s->n || tensors[t].numel > s->n - tensors[t].offset) {
            fprintf(stderr, "%s:%d: tensor %d [%zu, +%zu) extends past the flat vector (%zu elements)\n",
                    __FILE__, __LINE__, t, tensors[t].offset, tensors[t].numel, s->n);
            abort();
        }
        size_t start, count;
        if (!gt_shard_intersect(s, tensors[t].offset, tensors[t].numel, &start, &count)) continue;
        if (pieces && found < max_pieces) {
            gt_shard_piece *p = &pieces[found];
            p->tensor = t;
            p->start_in_tensor = start;
            p->start_in_slice = tensors[t].offset + start - s->begin;
            p->count = count;
        }
        found++;
    }
    return found;
}
