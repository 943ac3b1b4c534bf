"""Preset voices: `voice_embedding/<name>.safetensors` or `.pt`, rows [N, dim] each.

Loaded lazily (memory-mapped safetensors) and checked against tekken.json's
`audio.voice_num_audio_tokens` (the number of [AUDIO] placeholders).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from ...errors import CheckpointError, MlxSpeechError

DEFAULT_VOICE = "casual_male"  # mlx-audio's default and README example


class Voices:
    def __init__(self, folder: Path, num_tokens: dict[str, int] | None, dim: int):
        self.num_tokens = dict(num_tokens or {})
        self.dim = dim
        self.files: dict[str, Path] = {}
        if folder.is_dir():
            for ext in (".pt", ".safetensors"):  # safetensors wins when both exist
                for f in folder.glob(f"*{ext}"):
                    self.files[f.stem] = f
        self._loaded: dict[str, mx.array] = {}

    @property
    def names(self) -> list[str]:
        return sorted(self.files)

    def default(self) -> str:
        if not self.files:
            raise MlxSpeechError("this checkpoint has no voices (voice_embedding/ is empty)")
        return DEFAULT_VOICE if DEFAULT_VOICE in self.files else self.names[0]

    def __getitem__(self, name: str) -> mx.array:
        if name in self._loaded:
            return self._loaded[name]
        if name not in self.files:
            raise MlxSpeechError(f"unknown voice {name!r}; known voices: "
                                 f"{', '.join(self.names) or '(none)'}")
        emb = _read(self.files[name])
        if emb.ndim != 2 or emb.shape[1] != self.dim:
            raise CheckpointError(f"voice {name}: shape {tuple(emb.shape)}, expected "
                                  f"(N, {self.dim})")
        want = self.num_tokens.get(name)
        if want is not None and want != emb.shape[0]:
            raise CheckpointError(f"voice {name} has {emb.shape[0]} rows but tekken.json "
                                  f"says {want} [AUDIO] tokens")
        self._loaded[name] = emb
        return emb


def _read(path: Path) -> mx.array:
    try:
        if path.suffix == ".safetensors":
            data = mx.load(str(path))
        else:
            from ..torchfile import load_torch

            data = load_torch(path)
    except (OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"cannot read voice {path}: {str(e).splitlines()[0]}") from None
    if isinstance(data, mx.array):
        return data
    if isinstance(data, dict) and data:
        if "embedding" in data:
            return data["embedding"]
        if len(data) == 1:
            return next(iter(data.values()))
    raise CheckpointError(f"{path}: expected one tensor (key 'embedding')")
