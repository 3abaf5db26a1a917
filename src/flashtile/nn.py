"""Modules for model authors: a self-attention layer and rotary position embeddings.

``Attention`` is the layer a transformer block calls::

    x (batch, seqlen, embed_dim)
      -> qkv_proj            (batch, seqlen, (heads + 2·kv_heads) · head_dim)
      -> views q, k, v       (batch, seqlen, heads | kv_heads, head_dim), no copies
      -> rotary on q and k   (if enabled)
      -> flashtile.attention (layout "bshd"; grouped-query heads are never repeated)
      -> out_proj            (batch, seqlen, embed_dim)

``RotaryEmbedding`` rotates pairs of channels by position-dependent angles (RoPE,
Su et al., 2021) in either of the two conventions in use: *half-split* (GPT-NeoX,
Hugging Face Llama: channel i pairs with i + rotary_dim/2) and *interleaved* (GPT-J,
Meta's Llama: channel 2i pairs with 2i + 1).
"""

from __future__ import annotations

import torch
from torch import nn

from .api import attention


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False) -> torch.Tensor:
    """Rotate the first ``2 · cos.shape[-1]`` channels of ``x``; the rest pass through.

    Args:
        x: (batch, seqlen, heads, head_dim), any float dtype.
        cos, sin: (seqlen, rotary_dim // 2), any float dtype: cos/sin of the angle of
            each (position, pair).
        interleaved: pairs are (2i, 2i+1) if True, (i, i + rotary_dim/2) if False.

    Returns:
        A new tensor of x's shape and dtype. Each pair (a, b) becomes
        (a·cos − b·sin, a·sin + b·cos), computed in float32 (float64 if x or cos is),
        so half-precision inputs are rounded once, at the end.
    """
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"cos: expected at most head_dim/2 = {x.shape[-1] // 2} pairs, got {cos.shape[-1]}")
    for name, table in (("cos", cos), ("sin", sin)):  # one row per position: no silent broadcast of one row
        if table.dim() != 2 or table.shape != (x.shape[1], cos.shape[-1]):
            raise ValueError(f"{name}: expected shape (seqlen, rotary_dim // 2) = ({x.shape[1]}, {cos.shape[-1]}), "
                             f"got {tuple(table.shape)}")
    compute = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), torch.float32)
    rot, rest = x[..., :rotary_dim].to(compute), x[..., rotary_dim:]
    cos, sin = cos[:, None, :].to(compute), sin[:, None, :].to(compute)  # (seqlen, 1, pairs): broadcast over heads
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = rot.chunk(2, dim=-1)
        rotated = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    rotated = rotated.to(x.dtype)
    return rotated if rest.shape[-1] == 0 else torch.cat((rotated, rest), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with a cos/sin cache that grows on demand.

    Pair i (0 ≤ i < rotary_dim/2) at position p is rotated by the angle
    ``p · base^(−2i / rotary_dim)``. Angles are computed in float64 and cached as
    float32 (float32 angles lose ~0.01 rad at position 10⁵). The cache is a
    non-persistent buffer: it follows ``.to(device)`` but is not in ``state_dict``, and
    it is rebuilt in float32 if ``.to(dtype)`` has cast it.

    Args:
        rotary_dim: channels rotated (even); the first rotary_dim channels of each
            head, the others pass through (partial rotary, as GPT-NeoX's rotary_pct).
        base: the frequency base (10000 in the RoPE paper and Llama 2).
        interleaved: pair convention, see :func:`apply_rotary`.
        max_seqlen: initial cache length; longer inputs extend the cache.
    """

    def __init__(self, rotary_dim: int, *, base: float = 10_000.0, interleaved: bool = False,
                 max_seqlen: int = 2048, device: torch.device | str | None = None):
        super().__init__()
        if rotary_dim <= 0 or rotary_dim % 2:
            raise ValueError(f"rotary_dim: expected a positive even number, got {rotary_dim}")
        if base <= 1.0:
            raise ValueError(f"base: expected a number > 1, got {base}")
        self.rotary_dim = rotary_dim
        self.base = float(base)
        self.interleaved = interleaved
        self._build_cache(max(1, max_seqlen), device)

    def _build_cache(self, length: int, device) -> None:
        exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64, device=device) / self.rotary_dim
        inv_freq = self.base ** -exponent                                                  # (pairs,)
        angles = torch.outer(torch.arange(length, dtype=torch.float64, device=device), inv_freq)  # (length, pairs)
        self.register_buffer("cos_cached", angles.cos().float(), persistent=False)
        self.register_buffer("sin_cached", angles.sin().float(), persistent=False)

    def cos_sin(self, seqlen: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions offset … offset+seqlen−1: two float32 (seqlen, rotary_dim/2)."""
        end = offset + seqlen
        if self.cos_cached.dtype != torch.float32:  # model.to(bfloat16) rounded the cache: rebuild it
            self._build_cache(self.cos_cached.shape[0], self.cos_cached.device)
        if end > self.cos_cached.shape[0]:
            self._build_cache(max(end, 2 * self.cos_cached.shape[0]), self.cos_cached.device)
        return self.cos_cached[offset:end], self.sin_cached[offset:end]

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: (batch, seqlen, heads, head_dim) at positions offset, offset+1, … -> rotated copy."""
        if x.dim() != 4 or x.shape[-1] < self.rotary_dim:
            raise ValueError(
                f"x: expected (batch, seqlen, heads, head_dim) with head_dim ≥ {self.rotary_dim}, "
                f"got shape {tuple(x.shape)}"
            )
        cos, sin = self.cos_sin(x.shape[1], offset)
        return apply_rotary(x, cos, sin, interleaved=self.interleaved)

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, base={self.base:g}, interleaved={self.interleaved}"


class Attention(nn.Module):
    """Multi-head self-attention over (batch, seqlen, embed_dim), running flashtile underneath.

    Unlike :class:`torch.nn.MultiheadAttention` it is batch-first, self-attention only,
    and returns the output alone (the attention weights are never built). It supports
    grouped-query attention, rotary embeddings, causal and sliding-window masks.

    Args:
        embed_dim: model width E.
        num_heads: query heads H.
        num_kv_heads: key/value heads H_kv (default H); H % H_kv == 0. Query head h
            uses KV head h // (H / H_kv); K/V are never repeated in memory.
        head_dim: D, default E // H (then E % H must be 0).
        causal: each query sees itself and earlier positions only.
        window_size: (left, right) sliding window, -1 = unbounded (see flashtile.attention).
        qkv_bias, out_bias: biases of the two projections (Llama: neither; Qwen2:
            qkv only; GPT-2: both).
        rope_base: rotary base; None disables rotary embeddings (e.g. learned absolute
            positions added before the block).
        rope_interleaved: rotary pair convention (see :class:`RotaryEmbedding`).
        rotary_dim: channels rotated per head, default D (partial rotary if smaller).
        softmax_scale: default 1/sqrt(D).
        softcap: > 0 caps scores as softcap·tanh(s/softcap) (Gemma 2).
        max_seqlen: initial length of the rotary cache (it grows on demand).

    Parameters (``state_dict`` keys): ``qkv_proj.weight`` ((H + 2·H_kv)·D, E), rows
    ordered [q heads | k heads | v heads]; ``out_proj.weight`` (E, H·D); and the biases
    when enabled. Shapes: input and output (batch, seqlen, E), any float dtype that
    flashtile supports (float16, bfloat16, float32).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        qkv_bias: bool = False,
        out_bias: bool = False,
        rope_base: float | None = 10_000.0,
        rope_interleaved: bool = False,
        rotary_dim: int | None = None,
        softmax_scale: float | None = None,
        softcap: float = 0.0,
        max_seqlen: int = 2048,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if not isinstance(num_kv_heads, int) or num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_kv_heads: expected a positive divisor of num_heads ({num_heads}), got {num_kv_heads!r}"
            )
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(
                    f"embed_dim: expected a multiple of num_heads ({num_heads}) when head_dim is not given, "
                    f"got {embed_dim}"
                )
            head_dim = embed_dim // num_heads
        if rope_base is not None and rotary_dim is not None and not 0 < rotary_dim <= head_dim:
            raise ValueError(f"rotary_dim: expected at most head_dim ({head_dim}), got {rotary_dim}")
        if len(window_size) != 2:
            raise ValueError(f"window_size: expected (left, right), got {window_size!r}")
        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, num_kv_heads, head_dim
        self.causal = bool(causal)
        self.window_size = (int(window_size[0]), int(window_size[1]))
        self.softmax_scale = softmax_scale
        self.softcap = float(softcap)

        factory = {"device": device, "dtype": dtype}
        self.qkv_proj = nn.Linear(embed_dim, (num_heads + 2 * num_kv_heads) * head_dim, bias=qkv_bias, **factory)
        self.out_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=out_bias, **factory)
        self.rotary = None
        if rope_base is not None:
            self.rotary = RotaryEmbedding(head_dim if rotary_dim is None else rotary_dim, base=rope_base,
                                          interleaved=rope_interleaved, max_seqlen=max_seqlen, device=device)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, S, E) -> q (B, S, H, D), k and v (B, S, H_kv, D), rotary applied to q and k.

        q, k and v start as views of one projection output (last dim contiguous, so
        flashtile reads them in place); rotary makes new q and k, v stays a view.
        """
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x: expected (batch, seqlen, {self.embed_dim}), got shape {tuple(x.shape)}")
        batch, seqlen, _ = x.shape
        h, h_kv = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(batch, seqlen, h + 2 * h_kv, self.head_dim)  # (B, S, H + 2·H_kv, D)
        q, k, v = qkv.split((h, h_kv, h_kv), dim=2)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention itself: q (B, S, H, D), k/v (B, S, H_kv, D) -> (B, S, H, D).

        A subclass may override this to run another implementation on the same
        projections and weights (examples/train_gpt.py compares with SDPA this way).
        """
        return attention(q, k, v, causal=self.causal, window_size=self.window_size,
                         softmax_scale=self.softmax_scale, softcap=self.softcap)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seqlen, embed_dim) -> (batch, seqlen, embed_dim)."""
        q, k, v = self.project_qkv(x)
        out = self.attend(q, k, v)                             # (B, S, H, D)
        return self.out_proj(out.flatten(2))                   # (B, S, H·D) -> (B, S, E)

    def extra_repr(self) -> str:
        parts = [f"embed_dim={self.embed_dim}", f"num_heads={self.num_heads}",
                 f"num_kv_heads={self.num_kv_heads}", f"head_dim={self.head_dim}", f"causal={self.causal}"]
        if self.window_size != (-1, -1):
            parts.append(f"window_size={self.window_size}")
        if self.softcap > 0:
            parts.append(f"softcap={self.softcap:g}")
        return ", ".join(parts)


__all__ = ["Attention", "RotaryEmbedding", "apply_rotary"]
