# tests/gpu/mma_emu.py — what emulate_mma_attention_fwd.py and emulate_mma_attention_bwd.py share: a
# numpy emulation of the warp-level PTX instructions that src/kernels/cuda/cuda_attention_mma.cu uses
# (ldmatrix(.trans).x4, mma.sync m16n8k16 .row.col bf16 -> f32, shfl.sync.bfly, cp.async's zero fill),
# built from the PTX ISA's fragment tables, plus the pieces both transcriptions need (the loaders,
# the kernels' shared helpers head_rows, mma_abt(_kblock), mma_pv and gt_attention_drop_index, the stand-in
# dropout keep function, a direct fp64 attention forward and backward, and the harness
# that runs the shapes and the mutation checks).
#
# Registers are numpy arrays with the lane as the first axis, so a kernel line such as
#   const int key = nt * 8 + (lane & 7) + ((lane >> 4) << 3);
# is transcribed as the same expression over LANE = [0 .. 31]:
#   an fp32 register -> shape (32,);  an m16n8 accumulator c[4] -> (32, 4);
#   four .b32 registers of two bf16 each (an A fragment, ldmatrix.x4's result) -> (32, 4, 2), the last
#   axis (low half, high half); a B register pair -> two (32, 2) arrays.
# Values are fp64 and never rounded to bf16 or fp32: these checks are about where each element goes,
# not about rounding. Shared memory is one flat fp64 array in bf16 element units at the kernel's offsets,
# filled with NaN, so a read of shared memory the kernel never wrote poisons the result, as garbage
# would on the GPU.
#
# Mutations (set_mutation): deliberately wrong fragment formulas; each script reruns a shape under each
# of them and fails unless every one is caught, so the comparison is shown able to fail.
import sys

try:
    import numpy as np
except ImportError:
    print("mma_emu: numpy is missing: run with a Python that has it (configure with "
          "-DGTRAIN_HF_PYTHON=/path/to/python, tools/setup-venv.sh makes one)")
    sys.exit(1)

MM_BM = 64  # query (forward, dq) or key (dk/dv) rows per block: 4 warps of 16
LANE = np.arange(32)

MUTATIONS = {
    "a_regs": "A fragment: a[1] and a[2] swapped (a[1] = row g, cols 2c+8..; a[2] = row g+8, cols 2c..)",
    "b_regs": "B fragment: b[0] and b[1] swapped (b[0] = k 2c+8, 2c+9)",
    "c_rows": "C/D fragment: c[0], c[1] on row g+8 and c[2], c[3] on row g",
    "ldmatrix_trans": ".trans ignored (ldmatrix.trans gives the untransposed registers)",
    "ldmatrix_row": "ldmatrix: register i of lane l from row l % 8 instead of l / 4 (and column 2 (l / 8) ..)",
    "shfl_bfly": "shfl.sync.bfly: partner lane ^ (mask << 2), across rows instead of within a quad",
}
_mutation = None


# ---- the PTX ISA's fragment tables, element by element ------------------------------------------
# "Matrix Fragments for mma.m16n8k16 with floating point type" (.bf16), lane = 4 groupID +
# threadID_in_group. The ISA numbers the bf16 elements a0..a7, b0..b3 (two per .b32 register, the
# lower index in the low half) and c0..c3.
def a_elem(lane, i):
    """(row, col) of A element a_i (register i // 2, half i % 2) held by lane."""
    g, c = lane >> 2, lane % 4
    if _mutation == "a_regs":
        i = {2: 4, 3: 5, 4: 2, 5: 3}.get(i, i)
    row = g if (i < 2 or 4 <= i < 6) else g + 8
    col = 2 * c + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def b_elem(lane, i):
    """(row k, col n) of B element b_i (register i // 2, half i % 2) held by lane."""
    g, c = lane >> 2, lane % 4
    if _mutation == "b_regs":
        i ^= 2
    return 2 * c + (i & 1) + (8 if i >= 2 else 0), g


def c_elem(lane, i):
    """(row, col) of accumulator element c_i held by lane."""
    g, c = lane >> 2, lane % 4
    upper = i >= 2
    if _mutation == "c_rows":
        upper = not upper
    return (g + 8 if upper else g), 2 * c + (i & 1)


