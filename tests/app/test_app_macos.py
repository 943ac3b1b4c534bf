"""The macOS layer (`mlx_speech.app.macos`) running on a fake Mac (tests/app/helpers_macos.py): the
real core, engine thread and menu code, with AppKit/Quartz/HIServices/AVFoundation/Carbon
standing in. What a first run on a Mac meets: threads, permissions, one instance, the Login
Item, the menu over hours, insertion with keys held, Secure Input, quitting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from mlx_speech.app.engine import Engine
from mlx_speech.app.events import Partial
from mlx_speech.app.settings import Settings
from tests.app.helpers_fakes import BLOCK, FakeASR, FakeMic, FakeSpeaker, FakeTTS, Store
from tests.app.helpers_macos import (
    COMMAND,
    DVORAK,
    TargetApp,
    World,
    install,
    run_app,
    wait_exit,
    wait_until,
)

ALT_R, ALT_L, CTRL, SHIFT_L, KEY_S = 61, 58, 59, 56, 1
SOUND = np.full(BLOCK, 0.2, np.float32)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MLX_SPEECH_APP_CONFIG", str(tmp_path / "config" / "app.json"))
    monkeypatch.setenv("MLX_SPEECH_APP_LOG", str(tmp_path / "Logs" / "app.log"))
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    yield tmp_path
    for s, h in saved.items():
        signal.signal(s, h)


class ScriptedASR(FakeASR):
    """FakeASR whose sessions end with `text` (what the user "said")."""

    text = ""

    def session(self, **kw):
        s = super().session(**kw)
        s.result = lambda: type("R", (), {"text": self.text, "token_ids": ()})()
        return s


class Launch:
    """The app as `macos.run` builds it, with fake devices and models behind the engine."""

    def __init__(self, world: World, monkeypatch, settings=None, store=None, tts=None):
        install(monkeypatch, world)
        world.user_front = world.front
        from mlx_speech.app import macos

        self.world, self.macos = world, macos
        self.settings = settings or Settings(asr_model="asr", tts_model="tts",
                                             preload_asr=False)
        self.mic, self.speaker = FakeMic(), FakeSpeaker()
        self.asr, self.tts = ScriptedASR(), tts or FakeTTS(chunks=3, gated=False)
        self.store = store or Store()
        self.apps: list = []
        self.engines: list[Engine] = []
        self.logs: list = []
        self.cleared: list[str] = []
        launch = self

        def engine(emit, speaker_factory=None, **kw):
            e = Engine(emit, store=launch.store, load=lambda f: {"asr": launch.asr,
                                                                 "tts": launch.tts}[f],
                       speaker_factory=lambda: launch.speaker)
            launch.engines.append(e)
            return e

        class App(macos.App):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                launch.apps.append(self)

        monkeypatch.setattr(macos, "Engine", engine)
        monkeypatch.setattr(macos, "App", App)
        monkeypatch.setattr(macos, "DeviceMicrophone", lambda *a, **k: launch.mic)
        monkeypatch.setattr(macos, "DeviceSpeaker", lambda *a, **k: launch.speaker)
        from mlx_speech.app import settings as settings_mod

        if hasattr(settings_mod, "open_log"):  # stdout/stderr stay pytest's
            monkeypatch.setattr(settings_mod, "open_log", lambda: self.logs.append(1))
        import mlx.core as mx

        real = mx.clear_streams

        def clear_streams():
            self.cleared.append(threading.current_thread().name)
            real()

        monkeypatch.setattr(mx, "clear_streams", clear_streams)
        world.on_exit = lambda: {"cleared": list(self.cleared)}

    @property
    def app(self):
        return self.apps[0]

    def run(self, script):
        """Run the app with `script` acting once its menu is up, then quit it (unless the
        script did)."""
        def act(w):
            started(w)
            script(w)
            if w.exited is None:
                w.click("Quit")
                wait_exit(w)
        return run_app(self.world, lambda: self.macos.run(self.settings), act)


def started(w: World) -> None:
    wait_until(w, lambda: w.menu() is not None and w.titles())
    w.front = w.user_front  # the user's editor has the focus


def dictate(w: World, launch: Launch, text: str, key: int = ALT_R) -> None:
    """Hold the key, speak three blocks, let go: the session's text is `text`."""
    launch.asr.text = text
    w.key(key, True)
    w.advance(0.3)
    for _ in range(3):
        launch.mic.push(SOUND)
    w.advance(0.05)
    w.key(key, False)
    w.advance(0.1)


