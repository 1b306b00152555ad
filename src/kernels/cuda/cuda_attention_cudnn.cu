/*
 * cuda_attention_cudnn.cu — an opt-in variant of the attention (train.cuda_attention = cudnn, bf16)
 * that runs cuDNN 9's fused flash attention, built with cuDNN's backend (graph) C API. It has never
 * run on a GPU: docs/gpu.md says what was checked without one, and describes the graphs in full.
 *
 * libcudnn is never linked: the first call dlopen()s libcudnn.so.9 (then libcudnn.so), takes the
 * functions it uses with dlsym() and creates one handle on the backend's stream 0; without cuDNN's
 * headers at build time (GTRAIN_HAVE_CUDNN_HEADERS unset) the file compiles to the fallback alone.
 * A call goes to the default kernels, the first such fallback of the process printing one line, when
 * the library is missing or unfit (not 9.x, or 9.10.0/9.10.1), for dropout > 0 (cuDNN's mask is not
 * ops.h's), HD not a multiple of 8 or over 128, T = 1, a tensor not 16-byte aligned, a backward with
 * T % 128 != 0 on cuDNN <= 9.15, or when building or running the graph fails (remembered per shape).
 * Plans are cached per (direction, B, T, NH, NKV, HD). gtrain's tensors are described by strides,
 * never copied; GQA is matmul broadcasting (and, for dK and dV, a sum over each group). The forward
 * graph's Stats output is exactly gtrain's lse, so any forward pairs with any backward. The backward
 * is cudnn-frontend's composite SDPA backward, whose dQ accumulation is NOT deterministic: repeats
 * can differ in the last bits (the default kernels stay the deterministic path).
 */
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "cuda_attention.cuh"

#if GTRAIN_HAVE_CUDNN_HEADERS
#include <cudnn_graph.h>
#endif

namespace {

long g_cudnn_calls = 0; /* forward and backward calls cuDNN ran (tests) */
int g_said = 0;         /* the one fallback line has been printed */
char g_last_fallback[320]; /* the latest fallback's reason, printed or not (tests) */

void say_fallback(const char *reason) {
    snprintf(g_last_fallback, sizeof g_last_fallback, "%s", reason);
    if (g_said) return;
    g_said = 1;
    fprintf(stderr, "gtrain: train.cuda_attention = cudnn: %s; using the default attention kernels\n", reason);
}

} /* namespace */

#if GTRAIN_HAVE_CUDNN_HEADERS

namespace {

/* ---------------------------------------------------------------- the library, through dlopen */

struct CudnnApi {
    void *lib;
    size_t version;
    cudnnHandle_t handle;
    decltype(&cudnnGetVersion) GetVersion;
    decltype(&cudnnGetErrorString) GetErrorString;
    decltype(&cudnnCreate) Create;
    decltype(&cudnnSetStream) SetStream;
    decltype(&cudnnBackendCreateDescriptor) CreateDescriptor;
    decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor;
    decltype(&cudnnBackendSetAttribute) SetAttribute;
    decltype(&cudnnBackendGetAttribute) GetAttribute;
    decltype(&cudnnBackendFinalize) Finalize;
    decltype(&cudnnBackendExecute) Execute;
};

CudnnApi g_api;
int g_load_state = 0;     /* 0 not tried, 1 usable, -1 unusable for the whole process */
char g_load_reason[320];  /* why, when -1 */

template <typename F>
bool take_symbol(F *fn, const char *name) {
    void *p = dlsym(g_api.lib, name);
    if (!p) {
        snprintf(g_load_reason, sizeof g_load_reason, "the loaded libcudnn has no %s", name);
        return false;
    }
    *fn = reinterpret_cast<F>(p);
    return true;
}

/* dlopen and dlsym only (no device needed) */
bool load_symbols(void) {
    const char *names[2] = {"libcudnn.so.9", "libcudnn.so"};
    char first_error[200] = "";
    for (int i = 0; i < 2 && !g_api.lib; i++) {
        g_api.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!g_api.lib && i == 0) {
            const char *e = dlerror();
            snprintf(first_error, sizeof first_error, "%s", e ? e : "unknown dlopen error");
        }
    }
    if (!g_api.lib) {
        snprintf(g_load_reason, sizeof g_load_reason, "cannot load cuDNN (%s)", first_error);
        return false;
    }
    if (!take_symbol(&g_api.GetVersion, "cudnnGetVersion") ||
        !take_symbol(&g_api.GetErrorString, "cudnnGetErrorString") || !take_symbol(&g_api.Create, "cudnnCreate") ||
        !take_symbol(&g_api.SetStream, "cudnnSetStream") ||
        !take_symbol(&g_api.CreateDescriptor, "cudnnBackendCreateDescriptor") ||
        !take_symbol(&g_api.DestroyDescriptor, "cudnnBackendDestroyDescriptor") ||
        !take_symbol(&g_api.SetAttribute, "cudnnBackendSetAttribute") ||
        !take_symbol(&g_api.GetAttribute, "cudnnBackendGetAttribute") ||
        !take_symbol(&g_api.Finalize, "cudnnBackendFinalize") || !take_symbol(&g_api.Execute, "cudnnBackendExecute"))
        return false;
    g_api.version = g_api.GetVersion();
    if (g_api.version < 90000 || g_api.version >= 100000) {
        snprintf(g_load_reason, sizeof g_load_reason, "cuDNN version %zu is not 9.x", g_api.version);
        return false;
    }
    if (g_api.version == 91000 || g_api.version == 91001) {
        snprintf(g_load_reason, sizeof g_load_reason,
                 "cuDNN 9.10.0 and 9.10.1 have known bf16 SDPA bugs (9.10.2 or later works)");
        return false;
    }
    return true;
}

