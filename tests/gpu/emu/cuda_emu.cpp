/*
 * cuda_emu.cpp — the scheduler, checks and runtime API of the CPU emulation (see cuda_emu.h for the
 * model and what it checks).
 *
 * Threads of a block are ucontext fibers, each on its own stack (256 KiB, a guard page below), run in
 * turn by a round-robin scheduler: a thread runs until it waits at a barrier (then it yields) or ends.
 * A barrier is a generation counter: the last thread to arrive advances it and goes on; the others
 * yield until they see it advanced. A round in which no thread arrived anywhere or ended, with threads
 * left, is a deadlock. Single OS thread throughout, so the bookkeeping needs no locks.
 *
 * Switching fibers: on x86-64 a few instructions of our own (gt_emu_ctx_switch: the callee-saved
 * registers and the stack pointer), since swapcontext also saves and restores the signal mask, a
 * system call each time, which made the trainer's test (thousands of blocks per step) ten times
 * slower; elsewhere, and under AddressSanitizer (which follows swapcontext only), ucontext.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "cuda_emu.h"

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define GT_EMU_FAST_SWITCH 1
/* gt_emu_ctx_switch(&save, to): pushes the System V callee-saved registers, stores the stack pointer
 * in save, switches to the stack `to` and pops them there; a new fiber's stack is laid out so that
 * this "returns" into fiber_main (run_block) */
extern "C" void gt_emu_ctx_switch(void **save, void *to);
asm(".text\n"
    ".globl gt_emu_ctx_switch\n"
    ".type gt_emu_ctx_switch,@function\n"
    "gt_emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size gt_emu_ctx_switch, .-gt_emu_ctx_switch\n");
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

constexpr int MAX_THREADS = 1024;
constexpr size_t STACK_BYTES = (size_t)256 << 10;
constexpr size_t SMEM_DEFAULT = (size_t)48 << 10;   /* dynamic shared memory without the attribute */
constexpr size_t SMEM_OPTIN_MAX = 232448;           /* sm_90 (H100/H200): 227 KiB per block */
constexpr size_t SMEM_STATIC_MAX = (size_t)48 << 10;

/* a cp.async queued by a thread (gt_emu_cp_async), performed at its cp.async.wait_group */
struct cp_copy {
    char *dst;
    const char *src;
    int size, src_bytes;
};

struct fiber {
    ucontext_t ctx;
    void *sp; /* GT_EMU_FAST_SWITCH: the saved stack pointer */
    uint3 tid;
    int linear;
    bool done;
    int waiting; /* 0 running, 1 at __syncthreads, 2 at a warp operation */
    unsigned long syncs;
    std::vector<cp_copy> cp_open;                 /* issued since the last commit_group */
    std::vector<std::vector<cp_copy>> cp_groups;  /* committed, not yet waited for: oldest first */
};

struct warp_state {
    unsigned gen, arrived, mask, exited;
    const char *what;
    uint64_t vals[2][32];
};

struct block_state {
    const char *name, *file;
    int line;
    gt_emu_thunk thunk;
    void *data;
    int nthreads, live;
    unsigned bar_gen;
    int bar_arrived;
    unsigned long progress;
    fiber *cur;
    warp_state warps[MAX_THREADS / 32];
    std::vector<void *> shared_seen;
    std::vector<size_t> shared_seen_bytes;
    size_t static_smem;
    char *dyn;
    size_t dyn_bytes;
    bool in_kernel;
};

block_state B;
fiber g_fibers[MAX_THREADS];
char *g_stacks;
size_t g_page;
ucontext_t g_sched;
void *g_sched_sp;
char *g_dyn_region; /* SMEM_OPTIN_MAX rounded to pages, then a guard page */
size_t g_dyn_region_bytes;
cudaError_t g_last_error = cudaSuccess;
std::map<const void *, int> g_smem_attr;
/* __launch_bounds__ by kernel name; built on first use: the registrations run during the static
 * initialisation of the other files */
std::map<std::string, int> &bounds(void) {
    static std::map<std::string, int> m;
    return m;
}
struct device_block {
    char *map;
    size_t map_bytes, bytes;
};
std::map<void *, device_block> g_device; /* cudaMalloc'd blocks */
size_t g_device_bytes;

/* Device memory is closed to host code: every cudaMalloc block is PROT_NONE except while the device
 * side runs (a launch, cudaMemcpy/cudaMemset, the cuBLASLt stand-in: gt_emu_device_begin/end). There a
 * first touch of a block faults once and on_segv opens that block, which closes again when the
 * device side is done; a fault on a block outside it is host code dereferencing a device pointer, which
 * a GPU's host would not survive either, and is reported as such. GT_EMU_DEVICE_PROTECT=0 turns it off
 * (then device memory is ordinary host memory, as before). */
