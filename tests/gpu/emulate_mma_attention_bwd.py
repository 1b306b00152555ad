#!/usr/bin/env python3
# tests/gpu/emulate_mma_attention_bwd.py — a lane-by-lane numpy emulation of the index math of the mma
# attention backward (src/kernels/cuda/cuda_attention_mma.cu: mma_abt, mma_pv, the dq and dk/dv
# kernels), which has NEVER RUN ON A GPU. ldmatrix(.trans).x4 and mma.sync m16n8k16 are emulated from
# the PTX ISA's fragment tables (A, B, C/D of m16n8k16 .bf16; the ldmatrix thread-to-row mapping), the
# kernels are transcribed by hand (same loops, same lane/row/column formulas, same causal skips and
# step order), and dq, dk, dv are compared with a direct attention backward (D from the output,
# dropout with a stand-in keep function at the kernels' index ((b*NH + h)*T + t)*T + s).
# fp64 throughout: it checks which element goes where, not bf16 rounding, the real RNG, cp.async
# ordering or barriers. A transcription, so it must be edited with the kernels.
# Run: /opt/gtrain-venv/bin/python tests/gpu/emulate_mma_attention_bwd.py (about 30 s, one core;
# not a CTest test). Exit 0 when every shape matches to 1e-10.
import numpy as np
import sys

MM_BM = 64

