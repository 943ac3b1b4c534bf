"""NVIDIA Nemotron speech streaming: cache-aware FastConformer + RNN-T (en 0.6b), and Nemotron
3.5 ASR streaming (`nemotron3_5_asr`, `Nemotron35Streaming`): the same model with a language-ID
prompt (NeMo's `EncDecRNNTBPEModelWithPrompt`, about 40 locales, punctuation and capitals, `auto`
language detection), the same encoder, decoder, sessions and batched stepping.

Files: config.py (config, languages), weights.py (every checkpoint layout as ours), model.py (the
network), step.py (sessions and their batched step); here the classes and the loader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from ...errors import CheckpointError, MlxSpeechError
from ...nn import quantization_declared
from ...text import GraphCache, SentencePieceDecoder, Vocabulary
from ..asr import StreamingASR, Word, make_booster, session_vocabulary, transcribe_with
from ..base import Latency, parameter_bytes
from ..loading import fill, read_json, read_weights, weight_files
from ..nemo import NemoLogMel, read_archive
from .config import (
    FRAME_MS,
    LATENCY_MS,
    SAMPLE_RATE,
    Languages,
    NemotronStreamingConfig,
    check_language,
    release_codes,
    release_prompts,
)
from .model import Model
from .step import Session, Steps, Transcript
from .weights import (
    is_nemo_mlx,
    mlx_audio_config_json,
    nemo_config_json,
    read_nemo,
    remap,
    remap_nemo_mlx,
    with_folder_prompts,
)

__all__ = ["LATENCY_MS", "LATENCY_MS_35", "Nemotron35Streaming", "NemotronStreaming", "Session",
           "Transcript", "Word", "check_load_options", "keep_high_precision", "load",
           "weight_patterns"]

HF_FILES = ["config.json", "model*.safetensors", "model.safetensors.index.json",
            "tokenizer.json", "tokenizer.model", "processor_config.json"]
MODEL_TYPES = ("nemotron_asr_streaming", "nemotron3_5_asr")  # English seed; Nemotron 3.5
# (and mlx-audio's `nemotron_asr` layout of either, read through weights.py)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def weight_patterns(folder: Path) -> list[str]:
    """The transformers layout (config.json + safetensors + tokenizer)."""
    return HF_FILES


class NemotronStreaming(StreamingASR):
    """A loaded model; any number of sessions can share it (`feed_many` steps them
    together)."""

    kind = "asr"  # the model contract (mlx_speech/models/base.py)
    family = "nemotron_streaming"
    name = "Nemotron streaming speech-to-text"
    # four latency modes (a checkpoint may support fewer: its sessions say)
    latency = Latency("Nemotron's latency", 1120, {"minimal": 80, "low": 160, "medium": 560,
                                                   "high": 1120, "xhigh": 1120},
                      choices_ms=tuple(sorted(LATENCY_MS)))
    languages: tuple[str, ...] | None = None  # what `language=` takes; None: none (English)
    spoken: tuple[str, ...] = ("en",)

    def __init__(self, model: Model, tokenizer: SentencePieceDecoder,
                 config: NemotronStreamingConfig, language: str | None = None):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.graphs = GraphCache()  # the context graphs of its sessions' vocabularies
        self.features = NemoLogMel(config.encoder.num_mel_bins)
        default = (config.encoder.default_right_context + 1) * FRAME_MS
        if default in self.latency.choices_ms:
            self.latency = replace(self.latency, default_ms=default)
        self.steps = Steps(model)  # the batched step every session goes through
        self.languages_info: Languages | None = None
        self.language_tags: dict[int, str] = {}  # token id -> the locale of its tag
        if config.num_prompts:
            info = Languages.build(config.prompts, config.default_prompt,
                                   [p for p, _ in tokenizer.pieces])
            tokenizer.hide(info.tags)  # tags stay in token_ids, never in text
            if language is not None:  # the load's default language for sessions
                info = Languages(info.prompts, info.resolve(language)[0], info.tags)
            self.languages_info, self.language_tags = info, info.tags
            self.languages = info.names
        elif language is not None:
            self.resolve_language(language)

    def resolve_language(self, language: str | None) -> tuple[str | None, int | None]:
        """A session's `language` -> (the checkpoint's name for it, its prompt slot); None:
        the model's default. (None, None) for a model without languages, which refuses any."""
        if self.languages_info is None:
            if language is None:
                return None, None
            raise MlxSpeechError(f"this {self.name} model is English only and takes no "
                                 f"language (got {language!r})")
        return self.languages_info.resolve(language)

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def weight_bytes(self) -> int:
        return parameter_bytes([self.model])

    def session(self, latency_ms: int | None = None, hotwords=None,
                boost: float | None = None, logprobs: bool = False,
                language: str | None = None, *, vocabulary: Vocabulary | None = None) -> Session:
        """A streaming session: `feed(samples) -> str`, `finish() -> str`.

        `latency_ms` is one of 80, 160, 560, 1120 (Nemotron 3.5 also 320; None: the model's
        default, 1120). `language` (Nemotron 3.5): a name of `languages` (`de-DE`, `de`, ...;
        case and `_` do not matter) or `auto` (the model detects it: `result().language`); None:
        the model's default (`auto` in the release).
        `vocabulary`: phrases to boost and their weight (NeMo's GPU-PB word boosting in
        greedy decoding); `hotwords` (a list, or one comma-separated string) and `boost`
        (default 1; 0: off) build one here instead. `logprobs`: keep each token's
        log-probability (`result().logprobs`, `lp.take()`).
        """
        return Session(self, latency_ms, session_vocabulary(vocabulary, hotwords, boost),
                       logprobs, language)

    def booster(self, vocabulary: Vocabulary | None):
        """A phrase-boosting walk over the phrases' SentencePiece ids at a word start."""
        return make_booster(self.graphs, vocabulary, self.config.blank_id,
                            lambda p: [self.tokenizer.encode(p)])

    def _feed_batch(self, sessions: list[Session], audios: list[np.ndarray]) -> list[str]:
        mels = [s.mel.feed(x) for s, x in zip(sessions, audios, strict=True)]
        return self.steps.run(sessions, [m if len(m) else None for m in mels], final=False)

    def _finish_batch(self, sessions: list[Session]) -> list[str]:
        live = [s for s in sessions if not s.finished]
        mels = []
        for s in live:
            s.finished = True
            mel = s.mel.finish()
            mels.append(mel if s.mel.emitted else None)
        texts = self.steps.run(live, mels, final=True)
        out = {id(s): t + s.detok.flush() for s, t in zip(live, texts, strict=True)}
        mx.clear_cache()
        return [out.get(id(s), "") for s in sessions]

    def transcribe(self, audio: np.ndarray | str | Path, sample_rate: int = 16000,
                   latency_ms: int | None = None,
                   progress: Callable[[float, float], None] | None = None,
                   hotwords=None, boost: float | None = None, logprobs: bool = False,
                   language: str | None = None, *,
                   vocabulary: Vocabulary | None = None) -> Transcript:
        """Transcribe a float32 mono array (at `sample_rate`) or an audio file.

        The same tokens as a live session in the same latency mode and language, any chunking.
        """
        session = self.session(latency_ms, hotwords, boost, logprobs, language,
                               vocabulary=vocabulary)
        return transcribe_with(session, audio, sample_rate, progress)