constexpr int MAX_OPENED = 1 << 14;
int g_protect = -1;
/* volatile, and a compiler barrier around the memcpy/memset they bracket: the signal handler reads
 * them, and the compiler knows memset touches nothing else, so it could move or cancel the updates */
volatile int g_device_depth;
char *g_opened[MAX_OPENED];
size_t g_opened_bytes[MAX_OPENED];
volatile int g_n_opened;

bool protect_device(void) {
    if (g_protect < 0) {
        const char *e = getenv("GT_EMU_DEVICE_PROTECT");
        g_protect = !(e && strcmp(e, "0") == 0);
    }
    return g_protect;
}

/* the block whose pages (the guard page excluded) hold addr, or NULL; no allocation (signal handler) */
const std::pair<void *const, device_block> *device_block_at(const char *addr) {
    auto it = g_device.upper_bound((void *)addr);
    /* addr may lie in the page before the next block's start (blocks end at their guard page) */
    if (it != g_device.end() && addr >= it->second.map && addr < it->second.map + it->second.map_bytes) return &*it;
    if (it == g_device.begin()) return NULL;
    --it;
    if (addr >= it->second.map && addr < it->second.map + it->second.map_bytes) return &*it;
    return NULL;
}
int g_reverse = -1;
int g_cp_eager = -1;

/* GT_EMU_CP_ASYNC=eager: cp.async lands at issue (the earliest a GPU may land it) instead of at the
 * thread's wait_group (the latest): a kernel that overwrites a stage other warps still read, or reads
 * one before a barrier orders the copy, then sees the new bytes too early */
bool cp_async_eager(void) {
    if (g_cp_eager < 0) {
        const char *e = getenv("GT_EMU_CP_ASYNC");
        g_cp_eager = e && strcmp(e, "eager") == 0;
    }
    return g_cp_eager;
}

int g_warp_first = -1;

bool reverse_order(void) {
    if (g_reverse < 0) {
        const char *e = getenv("GT_EMU_SCHEDULE");
        g_reverse = e && strcmp(e, "reverse") == 0;
    }
    return g_reverse;
}

/* GT_EMU_SCHEDULE=warps: a block's warps one at a time, each run until all its lanes wait at
 * __syncthreads (or have ended), as if the other warps were stalled. The lane-by-lane order moves on to
 * the next warp whenever a lane waits at a warp operation, so a warp reading shared memory that other
 * warps write, with no block barrier between, usually finds it written anyway; here it finds the poison */
bool warp_first_order(void) {
    if (g_warp_first < 0) {
        const char *e = getenv("GT_EMU_SCHEDULE");
        g_warp_first = e && strcmp(e, "warps") == 0;
    }
    return g_warp_first;
}

void where(FILE *f) {
    if (!B.in_kernel) return;
    fprintf(f, "gtrain-emu:   in kernel %s (launched at %s:%d), block (%u,%u,%u) of (%u,%u,%u)", B.name, B.file, B.line,
            blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z);
    if (B.cur) fprintf(f, ", thread (%u,%u,%u) of (%u,%u,%u)", B.cur->tid.x, B.cur->tid.y, B.cur->tid.z, blockDim.x,
                       blockDim.y, blockDim.z);
    fputc('\n', f);
}

/* a bug in the kernel (or in how it is launched) that a GPU would turn into a hang, a wrong result
 * or undefined behaviour: say so and stop */
[[noreturn]] void kernel_bug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kernel_bug(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gtrain-emu: KERNEL BUG: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    where(stderr);
    fflush(stderr);
    abort();
}