bool load_api_once(void) {
    if (!load_symbols()) return false;
    cudnnStatus_t st = g_api.Create(&g_api.handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(g_load_reason, sizeof g_load_reason, "cudnnCreate failed (%s)", g_api.GetErrorString(st));
        return false;
    }
    /* every kernel of the backend runs on the legacy default stream (cuda_common.cuh) */
    st = g_api.SetStream(g_api.handle, (cudaStream_t)0);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(g_load_reason, sizeof g_load_reason, "cudnnSetStream failed (%s)", g_api.GetErrorString(st));
        return false;
    }
    return true;
}

/* the library is usable (loads it on the first call); otherwise g_load_reason says why */
bool api_ready(void) {
    if (g_load_state == 0) g_load_state = load_api_once() ? 1 : -1;
    return g_load_state == 1;
}

/* ---------------------------------------------------------------- the plan cache */

constexpr int CACHE_SIZE = 32;
constexpr int MAX_DESC = 128; /* descriptors of one graph: tensors, ops, op graph, configs, plan */
constexpr int MAX_OPS = 40;

/* unique ids of the real (non-virtual) tensors; virtual ones count up from 100 */
enum : int64_t {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_DO, UID_DQ, UID_DK, UID_DV,
    UID_ONE, UID_DSUM, UID_DQ_ACCUM,
    UID_VIRTUAL0 = 100
};

struct Plan {
    int used;
    int backward, B, T, NH, NKV, HD;
    int ok; /* 1: plan ready; 0: building or executing failed, fall back (never retried) */
    cudnnBackendDescriptor_t desc[MAX_DESC];
    int ndesc;
    cudnnBackendDescriptor_t plan;
    int64_t workspace;
    /* by-value scalars: the variant pack points at these host floats */
    float scale, neg_inf, one;
};

Plan g_cache[CACHE_SIZE];

/* a tensor of the graph under construction, with how often an operation writes and reads it */
struct Wire {
    cudnnBackendDescriptor_t d;
    int64_t uid;
    bool is_virtual;
    int produced, consumed;
};

/* one graph under construction: the first failure is kept, every later step is skipped */
struct Build {
    Plan *p;
    bool ok;
    char why[256];
    int64_t next_uid;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int nops;
    Wire wires[MAX_OPS * 2];
    int nwires;
};

/* an operation reads (produce = false) or writes tensor d */
void wire(Build &b, cudnnBackendDescriptor_t d, bool produce) {
    if (!b.ok || !d) return;
    for (int i = 0; i < b.nwires; i++)
        if (b.wires[i].d == d) {
            if (produce) b.wires[i].produced++;
            else b.wires[i].consumed++;
            return;
        }
}

/* cuDNN does not check the wiring when it finalizes the operation graph (a virtual tensor read but
 * never written passes), so check it here: every virtual tensor written once and read, every real
 * tensor in `outputs` written once, every other real tensor (inputs, scalars) read and never written */
void check_wiring(Build &b, const int64_t *outputs, int nout) {
    for (int i = 0; i < b.nwires && b.ok; i++) {
        const Wire &w = b.wires[i];
        bool is_output = false;
        for (int j = 0; j < nout; j++) is_output = is_output || outputs[j] == w.uid;
        const bool good = w.is_virtual ? (w.produced == 1 && w.consumed >= 1)
                                       : is_output ? w.produced == 1 : (w.produced == 0 && w.consumed >= 1);
        if (!good) {
            b.ok = false;
            snprintf(b.why, sizeof b.why, "internal: graph tensor uid %lld is written %d times and read %d times",
                     (long long)w.uid, w.produced, w.consumed);
        }
    }
}

void fail(Build &b, const char *what, cudnnStatus_t st) {
    if (!b.ok) return;
    b.ok = false;
    snprintf(b.why, sizeof b.why, "%s failed (%s)", what, g_api.GetErrorString(st));
}

cudnnBackendDescriptor_t make(Build &b, cudnnBackendDescriptorType_t type, const char *what) {
    if (!b.ok) return nullptr;
    if (b.p->ndesc >= MAX_DESC) {
        b.ok = false;
        snprintf(b.why, sizeof b.why, "internal: more than %d cuDNN descriptors for one graph", MAX_DESC);
        return nullptr;
    }
    cudnnBackendDescriptor_t d = nullptr;
    cudnnStatus_t st = g_api.CreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(b, what, st);
        return nullptr;
    }
    b.p->desc[b.p->ndesc++] = d;
    return d;
}

void set(Build &b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         int64_t count, const void *value, const char *what) {
    if (!b.ok) return;
    cudnnStatus_t st = g_api.SetAttribute(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS) fail(b, what, st);
}

void finalize(Build &b, cudnnBackendDescriptor_t d, const char *what) {
    if (!b.ok) return;
    cudnnStatus_t st = g_api.Finalize(d);
    if (st != CUDNN_STATUS_SUCCESS) fail(b, what, st);
}

void add_op(Build &b, cudnnBackendDescriptor_t op) {
    if (!b.ok) return;
    if (b.nops >= MAX_OPS) {
        b.ok = false;
        snprintf(b.why, sizeof b.why, "internal: more than %d operations in one graph", MAX_OPS);
        return;
    }
    b.ops[b.nops++] = op;
}

