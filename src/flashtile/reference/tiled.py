"""The FlashAttention algorithm in plain PyTorch: the CPU backend and the teaching text.

It computes exactly what :func:`flashtile.reference.naive_attention` computes, but
never holds more than one (BLOCK_M × BLOCK_N) tile of scores per head:

Forward (``_fwd``), for each query tile Q_i (BLOCK_M rows)::

    m_i = -inf, l_i = 0, acc = 0                # running max, running sum, output
    for each key/value tile K_j, V_j (BLOCK_N rows) inside Q_i's band:
        S    = Q_i K_jᵀ · scale  (+ softcap, ALiBi, score_mod, bias, mask)
        m_ij = max(m_i, rowmax(S))
        P    = exp(S - m_ij)
        l_i  = l_i · exp(m_i - m_ij) + rowsum(P)   # rescale the old sum ...
        acc  = acc · exp(m_i - m_ij) + P V_j       # ... and the old output
        m_i  = m_ij
    O_i = acc / l_i,   LSE_i = m_i + log(l_i)

Backward, from the saved LSE (no N×N buffer either)::

    D = rowsum(dO ∘ O)                                       (_bwd_preprocess)
    for each K_j, V_j tile:  for each Q_i tile in its band:  (_bwd_dkdv)
        P = exp(S - LSE);  dP = dO Vᵀ;  dS = P ∘ (dP - D)
        dV_j += Pᵀ dO_i;   dK_j += dSᵀ Q_i · scale
    for each Q_i tile:       for each K_j tile in its band:  (_bwd_dq)
        dQ_i += dS K_j · scale

The Triton kernels in :mod:`flashtile.kernels` follow this text line by line, with
the same names. Work is vectorised over batch and heads; grouped-query attention
views the query heads as (heads_kv, group) so that K/V are never repeated. As in the
kernels, only the tiles the band crosses are masked. Extra memory is O(N·d) plus one
BLOCK_M × BLOCK_N tile of scores per (batch, head): without tiles given, ``default_tile``
keeps that tile under TILE_SCORES floats for the whole call.
"""

from __future__ import annotations

import torch

