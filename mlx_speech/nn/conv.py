"""Causal 1-D convolution with an explicit streaming tail."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class ConvCache:
    """The last `pad` input frames of a causal conv, zeros at stream start."""

    def __init__(self):
        self.tail: mx.array | None = None

    def update_and_fetch(self, x: mx.array, pad: int) -> mx.array:
        if self.tail is None:
            self.tail = mx.zeros((x.shape[0], pad, x.shape[2]), x.dtype)
        x = mx.concatenate([self.tail, x], axis=1)
        self.tail = x[:, x.shape[1] - pad :]
        return x

    @property
    def state(self) -> list[mx.array]:
        return [] if self.tail is None else [self.tail]


class CausalConv1d(nn.Module):
    """Conv1d over (B, T, C) that sees only the past: left pad k - stride.

    Offline (`cache=None`) pads with zeros; streaming keeps the same frames in a
    ConvCache. Chunks must hold a multiple of `stride` frames.
    """

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, stride: int = 1,
                 bias: bool = True):
        super().__init__()
        self.conv = nn.Conv1d(in_ch, out_ch, kernel_size, stride=stride, bias=bias)
        self.kernel_size, self.stride = kernel_size, stride

    def __call__(self, x: mx.array, cache: ConvCache | None = None) -> mx.array:
        pad = self.kernel_size - self.stride
        if cache is not None:
            x = cache.update_and_fetch(x, pad)
        else:
            x = mx.pad(x, [(0, 0), (pad, 0), (0, 0)])
        return self.conv(x)