# ---------------------------------------------------------------- threads


def test_every_appkit_and_text_input_call_is_on_the_main_thread(home, monkeypatch):
    w = World()
    w.front = TargetApp(selection="Read this aloud.", ax=False)  # no AX: the Cmd-C fallback
    launch = Launch(w, monkeypatch)

    def script(w):
        dictate(w, launch, "hello there")
        wait_until(w, lambda: "hello there" in w.front.text)
        assert w.off_main == [], f"AppKit/TIS off the main thread: {w.off_main[:5]}"
        w.keys([(CTRL, True, None), (ALT_L, True, None), (KEY_S, True, None)])
        w.advance(0.1)
        w.keys([(KEY_S, False, None), (ALT_L, False, None), (CTRL, False, None)])
        wait_until(w, lambda: len(launch.speaker.written) == 3)

    launch.run(script)
    assert w.front.text == "hello there"
    assert launch.speaker.written, "the selection was not spoken"
    assert w.counts["Carbon.UCKeyTranslate"] > 0  # the layout was read (for the hotkeys)
    assert w.off_main == [], f"AppKit/TIS off the main thread: {w.off_main[:5]}"


# ---------------------------------------------------------------- permissions


def test_missing_permissions_show_and_the_tap_starts_when_granted(home, monkeypatch):
    w = World(ax=False, listen=False, mic=0)
    launch = Launch(w, monkeypatch)
    seen = {}

    def script(w):
        seen["prompts"] = sorted(w.prompts)
        seen["titles"] = w.titles()
        seen["icon"] = w.status_item().button().title()
        w.click("Open Input Monitoring settings")
        w.key(ALT_R, True)  # nothing listens yet
        w.advance(0.4)
        w.key(ALT_R, False)
        seen["listening_before"] = w.on_main(lambda: launch.app.capture is not None)
        w.listen_access = w.ax_trusted = True  # the user switches them on in Settings
        w.answer_mic(True)
        w.advance(2.0)
        seen["after"] = w.titles()
        w.key(ALT_R, True)
        w.advance(0.4)
        seen["listening_after"] = w.on_main(lambda: launch.app.view().listening)
        w.key(ALT_R, False)

    launch.run(script)
    assert seen["prompts"] == ["accessibility", "input_monitoring", "microphone"]
    assert seen["icon"].startswith("!")
    assert seen["titles"][0] == ("Permission needed: Input Monitoring, Accessibility, "
                                 "Microphone")
    for pane in ("Input Monitoring", "Accessibility", "Microphone"):
        assert f"Open {pane} settings\u2026" in seen["titles"]
    assert w.opened == [
        "x-apple.systempreferences:com.apple.preference.security?Privacy_ListenEvent"]
    assert seen["listening_before"] is False
    assert not any(t.startswith("Permission needed") for t in seen["after"])
    assert seen["listening_after"] is True  # the tap started once the grant arrived


def test_microphone_is_asked_before_the_first_dictation(home, monkeypatch):
    w = World(mic=0)
    launch = Launch(w, monkeypatch)
    seen = {}

    def script(w):
        seen["asked_at_start"] = "microphone" in w.prompts
        w.key(ALT_R, True)
        w.advance(0.4)
        w.key(ALT_R, False)
        seen["opened_while_asking"] = launch.mic.opened
        w.answer_mic(True)
        w.advance(0.2)
        w.key(ALT_R, True)
        w.advance(0.4)
        seen["opened_after"] = launch.mic.opened
        w.key(ALT_R, False)

    launch.run(script)
    assert seen == {"asked_at_start": True, "opened_while_asking": 0, "opened_after": 1}


# ---------------------------------------------------------------- lifecycle


def test_a_second_instance_does_not_start(home, monkeypatch):
    lock = home / "config" / "app.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, signal
        fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, str(os.getpid()).encode())
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
        print("ready", flush=True)
        if signal.sigtimedwait([signal.SIGUSR1], 30) is not None:
            print("menu shown", flush=True)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        w = World()
        launch = Launch(w, monkeypatch)
        from mlx_speech.errors import MlxSpeechError

        with pytest.raises(MlxSpeechError, match=f"already running \\(pid {holder.pid}\\)"):
            launch.run(lambda w: None)
        assert w.nsapp is None and not launch.engines and not w.status_items
        assert holder.stdout.readline().strip() == "menu shown"  # the first one shows itself
    finally:
        holder.kill()
        holder.wait()


