"""Mistral-style pre-norm transformer pieces (names follow Mistral checkpoints).

Attention (`wq/wk/wv/wo`, GQA, optional interleaved RoPE), SwiGLU FeedForward
(`w1/w2/w3`) and Block (`attention_norm`, `ffn_norm`). `rope_theta=None` gives
attention without positions (e.g. a bidirectional head over a few tokens).
Caches are passed in; they need `update_and_fetch(k, v)` and `rope_offset`.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .cache import fixed_shapes

# transformers' names of a Mistral block's parameters -> `Block`'s (Mistral's own): the rules a
# checkpoint's key goes through (re.sub, in order) when it comes in transformers' layout
HF_BLOCK_NAMES = [
    (r"\.self_attn\.q_proj\.", ".attention.wq."),
    (r"\.self_attn\.k_proj\.", ".attention.wk."),
    (r"\.self_attn\.v_proj\.", ".attention.wv."),
    (r"\.self_attn\.o_proj\.", ".attention.wo."),
    (r"\.input_layernorm\.", ".attention_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
    (r"\.mlp\.gate_proj\.", ".feed_forward.w1."),
    (r"\.mlp\.up_proj\.", ".feed_forward.w3."),
    (r"\.mlp\.down_proj\.", ".feed_forward.w2."),
]


class KVCache:
    """Keys/values of every position so far, grown in power-of-two steps (no window).

    With `fixed_shapes()` (GPU backends) attention sees every allocated slot, the ones not
    written yet masked (`make_mask`), so a long generation reuses a few shapes."""

    def __init__(self, step: int = 256):
        self.step = step
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    @property
    def rope_offset(self) -> int:
        return self.offset

    def attended(self, end: int) -> int:
        if not fixed_shapes():
            return end
        n = max(self.step, 1 << (end - 1).bit_length())
        return n if self.keys is None else max(n, self.keys.shape[2])

    def make_mask(self, length: int) -> mx.array | str | None:
        """Mask for `length` new queries (causal) against the slots attention sees."""
        end = self.offset + length
        n = self.attended(end)
        if n == end and (length == 1 or self.offset == 0):
            return None if length == 1 else "causal"
        return mx.arange(self.offset, end)[:, None] >= mx.arange(n)[None]

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Append (B, H, L, D) keys/values; return the slots attention sees."""
        L = k.shape[2]
        end = self.offset + L
        if self.keys is None or end > self.keys.shape[2]:
            n = max(self.step, 1 << (end - 1).bit_length())
            B, H, _, D = k.shape
            new_k = mx.zeros((B, H, n, D), k.dtype)
            new_v = mx.zeros((B, H, n, v.shape[-1]), v.dtype)
            if self.keys is not None:
                new_k[:, :, : self.offset] = self.keys[:, :, : self.offset]
                new_v[:, :, : self.offset] = self.values[:, :, : self.offset]
            self.keys, self.values = new_k, new_v
        self.keys[:, :, self.offset : end] = k
        self.values[:, :, self.offset : end] = v
        self.offset = end
        n = self.attended(end)
        if n == self.keys.shape[2]:
            return self.keys, self.values
        return self.keys[:, :, :n], self.values[:, :, :n]

    @property
    def state(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values) if a is not None]


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int,
                 rope_theta: float | None, bias: bool = False):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.rope_theta = rope_theta
        self.scale = head_dim**-0.5
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=bias)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=bias)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=bias)

    def rope(self, x: mx.array, offset: int) -> mx.array:
        return mx.fast.rope(x, self.head_dim, traditional=True, base=self.rope_theta,
                            scale=1.0, offset=offset)

    def __call__(self, x: mx.array, mask=None, cache=None,
                 shape: tuple[int, int] | None = None) -> mx.array:
        """x (B, L, dim) -> (B, L, dim); or rows (B * L, dim) with `shape` (B, L) -> rows."""
        B, L = x.shape[:2] if shape is None else shape
        q, k, v = (heads(w(x), B, L, n) for w, n in (
            (self.wq, self.n_heads), (self.wk, self.n_kv_heads), (self.wv, self.n_kv_heads)))
        if self.rope_theta is not None:
            offset = 0 if cache is None else cache.rope_offset
            q, k = self.rope(q, offset), self.rope(k, offset)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        if L > 1:
            o = o.transpose(0, 2, 1, 3)
        return self.wo(o.reshape(*x.shape[:-1], -1))


def heads(y: mx.array, B: int, L: int, n: int) -> mx.array:
    """A projection (..., n * head_dim) of B x L positions -> (B, n, L, head_dim). One position
    is one reshape (the same memory order): one graph node fewer than reshape + transpose."""
    if L == 1:
        return y.reshape(B, n, 1, -1)
    return y.reshape(B, L, n, -1).transpose(0, 2, 1, 3)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool = False):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.w2(nn.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm block; `ffn_scale` (optional) multiplies the normed FFN input."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, hidden: int,
                 rope_theta: float | None, eps: float, bias: bool = False):
        super().__init__()
        self.attention = Attention(dim, n_heads, n_kv_heads, head_dim, rope_theta, bias)
        self.attention_norm = nn.RMSNorm(dim, eps=eps)
        self.feed_forward = FeedForward(dim, hidden, bias)
        self.ffn_norm = nn.RMSNorm(dim, eps=eps)

    def __call__(self, x: mx.array, mask=None, cache=None,
                 ffn_scale: mx.array | None = None,
                 shape: tuple[int, int] | None = None) -> mx.array:
        """x (B, L, dim) -> (B, L, dim); or rows (B * L, dim) with `shape` (B, L) -> rows (a
        stack of layers reshapes once, not per layer). With dense weights a (B, L, dim) input
        runs as rows too: a dense matmul of 3-D input adds a flatten and an unflatten node per
        call (14 a layer), and every node costs host time, compiled steps included. Quantized
        matmuls take (B, L, dim) as it is. The numbers are the same either way."""
        rows = shape is None and not isinstance(self.attention.wq, nn.QuantizedLinear)
        if rows:
            B, L, D = x.shape
            shape, x = (B, L), x.reshape(B * L, D)
        if ffn_scale is not None and shape is not None:
            ffn_scale = _rows(ffn_scale, *shape, x.shape[-1])
        h = x + self.attention(self.attention_norm(x), mask, cache, shape)
        f = self.ffn_norm(h)
        if ffn_scale is not None:
            f = f * ffn_scale
        out = h + self.feed_forward(f)
        return out.reshape(*shape, -1) if rows else out


def _rows(scale: mx.array, B: int, L: int, D: int) -> mx.array:
    """A scale broadcastable to (B, L, D) as one broadcastable to (B * L, D) rows (2-D scales
    are taken as rows already: (1, D) or (B * L, D))."""
    if scale.ndim == 2:
        return scale
    if scale.size == D:
        return scale.reshape(1, D)
    if L == 1:
        return scale.reshape(B, D)
    return mx.broadcast_to(scale, (B, L, D)).reshape(B * L, D)