void *map_guarded(size_t bytes, char **map_out, size_t *map_bytes_out) {
    /* bytes rounded up to pages, then one inaccessible page; the block ends right at the guard */
    const size_t body = (bytes + g_page - 1) / g_page * g_page;
    char *m = (char *)mmap(NULL, body + g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return NULL;
    if (mprotect(m + body, g_page, PROT_NONE) != 0) abort();
    *map_out = m;
    *map_bytes_out = body + g_page;
    return m + body;
}

void on_segv(int sig, siginfo_t *si, void *) {
    const char *addr = (const char *)si->si_addr;
    if (sig == SIGSEGV && protect_device()) {
        const std::pair<void *const, device_block> *d = device_block_at(addr);
        if (d && g_device_depth > 0 && g_n_opened < MAX_OPENED &&
            mprotect(d->second.map, d->second.map_bytes, PROT_READ | PROT_WRITE) == 0) {
            g_opened[g_n_opened] = d->second.map;
            g_opened_bytes[g_n_opened++] = d->second.map_bytes;
            return; /* the access runs again, now allowed */
        }
        if (d && g_device_depth == 0) {
            fprintf(stderr, "gtrain-emu: HOST CODE READ OR WROTE DEVICE MEMORY: address %p, in the %zu-byte cudaMalloc "
                            "block at %p (a GPU's host cannot dereference device pointers: use cudaMemcpy)\n",
                    si->si_addr, d->second.bytes, d->first);
            fflush(stderr);
            signal(SIGABRT, SIG_DFL);
            abort();
        }
    }
    fprintf(stderr, "gtrain-emu: %s at address %p", sig == SIGSEGV ? "segmentation fault" : "bus error", si->si_addr);
    if (B.in_kernel && B.dyn && addr >= B.dyn && addr < g_dyn_region + g_dyn_region_bytes + g_page)
        fprintf(stderr, ": KERNEL BUG: past the end of the %zu bytes of dynamic shared memory the launch asked for",
                B.dyn_bytes);
    else if (B.in_kernel && addr >= g_stacks && addr < g_stacks + MAX_THREADS * (STACK_BYTES + g_page))
        fprintf(stderr, ": a thread's stack overflowed (%zu KiB each)", STACK_BYTES >> 10);
    else
        for (auto &kv : g_device) {
            const device_block &d = kv.second;
            if (addr >= d.map && addr < d.map + d.map_bytes + g_page) {
                fprintf(stderr, ": KERNEL BUG: past the end of a %zu-byte cudaMalloc block at %p", d.bytes, kv.first);
                break;
            }
        }
    fputc('\n', stderr);
    where(stderr);
    fflush(stderr);
    signal(SIGABRT, SIG_DFL);
    abort();
}

void init_once(void) {
    if (g_stacks) return;
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t per = STACK_BYTES + g_page;
    g_stacks = (char *)mmap(NULL, per * MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                            -1, 0);
    if (g_stacks == MAP_FAILED) {
        perror("gtrain-emu: mmap of the fiber stacks");
        abort();
    }
    for (int i = 0; i < MAX_THREADS; i++) mprotect(g_stacks + per * i, g_page, PROT_NONE); /* below each stack */
    char *m;
    size_t mb;
    char *end = (char *)map_guarded(SMEM_OPTIN_MAX, &m, &mb);
    if (!end) abort();
    g_dyn_region = m;
    g_dyn_region_bytes = mb - g_page;
    /* faults inside a fiber (or of a stack overflow) need their own stack for the handler */
    static char alt[1 << 16];
    stack_t ss;
    ss.ss_sp = alt;
    ss.ss_size = sizeof alt;
    ss.ss_flags = 0;
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}

/* from the running fiber to the scheduler (run_block), and back */
void to_scheduler(fiber *f) {
#ifdef GT_EMU_FAST_SWITCH
    gt_emu_ctx_switch(&f->sp, g_sched_sp);
#else
    swapcontext(&f->ctx, &g_sched);
#endif
}
void to_fiber(fiber *f) {
#ifdef GT_EMU_FAST_SWITCH
    gt_emu_ctx_switch(&g_sched_sp, f->sp);
#else
    swapcontext(&g_sched, &f->ctx);
#endif
}

void yield(void) { to_scheduler(B.cur); }

void release_block_barrier_if_complete(void) {
    if (B.bar_arrived > 0 && B.bar_arrived == B.live) {
        B.bar_arrived = 0;
        B.bar_gen++;
    }
}

void fiber_main(void) {
    B.thunk(B.data);
    fiber *f = B.cur;
    if (!f->cp_open.empty() || !f->cp_groups.empty())
        kernel_bug("a thread ended with cp.async copies it never waited for (%zu uncommitted, %zu groups): their "
                   "shared-memory writes land at an unknown time",
                   f->cp_open.size(), f->cp_groups.size());
    f->done = true;
    B.live--;
    B.progress++;
    warp_state &w = B.warps[f->linear >> 5];
    const unsigned bit = 1u << (f->linear & 31);
    w.exited |= bit;
    if (w.arrived && (w.mask & bit))
        kernel_bug("a thread ended while other lanes of its warp wait for it at %s (mask 0x%08x)", w.what, w.mask);
    /* as the hardware does, a barrier counts the threads still running; the block's end check below
     * reports that the counts differ */
    release_block_barrier_if_complete();
    to_scheduler(f);
    abort(); /* never resumed */
}

void run_block(void) {
    const int n = B.nthreads;
    const size_t per = STACK_BYTES + g_page;
    B.live = n;
    B.bar_gen = 0;
    B.bar_arrived = 0;
    B.shared_seen.clear();
    B.shared_seen_bytes.clear();
    B.static_smem = 0;
    memset(B.warps, 0, sizeof B.warps);
    if (B.dyn_bytes) memset(B.dyn, 0xFF, B.dyn_bytes);
    for (int i = 0; i < n; i++) {
        fiber &f = g_fibers[i];
        f.linear = i;
        f.tid.x = (unsigned)i % blockDim.x;
        f.tid.y = (unsigned)i / blockDim.x % blockDim.y;
        f.tid.z = (unsigned)i / (blockDim.x * blockDim.y);
        f.done = false;
        f.waiting = 0;
        f.syncs = 0;
        f.cp_open.clear();
        f.cp_groups.clear();
#ifdef GT_EMU_FAST_SWITCH
        /* the stack's top (16-byte aligned): a null return address for fiber_main (it never
         * returns; entered with rsp = 8 mod 16, as after a call), the entry for the switch's ret, then
         * the six callee-saved registers it pops (zero) */
        void **top = (void **)(g_stacks + per * i + g_page + STACK_BYTES);
        top[-1] = NULL;
        top[-2] = (void *)fiber_main;
        for (int r = 3; r <= 8; r++) top[-r] = NULL;
        f.sp = top - 8;
#else
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = g_stacks + per * i + g_page;
        f.ctx.uc_stack.ss_size = STACK_BYTES;
        f.ctx.uc_link = &g_sched;
        makecontext(&f.ctx, fiber_main, 0);
#endif
    }
    const bool rev = reverse_order();
    while (B.live > 0) {
        const unsigned long before = B.progress;
        if (warp_first_order()) {
            for (int w0 = 0; w0 < n; w0 += 32) {
                const int w1 = w0 + 32 < n ? w0 + 32 : n;
                unsigned long seen;
                do { /* until none of the warp's lanes gets further */
                    seen = B.progress;
                    for (int k = w0; k < w1; k++) {
                        fiber &f = g_fibers[k];
                        if (f.done) continue;
                        B.cur = &f;
                        threadIdx = f.tid;
                        to_fiber(&f);
                    }
                } while (B.progress != seen);
            }
        } else {
            for (int k = 0; k < n; k++) {
                fiber &f = g_fibers[rev ? n - 1 - k : k];
                if (f.done) continue;
                B.cur = &f;
                threadIdx = f.tid;
                to_fiber(&f);
            }
        }
        B.cur = NULL;
        if (B.live > 0 && B.progress == before) {
            fprintf(stderr, "gtrain-emu: KERNEL BUG: deadlock: %d of %d threads wait and none can go on\n", B.live, n);
            for (int i = 0; i < n && i < 4096; i++)
                if (!g_fibers[i].done)
                    fprintf(stderr, "gtrain-emu:   thread %d waits at %s (%lu __syncthreads passed)\n", i,
                            g_fibers[i].waiting == 1 ? "__syncthreads" : B.warps[i >> 5].what ? B.warps[i >> 5].what : "?",
                            g_fibers[i].syncs);
            where(stderr);
            abort();
        }
    }
    for (int i = 1; i < n; i++)
        if (g_fibers[i].syncs != g_fibers[0].syncs) {
            B.cur = &g_fibers[i];
            kernel_bug("threads of one block passed __syncthreads different numbers of times: thread 0 %lu times, "
                       "thread %d %lu times",
                       g_fibers[0].syncs, i, g_fibers[i].syncs);
        }
    if (B.static_smem > SMEM_STATIC_MAX)
        kernel_bug("%zu bytes of static shared memory (at most %zu)", B.static_smem, SMEM_STATIC_MAX);
    if (B.static_smem + B.dyn_bytes > SMEM_OPTIN_MAX)
        kernel_bug("%zu bytes of static and %zu of dynamic shared memory: more than the %zu a block may have",
                   B.static_smem, B.dyn_bytes, SMEM_OPTIN_MAX);
}

void launch_error(cudaError_t err, const char *name, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void launch_error(cudaError_t err, const char *name, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gtrain-emu: the launch of %s at %s:%d fails: ", name, file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    g_last_error = err;
}

/* the tensor-core instructions' names (their meetings must not mix with other warp operations) */
const char *const LDMATRIX = "ldmatrix.sync.aligned.m8n8.x4.shared.b16";
const char *const LDMATRIX_T = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16";
const char *const MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
bool is_tensor_op(const char *what) { return what == LDMATRIX || what == LDMATRIX_T || what == MMA; }

/* n bytes at p lie in this block's shared memory (dynamic, or one static __shared__ array) */
bool in_shared(const void *p, size_t n) {
    const char *c = (const char *)p;
    if (B.dyn && c >= B.dyn && c + n <= B.dyn + B.dyn_bytes) return true;
    for (size_t i = 0; i < B.shared_seen.size(); i++) {
        const char *a = (const char *)B.shared_seen[i];
        if (c >= a && c + n <= a + B.shared_seen_bytes[i]) return true;
    }
    return false;
}

float bf16_bits_to_float(uint32_t h) { return gt_emu_from_bits<float>((uint64_t)(h & 0xffffu) << 16); }

} /* namespace */

/* ---------------------------------------------------------------- device-side entry points */

void gt_emu_device_begin(void) {
    g_device_depth = g_device_depth + 1;
    asm volatile("" ::: "memory");
}

void gt_emu_device_end(void) {
    asm volatile("" ::: "memory");
    g_device_depth = g_device_depth - 1;
    if (g_device_depth > 0) return;
    for (int i = 0; i < g_n_opened; i++)
        if (mprotect(g_opened[i], g_opened_bytes[i], PROT_NONE) != 0) abort();
    g_n_opened = 0;
}

void gt_emu_syncthreads(void) {
    fiber *f = B.cur;
    if (!f) kernel_bug("__syncthreads outside a kernel");
    f->syncs++;
    B.progress++;
    const unsigned gen = B.bar_gen;
    if (++B.bar_arrived == B.live) {
        B.bar_arrived = 0;
        B.bar_gen++;
        return;
    }
    f->waiting = 1;
    while (B.bar_gen == gen) yield();
    f->waiting = 0;
}

int gt_emu_lane(void) { return B.cur->linear & 31; }

const uint64_t *gt_emu_warp_meet(unsigned mask, uint64_t bits, const char *what) {
    fiber *f = B.cur;
    if (!f) kernel_bug("%s outside a kernel", what);
    const int wi = f->linear >> 5, lane = f->linear & 31;
    warp_state &w = B.warps[wi];
    const int in_warp = B.nthreads - wi * 32 < 32 ? B.nthreads - wi * 32 : 32;
    const unsigned exist = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1u;
    if (!(mask >> lane & 1u)) kernel_bug("%s with mask 0x%08x by lane %d, which is not in it", what, mask, lane);
    if (mask & ~exist)
        kernel_bug("%s with mask 0x%08x in a warp of %d threads (block of %d): lanes that do not exist", what, mask,
                   in_warp, B.nthreads);
    if (mask & w.exited)
        kernel_bug("%s with mask 0x%08x names lanes that have already ended (0x%08x)", what, mask, mask & w.exited);
    if (w.arrived == 0) {
        w.mask = mask;
        w.what = what;
    } else if (w.mask != mask) {
        kernel_bug("lanes of one warp meet with different masks: 0x%08x (%s) and 0x%08x (%s)", w.mask, w.what, mask, what);
    } else if (w.what != what && (is_tensor_op(w.what) || is_tensor_op(what))) {
        /* the shuffles may meet from different call sites; an ldmatrix or mma only with itself */
        kernel_bug("lanes of one warp at different warp-collective instructions: %s and %s", w.what, what);
    }
    const unsigned gen = w.gen;
    w.vals[gen & 1][lane] = bits;
    w.arrived |= 1u << lane;
    B.progress++;
    if (w.arrived == mask) {
        w.arrived = 0;
        w.gen++;
    } else {
        f->waiting = 2;
        while (w.gen == gen) yield();
        f->waiting = 0;
    }
    /* the other buffer takes the next meeting, which cannot complete before this lane has read */
    return w.vals[gen & 1];
}

void gt_emu_shared(void *p, size_t bytes) {
    for (void *q : B.shared_seen)
        if (q == p) return;
    B.shared_seen.push_back(p);
    B.shared_seen_bytes.push_back(bytes);
    B.static_smem += bytes;
    memset(p, 0xFF, bytes);
}

void *gt_emu_dynamic_shared(void) { return B.dyn; }

/* ---------------------------------------------------------------- tensor-core PTX (cuda_emu.h) */

/* Both warp-collective instructions meet twice: the first meeting exchanges what each lane gives (a
 * row address, a pointer to its fragments), the second keeps every lane from going on (and writing
 * shared memory or its fragments) before all have read, as the one instruction of a warp would. */

void gt_emu_ldmatrix_x4(uint32_t r[4], const void *p, int trans) {
    const char *what = trans ? LDMATRIX_T : LDMATRIX;
    if (!B.cur) kernel_bug("%s outside a kernel", what);
    const int lane = gt_emu_lane();
    if ((uintptr_t)p % 16)
        kernel_bug("%s: lane %d's row address %p is not 16-byte aligned", what, lane, p);
    if (!in_shared(p, 16))
        kernel_bug("%s: lane %d's row %p (16 bytes) is not in the block's shared memory", what, lane, p);
    const uint64_t *all = gt_emu_warp_meet(0xffffffffu, (uint64_t)(uintptr_t)p, what);
    const uint16_t *row[32];
    for (int l = 0; l < 32; l++) row[l] = (const uint16_t *)(uintptr_t)all[l];
    const int g = lane >> 2, c = lane & 3;
    for (int i = 0; i < 4; i++) {
        uint32_t lo, hi;
        if (!trans) { /* row g of matrix i, columns 2c, 2c + 1 */
            lo = row[8 * i + g][2 * c];
            hi = row[8 * i + g][2 * c + 1];
        } else { /* rows 2c, 2c + 1 of matrix i, column g */
            lo = row[8 * i + 2 * c][g];
            hi = row[8 * i + 2 * c + 1][g];
        }
        r[i] = lo | hi << 16;
    }
    (void)gt_emu_warp_meet(0xffffffffu, 0, what);
}

namespace {
struct mma_operands {
    uint32_t a[4], b[2];
};
} /* namespace */

void gt_emu_mma_m16n8k16_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (!B.cur) kernel_bug("%s outside a kernel", MMA);
    const int lane = gt_emu_lane();
    const mma_operands mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
    const uint64_t *all = gt_emu_warp_meet(0xffffffffu, (uint64_t)(uintptr_t)&mine, MMA);
    /* A (16 x 16) and B (16 x 8, k x n) from every lane's registers, by the ISA's tables: lane 4g + q
     * holds a[0] = (g, 2q..2q+1), a[1] = (g + 8, 2q..), a[2] = (g, 2q + 8..), a[3] = (g + 8, 2q + 8..);
     * b[0] = (k 2q, 2q + 1; n g), b[1] = (k 2q + 8, 2q + 9; n g); lower column / k in the low half */
    float A[16][16], Bm[16][8];
    for (int l = 0; l < 32; l++) {
        const mma_operands *o = (const mma_operands *)(uintptr_t)all[l];
        const int g = l >> 2, q = l & 3;
        for (int i = 0; i < 4; i++) {
            const int row = g + (i & 1) * 8, col = 2 * q + (i >> 1) * 8;
            A[row][col] = bf16_bits_to_float(o->a[i]);
            A[row][col + 1] = bf16_bits_to_float(o->a[i] >> 16);
        }
        for (int i = 0; i < 2; i++) {
            const int k = 2 * q + i * 8;
            Bm[k][g] = bf16_bits_to_float(o->b[i]);
            Bm[k + 1][g] = bf16_bits_to_float(o->b[i] >> 16);
        }
    }
    /* this lane's D: c[0], c[1] = (row g, cols 2q, 2q + 1), c[2], c[3] = (row g + 8, same cols) */
    const int g = lane >> 2, q = lane & 3;
    float d[4];
    for (int e = 0; e < 4; e++) {
        const int row = g + (e >> 1) * 8, col = 2 * q + (e & 1);
        float acc = c[e];
        for (int k = 0; k < 16; k++) acc += A[row][k] * Bm[k][col]; /* exact product; -ffp-contract=off */
        d[e] = acc;
    }
    (void)gt_emu_warp_meet(0xffffffffu, 0, MMA); /* every lane has read `mine` */
    for (int e = 0; e < 4; e++) c[e] = d[e];
}