def test_a_second_launch_opens_the_running_apps_menu(home, monkeypatch):
    w = World()
    launch = Launch(w, monkeypatch)

    def script(w):
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            raise AssertionError("nothing handles a second launch's signal")
        os.kill(os.getpid(), signal.SIGUSR1)  # what the second launch sends
        wait_until(w, lambda: w.popped == 1)

    launch.run(script)
    assert w.popped == 1


def test_login_item_on_starts_no_second_copy(home, monkeypatch):
    bin_dir, log = home / "bin", home / "calls.log"
    bin_dir.mkdir()
    for tool in ("launchctl", "open"):  # what would start a second copy, recorded
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    exe = home / "Applications" / "MLX Speech.app" / "Contents" / "MacOS" / "MLX Speech"
    exe.parent.mkdir(parents=True)
    exe.write_bytes(b"\xcf\xfa\xed\xfe")
    w = World()
    launch = Launch(w, monkeypatch)
    seen = {}

    def script(w):
        w.click("Launch at login")
        w.advance(0.1)
        seen["on"] = (w.find("Launch at login")._state, w.titles())
        exe.unlink()  # the bundle was deleted: switching it on again must say why not
        w.click("Launch at login")
        w.advance(0.1)
        w.click("Launch at login")
        w.advance(0.1)
        seen["failed"] = (w.find("Launch at login")._state, w.titles())

    launch.run(script)
    plist = home / "Library" / "LaunchAgents" / "io.github.mlx-realtime-speech.menubar.plist"
    calls = log.read_text().splitlines() if log.exists() else []
    started_now = [c for c in calls if c.startswith(("launchctl bootstrap", "open"))]
    assert started_now == [], f"a second copy was started: {started_now}"
    state, titles = seen["on"]
    assert state == 1 and "Launch at login: on, from your next login" in titles
    state, titles = seen["failed"]
    assert state == 0 and not plist.exists()
    assert any(t.startswith("Error: cannot change Launch at login: no ") for t in titles)


def test_quit_joins_the_engine_before_exit(home, monkeypatch):
    class SlowStore:  # a 30 s download: quitting must not wait for it, nor leave it running
        def ensure(self, model_id, progress, kind=None):
            for i in range(3000):
                progress(i, 3000)
                time.sleep(0.01)
            return model_id

    w = World()
    launch = Launch(w, monkeypatch, Settings(asr_model="asr", tts_model="tts"),
                    store=SlowStore())

    def script(w):
        wait_until(w, lambda: launch.app.models["asr"].status == "downloading")

    t0 = time.perf_counter()
    launch.run(script)
    assert "mlx-engine" not in w.exited["threads"]  # joined before the process exits
    assert w.exited["cleared"] == ["mlx-engine"]  # MLX freed on its own thread
    assert time.perf_counter() - t0 < 20


def test_quit_stops_speech_at_once(home, monkeypatch):
    w = World()
    w.front = TargetApp(selection="A long text to read.")
    tts = FakeTTS(chunks=6, gated=True)  # each chunk waits for the test to release it
    launch = Launch(w, monkeypatch, tts=tts)

    def script(w):
        w.keys([(CTRL, True, None), (ALT_L, True, None), (KEY_S, True, None)])
        w.keys([(KEY_S, False, None), (ALT_L, False, None), (CTRL, False, None)])
        tts.gate.release()
        wait_until(w, lambda: len(launch.speaker.written) == 1)
        w.click("Quit")
        for _ in range(6):  # generation goes on (slowly) meanwhile
            tts.gate.release()
        wait_exit(w)

    launch.run(script)
    assert launch.speaker.stopped_at == 1  # silenced at Quit: nothing more was played
    assert "mlx-engine" not in w.exited["threads"]


# ---------------------------------------------------------------- the menu


def test_ten_thousand_partials_leave_the_menu_items_flat(home, monkeypatch):
    w = World()
    launch = Launch(w, monkeypatch)
    counts = []

    def script(w):
        w.key(ALT_R, True)
        w.advance(0.3)
        sid = w.on_main(lambda: launch.app.capture.sid)

        def partials(n):
            for i in range(n):
                launch.app.post(Partial(sid, f" w{i % 10}"))
                w.advance(0.05)  # one pump and one menu update per partial
        for n in (100, 900, 9000):
            w.on_main(lambda n=n: partials(n), timeout=300)
            counts.append(w.live_menu_items())
            assert counts[-1] == counts[0], counts  # fail early on a leak
        w.key(ALT_R, False)

    launch.run(script)
    assert counts[0] == counts[-1] and counts[0] < 100
    assert len(w.status_item().button().title()) <= 20  # glyph + a short tail