/* a 4-d tensor; uid 0 takes the next virtual id */
cudnnBackendDescriptor_t tensor(Build &b, int64_t uid, cudnnDataType_t dt, const int64_t (&dims)[4],
                                const int64_t (&strides)[4], bool is_virtual, bool by_value = false) {
    cudnnBackendDescriptor_t t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "creating a tensor descriptor");
    if (uid == 0) uid = b.next_uid++;
    const int64_t align = 16;
    set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dimensions");
    set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
    set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor unique id");
    set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor is-virtual");
    if (by_value) set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by-value");
    finalize(b, t, "finalizing a tensor descriptor");
    if (b.ok && b.nwires == MAX_OPS * 2) {
        b.ok = false;
        snprintf(b.why, sizeof b.why, "internal: more than %d tensors in one graph", MAX_OPS * 2);
    }
    if (b.ok) b.wires[b.nwires++] = Wire{t, uid, is_virtual, 0, 0};
    return t;
}

/* y = mode(x[, in_b][, t]); axis >= 0 for GEN_INDEX */
void pointwise(Build &b, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
               cudnnBackendDescriptor_t in_b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
               int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "creating a pointwise descriptor");
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (axis >= 0) set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    finalize(b, pw, "finalizing a pointwise descriptor");
    cudnnBackendDescriptor_t op =
        make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "creating a pointwise operation");
    const float one = 1.0f;
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op");
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
    if (in_b) set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &in_b, "pointwise b");
    if (t) set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
    finalize(b, op, "finalizing a pointwise operation");
    add_op(b, op);
    wire(b, x, false), wire(b, in_b, false), wire(b, t, false), wire(b, y, true);
}

/* c = a b over the last two dimensions, batched (broadcast) over the first two; fp32 compute */
void matmul(Build &b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bb, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "creating a matmul descriptor");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
    finalize(b, mm, "finalizing a matmul descriptor");
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "creating a matmul operation");
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bb, "matmul b");
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul descriptor");
    finalize(b, op, "finalizing a matmul operation");
    add_op(b, op);
    wire(b, a, false), wire(b, bb, false), wire(b, c, true);
}

/* y = reduce(x) over the dimensions where y has extent 1 (or, GQA, over the groups of heads) */
void reduction(Build &b, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "creating a reduction descriptor");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, "reduction operator");
    set(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
    finalize(b, rd, "finalizing a reduction descriptor");
    cudnnBackendDescriptor_t op =
        make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "creating a reduction operation");
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, "reduction descriptor");
    finalize(b, op, "finalizing a reduction operation");
    add_op(b, op);
    wire(b, x, false), wire(b, y, true);
}

/* y = x seen with other dimensions/strides (here: a transposed view) */
void reshape(Build &b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "creating a reshape operation");
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
    finalize(b, op, "finalizing a reshape operation");
    add_op(b, op);
    wire(b, x, false), wire(b, y, true);
}

/* y = mode(x[, in_b]) with fp32 math into a new virtual tensor of type dt, dims and strides */
cudnnBackendDescriptor_t pointwise_new(Build &b, cudnnPointwiseMode_t mode, cudnnDataType_t dt,
                                       cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t in_b,
                                       const int64_t (&dims)[4], const int64_t (&strides)[4]) {
    cudnnBackendDescriptor_t y = tensor(b, 0, dt, dims, strides, true);
    pointwise(b, mode, CUDNN_DATA_FLOAT, x, in_b, nullptr, y);
    return y;
}

