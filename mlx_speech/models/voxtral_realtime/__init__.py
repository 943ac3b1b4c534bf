"""Voxtral Mini 4B Realtime: streaming speech-to-text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

from ...audio.io import check_audio, load_audio
from ...errors import CheckpointError
from ...hub import load_safetensors, read_json
from ...text.tekken import Tekken
from .config import VoxtralRealtimeConfig
from .model import Model
from .session import Session, Transcript, Word
from .weights import remap

__all__ = ["Session", "Transcript", "VoxtralRealtime", "Word", "load", "weight_patterns"]

MISTRAL_FILES = ["params.json", "consolidated*.safetensors", "tekken.json"]
HF_FILES = ["config.json", "model*.safetensors", "model.safetensors.index.json", "tekken.json"]


def weight_patterns(folder: Path) -> list[str]:
    """Download one layout only: Mistral-native when the repo has params.json."""
    return MISTRAL_FILES if (Path(folder) / "params.json").exists() else HF_FILES


class VoxtralRealtime:
    """A loaded model; any number of sessions can share it."""

    def __init__(self, model: Model, tokenizer: Tekken, config: VoxtralRealtimeConfig):
        self.model, self.tokenizer, self.config = model, tokenizer, config

    @property
    def sample_rate(self) -> int:
        return self.config.audio.sample_rate

    def session(self, delay_ms: int | None = None) -> Session:
        """A streaming session: `feed(samples) -> str`, `finish() -> str`."""
        return Session(self, delay_ms)

    def transcribe(self, audio: np.ndarray | str | Path, sample_rate: int = 16000,
                   delay_ms: int | None = None,
                   progress: Callable[[float, float], None] | None = None) -> Transcript:
        """Transcribe a float32 mono array (at `sample_rate`) or an audio file.

        Offline transcription is the streaming session fed in large pieces, so
        both give the same tokens. `progress(done_s, total_s)` is called per piece.
        """
        if isinstance(audio, (str, Path)):
            audio, _ = load_audio(audio, self.sample_rate)
        else:
            audio = check_audio(audio)
            if sample_rate != self.sample_rate:
                from ...audio.resample import resample

                audio = resample(audio, sample_rate, self.sample_rate)
        s = self.session(delay_ms)
        piece = 10 * self.sample_rate
        total = len(audio) / self.sample_rate
        for i in range(0, len(audio), piece):
            s.feed(audio[i: i + piece])
            if progress is not None:
                progress(min(len(audio), i + piece) / self.sample_rate, total)
        s.finish()
        return s.result()


def _read_config(folder: Path) -> tuple[VoxtralRealtimeConfig, list[Path]]:
    if (folder / "params.json").exists():
        cfg = VoxtralRealtimeConfig.from_params(read_json(folder / "params.json"))
        files = sorted(folder.glob("consolidated*.safetensors"))
    elif (folder / "config.json").exists():
        c = read_json(folder / "config.json")
        if c.get("model_type") != "voxtral_realtime":
            raise CheckpointError(f"{folder} holds a {c.get('model_type')!r} model, "
                                  "not voxtral_realtime")
        cfg = VoxtralRealtimeConfig.from_hf(c)
        files = sorted(folder.glob("model*.safetensors"))
    else:
        raise CheckpointError(f"{folder} has neither params.json nor config.json")
    if not files:
        raise CheckpointError(f"no safetensors weights in {folder}")
    return cfg, files


def load(folder: str | Path, dtype: mx.Dtype | None = None) -> VoxtralRealtime:
    """Load either layout strictly (every key mapped, none missing), lazily."""
    folder = Path(folder)
    config, files = _read_config(folder)
    tek = folder / "tekken.json"
    if not tek.exists():
        raise CheckpointError(f"{folder} has no tekken.json (the Voxtral tokenizer)")
    tokenizer = Tekken.from_file(tek)
    config.apply_tekken_audio(tokenizer.audio)
    model = Model(config)
    expected = {k for k, _ in _flat(model.parameters())}
    try:
        weights = remap(load_safetensors(files), config, expected)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{folder}: {e}") from None
    if dtype is not None:
        weights = {k: v.astype(dtype) for k, v in weights.items()}
    _check_shapes(model, weights)
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    try:
        mx.eval(model.parameters())
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        raise CheckpointError(f"cannot read weights in {folder}: {msg}") from None
    return VoxtralRealtime(model, tokenizer, config)


def _flat(tree, prefix=""):
    from mlx.utils import tree_flatten

    return tree_flatten(tree, prefix=prefix)


def _check_shapes(model: Model, weights: dict[str, mx.array]) -> None:
    for k, p in _flat(model.parameters()):
        if tuple(weights[k].shape) != tuple(p.shape):
            raise CheckpointError(
                f"weight {k!r} has shape {tuple(weights[k].shape)}, config expects "
                f"{tuple(p.shape)}"
            )
