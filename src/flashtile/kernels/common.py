"""Small ``@triton.jit`` helpers shared by the forward and backward kernels.

Scores inside the kernels live in the base-2 domain: ``s2 = S · log2(e)``, so that
the softmax uses ``exp2``. The helpers take position tensors already broadcast to
the tile's orientation (``[:, None]``/``[None, :]`` in the forward and dQ kernels,
the transpose in the dK/dV kernel), so one helper serves both.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


def padded_head_dim(head_dim: int) -> int:
    """The kernels' HEAD_DIM_PADDED: tl.dot needs at least 16 along every dimension, and tiles
    are powers of two."""
    return max(16, next_power_of_2(head_dim))


# Host-side twins of triton.cdiv and triton.next_power_of_2, for grids, padded lengths and tile
# sizes: since Triton 3.6 those are constexpr functions whose every call unwraps its arguments
# (1.9 µs on a fast CPU against 0.02-0.1 µs here), and a training step's or a decode step's
# launch path asks for several.
def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of two host ints."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, for a host int n >= 0 (0 for 0, as triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@triton.jit
def _tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1): saturates cleanly to ±1 for large |x|,
    # and uses only exp2 (Triton has no portable tanh that also runs in the interpreter).
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def _scores_log2(qk, q_pos, k_pos, seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope,
                 HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Raw dot products -> base-2 scores, with softcap and ALiBi applied.

    qk_scale is softmax_scale·log2(e) without softcap, softmax_scale/softcap with it.
    Returns (s2, tanh) where tanh is the softcap's tanh (needed by the backward; the
    scores themselves when there is no softcap, unused then).
    """
    if HAS_SOFTCAP:
        tanh = _tanh(qk * qk_scale)
        s2 = tanh * (softcap * LOG2E)
    else:
        tanh = qk
        s2 = qk * qk_scale
    if HAS_ALIBI:
        # -slope·|i + seqlen_k - seqlen_q - j|, in base 2
        distance = tl.abs(q_pos + (seqlen_k - seqlen_q) - k_pos).to(tl.float32)
        s2 = s2 - (alibi_slope * LOG2E) * distance
    return s2, tanh


