/*
 * test_shard — ZeRO slice arithmetic: for every n and world size tried, the slices tile [0, n) exactly
 * once, the padded size is the smallest multiple of W >= n, n < W leaves empty slices, and the
 * per-tensor pieces of all ranks together cover every tensor element exactly once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard.h"

static int failures = 0;
#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            if (failures < 20) {                                              \
                fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                 \
                fprintf(stderr, "\n");                                        \
            }                                                                 \
            failures++;                                                       \
        }                                                                     \
    } while (0)

/* slices_tile_the_vector_exactly_once, padding_is_the_next_multiple_of_world */
static void slices_tile_the_vector(size_t n, int W) {
    size_t expect_pad = (n + (size_t)W - 1) / (size_t)W * (size_t)W;
    size_t next = 0;
    for (int r = 0; r < W; r++) {
        gt_shard s;
        gt_shard_init(&s, n, W, r);
        CHECK(s.n_pad == expect_pad, "n=%zu W=%d n_pad=%zu want %zu", n, W, s.n_pad, expect_pad);
        CHECK(s.slice_len * (size_t)W == s.n_pad, "n=%zu W=%d", n, W);
        CHECK(s.n_pad >= n && s.n_pad - n < (size_t)W, "n=%zu W=%d n_pad=%zu", n, W, s.n_pad);
        CHECK(s.begin == next, "n=%zu W=%d r=%d begin=%zu want %zu", n, W, r, s.begin, next);
        CHECK(s.begin <= s.end && s.end <= n, "n=%zu W=%d r=%d [%zu,%zu)", n, W, r, s.begin, s.end);
        CHECK(gt_shard_count(&s) <= s.slice_len, "n=%zu W=%d r=%d", n, W, r);
        CHECK(s.begin == ((size_t)r * s.slice_len < n ? (size_t)r * s.slice_len : n), "n=%zu W=%d r=%d", n, W, r);
        if (n < (size_t)W) CHECK(gt_shard_count(&s) == (r < (int)n ? 1u : 0u), "n<W: n=%zu W=%d r=%d", n, W, r);
        next = s.end;
    }
    CHECK(next == n, "n=%zu W=%d: slices end at %zu", n, W, next);
}

/* pieces_cover_every_tensor_element_once: tensors of random sizes (zeros included) back to back. */
static void pieces_cover_tensors(size_t n_tensors_max, int W, unsigned seed) {
    srand(seed);
    int n_tensors = 1 + rand() % (int)n_tensors_max;
    gt_tensor_extent *t = calloc((size_t)n_tensors, sizeof *t);
    size_t n = 0;
    for (int i = 0; i < n_tensors; i++) {
        t[i].offset = n;
        t[i].numel = (rand() % 4 == 0) ? 0 : (size_t)(rand() % 23);
        n += t[i].numel;
    }
    unsigned char *seen = calloc(n + 1, 1);
    for (int r = 0; r < W; r++) {
        gt_shard s;
        gt_shard_init(&s, n, W, r);
        size_t np = gt_shard_pieces(&s, t, n_tensors, NULL, 0);
        gt_shard_piece *p = calloc(np + 1, sizeof *p);
        CHECK(gt_shard_pieces(&s, t, n_tensors, p, np) == np, "count differs when writing");
        size_t covered = 0, last_slice_pos = 0;
        for (size_t k = 0; k < np; k++) {
            CHECK(p[k].count > 0, "empty piece listed");
            CHECK(p[k].start_in_tensor + p[k].count <= t[p[k].tensor].numel, "piece outside tensor");
            size_t flat = t[p[k].tensor].offset + p[k].start_in_tensor;
            CHECK(flat == s.begin + p[k].start_in_slice, "start_in_slice disagrees with flat index");
            CHECK(flat >= s.begin && flat + p[k].count <= s.end, "piece outside slice");
            CHECK(k == 0 || p[k].start_in_slice >= last_slice_pos, "pieces not in flat order");
            last_slice_pos = p[k].start_in_slice + p[k].count;
            size_t st, ct;
            CHECK(gt_shard_intersect(&s, t[p[k].tensor].offset, t[p[k].tensor].numel, &st, &ct) == 1 &&
                      st == p[k].start_in_tensor && ct == p[k].count, "intersect disagrees with pieces");
            for (size_t e = 0; e < p[k].count; e++) seen[flat + e]++;
            covered += p[k].count;
        }
        CHECK(covered == gt_shard_count(&s), "W=%d r=%d pieces cover %zu of %zu", W, r, covered, gt_shard_count(&s));
        free(p);
    }
    for (size_t e = 0; e < n; e++) CHECK(seen[e] == 1, "element %zu covered %d times (W=%d)", e, seen[e], W);
    free(seen);
    free(t);
}

