"""Launchers: choose configs, allocate scratch, compute grids, call the kernels.

Tensors arrive as (batch, heads, seqlen, headdim) views with any strides (the last
one is 1); nothing is copied. Grids are 1-D (tiles × batch × heads), so batch ×
heads may exceed 65535; base offsets are 64-bit inside the kernels.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from triton.runtime.errors import OutOfResources

from ..masks import Band
from . import autotune, fast_launch, hopper, tma
from .bwd import PREPROCESS_ROWS, _bwd_dkdv_kernel, _bwd_dq_kernel, _bwd_preprocess
from .common import LOG2E as _LOG2E_CONSTEXPR
from .common import cdiv, padded_head_dim
from .configs import backward_configs, forward_config
from .padding import fill_rows_outside
from .fwd import _fwd_kernel

LOG2E = _LOG2E_CONSTEXPR.value  # the kernels' log2(e) as a float, for the scale the host works out


def _dot_precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    if dtype == torch.float32:
        return "tf32" if allow_tf32 else "ieee"
    return "ieee"  # ignored for 16-bit inputs


def _qk_scale(softmax_scale: float, softcap: float) -> float:
    # With softcap the kernels compute tanh(qk · scale / softcap); without, qk · scale · log2(e).
    return softmax_scale / softcap if softcap > 0 else softmax_scale * LOG2E


def _alibi_args(alibi_slopes: torch.Tensor | None, q: torch.Tensor):
    if alibi_slopes is None:
        return q, 0, 0  # a dummy pointer: never read when HAS_ALIBI is False
    if alibi_slopes.dim() == 1:
        return alibi_slopes, 0, alibi_slopes.stride(0)
    return alibi_slopes, alibi_slopes.stride(0), alibi_slopes.stride(1)


def _maybe_autotune(kind, table_cfg, q, head_dim_padded, causal, seqlen, launch, bias=None, score_mod=None,
                    dropout=False):
    """The table's config, or with FLASHTILE_AUTOTUNE=1 the fastest measured one (cached on disk).

    The key holds what changes the best config: a bias and dropout (they take shared
    memory, so a config chosen without them may not launch with them) and a score_mod
    (more arithmetic per score) get choices of their own."""
    if not autotune.enabled() or q.device.type != "cuda":
        return table_cfg
    extras = ((f"-bias{bias.element_size()}" if bias is not None else "") + ("-scoremod" if score_mod else "")
              + ("-dropout" if dropout else ""))
    key = (f"{kind}-d{head_dim_padded}-{str(q.dtype).removeprefix('torch.')}-{'causal' if causal else 'full'}"
           f"-n{autotune.seqlen_bucket(seqlen)}{extras}")
    return autotune.tuner_for(q.device).choose(key, autotune.candidates(kind, table_cfg), launch)


def _bias_args(bias: torch.Tensor | None, q: torch.Tensor, seqlen_k: int):
    """The bias pointer and its (batch, head, row, column) strides, 0 along broadcast dims."""
    if bias is None:
        return q, (0, 0, 0, 0)  # a dummy pointer: never read when HAS_BIAS is False
    # expand() gives every broadcast dim stride 0 (a size-1 dim may carry any stride).
    return bias, tuple(bias.expand(*q.shape[:3], seqlen_k).stride())


def _block_mask_args(block_mask, kernel: str, dummy: torch.Tensor):
    """(indices, partial counts, counts, schedule, runs, mask buffer) of one kernel's tile
    lists (``kernel``: "fwd", "dq" or "dkdv"), their strides (BlockMask.lists), and the
    kernel's constexprs (the jitted mask; whether every row's full tiles are one run), or
    dummies without one."""
    if block_mask is None:
        return (dummy,) * 6, (0, 0, 0, 0, 0), dict(MASK_MOD=None, FULL_RANGE=False)
    lists, strides, full_range = block_mask.lists(kernel)
    buffer = block_mask.mask.buffer if block_mask.mask.buffer is not None else dummy
    return (*lists, buffer), strides, dict(MASK_MOD=block_mask.mask.triton_fn(), FULL_RANGE=full_range)


def _fit_args(bias: torch.Tensor | None, block_mask, dropout_p: float, backward: bool = False) -> dict:
    """What the config choice must fit beside the Q/K/V tiles: a bias tile, a block mask's
    tiles (the forward's, or the dQ pass's for the backward), dropout's keep mask."""
    blocks = None
    if block_mask is not None:
        blocks = block_mask.backward_blocks if backward else (block_mask.block_m, block_mask.block_n)
    return dict(bias_elem=bias.element_size() if bias is not None else 0, blocks=blocks, dropout=dropout_p > 0)