void gt_emu_cp_async(void *dst, const void *src, int size, int src_bytes) {
    fiber *f = B.cur;
    if (!f) kernel_bug("cp.async outside a kernel");
    if ((uintptr_t)dst % (uintptr_t)size || !in_shared(dst, (size_t)size))
        kernel_bug("cp.async of %d bytes to %p: not %d-byte aligned shared memory of this block", size, dst, size);
    if (src_bytes < 0 || src_bytes > size) kernel_bug("cp.async of %d bytes with src-size %d", size, src_bytes);
    if (src_bytes > 0) {
        const std::pair<void *const, device_block> *d = device_block_at((const char *)src);
        if ((uintptr_t)src % (uintptr_t)size || !d || (const char *)src < (const char *)d->first ||
            (const char *)src + src_bytes > (const char *)d->first + d->second.bytes)
            kernel_bug("cp.async of %d bytes from %p: not %d-byte aligned inside a cudaMalloc block", src_bytes, src,
                       size);
    }
    if (cp_async_eager()) {
        if (src_bytes) memcpy(dst, src, (size_t)src_bytes);
        memset((char *)dst + src_bytes, 0, (size_t)(size - src_bytes));
        return;
    }
    f->cp_open.push_back(cp_copy{(char *)dst, (const char *)src, size, src_bytes});
}

