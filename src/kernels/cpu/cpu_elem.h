/*
 * cpu_elem.h — compiles a kernel file once per element type of the working tensors: fp32 (the table
 * of ops_cpu.c) and bf16 (the bf16 table, same file). Each layer is one kernel written once, so the
 * two tables cannot drift apart.
 *
 * A kernel file (cpu_pointwise.c, cpu_norm.c, cpu_rope.c, cpu_attention.c, cpu_loss.c) is in two
 * parts: what does not depend on the element type (includes, constants, float-only helpers), compiled
 * once, then, after `#else`, the kernels. Its first part defines GT_CPU_TEMPLATE as the file's own name and includes
 * this header, which includes the file back twice, each time with these set:
 *   ELEM          float             | uint16_t (the bits of a bf16)
 *   LD(p, i)      p[i]              | gt_bf16_to_f32(p[i])     element i of p, as a float
 *   ST(x)         x                 | gt_f32_to_bf16(x)        a float as an element (nearest, ties even)
 *   ELEM_NAME(f)  f                 | f##_bf16                 names: gt_cpu_X and gt_cpu_X_bf16
 *                                                              (a comment above each kernel names both)
 *   ELEM_F32      1                 | 0                        where the two differ (the products)
 * All the math is fp32 in both passes: in the fp32 pass LD and ST are the identity, so its loops are
 * plain float loops the compiler vectorises as before; the bf16 pass adds one conversion per load and
 * one rounding per store.
 */
#ifndef GT_CPU_TEMPLATE
#error "define GT_CPU_TEMPLATE as the kernel file to instantiate before including cpu_elem.h"
#endif

#define ELEM float
#define LD(p, i) ((p)[i])
#define ST(x) (x)
#define ELEM_NAME(f) f
#define ELEM_F32 1
#include GT_CPU_TEMPLATE
#undef ELEM
#undef LD
#undef ST
#undef ELEM_NAME
#undef ELEM_F32

#define ELEM uint16_t
#define LD(p, i) gt_bf16_to_f32((p)[i])
#define ST(x) gt_f32_to_bf16(x)
#define ELEM_NAME(f) f##_bf16
#define ELEM_F32 0
#include GT_CPU_TEMPLATE
#undef ELEM
#undef LD
#undef ST
#undef ELEM_NAME
#undef ELEM_F32