def ldmatrix_elem(lane, half, trans):
    """(row, col) within 8x8 matrix i of the half'th b16 of register i of lane ("ldmatrix": each
    thread gets two consecutive elements of row lane / 4; with .trans the matrix is transposed)."""
    row, col = lane // 4, 2 * (lane % 4) + half
    if _mutation == "ldmatrix_row":
        row, col = lane % 8, 2 * (lane // 8) + half
    if trans and _mutation != "ldmatrix_trans":
        row, col = col, row
    return row, col


def _tables():
    t = {}
    t["A"] = np.array([[[a_elem(l, 2 * r + h) for h in range(2)] for r in range(4)] for l in range(32)])
    t["B"] = np.array([[[b_elem(l, 2 * r + h) for h in range(2)] for r in range(2)] for l in range(32)])
    t["C"] = np.array([[c_elem(l, i) for i in range(4)] for l in range(32)])
    t["L"] = np.array([[ldmatrix_elem(l, h, False) for h in range(2)] for l in range(32)])
    t["LT"] = np.array([[ldmatrix_elem(l, h, True) for h in range(2)] for l in range(32)])
    # every element of each matrix is held by exactly one (lane, register, half): a table that is not
    # a bijection is a typo, not a layout
    for name, shape in (("A", (16, 16)), ("B", (16, 8)), ("C", (16, 8))):
        rc = t[name].reshape(-1, 2)
        seen = np.zeros(shape, int)
        np.add.at(seen, (rc[:, 0], rc[:, 1]), 1)
        assert (seen == 1).all(), f"fragment table {name} is not a bijection"
    for name in ("L", "LT"):
        rc = t[name].reshape(-1, 2)
        seen = np.zeros((8, 8), int)
        np.add.at(seen, (rc[:, 0], rc[:, 1]), 1)
        assert (seen == 1).all(), f"ldmatrix table {name} is not a bijection"
    return t


_T = _tables()


def set_mutation(name):
    """None for the PTX ISA's layouts, or a key of MUTATIONS."""
    global _mutation, _T
    assert name is None or name in MUTATIONS
    _mutation = name
    _T = _tables()


# ---- the instructions ------------------------------------------------------------------------------
stats = {"ldmatrix": 0, "mma": 0, "bank_conflicts": 0, "misaligned": 0}


def ldmatrix_x4(smem, addrs, trans=False):
    """ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: addrs[l] (bf16 element offset into the
    block's shared memory, which is 128-byte aligned) is the row lane l provides: lanes 8i..8i+7 give
    rows 0-7 of matrix i. Returns the (32, 4, 2) registers. Also counts rows not 16-byte aligned and
    8-row phases whose rows share a shared-memory bank (4-byte banks, 32 of them)."""
    addrs = np.broadcast_to(np.asarray(addrs), (32,))
    stats["ldmatrix"] += 1
    stats["misaligned"] += int((addrs % 8 != 0).sum())
    for i in range(4):
        first = (addrs[8 * i: 8 * i + 8] * 2 // 4) % 32  # each row covers 4 banks from its first
        banks = (first[:, None] + np.arange(4)) % 32
        if len(np.unique(banks)) != 32:
            stats["bank_conflicts"] += 1
    M = smem[addrs[:, None] + np.arange(8)].reshape(4, 8, 8)  # matrix i, row r: lane 8i + r's 8 elements
    t = _T["LT" if trans else "L"]
    return M[:, t[:, :, 0], t[:, :, 1]].transpose(1, 0, 2)


def ldmatrix_x4_trans(smem, addrs):
    return ldmatrix_x4(smem, addrs, trans=True)


def mma_bf16(c, a, b0, b1):
    """mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: c (32, 4) + A (a: (32, 4, 2)) B (b0, b1:
    (32, 2) each). Returns the new (32, 4) accumulator."""
    stats["mma"] += 1
    A = np.full((16, 16), np.nan)
    B = np.full((16, 8), np.nan)
    C = np.full((16, 8), np.nan)
    A[_T["A"][..., 0], _T["A"][..., 1]] = a
    B[_T["B"][..., 0], _T["B"][..., 1]] = np.stack([b0, b1], axis=1)
    C[_T["C"][..., 0], _T["C"][..., 1]] = c
    D = A @ B + C
    return D[_T["C"][..., 0], _T["C"][..., 1]]


def shfl_xor(v, mask):
    """__shfl_xor_sync(0xffffffff, v, mask) (shfl.sync.bfly): lane l gets lane (l ^ mask)'s v."""
    src = LANE ^ (mask << 2 if _mutation == "shfl_bfly" else mask)
    return v[src % 32]


def pack_bf16(lo, hi):
    """pack_bf16 (__floats2bfloat162_rn): lo in the low half; not rounded here."""
    return np.stack([lo, hi], axis=-1)


def new_smem(n):
    return np.full(n, np.nan)


def load_tile(smem, dst, src, base, stride, row0, Tn, HD, ROWS, threads=128):
    """load_tile_async<HD, ROWS>(smem + dst, gmem + base, stride, row0, Tn): each 16-byte chunk idx of
    the tile, rows past Tn zero-filled (cp.async with src_bytes 0). The strided thread loop is one pass
    over every idx here."""
    LD, CH = HD + 8, HD // 8
    idx = np.arange(0, ROWS * CH)  # threadIdx.x, threadIdx.x + MM_THREADS, ...: all of them once
    r = idx // CH
    c = (idx % CH) * 8
    t = row0 + r
    s = np.where(t < Tn, base + t * stride + c, base)
    vals = np.where((t < Tn)[:, None], src[s[:, None] + np.arange(8)], 0.0)
    smem[(dst + r * LD + c)[:, None] + np.arange(8)] = vals


def load_stat(sbuf, dst, src, base, row0, Tn, N):
    """load_stat_async<N>(sbuf + dst, gmem + base, row0, Tn): N floats, past Tn zero (4-byte cp.async)."""
    i = np.arange(N)
    t = row0 + i
    sbuf[dst + i] = np.where(t < Tn, src[np.where(t < Tn, base + t, base)], 0.0)


def head_rows(b, Tn, stride, h, HD):
    """head_rows(x, b, Tn, stride, h, HD) of cuda_common.cuh: the offset of row 0 of head h of batch b"""
    return b * Tn * stride + h * HD


# ---- the kernels' shared device helpers (cuda_attention_mma.cu), used by both transcriptions --------
def mma_abt_kblock(acc, a, smem, Bs, kk, HD, NT):
    """mma_abt_kblock<HD, NT>(acc, a, smem + Bs, kk, lane): acc (NT, 32, 4) += k-block kk of A B^T, A's
    fragment a (32, 4, 2)"""
    LD = HD + 8
    lane = LANE
    for nt in range(0, NT, 2):
        row = nt * 8 + (lane & 7) + ((lane >> 4) << 3)
        r = ldmatrix_x4(smem, Bs + row * LD + kk * 16 + ((lane >> 3) & 1) * 8)
        acc[nt] = mma_bf16(acc[nt], a, r[:, 0], r[:, 1])
        acc[nt + 1] = mma_bf16(acc[nt + 1], a, r[:, 2], r[:, 3])


def mma_abt(acc, smem, As, Bs, HD, NT):
    """mma_abt<HD, NT>(acc, smem + As, smem + Bs, lane): acc (NT, 32, 4) += A B^T"""
    LD = HD + 8
    lane = LANE
    for kk in range(HD // 16):
        a = ldmatrix_x4(smem, As + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8)
        mma_abt_kblock(acc, a, smem, Bs, kk, HD, NT)


def mma_pv(acc, p, smem, Vs, HD, NT):
    """mma_pv<HD, NT>(acc, p, smem + Vs, lane): acc (HD / 8, 32, 4) += P V, P (NT, 32, 4) in C layout"""
    LD, DT = HD + 8, HD // 8
    lane = LANE
    for j in range(NT // 2):
        pa = np.stack([pack_bf16(p[2 * j][:, 0], p[2 * j][:, 1]),
                       pack_bf16(p[2 * j][:, 2], p[2 * j][:, 3]),
                       pack_bf16(p[2 * j + 1][:, 0], p[2 * j + 1][:, 1]),
                       pack_bf16(p[2 * j + 1][:, 2], p[2 * j + 1][:, 3])], axis=1)
        for dt in range(0, DT, 2):
            row = j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8
            r = ldmatrix_x4_trans(smem, Vs + row * LD + dt * 8 + (lane >> 4) * 8)
            acc[dt] = mma_bf16(acc[dt], pa, r[:, 0], r[:, 1])
            acc[dt + 1] = mma_bf16(acc[dt + 1], pa, r[:, 2], r[:, 3])


def gt_attention_drop_index(b, h, t, s, NH, Tn):
    return ((b * NH + h) * Tn + t) * Tn + s


def keepf(idx, p):
    """stand-in for gt_dropout_keep_at(rng, idx, p) (ops.h): any deterministic function of the element index does;
    this one keeps about 1 - p of them"""
    return ((np.asarray(idx, dtype=np.int64) * 2654435761) % 1000) / 1000.0 >= p


# ---- the reference: direct fp64 causal GQA attention -------------------------------------------
def reference(q, k, v, dout, dropout):
    """q, dout (B, T, NH, HD); k, v (B, T, NKV, HD). Returns out, lse (B, NH, T), dq, dk, dv, D (B, NH, T)
    with the semantics of cuda_attention.cu: scale 1/sqrt(HD), causal s <= t, GQA head h reads kv head
    h / (NH / NKV), lse = m + log(l) before dropout, dropout keep at ((b NH + h) T + t) T + s scaled by
    1/(1-p), D = rowsum(dout * out)."""
    B, Tn, NH, HD = q.shape
    NKV = k.shape[2]
    scale = 1.0 / np.sqrt(HD)
    ks = 1.0 / (1.0 - dropout) if dropout > 0 else 1.0
    group = NH // NKV
    out = np.zeros_like(q)
    lse = np.zeros((B, NH, Tn))
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    D = np.zeros((B, NH, Tn))
    t_ = np.arange(Tn)
    mask = t_[None, :] <= t_[:, None]
    for b in range(B):
        for h in range(NH):
            g = h // group
            S = np.where(mask, q[b, :, h] @ k[b, :, g].T * scale, -np.inf)
            m = S.max(1, keepdims=True)
            P = np.exp(S - m)
            l = P.sum(1, keepdims=True)
            P = P / l
            lse[b, h] = (m + np.log(l))[:, 0]
            K = np.ones((Tn, Tn))
            if dropout > 0:
                K = np.where(keepf(((b * NH + h) * Tn + t_[:, None]) * Tn + t_[None, :], dropout), ks, 0.0)
            Pd = P * K
            out[b, :, h] = Pd @ v[b, :, g]
            D[b, h] = (dout[b, :, h] * out[b, :, h]).sum(1)
            dS = P * ((dout[b, :, h] @ v[b, :, g].T) * K - D[b, h][:, None]) * scale
            dq[b, :, h] = dS @ k[b, :, g]
            dk[b, :, g] += dS.T @ q[b, :, h]
            dv[b, :, g] += Pd.T @ dout[b, :, h]
    return out, lse, dq, dk, dv, D


def inputs(B, Tn, NH, NKV, HD, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Tn, NH, HD)), rng.standard_normal((B, Tn, NKV, HD)),
            rng.standard_normal((B, Tn, NKV, HD)), rng.standard_normal((B, Tn, NH, HD)))


def rel_err(got, want):
    """max |got - want| / max(max |want|, 1); inf when anything was left unwritten (NaN)"""
    if np.isnan(got).any():
        return float("inf")
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1.0))


