"""`mlx_speech.app --simulate`: the real core, engine, library and audio devices, headless.

Hotkeys come from stdin, one command a line:

    press dictate | release dictate | tap dictate | press speak | release speak | tap speak
    select TEXT      (what the selection reader returns from now on)
    wait SECONDS     (pause reading commands)
    quit             (or end of input: finish what is in flight, then exit)

Every event is one JSON object a line on stdout, with "t" (seconds since start):

    {"event": "state", "state": NAME}        idle, loading, downloading, listening, silent_mic,
                                              finalizing, speaking, needs_permission, error
    {"event": "partial", "text": ...}        the dictation's text so far
    {"event": "inserted", "text": ..., "how": "typed" | "pasted"}
    {"event": "recent", "text": ..., "inserted": bool}
    {"event": "speaking", "text": ...}       the first audio of the selection is playing
    {"event": "spoken", "seconds": ..., "stopped": bool}
    {"event": "error", "message": ...}

Text "inserted" is recorded, not typed; the clipboard lives in memory; permissions are granted.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from .core import App
from .devices import DeviceMicrophone, DeviceSpeaker
from .engine import Engine
from .events import Key, Quit
from .ports import GrantedPermissions, MemoryClipboard, Ports, RecordingInserter, ScriptedSelection
from .settings import Settings

HOTKEYS = ("dictate", "speak")
TAP_SECONDS = 0.02


class WavRecorder:
    """--save-audio DIR: the samples each dictation's session received, as float wav, and
    its result (text, token ids) beside it as JSON."""

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def save(self, n, samples, sample_rate, info):
        import soundfile as sf

        path = self.folder / f"dictation-{n}.wav"
        sf.write(str(path), samples, sample_rate, subtype="FLOAT")
        path.with_suffix(".json").write_text(json.dumps(info), encoding="utf-8")
        return str(path)


def parse(line: str):
    """One stdin line -> ("key", name, down) | ("tap", name) | ("select", text) |
    ("wait", seconds) | ("quit",) | None for a blank line; ValueError for anything else."""
    s = line.strip()
    if not s or s.startswith("#"):
        return None
    word, _, rest = s.partition(" ")
    rest = rest.strip()
    if word in ("press", "release", "tap"):
        if rest not in HOTKEYS:
            raise ValueError(f"unknown hotkey {rest!r} (dictate or speak)")
        return ("tap", rest) if word == "tap" else ("key", rest, word == "press")
    if word == "select":
        return ("select", line.lstrip().partition(" ")[2].rstrip("\r\n"))
    if word == "wait":
        try:
            sec = float(rest)
        except ValueError:
            raise ValueError(f"wait needs seconds, got {rest!r}") from None
        if not 0 <= sec < 1e6:
            raise ValueError(f"wait needs seconds, got {rest!r}")
        return ("wait", sec)
    if word in ("quit", "exit"):
        return ("quit",)
    raise ValueError(f"unknown command {s!r}")


def run(settings: Settings, stdin=None, stdout=None, *, save_audio: str | None = None,
        mic_device=None, speaker_device=None) -> int:
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    t0 = time.monotonic()
    out_lock = threading.Lock()

    def emit(ev: dict) -> None:
        line = json.dumps({**ev, "t": round(time.monotonic() - t0, 3)}, ensure_ascii=False)
        with out_lock:
            stdout.write(line + "\n")
            stdout.flush()

    clipboard = MemoryClipboard()
    selection = ScriptedSelection()
    ports = Ports(microphone=DeviceMicrophone(mic_device),
                  inserter=RecordingInserter(clipboard), clipboard=clipboard,
                  selection=selection, permissions=GrantedPermissions(),
                  recorder=WavRecorder(save_audio) if save_audio else None)
    app_ref: list[App] = []
    engine = Engine(lambda ev: app_ref[0].post(ev),
                    speaker_factory=lambda: DeviceSpeaker(speaker_device),
                    keep_audio=bool(save_audio))
    app = App(ports, engine, settings, clock=time.monotonic, emit=emit)
    app_ref.append(app)
    engine.start()

    def read_commands() -> None:
        for line in stdin:
            try:
                cmd = parse(line)
            except ValueError as e:
                emit({"event": "error", "message": str(e)})
                continue
            if cmd is None:
                continue
            if cmd[0] == "key":
                app.post(Key(cmd[1], cmd[2]))
            elif cmd[0] == "tap":
                app.post(Key(cmd[1], True))
                time.sleep(TAP_SECONDS)
                app.post(Key(cmd[1], False))
            elif cmd[0] == "select":
                selection.text = cmd[1]
            elif cmd[0] == "wait":
                time.sleep(cmd[1])
            elif cmd[0] == "quit":
                break
        app.post(Quit())

    reader = threading.Thread(target=read_commands, name="stdin", daemon=True)
    app.start()
    reader.start()
    try:
        while not app.done:
            app.pump(timeout=app.wait_time())
    except KeyboardInterrupt:
        pass
    finally:
        if app.speaking:
            engine.stop_speaking(app.speaking[0])
        ports.microphone.close()
        engine.shutdown()
        app.pump()  # report what the engine said on its way out (e.g. a failed load)
    return 0
