"""Mimi checkpoint (`tokenizer-e351c8d8-checkpoint125.safetensors`) -> module names, strict.

Kyutai names wrap each conv twice (`conv.conv.weight`, `convtr.convtr.weight`) and store PyTorch
layouts; ours are MLX layouts (conv (out, k, in), transposed conv (out, k, in / groups), 1x1
projections as Linear). Codebooks arrive as `embedding_sum` / `cluster_usage` (or the legacy
`embed_avg`, `embed_sum`, `cluster_size`) and become one `embedding`. Weight-norm pairs
(`weight_g`, `weight_v`) are folded. Transformer attention names go through `remap_checkpoint`
(fused `in_proj_weight`, `in_proj.weight` or split `in_projs.{k}.weight`).
"""

from __future__ import annotations

import re

import mlx.core as mx

from ...errors import CheckpointError
from ...nn import remap_checkpoint
from .config import MimiConfig

_CONV = re.compile(r"^(?P<pre>.*)\.conv\.conv\.(?P<p>weight|bias)$")
_CONVTR = re.compile(r"^(?P<pre>.*)\.convtr\.convtr\.(?P<p>weight|bias)$")
_CODEBOOK = re.compile(r"^(?P<pre>quantizer\.rvq_\w+\.vq\.layers\.\d+)\._codebook\.(?P<p>\w+)$")
_PROJ = re.compile(r"^quantizer\.rvq_\w+\.(input|output)_proj\.weight$")
_LEGACY = {"embed_avg": "embedding_sum", "embed_sum": "embedding_sum",
           "cluster_size": "cluster_usage", "inited": "_initialized"}


def _fold_weight_norm(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    out = dict(weights)
    for k in [k for k in weights if k.endswith(".weight_v")]:
        base = k[: -len("_v")]
        g = out.pop(base + "_g", None)
        if g is None:
            raise CheckpointError(f"checkpoint has {k!r} without {base + '_g'!r}")
        v = out.pop(k)
        norm = mx.sqrt((v * v).sum(axis=tuple(range(1, v.ndim)), keepdims=True))
        out[base] = v * (g / norm)
    return out


def _convtr_layout(w: mx.array, groups: int) -> mx.array:
    """PyTorch (in, out / g, k) -> MLX (out, k, in / g)."""
    cin, cog, k = w.shape
    w = w.reshape(groups, cin // groups, cog, k).transpose(0, 2, 3, 1)
    return w.reshape(groups * cog, k, cin // groups)


def remap(weights: dict[str, mx.array], cfg: MimiConfig) -> dict[str, mx.array]:
    weights = _fold_weight_norm(weights)
    out: dict[str, mx.array] = {}
    books: dict[str, dict[str, mx.array]] = {}
    for side in ("encoder_transformer", "decoder_transformer"):
        sub = remap_checkpoint(weights, cfg.transformer.transformer, prefix=f"{side}.transformer.")
        out.update({f"{side}.transformer.{k}": v for k, v in sub.items()})
    for key, w in weights.items():
        if key.startswith(("encoder_transformer.transformer.", "decoder_transformer.transformer.")):
            continue
        if m := _CODEBOOK.match(key):
            p = _LEGACY.get(m["p"], m["p"])
            if p not in ("embedding_sum", "cluster_usage", "_initialized"):
                raise CheckpointError(f"unexpected codebook key {key!r}")
            books.setdefault(m["pre"], {})[p] = w
        elif key == "upsample.convtr.convtr.convtr.weight":
            out["upsample.weight"] = _convtr_layout(w, groups=w.shape[0])
        elif key == "downsample.conv.conv.conv.weight":
            out["downsample.conv.weight"] = w.transpose(0, 2, 1)
        elif m := _CONVTR.match(key):
            out[f"{m['pre']}.{m['p']}"] = _convtr_layout(w, 1) if m["p"] == "weight" else w
        elif m := _CONV.match(key):
            out[f"{m['pre']}.conv.{m['p']}"] = w.transpose(0, 2, 1) if m["p"] == "weight" else w
        elif _PROJ.match(key):
            out[key] = w[..., 0] if w.ndim == 3 else w
        else:
            out[key] = w  # transformer in/out projections; anything else fails the strict load
    for pre, parts in books.items():
        if "embedding_sum" not in parts or "cluster_usage" not in parts:
            raise CheckpointError(f"codebook {pre!r} lacks embedding_sum or cluster_usage")
        usage = mx.maximum(parts["cluster_usage"], 1e-5)
        out[f"{pre}.embedding"] = parts["embedding_sum"] / usage[:, None]
    return out
