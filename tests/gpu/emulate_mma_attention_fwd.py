#!/usr/bin/env python3
# tests/gpu/emulate_mma_attention_fwd.py — the mma attention FORWARD (mma_attention_forward_kernel in
# src/kernels/cuda/cuda_attention_mma.cu, NEVER RUN ON A GPU) transcribed by hand onto the PTX
# emulation of mma_emu.py and compared with a direct fp64 causal GQA attention: out and lse.
# The transcription keeps the kernel's loops, its lane/row/column/address expressions (evaluated for
# all 32 lanes at once), its causal tile skipping, the online softmax with row statistics reduced over
# the 4 lanes of a quad by xor shuffles, P re-packed from the S accumulators as A fragments, V through
# ldmatrix.trans, the two cp.async stages (as plain copies into the stage the kernel uses) and its
# global pointer arithmetic on flat arrays; dropout's keep decision is mma_emu.keepf at the kernel's
# index. The kernel's helpers shared with the backward (mma_abt_kblock, mma_pv, head_rows, gt_attention_drop_index)
# are transcribed once in mma_emu.py.
# It does NOT check bf16/fp32 rounding, the real RNG, barriers, cp.async ordering or timing.
# A transcription: edit it with the kernel.
# Run: python3 tests/gpu/emulate_mma_attention_fwd.py (CTest: mma_attention_forward_emulation_matches_fp64);
# exit 0 when every shape matches to 1e-10 and every mutation of the layouts is caught.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mma_emu as emu  # noqa: E402
from mma_emu import MM_BM, LANE, np  # noqa: E402

INF = np.inf


