/*
 * cuda_emu.h — a CPU emulation of the CUDA execution model, just enough to compile and run the default
 * path of the CUDA backend (src/kernels/cuda: cuda_pointwise.cu, cuda_norm.cu, cuda_rope.cu,
 * cuda_loss.cu, cuda_attention.cu, cuda_optimizer.cu, cuda_ops.cu, cuda_common.cuh) and the
 * tensor-core attention (cuda_attention_mma.cu) with the host C++ compiler, so its kernels can be
 * checked against the CPU backend on a machine without a GPU (tests/gpu.cmake:
 * cuda_kernels_emulated_match_cpu; docs/gpu.md).
 *
 * How the real sources get here: tests/gpu/emu/emulate_cu.cmake copies each .cu into the build tree
 * and rewrites, line for line, the two things C++ cannot parse or would get wrong:
 *   k<<<grid, block[, smem[, stream]]>>>(args)  ->  gt_emu_launcher(k, "k", file, line, grid, block[, ...])(args)
 *   __shared__ T a[N];                         ->  static T a[N]; gt_emu_shared(a, sizeof a);
 *   extern __shared__ T a[];                   ->  T *a = (T *)gt_emu_dynamic_shared();
 * Everything else is the kernel source as written, compiled by g++ -x c++ against this header (the
 * toolkit's host headers give bf16, int4/float4, dim3 and the runtime API's declarations).
 *
 * The model (cuda_emu.cpp): one OS thread. A launch runs its blocks one after another; the threads of
 * a block are fibers (one stack each) run in turn, each until it waits at a barrier or ends.
 * __syncthreads is a real block barrier and the warp operations (__shfl_*_sync, __syncwarp, votes) a
 * real barrier of the lanes in their mask, so the kernels' cooperation is exercised as written. Checked
 * on every block, each failure a loud abort naming the kernel, block and thread ("KERNEL BUG"):
 *   - every thread of a block passes __syncthreads the same number of times;
 *   - a warp operation's mask names only lanes that exist, have not exited and call it too (with the
 *     same mask), and includes the calling lane; no deadlock (threads waiting on ones that never come);
 *   - dynamic shared memory: no access past the bytes the launch asked for (a guard page follows them),
 *     and more than 48 KiB only after cudaFuncSetAttribute(MaxDynamicSharedMemorySize), at most 227 KiB;
 *   - device memory (cudaMalloc) ends at a guard page: a read or write past a block's end faults and is
 *     reported with the kernel's name;
 *   - device memory is PROT_NONE to host code (opened block by block, on first touch, inside a launch,
 *     cudaMemcpy/cudaMemset or gt_emu_device_begin/end): host code dereferencing a device pointer
 *     stops with "HOST CODE READ OR WROTE DEVICE MEMORY" (GT_EMU_DEVICE_PROTECT=0: not checked);
 *   - shared memory (static and dynamic) starts every block filled with 0xFF bytes (NaN floats), and
 *     cudaMalloc'd memory starts so too, so a read of something no thread wrote shows up as NaN.
 * Launch configurations are checked as the device would (threads per block, grid limits, the kernel's
 * __launch_bounds__), failing
 * through cudaGetLastError like a real launch. GT_EMU_SCHEDULE=reverse runs blocks and threads in the
 * reverse order, to expose order dependences the forward order hides; GT_EMU_SCHEDULE=warps runs a
 * block's warps one at a time, each until all its lanes wait at __syncthreads, so a missing block
 * barrier between one warp's shared-memory writes and another's reads shows (the default order moves
 * to the next warp at every warp operation, which hides it).
 *
 * Not modelled: timing, concurrency between blocks (and so races between blocks, atomics' contention),
 * the GPU memory model (every write is visible at once), the device's math (expf, logf, sqrtf and
 * double math are the host's libm; nvcc contracts a * b + c into FMAs where this build, with
 * -ffp-contract=off, does not), the tensor cores' rounding (ldmatrix, mma.sync and cp.async are
 * emulated below for cuda_attention_mma.cu, see "tensor-core PTX"),
 * cuBLASLt (tests/gpu/emu/emu_stubs.cpp stands in with a reference loop), streams (everything is
 * synchronous).
 */
#ifndef GT_CUDA_EMU_H
#define GT_CUDA_EMU_H

#ifdef __CUDACC__
#error "cuda_emu.h is for the host compiler: the emulated build never goes through nvcc"
#endif

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

/* the execution-space qualifiers are plain C++ here; __shared__ arrays are static (blocks run one at a
 * time, so one copy serves every block; the rewrite registers each for its per-block poisoning) */
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

/* ---------------------------------------------------------------- built-in variables */

/* set by the scheduler each time it resumes a thread (calls into cuda_emu.cpp are opaque, so the
 * compiler reloads them after every barrier) */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

/* ---------------------------------------------------------------- barriers and warp operations */