def _score_mod_args(score_mod, dummy: torch.Tensor):
    """(buffer, jitted forward, jitted derivative) of a score_mod, or dummies without one."""
    if score_mod is None:
        return dummy, None, None
    fwd, grad = score_mod.triton_fns()
    return (score_mod.buffer if score_mod.buffer is not None else dummy), fwd, grad


@contextlib.contextmanager
def _block_mask_tiles_must_fit(blocks: tuple[int, int], head_dim: int, dtype: torch.dtype):
    """A block mask fixes the kernels' tile sizes (``blocks``, queries × keys); when even
    one pipeline stage of them does not fit in shared memory, say so in flashtile's terms
    instead of Triton's."""
    try:
        yield
    except OutOfResources as err:
        raise ValueError(
            f"block_mask: its {blocks[0]}×{blocks[1]} tiles do not fit in this GPU's shared "
            f"memory at headdim {head_dim}, {dtype} ({err}); build it with smaller tiles, e.g. "
            f"create_block_mask(..., block_m=64, block_n=64, backward_block_n=64)") from err


def _launch_args(cfg) -> dict:
    return dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


@dataclass(frozen=True)
class Varlen:
    """Packed variable-length batch: int32 cumulative sequence starts on the device.

    The tensors are then (1, heads, total_tokens, headdim) views; sequence b owns rows
    cu_seqlens[b] : cu_seqlens[b + 1]. max_seqlen_* size the grid, so no host sync.
    """

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    def __post_init__(self):
        # The kernels read offset i at cu_seqlens + i: a strided view (offsets[::2]) is copied.
        object.__setattr__(self, "cu_seqlens_q", self.cu_seqlens_q.contiguous())
        object.__setattr__(self, "cu_seqlens_k", self.cu_seqlens_k.contiguous())


def _problem(q, k, varlen: Varlen | None):
    """(batch, seqlen_q, seqlen_k) as the grid sees them: sequences and maxima when packed."""
    if varlen is None:
        return q.shape[0], q.shape[2], k.shape[2]
    return varlen.cu_seqlens_q.shape[0] - 1, varlen.max_seqlen_q, varlen.max_seqlen_k


def _packed_rows(t: torch.Tensor) -> torch.Tensor:
    """The (1, heads, total, D) view of a packed (total, heads, D) tensor as (total, heads · D)."""
    return t[0].transpose(0, 1).view(t.shape[2], -1)  # a view: raises rather than copy


def _batch_stride(t: torch.Tensor, varlen: Varlen | None):
    # Packed tensors have no batch dimension: the sequence offset comes from cu_seqlens.
    strides = t.stride()
    return strides if varlen is None else (0, *strides[1:])


def _lse_strides(lse: torch.Tensor, varlen: Varlen | None) -> tuple[int, int]:
    # Dense LSE is (B, H, Sq); packed LSE is (H, total_q), rows offset by cu_seqlens_q.
    return (lse.stride(0), lse.stride(1)) if varlen is None else (0, lse.stride(0))


