"""Model-agnostic layers and streaming state shared by every model."""

from .cache import SlidingKVCache, window_mask
from .conv import CausalConv1d, ConvCache
from .sampling import sample

__all__ = ["CausalConv1d", "ConvCache", "SlidingKVCache", "sample", "window_mask"]