static void intersect_examples(void) {
    gt_shard s;   /* n = 10, W = 4: slices [0,3) [3,6) [6,9) [9,10) */
    gt_shard_init(&s, 10, 4, 1);
    CHECK(s.n_pad == 12 && s.slice_len == 3 && s.begin == 3 && s.end == 6, "n=10 W=4 r=1");
    size_t st, ct;
    CHECK(gt_shard_intersect(&s, 0, 4, &st, &ct) == 1 && st == 3 && ct == 1, "tensor [0,4) on [3,6)");
    CHECK(gt_shard_intersect(&s, 4, 1, &st, &ct) == 1 && st == 0 && ct == 1, "tensor [4,5)");
    CHECK(gt_shard_intersect(&s, 2, 8, &st, &ct) == 1 && st == 1 && ct == 3, "tensor [2,10)");
    CHECK(gt_shard_intersect(&s, 6, 4, &st, &ct) == 0 && st == 0 && ct == 0, "tensor [6,10) misses");
    CHECK(gt_shard_intersect(&s, 4, 0, &st, &ct) == 0 && ct == 0, "empty tensor misses");
    gt_shard_init(&s, 10, 4, 3);
    CHECK(s.begin == 9 && s.end == 10, "last rank gets the remainder");
    gt_shard_init(&s, 2, 5, 4);   /* n < W: ranks 2..4 own nothing */
    CHECK(s.n_pad == 5 && s.slice_len == 1 && gt_shard_count(&s) == 0 && s.begin == 2, "n=2 W=5 r=4");
    gt_shard_init(&s, 0, 3, 0);
    CHECK(s.n_pad == 0 && s.slice_len == 0 && gt_shard_count(&s) == 0, "n=0");
    /* a 7B-parameter flat vector over 8 ranks: no 32-bit overflow */
    size_t big = 6738415616u;
    gt_shard_init(&s, big, 8, 7);
    CHECK(s.slice_len == big / 8 && s.end == big && s.begin == big / 8 * 7, "7B over 8 ranks");
    gt_shard_init(&s, big + 1, 8, 7);
    CHECK(s.slice_len == big / 8 + 1 && s.end == big + 1 && gt_shard_count(&s) == big + 1 - 7 * (big / 8 + 1),
          "7B+1 over 8 ranks");
}

int main(void) {
    size_t cases = 0;
    for (int W = 1; W <= 9; W++)
        for (size_t n = 0; n <= 64; n++, cases++) slices_tile_the_vector(n, W);
    printf("slices tile [0,n) once, padding is ceil(n/W)*W, n<W gives empty slices: %zu (n,W) cases\n", cases);
    intersect_examples();
    printf("intersection examples (n=10 W=4, n<W, n=0, 7B over 8 ranks)\n");
    for (int W = 1; W <= 8; W++)
        for (unsigned seed = 1; seed <= 40; seed++) pieces_cover_tensors(12, W, seed * 31 + (unsigned)W);
    printf("per-tensor pieces of all ranks cover every tensor element exactly once: 320 layouts\n");
    if (failures) {
        printf("test_shard: %d FAILURES\n", failures);
        return 1;
    }
    printf("test_shard: all passed\n");
    return 0;
}
