#!/usr/bin/env python3
# tests/gpu/emulate_mma_attention_bwd.py — the mma attention BACKWARD (store_rows, the dq and dk/dv
# kernels of src/kernels/cuda/cuda_attention_mma.cu, NEVER RUN ON A GPU; mma_abt, mma_pv, head_rows and
# gt_attention_drop_index are transcribed once in mma_emu.py, shared with the forward's script) transcribed by
# hand onto the PTX emulation of mma_emu.py and compared with a direct fp64 attention backward: dq, dk,
# dv (D from the output, as gt_cuda_attention_rowdot gives it; lse from the reference forward).
# The transcription keeps the kernels' loops, their lane/row/column/address expressions (evaluated for
# all 32 lanes at once), the causal skips, the dk/dv step order over the group's heads, the two
# cp.async stages (as plain copies into the stage the kernel uses) and the global pointer arithmetic on
# flat arrays; dropout's keep decision is mma_emu.keepf at the kernels' index ((b NH + h) T + t) T + s.
# It does NOT check bf16/fp32 rounding, the real RNG, barriers, cp.async ordering or timing.
# A transcription: edit it with the kernels.
# Run: python3 tests/gpu/emulate_mma_attention_bwd.py (CTest: mma_attention_backward_emulation_matches_fp64);
# exit 0 when every shape matches to 1e-10 and every mutation of the layouts is caught.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mma_emu as emu  # noqa: E402
from mma_emu import MM_BM, LANE, np  # noqa: E402