def forward_kernel(out, lse, q, k, v, B, Tn, NH, NKV, HD, BN, scale, dropout, keep_scale):
    """mma_attention_forward_kernel<HD, BN> over the grid ((Tn + 63) / 64, NH, B); q, k, v, out, lse
    flat, as the kernel sees them."""
    LD, KD, NT, DT = HD + 8, HD // 16, BN // 8, HD // 8
    grid_x = (Tn + MM_BM - 1) // MM_BM
    lane = LANE
    for b in range(B):  # blockIdx.z
        for h in range(NH):  # blockIdx.y
            for bx in range(grid_x):  # blockIdx.x
                smem = emu.new_smem((MM_BM + 4 * BN) * LD)
                sQ = 0                  # (64, LD)
                sK = sQ + MM_BM * LD    # 2 stages of (BN, LD)
                sV = sK + 2 * BN * LD   # 2 stages of (BN, LD)

                qtile = grid_x - 1 - bx
                g = h // (NH // NKV)
                q0 = qtile * MM_BM
                qs, ks = NH * HD, NKV * HD
                qb = emu.head_rows(b, Tn, qs, h, HD)
                kb = emu.head_rows(b, Tn, ks, g, HD)
                vb = emu.head_rows(b, Tn, ks, g, HD)

                last = min(q0 + MM_BM, Tn) - 1
                ntiles = last // BN + 1
                emu.load_tile(smem, sQ, q, qb, qs, q0, Tn, HD, MM_BM)
                emu.load_tile(smem, sK, k, kb, ks, 0, Tn, HD, BN)
                emu.load_tile(smem, sV, v, vb, ks, 0, Tn, HD, BN)

                # each warp's registers
                W = []
                for warp in range(4):
                    r = {}
                    r["quad"] = lane & 3
                    r["w0"] = q0 + warp * 16
                    r["row_a"] = r["w0"] + (lane >> 2)
                    r["row_b"] = r["row_a"] + 8
                    r["warp_active"] = r["w0"] < Tn
                    r["warp_last"] = min(r["w0"] + 15, Tn - 1)
                    r["o"] = np.zeros((DT, 32, 4))
                    r["m_a"] = np.full(32, -INF)
                    r["m_b"] = np.full(32, -INF)
                    r["l_a"] = np.zeros(32)
                    r["l_b"] = np.zeros(32)
                    r["qf"] = [None] * KD
                    W.append(r)

                for tile in range(ntiles):
                    k0, stage = tile * BN, tile & 1
                    if tile + 1 < ntiles:
                        emu.load_tile(smem, sK + (stage ^ 1) * BN * LD, k, kb, ks, k0 + BN, Tn, HD, BN)
                        emu.load_tile(smem, sV + (stage ^ 1) * BN * LD, v, vb, ks, k0 + BN, Tn, HD, BN)
                    # cp_async_wait + __syncthreads: this stage and Q are in place
                    tK, tV = sK + stage * BN * LD, sV + stage * BN * LD
                    for warp in range(4):
                        R = W[warp]
                        quad, row_a, row_b = R["quad"], R["row_a"], R["row_b"]
                        o, qf = R["o"], R["qf"]
                        if tile == 0:
                            for kk in range(KD):
                                qf[kk] = emu.ldmatrix_x4(smem, sQ + (warp * 16 + (lane & 15)) * LD + kk * 16 +
                                                         (lane >> 4) * 8)
                        if not (R["warp_active"] and k0 <= R["warp_last"]):
                            continue
                        s = np.zeros((NT, 32, 4))
                        for kk in range(KD):
                            emu.mma_abt_kblock(s, qf[kk], smem, tK, kk, HD, NT)
                        # scale and causal mask; the row max over the tile
                        mx_a, mx_b = np.full(32, -INF), np.full(32, -INF)
                        for nt in range(NT):
                            for e in range(4):
                                rr = row_a if e < 2 else row_b
                                col = k0 + nt * 8 + 2 * quad + (e & 1)
                                x = np.where((col <= rr) & (rr < Tn), s[nt][:, e] * scale, -INF)
                                s[nt][:, e] = x
                                if e < 2:
                                    mx_a = np.fmax(mx_a, x)
                                else:
                                    mx_b = np.fmax(mx_b, x)
                        mx_a = np.fmax(mx_a, emu.shfl_xor(mx_a, 1))
                        mx_a = np.fmax(mx_a, emu.shfl_xor(mx_a, 2))
                        mx_b = np.fmax(mx_b, emu.shfl_xor(mx_b, 1))
                        mx_b = np.fmax(mx_b, emu.shfl_xor(mx_b, 2))
                        m_a, m_b = R["m_a"], R["m_b"]
                        mn_a, mn_b = np.fmax(m_a, mx_a), np.fmax(m_b, mx_b)
                        with np.errstate(invalid="ignore"):  # np.where evaluates both sides
                            corr_a = np.where(mn_a == -INF, 1.0, np.exp(m_a - mn_a))
                            corr_b = np.where(mn_b == -INF, 1.0, np.exp(m_b - mn_b))
                        R["m_a"], R["m_b"] = mn_a, mn_b
                        # p = exp(s - m); l sums p before dropout
                        sum_a, sum_b = np.zeros(32), np.zeros(32)
                        for nt in range(NT):
                            for e in range(4):
                                mm = mn_a if e < 2 else mn_b
                                with np.errstate(invalid="ignore"):
                                    p = np.where(s[nt][:, e] == -INF, 0.0, np.exp(s[nt][:, e] - mm))
                                if e < 2:
                                    sum_a = sum_a + p
                                else:
                                    sum_b = sum_b + p
                                if dropout > 0.0:
                                    rr = row_a if e < 2 else row_b
                                    col = k0 + nt * 8 + 2 * quad + (e & 1)
                                    idx = emu.gt_attention_drop_index(b, h, rr, col, NH, Tn)
                                    p = np.where(p != 0.0, np.where(emu.keepf(idx, dropout), p * keep_scale, 0.0), p)
                                s[nt][:, e] = p
                        R["l_a"] = R["l_a"] * corr_a + sum_a
                        R["l_b"] = R["l_b"] * corr_b + sum_b
                        for dt in range(DT):
                            o[dt][:, 0] *= corr_a
                            o[dt][:, 1] *= corr_a
                            o[dt][:, 2] *= corr_b
                            o[dt][:, 3] *= corr_b
                        # O += P V
                        emu.mma_pv(o, s, smem, tV, HD, NT)
                    # __syncthreads

                for warp in range(4):
                    R = W[warp]
                    quad, row_a, row_b, o = R["quad"], R["row_a"], R["row_b"], R["o"]
                    # l over the 4 lanes of each row, then out = O / l
                    l_a, l_b = R["l_a"], R["l_b"]
                    l_a = l_a + emu.shfl_xor(l_a, 1)
                    l_a = l_a + emu.shfl_xor(l_a, 2)
                    l_b = l_b + emu.shfl_xor(l_b, 1)
                    l_b = l_b + emu.shfl_xor(l_b, 2)
                    if not R["warp_active"]:
                        continue
                    # a row past Tn has l = 0: its inf and nan are computed, as on the GPU, and not stored
                    np_err = np.seterr(divide="ignore", invalid="ignore")
                    inv_a, inv_b = 1.0 / l_a, 1.0 / l_b
                    log_a, log_b = np.log(l_a), np.log(l_b)
                    lse_bh = (b * NH + h) * Tn
                    ok = row_a < Tn
                    ot = (b * Tn + row_a) * qs + h * HD
                    for dt in range(DT):
                        out[(ot + dt * 8 + 2 * quad)[ok]] = (o[dt][:, 0] * inv_a)[ok]
                        out[(ot + dt * 8 + 2 * quad + 1)[ok]] = (o[dt][:, 1] * inv_a)[ok]
                    w = ok & (quad == 0)
                    lse[(lse_bh + row_a)[w]] = (R["m_a"] + log_a)[w]
                    ok = row_b < Tn
                    ot = (b * Tn + row_b) * qs + h * HD
                    for dt in range(DT):
                        out[(ot + dt * 8 + 2 * quad)[ok]] = (o[dt][:, 2] * inv_b)[ok]
                        out[(ot + dt * 8 + 2 * quad + 1)[ok]] = (o[dt][:, 3] * inv_b)[ok]
                    w = ok & (quad == 0)
                    lse[(lse_bh + row_b)[w]] = (R["m_b"] + log_b)[w]
                    np.seterr(**np_err)