void gt_emu_cp_async_commit(void) {
    fiber *f = B.cur;
    if (!f) kernel_bug("cp.async.commit_group outside a kernel");
    f->cp_groups.push_back(std::move(f->cp_open)); /* an empty group is a group, as in PTX */
    f->cp_open.clear();
}

void gt_emu_cp_async_wait(int newest_pending) {
    fiber *f = B.cur;
    if (!f) kernel_bug("cp.async.wait_group outside a kernel");
    size_t done = 0;
    while (f->cp_groups.size() - done > (size_t)newest_pending) {
        for (const cp_copy &cp : f->cp_groups[done]) {
            if (cp.src_bytes) memcpy(cp.dst, cp.src, (size_t)cp.src_bytes);
            memset(cp.dst + cp.src_bytes, 0, (size_t)(cp.size - cp.src_bytes));
        }
        done++;
    }
    f->cp_groups.erase(f->cp_groups.begin(), f->cp_groups.begin() + (long)done);
}

int gt_emu_launch_bounds(const char *kernel_name, int bound) {
    auto it = bounds().find(kernel_name);
    if (it == bounds().end() || bound < it->second) bounds()[kernel_name] = bound;
    return bound;
}

void gt_emu_run(const char *name, const char *file, int line, const void *kernel, dim3 grid, dim3 block, size_t smem,
                gt_emu_thunk thunk, void *data) {
    init_once();
    if (B.in_kernel) kernel_bug("a kernel launched from inside a kernel (%s)", name);
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!grid.x || !grid.y || !grid.z || !threads || threads > MAX_THREADS || block.x > 1024 || block.y > 1024 ||
        block.z > 64 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u) {
        launch_error(cudaErrorInvalidConfiguration, name, file, line, "grid (%u,%u,%u), block (%u,%u,%u)", grid.x, grid.y,
                     grid.z, block.x, block.y, block.z);
        return;
    }
    const std::string base(name, strcspn(name, "<"));
    auto lb = bounds().find(base);
    if (lb != bounds().end() && threads > (unsigned long long)lb->second) {
        launch_error(cudaErrorLaunchOutOfResources, name, file, line, "%llu threads per block, but __launch_bounds__(%d)",
                     threads, lb->second);
        return;
    }
    auto attr = g_smem_attr.find(kernel);
    const size_t allowed = attr != g_smem_attr.end() ? (size_t)attr->second : SMEM_DEFAULT;
    if (smem > allowed && smem > SMEM_DEFAULT) {
        launch_error(cudaErrorInvalidValue, name, file, line,
                     "%zu bytes of dynamic shared memory, but only %zu allowed (cudaFuncSetAttribute "
                     "cudaFuncAttributeMaxDynamicSharedMemorySize raises it)",
                     smem, allowed);
        return;
    }
    B.name = name;
    B.file = file;
    B.line = line;
    B.thunk = thunk;
    B.data = data;
    B.nthreads = (int)threads;
    B.dyn_bytes = smem;
    /* the launch's bytes end at the guard page; 16-byte aligned as the device's are */
    B.dyn = g_dyn_region + g_dyn_region_bytes - (smem + 15) / 16 * 16;
    blockDim = block;
    gridDim = grid;
    B.in_kernel = true;
    gt_emu_device_begin();
    const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    const bool rev = reverse_order();
    for (unsigned long long i = 0; i < nblocks; i++) {
        const unsigned long long b = rev ? nblocks - 1 - i : i;
        blockIdx.x = (unsigned)(b % grid.x);
        blockIdx.y = (unsigned)(b / grid.x % grid.y);
        blockIdx.z = (unsigned)(b / ((unsigned long long)grid.x * grid.y));
        run_block();
    }
    gt_emu_device_end();
    B.in_kernel = false;
}

