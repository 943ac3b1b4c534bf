"""Kyutai's streaming transformer (moshi 0.2.13 `StreamingTransformer`), shared by Mimi and Moshi.

Quirks worth knowing before reading the code:
- Pre-norm layers: h = x + ls1 * Attn(norm1(x)); y = h + ls2 * FFN(norm2(h)); no biases in any
  Linear. FFN is linear2(gelu_erf(linear1 x)) or, gated, linear_out(silu(gate) * up) where the
  gate is the first half of linear_in's outputs.
- Attention projection rows are Q, K, V with heads contiguous; interleaved RoPE (pairs 2i, 2i+1)
  on absolute stream positions; scale 1/sqrt(head_dim).
- Window: the key at p_k is visible from p_q iff 0 <= p_q - p_k < context.
- Streaming keeps PyTorch's ring of `capacity` (= context) slots and writes a call's keys *before*
  attending, so with T > 1 positions per call the first queries lose the keys that later ones
  overwrote (spec 8.6). Offline (state=None) sees the full window.
- weights_per_step (depformer): step k has its own attention projections and gated FFN; the norms
  are shared. With context=None the ring holds `weights_per_step` slots and never windows.
- rms_norm_f32: eps 1e-8, statistics in float32, weight `alpha` of shape (1, 1, d).

Parameter names are moshi 0.2.13's module names: `layers.{i}.self_attn.in_projs.{k}.weight`,
`...out_projs.{k}.weight` (k = 0 without weights_per_step), `norm1.weight/.bias` or `norm1.alpha`,
`linear1/linear2.weight` or `gating[.{k}].linear_in/linear_out.weight`, `layer_scale_{1,2}.scale`.
Released checkpoints fuse the per-step projections (`in_proj_weight`, `out_proj.weight`):
`remap_checkpoint` splits them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .cache import SlidingKVCache

_NORMS = ("layer_norm", "rms_norm", "rms_norm_f32")
_UNBOUNDED = 2**31 - 1


@dataclass
class TransformerConfig:
    d_model: int
    num_heads: int
    num_layers: int
    dim_feedforward: int
    causal: bool = True
    context: int | None = None
    norm: str = "layer_norm"
    gating: str = "none"
    layer_scale: float | None = None
    positional_embedding: str = "rope"
    max_period: float = 10000.0
    weights_per_step: int = 0

    def __post_init__(self):
        if self.norm not in _NORMS:
            raise ValueError(f"norm {self.norm!r} not in {_NORMS}")
        if self.gating not in ("none", "silu"):
            raise ValueError(f"gating {self.gating!r} not in ('none', 'silu')")
        if self.positional_embedding not in ("rope", "none"):
            raise ValueError(f"positional_embedding {self.positional_embedding!r} not supported")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} not divisible by {self.num_heads} heads")
        if self.weights_per_step and self.gating == "none":
            raise ValueError("weights_per_step needs a gated FFN (as in moshi)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def num_weight_sets(self) -> int:
        return max(1, self.weights_per_step)

    @property
    def gating_hidden(self) -> int:
        # moshi's ActivationGating rule; 4.125 * d (the 7B LM) gives 2/3 of it.
        if self.dim_feedforward == 4 * self.d_model:
            return 21 * self.d_model // 8
        return 2 * self.dim_feedforward // 3


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, f32: bool):
        super().__init__()
        self.alpha = mx.ones((1, 1, dim))
        self.eps, self.f32 = eps, f32

    def __call__(self, x: mx.array) -> mx.array:
        w = self.alpha.reshape(-1)
        if self.f32:
            y = mx.fast.rms_norm(x.astype(mx.float32), w.astype(mx.float32), self.eps)
            return y.astype(x.dtype)
        return mx.fast.rms_norm(x, w, self.eps)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = mx.full((dim,), init)

    def __call__(self, x: mx.array) -> mx.array:
        return x * self.scale


class Gating(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        gate, up = mx.split(self.linear_in(x), 2, axis=-1)
        return self.linear_out(nn.silu(gate) * up)


def _make_norm(cfg: TransformerConfig) -> nn.Module:
    if cfg.norm == "layer_norm":
        return nn.LayerNorm(cfg.d_model, eps=1e-5)
    if cfg.norm == "rms_norm":
        return RMSNorm(cfg.d_model, 1e-5, f32=False)
    return RMSNorm(cfg.d_model, 1e-8, f32=True)


def _per_step(mods: list, x: mx.array, step: int) -> mx.array:
    """Position t of x goes through mods[step + t] (moshi's apply_weights_per_step)."""
    if len(mods) == 1:
        return mods[0](x)
    T = x.shape[1]
    if step < 0 or step + T > len(mods):
        raise ValueError(f"steps {step}..{step + T - 1} outside the {len(mods)} per-step weights")
    if T == 1:
        return mods[step](x)
    return mx.concatenate([mods[step + t](x[:, t : t + 1]) for t in range(T)], axis=1)


class RingKVCache(SlidingKVCache):
    """PyTorch moshi's RingKVCache: `capacity` slots, a call's keys written before attending.

    Slot s holds the newest position p with p % capacity == s; the mask then keeps keys with
    0 <= p_q - p_k < window. A chunk may be as long as the ring itself.
    """

    def __init__(self, capacity: int, window: int):
        super().__init__(window, max_chunk=capacity)
        self.capacity = capacity


class TransformerState:
    """Streaming state of one Transformer: a ring KV cache per layer and the stream position."""

    def __init__(self, num_layers: int, batch: int, capacity: int, window: int):
        self.batch, self.capacity, self.window = batch, capacity, window
        self.layers = [RingKVCache(capacity, window) for _ in range(num_layers)]
        self.offset = 0

    def reset(self) -> None:
        """Back to position 0; the ring buffers are kept and their old slots masked out."""
        self.offset = 0
        for c in self.layers:
            c.offset = 0

    def mask(self, length: int) -> mx.array | str | None:
        """Boolean (length, attended slots) mask for the next `length` queries; None if all
        visible, "causal" if the window does not bind yet (the forms the fused GPU kernels
        take). The slots are the ring's (`SlidingKVCache.attended`: every allocated one with
        fixed shapes, so a stream reuses a few shapes)."""
        end = self.offset + length
        n = self.layers[0].attended(end)
        if length == 1 and min(end, self.capacity) >= n and n <= self.window:
            return None
        if end == n <= min(self.capacity, self.window):
            return "causal"
        q = mx.arange(self.offset, end)
        d = q[:, None] - self.layers[0].slot_positions(end)[None, :]
        return (d >= 0) & (d < self.window)

    def arrays(self) -> list[mx.array]:
        return [a for c in self.layers for a in c.state]


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d = cfg.d_model
        self.in_projs = [nn.Linear(d, 3 * d, bias=False) for _ in range(cfg.num_weight_sets)]
        self.out_projs = [nn.Linear(d, d, bias=False) for _ in range(cfg.num_weight_sets)]
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.rope = cfg.positional_embedding == "rope"
        self.max_period = cfg.max_period

    def __call__(self, x: mx.array, cache: RingKVCache | None, mask: mx.array | None,
                 offset: int, step: int) -> mx.array:
        B, T, D = x.shape
        qkv = _per_step(self.in_projs, x, step).reshape(B, T, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.transpose(2, 0, 3, 1, 4)  # each (B, H, T, head_dim)
        if self.rope:
            rope = dict(traditional=True, base=self.max_period, scale=1.0, offset=offset)
            q = mx.fast.rope(q, self.head_dim, **rope)
            k = mx.fast.rope(k, self.head_dim, **rope)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5, mask=mask)
        return _per_step(self.out_projs, o.transpose(0, 2, 1, 3).reshape(B, T, D), step)


class TransformerLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.norm1 = _make_norm(cfg)
        self.norm2 = _make_norm(cfg)
        if cfg.gating == "none":
            self.linear1 = nn.Linear(cfg.d_model, cfg.dim_feedforward, bias=False)
            self.linear2 = nn.Linear(cfg.dim_feedforward, cfg.d_model, bias=False)
        elif cfg.weights_per_step:
            self.gating = [Gating(cfg.d_model, cfg.gating_hidden)
                           for _ in range(cfg.num_weight_sets)]
        else:
            self.gating = Gating(cfg.d_model, cfg.gating_hidden)
        if cfg.layer_scale is not None:
            self.layer_scale_1 = LayerScale(cfg.d_model, cfg.layer_scale)
            self.layer_scale_2 = LayerScale(cfg.d_model, cfg.layer_scale)
        self.scaled = cfg.layer_scale is not None
        self.gated = cfg.gating != "none"

    def __call__(self, x: mx.array, cache: RingKVCache | None, mask: mx.array | None,
                 offset: int, step: int) -> mx.array:
        h = self.self_attn(self.norm1(x), cache, mask, offset, step)
        x = x + (self.layer_scale_1(h) if self.scaled else h)
        y = self.norm2(x)
        if not self.gated:
            y = self.linear2(nn.gelu(self.linear1(y)))
        elif isinstance(self.gating, list):
            y = _per_step(self.gating, y, step)
        else:
            y = self.gating(y)
        return x + (self.layer_scale_2(y) if self.scaled else y)


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = [TransformerLayer(cfg) for _ in range(cfg.num_layers)]

    def make_state(self, batch: int = 1, capacity: int | None = None) -> TransformerState:
        """Ring KV state; capacity defaults to `context` (or `weights_per_step` without one)."""
        cfg = self.cfg
        if capacity is None:
            capacity = cfg.context if cfg.context is not None else cfg.weights_per_step
            if not capacity:
                raise ValueError("a transformer without context needs an explicit capacity")
        window = cfg.context if cfg.context is not None else _UNBOUNDED
        return TransformerState(cfg.num_layers, batch, capacity, window)

    def __call__(self, x: mx.array, state: TransformerState | None = None, *,
                 step: int | None = None) -> mx.array:
        """x (B, T, d_model). state=None: offline over positions 0..T-1; with a state the T
        positions continue the stream. `step` picks per-step weights (default: stream position)."""
        cfg = self.cfg
        T = x.shape[1]
        if state is None:
            offset, caches = 0, [None] * len(self.layers)
            mask = None
            if cfg.causal and T > 1:
                p = mx.arange(T)
                d = p[:, None] - p[None, :]
                window = cfg.context if cfg.context is not None else _UNBOUNDED
                mask = (d >= 0) & (d < window)
        else:
            if not cfg.causal:
                raise ValueError("streaming needs a causal transformer")
            if x.shape[0] != state.batch:
                raise ValueError(f"batch {x.shape[0]} but the state was made for {state.batch}")
            offset, caches = state.offset, state.layers
            mask = state.mask(T)
        if step is None:
            step = offset if cfg.weights_per_step else 0
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, cache, mask, offset, step)
        if state is not None:
            state.offset += T
        return x