def run(B, Tn, NH, NKV, HD, dropout):
    q, k, v, dout = emu.inputs(B, Tn, NH, NKV, HD)
    out_w, lse_w = emu.reference(q, k, v, dout, dropout)[:2]
    BN = 64 if HD == 64 else 32  # gt_cuda_attention_mma_forward: forward_hd<64, 64>, forward_hd<128, 32>
    scale = 1.0 / np.sqrt(HD)
    keep_scale = 1.0 / (1.0 - dropout) if dropout > 0.0 else 1.0
    out = np.full(q.size, np.nan)
    lse = np.full(B * NH * Tn, np.nan)
    forward_kernel(out, lse, q.ravel(), k.ravel(), v.ravel(), B, Tn, NH, NKV, HD, BN, scale, dropout, keep_scale)
    return {"out": emu.rel_err(out.reshape(q.shape), out_w), "lse": emu.rel_err(lse.reshape(lse_w.shape), lse_w)}


if __name__ == "__main__":
    # test_ops_cuda's mma shapes but the 7B one (GQA groups of 2 and 4, dropout, T not a multiple of the
    # tiles, several key and query tiles, one row), one with 10 key tiles of 32 (HD 128), and two whose
    # last row is the first of a key tile (k0 == warp_last: the skip test's edge)
    shapes = [(2, 77, 4, 2, 64, 0.0), (2, 77, 4, 2, 64, 0.1), (1, 130, 2, 1, 128, 0.0), (1, 130, 4, 4, 128, 0.2),
              (1, 200, 8, 2, 64, 0.1), (1, 1, 2, 1, 128, 0.0), (1, 300, 2, 1, 128, 0.0),
              (1, 129, 2, 1, 64, 0.0), (1, 65, 4, 2, 128, 0.1)]
    sys.exit(emu.main(run, shapes, ["a_regs", "b_regs", "c_rows", "ldmatrix_trans", "ldmatrix_row", "shfl_bfly"],
                      (1, 77, 2, 1, 64, 0.0)))