@triton.jit
def _band_mask(q_pos, k_pos, seqlen_q, seqlen_k, window_left, window_right,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """True where query q_pos may see key k_pos (bottom-right aligned band, in bounds)."""
    shifted_q = q_pos + (seqlen_k - seqlen_q)
    mask = (q_pos < seqlen_q) & (k_pos < seqlen_k)
    if HAS_LEFT:
        mask = mask & (k_pos >= shifted_q - window_left)
    if HAS_RIGHT:
        mask = mask & (k_pos <= shifted_q + window_right)
    return mask


@triton.jit
def _key_tiles(m_lo, m_hi, seqlen_q, seqlen_k, window_left, window_right,
               BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """K/V tiles a Q tile [m_lo, m_hi) visits, as three ranges of tile starts.

    [lo, full_lo) and [full_hi, hi) need masking; every tile in [full_lo, full_hi)
    is inside the band for every row and inside seqlen_k, so it needs no mask.
    Tiles outside [lo, hi) are never visited (above the causal diagonal, outside the window).
    """
    offset = seqlen_k - seqlen_q
    if HAS_LEFT:
        lo = tl.maximum(m_lo + offset - window_left, 0)
        full_lo = tl.cdiv(tl.maximum(m_hi - 1 + offset - window_left, 0), BLOCK_N) * BLOCK_N
    else:
        lo = tl.full([], 0, tl.int32)
        full_lo = lo
    lo = lo // BLOCK_N * BLOCK_N
    full_lo = tl.maximum(full_lo, lo)
    if HAS_RIGHT:
        hi = tl.minimum(m_hi + offset + window_right, seqlen_k)
        full_hi = tl.minimum(tl.maximum(m_lo + offset + window_right + 1, 0), seqlen_k) // BLOCK_N * BLOCK_N
    else:
        hi = seqlen_k
        full_hi = seqlen_k // BLOCK_N * BLOCK_N
    hi = tl.maximum(hi, lo)
    full_hi = tl.maximum(full_hi, full_lo)
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.minimum(full_hi, tl.maximum(hi, full_lo))
    return lo, full_lo, full_hi, hi


@triton.jit
def _query_tiles(n_lo, n_hi, seqlen_q, seqlen_k, window_left, window_right,
                 BLOCK_M: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Q tiles that see the K/V tile [n_lo, n_hi), as three ranges like :func:`_key_tiles`.

    Key j is seen by rows i with j - offset - right <= i <= j - offset + left: the same band
    with queries and keys swapped (offset negated, left and right exchanged).
    """
    return _key_tiles(n_lo, n_hi, seqlen_k, seqlen_q, window_right, window_left, BLOCK_M, HAS_RIGHT, HAS_LEFT)


@triton.jit
def _dropout_keep(seed, bh, q_pos, k_pos, dropout_p):
    """Keep-mask of a tile, (len(q_pos), len(k_pos)) booleans, True where dropout keeps
    P[q_pos, k_pos] of head ``bh`` (= batch·heads_q + head).

    ``q_pos`` and ``k_pos`` are 1-d; ``k_pos`` is contiguous and starts at a multiple of 8
    (every tile does). One Philox call per eight columns: counter (column // 8, row, bh, 0),
    key the 64-bit seed; output t gives columns 8g + 2t (its low 16 bits) and 8g + 2t + 1
    (its high 16 bits), and a column is kept when its 16 bits, as a number, are at least
    p · 65536 (exact in float32). The mask depends on nothing else (not on tile sizes), so
    the forward, both backward kernels and the PyTorch reference (reference/philox.py) draw
    the same one. The Philox rounds are dropout's cost: a call per column cost the forward
    4.3× on the H200, a call per four columns 2.9×.
    """
    rows: tl.constexpr = q_pos.shape[0]
    cols: tl.constexpr = k_pos.shape[0]
    groups = tl.min(tl.reshape(k_pos, [cols // 8, 8]), axis=1) // 8  # (cols / 8,): each octet's counter
    zero = (q_pos[:, None] * 0 + groups[None, :] * 0).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, (groups[None, :] + zero).to(tl.uint32), (q_pos[:, None] + zero).to(tl.uint32),
                               (bh + zero).to(tl.uint32), zero)
    # join(join(r0, r2), join(r1, r3)) is (rows, cols / 8, 2, 2) with [..., i, j] = r[2i + j];
    # joining each word's low and high halves adds a last dim: flattened row-major,
    # column 8g + 2t + h holds half h of r_t.
    words = tl.join(tl.join(r0, r2), tl.join(r1, r3))
    halves = tl.reshape(tl.join(words & 0xFFFF, words >> 16), [rows, cols])
    return halves.to(tl.float32) >= dropout_p * 65536.0


@triton.jit
def _load_bias(Bias_head, q_pos, k_pos, stride_bm, stride_bn, seqlen_q, seqlen_k):
    """Additive bias at (q_pos, k_pos); broadcast dims have stride 0; 0 outside the bounds.

    Always bounds-checked: even tiles that need no attention mask can hang past the last
    query (forward, dQ) or the last key (dK/dV).
    """
    ptrs = Bias_head + q_pos.to(tl.int64) * stride_bm + k_pos * stride_bn
    bias = tl.load(ptrs, mask=(q_pos < seqlen_q) & (k_pos < seqlen_k), other=0.0).to(tl.float32)
    # -inf stays a mask; a huge finite bias (float32's min, as some masks use) must not
    # overflow to -inf once scaled by log2(e), or the row would read as masked.
    # (A NaN bias compares false and passes through unchanged.)
    return tl.where((bias < -1e30) & (bias != float("-inf")), -1e30, bias)
