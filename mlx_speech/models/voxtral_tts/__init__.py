"""Voxtral-4B-TTS: text + preset voice -> 24 kHz speech, offline or streamed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np

from ...audio import Audio
from ...errors import CheckpointError, MlxSpeechError
from ...nn import CompiledStep
from ...text import Tekken
from ..base import parameter_bytes
from ..loading import (
    declared_quantization,
    fill,
    mistral_or_hf_layout,
    parameter_names,
    read_weights,
)
from .config import DEFAULT_VOICE, Voices, VoxtralTTSConfig
from .model import Model, check_keys, remap
from .session import MAX_FRAMES, PAUSE_S, Session, default_max_frames, step_many
from .step import frame_codes, frame_step
from .text import CLAUSE_WORDS, SEGMENT_CHARS, normalize, split_sentences

__all__ = ["CLAUSE_WORDS", "DEFAULT_VOICE", "MAX_FRAMES", "PAUSE_S", "Session", "VoxtralTTS",
           "default_max_frames", "keep_high_precision", "load", "normalize", "weight_patterns"]

MISTRAL_FILES = ["params.json", "consolidated*.safetensors", "tekken.json", "voice_embedding/*"]
MLX_FILES = ["config.json", "model*.safetensors", "model.safetensors.index.json", "tekken.json",
             "voice_embedding/*"]
CHUNK_CHARS = SEGMENT_CHARS  # `stream` joins sentences into chunks of at most this many


def weight_patterns(folder: Path) -> list[str]:
    """Download one layout only: Mistral-native when the repo has params.json."""
    return MISTRAL_FILES if (Path(folder) / "params.json").exists() else MLX_FILES


class VoxtralTTS:
    """A loaded model. `generate` returns one Audio, `stream` yields Audio chunks,
    `stream_text` speaks text that arrives in pieces; `session` / `step_many` step many
    voices together (one batched forward per frame)."""

    kind = "tts"  # the model contract (mlx_speech/models/base.py)
    family = "voxtral_tts"
    name = "Voxtral TTS"

    @staticmethod
    def check_session_options(folder: str | Path, what: str, voice=None, text=None, **_) -> None:
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
        # compile the semantic head + 7 Euler steps once per batch shape; the weights are
        # passed as inputs, so later weight updates are seen.
        self.decode_frame = (mx.compile(model.decode_frame, inputs=model.state) if compile
                             else model.decode_frame)
        # the whole batched frame (backbone step, flow head), compiled per shape at the fixed
        # shapes (nn.compiled: on by default where they are, MLX_SPEECH_COMPILE switches it)
        self.frame = CompiledStep(self._frame, "voxtral_tts.frame")
        t = tokenizer
        self.ids = {name: t.special_id(tok) for name, tok in (
            ("bos", "<s>"), ("audio", "[AUDIO]"), ("begin_audio", "[BEGIN_AUDIO]"),
            ("next_text", "[NEXT_AUDIO_TEXT]"), ("repeat_text", "[REPEAT_AUDIO_TEXT]"))}

    def _frame(self, *args):
        """`step.frame_step` with this model's (compiled) flow head, read at each call."""
        return frame_step(self.model, self.decode_frame, *args)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def voices(self) -> list[str]:
        return self._voices.names

    def weight_bytes(self) -> int:
        return parameter_bytes([self.model])

    def default_voice(self) -> str:
        return self._voices.default()

    def voice_rows(self, voice: str) -> mx.array:
        """(N, dim) embedding rows of a preset voice (MlxSpeechError naming the known ones)."""
        return self._voices[voice]

    def prompt_ids(self, text: str, n_voice: int) -> list[int]:
        """[BOS] [BEGIN_AUDIO] [AUDIO]*N [NEXT_AUDIO_TEXT] text [REPEAT_AUDIO_TEXT] [BEGIN_AUDIO]"""
        i = self.ids
        return ([i["bos"], i["begin_audio"]] + [i["audio"]] * n_voice + [i["next_text"]]
                + self.tokenizer.encode(text) + [i["repeat_text"], i["begin_audio"]])

    def prompt(self, text: str, voice: str) -> mx.array:
        """(1, L, dim) prompt embeddings for `text` (used as given) in `voice`."""
        rows = self._voices[voice]
        return self.model.embed_prompt(self.prompt_ids(text, rows.shape[0]), rows,
                                       self.ids["audio"])

    def codes(self, text: str, voice: str | None = None, seed: int = 0,
              max_frames: int | None = None, noise: mx.array | None = None) -> np.ndarray:
        """(T, 37) int codes for one prompt (text used as given, not split)."""
        voice = self._voices.default() if voice is None else voice
        n = default_max_frames(text) if max_frames is None else max_frames
        step = self.ids["audio"] if self.first_frame == "audio_step" else None
        rows = list(frame_codes(self.model, self.prompt(text, voice), n, seed, noise, step,
                                self.decode_frame))
        return np.stack(rows) if rows else np.zeros((0, self.config.n_codebooks), np.int32)

    # -- many voices, text in pieces ------------------------------------------------------------
    def session(self, voice: str | None = None, seed: int = 0, max_frames: int | None = None,
                first_frames: int = 4, chunk_frames: int = 16,
                clause_words: int | None = CLAUSE_WORDS,
                max_chars: int = SEGMENT_CHARS, text: str | None = None) -> Session:
        """A speech session: `feed(text)` pieces as they come, `finish()`, then `step()` (or
        `step_many` with other sessions) until `done`. Segments are cut at sentence ends (a
        clause mark after `clause_words` words; at most `max_chars` characters), segment j
        drawn from seed + j, `PAUSE_S` of silence between; chunks of `first_frames` then
        `chunk_frames` frames (80 ms each); `max_frames` caps each segment.

        `text`: a whole text instead, cut as `stream` cuts it (sentences joined into chunks of
        at most CHUNK_CHARS) and finished: the session speaks exactly `stream`'s audio."""
        s = Session(self, voice, seed, max_frames, first_frames, chunk_frames, clause_words,
                    max_chars)
        if text is not None:
            s.add_segments(split_sentences(text, CHUNK_CHARS))
        return s

    def step_many(self, sessions: Iterable[Session]) -> list[Audio | None]:
        """Advance each session by one frame in one batched forward (the backbone step, the
        flow head, the codec chunks due): each session's new audio or None, exactly as
        `[s.step() for s in sessions]`. Sessions join and leave at any call; a cancelled
        session does no more work. Call from the one thread that owns MLX work."""
        return step_many(self, list(sessions))

    def stream_text(self, text: str | Iterable[str], voice: str | None = None, seed: int = 0,
                    max_frames: int | None = None, first_frames: int = 4,
                    chunk_frames: int = 16, clause_words: int | None = CLAUSE_WORDS,
                    max_chars: int = SEGMENT_CHARS,
                    should_stop: Callable[[], bool] | None = None) -> Iterator[Audio]:
        """Speak text that arrives in pieces (an LLM's tokens, lines of a pipe): yields 24 kHz
        Audio chunks, the first as soon as a segment (a sentence; see `session`) has arrived
        and `first_frames` frames are made, and keeps going as more text comes. The audio is
        the same whatever the pieces: each segment as `stream(segment, seed=seed + j)`, with
        `PAUSE_S` between. The pieces are read on a helper thread (a slow source never stalls
        the frames); MLX work stays on the caller's. `should_stop()` true, or closing the
        generator, stops before the next frame (barge-in)."""
        s = self.session(voice, seed, max_frames, first_frames, chunk_frames, clause_words,
                         max_chars)
        if isinstance(text, str):
            s.feed(text)
            s.finish()
        else:
            threading.Thread(target=_read_pieces, args=(text, s), daemon=True,
                             name="mlx_speech-tts-text").start()
        try:
            while True:
                if should_stop is not None and should_stop():
                    return
                if s.error is not None:
                    raise s.error
                if s.ready:
                    if (a := s.step()) is not None:
                        yield a
                elif s.done:
                    break
                else:
                    s.wait(None if should_stop is None else 0.05)
        finally:
            s.cancel()  # the reader stops taking pieces
        if s.error is not None:
            raise s.error
        if s.segments == 0:
            raise MlxSpeechError("text is empty: nothing to say")
        _check_spoke(s)

    # -- one text -----------------------------------------------------------------------------
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
        s = self.session(voice, seed, max_frames, first_frames, chunk_frames, text=text)
        total, reported = s.pending_chars, 0
        while not s.done:
            if should_stop is not None and should_stop():
                s.cancel()
                return
            if (a := s.step()) is not None:
                yield a
            if progress is not None and s.segments_done > reported:
                reported = s.segments_done
                progress(s.chars_done, total)
        _check_spoke(s)

    def generate(self, text: str, voice: str | None = None, seed: int = 0,
                 max_frames: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> Audio:
        """Speech for `text` as one 24 kHz float32 Audio (the joined `stream`)."""
        return Audio.concat(list(self.stream(text, voice, seed, max_frames, progress,
                                             first_frames=128, chunk_frames=128)))


def _check_spoke(s: Session) -> None:
    if s.frames == 0:
        raise MlxSpeechError("the model produced no audio (END on the first frame); "
                             "try another seed or voice, or rephrase the text")


def _read_pieces(pieces: Iterable[str], s: Session) -> None:
    """A helper thread: feed the pieces into the session as they come."""
    try:
        for piece in pieces:
            if s.cancelled:
                return
            s.feed(piece)
        s.finish()
    except BaseException as e:  # noqa: BLE001 (handed to the consuming thread)
        s.fail(e)


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
    config, files = mistral_or_hf_layout(folder, "voxtral_tts", VoxtralTTSConfig.from_params,
                                         VoxtralTTSConfig.from_mlx_audio)
    config.codec.alibi = alibi
    config.codec.__post_init__()
    tokenizer = Tekken.from_folder(folder)
    weights, converted = read_weights(files)  # converted: in our names and dtypes already
    if not converted:  # remapped before the model is built: its table sizes come from them
        weights, origin = remap(weights, config)
    try:  # table sizes come from the weights (tiny configs round differently)
        config.backbone.vocab_size = weights["tok_embeddings.weight"].shape[0]
        config.audio_table_rows = weights["audio_codebook_embeddings.embeddings.weight"].shape[0]
        config.semantic_head_rows = (
            weights["acoustic_transformer.semantic_codebook_output.weight"].shape[0])
    except KeyError as e:
        raise CheckpointError(f"{folder}: checkpoint is missing {e.args[0]!r}") from None
    model = Model(config)
    if not converted:
        check_keys(weights, origin, parameter_names(model))
    if dtype is not None:
        weights = {k: v if ".quantizer." in k or not mx.issubdtype(v.dtype, mx.floating)
                   else v.astype(dtype) for k, v in weights.items()}
    fill(model, weights, folder, converted=converted, quantize=quantize, group_size=group_size,
         keep=keep_high_precision, declared=declared_quantization(folder))
    voices = Voices(folder / "voice_embedding",
                    tokenizer.audio.get("voice_num_audio_tokens"), config.backbone.dim)
    return VoxtralTTS(model, tokenizer, voices, first_frame, compile)