void gt_emu_syncthreads(void);
#define __syncthreads() gt_emu_syncthreads()

/* the calling lane (0..31) of its warp, from the thread's linear index in the block */
int gt_emu_lane(void);
/* a barrier of the lanes in mask: each deposits 8 bytes; returns the 32 slots of this meeting (lanes
 * outside the mask undefined), valid until the caller's next warp operation */
const uint64_t *gt_emu_warp_meet(unsigned mask, uint64_t bits, const char *what);

template <typename T>
static inline uint64_t gt_emu_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <typename T>
static inline T gt_emu_from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}

template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const int lane = gt_emu_lane(), seg = lane & ~(width - 1);
    const uint64_t *all = gt_emu_warp_meet(mask, gt_emu_bits(v), "__shfl_sync");
    return gt_emu_from_bits<T>(all[seg + (src & (width - 1))]);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = gt_emu_lane(), seg = lane & ~(width - 1);
    int src = lane ^ lane_mask;
    if ((src & ~(width - 1)) != seg) src = lane; /* outside the lane's segment: its own value */
    const uint64_t *all = gt_emu_warp_meet(mask, gt_emu_bits(v), "__shfl_xor_sync");
    return gt_emu_from_bits<T>(all[src]);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = gt_emu_lane(), seg = lane & ~(width - 1);
    int src = lane + (int)delta;
    if (src >= seg + width) src = lane;
    const uint64_t *all = gt_emu_warp_meet(mask, gt_emu_bits(v), "__shfl_down_sync");
    return gt_emu_from_bits<T>(all[src]);
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = gt_emu_lane(), seg = lane & ~(width - 1);
    int src = lane - (int)delta;
    if (src < seg) src = lane;
    const uint64_t *all = gt_emu_warp_meet(mask, gt_emu_bits(v), "__shfl_up_sync");
    return gt_emu_from_bits<T>(all[src]);
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    const uint64_t *all = gt_emu_warp_meet(mask, pred != 0, "__ballot_sync");
    unsigned r = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1u) && all[l]) r |= 1u << l;
    return r;
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)gt_emu_warp_meet(mask, 0, "__syncwarp"); }

/* ---------------------------------------------------------------- atomics (one OS thread: plain) */

static inline int atomicCAS(int *a, int cmp, int v) { int o = *a; if (o == cmp) *a = v; return o; }
static inline unsigned atomicCAS(unsigned *a, unsigned cmp, unsigned v) { unsigned o = *a; if (o == cmp) *a = v; return o; }
static inline unsigned long long atomicCAS(unsigned long long *a, unsigned long long cmp, unsigned long long v) {
    unsigned long long o = *a;
    if (o == cmp) *a = v;
    return o;
}
template <typename T> static inline T atomicAdd(T *a, T v) { T o = *a; *a = o + v; return o; }
template <typename T> static inline T atomicExch(T *a, T v) { T o = *a; *a = v; return o; }
template <typename T> static inline T atomicMax(T *a, T v) { T o = *a; if (v > o) *a = v; return o; }
template <typename T> static inline T atomicMin(T *a, T v) { T o = *a; if (v < o) *a = v; return o; }

/* ---------------------------------------------------------------- intrinsics */

/* the _rn forms are single IEEE operations; this build has -ffp-contract=off, so none fuses */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
/* the fast approximations: the host's exact forms (the device's error bounds are not modelled) */
/* glibc declares __expf and __logf itself (its internal names): macros, after <math.h> */
#define __expf(a) expf(a)
#define __logf(a) logf(a)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
static inline int __float_as_int(float a) { return gt_emu_from_bits<int>(gt_emu_bits(a)); }
static inline float __int_as_float(int a) { return gt_emu_from_bits<float>(gt_emu_bits(a)); }
static inline unsigned __float_as_uint(float a) { return gt_emu_from_bits<unsigned>(gt_emu_bits(a)); }
static inline float __uint_as_float(unsigned a) { return gt_emu_from_bits<float>(gt_emu_bits(a)); }
template <typename T> static inline T __ldg(const T *p) { return *p; }

/* the device's integer min/max overloads */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

/* ---------------------------------------------------------------- shared memory */

/* a __shared__ array's first declaration reached in a block fills it with 0xFF and counts its bytes */
void gt_emu_shared(void *p, size_t bytes);
/* the launch's dynamic shared memory (followed by a guard page; 0xFF at every block's start) */
void *gt_emu_dynamic_shared(void);

/* ---------------------------------------------------------------- tensor-core PTX (include/cuda_ptx.cuh) */

