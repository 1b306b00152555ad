/*
 * emu_wmma.h — the CPU emulation's nvcuda::wmma, as much of it as cuda_attention_wmma.cu uses (that
 * file includes this in place of <mma.h> under GT_CUDA_EMULATED; nvcc never sees it): 16x16x16
 * fragments of bf16 (matrix_a / matrix_b, row_major or col_major) and of float (accumulator),
 * fill_fragment, load_matrix_sync, store_matrix_sync and mma_sync with the documented signatures. The
 * work and the checks are cuda_emu.cpp's gt_emu_wmma_* (cuda_emu.h says the layout and what is checked).
 */
#ifndef GT_EMU_WMMA_H
#define GT_EMU_WMMA_H

#include "cuda_emu.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16x16x16 shape only");
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, float>::value,
                  "the emulation has bf16 and float fragments only");
    static_assert(std::is_same<Use, accumulator>::value == std::is_same<Layout, void>::value,
                  "matrix_a/b fragments name a layout, accumulators do not");
    typedef T element_type;
    typedef T storage_element_type;
    enum { num_elements = GT_EMU_WMMA_PER_LANE };
    T x[GT_EMU_WMMA_PER_LANE];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
static inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, const T &v) {
    gt_emu_wmma_fill(f.x, gt_emu_bits(v), (int)sizeof(T));
}

/* matrix_a / matrix_b: the layout is the fragment's */
template <typename Use, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f, const __nv_bfloat16 *p,
                                    unsigned ldm) {
    static_assert(!std::is_same<Layout, void>::value, "an accumulator's load names its memory layout");
    gt_emu_wmma_load(f.x, p, ldm, 2, std::is_same<Layout, col_major>::value);
}
/* the accumulator: the layout is the call's */
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t layout) {
    gt_emu_wmma_load(f.x, p, ldm, 4, layout == mem_col_major);
}
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                                     layout_t layout) {
    gt_emu_wmma_store(p, f.x, ldm, 4, layout == mem_col_major);
}

template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
    static_assert(sizeof(__nv_bfloat16) == sizeof(uint16_t), "bf16 is 16 bits");
    gt_emu_wmma_mma_bf16(d.x, (const uint16_t *)a.x, (const uint16_t *)b.x, c.x);
}

} /* namespace wmma */
} /* namespace nvcuda */

#endif
