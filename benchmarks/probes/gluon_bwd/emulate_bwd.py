"""CPU emulation of gluon_bwd.py's tile schedule, checked against torch autograd (fp32).

It replays, tile by tile and warpgroup by warpgroup, exactly the index math and branch
conditions of the two kernels (first Q tile, tile skips, which tiles get a causal / key-end
mask and which get none, TMA boxes zero-filled outside the (B, H, S, D) view, +inf / 0 padding
of the lse2 / Delta buffers, stores clipped at the tensor's edge), in float32 and without the
bf16 rounding of P and dS. It catches schedule and masking bugs, not synchronisation or layout
bugs (those need the GPU: check_bwd.py).

    python emulate_bwd.py
"""

from __future__ import annotations

import math

import torch

LOG2E = 1.4426950408889634


def cdiv(a, b):
    return -(-a // b)


def box(t, b, h, start, rows):
    """A TMA box [1, 1, rows, D] of t (B, H, S, D) at row `start`: zeros outside."""
    out = torch.zeros(rows, t.shape[-1], dtype=t.dtype)
    lo, hi = max(start, 0), min(start + rows, t.shape[2])
    if hi > lo:
        out[lo - start:hi - start] = t[b, h, lo:hi]
    return out


def store(t, b, h, start, tile):
    hi = min(start + tile.shape[0], t.shape[2])
    if hi > start:
        t[b, h, start:hi] = tile[:hi - start]


def prep(out, dout, lse, pad=128):
    B, H, S, _ = out.shape
    s_pad = cdiv(S, pad) * pad
    lse2 = torch.full((B * H, s_pad), math.inf)
    delta = torch.zeros(B * H, s_pad)
    l2 = torch.where(lse == -math.inf, torch.full_like(lse, math.inf), lse * LOG2E)
    lse2[:, :S] = l2.reshape(B * H, S)
    delta[:, :S] = (out * dout).sum(-1).reshape(B * H, S)
    return lse2, delta


def dkdv(q, k, v, dout, lse2, delta, scale, causal, BLOCK_M=64, BLOCK_N=128):
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    HALF_N = BLOCK_N // 2
    qk_scale = scale * LOG2E
    dk, dv = torch.full_like(k, math.nan), torch.full_like(v, math.nan)
    num_n_blocks = cdiv(Sk, BLOCK_N)
    n_q_blocks = cdiv(Sq, BLOCK_M)
    shift = Sk - Sq
    for pid in range(num_n_blocks * B * Hkv):
        block_n = pid % num_n_blocks
        bh = pid // num_n_blocks
        batch, head_kv = bh // Hkv, bh % Hkv
        n_start = block_n * BLOCK_N
        if causal:
            first_tile = min(cdiv(max(n_start - shift - (BLOCK_M - 1), 0), BLOCK_M), n_q_blocks)
        else:
            first_tile = 0
        n_q_tiles = n_q_blocks - first_tile
        for half in range(2):
            key_first = n_start + half * HALF_N
            keys = key_first + torch.arange(HALF_N)
            kt = box(k, batch, head_kv, key_first, HALF_N)
            vt = box(v, batch, head_kv, key_first, HALF_N)
            dk_acc = torch.zeros(HALF_N, D)
            dv_acc = torch.zeros(HALF_N, D)
            for it in range(group * n_q_tiles):
                g = it // n_q_tiles
                m_start = (first_tile + it - g * n_q_tiles) * BLOCK_M
                head = head_kv * group + g
                row = batch * Hq + head
                qt = box(q, batch, head, m_start, BLOCK_M)
                dot = box(dout, batch, head, m_start, BLOCK_M)
                lse_t = lse2[row, m_start:m_start + BLOCK_M]
                delta_t = delta[row, m_start:m_start + BLOCK_M]
                assert lse_t.numel() == BLOCK_M  # inside the padded buffer
                run = (key_first <= m_start + BLOCK_M - 1 + shift) if causal else True
                if not run:
                    continue
                s = kt @ qt.T * qk_scale - lse_t[None, :]
                if causal and key_first + HALF_N - 1 > m_start + shift:
                    queries = m_start + torch.arange(BLOCK_M)
                    s = torch.where(keys[:, None] <= (queries + shift)[None, :], s, torch.tensor(-math.inf))
                p = torch.exp2(s)
                dv_acc += p @ dot
                dp = vt @ dot.T
                ds = p * (dp - delta_t[None, :])
                dk_acc += ds @ qt
            store(dk, batch, head_kv, key_first, dk_acc * scale)
            store(dv, batch, head_kv, key_first, dv_acc)
    return dk, dv


def dq_kernel(q, k, v, dout, lse2, delta, scale, causal, BLOCK_M=128, BLOCK_N=64):
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    HALF_M = BLOCK_M // 2
    qk_scale = scale * LOG2E
    dq = torch.full_like(q, math.nan)
    num_m_blocks = cdiv(Sq, BLOCK_M)
    shift = Sk - Sq
    for pid in range(num_m_blocks * B * Hq):
        block_m = pid % num_m_blocks
        bh = pid // num_m_blocks
        batch, head = bh // Hq, bh % Hq
        if causal:
            block_m = num_m_blocks - 1 - block_m
        head_kv = head // group
        q_start = block_m * BLOCK_M
        kv_end = min(Sk, max(q_start + BLOCK_M + shift, 0)) if causal else Sk
        n_tiles = cdiv(kv_end, BLOCK_N)
        for half in range(2):
            first_row = q_start + half * HALF_M
            rows = first_row + torch.arange(HALF_M)
            lse_r = lse2[bh, first_row:first_row + HALF_M]
            delta_r = delta[bh, first_row:first_row + HALF_M]
            assert lse_r.numel() == HALF_M
            qt = box(q, batch, head, first_row, HALF_M)
            dot = box(dout, batch, head, first_row, HALF_M)
            acc = torch.zeros(HALF_M, D)
            for j in range(n_tiles):
                tile_start = j * BLOCK_N
                kt = box(k, batch, head_kv, tile_start, BLOCK_N)
                vt = box(v, batch, head_kv, tile_start, BLOCK_N)
                if causal and not (tile_start <= first_row + HALF_M - 1 + shift):
                    continue
                s = qt @ kt.T * qk_scale - lse_r[:, None]
                crosses = tile_start + BLOCK_N > Sk
                if causal:
                    crosses = crosses or (tile_start + BLOCK_N - 1 > first_row + shift)
                if crosses:
                    cols = tile_start + torch.arange(BLOCK_N)
                    visible = (cols < Sk)[None, :]
                    if causal:
                        visible = visible & (cols[None, :] <= (rows + shift)[:, None])
                    s = torch.where(visible, s, torch.tensor(-math.inf))
                p = torch.exp2(s)
                dp = dot @ vt.T
                ds = p * (dp - delta_r[:, None])
                acc += ds @ kt
            store(dq, batch, head, first_row, acc * scale)
    return dq


def reference(q, k, v, dout, scale, causal):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ kk.transpose(-1, -2) * scale
    Sq, Sk = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(Sq)[:, None]
        j = torch.arange(Sk)[None, :]
        s = s.masked_fill(j > i + Sk - Sq, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows that see no key: P = 0
    out = p @ vv
    out.backward(dout)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def main():
    torch.manual_seed(0)
    cases = [  # (B, Hq, Hkv, Sq, Sk, D, causal)
        (2, 4, 2, 200, 200, 64, False), (2, 4, 2, 200, 200, 64, True), (1, 4, 1, 130, 300, 32, True),
        (1, 2, 2, 300, 130, 32, True), (1, 2, 1, 257, 191, 32, False), (1, 4, 2, 64, 64, 32, True),
        (1, 2, 1, 1, 77, 32, True), (1, 2, 2, 129, 128, 32, True),
    ]
    worst = 0.0
    for B, Hq, Hkv, Sq, Sk, D, causal in cases:
        q, dout = torch.randn(B, Hq, Sq, D), torch.randn(B, Hq, Sq, D)
        k, v = torch.randn(B, Hkv, Sk, D), torch.randn(B, Hkv, Sk, D)
        scale = D ** -0.5
        out, lse, gq, gk, gv = reference(q, k, v, dout, scale, causal)
        lse2, delta = prep(out, dout, lse)
        ek, ev = dkdv(q, k, v, dout, lse2, delta, scale, causal)
        errs = []
        for bn in (64, 128):
            eq = dq_kernel(q, k, v, dout, lse2, delta, scale, causal, BLOCK_N=bn)
            errs.append((eq - gq).abs().max().item())
        err = max(errs + [(ek - gk).abs().max().item(), (ev - gv).abs().max().item()])
        worst = max(worst, err if not math.isnan(err) else math.inf)
        print(f"B={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D} causal={causal}: max|err| = {err:.2e}")
    print("emulation OK" if worst < 1e-3 else "EMULATION MISMATCH")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
