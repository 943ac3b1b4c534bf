"""mlx_speech.app: the menu-bar app (dictation anywhere, speak selection) on the library.

The source lives in the repository's top-level `apps/menubar/` folder and installs as the
subpackage `mlx_speech.app` (pyproject's package-dir; `mlx_speech/__init__.py` maps it in a
source checkout). `import mlx_speech` never imports it.

Layers, from pure to platform:

- `gestures`, `committer`, `ports`, `settings`, `core`, `menu`, `keys`: pure Python. The `App`
  state machine takes an injected clock and an event queue; every side effect goes through a
  small port (microphone, speaker, text inserter, clipboard, selection, permissions, hotkeys,
  login item, model store). `keys` turns raw key events into hotkey events.
- `engine`: the one thread that owns MLX work (ASR sessions fed microphone blocks, TTS streams).
- `devices`: sounddevice microphone/speaker adapters (the library's `audio.devices`).
- `simulate` (`--simulate`), `preview` (`--preview DIR`, Pillow), `bundle` + `launcher` +
  `macho` (`--install-app`: MLX Speech.app; the Login Item), `instance` (one app per user),
  `doctor` (`--doctor`).
- `macos`, `mac_ui`, `mac_input`, `carbon`: the macOS layer (PyObjC: AppKit menu bar, Quartz
  event tap, NSPasteboard, Accessibility, TCC; Carbon through ctypes), imported only on darwin.
"""

from __future__ import annotations

from .core import App, Key, MenuAction
from .menu import Menu, MenuItem, present, render_text
from .ports import InsertResult
from .settings import Settings

__all__ = ["App", "InsertResult", "Key", "Menu", "MenuAction", "MenuItem", "Settings", "main",
           "present", "render_text"]


def main(argv: list[str] | None = None) -> int:
    """The `mlx_speech.app` command (see `mlx_speech.app --help`)."""
    from .cli import main as _main

    return _main(argv)
