/*
 * cpu_rope.c — the rope family of ops.h on the CPU: rotary position embedding as Hugging Face
 * transformers computes it for LLaMA (apply_rotary_pos_emb with rotate_half). Each kernel is written
 * once over the element type and compiled for fp32 and bf16 (cpu_elem.h); the rope table is fp32 in
 * both.
 *
 * Pair (i, i + HD/2) of each head rotates by angle t * inv_freq_i. The (cos, sin) table comes
 * from the model (gt_rope_table in model.c, which follows transformers' inv_freq, llama3 scaling
 * included); this file only applies the rotation.
 */
#ifndef ELEM_F32   /* this part once; cpu_elem.h then includes the file back for the part after #else */
#include "cpu_kernels.h"

#define GT_CPU_TEMPLATE "cpu_rope.c"
#include "cpu_elem.h"

#else /* ---------------------------------------------------------------- the kernels, once per ELEM */

/* sign = +1: out = x*cos + rotate_half(x)*sin ; sign = -1: the inverse (transpose) rotation.
 * x (B, T, NH, HD); rope (T_max, HD/2, 2); out may alias inp. rope_rotate, rope_rotate_bf16 */
static void ELEM_NAME(rope_rotate)(ELEM *out, const ELEM *inp, const float *rope, const int32_t *doc, int B,
                                   int T, int NH, int HD, float sign) {
    GT_CPU_CHECK(HD % 2 == 0, "rope needs an even head dim, got %d", HD);
    int half = HD / 2;
#pragma omp parallel for schedule(static)
    for (long row = 0; row < (long)B * T * NH; row++) {
        int t = (int)((row / NH) % T);
        if (doc) t -= doc[row / NH]; /* the position inside its document (ops.h) */
        const ELEM *x = inp + (size_t)row * HD;
        ELEM *o = out + (size_t)row * HD;
        const float *cs = rope + (size_t)t * half * 2;
        for (int i = 0; i < half; i++) {
            float x1 = LD(x, i), x2 = LD(x, i + half);
            float c = cs[2 * i], si = sign * cs[2 * i + 1];
            o[i] = ST(x1 * c - x2 * si);
            o[i + half] = ST(x2 * c + x1 * si);
        }
    }
}

/* gt_cpu_rope_forward, gt_cpu_rope_forward_bf16 */
void ELEM_NAME(gt_cpu_rope_forward)(void *out, const void *inp, const float *rope, const int32_t *doc, int B, int T,
                                    int NH, int HD) {
    ELEM_NAME(rope_rotate)(out, inp, rope, doc, B, T, NH, HD, 1.0f);
}

/* gt_cpu_rope_backward, gt_cpu_rope_backward_bf16 */
void ELEM_NAME(gt_cpu_rope_backward)(void *dinp, const void *dout, const float *rope, const int32_t *doc, int B,
                                     int T, int NH, int HD) {
    ELEM_NAME(rope_rotate)(dinp, dout, rope, doc, B, T, NH, HD, -1.0f);
}

#endif
