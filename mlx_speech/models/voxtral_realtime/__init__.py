"""Voxtral Mini 4B Realtime: streaming speech-to-text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from ...errors import MlxSpeechError
from ...text import GraphCache, Tekken, Vocabulary
from ..asr import StreamingASR, Transcript, Word, make_booster, session_vocabulary, transcribe_with
from ..base import Latency, parameter_bytes
from ..loading import (
    declared_quantization,
    fill,
    mistral_or_hf_layout,
    read_json,
    read_weights,
    weight_files,
)
from .config import FRAME_MS, VoxtralRealtimeConfig
from .model import Model, remap
from .session import MAX_DELAY_MS, Session
from .step import Steps

__all__ = ["Session", "Transcript", "VoxtralRealtime", "Word", "keep_high_precision", "load",
           "weight_patterns"]

MISTRAL_FILES = ["params.json", "consolidated*.safetensors", "tekken.json"]
HF_FILES = ["config.json", "model*.safetensors", "model.safetensors.index.json", "tekken.json"]


def weight_patterns(folder: Path) -> list[str]:
    """Download one layout only: Mistral-native when the repo has params.json."""
    return MISTRAL_FILES if (Path(folder) / "params.json").exists() else HF_FILES


class VoxtralRealtime(StreamingASR):
    """A loaded model; any number of sessions can share it (`feed_many` steps them
    together)."""

    kind = "asr"  # the model contract (mlx_speech/models/base.py)
    family = "voxtral_realtime"
    name = "Voxtral Realtime speech-to-text"
    # the transcription delay: any multiple of 80 ms up to 2400 (default: the checkpoint's)
    latency = Latency("delay", 480, {"minimal": 80, "low": 240, "medium": 480, "high": 960,
                                     "xhigh": 2400}, step_ms=FRAME_MS, max_ms=MAX_DELAY_MS)
    languages = None  # it takes no language: it transcribes what it hears, in these 13
    spoken = ("ar", "de", "en", "es", "fr", "hi", "it", "ja", "ko", "nl", "pt", "ru", "zh")

    def __init__(self, model: Model, tokenizer: Tekken, config: VoxtralRealtimeConfig,
                 kv_bits: int | None = None):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.graphs = GraphCache()  # the context graphs of its sessions' vocabularies
        self.kv_bits = kv_bits  # 8: every session's KV cache 8-bit
        self.latency = replace(self.latency, default_ms=config.audio.delay_ms)
        self.steps = Steps(model, config)  # the batched step every session goes through

    @property
    def sample_rate(self) -> int:
        return self.config.audio.sample_rate

    def weight_bytes(self) -> int:
        return parameter_bytes([self.model])

    def session(self, latency_ms: int | None = None, hotwords=None,
                boost: float | None = None, logprobs: bool = False, *,
                vocabulary: Vocabulary | None = None, delay_ms: int | None = None) -> Session:
        """A streaming session: `feed(samples) -> str`, `finish() -> str`.

        `latency_ms`: the transcription delay, a multiple of 80 ms (None: the model's default);
        `delay_ms` is its older name. `vocabulary`: phrases to boost and their weight (a
        context graph over their Tekken ids); `hotwords` (a list, or one comma-separated
        string) and `boost` (default 1; 0: off) build one here instead. `logprobs`: keep each
        token's log-probability (`result().logprobs`, `lp.take()`)."""
        return Session(self, _latency(latency_ms, delay_ms),
                       session_vocabulary(vocabulary, hotwords, boost), logprobs)

    def booster(self, vocabulary: Vocabulary | None):
        """A phrase-boosting walk over each phrase's Tekken ids after a space and at the
        start of the text; special tokens (pads, word markers) leave its state alone."""
        tk = self.tokenizer
        return make_booster(self.graphs, vocabulary, self.config.decoder.vocab_size,
                            lambda p: [tk.encode(" " + p), tk.encode(p)], tk.is_special)

    def _feed_batch(self, sessions: list[Session], audios: list[np.ndarray]) -> list[str]:
        return self.steps.feed(sessions, audios)

    def _finish_batch(self, sessions: list[Session]) -> list[str]:
        return self.steps.finish(sessions)

    def transcribe(self, audio: np.ndarray | str | Path, sample_rate: int = 16000,
                   latency_ms: int | None = None,
                   progress: Callable[[float, float], None] | None = None,
                   hotwords=None, boost: float | None = None, logprobs: bool = False, *,
                   vocabulary: Vocabulary | None = None,
                   delay_ms: int | None = None) -> Transcript:
        """Transcribe a float32 mono array (at `sample_rate`) or an audio file.

        The same tokens as a live session with any chunking; `progress(done_s,
        total_s)` is called every few seconds of audio.
        """
        session = self.session(_latency(latency_ms, delay_ms), hotwords, boost, logprobs,
                               vocabulary=vocabulary)
        return transcribe_with(session, audio, sample_rate, progress)


def _latency(latency_ms: int | None, delay_ms: int | None) -> int | None:
    """`latency_ms`, the name both ASR families take, or its alias `delay_ms`."""
    if latency_ms is not None and delay_ms is not None and latency_ms != delay_ms:
        raise MlxSpeechError("give latency_ms or delay_ms (its older name), not both")
    return latency_ms if latency_ms is not None else delay_ms


def _read_config(folder: Path) -> tuple[VoxtralRealtimeConfig, list[Path]]:
    """Mistral-native (params.json), transformers, mlx-audio or voxmlx (config.json)."""
    cfg = folder / "config.json"
    if not (folder / "params.json").exists() and cfg.exists():
        c = read_json(cfg)
        if "multimodal" in c:  # voxmlx: params.json saved as config.json (+ quantization)
            return VoxtralRealtimeConfig.from_params(c), weight_files(folder)
        if "encoder_args" in c or "decoder" in c:
            return VoxtralRealtimeConfig.from_mlx_audio(c), weight_files(folder)
    return mistral_or_hf_layout(folder, "voxtral_realtime",
                                VoxtralRealtimeConfig.from_params, VoxtralRealtimeConfig.from_hf)


def _weights_layout(keys, layout: str) -> str:
    """MLX exports are told apart by their key names (the config may be either kind)."""
    for k in keys:
        if k.startswith(("decoder.layers.", "encoder.transformer_layers.")):
            return "mlx_audio"
        if k.startswith(("language_model.layers.", "adapter.w_in.")):
            return "voxmlx"
    return layout


def keep_high_precision(path: str, module) -> bool:
    """What on-the-fly quantization leaves in full precision (besides norms and the conv stem,
    which are not Linear layers, and widths not divisible by the group).

    The ada-norm MLP (dim -> 32 -> dim) runs once per session to give constant FFN scales, so
    quantizing it saves no time per step and only adds error. Everything else, including the
    tied embedding / LM head (the largest read per decoded token) and the adapter, is
    quantized, as mlx-audio's current converter does (see README, "Quantized models").
    """
    return ".ada_rms_norm_t_cond." in path


def _window(name: str, value: int | None, trained: int) -> int:
    if value is None:
        return trained
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= trained:
        raise MlxSpeechError(f"{name} must be a whole number of positions between 1 and the "
                             f"model's {trained}, got {value!r}")
    return value


def load(folder: str | Path, dtype: mx.Dtype | None = None, quantize: int | None = None,
         group_size: int = 64, decoder_window: int | None = None,
         encoder_window: int | None = None, kv_bits: int | None = None) -> VoxtralRealtime:
    """Load any layout strictly (every key mapped, none missing), lazily.

    Quantized files (mlx-audio, voxmlx) load as they are; `quantize` (4, 6 or 8 bits, group
    `group_size`) quantizes a full-precision checkpoint on the fly.

    `decoder_window` / `encoder_window` (positions; default the model's 8192 / 750) shrink
    the sliding windows attention sees, a memory lever for many long streams: a stream's KV
    cache shrinks in proportion, and the model computes exactly what the reference
    (transformers) computes with the same `sliding_window`s, which differs from the
    trained windows' output (docs/gpu-and-memory.md). `kv_bits=8` stores every session's
    keys and values in 8 bits (int8 with a scale per head and position, as vLLM's 8-bit KV
    caches): about 0.53x a bf16 cache, logits within a bounded error of the exact cache.
    """
    if kv_bits not in (None, 8):
        raise MlxSpeechError(f"kv_bits must be 8 (an 8-bit KV cache) or None, got {kv_bits!r}")
    folder = Path(folder)
    config, files = _read_config(folder)
    config.decoder.sliding_window = _window("decoder_window", decoder_window,
                                            config.decoder.sliding_window)
    config.encoder.sliding_window = _window("encoder_window", encoder_window,
                                            config.encoder.sliding_window)
    tokenizer = Tekken.from_folder(folder)
    config.apply_tekken_audio(tokenizer.audio)
    weights, converted = read_weights(files)
    config.layout = _weights_layout(weights, config.layout)
    model = Model(config)
    fill(model, weights, folder, converted=converted,
         remap=lambda w, expected: remap(w, config, expected), dtype=dtype, quantize=quantize,
         group_size=group_size, keep=keep_high_precision,
         declared=declared_quantization(folder))
    return VoxtralRealtime(model, tokenizer, config, kv_bits)
