"""Moshi / PersonaPlex LM: the temporal transformer, the depformer and their checkpoint names.

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
- Checkpoint names (strict, torch-free; `remap`): released files (spec §5.1, §5.2) use the module
  names of `moshi.models.lm.LMModel` with the attention projections fused over depformer steps
  (`self_attn.in_proj_weight`, `self_attn.out_proj.weight`), which `remap_checkpoint` splits;
  every other key keeps its name. Any key left over, or any parameter not covered, is a
  CheckpointError naming it. moshi_mlx's and the community PersonaPlex MLX names are renamed to
  those first (`from_moshi_mlx`, `personaplex_mlx_weights`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ...errors import CheckpointError
from ...nn import (
    RMSNorm,
    Transformer,
    TransformerConfig,
    TransformerState,
    param_name,
    remap_checkpoint,
)
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


_GATING_IN = re.compile(r"^(transformer|depformer)\.layers\.0\.gating(\.0)?\.linear_in\.weight$")


def depformer_steps(keys) -> int:
    """dep_q as the weights say it: the number of `depformer_in.{k}` / `linears.{k}` heads."""
    n = [int(m.group(1)) for k in keys if (m := re.match(r"^linears\.(\d+)\.weight$", k))]
    return max(n) + 1 if n else 0


def gated_hidden(weights: dict[str, mx.array]) -> tuple[int | None, int | None]:
    """Gated FFN hidden sizes (temporal, depformer) from linear_in's row count (2 * hidden)."""
    out = {"transformer": None, "depformer": None}
    for k, w in weights.items():
        m = _GATING_IN.match(k)
        if m:
            out[m.group(1)] = int(w.shape[0]) // 2
    return out["transformer"], out["depformer"]


def remap(weights: dict[str, mx.array], model) -> dict[str, mx.array]:
    """Checkpoint tensors -> `model`'s parameter names; raises on unmapped or missing keys."""
    expected = {k: v.shape for k, v in tree_flatten(model.parameters())}
    out: dict[str, mx.array] = {}
    sub = {"transformer.": model.transformer.cfg, "depformer.": model.depformer.cfg}
    for prefix, cfg in sub.items():
        part = {k: w for k, w in weights.items() if k.startswith(prefix)}
        try:
            mapped = remap_checkpoint(part, cfg, prefix)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        out.update({prefix + k: w for k, w in mapped.items()})
    for k, w in weights.items():
        if not k.startswith(tuple(sub)):
            out[k] = w
    for k in out:
        if param_name(k) not in expected:
            raise CheckpointError(f"unexpected LM checkpoint key {k!r}")
    missing = sorted(set(expected) - set(out))
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"LM checkpoint is missing {', '.join(missing[:5])}{more}")
    return out


_MLX_SLICE = re.compile(r"^depformer\.slices\.(\d+)\.(.*)$")
_MLX_NORM = re.compile(r"^(.*(?:^|\.)(?:norm1|norm2|out_norm))\.weight$")


def is_moshi_mlx(keys) -> bool:
    """moshi_mlx's names (Kyutai's `moshiko-mlx-*` files: `audio_embs.K`, `depformer.slices.K`)."""
    return any(k.startswith(("audio_embs.", "depformer.slices.")) for k in keys)


def from_moshi_mlx(weights: dict[str, mx.array], rms: bool) -> dict[str, mx.array]:
    """moshi_mlx `Lm` names -> the names `remap` takes (per-step projections already split).

    Slice k of moshi_mlx's depformer holds step k's embedding, input/output projections and
    attention/FFN weights; its norms are copies of the shared ones (checked equal). RMS norms
    are `.weight` (d,) there and `.alpha` (1, 1, d) here. Quantized modules keep `.scales` /
    `.biases` beside `.weight`.
    """
    out: dict[str, mx.array] = {}
    norms: dict[str, tuple[str, mx.array]] = {}
    for key, w in weights.items():
        name = key
        if m := _MLX_SLICE.match(key):
            k, rest = int(m.group(1)), m.group(2)
            if rest.startswith("emb."):
                name = ("depformer_text_emb." if k == 0 else f"depformer_emb.{k - 1}.") + rest[4:]
            elif rest.startswith("linear_in."):
                name = f"depformer_in.{k}." + rest[len("linear_in."):]
            elif rest.startswith("linear_out."):
                name = f"linears.{k}." + rest[len("linear_out."):]
            elif lm := re.match(r"^transformer\.layers\.(\d+)\.(.*)$", rest):
                layer, part = lm.group(1), lm.group(2)
                part = re.sub(r"^self_attn\.(in|out)_proj\.", rf"self_attn.\1_projs.{k}.", part)
                part = re.sub(r"^gating\.", f"gating.{k}.", part)
                name = f"depformer.layers.{layer}.{part}"
                if part.startswith(("norm1.", "norm2.")):
                    if name in norms:  # a copy of the shared norm
                        first_key, first = norms[name]
                        if first.shape != w.shape or not mx.array_equal(first, w).item():
                            raise CheckpointError(f"{key} differs from {first_key}: the "
                                                  "depformer norms are shared by every step")
                        continue
                    norms[name] = (key, w)
        elif key.startswith("audio_embs."):
            name = "emb." + key[len("audio_embs."):]
        else:
            name = re.sub(r"\.self_attn\.(in|out)_proj\.", r".self_attn.\1_projs.0.", key)
        if rms and (m := _MLX_NORM.match(name)):
            name, w = m.group(1) + ".alpha", w.reshape(1, 1, -1)
        out[name] = w
    return out


_FLAT_QUANT = re.compile(r"\.in_proj_(scales|biases)$")


def personaplex_mlx_weights(parts: dict[str, dict[str, mx.array]]) -> dict[str, mx.array]:
    """The community PersonaPlex MLX split files -> Kyutai names.

    `temporal` holds `transformer.*` without its prefix (and `out_norm.*`), `depformer` holds
    `depformer.*` without its prefix (and `depformer_in.*`), `embeddings` the embeddings and
    heads as they are. The fused attention input is quantized flat, as `in_proj_weight`,
    `in_proj_scales`, `in_proj_biases`; other quantized modules use `.scales` / `.biases`.
    """
    out: dict[str, mx.array] = {}
    prefix = {"temporal": "transformer.", "depformer": "depformer.", "embeddings": ""}
    for part, tensors in parts.items():
        for key, w in tensors.items():
            name = key
            if key.startswith("layers."):
                name = prefix[part] + key
            name = _FLAT_QUANT.sub(r".in_proj.\1", name)
            if name.endswith(".in_proj_weight") and key[: -len("weight")] + "scales" in tensors:
                name = name[: -len("_weight")] + ".weight"
            if name in out:
                raise CheckpointError(f"{key} appears twice in the split PersonaPlex files")
            out[name] = w
    return out