/* ---------------------------------------------------------------- the runtime API subset */

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}

/* ---- what the trainer's device selection (src/dist/comm_nccl.c: gt_cuda_select_device) and
 * `gtrain --version` (cuda_version.cu) ask: one device, 0, described as an H200 */

cudaError_t cudaSetDevice(int device) {
    if (device != 0) {
        g_last_error = cudaErrorInvalidDevice;
        return cudaErrorInvalidDevice;
    }
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) {
        g_last_error = cudaErrorInvalidDevice;
        return cudaErrorInvalidDevice;
    }
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CPU emulation of a CUDA device (tests/gpu/emu)");
    /* a UUID of its own (not all zero: gt_cuda_select_device then uses it, not the PCI address) */
    for (int i = 0; i < 16; i++) prop->uuid.bytes[i] = (char)(0xE0 + i);
    prop->totalGlobalMem = (size_t)141 << 30;
    prop->sharedMemPerBlock = SMEM_STATIC_MAX;
    prop->sharedMemPerBlockOptin = SMEM_OPTIN_MAX;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = MAX_THREADS;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = MAX_THREADS;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->pciBusID = 1;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) {
    *version = CUDART_VERSION; /* the headers it was built with */
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version) {
    *version = 0; /* no driver: "none" */
    return cudaSuccess;
}

