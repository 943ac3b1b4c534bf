"""The app's settings: a dataclass persisted as JSON in the platform's config folder."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from mlx_speech.errors import optional
from mlx_speech.text.vocabulary import MAX_PHRASE_CHARS, MAX_PHRASES, Vocabulary

DEFAULT_ASR = "mistralai/Voxtral-Mini-4B-Realtime-2602"
DEFAULT_TTS = "mistralai/Voxtral-4B-TTS-2603"

# (hub id, menu label[, model type]): the model pickers; quantized builds where they are
# published. A speech model's type (mlx_speech.registry) is known before any download
ASR_MODELS = (
    (DEFAULT_ASR, "Voxtral Realtime (bf16)", "voxtral_realtime"),
    ("mlx-community/Voxtral-Mini-4B-Realtime-2602-4bit", "Voxtral Realtime 4-bit",
     "voxtral_realtime"),
    ("mlx-community/Voxtral-Mini-4B-Realtime-6bit", "Voxtral Realtime 6-bit", "voxtral_realtime"),
    ("nvidia/nemotron-speech-streaming-en-0.6b", "Nemotron streaming (English)",
     "nemotron_asr_streaming"),
    ("nvidia/nemotron-3.5-asr-streaming-0.6b", "Nemotron 3.5 streaming (multilingual)",
     "nemotron3_5_asr"),
)
ASR_TYPES = {mid: t for mid, _, t in ASR_MODELS}
TTS_MODELS = (
    (DEFAULT_TTS, "Voxtral TTS (bf16)"),
    ("mlx-community/Voxtral-4B-TTS-2603-mlx-4bit", "Voxtral TTS 4-bit"),
    ("mlx-community/Voxtral-4B-TTS-2603-mlx-6bit", "Voxtral TTS 6-bit"),
)
TOGGLES = ("tap", "double_tap")
UNLOAD_CHOICES = (5, 10, 30, 0)  # minutes; 0 = keep loaded
SMALL_MACHINE = 17 << 30  # bytes: a "16 GB" Mac and smaller unload idle models by default
HANDSFREE_STOP_CHOICES = (1000, 2000, 3000, 5000, 0)  # ms of silence; 0 = only a tap stops
MAX_LANGUAGE_CHARS = 32  # a language name ("de-DE", "auto"); longer ones are dropped on read
# settings files from before one latency per model kept Voxtral's as delay_ms and Nemotron's as
# latency_ms: each goes to the pickers' models of its type
OLD_LATENCY_KEYS = {"delay_ms": "voxtral_realtime", "latency_ms": "nemotron_asr_streaming"}


@dataclass
class Settings:
    asr_model: str = DEFAULT_ASR
    tts_model: str = DEFAULT_TTS
    # speech model id -> its streaming latency (ms); absent: the model's default. The menu
    # offers the loaded model's values (`model.latency.values()`)
    latency_ms: dict = field(default_factory=dict)
    # speech model id -> the language its dictation is in (a name of `model.languages`, e.g.
    # "de-DE" or "auto"), for models that take one; absent: the model's default. Files from
    # before it have none: every model its default
    language: dict = field(default_factory=dict)
    # phrases dictation should favour (names, jargon), and how strongly (phrase boosting;
    # docs/vocabulary-and-timing.md); an empty list or 0 leaves the model as it is
    vocabulary: list = field(default_factory=list)
    vocabulary_boost: float = 1.0
    voice: str | None = None  # None = the TTS model's default voice
    tts_seed: int = 0
    tts_max_frames: int | None = None
    # keys joined by "+": alt/ctrl/shift/cmd match either side, alt_r/alt_l one side; fn, esc,
    # space, f1..f12; letters and digits are the keys that type them in the current layout
    dictate_hotkey: str = "alt_r"  # right Option: hold to talk, tap for hands-free
    speak_hotkey: str = "ctrl+alt+s"
    toggle: str = "tap"  # hands-free by "tap" or "double_tap"
    hold_delay_ms: int = 250
    double_tap_ms: int = 350
    debounce_ms: int = 40
    type_max_chars: int = 80  # longer text is pasted (clipboard + Cmd-V)
    # the clipboard goes back this long after Cmd-V (more for long text): slow apps read it late
    restore_delay_ms: int = 1000
    silent_after_s: float = 4.0  # warn when the microphone gives only silence this long
    # hands-free dictation ends by itself once the speaker has been silent this long (the
    # Silero VAD); 0 = only a tap ends it
    handsfree_stop_ms: int = 2000
    # 0 = never; by default 10 on a machine with 16 GB or less (one speech model fills it)
    unload_after_min: int = field(default_factory=lambda: default_unload_after_min())
    preload_asr: bool = True
    recent_size: int = 10
    login_item: bool = False
    extra: dict = field(default_factory=dict)

    def replace(self, **changes) -> Settings:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Settings:
        """Unknown keys are dropped; a value of the wrong type falls back to the default."""
        base = cls()
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            v, default = data[f.name], getattr(base, f.name)
            if default is None or v is None:
                ok = v is None or isinstance(v, (int, str))
            elif isinstance(default, bool):
                ok = isinstance(v, bool)
            elif isinstance(default, float):
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            else:
                ok = isinstance(v, type(default)) and not isinstance(v, bool)
            if ok:
                kw[f.name] = v
        s = cls(**kw)
        if not isinstance(data.get("latency_ms"), dict):  # an older file: delay_ms, latency_ms
            s.latency_ms = _old_latencies(data, s.asr_model)
        s.latency_ms = {k: v for k, v in s.latency_ms.items() if isinstance(k, str) and _ms(v)}
        s.language = {k: v for k, v in s.language.items() if isinstance(k, str)
                      and isinstance(v, str) and 0 < len(v) <= MAX_LANGUAGE_CHARS}
        s.vocabulary = [p for p in s.vocabulary if isinstance(p, str) and p.strip()
                        and len(p) <= MAX_PHRASE_CHARS][:MAX_PHRASES]
        if not 0 <= s.vocabulary_boost <= 100:
            s.vocabulary_boost = base.vocabulary_boost
        if s.toggle not in TOGGLES:
            s.toggle = base.toggle
        return s

    def dictation_vocabulary(self) -> Vocabulary | None:
        """The vocabulary as the sessions take it (None: nothing to boost); the entries
        `from_json` kept always parse."""
        return Vocabulary.parse(self.vocabulary, self.vocabulary_boost)


def physical_memory() -> int | None:
    """This machine's memory in bytes (None when the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_unload_after_min(memory: int | None = None) -> int:
    """The idle minutes after which models unload, unless the user chose: 10 on a machine
    with 16 GB of memory or less (or that does not say), else 0 (kept loaded)."""
    memory = physical_memory() if memory is None else memory
    return 10 if memory is None or memory <= SMALL_MACHINE else 0


