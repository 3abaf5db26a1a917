"""Argument checks shared by every public face: clear errors, never a wrong answer.

Each error names the argument, what was expected and what came.
"""

from __future__ import annotations

import math

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEADDIM_TRITON = 256


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_tensor(name: str, t, rank: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor (float16, bfloat16, float32), got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name}: expected a {rank}-d tensor, got {t.dim()}-d ({_describe(t)})")
    if t.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got {_describe(t)}")


def check_packed(name: str, t, shape_words: str, axis: int, count: int) -> None:
    """A packed tensor of the flash-attn faces, e.g. qkv of ``shape_words`` =
    "(batch, seqlen, 3, heads, headdim)" with ``count`` = 3 along ``axis`` = 2."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != shape_words.count(",") + 1 or t.shape[axis] != count:
        raise ValueError(f"{name}: expected shape {shape_words}, got {tuple(t.shape)}")


_QKV_DTYPES = SUPPORTED_DTYPES + (torch.float64,)  # (float64: the oracle's precision, reference backend)


def check_qkv(q, k, v, layout: str) -> tuple[int, int, int, int, int, int]:
    """Check q/k/v as (batch, seqlen, heads, headdim) ('bshd') or (batch, heads, seqlen, headdim) ('bhsd').

    Returns (batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim).
    """
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, 4)
    s_dim, h_dim = (1, 2) if layout == "bshd" else (2, 1)
    order = "(batch, seqlen, heads, headdim)" if layout == "bshd" else "(batch, heads, seqlen, headdim)"
    if q.dtype not in _QKV_DTYPES:
        raise TypeError(f"q: expected dtype float16, bfloat16 or float32, got {q.dtype}")
    # Each .shape is a new torch.Size: read once (this runs on every call's host path).
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    for name, t, shape in (("k", k, k_shape), ("v", v, v_shape)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} (the dtype of q), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (the device of q), got {t.device}")
        if shape[0] != q_shape[0]:
            raise ValueError(f"{name}: expected batch {q_shape[0]} (the batch of q), got {shape[0]} ({_describe(t)})")
    if k_shape[-1] != q_shape[-1]:
        raise ValueError(f"k: expected headdim {q_shape[-1]} (the headdim of q), got {k_shape[-1]}")
    if v_shape[-1] != q_shape[-1]:
        raise ValueError(f"v: expected headdim {q_shape[-1]} (the headdim of q), got {v_shape[-1]}")
    if v_shape[s_dim] != k_shape[s_dim]:
        raise ValueError(f"v: expected seqlen {k_shape[s_dim]} (the seqlen of k) in {order}, got {v_shape[s_dim]}")
    if v_shape[h_dim] != k_shape[h_dim]:
        raise ValueError(f"v: expected {k_shape[h_dim]} heads (the heads of k) in {order}, got {v_shape[h_dim]}")
    heads_q, heads_kv = q_shape[h_dim], k_shape[h_dim]
    if heads_q % heads_kv != 0:
        raise ValueError(
            f"k: heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv}) for grouped-query attention; "
            f"q and k are read as {order}"
        )
    return q_shape[0], q_shape[s_dim], k_shape[s_dim], heads_q, heads_kv, q_shape[-1]


def check_options(
    *,
    headdim: int,
    batch: int,
    heads_q: int,
    device: torch.device,
    softmax_scale,
    window_size,
    softcap,
    alibi_slopes,
    dropout_p,
) -> float:
    """Check the scalar options; returns the resolved softmax scale."""
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(headdim)
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}")
    elif not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale: expected a finite value > 0, got {softmax_scale}")
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        raise TypeError(f"window_size: expected a pair (left, right), got {window_size!r}")
    for side, w in zip(("left", "right"), window_size):
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise ValueError(f"window_size: expected {side} to be an int >= -1 (-1 = unbounded), got {w!r}")
    if (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
            or not (math.isfinite(softcap) and softcap >= 0)):
        raise ValueError(f"softcap: expected a finite float >= 0 (0 disables it), got {softcap!r}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not (0.0 <= dropout_p < 1.0):
        raise ValueError(f"dropout_p: expected a float in [0, 1), got {dropout_p!r}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes: expected a torch.Tensor or None, got {type(alibi_slopes).__name__}")
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"alibi_slopes: expected dtype torch.float32, got {alibi_slopes.dtype}")
        if tuple(alibi_slopes.shape) not in ((heads_q,), (batch, heads_q)):
            raise ValueError(
                f"alibi_slopes: expected shape ({heads_q},) or ({batch}, {heads_q}), got {tuple(alibi_slopes.shape)}"
            )
        if alibi_slopes.device != device:
            raise ValueError(f"alibi_slopes: expected device {device} (the device of q), got {alibi_slopes.device}")
    return float(softmax_scale)


def check_bias(bias, full_shape: tuple[int, int, int, int], device: torch.device) -> None:
    """An additive bias must broadcast to (batch, heads_q, seqlen_q, seqlen_k)."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias: expected a torch.Tensor or None, got {type(bias).__name__}")
    if not bias.is_floating_point():
        raise TypeError(f"bias: expected a floating-point tensor, got {bias.dtype}")
    if bias.device != device:
        raise ValueError(f"bias: expected device {device} (the device of q), got {bias.device}")
    if bias.dim() > 4 or any(b not in (1, f) for b, f in zip(bias.shape[::-1], full_shape[::-1])):
        raise ValueError(f"bias: expected a shape broadcastable to (batch, heads_q, seqlen_q, seqlen_k) = "
                         f"{full_shape}, got {tuple(bias.shape)}")


def check_int32_tensor(name: str, t, device: torch.device) -> None:
    """An index tensor (cu_seqlens, cache_seqlens, block tables …): int32, on q's device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected an int32 torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name}: expected dtype torch.int32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device} (the device of q), got {t.device}")


def check_on_device(ok: torch.Tensor, message: str, cpu_message=None) -> None:
    """Check a condition on index values: a ValueError on the CPU (with ``cpu_message()``,
    which may show the values, if given); on a GPU an asynchronous device assert, since
    reading the values on the host would wait for the GPU."""
    if ok.device.type == "cpu":
        if not bool(ok):
            raise ValueError(cpu_message() if cpu_message is not None else message)
    else:
        torch._assert_async(ok, message)


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # The kernels read rows of headdim as vectors; only a strided last dim forces a copy.
    return t if t.stride(-1) == 1 else t.contiguous()


def check_backend_limits(backend: str, dtype: torch.dtype, headdim: int) -> None:
    """Limits of the Triton kernels, checked once the backend is known."""
    if backend != "triton":
        return
    if dtype == torch.float64:
        raise TypeError("q: float64 is not supported by the Triton kernels (use float16, bfloat16 or float32, "
                        "or FLASHTILE_BACKEND=reference)")
    if headdim > MAX_HEADDIM_TRITON:
        raise ValueError(f"q: headdim must be <= {MAX_HEADDIM_TRITON} for the Triton kernels, got {headdim}")