/* the causal mask of a (b, h, s_q, s_kv) fp32 score tensor: keep key col <= query row, else fill */
cudnnBackendDescriptor_t causal_mask(Build &b, cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t fill,
                                     const int64_t (&sd)[4], const int64_t (&ss)[4]) {
    cudnnBackendDescriptor_t row = tensor(b, 0, CUDNN_DATA_INT32, sd, ss, true);
    cudnnBackendDescriptor_t col = tensor(b, 0, CUDNN_DATA_INT32, sd, ss, true);
    cudnnBackendDescriptor_t keep = tensor(b, 0, CUDNN_DATA_BOOLEAN, sd, ss, true);
    cudnnBackendDescriptor_t out = tensor(b, 0, CUDNN_DATA_FLOAT, sd, ss, true);
    pointwise(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, nullptr, nullptr, row, 2);
    pointwise(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, nullptr, nullptr, col, 3);
    pointwise(b, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
    pointwise(b, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, fill, keep, out);
    return out;
}

/* shapes shared by both graphs */
struct Dims {
    int64_t q[4], qs[4];       /* q, out, dout, dq: (b, NH, T, HD) over (B, T, NH, HD) memory */
    int64_t kv[4], kvs[4];     /* k, v, dk, dv: (b, NKV, T, HD) over (B, T, NKV, HD) memory */
    int64_t kt[4], kts[4];     /* K^T, V^T: (b, NKV, HD, T) views of the same memory */
    int64_t sc[4], scs[4];     /* scores (b, NH, T, T) */
    int64_t sct[4], scts[4];   /* transposed scores (b, NH, T_kv, T_q) */
    int64_t row[4], rows[4];   /* per-row statistics (b, NH, T, 1): gtrain's lse layout */
    int64_t one[4], ones[4];   /* scalars */
    int64_t hd[4], hds[4];     /* per-query-head (b, NH, T, HD) contiguous: dQ accumulator, GQA dK/dV */
};

Dims make_dims(const Plan &p) {
    const int64_t b = p.B, h = p.NH, hk = p.NKV, s = p.T, d = p.HD;
    Dims x = {
        {b, h, s, d}, {s * h * d, d, h * d, 1},
        {b, hk, s, d}, {s * hk * d, d, hk * d, 1},
        {b, hk, d, s}, {s * hk * d, d, 1, hk * d},
        {b, h, s, s}, {h * s * s, s * s, s, 1},
        {b, h, s, s}, {h * s * s, s * s, 1, s},
        {b, h, s, 1}, {h * s, s, 1, 1},
        {1, 1, 1, 1}, {1, 1, 1, 1},
        {b, h, s, d}, {h * s * d, s * d, d, 1},
    };
    return x;
}

/* the scaled scores Q K^T * scale (b, NH, T, T) fp32, the start of both graphs */
cudnnBackendDescriptor_t scaled_scores(Build &b, const Dims &x, cudnnBackendDescriptor_t Q, cudnnBackendDescriptor_t KT,
                                       cudnnBackendDescriptor_t scale) {
    cudnnBackendDescriptor_t s1 = tensor(b, 0, CUDNN_DATA_FLOAT, x.sc, x.scs, true);
    matmul(b, Q, KT, s1);
    return pointwise_new(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s1, scale, x.sc, x.scs);
}

/* out = a^T c for an fp32 score-shaped a (dV = P^T dO, dK = dS^T Q): a seen transposed in bf16
 * (reshape), then with GQA the per-query-head product (b, NH, T, HD) summed over each group of heads */
void transposed_product(Build &b, const Dims &x, bool gqa, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t c,
                        cudnnBackendDescriptor_t out) {
    cudnnBackendDescriptor_t at = tensor(b, 0, CUDNN_DATA_BFLOAT16, x.sct, x.scts, true);
    reshape(b, a, at);
    if (!gqa) {
        matmul(b, at, c, out);
    } else {
        cudnnBackendDescriptor_t full = tensor(b, 0, CUDNN_DATA_BFLOAT16, x.hd, x.hds, true);
        matmul(b, at, c, full);
        reduction(b, CUDNN_REDUCE_TENSOR_ADD, full, out);
    }
}

void build_forward(Build &b) {
    const Dims x = make_dims(*b.p);
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, H = CUDNN_DATA_BFLOAT16;
    cudnnBackendDescriptor_t Q = tensor(b, UID_Q, H, x.q, x.qs, false);
    cudnnBackendDescriptor_t KT = tensor(b, UID_K, H, x.kt, x.kts, false);
    cudnnBackendDescriptor_t V = tensor(b, UID_V, H, x.kv, x.kvs, false);
    cudnnBackendDescriptor_t O = tensor(b, UID_O, H, x.q, x.qs, false);
    cudnnBackendDescriptor_t stats = tensor(b, UID_STATS, F, x.row, x.rows, false);
    cudnnBackendDescriptor_t scale = tensor(b, UID_SCALE, F, x.one, x.ones, false, true);
    cudnnBackendDescriptor_t neg_inf = tensor(b, UID_NEG_INF, F, x.one, x.ones, false, true);

    cudnnBackendDescriptor_t s2 = scaled_scores(b, x, Q, KT, scale);
    cudnnBackendDescriptor_t s3 = causal_mask(b, s2, neg_inf, x.sc, x.scs);
    cudnnBackendDescriptor_t mx = tensor(b, 0, F, x.row, x.rows, true);
    reduction(b, CUDNN_REDUCE_TENSOR_MAX, s3, mx);
    cudnnBackendDescriptor_t s4 = pointwise_new(b, CUDNN_POINTWISE_SUB, F, s3, mx, x.sc, x.scs);
    cudnnBackendDescriptor_t e = pointwise_new(b, CUDNN_POINTWISE_EXP, F, s4, nullptr, x.sc, x.scs);
    cudnnBackendDescriptor_t sum = tensor(b, 0, F, x.row, x.rows, true);
    reduction(b, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    cudnnBackendDescriptor_t logsum = pointwise_new(b, CUDNN_POINTWISE_LOG, F, sum, nullptr, x.row, x.rows);
    pointwise(b, CUDNN_POINTWISE_ADD, F, mx, logsum, nullptr, stats);
    /* bf16: the second matmul's A */
    cudnnBackendDescriptor_t P = pointwise_new(b, CUDNN_POINTWISE_DIV, H, e, sum, x.sc, x.scs);
    matmul(b, P, V, O);
    const int64_t outputs[2] = {UID_O, UID_STATS};
    check_wiring(b, outputs, 2);
}

void build_backward(Build &b) {
    const Dims x = make_dims(*b.p);
    const bool gqa = b.p->NH != b.p->NKV;
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, H = CUDNN_DATA_BFLOAT16;
    cudnnBackendDescriptor_t Q = tensor(b, UID_Q, H, x.q, x.qs, false);
    cudnnBackendDescriptor_t KT = tensor(b, UID_K, H, x.kt, x.kts, false);
    cudnnBackendDescriptor_t VT = tensor(b, UID_V, H, x.kt, x.kts, false);
    cudnnBackendDescriptor_t O = tensor(b, UID_O, H, x.q, x.qs, false);
    cudnnBackendDescriptor_t dO = tensor(b, UID_DO, H, x.q, x.qs, false);
    cudnnBackendDescriptor_t stats = tensor(b, UID_STATS, F, x.row, x.rows, false);
    cudnnBackendDescriptor_t dQ = tensor(b, UID_DQ, H, x.q, x.qs, false);
    cudnnBackendDescriptor_t dK = tensor(b, UID_DK, H, x.kv, x.kvs, false);
    cudnnBackendDescriptor_t dV = tensor(b, UID_DV, H, x.kv, x.kvs, false);
    cudnnBackendDescriptor_t scale = tensor(b, UID_SCALE, F, x.one, x.ones, false, true);
    cudnnBackendDescriptor_t neg_inf = tensor(b, UID_NEG_INF, F, x.one, x.ones, false, true);
    cudnnBackendDescriptor_t one = tensor(b, UID_ONE, F, x.one, x.ones, false, true);
    cudnnBackendDescriptor_t dsum = tensor(b, UID_DSUM, F, x.row, x.rows, false);
    cudnnBackendDescriptor_t dq_acc = tensor(b, UID_DQ_ACCUM, F, x.hd, x.hds, false);

    /* D = rowsum(dO * O), into the real scratch tensor dsum */
    cudnnBackendDescriptor_t doo = pointwise_new(b, CUDNN_POINTWISE_MUL, F, dO, O, x.q, x.qs);
    cudnnBackendDescriptor_t dr = tensor(b, 0, F, x.row, x.rows, true);
    reduction(b, CUDNN_REDUCE_TENSOR_ADD, doo, dr);
    pointwise(b, CUDNN_POINTWISE_MUL, F, dr, one, nullptr, dsum);

    /* P = exp(Q K^T * scale - lse), causally masked */
    cudnnBackendDescriptor_t s2 = scaled_scores(b, x, Q, KT, scale);
    cudnnBackendDescriptor_t s3 = pointwise_new(b, CUDNN_POINTWISE_SUB, F, s2, stats, x.sc, x.scs);
    cudnnBackendDescriptor_t s4 = causal_mask(b, s3, neg_inf, x.sc, x.scs);
    cudnnBackendDescriptor_t P = pointwise_new(b, CUDNN_POINTWISE_EXP, F, s4, nullptr, x.sc, x.scs);

    /* dV = P^T dO */
    transposed_product(b, x, gqa, P, dO, dV);

    /* dS = (dO V^T - D) * P * scale */
    cudnnBackendDescriptor_t dp = tensor(b, 0, F, x.sc, x.scs, true);
    matmul(b, dO, VT, dp);
    cudnnBackendDescriptor_t dp2 = pointwise_new(b, CUDNN_POINTWISE_SUB, F, dp, dsum, x.sc, x.scs);
    cudnnBackendDescriptor_t ds1 = pointwise_new(b, CUDNN_POINTWISE_MUL, F, dp2, P, x.sc, x.scs);
    cudnnBackendDescriptor_t dS = pointwise_new(b, CUDNN_POINTWISE_MUL, F, ds1, scale, x.sc, x.scs);

    /* dK = dS^T Q */
    transposed_product(b, x, gqa, dS, Q, dK);

    /* dQ = dS K, accumulated in fp32 by cuDNN, then converted into dq */
    cudnnBackendDescriptor_t K = tensor(b, 0, F, x.kv, x.kvs, true);
    reshape(b, KT, K);
    matmul(b, dS, K, dq_acc);
    pointwise(b, CUDNN_POINTWISE_IDENTITY, F, dq_acc, nullptr, nullptr, dQ);
    const int64_t outputs[5] = {UID_DQ, UID_DK, UID_DV, UID_DSUM, UID_DQ_ACCUM};
    check_wiring(b, outputs, 5);
}

/* gt_cuda_attention_cudnn_graph_check only: a device described by JSON instead of a handle (cuDNN's
 * ahead-of-time compilation, cuDNN >= 9.8), so heuristics and plans can be tried without a device */
cudnnBackendDescriptor_t g_check_device = nullptr;

/* the graph's operation graph, then an engine config whose execution plan finalizes */
void build_plan(Build &b) {
    cudnnBackendDescriptor_t graph = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "creating the operation graph");
    if (g_api.handle)
        set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g_api.handle, "operation graph handle");
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b.nops, b.ops, "operation graph ops");
    finalize(b, graph, "finalizing the operation graph");
    /* no handle and no device description: gt_cuda_attention_cudnn_graph_check stops here */
    if (!b.ok || (!g_api.handle && !g_check_device)) return;

    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    int tried = 0;
    cudnnStatus_t last = CUDNN_STATUS_SUCCESS;
    for (int mi = 0; mi < 2 && b.ok; mi++) {
        cudnnBackendDescriptor_t heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "creating the heuristics");
        set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
            "heuristics graph");
        set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi], "heuristics mode");
        if (g_check_device)
            set(b, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g_check_device,
                "heuristics device");
        finalize(b, heur, "finalizing the heuristics");
        if (!b.ok) return;
        int64_t count = 0;
        cudnnStatus_t st = g_api.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                              &count, nullptr);
        if (st != CUDNN_STATUS_SUCCESS) {
            last = st;
            continue;
        }
        if (count > 8) count = 8; /* the best few are enough */
        if (count <= 0) continue;
        cudnnBackendDescriptor_t cfg[8];
        for (int64_t i = 0; i < count; i++)
            cfg[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "creating an engine config");
        if (!b.ok) return;
        int64_t got = 0;
        st = g_api.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg);
        if (st != CUDNN_STATUS_SUCCESS) {
            last = st;
            continue;
        }
        for (int64_t i = 0; i < got && i < count; i++) {
            cudnnBackendDescriptor_t plan = make(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "creating a plan");
            if (!b.ok) return;
            tried++;
            st = g_api.handle ? g_api.SetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                                   &g_api.handle)
                              : CUDNN_STATUS_SUCCESS;
            if (st == CUDNN_STATUS_SUCCESS)
                st = g_api.SetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                        &cfg[i]);
            if (st == CUDNN_STATUS_SUCCESS) st = g_api.Finalize(plan);
            int64_t ws = 0;
            if (st == CUDNN_STATUS_SUCCESS)
                st = g_api.GetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, nullptr,
                                        &ws);
            if (st == CUDNN_STATUS_SUCCESS && ws >= 0) {
                b.p->plan = plan;
                b.p->workspace = ws;
                return;
            }
            if (!g_api.handle && st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER) {
                /* the graph check without a device: the engine took the graph and compiled its kernel
                 * for the described device; only loading it needs a driver. Enough; stop here. */
                b.ok = false;
                snprintf(b.why, sizeof b.why, "compiled for the described device (engine config %d of the %s list); "
                         "loading it needs a driver", (int)i + 1, mi == 0 ? "heuristics A" : "fallback");
                return;
            }
            last = st;
        }
    }
    b.ok = false;
    if (tried == 0)
        snprintf(b.why, sizeof b.why, "cuDNN's heuristics offered no engine config for the %s graph",
                 b.p->backward ? "backward" : "forward");
    else
        snprintf(b.why, sizeof b.why, "no cuDNN engine took the %s graph (%d configs tried; last: %s)",
                 b.p->backward ? "backward" : "forward", tried, g_api.GetErrorString(last));
}

