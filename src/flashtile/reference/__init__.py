"""PyTorch implementations: the float64 oracle and the tiled algorithm (CPU backend)."""

from .naive import naive_attention
from .tiled import tiled_attention_backward, tiled_attention_forward

__all__ = ["naive_attention", "tiled_attention_forward", "tiled_attention_backward"]