/* ---- streams and events: everything is synchronous here, so every stream is idle and every event
 * complete (src/dist/comm_nccl.c uses them only once NCCL is up, which it never is in the emulation) */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    (void)flags;
    *stream = (cudaStream_t)0;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    *event = (cudaEvent_t)0;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t bytes) {
    init_once();
    *p = NULL;
    if (bytes == 0) bytes = 1;
    /* 256-byte aligned as cudaMalloc's; the block ends within 255 bytes of a guard page */
    const size_t body = (bytes + 255) / 256 * 256;
    char *m;
    size_t mb;
    char *end = (char *)map_guarded(body, &m, &mb);
    if (!end) {
        g_last_error = cudaErrorMemoryAllocation;
        return cudaErrorMemoryAllocation;
    }
    char *ptr = end - body;
    memset(ptr, 0xFF, body); /* never-written device memory reads as NaN */
    if (protect_device() && mprotect(m, mb - g_page, PROT_NONE) != 0) abort(); /* closed to host code */
    g_device[ptr] = device_block{m, mb - g_page, bytes};
    g_device_bytes += body;
    *p = ptr;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    auto it = g_device.find(p);
    if (it == g_device.end()) return cudaErrorInvalidValue;
    g_device_bytes -= (it->second.bytes + 255) / 256 * 256;
    munmap(it->second.map, it->second.map_bytes + g_page);
    g_device.erase(it);
    return cudaSuccess;
}