/* the cached plan of a shape, building it on first use; nullptr (and *why) when it cannot run */
Plan *get_plan(int backward, int B, int T, int NH, int NKV, int HD, const char **why) {
    static char reason[320];
    Plan *slot = nullptr;
    for (int i = 0; i < CACHE_SIZE; i++) {
        Plan &p = g_cache[i];
        if (!p.used) {
            if (!slot) slot = &p;
            continue;
        }
        if (p.backward == backward && p.B == B && p.T == T && p.NH == NH && p.NKV == NKV && p.HD == HD) {
            if (p.ok) return &p;
            *why = nullptr; /* failed before and said so then */
            return nullptr;
        }
    }
    if (!slot) {
        snprintf(reason, sizeof reason, "more than %d attention shapes; no cuDNN plan for B=%d T=%d NH=%d NKV=%d HD=%d",
                 CACHE_SIZE, B, T, NH, NKV, HD);
        *why = reason;
        return nullptr;
    }
    memset(slot, 0, sizeof *slot);
    slot->used = 1;
    slot->backward = backward, slot->B = B, slot->T = T, slot->NH = NH, slot->NKV = NKV, slot->HD = HD;
    slot->scale = 1.0f / sqrtf((float)HD);
    /* cudnn-frontend masks with the lowest float before cuDNN 9.10, with -inf from then on */
    slot->neg_inf = g_api.version < 91000 ? -FLT_MAX : -INFINITY;
    slot->one = 1.0f;
    Build b;
    memset(&b, 0, sizeof b);
    b.p = slot;
    b.ok = true;
    b.next_uid = UID_VIRTUAL0;
    if (backward) build_backward(b);
    else build_forward(b);
    build_plan(b);
    if (!b.ok) {
        /* keep the slot as a "failed" mark; its descriptors are no longer needed */
        for (int i = 0; i < slot->ndesc; i++) g_api.DestroyDescriptor(slot->desc[i]);
        slot->ndesc = 0;
        slot->plan = nullptr;
        snprintf(reason, sizeof reason, "%s (%s B=%d T=%d NH=%d NKV=%d HD=%d)", b.why,
                 backward ? "backward" : "forward", B, T, NH, NKV, HD);
        *why = reason;
        return nullptr;
    }
    slot->ok = 1;
    return slot;
}