# streaming latency -> right context (frames): the seed model's modes and 320 ms (r = 3)
LATENCY_MS_35 = {**LATENCY_MS, 320: 3}


class Nemotron35Streaming(NemotronStreaming):
    """A loaded Nemotron 3.5 model: `languages` is its checkpoint's (the class attribute: the
    release's, for checks before a load); sessions and `transcribe` take `language=`."""

    name = "Nemotron 3.5 streaming speech-to-text"
    # the seed model's modes and 320 ms (a checkpoint may support fewer: its sessions say)
    latency = Latency("Nemotron 3.5's latency", 1120, {"minimal": 80, "low": 160, "medium": 560,
                                                       "high": 1120, "xhigh": 1120},
                      choices_ms=tuple(sorted(LATENCY_MS_35)))
    languages = tuple(sorted(release_prompts(), key=str.lower))
    spoken = release_codes()


def _read_tokenizer(folder: Path) -> SentencePieceDecoder:
    for name in TOKENIZER_FILES:
        if (folder / name).exists():
            tk = SentencePieceDecoder.from_file(folder / name)
            spm = folder / "tokenizer.model"
            if name != "tokenizer.model" and spm.exists():
                # hotwords are encoded exactly as sentencepiece does with the .model's scores
                exact = SentencePieceDecoder.from_file(spm)
                if [p for p, _ in exact.pieces] == [p for p, _ in tk.pieces[:len(exact)]]:
                    tk.encoding = exact.encoding
            return tk
    raise CheckpointError(f"{folder} has no tokenizer.json or tokenizer.model")


