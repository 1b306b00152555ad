/* mfu.h — the peak that model FLOPs utilisation (MFU) is measured against.
 *
 * MFU = model FLOPs of a step / step time / peak FLOP/s. The model FLOPs are the planner's
 * (planner.c, forward_flops): 2 per multiply-add of every matmul of the blocks and the LM head, the
 * input embedding left out, causal attention counted as half of the T x T square (QK^T and PV over
 * the T(T+1)/2 pairs a causal mask keeps, the convention Megatron-LM and MaxText use), times 3 for
 * forward and backward; a recompute's extra forward is not counted (it is not model work).
 *
 * The peak is the GPU's dense (no 2:4 sparsity) tensor-core bf16 rate, or its fp32 rate for
 * train.precision = fp32, from NVIDIA's datasheets, by the name the CUDA runtime reports
 * (cudaDeviceProp.name); train.peak_tflops, when set, replaces it (and is the only way to get an
 * MFU on the CPU).
 */
#ifndef GT_MFU_H
#define GT_MFU_H

#include <stddef.h>

/* The dense peak in FLOP/s of the GPU named `device_name` (e.g. "NVIDIA H100 80GB HBM3"), for bf16
 * (1) or fp32 (0) math; 0 when the name is not in the table. `which` (may be NULL) gets the table
 * row's name. */
double gt_gpu_peak_flops(const char *device_name, int bf16, char *which, size_t which_len);

#endif