# ---------------------------------------------------------------- insertion


def test_cmd_c_waits_for_the_chord_to_be_released(home, monkeypatch):
    w = World()
    w.front = TargetApp(selection="Read me.", ax=False)
    launch = Launch(w, monkeypatch)
    seen = {}

    def script(w):
        w.keys([(CTRL, True, None), (ALT_L, True, None), (KEY_S, True, None)])
        w.advance(0.5)
        seen["posted_while_held"] = len(w.posted)
        w.keys([(KEY_S, False, None), (ALT_L, False, None), (CTRL, False, None)])
        wait_until(w, lambda: launch.speaker.written)

    launch.run(script)
    assert seen["posted_while_held"] == 0
    assert [flags for _, flags in w.posted] == [COMMAND, COMMAND]  # Cmd-C, nothing more
    assert w.front.shortcuts == []


@pytest.mark.parametrize("layout", ["us", "dvorak"])
def test_cmd_v_after_the_modifiers_are_up_on_the_users_layout(home, monkeypatch, layout):
    w = World(layout=DVORAK if layout == "dvorak" else None)
    w.pb.set_items([{"public.utf8-plain-text": b"my clipboard"}])
    text = "a dictation long enough to be pasted, not typed"
    launch = Launch(w, monkeypatch, Settings(asr_model="asr", tts_model="tts",
                                             preload_asr=False, type_max_chars=10))
    seen = {}

    def script(w):
        w.key(SHIFT_L, True)  # the user holds Shift for their next word
        dictate(w, launch, text)
        w.advance(0.5)
        seen["while_held"] = (w.front.text, len(w.posted))
        w.key(SHIFT_L, False)
        wait_until(w, lambda: text in w.front.text)
        w.advance(3.0)  # the restore

    launch.run(script)
    assert seen["while_held"] == ("", 0)
    assert w.front.text == text and w.front.shortcuts == []
    assert all(flags == COMMAND for _, flags in w.posted)
    assert w.pb.string() == "my clipboard"  # put back


def test_secure_input_keeps_the_text_in_recent(home, monkeypatch):
    w = World()
    launch = Launch(w, monkeypatch)
    seen = {}

    def script(w):
        w.secure_input = True  # a password field has the focus
        dictate(w, launch, "my secret words")
        wait_until(w, lambda: launch.app.recent)
        seen["recent"] = w.on_main(lambda: launch.app.recent[0])
        seen["titles"] = w.titles()

    launch.run(script)
    assert w.front.text == "" and w.dropped == []  # nothing was even sent
    assert seen["recent"].text == "my secret words" and not seen["recent"].inserted
    assert any("Secure Input is on" in t for t in seen["titles"])


def test_key_times_come_from_the_events(home, monkeypatch):
    """A 300 ms hold whose press and release reach the app together (a busy main thread)
    is still push-to-talk, not a tap into hands-free mode."""
    w = World()
    launch = Launch(w, monkeypatch)
    seen = {}

    def script(w):
        t0 = w.monotonic()
        w.on_main(lambda: setattr(w, "t_ns", w.t_ns + 350_000_000))  # no timer ran
        w.keys([(ALT_R, True, t0), (ALT_R, False, t0 + 0.3)])
        w.advance(0.1)
        seen["listening"] = w.on_main(lambda: launch.app.capture is not None)

    launch.run(script)
    assert seen["listening"] is False  # released after a hold: not hands-free


def test_left_and_right_option_are_told_apart(home, monkeypatch):
    w = World()
    launch = Launch(w, monkeypatch)

    def script(w):
        w.key(ALT_L, True)  # left Option held (e.g. typing a special character)
        dictate(w, launch, "both options")
        w.advance(0.3)
        w.key(ALT_L, False)
        wait_until(w, lambda: "both options" in w.front.text)

    launch.run(script)
    assert w.front.text == "both options"