def _ms(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _old_latencies(data: dict, asr_model: str) -> dict:
    """An older file's Voxtral delay_ms and Nemotron latency_ms, each for the pickers' models
    of its family, and for a speech model of unknown family when it is the only one set."""
    old = {k: data[k] for k in OLD_LATENCY_KEYS if _ms(data.get(k))}
    out = {mid: old[k] for k, model_type in OLD_LATENCY_KEYS.items() if k in old
           for mid, t in ASR_TYPES.items() if t == model_type}
    if asr_model not in ASR_TYPES and len(old) == 1:
        out[asr_model] = next(iter(old.values()))
    return out


def settings_path() -> Path:
    """`$MLX_SPEECH_APP_CONFIG` if set, else app.json in the platform's config folder."""
    env = os.environ.get("MLX_SPEECH_APP_CONFIG")
    if env:
        return Path(env)
    with optional("app", "the app's settings"):
        import platformdirs

    return Path(platformdirs.user_config_dir("mlx_speech", appauthor=False)) / "app.json"


def load_settings(path: Path | None = None) -> Settings:
    """Saved settings, or the defaults when there are none or the file is unreadable."""
    path = settings_path() if path is None else path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Settings()
    return Settings.from_json(data) if isinstance(data, dict) else Settings()


def save_settings(s: Settings, path: Path | None = None) -> None:
    """Atomic write (a crash never leaves half a file)."""
    path = settings_path() if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(s.to_json(), indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def lock_path() -> Path:
    """The single-instance lock, beside the settings."""
    return settings_path().with_name("app.lock")


def log_path() -> Path:
    """`$MLX_SPEECH_APP_LOG` if set, else app.log in the platform's log folder
    (~/Library/Logs/MLX Speech on macOS)."""
    env = os.environ.get("MLX_SPEECH_APP_LOG")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_log_dir("MLX Speech", appauthor=False)) / "app.log"


def open_log(max_bytes: int = 5_000_000):
    """Send this process's stdout and stderr (Python's and C libraries') to the log file,
    keeping one older file; returns its path. For launches without a terminal, where
    both go to /dev/null and every traceback would be lost."""
    import sys

    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.stat().st_size > max_bytes:
            os.replace(path, path.with_name(path.name + ".1"))
    except OSError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream, target in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os.dup2(fd, target)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    return path
