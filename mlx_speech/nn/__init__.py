"""Model-agnostic layers and streaming state shared by every model."""

from .cache import RingBatch, RingRow, SlidingKVCache, stack_rows, window_mask
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
    "RingBatch",
    "RingRow",
    "SlidingKVCache",
    "sample",
    "stack_rows",
    "window_mask",
]
