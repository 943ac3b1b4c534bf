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
from .config import LmConfig
from .transformer import remap_checkpoint

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
        if k not in expected:
            raise CheckpointError(f"unexpected LM checkpoint key {k!r}")
    missing = sorted(set(expected) - set(out))
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"LM checkpoint is missing {', '.join(missing[:5])}{more}")
    return out


def check_config(config: LmConfig, weights: dict[str, mx.array]) -> None:
    """The config's dep_q must match the heads in the file (PersonaPlex has 16)."""
    n = depformer_steps(weights)
    if n != config.dep_q:
        raise CheckpointError(f"config says dep_q={config.dep_q} but the weights have {n} "
                              "depformer heads")