/* Pinned host memory: plain host memory here (there is no DMA to speed up), kept in a set so that
 * cudaFreeHost of anything else fails as on a GPU. GT_EMU_PIN_FAIL=1 refuses every pinning, as a host
 * at its locked-memory limit does. */
static std::set<void *> g_pinned;

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    *p = NULL;
    const char *refuse = getenv("GT_EMU_PIN_FAIL");
    void *m = refuse && strcmp(refuse, "1") == 0 ? NULL : malloc(bytes ? bytes : 1);
    if (!m) {
        g_last_error = cudaErrorMemoryAllocation;
        return cudaErrorMemoryAllocation;
    }
    g_pinned.insert(m);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    if (!g_pinned.erase(p)) return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    (void)kind;
    gt_emu_device_begin();
    memmove(dst, src, count);
    gt_emu_device_end();
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    (void)stream;
    return cudaMemcpy(dst, src, count, kind);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream) {
    (void)stream;
    gt_emu_device_begin();
    memset(p, value, count);
    gt_emu_device_end();
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t count) { return cudaMemsetAsync(p, value, count, 0); }

cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset,
                               enum cudaMemcpyKind kind) {
    (void)kind;
    memcpy((char *)symbol + offset, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset, enum cudaMemcpyKind kind) {
    (void)kind;
    memcpy(dst, (const char *)symbol + offset, count);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    const cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; } /* every launch has already finished */

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    const size_t total = (size_t)141 << 30; /* an H200's, nominally: nothing here is a real limit */
    *total_bytes = total;
    *free_bytes = g_device_bytes < total ? total - g_device_bytes : 0;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (value < 0 || (size_t)value > SMEM_OPTIN_MAX) {
        fprintf(stderr, "gtrain-emu: cudaFuncSetAttribute(MaxDynamicSharedMemorySize, %d): more than the device's %zu\n",
                value, SMEM_OPTIN_MAX);
        return cudaErrorInvalidValue;
    }
    g_smem_attr[func] = value;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "an emulated CUDA error";
    }
}

} /* extern "C" */