# ---- the kernels' helpers ------------------------------------------------------------------------
def store_rows(dst, base, stride, acc, row_a, quad, Tn, HD):
    """store_rows<HD>(gmem + base, stride, acc, row_a, quad, Tn)"""
    ok = row_a < Tn
    o = base + row_a * stride + 2 * quad
    for dt in range(HD // 8):
        dst[(o + dt * 8)[ok]] = acc[dt][:, 0][ok]
        dst[(o + dt * 8 + 1)[ok]] = acc[dt][:, 1][ok]
    ok = row_a + 8 < Tn
    o = base + (row_a + 8) * stride + 2 * quad
    for dt in range(HD // 8):
        dst[(o + dt * 8)[ok]] = acc[dt][:, 2][ok]
        dst[(o + dt * 8 + 1)[ok]] = acc[dt][:, 3][ok]


def where_ok(ok, buf, idx):
    """ok ? buf[idx] : 0.0f, per lane"""
    return np.where(ok, buf[np.where(ok, idx, 0)], 0.0)


# ---- dq kernel -------------------------------------------------------------------------------------
def dq_kernel(dq, Dbuf, dout, q, k, v, lse, B, Tn, NH, NKV, HD, BN, scale, dropout, keep_scale):
    LD, NT, DT = HD + 8, BN // 8, HD // 8
    grid_x = (Tn + MM_BM - 1) // MM_BM
    lane = LANE
    for b in range(B):
        for h in range(NH):
            for bx in range(grid_x):
                smem = emu.new_smem((2 * MM_BM + 4 * BN) * LD)
                sQ = 0
                sdO = sQ + MM_BM * LD
                sK = sdO + MM_BM * LD
                sV = sK + 2 * BN * LD

                qtile = grid_x - 1 - bx
                g = h // (NH // NKV)
                q0 = qtile * MM_BM
                qs, ks = NH * HD, NKV * HD
                qb = emu.head_rows(b, Tn, qs, h, HD)
                ob = emu.head_rows(b, Tn, qs, h, HD)
                kb = emu.head_rows(b, Tn, ks, g, HD)
                vb = emu.head_rows(b, Tn, ks, g, HD)

                last = min(q0 + MM_BM, Tn) - 1
                ntiles = last // BN + 1
                emu.load_tile(smem, sQ, q, qb, qs, q0, Tn, HD, MM_BM)
                emu.load_tile(smem, sdO, dout, ob, qs, q0, Tn, HD, MM_BM)
                emu.load_tile(smem, sK, k, kb, ks, 0, Tn, HD, BN)
                emu.load_tile(smem, sV, v, vb, ks, 0, Tn, HD, BN)

                W = []
                for warp in range(4):
                    R = {"quad": lane & 3, "w0": q0 + warp * 16}
                    R["row_a"] = R["w0"] + (lane >> 2)
                    R["row_b"] = R["row_a"] + 8
                    R["warp_active"] = R["w0"] < Tn
                    R["warp_last"] = min(R["w0"] + 15, Tn - 1)
                    bh = b * NH + h
                    R["lse_a"] = where_ok(R["row_a"] < Tn, lse, bh * Tn + R["row_a"])
                    R["lse_b"] = where_ok(R["row_b"] < Tn, lse, bh * Tn + R["row_b"])
                    R["D_a"] = where_ok(R["row_a"] < Tn, Dbuf, bh * Tn + R["row_a"])
                    R["D_b"] = where_ok(R["row_b"] < Tn, Dbuf, bh * Tn + R["row_b"])
                    R["acc"] = np.zeros((DT, 32, 4))
                    W.append(R)

                for tile in range(ntiles):
                    k0, stage = tile * BN, tile & 1
                    if tile + 1 < ntiles:
                        emu.load_tile(smem, sK + (stage ^ 1) * BN * LD, k, kb, ks, k0 + BN, Tn, HD, BN)
                        emu.load_tile(smem, sV + (stage ^ 1) * BN * LD, v, vb, ks, k0 + BN, Tn, HD, BN)
                    tK, tV = sK + stage * BN * LD, sV + stage * BN * LD
                    for warp in range(4):
                        R = W[warp]
                        if not (R["warp_active"] and k0 <= R["warp_last"]):
                            continue
                        quad, row_a, row_b = R["quad"], R["row_a"], R["row_b"]
                        s = np.zeros((NT, 32, 4))
                        dp = np.zeros((NT, 32, 4))
                        emu.mma_abt(s, smem, sQ + warp * 16 * LD, tK, HD, NT)
                        emu.mma_abt(dp, smem, sdO + warp * 16 * LD, tV, HD, NT)
                        for nt in range(NT):
                            for e in range(4):
                                r = row_a if e < 2 else row_b
                                col = k0 + nt * 8 + 2 * quad + (e & 1)
                                live = (col <= r) & (r < Tn)
                                with np.errstate(over="ignore"):  # dead lanes' values are not used
                                    p = np.exp(s[nt][:, e] * scale - (R["lse_a"] if e < 2 else R["lse_b"]))
                                d = dp[nt][:, e]
                                if dropout > 0.0:
                                    d = np.where(emu.keepf(emu.gt_attention_drop_index(b, h, r, col, NH, Tn), dropout),
                                                 d * keep_scale, 0.0)
                                ds = p * (d - (R["D_a"] if e < 2 else R["D_b"])) * scale
                                s[nt][:, e] = np.where(live, ds, 0.0)
                        emu.mma_pv(R["acc"], s, smem, tK, HD, NT)  # dQ += dS K
                    # __syncthreads
                for warp in range(4):
                    R = W[warp]
                    if R["warp_active"]:
                        store_rows(dq, emu.head_rows(b, Tn, qs, h, HD), qs, R["acc"], R["row_a"], R["quad"], Tn,
                                   HD)


# ---- dk/dv kernel ----------------------------------------------------------------------------------
def dkdv_kernel(dk, dv, Dbuf, dout, q, k, v, lse, B, Tn, NH, NKV, HD, BQ, scale, dropout, keep_scale):
    LD, NT, DT = HD + 8, BQ // 8, HD // 8
    assert MM_BM % BQ == 0
    grid_x = (Tn + MM_BM - 1) // MM_BM
    lane = LANE
    for b in range(B):
        for g in range(NKV):
            for bx in range(grid_x):
                smem = emu.new_smem((2 * MM_BM + 4 * BQ) * LD)
                sK = 0
                sV = sK + MM_BM * LD
                sQ = sV + MM_BM * LD
                sdO = sQ + 2 * BQ * LD
                sL = emu.new_smem(2 * BQ)  # after sdO in the kernel's shared memory, fp32
                sD = emu.new_smem(2 * BQ)

                ktile = bx
                group = NH // NKV
                k0 = ktile * MM_BM
                qs, ks = NH * HD, NKV * HD
                kb = emu.head_rows(b, Tn, ks, g, HD)
                vb = emu.head_rows(b, Tn, ks, g, HD)

                qt0 = k0 // BQ
                nq = (Tn + BQ - 1) // BQ - qt0
                nsteps = group * nq
                emu.load_tile(smem, sK, k, kb, ks, k0, Tn, HD, MM_BM)
                emu.load_tile(smem, sV, v, vb, ks, k0, Tn, HD, MM_BM)
                h, q0 = g * group, qt0 * BQ
                bh = b * NH + h
                emu.load_tile(smem, sQ, q, emu.head_rows(b, Tn, qs, h, HD), qs, q0, Tn, HD, BQ)
                emu.load_tile(smem, sdO, dout, emu.head_rows(b, Tn, qs, h, HD), qs, q0, Tn, HD, BQ)
                emu.load_stat(sL, 0, lse, bh * Tn, q0, Tn, BQ)
                emu.load_stat(sD, 0, Dbuf, bh * Tn, q0, Tn, BQ)

                W = []
                for warp in range(4):
                    R = {"quad": lane & 3, "w0": k0 + warp * 16}
                    R["row_a"] = R["w0"] + (lane >> 2)
                    R["row_b"] = R["row_a"] + 8
                    R["warp_active"] = R["w0"] < Tn
                    R["dk_acc"] = np.zeros((DT, 32, 4))
                    R["dv_acc"] = np.zeros((DT, 32, 4))
                    W.append(R)

                for it in range(nsteps):
                    stage = it & 1
                    h, q0 = g * group + it // nq, (qt0 + it % nq) * BQ
                    if it + 1 < nsteps:
                        hn, qn = g * group + (it + 1) // nq, (qt0 + (it + 1) % nq) * BQ
                        bhn = b * NH + hn
                        emu.load_tile(smem, sQ + (stage ^ 1) * BQ * LD, q, emu.head_rows(b, Tn, qs, hn, HD), qs, qn, Tn,
                                      HD, BQ)
                        emu.load_tile(smem, sdO + (stage ^ 1) * BQ * LD, dout, emu.head_rows(b, Tn, qs, hn, HD), qs, qn,
                                      Tn, HD, BQ)
                        emu.load_stat(sL, (stage ^ 1) * BQ, lse, bhn * Tn, qn, Tn, BQ)
                        emu.load_stat(sD, (stage ^ 1) * BQ, Dbuf, bhn * Tn, qn, Tn, BQ)
                    tQ, tdO = sQ + stage * BQ * LD, sdO + stage * BQ * LD
                    tL, tD = stage * BQ, stage * BQ  # offsets into sL, sD
                    for warp in range(4):
                        R = W[warp]
                        w0 = R["w0"]
                        if not (R["warp_active"] and q0 + BQ - 1 >= w0):
                            continue
                        quad, row_a, row_b = R["quad"], R["row_a"], R["row_b"]
                        s = np.zeros((NT, 32, 4))
                        dp = np.zeros((NT, 32, 4))
                        emu.mma_abt(s, smem, sK + warp * 16 * LD, tQ, HD, NT)  # S^T: keys x queries
                        emu.mma_abt(dp, smem, sV + warp * 16 * LD, tdO, HD, NT)  # dP~^T
                        for nt in range(NT):
                            for e in range(4):
                                sk = row_a if e < 2 else row_b
                                c = nt * 8 + 2 * quad + (e & 1)
                                tq = q0 + c
                                live = (tq < Tn) & (sk <= tq)
                                with np.errstate(over="ignore"):
                                    p = np.exp(s[nt][:, e] * scale - sL[tL + c])
                                d = dp[nt][:, e]
                                pt = p
                                if dropout > 0.0:
                                    keep = emu.keepf(emu.gt_attention_drop_index(b, h, tq, sk, NH, Tn), dropout)
                                    d = np.where(keep, d * keep_scale, 0.0)
                                    pt = np.where(keep, p * keep_scale, 0.0)
                                ds = p * (d - sD[tD + c]) * scale
                                s[nt][:, e] = np.where(live, pt, 0.0)
                                dp[nt][:, e] = np.where(live, ds, 0.0)
                        emu.mma_pv(R["dv_acc"], s, smem, tdO, HD, NT)  # dV += P~^T dO
                        emu.mma_pv(R["dk_acc"], dp, smem, tQ, HD, NT)  # dK += dS^T Q
                    # __syncthreads
                for warp in range(4):
                    R = W[warp]
                    if R["warp_active"]:
                        store_rows(dk, emu.head_rows(b, Tn, ks, g, HD), ks, R["dk_acc"], R["row_a"], R["quad"], Tn,
                                   HD)
                        store_rows(dv, emu.head_rows(b, Tn, ks, g, HD), ks, R["dv_acc"], R["row_a"], R["quad"], Tn,
                                   HD)


def run(B, Tn, NH, NKV, HD, dropout):
    q, k, v, dout = emu.inputs(B, Tn, NH, NKV, HD)
    out, lse, dq_w, dk_w, dv_w, Dbuf = emu.reference(q, k, v, dout, dropout)
    BN = 64 if HD == 64 else 32  # gt_cuda_attention_mma_backward: backward_hd<64, 64>, backward_hd<128, 32>
    scale = 1.0 / np.sqrt(HD)
    keep_scale = 1.0 / (1.0 - dropout) if dropout > 0.0 else 1.0
    dq, dk, dv = np.full(q.size, np.nan), np.full(k.size, np.nan), np.full(v.size, np.nan)
    args = (Dbuf.ravel(), dout.ravel(), q.ravel(), k.ravel(), v.ravel(), lse.ravel(), B, Tn, NH, NKV, HD, BN, scale,
            dropout, keep_scale)
    dq_kernel(dq, *args)
    dkdv_kernel(dk, dv, *args)
    return {"dq": emu.rel_err(dq.reshape(q.shape), dq_w), "dk": emu.rel_err(dk.reshape(k.shape), dk_w),
            "dv": emu.rel_err(dv.reshape(v.shape), dv_w)}


if __name__ == "__main__":
    # test_ops_cuda's mma shapes but the 7B one (GQA groups of 2 and 4: the dk/dv kernel sums a kv
    # head's query heads, dropout, T not a multiple of the tiles, several key and query tiles, one row),
    # one with 10 key tiles of 32 (HD 128), and two whose last row is the first of a key tile (k0 ==
    # warp_last: the skip test's edge)
    shapes = [(2, 77, 4, 2, 64, 0.0), (2, 77, 4, 2, 64, 0.1), (1, 130, 2, 1, 128, 0.0), (1, 130, 4, 4, 128, 0.2),
              (1, 200, 8, 2, 64, 0.1), (1, 1, 2, 1, 128, 0.0), (1, 300, 2, 1, 128, 0.0),
              (1, 129, 2, 1, 64, 0.0), (1, 65, 4, 2, 128, 0.1)]
    sys.exit(emu.main(run, shapes, ["a_regs", "b_regs", "c_rows", "ldmatrix_trans", "ldmatrix_row"],
                      (1, 77, 2, 1, 64, 0.1)))
