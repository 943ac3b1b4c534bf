"""The model contract: what every loaded model is, written once.

`mlx_speech.load` returns one object per checkpoint; whatever its family, it says what it is
through the attributes below, and every front door (CLIs, server, app, doctor) asks them
instead of guessing from attributes, types or names. Class attributes hold what does not
depend on the weights, so a front door can check a value against a family (through
`mlx_speech.registry.family`) before anything is loaded.

Every model:
    kind         "asr" | "tts" | "duplex" | "vad" | "diarizer"
    family       the registry's family name, for display and logs (nothing branches on it)
    name         how messages name the model ("Voxtral Realtime speech-to-text", ...)
    sample_rate  the audio rate it takes (asr, vad, diarizer, duplex) or makes (tts), in Hz
    session(**options)   a streaming session
    weight_bytes()       bytes of the loaded weights
Speech-to-text also: `latency` (a `Latency`), `languages`, `spoken`, `transcribe`,
`feed_many`, `finish_many`, `tokenizer`, where
    languages    what sessions' `language=` takes (names such as "de-DE", "de" and "auto"), or
                 None when the model takes no language (it is given none: it transcribes what
                 it hears). The class attribute is the family's, for checks before a load; a
                 loaded model's is its checkpoint's, and `resolve_language(name) -> (name, slot)`
                 resolves one of them (a one-line MlxSpeechError listing them otherwise)
    spoken       the ISO 639 codes ("de"; two letters where there are two) of the languages it
                 transcribes (class attribute): what a front door may take as a hint for a model
                 that takes no language (`text.language_names.language_code` of a client's name)
Text-to-speech: `voices`, `generate`, `stream`. Full duplex: `frame_size`, `voices`, `roles`
(whether sessions take a text role prompt). Diarizer: `n_speakers`, `feed_many`,
`finish_many`. VAD: `make_state`, called on (audio, state). A speech-to-text
session takes `vocabulary` (a `mlx_speech.text.vocabulary.Vocabulary`, parsed at the edge).
`check_sessions` / `checked_pairs` are the checks every batched `feed_many` / `finish_many`
makes before any session moves.

A new family adds its folder under `mlx_speech/models/`, a class with these attributes, and one
line in `mlx_speech/registry.MODELS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

from ..errors import MlxSpeechError

KIND_NAMES = {"asr": "speech-to-text", "tts": "text-to-speech", "duplex": "full-duplex",
              "vad": "voice activity detection", "diarizer": "speaker diarization"}
COMMANDS = {"asr": "use mlx_speech.transcribe", "tts": "use mlx_speech.say",
            "duplex": "use mlx_speech.chat", "vad": "give it to --vad"}
# OpenAI's realtime `transcription.delay` names, shortest first: each ASR family maps them
# onto its own latencies (`Latency.presets`)
DELAY_NAMES = ("minimal", "low", "medium", "high", "xhigh")


@dataclass(frozen=True)
class Latency:
    """A streaming ASR family's latency: its default, the values it takes, and what OpenAI's
    delay names mean for it. One name (`latency_ms`) and one table per family."""

    what: str  # how an error names the value ("delay", "Nemotron's latency")
    default_ms: int
    presets: Mapping[str, int]  # DELAY_NAMES -> ms
    choices_ms: tuple[int, ...] | None = None  # the modes; None: any multiple of step_ms
    step_ms: int = 80  # in [step_ms, max_ms]
    max_ms: int = 0

    def __post_init__(self):
        if tuple(self.presets) != DELAY_NAMES:
            raise ValueError(f"presets must name {DELAY_NAMES}")
        for ms in (self.default_ms, *self.presets.values()):
            self.check(ms)

    def check(self, ms) -> int:
        """`ms` when the family takes it; else MlxSpeechError stating the family's rule."""
        ok = isinstance(ms, int) and not isinstance(ms, bool)
        if self.choices_ms is not None:
            if not (ok and ms in self.choices_ms):
                known = ", ".join(str(k) for k in sorted(self.choices_ms))
                raise MlxSpeechError(f"{self.what} is one of {known} ms, got {ms}")
        elif not (ok and ms % self.step_ms == 0 and self.step_ms <= ms <= self.max_ms):
            raise MlxSpeechError(f"{self.what} must be a multiple of {self.step_ms} ms between "
                                 f"{self.step_ms} and {self.max_ms}, got {ms}")
        return ms

    def preset(self, name: str) -> int:
        """The latency OpenAI's delay `name` stands for in this family."""
        if name not in self.presets:
            raise MlxSpeechError(f"delay must be one of {', '.join(DELAY_NAMES)}, got {name!r}")
        return self.presets[name]

    def values(self) -> tuple[int, ...]:
        """The values a settings menu offers: the modes, or the presets' distinct values."""
        if self.choices_ms is not None:
            return tuple(sorted(self.choices_ms))
        return tuple(sorted(set(self.presets.values())))


def parameter_bytes(modules: Iterable) -> int:
    """Bytes of the parameters of MLX modules (a model's `weight_bytes`)."""
    from mlx.utils import tree_flatten

    return sum(v.nbytes for m in modules for _, v in tree_flatten(m.parameters()))


class SpeechModel(Protocol):
    """What every loaded model is (see the module docstring)."""

    kind: ClassVar[str]
    family: ClassVar[str]
    name: ClassVar[str]

    @property
    def sample_rate(self) -> int: ...

    def session(self, **options): ...

    def weight_bytes(self) -> int: ...


class ASRModel(SpeechModel, Protocol):
    latency: Latency
    languages: tuple[str, ...] | None
    spoken: ClassVar[tuple[str, ...]]

    def transcribe(self, audio, sample_rate: int = 16000, **options): ...

    def feed_many(self, pairs) -> list[str]: ...

    def finish_many(self, sessions) -> list[str]: ...


class TTSModel(SpeechModel, Protocol):
    @property
    def voices(self) -> list[str]: ...

    def generate(self, text: str, **options): ...

    def stream(self, text: str, **options): ...


class DuplexModel(SpeechModel, Protocol):
    @property
    def frame_size(self) -> int: ...

    @property
    def voices(self) -> list[str]: ...

    @property
    def roles(self) -> bool: ...


class DiarizerModel(SpeechModel, Protocol):
    @property
    def n_speakers(self) -> int: ...

    def feed_many(self, pairs) -> list: ...

    def finish_many(self, sessions) -> list: ...


def check_sessions(owner, sessions) -> None:
    """A batched call's sessions (`feed_many`, `finish_many`): every one `owner`'s, none listed
    twice."""
    seen = set()
    for s in sessions:
        if getattr(s, "owner", None) is not owner:
            raise MlxSpeechError("a session belongs to another model")
        if id(s) in seen:
            raise MlxSpeechError("a session may appear only once per call")
        seen.add(id(s))


def checked_pairs(owner, pairs) -> tuple[list, list]:
    """A batched feed's `[(session, chunk)]` checked before any session is fed: the sessions
    (`check_sessions`, none finished) and their chunks as float32 mono numpy arrays."""
    from ..audio.io import check_audio  # numpy: front doors read this module before any load

    sessions = [s for s, _ in pairs]
    check_sessions(owner, sessions)
    for s in sessions:
        if s.finished:
            raise MlxSpeechError("session already finished; start a new one")
    return sessions, [check_audio(c) for _, c in pairs]