/* What cuda_attention_mma.cu's inline PTX does, for include/cuda_ptx.cuh's stand-ins of its wrappers (the PTX ISA:
 * "ldmatrix", "Matrix Fragments for mma.m16n8k16 with floating point type", "cp.async"). Each is
 * checked as the hardware requires, failures a KERNEL BUG:
 *   ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: warp-collective, all 32 lanes (mask 0xffffffff,
 *     every lane at the same instruction); lane l gives the address of row l % 8 of matrix l / 8, a
 *     16-byte aligned row of 16 bytes in this block's shared memory; register i of lane l receives row
 *     l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i (lower column in the low half), with .trans
 *     rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4;
 *   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d = c in place: warp-collective as ldmatrix;
 *     the A, B and C/D fragments as the ISA tables (cuda_attention_mma.cu's header quotes them). The
 *     products of bf16 are exact in fp32; each output is c plus its 16 products added one at a time in
 *     k order, rounding to nearest fp32 after each add (the hardware's internal order and rounding are
 *     not specified: a choice, not a model of the tensor core);
 *   cp.async (size 16 .cg or 4 .ca, src_bytes 0..size; the rest of the size zero-filled): dst in this
 *     block's shared memory and src in cudaMalloc'd memory, both aligned to size. A copy is queued on
 *     the issuing thread; commit_group closes its open copies into a group; wait_group N performs that
 *     thread's groups but the newest N (reading the source then), so shared memory read before the
 *     wait still holds the poison (0xFF: NaN) and a thread that ends with copies not waited for is a
 *     bug. GT_EMU_CP_ASYNC=eager instead performs each copy at issue, the earliest a GPU may land it
 *     (the _reverse_schedule test runs so): a stage overwritten while other warps still read it, for
 *     want of a barrier, then shows. */
void gt_emu_ldmatrix_x4(uint32_t r[4], const void *p, int trans);
void gt_emu_mma_m16n8k16_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
void gt_emu_cp_async(void *dst, const void *src, int size, int src_bytes);
void gt_emu_cp_async_commit(void);
void gt_emu_cp_async_wait(int newest_pending);

/* ---------------------------------------------------------------- device memory */

/* device memory (cudaMalloc) is inaccessible to host code except between these (nested; launches and
 * cudaMemcpy/cudaMemset call them): host code that stands in for a device library (emu_stubs.cpp's
 * cuBLASLt matmul) brackets its loops with them */
void gt_emu_device_begin(void);
void gt_emu_device_end(void);

/* ---------------------------------------------------------------- launches */

/* a kernel's __launch_bounds__ (registered by the rewrite, by name without template arguments): a
 * launch with more threads per block fails, as it would on the device; returns bound */
int gt_emu_launch_bounds(const char *kernel_name, int bound);

typedef void (*gt_emu_thunk)(void *data);
void gt_emu_run(const char *name, const char *file, int line, const void *kernel, dim3 grid, dim3 block, size_t smem,
                gt_emu_thunk thunk, void *data);

/* k<<<grid, block, smem, stream>>>(args) becomes gt_emu_launcher(k, ...)(args): the arguments are
 * converted to the kernel's parameter types once, as a launch does, and every thread gets a copy */
template <typename... P>
struct gt_emu_launch {
    void (*kernel)(P...);
    const char *name, *file;
    int line;
    dim3 grid, block;
    size_t smem;

    template <typename... A>
    void operator()(A &&...a) const {
        struct data_t {
            void (*kernel)(P...);
            std::tuple<typename std::decay<P>::type...> args;
        };
        data_t d{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)};
        gt_emu_run(name, file, line, (const void *)kernel, grid, block, smem,
                   [](void *p) {
                       data_t *dd = (data_t *)p;
                       std::tuple<typename std::decay<P>::type...> args = dd->args; /* this thread's copy */
                       std::apply(dd->kernel, args);
                   },
                   &d);
    }
};

template <typename... P>
static inline gt_emu_launch<P...> gt_emu_launcher(void (*kernel)(P...), const char *name, const char *file, int line,
                                                  dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0) {
    (void)stream; /* one stream: everything is ordered and synchronous */
    return gt_emu_launch<P...>{kernel, name, file, line, grid, block, smem};
}

/* ---------------------------------------------------------------- the runtime's C++ overloads */

template <typename T>
static inline cudaError_t cudaMalloc(T **p, size_t bytes) {
    return cudaMalloc((void **)p, bytes);
}
template <typename T>
static inline cudaError_t cudaMemcpyToSymbol(const T &symbol, const void *src, size_t count, size_t offset = 0,
                                             cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
    return cudaMemcpyToSymbol((const void *)&symbol, src, count, offset, kind);
}
template <typename T>
static inline cudaError_t cudaMemcpyFromSymbol(void *dst, const T &symbol, size_t count, size_t offset = 0,
                                               cudaMemcpyKind kind = cudaMemcpyDeviceToHost) {
    return cudaMemcpyFromSymbol(dst, (const void *)&symbol, count, offset, kind);
}
template <typename T>
static inline cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)entry, attr, value);
}

#endif