/* run a plan with the tensors given by uid; false (and *why) when cuDNN refused */
bool execute(Plan *p, int n, const int64_t *uids, void *const *ptrs, void *workspace, const char **why) {
    static char reason[320];
    cudnnBackendDescriptor_t pack = nullptr;
    cudnnStatus_t st = g_api.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = g_api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = g_api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = g_api.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (st == CUDNN_STATUS_SUCCESS) st = g_api.Finalize(pack);
    if (st == CUDNN_STATUS_SUCCESS) st = g_api.Execute(g_api.handle, p->plan, pack);
    if (pack) g_api.DestroyDescriptor(pack);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(reason, sizeof reason, "cudnnBackendExecute of the %s plan failed (%s)",
                 p->backward ? "backward" : "forward", g_api.GetErrorString(st));
        *why = reason;
        p->ok = 0; /* never again for this shape; its descriptors stay (cheap) */
        return false;
    }
    CUDA_CHECK_LAUNCH();
    return true;
}

size_t round_up(size_t n) { return (n + 255) & ~(size_t)255; }

} /* namespace */

#endif /* GTRAIN_HAVE_CUDNN_HEADERS */

/* ---------------------------------------------------------------- entry points */

/* The static part of the fallback rules (everything but the library and cuDNN's own verdict on the
 * graph): nullptr when the shape may go to cuDNN, else the reason. cuDNN's version matters only
 * for the backward's T % 128 rule; version 0 means "not loaded" (that rule is then assumed off). */
