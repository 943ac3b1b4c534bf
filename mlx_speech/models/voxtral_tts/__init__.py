"""Voxtral-4B-TTS: text + preset voice -> 24 kHz speech, offline or streamed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ...audio.clip import Audio
from ...converted import is_converted
from ...errors import CheckpointError, MlxSpeechError
from ...hub import load_safetensors, mistral_or_hf_layout
from ...nn import quant
from ...text.tekken import Tekken
from ..asr import load_strict
from ..base import parameter_bytes
from .config import VoxtralTTSConfig
from .generate import CodecStream, frame_codes
from .model import Model
from .text import normalize, split_sentences
from .voices import DEFAULT_VOICE, Voices
from .weights import check_keys, remap

__all__ = ["DEFAULT_VOICE", "VoxtralTTS", "keep_high_precision", "load", "normalize",
           "weight_patterns"]

MISTRAL_FILES = ["params.json", "consolidated*.safetensors", "tekken.json", "voice_embedding/*"]
MLX_FILES = ["config.json", "model*.safetensors", "model.safetensors.index.json", "tekken.json",
             "voice_embedding/*"]
MAX_FRAMES = 2048  # 164 s per text chunk
PAUSE_S = 0.25  # silence between the chunks of a long text
CHUNK_CHARS = 400


def weight_patterns(folder: Path) -> list[str]:
    """Download one layout only: Mistral-native when the repo has params.json."""
    return MISTRAL_FILES if (Path(folder) / "params.json").exists() else MLX_FILES


def default_max_frames(text: str) -> int:
    """Generous cap: ~5x a normal speaking rate (~15 characters per second)."""
    return min(MAX_FRAMES, 64 + 4 * len(text))


class VoxtralTTS:
    """A loaded model. `generate` returns one Audio, `stream` yields Audio chunks."""

    kind = "tts"  # the model contract (mlx_speech/models/base.py)
    family = "voxtral_tts"
    name = "Voxtral TTS"

    @staticmethod
    def check_options(folder: str | Path, what: str, voice=None, text=None, **_) -> None:
        """Session options checked from the checkpoint's files before its weights are read
        (`mlx_speech.load(..., options=...)`): the text has something to say, and a voice is one
        of the checkpoint's (once its voice files are there: a hub repo's come with its weights)."""
        if text is not None:
            normalize(text)
        voices = Path(folder) / "voice_embedding"
        if voice is not None and voices.is_dir():
            names = sorted({f.stem for f in voices.iterdir()
                            if f.suffix in (".pt", ".safetensors")})
            if voice not in names:
                raise MlxSpeechError(f"unknown voice {voice!r}; known voices: "
                                     f"{', '.join(names) or '(none)'}")

    def __init__(self, model: Model, tokenizer: Tekken, voices: Voices,
                 first_frame: str = "prefill", compile: bool = True):
        if first_frame not in ("prefill", "audio_step"):
            raise ValueError("first_frame must be 'prefill' or 'audio_step'")
        self.model, self.tokenizer, self._voices = model, tokenizer, voices
        self.config = model.config
        self.first_frame = first_frame
        # fixed shapes per frame: compile the semantic head + 7 Euler steps once; the
        # weights are passed as inputs, so later weight updates are seen.
        self._decode_frame = (mx.compile(model.decode_frame, inputs=model.state) if compile
                              else model.decode_frame)
        t = tokenizer
        self.ids = {name: t.special_id(tok) for name, tok in (
            ("bos", "<s>"), ("audio", "[AUDIO]"), ("begin_audio", "[BEGIN_AUDIO]"),
            ("next_text", "[NEXT_AUDIO_TEXT]"), ("repeat_text", "[REPEAT_AUDIO_TEXT]"))}

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def voices(self) -> list[str]:
        return self._voices.names

    def weight_bytes(self) -> int:
        return parameter_bytes([self.model])

    def prompt_ids(self, text: str, n_voice: int) -> list[int]:
        """[BOS] [BEGIN_AUDIO] [AUDIO]*N [NEXT_AUDIO_TEXT] text [REPEAT_AUDIO_TEXT] [BEGIN_AUDIO]"""
        i = self.ids
        return ([i["bos"], i["begin_audio"]] + [i["audio"]] * n_voice + [i["next_text"]]
                + self.tokenizer.encode(text) + [i["repeat_text"], i["begin_audio"]])

    def codes(self, text: str, voice: str | None = None, seed: int = 0,
              max_frames: int | None = None, noise: mx.array | None = None) -> np.ndarray:
        """(T, 37) int codes for one prompt (text used as given, not split)."""
        rows = list(self._frames(text, voice, seed, max_frames, noise))
        return np.stack(rows) if rows else np.zeros((0, self.config.n_codebooks), np.int32)

    def _frames(self, text, voice, seed, max_frames, noise=None) -> Iterator[np.ndarray]:
        voice = self._voices.default() if voice is None else voice
        rows = self._voices[voice]
        ids = self.prompt_ids(text, rows.shape[0])
        prompt = self.model.embed_prompt(ids, rows, self.ids["audio"])
        n = default_max_frames(text) if max_frames is None else max_frames
        step = self.ids["audio"] if self.first_frame == "audio_step" else None
        return frame_codes(self.model, prompt, n, seed, noise, step, self._decode_frame)

    def stream(self, text: str, voice: str | None = None, seed: int = 0,
               max_frames: int | None = None,
               progress: Callable[[int, int], None] | None = None,
               first_frames: int = 4, chunk_frames: int = 16,
               should_stop: Callable[[], bool] | None = None) -> Iterator[Audio]:
        """Yield 24 kHz float32 Audio chunks as frames are decoded.

        Long text is split at sentence boundaries (fresh prompt per chunk, same
        voice, `PAUSE_S` of silence between). Chunk j draws its noise from
        seed + j. `progress(done_chars, total_chars)` is called after each text
        chunk. The first chunk comes after `first_frames` frames (80 ms each).
        `should_stop()` true ends the stream before the next frame (a server's
        client left: no chunk's worth of frames is made for nobody).
        """
        voice = self._voices.default() if voice is None else voice
        self._voices[voice]  # unknown voice: fail before any work
        chunks = split_sentences(text, CHUNK_CHARS)
        total, done, frames = sum(len(c) for c in chunks), 0, 0
        pause = np.zeros(int(PAUSE_S * self.sample_rate), np.float32)
        for j, chunk in enumerate(chunks):
            if j:
                yield Audio(pause, self.sample_rate)
            dec = CodecStream(self.model.audio_tokenizer, first_frames, chunk_frames)
            for codes in self._frames(chunk, voice, seed + j, max_frames):
                if should_stop is not None and should_stop():
                    return
                frames += 1
                if (wav := dec.push(codes)) is not None:
                    yield Audio(wav, self.sample_rate)
            if (wav := dec.flush()) is not None:
                yield Audio(wav, self.sample_rate)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
        if frames == 0:
            raise MlxSpeechError("the model produced no audio (END on the first frame); "
                                 "try another seed or voice, or rephrase the text")

    def generate(self, text: str, voice: str | None = None, seed: int = 0,
                 max_frames: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> Audio:
        """Speech for `text` as one 24 kHz float32 Audio (the joined `stream`)."""
        return Audio.concat(list(self.stream(text, voice, seed, max_frames, progress,
                                             first_frames=128, chunk_frames=128)))


def _read_config(folder: Path) -> tuple[VoxtralTTSConfig, list[Path]]:
    return mistral_or_hf_layout(folder, "voxtral_tts",
                                VoxtralTTSConfig.from_params, VoxtralTTSConfig.from_mlx_audio)


def keep_high_precision(path: str, module) -> bool:
    """What on-the-fly quantization leaves in full precision (as mlx-audio's converter and the
    mlx-community 4/6-bit releases do): the codec (`audio_tokenizer`: small, runs once per
    chunk, and its output is the waveform itself) and the audio-code embeddings (37 lookups a
    frame, so no bandwidth to save; they carry the voice). The backbone, its embedding, the
    semantic head and the flow transformer are quantized; the 36-wide acoustic input
    projection is kept because its width is not a multiple of the group."""
    return path.startswith(("audio_tokenizer.", "audio_codebook_embeddings."))


def load(folder: str | Path, dtype: mx.Dtype | None = None, alibi: str = "vo",
         first_frame: str = "prefill", compile: bool = True, quantize: int | None = None,
         group_size: int = 64) -> VoxtralTTS:
    """Load either layout strictly and lazily (memory-mapped).

    Quantized mlx-community folders (4/6/8-bit) load as they are; `quantize` (4, 6 or 8
    bits, group `group_size`) quantizes a full-precision checkpoint on the fly, keeping
    `keep_high_precision`.
    `dtype` casts every float weight except the fp32-sensitive semantic codebook.
    `alibi` picks the codec slopes: "vo" (1 .. 1/128, vllm-omni) or "mlxa"
    (1/2 .. 1/256, mlx-audio). `first_frame`: "prefill" or "audio_step" (§5.1).
    `compile`: mx.compile the per-frame flow head.
    """
    folder = Path(folder)
    config, files = _read_config(folder)
    config.codec.alibi = alibi
    config.codec.__post_init__()
    tek = folder / "tekken.json"
    if not tek.exists():
        raise CheckpointError(f"{folder} has no tekken.json (the Voxtral tokenizer)")
    tokenizer = Tekken.from_file(tek)
    converted = is_converted(files)  # already in our names and dtypes
    weights, origin = ((load_safetensors(files), "converted") if converted
                       else remap(load_safetensors(files), config))
    try:  # table sizes come from the weights (tiny configs round differently)
        config.backbone.vocab_size = weights["tok_embeddings.weight"].shape[0]
        config.audio_table_rows = weights["audio_codebook_embeddings.embeddings.weight"].shape[0]
        config.semantic_head_rows = (
            weights["acoustic_transformer.semantic_codebook_output.weight"].shape[0])
    except KeyError as e:
        raise CheckpointError(f"{folder}: checkpoint is missing {e.args[0]!r}") from None
    model = Model(config)
    if not converted:
        check_keys(weights, origin, {k for k, _ in tree_flatten(model.parameters())})
    if dtype is not None:
        weights = {k: v if ".quantizer." in k or not mx.issubdtype(v.dtype, mx.floating)
                   else v.astype(dtype) for k, v in weights.items()}
    load_strict(model, weights, folder, None, quantize, group_size, keep_high_precision,
                quant.declared(folder / "config.json"))
    voices = Voices(folder / "voice_embedding",
                    tokenizer.audio.get("voice_num_audio_tokens"), config.backbone.dim)
    return VoxtralTTS(model, tokenizer, voices, first_frame, compile)

