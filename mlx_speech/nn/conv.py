"""Causal 1-D convolution with an explicit streaming tail."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class ConvCache:
    """The last `pad` input frames of a causal conv, zeros at stream start."""

    def __init__(self):
        self.tail: mx.array | None = None

    def update_and_fetch(self, x: mx.array, pad: int, replicate: bool = False) -> mx.array:
        if not pad:  # a 1-tap conv keeps no tail (no zero-size array reaches a kernel)
            return x
        if self.tail is None:
            if replicate:  # stream start padded with copies of the first frame
                self.tail = mx.repeat(x[:, :1], pad, axis=1)
            else:
                self.tail = mx.zeros((x.shape[0], pad, x.shape[2]), x.dtype)
        x = mx.concatenate([self.tail, x], axis=1)
        self.tail = x[:, x.shape[1] - pad :]
        return x

    @property
    def state(self) -> list[mx.array]:
        return [] if self.tail is None else [self.tail]


class CausalConv1d(nn.Module):
    """Conv1d over (B, T, C) that sees only the past: left pad (k - 1) * dilation + 1 - stride.

    Offline (`cache=None`) pads with zeros (or copies of the first frame when `replicate`);
    streaming keeps the same frames in a ConvCache. Chunks must hold a multiple of `stride` frames.
    """

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, stride: int = 1,
                 bias: bool = True, dilation: int = 1, replicate: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(in_ch, out_ch, kernel_size, stride=stride, dilation=dilation,
                              bias=bias)
        self.kernel_size, self.stride = kernel_size, stride
        self.dilation, self.replicate = dilation, replicate

    def __call__(self, x: mx.array, cache: ConvCache | None = None) -> mx.array:
        pad = (self.kernel_size - 1) * self.dilation + 1 - self.stride
        if cache is not None:
            x = cache.update_and_fetch(x, pad, self.replicate)
        elif not pad:
            pass
        elif self.replicate:
            x = mx.concatenate([mx.repeat(x[:, :1], pad, axis=1), x], axis=1)
        else:
            x = mx.pad(x, [(0, 0), (pad, 0), (0, 0)])
        return self.conv(x)


def conv_transpose(x: mx.array, weight: mx.array, stride: int, groups: int = 1) -> mx.array:
    """`mx.conv_transpose1d(x, weight, stride=stride, groups=groups)`: x (B, T, I), weight
    (O, K, I / groups) -> (B, (T - 1) * stride + K, O).

    Without groups, as one matrix product and an overlap-add: frame t's K outputs land at
    t * stride + k. The product runs on the BLAS (MLX's CPU backend computes a transposed
    convolution with a direct loop: 4-5x slower at the codecs' shapes, growing with the
    batch), and it reads the weight in place (a view: nothing copied per call). Equal to
    the convolution up to float rounding."""
    if groups != 1:
        return mx.conv_transpose1d(x, weight, stride=stride, groups=groups)
    B, T, _ = x.shape
    O, K, I = weight.shape
    J = -(-K // stride)  # input frames one output frame sums
    z = x.reshape(B * T, I) @ weight.reshape(O * K, I).T  # (B*T, O*K), o-major
    z = z.reshape(B, T, O, K).swapaxes(2, 3)  # (B, T, K, O)
    if J * stride > K:
        z = mx.pad(z, [(0, 0), (0, 0), (0, J * stride - K), (0, 0)])
    z = z.reshape(B, T, J, stride, O)
    y = z[:, :, 0]
    for j in range(1, J):  # frame t's j-th stride of outputs lands in output frame t + j
        y = mx.pad(y, [(0, 0), (0, 1), (0, 0), (0, 0)]) + mx.pad(
            z[:, :, j], [(0, 0), (j, 0), (0, 0), (0, 0)])
    return y.reshape(B, (T + J - 1) * stride, O)[:, : (T - 1) * stride + K]


class ConvTrCache:
    """Overlap of a causal transposed conv: the last k - stride outputs of the previous chunk,
    bias excluded, zeros at stream start."""

    def __init__(self):
        self.partial: mx.array | None = None

    @property
    def state(self) -> list[mx.array]:
        return [] if self.partial is None else [self.partial]


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d over (B, T, C) trimmed causally: the last k - stride outputs are dropped.

    Streaming keeps them (minus the bias) in a ConvTrCache and adds them to the next chunk's
    first outputs, so any chunking gives the offline result. Weight layout (out, k, in / groups).
    """

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, stride: int = 1,
                 bias: bool = True, groups: int = 1):
        super().__init__()
        scale = (1.0 / (in_ch * kernel_size)) ** 0.5
        self.weight = mx.random.uniform(-scale, scale, (out_ch, kernel_size, in_ch // groups))
        if bias:
            self.bias = mx.zeros((out_ch,))
        self.kernel_size, self.stride, self.groups = kernel_size, stride, groups

    def __call__(self, x: mx.array, cache: ConvTrCache | None = None) -> mx.array:
        y = conv_transpose(x, self.weight, self.stride, self.groups)
        pad = self.kernel_size - self.stride
        has_bias = "bias" in self
        if cache is not None and pad:
            if cache.partial is not None:
                y = mx.concatenate([y[:, :pad] + cache.partial, y[:, pad:]], axis=1)
            cache.partial = y[:, y.shape[1] - pad :]
        if pad:
            y = y[:, : y.shape[1] - pad]
        return y + self.bias if has_bias else y
