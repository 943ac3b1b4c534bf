"""The app's side effects, each behind a small interface (a "port").

The core calls only these; the macOS layer, the headless simulator and the tests each provide
their own. The in-memory versions here are real implementations used by `--simulate` (a
recording inserter, a scripted selection, a clipboard in memory), not test doubles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import numpy as np


class InsertResult(str, Enum):
    OK = "ok"
    NO_PERMISSION = "no-permission"  # Accessibility is not granted: nothing was typed
    FOCUS_CHANGED = "focus-changed"  # another app/field has the focus now: nothing was typed
    FAILED = "failed"  # the platform call failed (secure input, the app refused, ...)


PERMISSIONS = ("microphone", "accessibility")


@dataclass(frozen=True)
class ClipboardSnapshot:
    """Every item on the clipboard with every type's data (not just its text)."""

    items: tuple[tuple[tuple[str, bytes], ...], ...] = ()


class Clipboard(Protocol):
    def token(self) -> int:
        """Changes whenever anything writes the clipboard (NSPasteboard.changeCount)."""

    def snapshot(self) -> ClipboardSnapshot: ...

    def restore(self, snap: ClipboardSnapshot) -> int:
        """Put a snapshot back; returns the new token."""

    def write_text(self, text: str) -> int:
        """Replace the contents with plain text; returns the new token."""

    def read_text(self) -> str | None: ...


class TextInserter(Protocol):
    def focus(self) -> object:
        """An opaque id of the focused app/field, compared before inserting."""

    def type_text(self, text: str) -> InsertResult:
        """Type unicode text into the focused field (CGEvent unicode strings)."""

    def paste(self) -> InsertResult:
        """Send Cmd-V to the focused app."""


class SelectionReader(Protocol):
    def read(self) -> str | None:
        """The selected text of the focused app, or None."""


class Permissions(Protocol):
    def granted(self, kind: str) -> bool:
        """kind: "microphone" or "accessibility"."""

    def open_settings(self, kind: str) -> None:
        """Open the System Settings pane that grants `kind`."""


class Microphone(Protocol):
    sample_rate: int

    def open(self, on_block: Callable[[np.ndarray], None]) -> None:
        """Start capturing; `on_block(float32 mono block)` runs off the audio thread.
        Raises MlxSpeechError (e.g. DeviceError) when no microphone can be opened."""

    def close(self) -> None:
        """Stop; when this returns every captured block has been passed to on_block."""


class Speaker(Protocol):
    def start(self, sample_rate: int) -> None: ...

    def write(self, samples: np.ndarray) -> bool:
        """Queue audio (may block while the queue is full); False once stopped."""

    def drain(self) -> None:
        """Wait until everything written has played (returns early once stopped)."""

    def stop(self) -> None:
        """Silence now (any thread): queued audio is dropped, writes return False."""

    def close(self) -> None: ...


class ModelStore(Protocol):
    def ensure(self, model_id: str, progress: Callable[[int, int], None]) -> str:
        """A local folder for `model_id`, downloading it first if needed;
        `progress(done_bytes, total_bytes)` while downloading."""


class Recorder(Protocol):
    def save(self, n: int, samples: np.ndarray, sample_rate: int, info: dict) -> str | None:
        """Keep the audio a dictation's session received (and its result); returns where."""


# ---------------------------------------------------------------- in-memory implementations


class MemoryClipboard:
    """A clipboard in memory with a change counter (the simulator's and the tests')."""

    def __init__(self, text: str | None = None):
        self._lock = threading.Lock()
        self._count = 0
        self._items: ClipboardSnapshot = ClipboardSnapshot()
        if text is not None:
            self.write_text(text)

    def token(self) -> int:
        return self._count

    def snapshot(self) -> ClipboardSnapshot:
        return self._items

    def restore(self, snap: ClipboardSnapshot) -> int:
        with self._lock:
            self._items = snap
            self._count += 1
            return self._count

    def write_text(self, text: str) -> int:
        return self.restore(ClipboardSnapshot(((("public.utf8-plain-text",
                                                 text.encode("utf-8")),),)))

    def read_text(self) -> str | None:
        for item in self._items.items:
            for kind, data in item:
                if kind == "public.utf8-plain-text":
                    return data.decode("utf-8")
        return None


class RecordingInserter:
    """Records what would be typed or pasted (the simulator's inserter)."""

    def __init__(self, clipboard: Clipboard | None = None):
        self.clipboard = clipboard
        self.typed: list[str] = []
        self.pasted: list[str | None] = []

    def focus(self) -> object:
        return "simulated-field"

    def type_text(self, text: str) -> InsertResult:
        self.typed.append(text)
        return InsertResult.OK

    def paste(self) -> InsertResult:
        self.pasted.append(self.clipboard.read_text() if self.clipboard else None)
        return InsertResult.OK


class ScriptedSelection:
    """Returns whatever `select TEXT` last set (the simulator's selection reader)."""

    def __init__(self, text: str | None = None):
        self.text = text

    def read(self) -> str | None:
        return self.text


class GrantedPermissions:
    def __init__(self, missing: set[str] | None = None):
        self.missing = set(missing or ())
        self.opened: list[str] = []

    def granted(self, kind: str) -> bool:
        return kind not in self.missing

    def open_settings(self, kind: str) -> None:
        self.opened.append(kind)


# ---------------------------------------------------------------- Cmd-C fallback

SENTINEL = "\u2063mlx-speech-selection-probe\u2063"


def copy_selection(clipboard: Clipboard, send_copy: Callable[[], None],
                   sleep: Callable[[float], None], timeout: float = 0.4,
                   poll: float = 0.02) -> str | None:
    """Read the selection by Cmd-C, keeping the user's clipboard.

    A sentinel is written first, so a selection equal to the old clipboard is still seen
    (an old clipboard that was left in place means "nothing copied"). The full snapshot goes
    back only if nobody but us wrote the clipboard since.
    """
    snap = clipboard.snapshot()
    mine = clipboard.write_text(SENTINEL)
    send_copy()
    text, waited = None, 0.0
    while waited < timeout:
        sleep(poll)
        waited += poll
        if clipboard.token() != mine:
            got = clipboard.read_text()
            text = None if got in (None, SENTINEL) else got
            mine = clipboard.token()
            break
    if clipboard.token() == mine:
        clipboard.restore(snap)
    return text or None


@dataclass
class Ports:
    """Everything the core touches outside itself."""

    microphone: Microphone
    inserter: TextInserter
    clipboard: Clipboard
    selection: SelectionReader
    permissions: Permissions
    recorder: Recorder | None = None
    extra: dict = field(default_factory=dict)