_FUSED = re.compile(
    r"^(layers\.\d+\.self_attn)\.(in_proj_weight|(in_proj|out_proj)\.(weight|scales|biases))$"
)


def remap_checkpoint(weights: Mapping[str, mx.array], cfg: TransformerConfig,
                     prefix: str = "") -> dict[str, mx.array]:
    """Kyutai names under `prefix` -> this module's names (prefix dropped).

    Fused `self_attn.in_proj_weight` / `in_proj.weight` / `out_proj.weight` are split row-wise into
    `num_weight_sets` chunks (step k = rows k*n...(k+1)*n); everything else keeps its name, so an
    unknown key still fails at `load_weights(strict=True)`.
    """
    out: dict[str, mx.array] = {}
    n = cfg.num_weight_sets
    for key, w in weights.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        m = _FUSED.match(name)
        if m is None:
            out[name] = w
            continue
        kind = "out_projs" if m.group(3) == "out_proj" else "in_projs"
        leaf = m.group(4) or "weight"  # quantized: .scales / .biases split like the rows
        if w.shape[0] % n:
            raise ValueError(f"{key} has {w.shape[0]} rows, not a multiple of {n} steps")
        for k, part in enumerate(mx.split(w, n, axis=0)):
            out[f"{m.group(1)}.{kind}.{k}.{leaf}"] = part
    return out