def attention_forward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_scale: float,
    band: Band,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    allow_tf32: bool,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    varlen: Varlen | None = None,
    block_mask=None,
    score_mod=None,
) -> torch.Tensor:
    """Run ``_fwd_kernel``. q/out: (B, Hq, Sq, D), k/v: (B, Hkv, Sk, D).

    Returns the LSE, float32: (B, Hq, Sq), or (Hq, total_q) for a packed batch.
    bias: broadcastable to (B, Hq, Sq, Sk); dropout uses the counter-based keep-mask of
    ``dropout_seed``, a one-element int64 tensor on the device (see reference/philox.py).
    """
    if hopper.eligible(q, k, v, out, band, softcap=softcap, alibi_slopes=alibi_slopes, bias=bias,
                       dropout_p=dropout_p, varlen=varlen, block_mask=block_mask, score_mod=score_mod):
        try:
            return hopper.forward(q, k, v, out, softmax_scale, causal=band.right == 0, block_mask=block_mask)
        except Exception as error:  # a kernel that cannot be built here: Triton's, under auto
            if not hopper.falls_back(error, q, backward=False, causal=band.right == 0, mask=_mask_of(block_mask)):
                raise
    heads_q, head_dim = q.shape[1], q.shape[3]
    heads_kv = k.shape[1]
    batch, seqlen_q, seqlen_k = _problem(q, k, varlen)
    head_dim_padded = padded_head_dim(head_dim)
    causal_like = band.right is not None  # causal or a right window: the diagonal-heavy configs
    if varlen is None:
        lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float32, device=q.device)
        cu_q = cu_k = lse  # dummy pointers: never read unless IS_VARLEN
    else:
        lse = torch.empty(heads_q, q.shape[2], dtype=torch.float32, device=q.device)
        cu_q, cu_k = varlen.cu_seqlens_q, varlen.cu_seqlens_k
        # Rows outside every sequence are never visited: zeros and the LSE of "no key".
        fill_rows_outside(_packed_rows(out), cu_q, 0.0)
        fill_rows_outside(lse.t(), cu_q, float("-inf"))
    alibi, stride_ab, stride_ah = _alibi_args(alibi_slopes, q)
    bias_ptr, bias_strides = _bias_args(bias, q, seqlen_k)
    mask_ptrs, mask_strides, mask_constexprs = _block_mask_args(block_mask, "fwd", lse)
    score_buf, score_fn, _ = _score_mod_args(score_mod, lse)

    use_tma = tma.wanted(varlen, k, v)

    def launch(cfg):
        num_m_blocks = cdiv(seqlen_q, cfg.BLOCK_M)
        descriptors, (desc_k, desc_v) = tma.launch_tiles(use_tma, (k, v), cfg.BLOCK_N, head_dim_padded,
                                                         cfg.num_stages)
        fast_launch.launch(
            _fwd_kernel, (num_m_blocks * batch * heads_q,),
            q, k, v, out, lse, alibi, bias_ptr, cu_q, cu_k, *mask_ptrs, score_buf, desc_k, desc_v,
            *_batch_stride(q, varlen), *_batch_stride(k, varlen), *_batch_stride(v, varlen),
            *_batch_stride(out, varlen), stride_ab, stride_ah, *bias_strides, *_lse_strides(lse, varlen),
            *mask_strides, heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, num_m_blocks,
            _qk_scale(softmax_scale, softcap), float(softcap), band.left or 0, band.right or 0,
            dropout_seed if dropout_seed is not None else lse, float(dropout_p),
            HEAD_DIM=head_dim, HEAD_DIM_PADDED=head_dim_padded, HAS_LEFT=band.left is not None, HAS_RIGHT=causal_like,
            HAS_SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None, HAS_BIAS=bias is not None,
            HAS_DROPOUT=dropout_p > 0, IS_VARLEN=varlen is not None,
            DOT_PRECISION=_dot_precision(q.dtype, allow_tf32), SCORE_MOD=score_fn, USE_TMA=descriptors,
            **mask_constexprs, **_launch_args(cfg),
        )

    cfg = forward_config(head_dim_padded, q.dtype, causal_like, q.device, seqlen_q,
                         **_fit_args(bias, block_mask, dropout_p))
    if block_mask is not None:
        with _block_mask_tiles_must_fit((block_mask.block_m, block_mask.block_n), head_dim, q.dtype):
            launch(cfg)  # tile sizes are the block mask's: nothing to tune
    else:
        launch(_maybe_autotune("fwd", cfg, q, head_dim_padded, causal_like, seqlen_q, launch, bias, score_mod,
                               dropout_p > 0))
    return lse


def _mask_of(block_mask):
    """A block mask's MaskMod, or None without one."""
    return block_mask.mask if block_mask is not None else None


