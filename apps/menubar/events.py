"""Events into the core's queue: from hotkeys, the menu, the microphone and the engine."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Key:
    """A hotkey went down or up: name is "dictate", "speak" or "esc". For a chord, "up" comes
    when its last key is released (so "all keys up" really means that). `t` is when the key
    moved, on the core's clock (the event's own timestamp); None means "now"."""

    name: str
    down: bool
    t: float | None = None


@dataclass(frozen=True)
class MenuAction:
    """A menu click: id as in the menu model (e.g. "paste_last", "copy:0", "asr_model:ID")."""

    id: str


@dataclass(frozen=True)
class Quit:
    """Finish what is in flight (recording, transcripts, speech), then stop."""


@dataclass(frozen=True)
class PermissionChanged:
    """The answer to a permission request arrived (e.g. the microphone prompt's callback)."""

    kind: str


@dataclass(frozen=True)
class SpeechEnded:
    """A voice activity detector heard the speaker stop in dictation `sid`: a hands-free
    dictation ends as if its hotkey was tapped (push-to-talk ignores it)."""

    sid: int


@dataclass(frozen=True)
class Level:
    """One microphone block arrived for dictation `sid` (posted by the capture thread)."""

    sid: int
    rms: float


# ---- from the engine thread ----


@dataclass(frozen=True)
class ModelStatus:
    kind: str  # "asr" | "tts"
    model_id: str
    status: str  # "unloaded" | "downloading" | "loading" | "ready" | "failed"
    done: int = 0  # bytes downloaded
    total: int = 0
    error: str | None = None
    voices: tuple[str, ...] = ()
    seconds: float = 0.0  # load time once ready
    latencies: tuple[int, ...] = ()  # a speech model's latency choices (ms), once ready
    languages: tuple[str, ...] = ()  # the languages a speech model takes, once ready (or none)


@dataclass(frozen=True)
class Partial:
    sid: int
    delta: str


@dataclass(frozen=True)
class Final:
    sid: int
    text: str
    seconds: float  # audio the session received
    audio: object = field(default=None, compare=False)  # the samples, when kept
    tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class SessionFailed:
    sid: int
    message: str


@dataclass(frozen=True)
class SpeakStarted:
    """The first audio of `sid` went to the speaker."""

    sid: int


@dataclass(frozen=True)
class SpeakDone:
    sid: int
    seconds: float  # audio played (written before a stop)
    stopped: bool


@dataclass(frozen=True)
class SpeakFailed:
    sid: int
    message: str
