"""Test scenes for turn detection: the espeak-ng phrases of tests/data/turns_*.wav with pauses
and background noise, and where each phrase's speech truly starts and ends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

DATA = Path(__file__).parents[1] / "data"
RATE = 16000
BLOCK = 1280  # the microphone's block (80 ms)


def phrase(name: str) -> np.ndarray:
    x, sr = sf.read(DATA / f"turns_{name}.wav", dtype="float32")
    assert sr == RATE
    return x


def speech_span(x: np.ndarray) -> tuple[int, int]:
    """First and one-past-last sample louder than 2% of the phrase's peak."""
    loud = np.flatnonzero(np.abs(x) > 0.02 * np.abs(x).max())
    return int(loud[0]), int(loud[-1]) + 1


def scene(names=("please", "meeting", "go"), lead_s: float = 0.7, gap_s: float = 1.2,
          tail_s: float = 1.0, noise_rms: float = 0.01, seed: int = 0):
    """(audio 16 kHz, [(onset_s, offset_s) of each phrase's speech]): the phrases `gap_s`
    apart (silence to silence, espeak's own edges included), low-passed noise throughout."""
    xs = [phrase(n) for n in names]
    total = int((lead_s + gap_s * (len(xs) - 1) + tail_s) * RATE) + sum(len(x) for x in xs)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(total + 64).astype(np.float32)
    hum = np.convolve(w, np.ones(8, np.float32) / 8, mode="same")[:total]  # a soft rumble
    audio = (noise_rms * hum / np.sqrt(np.mean(hum ** 2))).astype(np.float32)
    spans, pos = [], int(lead_s * RATE)
    for x in xs:
        on, off = speech_span(x)
        audio[pos: pos + len(x)] += x
        spans.append(((pos + on) / RATE, (pos + off) / RATE))
        pos += len(x) + int(gap_s * RATE)
    return audio, spans


def silero():
    """The real Silero VAD: its release model, shipped with mlx_speech (never skipped: the
    weights are package data, so a missing file is a packaging bug)."""
    from mlx_speech.models.silero_vad import load_vad

    return load_vad()


def fake_microphone(blocks: list[np.ndarray]):
    """A `Microphone` class for `transcribe --live` that hands out `blocks`, then Ctrl-C."""

    class FakeMic:
        dropped, ended = 0, False
        check = staticmethod(lambda device=None: None)  # a microphone is there

        def __init__(self, **kw):
            assert kw["sample_rate"] == RATE

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def silent_for(self):
            return 0.0

        def problem(self, quiet_seconds):
            return None

        def read(self, timeout=None):
            if not blocks:
                raise KeyboardInterrupt
            return blocks.pop(0)

        def read_watched(self, timeout, warn):
            return self.read(timeout)

    return FakeMic


def blocks(x: np.ndarray, n: int = BLOCK):
    return [x[i: i + n] for i in range(0, len(x), n)]


def turns_offline(vad, x, silence_ms=500):
    """The turns the VAD cuts in `x`, computed offline (streamed VAD == offline)."""
    from mlx_speech.audio.turns import FRAME, TurnAudio, TurnConfig, TurnDetector
    from mlx_speech.models.silero_vad import frame_probs

    ta = TurnAudio(TurnDetector(TurnConfig(silence_duration_ms=silence_ms)))
    ta.push(x)
    n = len(x) // FRAME
    acts = ta.step(frame_probs(vad, x[: n * FRAME])[:n]) + ta.commit()
    starts = [a[1] for a in acts if a[0] == "start"]
    stops = [a[1] for a in acts if a[0] == "stop"]
    return list(zip(starts, stops, strict=True))