def check_load_options(configs: Path, language: str | None = None, **_) -> None:
    """`language` against the checkpoint's languages, from its configs alone (a `.nemo`'s
    model_config.yaml; a folder's config.json and processor_config.json): a one-line error
    before any weights are read or downloaded."""
    if language is None:
        return
    configs = Path(configs)
    if configs.is_file():
        c = nemo_config_json(read_archive(configs, False, False)[0])
    elif (configs / "config.json").exists():
        c = folder_config(configs)
    else:
        return  # no config yet: load() reports it
    check_language(c, language)


def folder_config(folder: Path) -> dict:
    """A folder's config.json as ours: mlx-audio's `nemotron_asr` layout translated, a
    transformers Nemotron 3.5's languages joined from processor_config.json."""
    if not (folder / "config.json").exists():
        raise CheckpointError(f"{folder} has no config.json")
    c = read_json(folder / "config.json")
    if c.get("model_type") == "nemotron_asr":  # mlx-audio: NeMo sections, NeMo-named weights
        c = mlx_audio_config_json(c)
    if c.get("model_type") not in MODEL_TYPES:
        raise CheckpointError(f"{folder} holds a {c.get('model_type')!r} model, "
                              "not nemotron_asr_streaming")
    return with_folder_prompts(folder, c)


def keep_high_precision(path: str, module) -> bool:
    """What on-the-fly quantization leaves in full precision besides the convolutions, the
    LSTM and the norms (which are not Linear layers): the 1x1 convolutions that this port runs
    as Linears (`pointwise_conv` in the subsampling stem and in every conformer conv module).
    They are convolutions in the checkpoint, which the MLX converters keep as they are; the
    stem sees the raw features. Attention, FFN, projections, joint and the prediction
    embedding are quantized."""
    return ".pointwise_conv" in path


def load(path: str | Path, dtype: mx.Dtype | None = None, quantize: int | None = None,
         group_size: int = 64, language: str | None = None) -> NemotronStreaming:
    """Load strictly (every key mapped, none missing), lazily (weights memory-mapped).

    `path` is a transformers-layout folder (config.json, model*.safetensors,
    tokenizer.json or tokenizer.model; Nemotron 3.5 also processor_config.json, its languages)
    or a NeMo `.nemo` archive. Quantized Linears / embeddings in the file load as they are;
    `quantize` (4, 6 or 8 bits, group `group_size`) quantizes a full-precision checkpoint on
    the fly, keeping `keep_high_precision`. `language`: the sessions' default language
    (Nemotron 3.5), checked against the checkpoint's languages before any weights are read.
    """
    path = Path(path)
    converted = False
    check_load_options(path, language)  # before any weights are read
    if path.is_file() and path.suffix == ".nemo":
        nemo_config, weights, tok = read_nemo(path)
        c = nemo_config_json(nemo_config)
        tokenizer = SentencePieceDecoder.from_model_bytes(tok)
    else:
        c = folder_config(path)
        files = weight_files(path)
        tokenizer = _read_tokenizer(path)
        weights, converted = read_weights(files)
    config = NemotronStreamingConfig.from_hf(c)
    model = Model(config)
    nemo_mlx = is_nemo_mlx(weights)  # an MLX export with NeMo names (possibly quantized)
    fill(model, weights, path, converted=converted,
         remap=remap_nemo_mlx if nemo_mlx else remap, dtype=dtype, quantize=quantize,
         group_size=group_size, keep=keep_high_precision,
         declared=quantization_declared(c) if nemo_mlx else None)
    if config.num_prompts:
        return Nemotron35Streaming(model, tokenizer, config, language)
    return NemotronStreaming(model, tokenizer, config, language)
