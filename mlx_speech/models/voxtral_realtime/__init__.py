"""Voxtral Mini 4B Realtime: streaming speech-to-text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ...errors import CheckpointError
from ...hub import load_safetensors, mistral_or_hf_layout
from ...text.tekken import Tekken
from ..asr import StreamingASR, Transcript, Word, load_strict, transcribe_with
from . import batch
from .config import VoxtralRealtimeConfig
from .model import Model
from .session import Session
from .weights import remap

__all__ = ["Session", "Transcript", "VoxtralRealtime", "Word", "load", "weight_patterns"]

MISTRAL_FILES = ["params.json", "consolidated*.safetensors", "tekken.json"]
HF_FILES = ["config.json", "model*.safetensors", "model.safetensors.index.json", "tekken.json"]


def weight_patterns(folder: Path) -> list[str]:
    """Download one layout only: Mistral-native when the repo has params.json."""
    return MISTRAL_FILES if (Path(folder) / "params.json").exists() else HF_FILES


class VoxtralRealtime(StreamingASR):
    """A loaded model; any number of sessions can share it (`feed_many` steps them
    together)."""

    def __init__(self, model: Model, tokenizer: Tekken, config: VoxtralRealtimeConfig):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self._scale_stacks: dict[tuple[int, ...], list[mx.array]] = {}
        self._steps = 0  # batched decoder steps, for periodic mx.clear_cache

    @property
    def sample_rate(self) -> int:
        return self.config.audio.sample_rate

    def session(self, delay_ms: int | None = None) -> Session:
        """A streaming session: `feed(samples) -> str`, `finish() -> str`."""
        return Session(self, delay_ms)

    def _feed_batch(self, sessions: list[Session], audios: list[np.ndarray]) -> list[str]:
        return batch.feed_batch(self, sessions, audios)

    def _finish_batch(self, sessions: list[Session]) -> list[str]:
        return batch.finish_batch(self, sessions)

    def transcribe(self, audio: np.ndarray | str | Path, sample_rate: int = 16000,
                   delay_ms: int | None = None,
                   progress: Callable[[float, float], None] | None = None) -> Transcript:
        """Transcribe a float32 mono array (at `sample_rate`) or an audio file.

        The same tokens as a live session with any chunking; `progress(done_s,
        total_s)` is called every few seconds of audio.
        """
        return transcribe_with(self.session(delay_ms), audio, sample_rate, progress)


def _read_config(folder: Path) -> tuple[VoxtralRealtimeConfig, list[Path]]:
    return mistral_or_hf_layout(folder, "voxtral_realtime",
                                VoxtralRealtimeConfig.from_params, VoxtralRealtimeConfig.from_hf)


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
    expected = {k for k, _ in tree_flatten(model.parameters())}
    try:
        weights = remap(load_safetensors(files), config, expected)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{folder}: {e}") from None
    load_strict(model, weights, folder, dtype)
    return VoxtralRealtime(model, tokenizer, config)

