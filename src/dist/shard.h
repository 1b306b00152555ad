/*
 * shard.h — ZeRO slice arithmetic for one flat vector of n elements over W ranks.
 *
 * The flat vector (parameters, gradients, Adam moments: all tensors back to back in flat order) is
 * padded to n_pad = ceil(n/W)*W elements so every rank owns the same number of elements,
 * slice_len = n_pad/W. Whole-vector communication moves slice_len elements per rank (reduce-scatter
 * of the padded gradient buffer, all-gather of the padded parameter buffer); the padding tail is zeros
 * that no tensor owns. ZeRO-2/3 communicate unit by unit (src/core/zero.h): a unit's piece on rank r
 * is the unit's range intersected with slice r (gt_shard_intersect), counts that vary per rank. Rank r's slice of the LOGICAL vector is clipped to [0, n):
 *     begin = min(r*slice_len, n),   end = min((r+1)*slice_len, n)
 * and may be empty (n < W, or the last ranks when padding is large). Any n >= 0 and W >= 1 work.
 *
 * The optimizer (per-tensor weight decay) and the training-state writer (HDF5 hyperslabs) need to
 * know which tensors a slice touches: gt_shard_pieces lists them.
 * Example: n = 10, W = 4 -> n_pad = 12, slice_len = 3; slices [0,3) [3,6) [6,9) [9,10).
 */
#ifndef GT_SHARD_H
#define GT_SHARD_H

#include <stddef.h>

typedef struct {
    size_t n;          /* logical elements in the flat vector */
    int world, rank;
    size_t n_pad;      /* ceil(n/world)*world: size of the padded buffers */
    size_t slice_len;  /* n_pad/world: elements each rank owns in the padded buffers */
    size_t begin, end; /* this rank's slice of [0, n), begin <= end, possibly empty */
} gt_shard;

/* Aborts on world < 1 or rank outside [0, world). */
void gt_shard_init(gt_shard *shard, size_t n, int world, int rank);

static inline size_t gt_shard_count(const gt_shard *shard) { return shard->end - shard->begin; }

/* Intersect this rank's slice with a tensor occupying [tensor_offset, tensor_offset+tensor_numel) of
 * the flat vector. Returns 1 and the range within the tensor (first element, count) if they overlap,
 * 0 with *start_in_tensor = *count = 0 if not. */
int gt_shard_intersect(const gt_shard *shard, size_t tensor_offset, size_t tensor_numel,
                       size_t *start_in_tensor, size_t *count);

typedef struct {
    size_t offset, numel;   /* a tensor's place in the flat vector */
} gt_tensor_extent;

typedef struct {
    int tensor;              /* index into the extents array */
    size_t start_in_tensor;  /* first element of the tensor inside the slice (flat index within it) */
    size_t start_in_slice;   /* where that element sits relative to shard->begin */
    size_t count;            /* elements */
} gt_shard_piece;

/* The pieces of this rank's slice, one per tensor it overlaps, in the order of `tensors` (flat order
 * gives ascending start_in_slice). Writes at most max_pieces into `pieces` (which may be NULL to only
 * count) and returns how many there are. Aborts if a tensor extends past n. */
size_t gt_shard_pieces(const gt_shard *shard, const gt_tensor_extent *tensors, int n_tensors,
                       gt_shard_piece *pieces, size_t max_pieces);

#endif
