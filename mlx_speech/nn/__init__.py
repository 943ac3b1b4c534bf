"""Model-agnostic layers and streaming state shared by every model."""

from .cache import SlidingKVCache, window_mask
from .conv import CausalConv1d, ConvCache
from .sampling import sample
from .transformer import Attention, Block, FeedForward, KVCache

__all__ = [
    "Attention",
    "Block",
    "CausalConv1d",
    "ConvCache",
    "FeedForward",
    "KVCache",
    "SlidingKVCache",
    "sample",
    "window_mask",
]
