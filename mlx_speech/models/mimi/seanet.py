"""SEANet encoder / decoder of Mimi (moshi 0.2.13 `SEANetEncoder` / `SEANetDecoder`), causal.

`model` lists the layers at the checkpoint's indices (`model.{i}`); ELUs are parameter-free
entries. A state is a list aligned with `model`: a ConvCache / ConvTrCache per conv, a pair of
ConvCaches per residual block, None for an ELU.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ...nn import CausalConv1d, CausalConvTranspose1d, ConvCache, ConvTrCache
from .config import SeanetConfig


class ELU(nn.Module):
    def __call__(self, x: mx.array, cache=None) -> mx.array:
        return nn.elu(x)


class ResBlock(nn.Module):
    """y = x + conv_k1(elu(conv_k(elu(x)))), hidden = dim // compress (true skip)."""

    def __init__(self, dim: int, kernel: int, dilation: int, compress: int):
        super().__init__()
        hidden = dim // compress
        self.block = [ELU(), CausalConv1d(dim, hidden, kernel, dilation=dilation),
                      ELU(), CausalConv1d(hidden, dim, 1)]

    def __call__(self, x: mx.array, cache: list[ConvCache] | None = None) -> mx.array:
        c1, c2 = cache if cache is not None else (None, None)
        y = self.block[1](nn.elu(x), c1)
        return x + self.block[3](nn.elu(y), c2)


def _make_cache(layer):
    if isinstance(layer, ResBlock):
        return [ConvCache(), ConvCache()]
    if isinstance(layer, CausalConvTranspose1d):
        return ConvTrCache()
    if isinstance(layer, CausalConv1d):
        return ConvCache()
    return None


class _Seanet(nn.Module):
    def make_state(self) -> list:
        return [_make_cache(layer) for layer in self.model]

    def __call__(self, x: mx.array, state: list | None = None) -> mx.array:
        """x (B, T, C) channels-last."""
        state = state if state is not None else [None] * len(self.model)
        for layer, cache in zip(self.model, state, strict=True):
            x = layer(x, cache)
        return x


class SeanetEncoder(_Seanet):
    def __init__(self, c: SeanetConfig):
        super().__init__()
        mult = 1
        model: list[nn.Module] = [CausalConv1d(c.channels, c.n_filters, c.kernel_size)]
        for ratio in reversed(c.ratios):
            ch = mult * c.n_filters
            model += [ResBlock(ch, c.residual_kernel_size, c.dilation_base**j, c.compress)
                      for j in range(c.n_residual_layers)]
            model += [ELU(), CausalConv1d(ch, 2 * ch, 2 * ratio, stride=ratio)]
            mult *= 2
        model += [ELU(), CausalConv1d(mult * c.n_filters, c.dimension, c.last_kernel_size)]
        self.model = model


class SeanetDecoder(_Seanet):
    def __init__(self, c: SeanetConfig):
        super().__init__()
        mult = 2 ** len(c.ratios)
        model: list[nn.Module] = [CausalConv1d(c.dimension, mult * c.n_filters, c.kernel_size)]
        for ratio in c.ratios:
            ch = mult * c.n_filters
            model += [ELU(), CausalConvTranspose1d(ch, ch // 2, 2 * ratio, stride=ratio)]
            model += [ResBlock(ch // 2, c.residual_kernel_size, c.dilation_base**j, c.compress)
                      for j in range(c.n_residual_layers)]
            mult //= 2
        model += [ELU(), CausalConv1d(c.n_filters, c.channels, c.last_kernel_size)]
        self.model = model