def attention_backward_triton(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dlse: torch.Tensor | None,
    softmax_scale: float,
    band: Band,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    allow_tf32: bool,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    bias_requires_grad: bool = False,
    varlen: Varlen | None = None,
    block_mask=None,
    score_mod=None,
    deterministic: bool = False,
) -> torch.Tensor | None:
    """Run the three backward kernels, writing dq (B, Hq, Sq, D), dk and dv (B, Hkv, Sk, D).

    Returns the bias gradient (the bias's shape, float32) when ``bias_requires_grad``:
    dS is written to a (B, Hq, Sq, Sk) scratch and summed over the bias's broadcast
    dims, the one place the backward holds an N×N buffer, and only on request.
    For a packed batch, rows outside every sequence get zero gradients. ``deterministic``:
    keep to kernels whose every output has one writer (hopper.backward's argument; the
    Triton kernels here always are).
    """
    heads_q, head_dim = q.shape[1], q.shape[3]
    heads_kv = k.shape[1]
    batch, seqlen_q, seqlen_k = _problem(q, k, varlen)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    lse = lse.contiguous()
    if dlse is not None:
        dlse = dlse.contiguous()
    if hopper.eligible(q, k, v, out, band, softcap=softcap, alibi_slopes=alibi_slopes, bias=bias,
                       dropout_p=dropout_p, varlen=varlen, block_mask=block_mask, score_mod=score_mod,
                       backward=True, grads=(dout, dq, dk, dv)):
        try:
            hopper.backward(q, k, v, out, dout, lse, dlse, softmax_scale, band.right == 0, dq, dk, dv,
                            deterministic=deterministic, block_mask=block_mask)
            return None
        except Exception as error:  # a kernel that cannot be built here: Triton's, under auto
            if not hopper.falls_back(error, q, backward=True, causal=band.right == 0, mask=_mask_of(block_mask)):
                raise
    head_dim_padded = padded_head_dim(head_dim)
    causal_like = band.right is not None  # causal or a right window: the diagonal-heavy configs
    cfg_dkdv, cfg_dq = backward_configs(head_dim_padded, q.dtype, causal_like, q.device,
                                        **_fit_args(bias, block_mask, dropout_p, backward=True))
    delta = torch.empty_like(lse)
    cu_q, cu_k = (varlen.cu_seqlens_q, varlen.cu_seqlens_k) if varlen is not None else (lse, lse)
    if varlen is not None:  # rows outside every sequence are never visited
        for grad, cu in ((dq, cu_q), (dk, cu_k), (dv, cu_k)):
            fill_rows_outside(_packed_rows(grad), cu, 0.0)
    alibi, stride_ab, stride_ah = _alibi_args(alibi_slopes, q)
    bias_ptr, bias_strides = _bias_args(bias, q, seqlen_k)
    has_dbias = bias is not None and bias_requires_grad
    # Unvisited tiles (outside the band) have dS = 0: the scratch starts zeroed.
    dbias_full = (torch.zeros(batch, heads_q, seqlen_q, seqlen_k, dtype=torch.float32, device=q.device)
                  if has_dbias else delta)
    seed = dropout_seed if dropout_seed is not None else lse  # a dummy pointer without dropout
    q_lists, q_list_strides, dkdv_mask_constexprs = _block_mask_args(block_mask, "dkdv", lse)
    kv_lists, kv_list_strides, dq_mask_constexprs = _block_mask_args(block_mask, "dq", lse)
    score_buf, score_fn, score_grad = _score_mod_args(score_mod, lse)
    if score_mod is not None and score_grad is None:
        raise ValueError(f"score_mod: {score_mod.name!r} has no derivative for the Triton kernels; wrap it as "
                         "flashtile.score_mod(fn, grad=...) (grad=1.0 if it only adds to the score), or use the "
                         "reference backend")
    common = dict(
        HEAD_DIM=head_dim, HEAD_DIM_PADDED=head_dim_padded, HAS_LEFT=band.left is not None, HAS_RIGHT=causal_like,
        HAS_SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None, HAS_BIAS=bias is not None,
        HAS_DROPOUT=dropout_p > 0, IS_VARLEN=varlen is not None, DOT_PRECISION=_dot_precision(q.dtype, allow_tf32),
    )
    strides = (*_batch_stride(q, varlen), *_batch_stride(k, varlen), *_batch_stride(v, varlen),
               *_batch_stride(dout, varlen))
    lse_strides = _lse_strides(lse, varlen)
    window = (band.left or 0, band.right or 0)
    qk_scale = _qk_scale(softmax_scale, softcap)

    num_m_pre = cdiv(seqlen_q, PREPROCESS_ROWS)
    fast_launch.launch(
        _bwd_preprocess, (num_m_pre * batch * heads_q,),
        out, dout, dlse if dlse is not None else delta, delta, cu_q, lse, delta, None, None,
        *_batch_stride(out, varlen), *_batch_stride(dout, varlen), *lse_strides, 0,
        heads_q, seqlen_q, num_m_pre,
        HEAD_DIM=head_dim, HEAD_DIM_PADDED=head_dim_padded, BLOCK_M=PREPROCESS_ROWS, HAS_DLSE=dlse is not None,
        IS_VARLEN=varlen is not None, PADDED=False, DQ_SUM_WIDTH=0,
    )

    use_tma = tma.wanted(varlen, q, k, v, dout)

    def launch_dkdv(cfg):
        num_n_blocks = cdiv(seqlen_k, cfg.BLOCK_N)
        descriptors, (desc_q, desc_do) = tma.launch_tiles(use_tma, (q, dout), cfg.BLOCK_M, head_dim_padded,
                                                          cfg.num_stages)
        fast_launch.launch(
            _bwd_dkdv_kernel, (num_n_blocks * batch * heads_kv,),
            q, k, v, dout, lse, delta, dk, dv, alibi, bias_ptr, cu_q, cu_k, *q_lists, score_buf, desc_q, desc_do,
            *strides, *_batch_stride(dk, varlen), *_batch_stride(dv, varlen), stride_ab, stride_ah,
            *bias_strides, *lse_strides, *q_list_strides, heads_q, heads_kv, heads_q // heads_kv, seqlen_q, seqlen_k,
            num_n_blocks,
            softmax_scale, qk_scale, float(softcap), *window, seed, float(dropout_p),
            SCORE_MOD=score_fn, SCORE_GRAD=score_grad, USE_TMA=descriptors, **dkdv_mask_constexprs, **common,
            **_launch_args(cfg),
        )

    def launch_dq(cfg):
        num_m_blocks = cdiv(seqlen_q, cfg.BLOCK_M)
        descriptors, (desc_k, desc_v) = tma.launch_tiles(use_tma, (k, v), cfg.BLOCK_N, head_dim_padded,
                                                         cfg.num_stages)
        fast_launch.launch(
            _bwd_dq_kernel, (num_m_blocks * batch * heads_q,),
            q, k, v, dout, lse, delta, dq, alibi, bias_ptr, dbias_full, cu_q, cu_k, *kv_lists, score_buf,
            desc_k, desc_v,
            *strides, *_batch_stride(dq, varlen), stride_ab, stride_ah,
            *bias_strides, *lse_strides, *kv_list_strides, heads_q, heads_q // heads_kv, seqlen_q, seqlen_k,
            num_m_blocks,
            softmax_scale, qk_scale, float(softcap), *window, seed, float(dropout_p),
            HAS_DBIAS=has_dbias, SCORE_MOD=score_fn, SCORE_GRAD=score_grad, USE_TMA=descriptors,
            **dq_mask_constexprs, **common, **_launch_args(cfg),
        )

    if block_mask is not None:  # tile sizes are the block mask's: nothing to tune
        with _block_mask_tiles_must_fit(block_mask.dkdv_blocks, head_dim, q.dtype):
            launch_dkdv(cfg_dkdv)
        with _block_mask_tiles_must_fit(block_mask.backward_blocks, head_dim, q.dtype):
            launch_dq(cfg_dq)
    else:
        launch_dkdv(_maybe_autotune("dkdv", cfg_dkdv, q, head_dim_padded, causal_like, seqlen_k, launch_dkdv, bias,
                                    score_mod, dropout_p > 0))
        launch_dq(_maybe_autotune("dq", cfg_dq, q, head_dim_padded, causal_like, seqlen_q, launch_dq, bias,
                                  score_mod, dropout_p > 0))
    if has_dbias:
        return dbias_full.sum_to_size(bias.shape)
    return None
