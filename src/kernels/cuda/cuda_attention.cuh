/*
 * cuda_attention.cuh — private to src/kernels/cuda/: how the attention implementations meet.
 *
 * cuda_attention.cu owns the ops table's attention_forward / attention_backward, the default kernels
 * (fp32 CUDA-core, deterministic, every head size up to 128) and the choice of variant. The opt-in bf16
 * variants, chosen with the config key train.cuda_attention (ops.h's gt_cuda_attention), each offer a forward and a backward that return 1 when
 * they ran the call and 0 when it is not one they take; the default kernels then run it. All of them
 * share the lse layout (B, NH, T) and the dropout of ops.h, so any forward pairs with any backward.
 */
#ifndef GT_CUDA_ATTENTION_CUH
#define GT_CUDA_ATTENTION_CUH

#include "cuda_common.cuh"

/* The variant the attention entries run: the one gt_ops_cuda was given (the config's
 * train.cuda_attention, ops.h's gt_cuda_attention), unless a test forced one. */
gt_cuda_attention gt_cuda_attention_variant(void);

/* Tests: force the variant by its train.cuda_attention name ("default", "mma", "cudnn"), or go back
 * to the one gt_ops_cuda was given (NULL). */
extern "C" void gt_cuda_attention_force_variant(const char *name);

/* D (B, NH, T) fp32 = rowsum(dout * out) over HD, the backward's first kernel in every variant that
 * takes D from the forward output; dout and out (B, T, NH, HD) in bf16 (bf16_io) or fp32 */
void gt_cuda_attention_rowdot(float *D, const void *dout, const void *out, int B, int Tn, int NH, int HD, int bf16_io);

/* The variants' entries, called for the bf16 working type after the shape checks (NH % NKV == 0,
 * B > 0, T > 0): 1 when they ran the call, 0 to leave it to the default kernels. */
int gt_cuda_attention_mma_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int Tn,
                                  int NH, int NKV, int HD, float dropout, gt_rng_key key);
int gt_cuda_attention_mma_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *q,
                                   const void *k, const void *v, const float *lse, int B, int Tn, int NH, int NKV,
                                   int HD, float dropout, gt_rng_key key);
int gt_cuda_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int Tn,
                                    int NH, int NKV, int HD, float dropout);
int gt_cuda_attention_cudnn_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *q,
                                     const void *k, const void *v, const float *lse, int B, int Tn, int NH, int NKV,
                                     int HD, float dropout);

#endif