# ---- PTX semantics -------------------------------------------------------------
def ldmatrix_x4(smem, addrs, trans=False):
    """addrs[l]: element offset of the row lane l provides. Returns regs[l][i] = (lo, hi)."""
    regs = [[None] * 4 for _ in range(32)]
    for i in range(4):
        M = np.array([smem[addrs[8 * i + r]: addrs[8 * i + r] + 8] for r in range(8)])  # 8x8
        for l in range(32):
            if not trans:
                regs[l][i] = (M[l // 4, 2 * (l % 4)], M[l // 4, 2 * (l % 4) + 1])
            else:
                regs[l][i] = (M[2 * (l % 4), l // 4], M[2 * (l % 4) + 1, l // 4])
    return regs

def mma(c, a, b0, b1):
    """c[l] = [4 floats]; a[l] = 4 pairs; b0[l], b1[l] pairs. Returns new c."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
    for l in range(32):
        g, t = l >> 2, l % 4
        for i in range(8):  # a0..a7
            reg, half = i // 2, i % 2
            row = g if (i < 2 or 4 <= i < 6) else g + 8
            col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
            A[row, col] = a[l][reg][half]
        for i in range(4):  # b0..b3
            reg, half = i // 2, i % 2
            row = t * 2 + (i & 1) + (8 if i >= 2 else 0)
            B[row, g] = (b0 if reg == 0 else b1)[l][half]
        for i in range(4):
            row = g if i < 2 else g + 8
            C[row, t * 2 + (i & 1)] = c[l][i]
    D = A @ B + C
    out = []
    for l in range(32):
        g, t = l >> 2, l % 4
        out.append([D[g if i < 2 else g + 8, t * 2 + (i & 1)] for i in range(4)])
    return out

# ---- the kernel helpers, transcribed ---------------------------------------------
def mma_abt(acc, smem, As, Bs, HD, NT):
    LD = HD + 8
    for kk in range(HD // 16):
        a = ldmatrix_x4(smem, [As + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8 for lane in range(32)])
        for nt in range(0, NT, 2):
            r = ldmatrix_x4(smem, [Bs + (nt * 8 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8
                                   for lane in range(32)])
            acc[nt] = mma(acc[nt], a, [x[0] for x in r], [x[1] for x in r])
            acc[nt + 1] = mma(acc[nt + 1], a, [x[2] for x in r], [x[3] for x in r])

def mma_pv(acc, p, smem, Vs, HD, NT):
    LD = HD + 8; DT = HD // 8
    for j in range(NT // 2):
        pa = [[(p[2 * j][l][0], p[2 * j][l][1]), (p[2 * j][l][2], p[2 * j][l][3]),
               (p[2 * j + 1][l][0], p[2 * j + 1][l][1]), (p[2 * j + 1][l][2], p[2 * j + 1][l][3])] for l in range(32)]
        for dt in range(0, DT, 2):
            r = ldmatrix_x4(smem, [Vs + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dt * 8 + (lane >> 4) * 8
                                   for lane in range(32)], trans=True)
            acc[dt] = mma(acc[dt], pa, [x[0] for x in r], [x[1] for x in r])
            acc[dt + 1] = mma(acc[dt + 1], pa, [x[2] for x in r], [x[3] for x in r])

def load_tile(smem, dst, src2d, row0, rows, Tn, HD):
    LD = HD + 8
    for r in range(rows):
        t = row0 + r
        smem[dst + r * LD: dst + r * LD + HD] = src2d[t] if t < Tn else 0.0

def keepf(idx, p):
    return ((idx * 2654435761) % 1000) / 1000.0 >= p

def zeros_acc(n):
    return [[[0.0] * 4 for _ in range(32)] for _ in range(n)]

# ---- dq kernel -----------------------------------------------------------------
def dq_kernel(dq, Dbuf, dout, q, k, v, lse, B, Tn, NH, NKV, HD, BN, scale, dropout, keep_scale):
    LD = HD + 8; NT = BN // 8; DT = HD // 8
    ntq = (Tn + MM_BM - 1) // MM_BM
    for b in range(B):
        for h in range(NH):
            g = h // (NH // NKV)
            for bx in range(ntq):
                qtile = ntq - 1 - bx
                q0 = qtile * MM_BM
                smem = np.zeros((2 * MM_BM + 4 * BN) * LD)
                sQ, sdO, sK, sV = 0, MM_BM * LD, 2 * MM_BM * LD, 2 * MM_BM * LD + 2 * BN * LD
                last = min(q0 + MM_BM, Tn) - 1
                ntiles = last // BN + 1
                load_tile(smem, sQ, q[b, :, h], q0, MM_BM, Tn, HD)
                load_tile(smem, sdO, dout[b, :, h], q0, MM_BM, Tn, HD)
                load_tile(smem, sK, k[b, :, g], 0, BN, Tn, HD)
                load_tile(smem, sV, v[b, :, g], 0, BN, Tn, HD)
                accs = [zeros_acc(DT) for _ in range(4)]
                for tile in range(ntiles):
                    k0, stage = tile * BN, tile & 1
                    if tile + 1 < ntiles:
                        load_tile(smem, sK + (stage ^ 1) * BN * LD, k[b, :, g], k0 + BN, BN, Tn, HD)
                        load_tile(smem, sV + (stage ^ 1) * BN * LD, v[b, :, g], k0 + BN, BN, Tn, HD)
                    tK, tV = sK + stage * BN * LD, sV + stage * BN * LD
                    for warp in range(4):
                        w0 = q0 + warp * 16
                        if not (w0 < Tn and k0 <= min(w0 + 15, Tn - 1)):
                            continue
                        s = zeros_acc(NT); dp = zeros_acc(NT)
                        mma_abt(s, smem, sQ + warp * 16 * LD, tK, HD, NT)
                        mma_abt(dp, smem, sdO + warp * 16 * LD, tV, HD, NT)
                        for l in range(32):
                            quad = l & 3; row_a = w0 + (l >> 2); row_b = row_a + 8
                            for nt in range(NT):
                                for e in range(4):
                                    r = row_a if e < 2 else row_b
                                    col = k0 + nt * 8 + 2 * quad + (e & 1)
                                    ds = 0.0
                                    if col <= r and r < Tn:
                                        p = np.exp(s[nt][l][e] * scale - lse[b, h, r])
                                        d = dp[nt][l][e]
                                        if dropout > 0:
                                            idx = ((b * NH + h) * Tn + r) * Tn + col
                                            d = d * keep_scale if keepf(idx, dropout) else 0.0
                                        ds = p * (d - Dbuf[b, h, r]) * scale
                                    s[nt][l][e] = ds
                        mma_pv(accs[warp], s, smem, tK, HD, NT)
                for warp in range(4):
                    w0 = q0 + warp * 16
                    if w0 >= Tn:
                        continue
                    for l in range(32):
                        quad = l & 3; row_a = w0 + (l >> 2)
                        for dt in range(DT):
                            for e in range(4):
                                r = row_a + (8 if e >= 2 else 0)
                                if r < Tn:
                                    dq[b, r, h, dt * 8 + 2 * quad + (e & 1)] = accs[warp][dt][l][e]

# ---- dk/dv kernel --------------------------------------------------------------
def dkdv_kernel(dk, dv, Dbuf, dout, q, k, v, lse, B, Tn, NH, NKV, HD, BQ, scale, dropout, keep_scale):
    LD = HD + 8; NT = BQ // 8; DT = HD // 8
    ntk = (Tn + MM_BM - 1) // MM_BM
    group = NH // NKV
    for b in range(B):
        for g in range(NKV):
            for bx in range(ntk):
                ktile = bx
                k0 = ktile * MM_BM
                smem = np.zeros((2 * MM_BM + 4 * BQ) * LD)
                sK, sV, sQ, sdO = 0, MM_BM * LD, 2 * MM_BM * LD, 2 * MM_BM * LD + 2 * BQ * LD
                sL = np.zeros(2 * BQ); sD = np.zeros(2 * BQ)
                qt0 = k0 // BQ; nq = (Tn + BQ - 1) // BQ - qt0; nsteps = group * nq
                load_tile(smem, sK, k[b, :, g], k0, MM_BM, Tn, HD)
                load_tile(smem, sV, v[b, :, g], k0, MM_BM, Tn, HD)

                def load_step(st, h, q0):
                    load_tile(smem, sQ + st * BQ * LD, q[b, :, h], q0, BQ, Tn, HD)
                    load_tile(smem, sdO + st * BQ * LD, dout[b, :, h], q0, BQ, Tn, HD)
                    for i in range(BQ):
                        t = q0 + i
                        sL[st * BQ + i] = lse[b, h, t] if t < Tn else 0.0
                        sD[st * BQ + i] = Dbuf[b, h, t] if t < Tn else 0.0
                load_step(0, g * group, qt0 * BQ)
                dks = [zeros_acc(DT) for _ in range(4)]; dvs = [zeros_acc(DT) for _ in range(4)]
                for it in range(nsteps):
                    stage = it & 1
                    h = g * group + it // nq; q0 = (qt0 + it % nq) * BQ
                    if it + 1 < nsteps:
                        load_step(stage ^ 1, g * group + (it + 1) // nq, (qt0 + (it + 1) % nq) * BQ)
                    tQ, tdO = sQ + stage * BQ * LD, sdO + stage * BQ * LD
                    for warp in range(4):
                        w0 = k0 + warp * 16
                        if not (w0 < Tn and q0 + BQ - 1 >= w0):
                            continue
                        s = zeros_acc(NT); dp = zeros_acc(NT)
                        mma_abt(s, smem, sK + warp * 16 * LD, tQ, HD, NT)
                        mma_abt(dp, smem, sV + warp * 16 * LD, tdO, HD, NT)
                        for l in range(32):
                            quad = l & 3; row_a = w0 + (l >> 2); row_b = row_a + 8
                            for nt in range(NT):
                                for e in range(4):
                                    sk = row_a if e < 2 else row_b
                                    c = nt * 8 + 2 * quad + (e & 1); tq = q0 + c
                                    pt = ds = 0.0
                                    if tq < Tn and sk <= tq:
                                        p = np.exp(s[nt][l][e] * scale - sL[stage * BQ + c])
                                        d = dp[nt][l][e]; pt = p
                                        if dropout > 0:
                                            keep = keepf(((b * NH + h) * Tn + tq) * Tn + sk, dropout)
                                            d = d * keep_scale if keep else 0.0
                                            pt = p * keep_scale if keep else 0.0
                                        ds = p * (d - sD[stage * BQ + c]) * scale
                                    s[nt][l][e] = pt; dp[nt][l][e] = ds
                        mma_pv(dvs[warp], s, smem, tdO, HD, NT)
                        mma_pv(dks[warp], dp, smem, tQ, HD, NT)
                for warp in range(4):
                    w0 = k0 + warp * 16
                    if w0 >= Tn:
                        continue
                    for l in range(32):
                        quad = l & 3; row_a = w0 + (l >> 2)
                        for dt in range(DT):
                            for e in range(4):
                                r = row_a + (8 if e >= 2 else 0)
                                if r < Tn:
                                    dk[b, r, g, dt * 8 + 2 * quad + (e & 1)] = dks[warp][dt][l][e]
                                    dv[b, r, g, dt * 8 + 2 * quad + (e & 1)] = dvs[warp][dt][l][e]

# ---- reference -----------------------------------------------------------------
def reference(q, k, v, dout, B, Tn, NH, NKV, HD, dropout):
    scale = 1.0 / np.sqrt(HD); ks = 1.0 / (1.0 - dropout) if dropout > 0 else 1.0
    group = NH // NKV
    out = np.zeros_like(q); lse = np.zeros((B, NH, Tn))
    dq = np.zeros_like(q); dk = np.zeros_like(k); dv = np.zeros_like(v)
    for b in range(B):
        for h in range(NH):
            g = h // group
            S = q[b, :, h] @ k[b, :, g].T * scale
            mask = np.tril(np.ones((Tn, Tn), bool))
            S = np.where(mask, S, -np.inf)
            m = S.max(1, keepdims=True)
            P = np.exp(S - m); l = P.sum(1, keepdims=True); P = P / l
            lse[b, h] = (m + np.log(l))[:, 0]
            K = np.ones((Tn, Tn))
            if dropout > 0:
                for t in range(Tn):
                    for s_ in range(Tn):
                        K[t, s_] = ks if keepf(((b * NH + h) * Tn + t) * Tn + s_, dropout) else 0.0
            Pd = P * K
            out[b, :, h] = Pd @ v[b, :, g]
            dPd = dout[b, :, h] @ v[b, :, g].T
            dP = dPd * K
            D = (dout[b, :, h] * out[b, :, h]).sum(1, keepdims=True)
            dS = P * (dP - D) * scale
            dq[b, :, h] = dS @ k[b, :, g]
            dk[b, :, g] += dS.T @ q[b, :, h]
            dv[b, :, g] += Pd.T @ dout[b, :, h]
    return out, lse, dq, dk, dv

def run(B, Tn, NH, NKV, HD, dropout, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Tn, NH, HD)); k = rng.standard_normal((B, Tn, NKV, HD))
    v = rng.standard_normal((B, Tn, NKV, HD)); dout = rng.standard_normal((B, Tn, NH, HD))
    out, lse, dq_w, dk_w, dv_w = reference(q, k, v, dout, B, Tn, NH, NKV, HD, dropout)
    Dbuf = np.einsum("bthd,bthd->bht", dout, out)
    BN = 64 if HD == 64 else 32
    scale = 1.0 / np.sqrt(HD); ks = 1.0 / (1.0 - dropout) if dropout > 0 else 1.0
    dq = np.full_like(q, np.nan); dk = np.full_like(k, np.nan); dv = np.full_like(v, np.nan)
    dq_kernel(dq, Dbuf, dout, q, k, v, lse, B, Tn, NH, NKV, HD, BN, scale, dropout, ks)
    dkdv_kernel(dk, dv, Dbuf, dout, q, k, v, lse, B, Tn, NH, NKV, HD, BN, scale, dropout, ks)
    errs = [np.nanmax(np.abs(a - w)) / max(np.abs(w).max(), 1.0) if not np.isnan(a).any() else float("nan")
            for a, w in ((dq, dq_w), (dk, dk_w), (dv, dv_w))]
    print(f"B{B} T{Tn} NH{NH} NKV{NKV} HD{HD} p{dropout}: rel err dq {errs[0]:.2e} dk {errs[1]:.2e} dv {errs[2]:.2e}",
          flush=True)
    return all(e < 1e-10 for e in errs)

if __name__ == "__main__":
    ok = True
    # test_ops_cuda's mma shapes (GQA groups of 2 and 4, dropout, T not a multiple of the tiles, one
    # row), small enough for Python, and two batches
    for shape in [(1, 77, 4, 2, 64, 0.0), (1, 77, 4, 2, 64, 0.1), (1, 130, 2, 1, 128, 0.0), (1, 130, 4, 4, 128, 0.2),
                  (1, 200, 8, 2, 64, 0.1), (1, 1, 2, 1, 128, 0.0), (2, 40, 2, 2, 64, 0.0)]:
        ok &= run(*shape)
    print("ALL OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)