TOL = 1e-10


def main(run, shapes, mutations, mutation_shape):
    """run(shape) -> dict name: rel err. Every shape must match to TOL with the ISA's layouts, and each
    mutation must make mutation_shape miss; exit status 0 only then."""
    ok = True
    for shape in shapes:
        errs = run(*shape)
        good = all(e < TOL for e in errs.values())
        ok &= good
        B, Tn, NH, NKV, HD, p = shape
        print(f"B{B} T{Tn} NH{NH} NKV{NKV} HD{HD} p{p}: rel err " +
              " ".join(f"{n} {e:.2e}" for n, e in errs.items()) + ("" if good else "  MISMATCH"), flush=True)
    if stats["misaligned"] or stats["bank_conflicts"]:
        ok = False
    print(f"{stats['ldmatrix']} ldmatrix, {stats['mma']} mma; ldmatrix rows not 16-byte aligned: "
          f"{stats['misaligned']}, 8-row phases with a bank conflict: {stats['bank_conflicts']}")
    for name in mutations:
        set_mutation(name)
        try:
            errs = run(*mutation_shape)
            caught = any(not e < TOL for e in errs.values())
        except (IndexError, ValueError) as ex:  # an address out of range is caught too
            caught, errs = True, {"exception": ex}
        finally:
            set_mutation(None)
        ok &= caught
        print(f"mutation {name} ({MUTATIONS[name]}): " + ("caught" if caught else "NOT CAUGHT (the check cannot fail)"),
              flush=True)
    print("ALL OK" if ok else "FAILED")
    return 0 if ok else 1