static const char *cudnn_shape_rule(int backward, int Tn, int HD, float dropout, size_t version) {
    static char reason[160];
    if (dropout > 0.0f) {
        snprintf(reason, sizeof reason, "dropout %.3g (cuDNN's dropout mask is not gtrain's)", (double)dropout);
        return reason;
    }
    if (HD % 8 != 0 || HD > 128) {
        snprintf(reason, sizeof reason, "head dim %d (cuDNN needs a multiple of 8, at most 128)", HD);
        return reason;
    }
    if (Tn < 2) return "sequence length 1 (not supported by cuDNN's fused attention)";
    if (backward && version != 0 && version <= 91500 && Tn % 128 != 0) {
        snprintf(reason, sizeof reason,
                 "T=%d is not a multiple of 128, which cuDNN %zu's attention backward needs without a padding mask",
                 Tn, version);
        return reason;
    }
    return nullptr;
}

/* Tests: calls (forward or backward) cuDNN ran so far. */
extern "C" long gt_cuda_attention_cudnn_calls(void) { return g_cudnn_calls; }

/* Tests: the reason of the latest fallback ("" when none yet); only the first one is printed. */
extern "C" const char *gt_cuda_attention_cudnn_last_fallback(void) { return g_last_fallback; }

/* Tests: the loaded cuDNN's version (e.g. 91900) when the library loads and a handle exists, else 0
 * with the reason in why. Loads the library (without printing anything). */
extern "C" long gt_cuda_attention_cudnn_version(char *why, size_t n) {
#if GTRAIN_HAVE_CUDNN_HEADERS
    if (api_ready()) return (long)g_api.version;
    if (why && n) snprintf(why, n, "%s", g_load_reason);
#else
    if (why && n) snprintf(why, n, "gtrain was built without cuDNN's headers (cudnn_graph.h)");
#endif
    return 0;
}

/* Tests without a device (tests/test_cudnn_graph.c): loads libcudnn's symbols only (no handle, so
 * never after a real use in the same process), builds the forward or backward graph's tensors and
 * operations and finalizes each of them, which is where cuDNN checks their types, dimensions and
 * strides; the operation graph, the engines and execution need a device and are not reached.
 * Returns 1 when every descriptor finalized, 0 with the reason in why. */
extern "C" int gt_cuda_attention_cudnn_graph_check(int backward, int B, int Tn, int NH, int NKV, int HD,
                                                   const char *device_json, char *why, size_t n) {
#if GTRAIN_HAVE_CUDNN_HEADERS
    if (g_load_state != 0 || g_api.handle) {
        if (why && n) snprintf(why, n, "the library is already in use");
        return 0;
    }
    static int symbols = 0; /* 0 not tried, 1 loaded, -1 not loadable */
    if (symbols == 0) symbols = load_symbols() ? 1 : -1;
    if (symbols < 0) {
        if (why && n) snprintf(why, n, "%s", g_load_reason);
        return 0;
    }
    if (device_json && !g_check_device) {
        cudnnBackendDescriptor_t dev = nullptr;
        cudnnStatus_t st = g_api.CreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &dev);
        if (st == CUDNN_STATUS_SUCCESS)
            st = g_api.SetAttribute(dev, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                    (int64_t)strlen(device_json), device_json);
        if (st == CUDNN_STATUS_SUCCESS) st = g_api.Finalize(dev);
        if (st != CUDNN_STATUS_SUCCESS) {
            if (dev) g_api.DestroyDescriptor(dev);
            if (why && n) snprintf(why, n, "the device description was refused (%s)", g_api.GetErrorString(st));
            return 0;
        }
        g_check_device = dev;
    }
    static Plan p;
    memset(&p, 0, sizeof p);
    p.backward = backward, p.B = B, p.T = Tn, p.NH = NH, p.NKV = NKV, p.HD = HD;
    Build b;
    memset(&b, 0, sizeof b);
    b.p = &p;
    b.ok = true;
    b.next_uid = UID_VIRTUAL0;
    if (backward) build_backward(b);
    else build_forward(b);
    build_plan(b); /* without a handle or a device description: stops after the operation graph */
    for (int i = 0; i < p.ndesc; i++) g_api.DestroyDescriptor(p.desc[i]);
    if (!b.ok && why && n) snprintf(why, n, "%s", b.why);
    return b.ok ? 1 : 0;
#else
    (void)backward, (void)B, (void)Tn, (void)NH, (void)NKV, (void)HD;
    if (why && n) snprintf(why, n, "gtrain was built without cuDNN's headers (cudnn_graph.h)");
    return 0;
#endif
}

/* Tests: 1 when the static fallback rules let this call go to cuDNN (cuDNN may still refuse it). */
extern "C" int gt_cuda_attention_cudnn_shape_ok(int backward, int Tn, int HD, float dropout) {
#if GTRAIN_HAVE_CUDNN_HEADERS
    const size_t version = g_load_state == 1 ? g_api.version : 0;
#else
    const size_t version = 0;
#endif
    return cudnn_shape_rule(backward, Tn, HD, dropout, version) == nullptr;
}

