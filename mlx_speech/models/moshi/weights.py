"""Kyutai / PersonaPlex LM checkpoint names -> LM parameters (strict, torch-free).

Released files (spec §5.1, §5.2) use the module names of `moshi.models.lm.LMModel` with the
attention projections fused over depformer steps (`self_attn.in_proj_weight`,
`self_attn.out_proj.weight`); `transformer.remap_checkpoint` splits those. Every other key keeps
its name. Any key left over, or any parameter not covered, is a CheckpointError naming it.
"""

from __future__ import annotations

import re

import mlx.core as mx
from mlx.utils import tree_flatten

from ...errors import CheckpointError
from ...nn.moshi_transformer import remap_checkpoint
from ...nn.quant import param_name
from .config import LmConfig

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


def check_config(config: LmConfig, weights: dict[str, mx.array]) -> None:
    """The config's dep_q must match the heads in the file (PersonaPlex has 16)."""
    n = depformer_steps(weights)
    if n != config.dep_q:
        raise CheckpointError(f"config says dep_q={config.dep_q} but the weights have {n} "
                              "depformer heads")