from ..masks import Band, key_range, query_range
from .philox import dropout_keep


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    # Like the kernels: low-precision inputs accumulate in float32; float64 stays.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _group_heads(t: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(B, Hq, S, ...) -> (B, Hkv, G, S, ...), a view: query heads grouped by KV head."""
    return t.unflatten(1, (heads_kv, t.shape[1] // heads_kv))


def _score_tile(q_tile, k_tile, start_m, start_n, seqlen_q, seqlen_k, softmax_scale, band, softcap, alibi,
                bias_tile=None, mask=None, score_mod=None, need_chain=False):
    """Scores of one tile, with every modifier and the mask applied.

    q_tile: (B, Hkv, G, BLOCK_M, D); k_tile: (B, Hkv, 1, BLOCK_N, D); bias_tile
    broadcastable to (B, Hkv, G, BLOCK_M, BLOCK_N).
    Returns S (B, Hkv, G, BLOCK_M, BLOCK_N) with -inf where masked, and the factor
    that turns dS (with respect to S) into the gradient with respect to Q Kᵀ · scale:
    the softcap's 1 - tanh² times the score_mod's derivative, or None when it is 1.
    """
    s = torch.matmul(q_tile, k_tile.transpose(-1, -2)) * softmax_scale
    chain = None
    if softcap > 0:  # d(softcap·tanh(x/softcap))/dx = 1 - tanh²
        tanh = torch.tanh(s / softcap)
        s = softcap * tanh
        chain = 1.0 - tanh * tanh
    # Positions of the tile's rows (bottom-right aligned) and columns.
    first_row, last_row = start_m + seqlen_k - seqlen_q, start_m + q_tile.shape[-2] - 1 + seqlen_k - seqlen_q
    last_col = start_n + k_tile.shape[-2] - 1
    rows = torch.arange(first_row, last_row + 1, device=s.device)[:, None]
    cols = torch.arange(start_n, last_col + 1, device=s.device)[None, :]
    if alibi is not None:  # alibi: (B or 1, Hkv, G, 1, 1) slopes
        s = s - alibi * (rows - cols).abs().to(s.dtype)
    if score_mod is not None or mask is not None:
        # A user's functions see (batch, query head) indices and absolute (not
        # bottom-right shifted) query positions.
        batch, heads_kv, group = q_tile.shape[:3]
        b = torch.arange(batch, device=s.device).view(-1, 1, 1, 1, 1)
        h = (torch.arange(heads_kv, device=s.device).view(1, -1, 1, 1, 1) * group
             + torch.arange(group, device=s.device).view(1, 1, -1, 1, 1))
        q_idx = rows - (seqlen_k - seqlen_q)
    if score_mod is not None:
        if need_chain:  # the forward has no use for it
            derivative = score_mod.derivative(s, b, h, q_idx, cols)
            chain = derivative if chain is None else chain * derivative
        # (contiguous: a result that broadcasts becomes a tile of its own, which the callers
        # then overwrite in place)
        s = torch.broadcast_to(score_mod(s, b, h, q_idx, cols), s.shape).to(s.dtype).contiguous()
    if bias_tile is not None:
        s = s + bias_tile.to(s.dtype)
    # The band masks only the tiles it crosses (the kernels' masked tiles); a tile inside it,
    # most of them, goes unmasked, as in the kernels' unmasked loop.
    allowed = None
    if band.left is not None and start_n < last_row - band.left:  # the first key misses the last row's band
        allowed = cols >= rows - band.left
    if band.right is not None and last_col > first_row + band.right:  # the last key is past the first row's
        allowed = (cols <= rows + band.right) if allowed is None else allowed & (cols <= rows + band.right)
    if mask is not None:
        allowed = mask(b, h, q_idx, cols) if allowed is None else allowed & mask(b, h, q_idx, cols)
    return (s if allowed is None else s.masked_fill(~allowed, float("-inf"))), chain


# A call's tile when none is given: as large as keeps one tile's scores for every (batch, head)
# within TILE_SCORES floats. Each tile pair costs some twenty torch ops of fixed dispatch cost
# (~10 µs each on a CPU), so small tiles of few heads are all overhead: 64 × 64 tiles of 8 heads
# ran a 2k forward + backward 2.6× slower than 256 × 256 on this project's 2-core CI machine, while
# 128 heads of 256 keys ran fastest at 64 (more tiles skipped under causal, nothing to amortise).
# docs/performance.md, "The CPU backend", has the sweep.
TILE_SCORES = 2 ** 19
TILE_SIZES = (256, 128, 64)


def default_tile(batch: int, heads: int) -> int:
    """The BLOCK_M = BLOCK_N that a call of ``batch`` × ``heads`` query heads runs without one given:
    the largest of TILE_SIZES whose tile holds at most TILE_SCORES scores over all of them."""
    for block in TILE_SIZES:
        if batch * heads * block * block <= TILE_SCORES:
            return block
    return TILE_SIZES[-1]


def _aligned(lo: int, block: int) -> int:
    # Tiles start on multiples of the block size, as the kernels' tiles do.
    return lo - lo % block


def _call_tiles(mask, block_mask, kernel: str, block_m: int | None, block_n: int | None, batch: int,
                heads: int) -> tuple:
    """(mask, BLOCK_M, BLOCK_N, tile kinds) of a call. With ``block_mask``: its mask, whole tiles
    of ``kernel``'s ("fwd", or "dq" for both backward passes) as near default_tile as they go,
    and their kinds (tile_kinds). Without: ``mask``, the tiles given (None: default_tile), no kinds."""
    target = default_tile(batch, heads)
    if block_mask is None:
        return mask, block_m or target, block_n or target, None
    block_m, block_n = (block_mask.block_m, block_mask.block_n) if kernel == "fwd" else block_mask.backward_blocks
    rows, cols = max(1, target // block_m), max(1, target // block_n)
    return block_mask.mask, block_m * rows, block_n * cols, block_mask.tile_kinds(kernel, rows, cols)


_EMPTY = object()  # _tile_mask's answer for a tile no (batch, head) visits


def _tile_mask(mask, kinds, m_tile: int, n_tile: int):
    """The mask to evaluate on tile (m_tile, n_tile): ``mask`` itself, None where every (batch,
    head) sees the whole tile, or _EMPTY where none sees any of it (BlockMask.tile_kinds;
    without kinds, every tile is evaluated)."""
    if kinds is None or mask is None:
        return mask
    kind = kinds[m_tile][n_tile]
    return mask if kind == 2 else None if kind == 1 else _EMPTY


def _group_bias(bias: torch.Tensor | None, heads_q: int, heads_kv: int) -> torch.Tensor | None:
    """A bias broadcastable to (B, Hq, Sq, Sk) as a (B|1, Hkv|1, G|1, Sq|1, Sk|1) view."""
    if bias is None:
        return None
    b = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    return _group_heads(b, heads_kv) if b.shape[1] == heads_q else b.unsqueeze(2)


def _bias_tile(bias_g, start_m, end_m, start_n, end_n):
    if bias_g is None:
        return None
    rows = slice(start_m, end_m) if bias_g.shape[-2] > 1 else slice(None)
    cols = slice(start_n, end_n) if bias_g.shape[-1] > 1 else slice(None)
    return bias_g[..., rows, cols]


def _keep_tile(seed, dropout_p, batch, heads_kv, group, start_m, end_m, start_n, end_n, device, batch_offset=0):
    """Dropout keep-mask of one tile, (B, Hkv, G, BLOCK_M, BLOCK_N): the kernels' Philox draw."""
    bh = ((batch_offset + torch.arange(batch, device=device).view(-1, 1, 1, 1, 1)) * (heads_kv * group)
          + torch.arange(heads_kv * group, device=device).view(1, heads_kv, group, 1, 1))
    rows = torch.arange(start_m, end_m, device=device).view(-1, 1)
    cols = torch.arange(start_n, end_n, device=device).view(1, -1)
    return dropout_keep(seed, bh, rows, cols, dropout_p)


def _alibi_slopes_grouped(alibi_slopes, heads_kv, dtype):
    if alibi_slopes is None:
        return None
    slopes = alibi_slopes if alibi_slopes.dim() == 2 else alibi_slopes[None]
    return _group_heads(slopes.to(dtype), heads_kv)[..., None, None]


def tiled_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    band: Band,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    BLOCK_M: int | None = None,
    BLOCK_N: int | None = None,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    batch_offset: int = 0,
    mask=None,
    score_mod=None,
    block_mask=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled forward with the online softmax.

    q: (B, Hq, Sq, D); k, v: (B, Hkv, Sk, D), any strides. ``out`` (B, Hq, Sq, D)
    may be given to write into (e.g. a transposed view of a (B, Sq, Hq, D) buffer).
    ``bias``: additive, broadcastable to (B, Hq, Sq, Sk), added after softcap and ALiBi.
    ``dropout_p`` > 0 drops probabilities with the counter-based keep-mask of
    ``dropout_seed`` (reference/philox.py), the same mask the kernels draw;
    ``batch_offset`` is the index of batch entry 0 in a larger packed batch (its
    dropout counters continue from there). ``mask`` is a
    :class:`~flashtile.mask_mods.MaskMod` evaluated on every visited tile; ``block_mask``, a
    :class:`~flashtile.block_mask.BlockMask`, gives the mask and the tiles instead (whole tiles
    of its own, near default_tile): tiles no (batch, head) visits are skipped, tiles every one
    sees whole are not masked (``tile_kinds``).
    ``score_mod`` a :class:`~flashtile.score_mods.ScoreMod` applied after softcap and ALiBi,
    before the bias.
    Returns out (q's dtype) and LSE (B, Hq, Sq), float32 (float64 for float64 input),
    natural log, -inf on rows that see no key. BLOCK_M, BLOCK_N: the tile; None: default_tile.
    """
    batch, heads_q, seqlen_q, headdim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    # (a block mask: whole tiles of its own, so that its kinds say which to skip and which to mask)
    mask, BLOCK_M, BLOCK_N, kinds = _call_tiles(mask, block_mask, "fwd", BLOCK_M, BLOCK_N, batch, heads_q)
    acc_dtype = _acc_dtype(q.dtype)
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty(batch, heads_q, seqlen_q, dtype=acc_dtype, device=q.device)
    q_g, out_g, lse_g = (_group_heads(t, heads_kv) for t in (q, out, lse))
    k_g, v_g = k.unsqueeze(2), v.unsqueeze(2)  # (B, Hkv, 1, Sk, D): broadcast over the group
    alibi = _alibi_slopes_grouped(alibi_slopes, heads_kv, acc_dtype)
    bias_g = _group_bias(bias, heads_q, heads_kv)

    for start_m in range(0, seqlen_q, BLOCK_M):
        end_m = min(start_m + BLOCK_M, seqlen_q)
        q_tile = q_g[..., start_m:end_m, :].to(acc_dtype)
        m_i = torch.full(q_tile.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
        l_i = torch.zeros_like(m_i)
        acc = torch.zeros(q_tile.shape, dtype=acc_dtype, device=q.device)
        lo, hi = key_range(start_m, end_m, seqlen_q, seqlen_k, band)
        for start_n in range(_aligned(lo, BLOCK_N), hi, BLOCK_N):
            tile_mask = _tile_mask(mask, kinds, start_m // BLOCK_M, start_n // BLOCK_N)
            if tile_mask is _EMPTY:
                continue
            end_n = min(start_n + BLOCK_N, seqlen_k)
            k_tile = k_g[..., start_n:end_n, :].to(acc_dtype)
            v_tile = v_g[..., start_n:end_n, :].to(acc_dtype)
            s, _ = _score_tile(q_tile, k_tile, start_m, start_n, seqlen_q, seqlen_k, softmax_scale, band, softcap,
                               alibi, _bias_tile(bias_g, start_m, end_m, start_n, end_n), tile_mask, score_mod)
            # -- update m_i and l_i (a row with nothing visible yet keeps m = -inf;
            #    subtracting 0 instead of -inf keeps exp() from producing NaN)
            m_ij = torch.maximum(m_i, s.amax(dim=-1))
            m_safe = torch.where(m_ij == float("-inf"), 0.0, m_ij)
            p = s.sub_(m_safe[..., None]).exp_()  # (in place: the tile's scores are not needed again)
            alpha = torch.exp(m_i - m_safe)
            l_i = l_i * alpha + p.sum(dim=-1)
            if dropout_p > 0:  # the normaliser counts every probability; only P·V drops some
                p = p * _keep_tile(dropout_seed, dropout_p, batch, heads_kv, heads_q // heads_kv, start_m, end_m,
                                   start_n, end_n, q.device, batch_offset)
            # -- rescale the output so far and add this tile's contribution
            acc = acc * alpha[..., None] + torch.matmul(p, v_tile)
            m_i = m_ij
        # -- epilogue: normalise; rows that saw no key (l = 0 exactly) give 0 and LSE = -inf;
        #    a NaN l (NaN inputs) propagates, as in standard attention
        seen = l_i != 0
        if dropout_p > 0:
            acc = acc / (1.0 - dropout_p)
        out_g[..., start_m:end_m, :] = torch.where(seen[..., None], acc / torch.where(seen, l_i, 1.0)[..., None], 0.0)
        lse_g[..., start_m:end_m] = torch.where(seen, m_i + torch.log(l_i), float("-inf"))
    return out, lse


def _probs_from_lse(s: torch.Tensor, lse_tile: torch.Tensor) -> torch.Tensor:
    # P = exp(S - LSE), in S's memory. Rows with LSE = -inf saw no key: use +inf so that P = 0.
    lse_safe = torch.where(lse_tile == float("-inf"), float("inf"), lse_tile)
    return s.sub_(lse_safe[..., None]).exp_()


def tiled_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    band: Band,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    BLOCK_M: int | None = None,
    BLOCK_N: int | None = None,
    dlse: torch.Tensor | None = None,
    dq: torch.Tensor | None = None,
    dk: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    dbias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    batch_offset: int = 0,
    mask=None,
    score_mod=None,
    block_mask=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tiled backward recomputing P from the LSE; shapes as in the forward.

    dout, out: (B, Hq, Sq, D); lse: (B, Hq, Sq). ``dlse`` (B, Hq, Sq), optional, is a
    gradient flowing into the LSE itself: since dLSE_i/dS_ij = P_ij it only shifts D.
    dq/dk/dv may be given to write into. With ``bias``, a zero-filled ``dbias`` of the
    bias's shape, if given, receives the bias gradient (dS summed over broadcast dims).
    ``score_mod``'s derivative comes from torch.func (forward mode), tile by tile. With
    ``block_mask`` both passes walk whole tiles of its dQ pass's (``backward_blocks``),
    skipping or leaving unmasked what its ``tile_kinds("dq", ...)`` say.
    Returns dq (B, Hq, Sq, D), dk and dv (B, Hkv, Sk, D) in the inputs' dtype.
    """
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    mask, BLOCK_M, BLOCK_N, kinds = _call_tiles(mask, block_mask, "dq", BLOCK_M, BLOCK_N, batch, heads_q)
    acc_dtype = _acc_dtype(q.dtype)
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv

    # -- _bwd_preprocess: D = rowsum(dO ∘ O)
    delta = (dout.to(acc_dtype) * out.to(acc_dtype)).sum(dim=-1)
    if dlse is not None:
        delta = delta - dlse.to(acc_dtype)
    q_g, do_g, lse_g, delta_g, dq_g = (_group_heads(t, heads_kv) for t in (q, dout, lse, delta, dq))
    k_g, v_g = k.unsqueeze(2), v.unsqueeze(2)
    alibi = _alibi_slopes_grouped(alibi_slopes, heads_kv, acc_dtype)
    bias_g, dbias_g = _group_bias(bias, heads_q, heads_kv), _group_bias(dbias, heads_q, heads_kv)

    def tile_grads(start_m, end_m, start_n, end_n, tile_mask):
        """Recompute one tile: P, dS with respect to the scores, and dS with respect to
        Q Kᵀ · scale (they differ by the softcap's and score_mod's derivatives), (B, Hkv, G, BLOCK_M, BLOCK_N)."""
        q_tile = q_g[..., start_m:end_m, :].to(acc_dtype)
        do_tile = do_g[..., start_m:end_m, :].to(acc_dtype)
        k_tile = k_g[..., start_n:end_n, :].to(acc_dtype)
        v_tile = v_g[..., start_n:end_n, :].to(acc_dtype)
        s, chain = _score_tile(q_tile, k_tile, start_m, start_n, seqlen_q, seqlen_k, softmax_scale, band, softcap,
                               alibi, _bias_tile(bias_g, start_m, end_m, start_n, end_n), tile_mask, score_mod,
                               need_chain=True)
        p = _probs_from_lse(s, lse_g[..., start_m:end_m].to(acc_dtype))
        dp = torch.matmul(do_tile, v_tile.transpose(-1, -2))
        p_used = p  # what multiplied V in the forward
        if dropout_p > 0:  # O = (P ∘ Z / (1 - p)) V, so dP = (dO Vᵀ) ∘ Z / (1 - p)
            keep = _keep_tile(dropout_seed, dropout_p, batch, heads_kv, heads_q // heads_kv, start_m, end_m,
                              start_n, end_n, q.device, batch_offset).to(acc_dtype) / (1.0 - dropout_p)
            dp, p_used = dp * keep, p * keep
        ds_scores = dp.sub_(delta_g[..., start_m:end_m, None]).mul_(p)  # P ∘ (dP − D), in dP's memory
        ds = ds_scores if chain is None else ds_scores * chain
        return q_tile, do_tile, k_tile, p_used, ds, ds_scores

    # -- _bwd_dkdv: one K/V tile at a time, looping over the Q tiles that see it.
    for start_n in range(0, seqlen_k, BLOCK_N):
        end_n = min(start_n + BLOCK_N, seqlen_k)
        dk_acc = torch.zeros(*k.shape[:2], end_n - start_n, k.shape[-1], dtype=acc_dtype, device=k.device)
        dv_acc = torch.zeros_like(dk_acc)
        lo, hi = query_range(start_n, end_n, seqlen_q, seqlen_k, band)
        for start_m in range(_aligned(lo, BLOCK_M), hi, BLOCK_M):
            tile_mask = _tile_mask(mask, kinds, start_m // BLOCK_M, start_n // BLOCK_N)
            if tile_mask is _EMPTY:
                continue
            end_m = min(start_m + BLOCK_M, seqlen_q)
            q_tile, do_tile, _, p, ds, _ = tile_grads(start_m, end_m, start_n, end_n, tile_mask)
            # The query heads of a group share this K/V head: sum their contributions.
            dv_acc += torch.matmul(p.transpose(-1, -2), do_tile).sum(dim=2)
            dk_acc += torch.matmul(ds.transpose(-1, -2), q_tile).sum(dim=2) * softmax_scale
        dk[:, :, start_n:end_n] = dk_acc
        dv[:, :, start_n:end_n] = dv_acc

    # -- _bwd_dq: one Q tile at a time, looping over the K/V tiles it sees.
    for start_m in range(0, seqlen_q, BLOCK_M):
        end_m = min(start_m + BLOCK_M, seqlen_q)
        dq_acc = torch.zeros(*dq_g.shape[:3], end_m - start_m, q.shape[-1], dtype=acc_dtype, device=q.device)
        lo, hi = key_range(start_m, end_m, seqlen_q, seqlen_k, band)
        for start_n in range(_aligned(lo, BLOCK_N), hi, BLOCK_N):
            tile_mask = _tile_mask(mask, kinds, start_m // BLOCK_M, start_n // BLOCK_N)
            if tile_mask is _EMPTY:
                continue
            end_n = min(start_n + BLOCK_N, seqlen_k)
            _, _, k_tile, _, ds, ds_scores = tile_grads(start_m, end_m, start_n, end_n, tile_mask)
            dq_acc += torch.matmul(ds, k_tile) * softmax_scale
            if dbias_g is not None:  # each (Q tile, K tile) pair is visited once here
                dbias_tile = _bias_tile(dbias_g, start_m, end_m, start_n, end_n)
                dbias_tile += ds_scores.sum_to_size(dbias_tile.shape).to(dbias_tile.dtype)
        dq_g[..., start_m:end_m, :] = dq_acc
    return dq, dk, dv
