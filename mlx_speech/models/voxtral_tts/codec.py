"""Voxtral TTS codec decoder: 37 codes per 80 ms frame -> 1920 samples at 24 kHz.

Quirks:
- Latent = semantic codebook row (embedding_sum / clamp(cluster_usage), in fp32)
  ++ FSQ levels mapped to [-1, 1]: 292 channels per frame.
- Causal convs: the first pads by replicating the first frame, output_proj by
  reflection; ConvTranspose x2 keeps the first T*2 outputs (causal).
- Transformer layers: ALiBi + sliding window (W+1 keys, i-W..i), QK-norm over
  the whole projection, RMSNorm eps 0.01, layer scales. Attention is computed
  in blocks of queries against block + W previous keys, so memory is linear in
  length. Weight norm is folded at load; conv weights are in MLX layout.
- Streaming: `CodecState` keeps each conv's input tail, each ConvT's last input
  frame and each layer's last W keys/values, so chunks decode exactly as one
  offline pass at constant cost per chunk. (The receptive field is ~20.5 frames:
  re-decoding >= 21 context frames would also be exact.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from ...nn import FeedForward, conv_transpose
from .config import N_SPECIAL, CodecConfig

_BLOCK = 64  # query block length of the local attention


class Tail:
    """The last frames of a layer's input stream (None before the first chunk)."""

    def __init__(self):
        self.x: mx.array | None = None

    def update_and_fetch(self, x: mx.array, keep: int, start) -> mx.array:
        """Prepend the stored tail (or `start(x)` at stream start); keep the last `keep`."""
        x = start(x) if self.x is None else mx.concatenate([self.x, x], axis=1)
        self.x = x[:, x.shape[1] - keep :] if keep else None
        return x


class KVTail:
    def __init__(self):
        self.k: mx.array | None = None
        self.v: mx.array | None = None


@dataclass
class CodecState:
    """Streaming state of the decoder; `Codec.make_state()` builds it."""

    convs: list[Tail] = field(default_factory=list)  # conv / ConvT per stage
    kv: list[list[KVTail]] = field(default_factory=list)  # per stage, per layer
    out: Tail = field(default_factory=Tail)

    def arrays(self) -> list[mx.array]:
        t = [c.x for c in (*self.convs, self.out)]
        t += [a for st in self.kv for c in st for a in (c.k, c.v)]
        return [a for a in t if a is not None]


def _pad_reflect(x: mx.array, left: int) -> mx.array:
    """Reflect-pad (B, T, C) on the left; short inputs are zero-extended first (VO)."""
    L = x.shape[1]
    extra = max(0, left - L + 1)
    if extra:
        x = mx.pad(x, [(0, 0), (0, extra), (0, 0)])
    x = mx.concatenate([x[:, 1 : left + 1][:, ::-1], x], axis=1)
    return x[:, : x.shape[1] - extra] if extra else x


