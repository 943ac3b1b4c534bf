"""FastConformer layers shared by NeMo-family models (Nemotron ASR, Sortformer diarization).

- Transformer-XL rel-pos attention with untied per-layer bias_u / bias_v and a sinusoidal
  table over relative distances (sin, cos interleaved); the position term rides into SDPA as
  an additive mask.
- Macaron block: half FFN, attention, conv module, half FFN, final LayerNorm.
- Conv module: pointwise -> GLU -> depthwise (causal with a cache, or centred) -> LayerNorm or
  (inference) BatchNorm -> SiLU -> pointwise. Frames outside `valid` are zeroed before the
  depthwise conv, as NeMo does with its pad mask, so right padding never leaks into real frames.

Module names are the transformers ones; NeMo's checkpoint names map onto them with
`mlx_speech/models/nemo/checkpoint.py`'s CONFORMER_RENAMES.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .conv import ConvCache


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

    def __call__(self, x: mx.array, p: mx.array, mask: mx.array | None, cache=None) -> mx.array:
        """x (B, T, D); p (H, Tk + T - 1, dh) position keys for distances Tk-1 .. -(T-1),
        from `project_positions`; mask bool, broadcast to (B, H, T, Tk); `cache` (optional)
        has `update_and_fetch(k, v)` and returns the keys/values to attend to."""
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


class ConformerFeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool):
        super().__init__()
        self.linear1 = nn.Linear(dim, hidden, bias=bias)
        self.linear2 = nn.Linear(hidden, dim, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear2(nn.silu(self.linear1(x)))


class FrozenBatchNorm(nn.Module):
    """Inference BatchNorm over the last axis (running statistics, no training mode)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = mx.ones((dim,))
        self.bias = mx.zeros((dim,))
        self.running_mean = mx.zeros((dim,))
        self.running_var = mx.ones((dim,))

    def __call__(self, x: mx.array) -> mx.array:
        scale = self.weight * mx.rsqrt(self.running_var + self.eps)
        return (x - self.running_mean) * scale + self.bias


class ConvModule(nn.Module):
    """Pointwise -> GLU -> depthwise -> norm -> SiLU -> pointwise.

    `causal`: the depthwise conv sees k-1 past frames (from `cache` when streaming);
    otherwise it is centred with (k-1)/2 zero frames each side."""

    def __init__(self, dim: int, kernel: int, bias: bool, eps: float, norm: str = "layer_norm",
                 causal: bool = True):
        super().__init__()
        self.kernel, self.causal = kernel, causal
        self.pointwise_conv1 = nn.Linear(dim, 2 * dim, bias=bias)
        self.depthwise_conv = nn.Conv1d(dim, dim, kernel, groups=dim, bias=bias)
        self.norm = (nn.LayerNorm(dim, eps=eps) if norm == "layer_norm"
                     else FrozenBatchNorm(dim, eps))
        self.pointwise_conv2 = nn.Linear(dim, dim, bias=bias)

    def __call__(self, x: mx.array, cache: ConvCache | None = None,
                 valid: mx.array | None = None) -> mx.array:
        """x (B, T, D); `valid` (B, T) bool marks real frames (None: all)."""
        a, b = mx.split(self.pointwise_conv1(x), 2, axis=-1)
        x = a * mx.sigmoid(b)
        if valid is not None:
            x = mx.where(valid[..., None], x, mx.array(0, x.dtype))
        pad = self.kernel - 1
        if cache is not None:
            x = cache.update_and_fetch(x, pad)
        elif self.causal:
            x = mx.pad(x, [(0, 0), (pad, 0), (0, 0)])
        else:
            x = mx.pad(x, [(0, 0), (pad // 2, pad - pad // 2), (0, 0)])
        x = nn.silu(self.norm(self.depthwise_conv(x)))
        return self.pointwise_conv2(x)


class ConformerLayer(nn.Module):
    def __init__(self, dim: int, n_heads: int, ff_hidden: int, conv_kernel: int, bias: bool,
                 conv_bias: bool, eps: float = 1e-5, conv_norm: str = "layer_norm",
                 causal_conv: bool = True):
        super().__init__()
        self.feed_forward1 = ConformerFeedForward(dim, ff_hidden, bias)
        self.self_attn = RelPosAttention(dim, n_heads, bias)
        self.conv = ConvModule(dim, conv_kernel, conv_bias, eps, conv_norm, causal_conv)
        self.feed_forward2 = ConformerFeedForward(dim, ff_hidden, bias)
        self.norm_feed_forward1 = nn.LayerNorm(dim, eps=eps)
        self.norm_self_att = nn.LayerNorm(dim, eps=eps)
        self.norm_conv = nn.LayerNorm(dim, eps=eps)
        self.norm_feed_forward2 = nn.LayerNorm(dim, eps=eps)
        self.norm_out = nn.LayerNorm(dim, eps=eps)

    def __call__(self, x, pos_keys, mask, kv=None, conv: ConvCache | None = None,
                 valid: mx.array | None = None):
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        x = x + self.self_attn(self.norm_self_att(x), pos_keys, mask, kv)
        x = x + self.conv(self.norm_conv(x), conv, valid)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)
