"""NVIDIA streaming Sortformer speaker diarization (diar_streaming_sortformer_4spk-v2.1):
who spoke when, up to 4 speakers, in arrival order, offline or streamed."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import numpy as np

from ...audio import audio_at
from ...nn import CompiledStep
from ..base import check_sessions, checked_pairs, parameter_bytes
from ..loading import fill, read_config, read_weights, weight_files
from ..nemo import NemoLogMel, read_archive
from ..stepper import Batch, Stepper
from .config import FRAME_S, SAMPLE_RATE, SortformerConfig
from .model import Sortformer
from .session import Diarization, DiarizerSession, Segment, segments, speaker_at
from .streaming import Chunk, init_state, network, step
from .weights import remap

__all__ = ["Diarization", "DiarizerSession", "Segment", "SortformerDiarizer", "load",
           "segments", "speaker_at", "weight_patterns"]

MODEL_FILES = ["config.json", "model*.safetensors", "model.safetensors.index.json"]


def weight_patterns(folder: Path) -> list[str]:
    return MODEL_FILES


class SortformerDiarizer:
    """A loaded diarizer; any number of sessions share it (`feed_many` steps them together)."""

    kind = "diarizer"  # the model contract (mlx_speech/models/base.py)
    family = "sortformer"
    name = "Sortformer speaker diarization"

    def __init__(self, model: Sortformer, config: SortformerConfig):
        self.model, self.config = model, config
        self.features = NemoLogMel(config.n_mels)
        # sessions with other streaming parameters step separately
        self.stepper = Stepper(self._step, key=lambda s, chunk: id(s.config))
        self.network = CompiledStep(partial(network, model), "sortformer.step")

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def weight_bytes(self) -> int:
        return parameter_bytes([self.model])

    @property
    def n_speakers(self) -> int:
        return self.config.n_spk

    def session(self, **streaming) -> DiarizerSession:
        """A streaming session; keyword arguments override the model's streaming parameters
        (chunk_len, chunk_right_context, fifo_len, spkcache_len, spkcache_update_period...)."""
        config = self.config.streaming(**streaming) if streaming else self.config
        dtype = self.model.sortformer_modules.encoder_proj.weight.dtype
        if not mx.issubdtype(dtype, mx.floating):
            dtype = mx.float16
        return DiarizerSession(self, config, init_state(self.model, config, dtype))

    def feed_many(self, pairs) -> list[np.ndarray]:
        """Feed each session its chunk (16 kHz mono float32, any size): `[(session, audio)]`
        as the ASR families take it. Returns each session's new frames (n, n_spk), exactly
        as `[s.feed(a) for s, a in pairs]` would, the model work batched into shared steps.
        Input is checked before any session is fed."""
        sessions, audios = checked_pairs(self, pairs)
        for s, x in zip(sessions, audios, strict=True):
            s.push(s.mel.feed(x))
        return self.advance(sessions, final=False)

    def finish_many(self, sessions: list[DiarizerSession]) -> list[np.ndarray]:
        """End each session's audio; returns its remaining frames."""
        check_sessions(self, sessions)
        live = [s for s in sessions if not s.finished]
        for s in live:
            s.push(s.mel.finish())
            s.finished = True
        out = dict(zip(map(id, live), self.advance(live, final=True), strict=True))
        empty = np.zeros((0, self.n_speakers), np.float32)
        return [out.get(id(s), empty) for s in sessions]

    def _step(self, batch: Batch[DiarizerSession], chunks: list[Chunk]) -> list[np.ndarray]:
        states = Batch([s.state for s in batch.streams], batch.size)
        probs = step(self.model, batch.streams[0].config, states, chunks, self.network)
        for s, p in zip(batch.streams, probs, strict=True):
            s.frames += len(p)
        return probs

    def advance(self, sessions: list[DiarizerSession], final: bool) -> list[np.ndarray]:
        """Step every chunk the sessions have ready (with `final`, the last ones too), the
        sessions batched; returns each session's new frames (n, n_spk)."""
        queues = {}
        for s in sessions:
            q = []
            while (ch := s.next_chunk(final)) is not None:
                q.append(ch)
            queues[id(s)] = q
        out = self.stepper.run(sessions, lambda s: queues[id(s)].pop(0)
                               if queues[id(s)] else None)
        empty = np.zeros((0, self.n_speakers), np.float32)
        return [np.concatenate(out[id(s)]) if out[id(s)] else empty for s in sessions]

    def probabilities(self, audio: np.ndarray | str | Path, sample_rate: int = SAMPLE_RATE,
                      streaming: bool = True) -> np.ndarray:
        """(frames, n_spk) speaker probabilities, one frame per 80 ms.

        `streaming=True` (what NeMo runs for this model): the streaming algorithm over the
        whole recording, the same frames as a live session. `streaming=False`: NeMo's offline
        forward, one full-context pass over the peak-normalised audio."""
        audio = audio_at(audio, SAMPLE_RATE, sample_rate)
        if streaming:
            s = self.session()
            return np.concatenate([s.feed(audio), s.finish()])
        x = audio.astype(np.float32)
        if len(x):
            x = x * (np.float32(1.0) / (x.max() + np.float32(self.config.eps)))
        mel = self.features(x)
        if len(mel) < 1:
            return np.zeros((0, self.n_speakers), np.float32)
        probs = self.model(mx.array(mel)[None])
        return np.array(probs[0].astype(mx.float32))

    def diarize(self, audio: np.ndarray | str | Path, sample_rate: int = SAMPLE_RATE,
                streaming: bool = True) -> Diarization:
        """Who spoke when: frame probabilities and per-speaker segments (NeMo's rule)."""
        probs = self.probabilities(audio, sample_rate, streaming)
        return Diarization(probs, segments(probs), FRAME_S)


def load(path: str | Path, dtype: mx.Dtype | None = None, quantize: int | None = None,
         group_size: int = 64) -> SortformerDiarizer:
    """Load strictly (every key mapped, none missing).

    `path` is a NeMo `.nemo` archive, mlx-audio's / mlx-community's folder (config.json with
    model_type "sortformer", model.safetensors) or our converted folder."""
    path = Path(path)
    converted = False
    if path.is_file() and path.suffix == ".nemo":
        nemo_config, weights, _ = read_archive(path, tokenizer=False)
        config = SortformerConfig.from_nemo(nemo_config)
    else:
        config = SortformerConfig.from_mlx_audio(read_config(path, "sortformer"))
        weights, converted = read_weights(weight_files(path))
    model = Sortformer(config)
    fill(model, weights, path, converted=converted, remap=remap, dtype=dtype,
         quantize=quantize, group_size=group_size, keep=_keep_high_precision)
    return SortformerDiarizer(model, config)


def _keep_high_precision(path: str, module) -> bool:
    """On-the-fly quantization keeps the subsampling stem and the speaker heads in full
    precision (the stem sees raw features; the heads are tiny and decide every label)."""
    return ".subsampling." in f".{path}." or path.startswith("sortformer_modules")