class CausalConv(nn.Module):
    """Conv1d (stride 1) with left padding kernel - 1 (replicate or reflect), weight (O, K, I)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, pad_mode: str):
        super().__init__()
        self.weight = mx.zeros((c_out, kernel, c_in))
        self.kernel, self.pad_mode = kernel, pad_mode

    def _start(self, x: mx.array) -> mx.array:
        pad = self.kernel - 1
        if self.pad_mode == "reflect":
            return _pad_reflect(x, pad)
        return mx.pad(x, [(0, 0), (pad, 0), (0, 0)], mode="edge")

    def __call__(self, x: mx.array, cache: Tail | None = None) -> mx.array:
        pad = self.kernel - 1
        x = self._start(x) if cache is None else cache.update_and_fetch(x, pad, self._start)
        return mx.conv1d(x, self.weight)


class CausalConvTranspose(nn.Module):
    """ConvTranspose1d keeping the first T * stride outputs; weight (O, K, I)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int):
        super().__init__()
        self.weight = mx.zeros((c_out, kernel, c_in))
        self.stride = stride
        self.n_prev = -(-kernel // stride) - 1  # earlier input frames an output step sees

    def __call__(self, x: mx.array, cache: Tail | None = None) -> mx.array:
        T, s, p = x.shape[1], self.stride, self.n_prev
        if cache is not None and p:  # zeros before the stream start add nothing
            x = cache.update_and_fetch(
                x, p, lambda x: mx.pad(x, [(0, 0), (p, 0), (0, 0)]))
        else:
            p = 0
        y = conv_transpose(x, self.weight, s)
        return y[:, p * s : (p + T) * s]


class ConvBlock(nn.Module):
    def __init__(self, conv: nn.Module):
        super().__init__()
        self.conv = conv

    def __call__(self, x: mx.array, cache: Tail | None = None) -> mx.array:
        return self.conv(x, cache)


def local_alibi_attention(q: mx.array, k: mx.array, v: mx.array, slopes: mx.array,
                          window: int, scale: float) -> mx.array:
    """(B, H, T, D) causal attention over keys i-window..i plus ALiBi slope_h (j - i)."""
    B, H, T, D = q.shape
    W = window
    n = max(W, min(_BLOCK, T))
    nb = -(-T // n)
    tail = nb * n - T

    def q_blocks(x):
        x = mx.pad(x, [(0, 0), (0, 0), (0, tail), (0, 0)]).reshape(B, H, nb, n, -1)
        return x.transpose(0, 2, 1, 3, 4).reshape(B * nb, H, n, -1)

    def kv_blocks(x):
        x = mx.pad(x, [(0, 0), (0, 0), (W, tail), (0, 0)])  # W + nb * n rows
        prev = x[:, :, : nb * n].reshape(B, H, nb, n, -1)[:, :, :, :W]
        main = x[:, :, W:].reshape(B, H, nb, n, -1)
        x = mx.concatenate([prev, main], axis=3)
        return x.transpose(0, 2, 1, 3, 4).reshape(B * nb, H, n + W, -1)

    rel = mx.arange(n + W)[None, :] - W - mx.arange(n)[:, None]  # key - query
    ok = (rel <= 0) & (rel >= -W)
    key_pos = (mx.arange(nb) * n)[:, None] - W + mx.arange(n + W)[None, :]
    ok = ok[None] & (key_pos >= 0)[:, None, :]  # (nb, n, n + W)
    bias = slopes[:, None, None] * rel.astype(mx.float32)  # (H, n, n + W)
    mask = mx.where(ok[:, None], bias[None], -1e9).astype(q.dtype)
    if B > 1:
        mask = mx.tile(mask, (B, 1, 1, 1))
    o = mx.fast.scaled_dot_product_attention(q_blocks(q), kv_blocks(k), kv_blocks(v),
                                             scale=scale, mask=mask)
    o = o.reshape(B, nb, H, n, D).transpose(0, 2, 1, 3, 4).reshape(B, H, nb * n, D)
    return o[:, :, :T]


class CodecAttention(nn.Module):
    def __init__(self, c: CodecConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)
        self.q_norm = nn.RMSNorm(c.n_heads * c.head_dim, eps=c.qk_norm_eps)
        self.k_norm = nn.RMSNorm(c.n_kv_heads * c.head_dim, eps=c.qk_norm_eps)

    def __call__(self, x: mx.array, slopes: mx.array, window: int,
                 cache: KVTail | None = None) -> mx.array:
        B, T, _ = x.shape
        q = self.q_norm(self.wq(x)).reshape(B, T, self.n_heads, -1).transpose(0, 2, 1, 3)
        k = self.k_norm(self.wk(x)).reshape(B, T, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = self.wv(x).reshape(B, T, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        P = 0
        if cache is not None:
            if cache.k is not None:  # earlier keys: run dummy queries there, drop them
                P = cache.k.shape[2]
                k = mx.concatenate([cache.k, k], axis=2)
                v = mx.concatenate([cache.v, v], axis=2)
                q = mx.pad(q, [(0, 0), (0, 0), (P, 0), (0, 0)])
            n = k.shape[2]
            cache.k, cache.v = k[:, :, max(0, n - window) :], v[:, :, max(0, n - window) :]
        o = local_alibi_attention(q, k, v, slopes, window, self.head_dim**-0.5)[:, :, P:]
        return self.wo(o.transpose(0, 2, 1, 3).reshape(B, T, -1))


class CodecLayer(nn.Module):
    def __init__(self, c: CodecConfig):
        super().__init__()
        self.attention_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.attention = CodecAttention(c)
        self.attention_scale = mx.ones((c.dim,))
        self.ffn_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.feed_forward = FeedForward(c.dim, c.hidden_dim)
        self.ffn_scale = mx.ones((c.dim,))

    def __call__(self, x: mx.array, slopes: mx.array, window: int,
                 cache: KVTail | None = None) -> mx.array:
        a = self.attention(self.attention_norm(x), slopes, window, cache)
        x = x + self.attention_scale * a
        return x + self.ffn_scale * self.feed_forward(self.ffn_norm(x))


class CodecStage(nn.Module):
    def __init__(self, c: CodecConfig, n_layers: int):
        super().__init__()
        self.layers = [CodecLayer(c) for _ in range(n_layers)]

    def __call__(self, x: mx.array, slopes: mx.array, window: int,
                 cache: list[KVTail] | None = None) -> mx.array:
        for i, layer in enumerate(self.layers):
            x = layer(x, slopes, window, None if cache is None else cache[i])
        return x


class SemanticCodebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.embedding_sum = mx.zeros((size, dim))
        self.cluster_usage = mx.ones((size,))


class Quantizer(nn.Module):
    def __init__(self, c: CodecConfig):
        super().__init__()
        self.semantic_codebook = SemanticCodebook(c.semantic_codebook_size, c.semantic_dim)
        self.levels = c.acoustic_codebook_size
        self.eps = c.codebook_eps

    def __call__(self, codes: mx.array) -> mx.array:
        """(B, T, 1 + n_acoustic) codes (+2 offset) -> (B, T, latent_dim) fp32."""
        sem = codes[..., 0] - N_SPECIAL
        cb = self.semantic_codebook
        usage = mx.maximum(cb.cluster_usage[sem].astype(mx.float32), self.eps)
        s = cb.embedding_sum[sem].astype(mx.float32) / usage[..., None]
        a = (codes[..., 1:] - N_SPECIAL).astype(mx.float32)
        a = 2.0 * a / (self.levels - 1) - 1.0
        return mx.concatenate([s, a], axis=-1)


class Codec(nn.Module):
    """Attribute names follow `audio_tokenizer.*` in the checkpoint."""

    def __init__(self, c: CodecConfig):
        super().__init__()
        self.config = c
        self.quantizer = Quantizer(c)
        blocks: list[nn.Module] = []
        for i, (n, k, s) in enumerate(zip(c.lengths, c.kernels, c.strides, strict=True)):
            c_in = c.latent_dim if i == 0 else c.dim
            conv = (CausalConvTranspose(c_in, c.dim, k, s) if s > 1
                    else CausalConv(c_in, c.dim, k, "replicate"))
            blocks += [ConvBlock(conv), CodecStage(c, n)]
        self.decoder_blocks = blocks
        self.output_proj = ConvBlock(CausalConv(c.dim, c.pretransform_patch_size,
                                                c.patch_proj_kernel_size, "reflect"))
        self._slopes = c.alibi_slopes  # python floats; not a parameter

    def make_state(self) -> CodecState:
        c = self.config
        return CodecState([Tail() for _ in c.strides],
                          [[KVTail() for _ in range(n)] for n in c.lengths])

    def __call__(self, codes: mx.array, state: CodecState | None = None) -> mx.array:
        """(B, T, n_codebooks) int codes -> (B, T * frame_samples) waveform.

        `state=None` decodes a whole utterance; with a state, successive chunks
        continue the same stream (same samples as one offline call).
        """
        c = self.config
        dtype = self.output_proj.conv.weight.dtype
        x = self.quantizer(codes).astype(dtype)
        slopes = mx.array(self._slopes, dtype=mx.float32)
        for i, window in enumerate(c.windows):
            st = (None, None) if state is None else (state.convs[i], state.kv[i])
            x = self.decoder_blocks[2 * i](x, st[0])
            x = self.decoder_blocks[2 * i + 1](x, slopes, window, st[1])
        x = self.output_proj(x, None if state is None else state.out)
        return x.reshape(x.shape[0], -1)
