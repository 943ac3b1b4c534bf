"""NeMo checkpoints without torch: the `.nemo` archive and the FastConformer key names.

A `.nemo` file is a tar (plain or gzip) holding `model_config.yaml`, `model_weights.ckpt` (a
torch.save zip of a plain state dict) and tokenizer artifacts named `<uuid>_tokenizer.model`.
The state dict is read with `mlx_speech.models.torchfile`, which builds tensors and plain containers
only and rejects any other pickled global, so no pickled code runs. Each family renames the
keys to its own modules; the FastConformer layers' names are the same in every NeMo family
(`CONFORMER_RENAMES`).
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import mlx.core as mx

from ...errors import CheckpointError
from ..torchfile import load_torch

# NeMo's FastConformer layer names -> the modules' of `mlx_speech.nn.conformer` (the
# transformers names): the same in every NeMo family's checkpoint (Nemotron ASR, Sortformer),
# applied with re.sub in order
CONFORMER_RENAMES = [
    (r"\.conv\.batch_norm\.", ".conv.norm."),
    (r"\.self_attn\.linear_q\.", ".self_attn.q_proj."),
    (r"\.self_attn\.linear_k\.", ".self_attn.k_proj."),
    (r"\.self_attn\.linear_v\.", ".self_attn.v_proj."),
    (r"\.self_attn\.linear_out\.", ".self_attn.o_proj."),
    (r"\.self_attn\.linear_pos\.", ".self_attn.relative_k_proj."),
    (r"\.self_attn\.pos_bias_u$", ".self_attn.bias_u"),
    (r"\.self_attn\.pos_bias_v$", ".self_attn.bias_v"),
]


def renamed(key: str, rules) -> str:
    """`key` after each (pattern, replacement) of `rules`, in order."""
    for pat, rep in rules:
        key = re.sub(pat, rep, key)
    return key


def read_state_dict(data: bytes) -> dict[str, mx.array]:
    """A torch.save zip archive of a flat name -> tensor dict, as MLX arrays."""
    sd = load_torch(data, name="model_weights.ckpt")
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise CheckpointError("model_weights.ckpt does not hold a state dict")
    for k, v in sd.items():
        if not isinstance(v, mx.array):
            raise CheckpointError(f"model_weights.ckpt entry {k!r} is not a tensor")
    return dict(sd)


def _member(tar: tarfile.TarFile, pattern: str) -> tarfile.TarInfo | None:
    for m in tar.getmembers():
        if m.isfile() and re.fullmatch(pattern, Path(m.name).name):
            return m
    return None


def read_archive(path: str | Path, weights: bool = True,
                 tokenizer: bool = True) -> tuple[dict, dict[str, mx.array], bytes | None]:
    """(model_config, the raw NeMo state dict ({} if not `weights`), tokenizer.model bytes or
    None when not `tokenizer`) of any NeMo model archive."""
    import yaml

    path = Path(path)
    try:
        with tarfile.open(path, "r:*") as tar:
            cfg_m = _member(tar, r"model_config\.yaml")
            w_m = _member(tar, r"model_weights\.ckpt")
            tok_m = _member(tar, r"(.+_)?tokenizer\.model") if tokenizer else None
            if cfg_m is None or w_m is None:
                raise CheckpointError(f"{path} lacks model_config.yaml or model_weights.ckpt")
            if tokenizer and tok_m is None:
                raise CheckpointError(f"{path} has no SentencePiece tokenizer.model")
            config = yaml.safe_load(tar.extractfile(cfg_m).read())
            raw = tar.extractfile(w_m).read() if weights else None
            tok = tar.extractfile(tok_m).read() if tok_m is not None else None
    except (tarfile.TarError, OSError, yaml.YAMLError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: model_config.yaml is not a mapping")
    return config, (read_state_dict(raw) if weights else {}), tok
