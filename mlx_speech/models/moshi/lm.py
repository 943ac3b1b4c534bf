"""Moshi / PersonaPlex LM: the temporal transformer and the depformer.

Quirks:
- The input of a step is the sum of 1 + n_q embeddings (text + audio streams); token -1 means "no
  input" and embeds to an exact zero vector. The rule is applied outside the embedding modules,
  so it survives `nn.quantize` (which swaps in QuantizedEmbedding).
- Temporal transformer: rms_norm_f32, silu-gated FFN, interleaved RoPE, causal window `context`
  (a ring of `context` keys); `out_norm` then `text_linear`.
- Depformer: per frame, dep_q sub-steps over its own short stream. Sub-step k adds
  `depformer_in[k](z)` to the embedding of the previous token (the text token for k = 0, else
  audio codebook k-1), uses its own attention/FFN weights (norms shared), has no positional
  embedding and attends to the sub-steps of this frame only: `depformer_context` is ignored, as
  in PyTorch (spec §4). `linears[k]` gives the logits of codebook k.
- The gated hidden sizes are taken from the weights (moshi's rule only holds for hidden_scale
  4.125), see `GatedConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ...nn.moshi_transformer import RMSNorm, Transformer, TransformerConfig, TransformerState
from .config import LmConfig


@dataclass
class GatedConfig(TransformerConfig):
    """TransformerConfig whose gated hidden size can be pinned (read from the checkpoint)."""

    hidden: int | None = None

    @property
    def gating_hidden(self) -> int:
        if self.hidden is not None:
            return self.hidden
        return TransformerConfig.gating_hidden.fget(self)


def embed(table: nn.Module, ids: mx.array) -> mx.array:
    """Embedding lookup where id -1 gives an exact zero vector (ids clamped for the lookup)."""
    e = table(mx.maximum(ids, 0))
    return mx.where((ids < 0)[..., None], mx.zeros((), dtype=e.dtype), e)


@dataclass
class LmState:
    """Streaming state of one conversation: the temporal ring KV and the per-frame depformer KV."""

    main: TransformerState
    dep: TransformerState

    def arrays(self) -> list[mx.array]:
        return self.main.arrays() + self.dep.arrays()


def _norm(kind: str, dim: int) -> nn.Module:
    if kind == "rms_norm_f32":
        return RMSNorm(dim, 1e-8, f32=True)
    if kind == "rms_norm":
        return RMSNorm(dim, 1e-5, f32=False)
    return nn.LayerNorm(dim, eps=1e-5)


class LM(nn.Module):
    def __init__(self, config: LmConfig, hidden: int | None = None,
                 depformer_hidden: int | None = None):
        super().__init__()
        c = self.config = config
        self.text_emb = nn.Embedding(c.text_card + 1, c.dim)
        self.emb = [nn.Embedding(c.card + 1, c.dim) for _ in range(c.n_q)]
        self.transformer = Transformer(GatedConfig(
            d_model=c.dim, num_heads=c.num_heads, num_layers=c.num_layers,
            dim_feedforward=c.dim_feedforward, causal=c.causal, context=c.context, norm=c.norm,
            gating=c.gating, layer_scale=c.layer_scale,
            positional_embedding=c.positional_embedding, max_period=c.max_period,
            hidden=hidden))
        self.out_norm = _norm(c.norm, c.dim)
        self.text_linear = nn.Linear(c.dim, c.text_card, bias=False)
        D = c.depformer_dim
        n_in = c.dep_q if c.depformer_multi_linear else 1
        self.depformer_in = [nn.Linear(c.dim, D, bias=False) for _ in range(n_in)]
        self.depformer_text_emb = nn.Embedding(c.text_card + 1, D)
        self.depformer_emb = [nn.Embedding(c.card + 1, D) for _ in range(c.dep_q - 1)]
        self.depformer = Transformer(GatedConfig(
            d_model=D, num_heads=c.depformer_num_heads, num_layers=c.depformer_num_layers,
            dim_feedforward=c.depformer_feedforward, causal=True, context=None, norm=c.norm,
            gating=c.depformer_gating, layer_scale=c.depformer_layer_scale,
            positional_embedding=c.depformer_pos_emb, max_period=c.depformer_max_period,
            weights_per_step=c.dep_q if c.depformer_weights_per_step else 0,
            hidden=depformer_hidden))
        self.linears = [nn.Linear(D, c.card, bias=False) for _ in range(c.dep_q)]

    def make_state(self, batch: int = 1) -> LmState:
        c = self.config
        main_cap = c.context if c.context is not None else 4096
        return LmState(self.transformer.make_state(batch, main_cap),
                       self.depformer.make_state(batch, c.dep_q))

    def embed_tokens(self, tokens: mx.array) -> mx.array:
        """tokens [B, 1 + n_q, T] -> summed input embedding [B, T, dim]."""
        x = None
        for k, table in enumerate(self.emb):
            e = embed(table, tokens[:, 1 + k])
            x = e if x is None else x + e
        t = embed(self.text_emb, tokens[:, 0])
        return t if x is None else x + t

    def forward_embeddings(self, x: mx.array, state: LmState | None = None):
        """x [B, T, dim] -> (z [B, T, dim] after out_norm, text logits [B, T, text_card])."""
        z = self.out_norm(self.transformer(x, None if state is None else state.main))
        return z, self.text_linear(z)

    def forward_tokens(self, tokens: mx.array, state: LmState | None = None):
        return self.forward_embeddings(self.embed_tokens(tokens), state)

    def depformer_logits(self, k: int, prev: mx.array, z: mx.array,
                         dep: TransformerState) -> mx.array:
        """Sub-step k of the current frame: prev [B] (text token for k = 0, else codebook k-1),
        z [B, 1, dim] -> logits [B, card]. `dep` must be reset at the start of each frame."""
        lin = self.depformer_in[k if len(self.depformer_in) > 1 else 0]
        table = self.depformer_text_emb if k == 0 else self.depformer_emb[k - 1]
        x = lin(z[:, -1:]) + embed(table, prev[:, None])
        y = self.depformer(x, dep, step=k)
        return self.linears[k](y)[:, 0]