def test_no_dock_icon_no_focus_stolen_no_app_nap_while_listening(home, monkeypatch):
    w = World()
    launch = Launch(w, monkeypatch)
    seen = {}

    def script(w):
        seen["front"] = w.front
        w.key(ALT_R, True)
        w.advance(0.3)
        seen["activity"] = list(w.activity)
        w.key(ALT_R, False)
        wait_until(w, lambda: not launch.app.busy)
        w.advance(0.1)

    launch.run(script)
    assert w.policy == 1 and w.activations == 0  # accessory; never activated
    assert seen["activity"] and seen["activity"][0][0] == "begin"
    assert seen["activity"][0][1] & 0xFF00000000  # latency critical: no App Nap
    assert w.activity[-1][0] == "end"
    assert ("system", 0.5) in w.ax_timeouts  # AX calls cannot block the UI for seconds
    assert launch.logs == [1]  # output goes to the log folder (no terminal)


def test_our_own_app_in_front_keeps_the_text_in_recent(home, monkeypatch):
    w = World()
    launch = Launch(w, monkeypatch)
    seen = {}

    def script(w):
        w.front = None  # MLX Speech itself is frontmost
        dictate(w, launch, "for nobody")
        wait_until(w, lambda: launch.app.recent)
        seen["recent"] = w.on_main(lambda: launch.app.recent[0])

    launch.run(script)
    assert not seen["recent"].inserted and w.posted == []


# ---------------------------------------------------------------- platform pieces


def test_typed_text_carries_no_modifier_flags(home, monkeypatch):
    w = World()
    install(monkeypatch, w)
    from mlx_speech.app import macos

    w.hid_flags = COMMAND  # the user still holds Command
    assert macos.MacInserter().type_text("hi \U0001F600") == macos.InsertResult.OK
    assert [ev.flags for ev, _ in w.posted] == [0, 0]
    assert [ev.unicode for ev, _ in w.posted] == ["hi \U0001F600"] * 2


def test_clipboard_snapshot_is_bounded_and_skips_concealed_items(home, monkeypatch):
    w = World()
    install(monkeypatch, w)
    from mlx_speech.app import macos

    big = 40_000_000
    w.pb.set_items([{"public.utf8-plain-text": b"caption",
                     "public.tiff": lambda: b"\0" * big, "public.png": lambda: b"\1" * 1000,
                     "dyn.ah62d4rv4gu8y": lambda: b"derived"}])
    cb = macos.MacClipboard()
    snap = cb.snapshot()
    assert dict(snap.items[0]) == {"public.utf8-plain-text": b"caption",
                                   "public.png": b"\1" * 1000}
    assert snap.dropped == 1 and w.pb.renders["dyn.ah62d4rv4gu8y"] == 0
    token = cb.write_text("dictation")
    item = w.pb.items[0]
    assert "org.nspasteboard.TransientType" in item and w.pb.options == [1]  # this Mac only
    assert cb.token() == token
    cb.write_text("for the user", transient=False)  # "Copy last": the user's own copy
    assert "org.nspasteboard.TransientType" not in w.pb.items[0] and w.pb.options[-1] == 0

    w.pb.set_items([{"public.utf8-plain-text": lambda: b"hunter2",
                     "org.nspasteboard.ConcealedType": b""}])
    assert cb.snapshot() is None and w.pb.renders["public.utf8-plain-text"] == 0


def test_doctor_reports_each_permission_and_the_tap(home, monkeypatch):
    w = World(ax=True, listen=False, mic=2)
    w.ax_trusted = False
    install(monkeypatch, w)
    from mlx_speech.app import doctor

    rows = {name: (status, detail) for name, status, detail in
            doctor.collect(darwin=True, mic_seconds=0.1)}
    assert rows["input monitoring"][0] == "FAIL" and "Input Monitoring" in rows[
        "input monitoring"][1]
    assert rows["accessibility"][0] == "FAIL"
    assert rows["microphone"] == ("FAIL", "denied: System Settings > Privacy & Security > "
                                  "Microphone: switch MLX Speech on")
    assert rows["event tap"][0] == "FAIL"
    assert rows["microphone audio"][0] == "n/a"  # not tried without the permission
    assert rows["keyboard layout"] == ("ok", "Cmd-V key 9, Cmd-C key 8")
    w.listen_access = w.ax_trusted = True
    rows = {name: status for name, status, _ in doctor.collect(darwin=True, mic_seconds=0.1)}
    assert rows["input monitoring"] == rows["accessibility"] == rows["event tap"] == "ok"