#if GTRAIN_HAVE_CUDNN_HEADERS
/* The checks both entry points make, in order: the library, the shape rule, 16-byte alignment (aligned:
 * every tensor of the call is), then the plan of the shape. nullptr after saying why (say_fallback; a
 * plan that failed before said so then). */
static Plan *plan_for_call(int backward, bool aligned, int B, int Tn, int NH, int NKV, int HD, float dropout) {
    if (!api_ready()) {
        say_fallback(g_load_reason);
        return nullptr;
    }
    const char *why = cudnn_shape_rule(backward, Tn, HD, dropout, g_api.version);
    if (!why && !aligned) why = "a tensor is not 16-byte aligned";
    if (why) {
        say_fallback(why);
        return nullptr;
    }
    Plan *p = get_plan(backward, B, Tn, NH, NKV, HD, &why);
    if (!p && why) say_fallback(why);
    return p;
}

/* an entry point's return value after execute(): 1 and counted when cuDNN ran the call, else 0 after
 * saying why */
static int ran_call(bool ran, const char *why) {
    if (!ran) {
        say_fallback(why);
        return 0;
    }
    g_cudnn_calls++;
    return 1;
}
#endif

/* Called by cuda_attention.cu's attention_forward for the bf16 working type when the selected variant
 * is GT_CUDA_ATTENTION_CUDNN, after its shape checks (NH % NKV == 0, B, T > 0); returns 1 when cuDNN ran
 * the call, 0 to use the default kernels. */
int gt_cuda_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int Tn,
                                    int NH, int NKV, int HD, float dropout) {
#if GTRAIN_HAVE_CUDNN_HEADERS
    const bool aligned = aligned16(out) && aligned16(lse) && aligned16(q) && aligned16(k) && aligned16(v);
    Plan *p = plan_for_call(0, aligned, B, Tn, NH, NKV, HD, dropout);
    if (!p) return 0;
    const char *why = nullptr;
    void *ws = p->workspace > 0 ? gt_cuda_alloc((size_t)p->workspace) : nullptr;
    const int64_t uids[7] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *const ptrs[7] = {(void *)q, (void *)k, (void *)v, out, lse, &p->scale, &p->neg_inf};
    const bool ran = execute(p, 7, uids, ptrs, ws, &why);
    if (ws) gt_cuda_free(ws); /* stream-ordered: a later user of the block runs after cuDNN's kernels */
    return ran_call(ran, why);
#else
    (void)out, (void)lse, (void)q, (void)k, (void)v, (void)B, (void)Tn, (void)NH, (void)NKV, (void)HD, (void)dropout;
    say_fallback("gtrain was built without cuDNN's headers (cudnn_graph.h)");
    return 0;
#endif
}

/* As above for attention_backward: lse is the forward's, whichever variant wrote it (same layout and
 * meaning, see the header). */
int gt_cuda_attention_cudnn_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const void *q,
                                     const void *k, const void *v, const float *lse, int B, int Tn, int NH, int NKV,
                                     int HD, float dropout) {
#if GTRAIN_HAVE_CUDNN_HEADERS
    const bool aligned = aligned16(dq) && aligned16(dk) && aligned16(dv) && aligned16(dout) && aligned16(out) &&
                         aligned16(q) && aligned16(k) && aligned16(v) && aligned16(lse);
    Plan *p = plan_for_call(1, aligned, B, Tn, NH, NKV, HD, dropout);
    if (!p) return 0;
    const char *why = nullptr;
    /* one block: cuDNN's workspace, then the D scratch (B, NH, T) and the fp32 dQ accumulator */
    const size_t ws_bytes = round_up((size_t)p->workspace);
    const size_t dsum_bytes = round_up(sizeof(float) * (size_t)B * NH * Tn);
    const size_t acc_bytes = sizeof(float) * (size_t)B * NH * Tn * HD;
    char *block = (char *)gt_cuda_alloc(ws_bytes + dsum_bytes + acc_bytes);
    void *ws = p->workspace > 0 ? (void *)block : nullptr;
    void *dsum = block + ws_bytes, *acc = block + ws_bytes + dsum_bytes;
    /* cudnn-frontend zeroes the accumulator for cuDNN < 9.6 and leaves it to cuDNN after; zeroing it
     * always costs one memset and is right for both */
    CUDA_CHECK(cudaMemsetAsync(acc, 0, acc_bytes, (cudaStream_t)0));
    const int64_t uids[14] = {UID_Q,  UID_K,  UID_V,     UID_O,       UID_DO,   UID_STATS, UID_DQ,
                              UID_DK, UID_DV, UID_SCALE, UID_NEG_INF, UID_ONE, UID_DSUM,  UID_DQ_ACCUM};
    void *const ptrs[14] = {(void *)q, (void *)k,  (void *)v,  (void *)out, (void *)dout,   (void *)lse, dq,
                            dk,        dv,         &p->scale,  &p->neg_inf, &p->one,        dsum,        acc};
    const bool ran = execute(p, 14, uids, ptrs, ws, &why);
    gt_cuda_free(block); /* stream-ordered, as in forward */
    return ran_call(ran, why);
#else
    (void)dq, (void)dk, (void)dv, (void)dout, (void)out, (void)q, (void)k, (void)v, (void)lse, (void)B, (void)Tn;
    (void)NH, (void)NKV, (void)HD, (void)dropout;
    say_fallback("gtrain was built without cuDNN's headers (cudnn_graph.h)");
    return 0;
#endif
}
