"""flashtile: exact, IO-aware attention (FlashAttention) for PyTorch, written in Python.

Importing flashtile queries no GPU and imports no Triton: the kernels load on first use.
"""

from . import io, nn
from .api import attention, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from .backends import backend_status
from .block_mask import BlockMask, create_block_mask
from .kvcache import flash_attn_with_kvcache
from .merge import merge_attention_states, merge_attention_states_pair
from .reference import naive_attention
from .reference.philox import dropout_keep_mask
from .score_mods import ScoreMod, score_mod
from .sdpa import scaled_dot_product_attention, use_flashtile_sdpa
from .varlen import flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func

__version__ = "0.1.0"

__all__ = [
    "attention",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "scaled_dot_product_attention",
    "use_flashtile_sdpa",
    "merge_attention_states",
    "merge_attention_states_pair",
    "naive_attention",
    "dropout_keep_mask",
    "backend_status",
    "BlockMask",
    "create_block_mask",
    "ScoreMod",
    "score_mod",
    "io",
    "nn",
    "__version__",
]
