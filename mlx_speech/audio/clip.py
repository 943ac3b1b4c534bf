"""`Audio`: a mono float32 clip with its sample rate, what generators return."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Audio:
    samples: np.ndarray  # float32, 1-D, nominally in [-1, 1]
    sample_rate: int

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate

    def __len__(self) -> int:
        return len(self.samples)

    def save(self, path: str | Path, format: str | None = None) -> None:
        from mlx_speech.audio.io import write_audio

        write_audio(path, self.samples, self.sample_rate, format)

    @staticmethod
    def concat(chunks: list[Audio]) -> Audio:
        if not chunks:
            raise ValueError("no audio chunks to join")
        rates = {c.sample_rate for c in chunks}
        if len(rates) != 1:
            raise ValueError(f"cannot join clips of different sample rates {sorted(rates)}")
        return Audio(np.concatenate([c.samples for c in chunks]).astype(np.float32, copy=False),
                     chunks[0].sample_rate)
