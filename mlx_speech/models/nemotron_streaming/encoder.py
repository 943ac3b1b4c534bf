"""Cache-aware FastConformer encoder (NVIDIA Nemotron speech streaming) in MLX.

Quirks worth knowing before reading the code:
- Causal dw_striding subsampling x8: three k3/s2 Conv2d over (time, freq), each
  padded (k-1, s-1) on both axes; flattened channel-major (C, F) before a Linear.
- Transformer-XL rel-pos attention with untied per-layer bias_u / bias_v and a
  sinusoidal table over relative distances; no biases in the attention, FFN or
  conv module (config flags); the conv module's norm is a LayerNorm.
- chunked_limited attention: frames form blocks of r+1 (r = right context, one
  value for all layers, chosen by the latency mode); a frame sees its own block
  and the left_context // (r+1) blocks before it. Blocks start at frame 0.
- Streaming is exact from the first chunk (no warm-up): caches start empty and
  grow to left_context frames, the causal convs keep their input tails, and
  subsampled frames wait in `pending` until their block is complete.
- `state=None` is offline; a state makes any mel chunking give the offline frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ...nn import ConvCache
from .config import EncoderConfig


class StridedConvCache:
    """Input time steps of a causal strided conv not yet consumed by an output.

    Starts as the offline left padding (k - 1 zero steps); on the final call the
    offline right padding (s - 1 zeros) is appended, so for any chunking the
    outputs equal the offline conv over the whole input.
    """

    def __init__(self):
        self.buf: mx.array | None = None

    def update_and_fetch(self, x: mx.array | None, k: int, s: int,
                         final: bool) -> mx.array | None:
        """New input steps `x` (None: none) -> the input steps of every output now complete,
        or None when there is none (nothing zero-size reaches a kernel)."""
        if self.buf is None:
            if x is None:
                return None
            self.buf = mx.zeros((x.shape[0], k - 1, *x.shape[2:]), x.dtype)
        parts = [self.buf] if x is None else [self.buf, x]
        if final and s > 1:
            b = self.buf
            parts.append(mx.zeros((b.shape[0], s - 1, *b.shape[2:]), b.dtype))
        n_in = sum(a.shape[1] for a in parts)
        n_out = max(0, (n_in - k) // s + 1)
        if not n_out and len(parts) == 1:
            return None
        x = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)
        self.buf = x[:, n_out * s:]  # never empty: k > s keeps k - s steps at least
        return x[:, : (n_out - 1) * s + k] if n_out else None

    @property
    def state(self) -> list[mx.array]:
        return [] if self.buf is None else [self.buf]


class CausalConv2d(nn.Module):
    """Conv2d over (B, T, F, C): causal in time, (k-1, s-1) zero padding in frequency."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, groups: int = 1):
        super().__init__()
        self.weight = mx.zeros((out_ch, kernel, kernel, in_ch // groups))
        self.bias = mx.zeros((out_ch,))
        self.kernel, self.stride, self.groups = kernel, stride, groups

    def __call__(self, x: mx.array | None, cache: StridedConvCache | None,
                 final: bool) -> mx.array | None:
        """None in (no new steps) or out (no complete output): nothing reaches a kernel."""
        k, s = self.kernel, self.stride
        if x is not None:
            x = mx.pad(x, [(0, 0), (0, 0), (k - 1, s - 1), (0, 0)])
        if cache is not None:
            x = cache.update_and_fetch(x, k, s, final)
        elif x is not None:
            x = mx.pad(x, [(0, 0), (k - 1, s - 1), (0, 0), (0, 0)])
            x = x if x.shape[1] >= k else None
        if x is None:
            return None
        return mx.conv2d(x, self.weight, stride=s, groups=self.groups) + self.bias


class SubsamplingLayer(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        ch = c.subsampling_conv_channels
        self.depthwise_conv = CausalConv2d(ch, ch, c.subsampling_conv_kernel_size,
                                           c.subsampling_conv_stride, groups=ch)
        self.pointwise_conv = nn.Linear(ch, ch)  # a 1x1 Conv2d


class Subsampling(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        ch = c.subsampling_conv_channels
        self.conv_in = CausalConv2d(1, ch, c.subsampling_conv_kernel_size,
                                    c.subsampling_conv_stride)
        self.layers = [SubsamplingLayer(c) for _ in range(c.n_subsampling_layers - 1)]
        self.linear = nn.Linear(ch * c.subsampled_freqs, c.hidden_size)

    def __call__(self, mel: mx.array | None, caches: list[StridedConvCache] | None,
                 final: bool) -> mx.array | None:
        """(B, T, n_mels) -> (B, T', hidden): frame t reads mel frames 8t-14 .. 8t.
        None when no frame is complete (a stage with nothing new is not run)."""
        caches = caches or [None] * (1 + len(self.layers))
        x = self.conv_in(None if mel is None else mel[..., None], caches[0], final)
        for layer, cache in zip(self.layers, caches[1:], strict=True):
            if x is None and not final:
                return None
            x = layer.depthwise_conv(None if x is None else nn.relu(x), cache, final)
            x = None if x is None else layer.pointwise_conv(x)
        if x is None:
            return None
        x = nn.relu(x)
        B, T, F, C = x.shape
        return self.linear(x.transpose(0, 1, 3, 2).reshape(B, T, C * F))


class ContextKVCache:
    """Keys/values of the last `size` frames, kept in time order (rel-pos needs it).

    Always `size` frames long: zeros stand in front until `valid` frames are real, and the
    encoder masks them, so the first chunk sees exactly what offline sees while attention
    keeps one key length from the first chunk on (a GPU builds kernels per shape). The copy
    per call is bounded by size + chunk frames.
    """

    def __init__(self, size: int):
        self.size = size
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.valid = 0  # real frames among the last `size`

    @property
    def length(self) -> int:
        """Real (unmasked) frames held."""
        return self.valid

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """(B, H, T, dh) new keys/values -> the `size` cached frames and the new ones."""
        if self.keys is None:
            B, H, _, dh = k.shape
            self.keys = mx.zeros((B, H, self.size, dh), k.dtype)
            self.values = mx.zeros((B, H, self.size, v.shape[-1]), v.dtype)
        k = mx.concatenate([self.keys, k], axis=2)
        v = mx.concatenate([self.values, v], axis=2)
        start = k.shape[2] - self.size
        self.keys, self.values = k[:, :, start:], v[:, :, start:]
        self.valid = min(self.size, self.valid + k.shape[2] - self.size)
        return k, v

    @property
    def state(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values) if a is not None]


def rel_positions(n_keys: int, n_queries: int, dim: int) -> mx.array:
    """Sinusoids (sin, cos interleaved) for distances n_keys-1 down to -(n_queries-1)."""
    pos = mx.arange(n_keys - 1, -n_queries, -1).astype(mx.float32)
    inv_freq = 1.0 / (10000.0 ** (mx.arange(0, dim, 2).astype(mx.float32) / dim))
    f = pos[:, None] * inv_freq[None]
    return mx.stack([mx.sin(f), mx.cos(f)], axis=-1).reshape(f.shape[0], dim)


def rel_shift(x: mx.array) -> mx.array:
    """(..., Tq, P) -> out[..., i, j] = x[..., i, j + Tq - 1 - i] (Transformer-XL)."""
    *lead, tq, p = x.shape
    x = mx.pad(x, [(0, 0)] * len(lead) + [(0, 0), (1, 0)])
    return x.reshape(*lead, p + 1, tq)[..., 1:, :].reshape(*lead, tq, p)


class RelPosAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, bias: bool):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.scale = self.head_dim**-0.5
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, dim, bias=bias)
        self.v_proj = nn.Linear(dim, dim, bias=bias)
        self.o_proj = nn.Linear(dim, dim, bias=bias)
        self.relative_k_proj = nn.Linear(dim, dim, bias=False)
        self.bias_u = mx.zeros((n_heads, self.head_dim))
        self.bias_v = mx.zeros((n_heads, self.head_dim))

    def project_positions(self, pos: mx.array) -> mx.array:
        """Sinusoid table (P, D) -> (H, P, dh) position keys."""
        return self.relative_k_proj(pos).reshape(-1, self.n_heads, self.head_dim).transpose(1, 0, 2)

    def __call__(self, x: mx.array, p: mx.array, mask: mx.array | None,
                 cache: ContextKVCache | None) -> mx.array:
        """x (B, T, D); p (H, Tk + T - 1, dh) position keys for distances Tk-1 .. -(T-1),
        from `project_positions`; mask (T, Tk) bool."""
        B, T, _ = x.shape
        H, dh = self.n_heads, self.head_dim

        def heads(y):
            return y.reshape(B, -1, H, dh).transpose(0, 2, 1, 3)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        n_keys = k.shape[2]
        bd = (q + self.bias_v[:, None]) @ p.swapaxes(-1, -2)  # (B, H, T, P)
        bd = rel_shift(bd)[..., :n_keys] * self.scale
        if mask is not None:
            bd = mx.where(mask, bd, mx.array(-mx.inf, bd.dtype))
        # content term inside SDPA; the position term rides in as an additive mask
        o = mx.fast.scaled_dot_product_attention(q + self.bias_u[:, None], k, v,
                                                 scale=self.scale, mask=bd)
        return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool):
        super().__init__()
        self.linear1 = nn.Linear(dim, hidden, bias=bias)
        self.linear2 = nn.Linear(hidden, dim, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear2(nn.silu(self.linear1(x)))


class ConvModule(nn.Module):
    """Pointwise -> GLU -> causal depthwise -> LayerNorm -> SiLU -> pointwise."""

    def __init__(self, dim: int, kernel: int, bias: bool, eps: float):
        super().__init__()
        self.kernel = kernel
        self.pointwise_conv1 = nn.Linear(dim, 2 * dim, bias=bias)
        self.depthwise_conv = nn.Conv1d(dim, dim, kernel, groups=dim, bias=bias)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.pointwise_conv2 = nn.Linear(dim, dim, bias=bias)

    def __call__(self, x: mx.array, cache: ConvCache | None) -> mx.array:
        a, b = mx.split(self.pointwise_conv1(x), 2, axis=-1)
        x = a * mx.sigmoid(b)
        pad = self.kernel - 1
        if cache is not None:
            x = cache.update_and_fetch(x, pad)
        else:
            x = mx.pad(x, [(0, 0), (pad, 0), (0, 0)])
        x = nn.silu(self.norm(self.depthwise_conv(x)))
        return self.pointwise_conv2(x)


class ConformerLayer(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        d, eps = c.hidden_size, c.norm_eps
        self.feed_forward1 = FeedForward(d, c.intermediate_size, c.attention_bias)
        self.self_attn = RelPosAttention(d, c.num_attention_heads, c.attention_bias)
        self.conv = ConvModule(d, c.conv_kernel_size, c.convolution_bias, eps)
        self.feed_forward2 = FeedForward(d, c.intermediate_size, c.attention_bias)
        self.norm_feed_forward1 = nn.LayerNorm(d, eps=eps)
        self.norm_self_att = nn.LayerNorm(d, eps=eps)
        self.norm_conv = nn.LayerNorm(d, eps=eps)
        self.norm_feed_forward2 = nn.LayerNorm(d, eps=eps)
        self.norm_out = nn.LayerNorm(d, eps=eps)

    def __call__(self, x, pos_keys, mask, kv: ContextKVCache | None, conv: ConvCache | None):
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        x = x + self.self_attn(self.norm_self_att(x), pos_keys, mask, kv)
        x = x + self.conv(self.norm_conv(x), conv)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


@dataclass
class EncoderState:
    """Everything a stream carries between encoder calls (python ints need no sync)."""

    right_context: int
    subsampling: list[StridedConvCache]
    kv: list[ContextKVCache]
    conv: list[ConvCache]
    pending: mx.array | None = None  # subsampled frames whose block is incomplete
    offset: int = 0  # frames already through the conformer layers
    # per-layer position keys for the last (n_keys, n_queries): constant once the
    # cache is full, so steady-state chunks skip the (left + T) x D x D projection
    pos_shape: tuple[int, int] | None = None
    pos_keys: list[mx.array] | None = None
    # streams stacked on the batch axis: row b's cache holds n_valid[b] real frames (the
    # rest, in front, is masked); None: read kv[0].valid (one stream)
    n_valid: list[int] | None = None

    def arrays(self) -> list[mx.array]:
        out = [a for c in (*self.subsampling, *self.kv, *self.conv) for a in c.state]
        out += self.pos_keys or []
        return out + ([self.pending] if self.pending is not None else [])


def chunked_limited_mask(q_pos: mx.array, k_pos: mx.array, block: int,
                         left_blocks: int) -> mx.array:
    """(Lq, Lk) bool: query block minus key block in [0, left_blocks]."""
    d = (q_pos // block)[:, None] - (k_pos // block)[None, :]
    return (d >= 0) & (d <= left_blocks)


class Encoder(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.config = c
        self.subsampling = Subsampling(c)
        self.layers = [ConformerLayer(c) for _ in range(c.num_hidden_layers)]

    def make_state(self, right_context: int) -> EncoderState:
        c = self.config
        return EncoderState(
            right_context, [StridedConvCache() for _ in range(c.n_subsampling_layers)],
            [ContextKVCache(c.left_context) for _ in range(c.num_hidden_layers)],
            [ConvCache() for _ in range(c.num_hidden_layers)],
        )

    def __call__(self, mel: mx.array | None, right_context: int | None = None,
                 state: EncoderState | None = None, final: bool = False) -> mx.array | None:
        """(B, T, n_mels) mel -> (B, T', hidden) encoder frames, or None for no frame.

        Offline (`state=None`): all frames of the utterance. Streaming: only frames
        whose block is complete; `final=True` flushes the rest exactly as offline. An empty
        or None `mel` is no new input; no zero-size array reaches a kernel.
        """
        c = self.config
        r = state.right_context if state is not None else right_context
        r = c.default_right_context if r is None else r
        block = r + 1
        if mel is not None and mel.shape[1] == 0:
            mel = None
        if mel is None and (state is None or not final):
            return None
        x = self.subsampling(mel, state.subsampling if state is not None else None,
                             final or state is None)
        if x is not None and c.scale_input:
            x = x * math.sqrt(c.hidden_size)
        offset, n_cached = 0, 0
        if state is not None:
            if state.pending is not None:
                x = state.pending if x is None else mx.concatenate([state.pending, x], axis=1)
            have = 0 if x is None else x.shape[1]
            n = have if final else have // block * block
            state.pending = x[:, n:] if n < have else None
            if not n:
                return None
            x = x if n == have else x[:, :n]
            offset, n_cached = state.offset, state.kv[0].size
            n_valid = state.n_valid or [state.kv[0].valid]
            state.offset += n
        if x is None:
            return None
        T = x.shape[1]
        mask = None
        if T > block:  # several blocks in one call: restrict by absolute block index
            q = mx.arange(offset, offset + T)
            mask = chunked_limited_mask(q, mx.arange(offset - n_cached, offset + T), block,
                                        c.left_context // block)
        if state is not None and min(n_valid) < n_cached:  # hide the caches' zero fill
            first = mx.array([n_cached - n for n in n_valid])[:, None, None, None]
            valid = mx.arange(n_cached + T)[None, None, None] >= first  # (B, 1, 1, Tk)
            mask = valid if mask is None else valid & mask
        shape = (n_cached + T, T)
        if state is not None and state.pos_shape == shape:
            pos_keys = state.pos_keys
        else:
            pos = rel_positions(*shape, c.hidden_size).astype(x.dtype)
            pos_keys = [layer.self_attn.project_positions(pos) for layer in self.layers]
            if state is not None:
                state.pos_shape, state.pos_keys = shape, pos_keys
        kv = state.kv if state is not None else [None] * len(self.layers)
        conv = state.conv if state is not None else [None] * len(self.layers)
        for layer, p, k, cv in zip(self.layers, pos_keys, kv, conv, strict=True):
            x = layer(x, p, mask, k, cv)
        return x
