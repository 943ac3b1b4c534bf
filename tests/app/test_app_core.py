"""The app's pure core: gestures, the never-lost / keys-down / clipboard rules, permissions,
silence, speak-selection stop, model loading and unloading, the menu model."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mlx_speech.app import present
from mlx_speech.app.committer import Committer
from mlx_speech.app.events import Final, Key, MenuAction, ModelStatus, Partial, Quit
from mlx_speech.app.gestures import GestureConfig, Gestures
from mlx_speech.app.ports import (
    SENTINEL,
    ClipboardSnapshot,
    InsertResult,
    MemoryClipboard,
    ScriptedSelection,
)
from mlx_speech.app.settings import Settings, load_settings, save_settings
from tests.app.helpers_fakes import (
    BLOCK,
    FakeSpeaker,
    FakeTTS,
    Store,
    key,
    make_app,
    pump_until,
    real_engine,
)

SOUND = np.full(BLOCK, 0.2, np.float32)
SILENCE = np.zeros(BLOCK, np.float32)


def advance(app, clock, dt):
    clock.t += dt
    app.pump()


def hold_to_talk(app, clock) -> int:
    """Hold the dictation key past the hold delay, then let go; returns the session id."""
    key(app, clock, "dictate", True)
    advance(app, clock, 0.3)
    sid = app.capture.sid
    key(app, clock, "dictate", False)
    advance(app, clock, 0.05)
    return sid


def inserted_once_ready(app, clock, events, gate, state: str) -> None:
    """Let go of the dictation key while the model is not ready: nothing is typed; once the
    gate lets the model through, the whole dictation is inserted, and the menu went through
    `state` meanwhile."""
    key(app, clock, "dictate", False, 0.5)
    advance(app, clock, 0.05)
    assert app.view().finalizing == 1 and app.ports.inserter.calls == []
    gate.set()
    pump_until(app, lambda: kinds(events, "inserted"))
    assert kinds(events, "inserted")[0]["text"] == "w0 w1 w2 w3 w4"
    assert state in states(events)


def kinds(events, kind):
    return [e for e in events if e["event"] == kind]


def states(events):
    return [e["state"] for e in events if e["event"] == "state"]


# ---------------------------------------------------------------- gestures


def test_gestures_hold_tap_double_tap_and_debounce():
    g = Gestures(GestureConfig(hold_delay=0.25, double_tap_window=0.35, debounce=0.04))
    assert g.down(0.0) == ["press"]
    assert g.down(0.05) == []  # auto-repeat
    assert g.tick(0.2) == [] and g.tick(0.26) == ["hold"]
    assert g.up(1.0) == [] and g.is_down  # not confirmed yet
    assert g.tick(1.05) == ["release"] and not g.is_down

    assert g.down(2.0) == ["press"] and g.up(2.1) == [] and g.tick(2.2) == ["tap"]
    assert g.down(2.4) == ["press"] and g.up(2.45) == [] and g.tick(2.5) == ["double_tap"]
    assert g.down(4.0) == ["press"] and g.up(4.05) == [] and g.tick(4.1) == ["tap"]
    assert g.down(5.0) == ["press"]  # too late for a double tap: a new tap
    g.up(5.05)
    assert g.tick(5.1) == ["tap"]

    # a modifier double fire (up then down within the debounce) is still one hold
    assert g.down(10.0) == ["press"]
    assert g.up(10.1) == [] and g.down(10.12) == []
    assert g.tick(10.3) == ["hold"]
    g.up(11.0)
    assert g.tick(11.01) == [] and g.tick(11.05) == ["release"]


def test_gesture_up_seen_late_is_still_a_hold():
    g = Gestures(GestureConfig(hold_delay=0.25, debounce=0.04))
    g.down(0.0)
    assert g.up(0.5) == ["hold"]  # no tick ran in between: the up says it
    assert g.tick(0.6) == ["release"]


# ---------------------------------------------------------------- dictation


def test_hold_to_talk_inserts_after_release():
    app, clock, ev = make_app()
    mic, eng = app.ports.microphone, app.engine
    key(app, clock, "dictate", True)
    assert mic.opened == 1 and eng.names()[:1] == ["begin"]
    sid = eng.calls[0][1]
    mic.push(SOUND)  # captured from the press on: the first syllable is kept
    advance(app, clock, 0.3)
    assert present(app.view()).state == "listening"
    mic.push(SOUND)
    assert len(eng.audio_blocks(sid)) == 2
    app.post(Partial(sid, "hello"))
    app.pump()
    assert kinds(ev, "partial")[-1]["text"] == "hello" and "hello" in present(app.view()).title
    key(app, clock, "dictate", False, 0.5)
    advance(app, clock, 0.05)  # the release is confirmed after the debounce
    assert mic.closed == 1 and ("finish", sid) in eng.calls
    assert present(app.view()).state == "finalizing"
    app.post(Final(sid, " hello world", 1.0))
    app.pump()
    assert app.ports.inserter.calls == [("typed", "hello world")]
    assert kinds(ev, "inserted") == [{"event": "inserted", "text": "hello world", "how": "typed"}]
    assert kinds(ev, "recent")[-1]["text"] == "hello world"
    assert states(ev)[-3:] == ["listening", "finalizing", "idle"]


def test_tap_is_hands_free_and_nothing_is_inserted_while_keys_are_down():
    app, clock, ev = make_app()
    eng = app.engine
    key(app, clock, "dictate", True)
    key(app, clock, "dictate", False, 0.1)
    advance(app, clock, 0.05)
    assert present(app.view()).state == "listening" and app.view().mode == "toggle"
    advance(app, clock, 5.0)  # hands-free keeps listening
    sid = eng.calls[0][1]
    key(app, clock, "dictate", True, 0.1)  # the next press stops
    assert ("finish", sid) in eng.calls
    app.post(Final(sid, "done", 1.0))  # the final arrives while the key is still down
    app.pump()
    advance(app, clock, 1.0)
    assert app.ports.inserter.calls == [] and kinds(ev, "inserted") == []
    key(app, clock, "dictate", False, 0.1)
    assert app.ports.inserter.calls == []  # up, but not yet confirmed (double fire guard)
    advance(app, clock, 0.05)
    assert app.ports.inserter.calls == [("typed", "done")]
    # and the stop press's release did not start a new dictation
    assert eng.names().count("begin") == 1 and app.capture is None


def test_double_tap_mode():
    app, clock, ev = make_app(Settings(toggle="double_tap", preload_asr=False))
    eng = app.engine
    key(app, clock, "dictate", True)
    key(app, clock, "dictate", False, 0.1)
    advance(app, clock, 0.05)
    first = eng.calls[0][1]
    assert ("cancel", first) in eng.calls and app.capture is None  # one tap: nothing
    key(app, clock, "dictate", True, 0.1)
    key(app, clock, "dictate", False, 0.1)
    advance(app, clock, 0.05)
    assert app.view().listening and app.view().mode == "toggle"


def test_esc_cancels_but_the_text_is_kept_in_recent():
    app, clock, ev = make_app()
    key(app, clock, "dictate", True)
    advance(app, clock, 0.3)
    sid = app.capture.sid
    key(app, clock, "esc", True)
    assert app.capture is None and ("finish", sid) in app.engine.calls
    key(app, clock, "dictate", False, 0.1)
    advance(app, clock, 0.05)
    app.post(Final(sid, "never mind", 1.0))
    app.pump()
    assert app.ports.inserter.calls == [] and kinds(ev, "inserted") == []
    assert app.recent[0].text == "never mind" and not app.recent[0].inserted
    assert "Cancelled" in str(present(app.view()).items)


def test_dictation_during_model_load_is_queued_not_lost():
    gate = threading.Event()
    holder = []
    events: list = []
    engine, models = real_engine(holder, store=Store(gate))
    app, clock, events = make_app(Settings(asr_model="asr", tts_model="tts"), engine=engine,
                                  events=events)
    holder.append(app)
    try:
        app.engine.load("asr", "asr")  # as at start-up (preload)
        pump_until(app, lambda: app.models["asr"].status == "downloading")
        assert present(app.view()).state == "downloading"
        key(app, clock, "dictate", True)
        advance(app, clock, 0.3)
        for _ in range(5):
            app.ports.microphone.push(SOUND)
        inserted_once_ready(app, clock, events, gate, "downloading")  # the model arrives
    finally:
        gate.set()
        engine.shutdown()


@pytest.mark.parametrize("silence_s", [2.0, 120.0])
def test_silence_mid_recording_stalls_nothing(silence_s):
    holder = []
    engine, models = real_engine(holder)
    events: list = []
    app, clock, events = make_app(Settings(asr_model="asr", tts_model="tts"), engine=engine,
                                  events=events)
    holder.append(app)
    mic = app.ports.microphone
    try:
        key(app, clock, "dictate", True)
        key(app, clock, "dictate", False, 0.05)
        advance(app, clock, 0.05)  # hands-free
        for _ in range(3):
            mic.push(SOUND)
            advance(app, clock, 0.08)
        for i in range(int(silence_s / 0.08)):
            mic.push(SILENCE)
            clock.t += 0.08
            if i % 25 == 0:
                app.pump()
        app.pump()
        if silence_s > app.settings.silent_after_s:
            assert present(app.view()).state == "silent_mic"  # a warning, still recording
        for _ in range(3):
            mic.push(SOUND)
            advance(app, clock, 0.08)
        assert present(app.view()).state == "listening"
        key(app, clock, "dictate", True, 0.1)
        key(app, clock, "dictate", False, 0.05)
        advance(app, clock, 0.05)
        pump_until(app, lambda: kinds(events, "inserted"))
        n = 3 + int(silence_s / 0.08)
        assert kinds(events, "inserted")[0]["text"] == f"w0 w1 w2 w{n} w{n + 1} w{n + 2}"
        assert models["asr"].sessions[0].n_samples == (n + 3) * BLOCK  # every block was fed
        assert ("silent_mic" in states(events)) == (silence_s > 4)
    finally:
        engine.shutdown()


def test_long_text_is_pasted_and_the_full_clipboard_restored_when_untouched():
    clip = MemoryClipboard()
    snap = ClipboardSnapshot(((("public.png", b"\x89PNG..."), ("public.utf8-plain-text", b"a")),
                              (("public.rtf", b"{\\rtf1 b}"),)))
    clip.restore(snap)
    app, clock, ev = make_app(Settings(type_max_chars=10, preload_asr=False), clipboard=clip)
    sid = hold_to_talk(app, clock)
    text = "a long enough dictation to paste"
    app.post(Final(sid, text, 2.0))
    app.pump()
    assert app.ports.inserter.calls == [("pasted", text)]
    assert kinds(ev, "inserted")[0]["how"] == "pasted"
    assert clip.read_text() == text  # the target app reads it now
    advance(app, clock, 0.9)
    assert clip.read_text() == text  # slow apps read it late: it stays a second
    advance(app, clock, 0.2)
    assert clip.snapshot() == snap  # every item and type is back


def test_clipboard_is_not_restored_over_something_the_user_copied():
    clip = MemoryClipboard("mine")
    app, clock, ev = make_app(Settings(type_max_chars=3, preload_asr=False), clipboard=clip)
    sid = hold_to_talk(app, clock)
    app.post(Final(sid, "pasted text", 2.0))
    app.pump()
    clip.write_text("copied meanwhile")  # another app wrote the clipboard
    advance(app, clock, 1.0)
    assert clip.read_text() == "copied meanwhile"


@pytest.mark.parametrize("result,state,words", [
    (InsertResult.FAILED, "error", "could not be inserted"),
    (InsertResult.FOCUS_CHANGED, "error", "focused app changed"),
    (InsertResult.NO_PERMISSION, "needs_permission", "Accessibility"),
])
def test_inserter_errors_surface_in_the_menu_and_the_text_stays_in_recent(result, state, words):
    app, clock, ev = make_app()
    app.ports.inserter.result = result
    sid = hold_to_talk(app, clock)
    app.post(Final(sid, "important words", 1.0))
    app.pump()
    menu = present(app.view())
    assert menu.state == state
    assert words in str(menu.items) and words in kinds(ev, "error")[-1]["message"]
    assert app.recent[0].text == "important words" and not app.recent[0].inserted
    assert any(it.id == "paste_last" for it in menu.items)
    assert kinds(ev, "inserted") == []


def test_focus_change_is_detected_before_typing():
    app, clock, ev = make_app()
    key(app, clock, "dictate", True)
    advance(app, clock, 0.3)
    sid = app.capture.sid
    app.ports.inserter.focused = "another app"
    key(app, clock, "dictate", False)
    advance(app, clock, 0.05)
    app.post(Final(sid, "for the editor", 1.0))
    app.pump()
    assert app.ports.inserter.calls == [] and present(app.view()).state == "error"
    app.post(MenuAction("paste_last"))  # the user clicks "Paste last" where it belongs
    app.pump()
    assert app.ports.inserter.calls == [("pasted", "for the editor")]


@pytest.mark.parametrize("missing", ["microphone", "accessibility"])
def test_permissions_are_checked_before_capture(missing):
    app, clock, ev = make_app(missing={missing})
    key(app, clock, "dictate", True)
    advance(app, clock, 0.5)
    assert app.ports.microphone.opened == 0 and app.engine.calls == []
    menu = present(app.view())
    assert menu.state == "needs_permission"
    btn = [it for it in menu.items if it.id == f"open_settings:{missing}"]
    assert btn
    app.post(MenuAction(btn[0].id))
    app.pump()
    assert app.ports.permissions.opened == [missing]


def test_microphone_error_surfaces():
    from mlx_speech.errors import DeviceError
    from tests.app.helpers_fakes import FakeMic

    app, clock, ev = make_app(mic=FakeMic(DeviceError("no microphone found")))
    key(app, clock, "dictate", True)
    assert present(app.view()).state == "error"
    assert kinds(ev, "error")[-1]["message"] == "no microphone found"
    assert ("cancel", 1) in app.engine.calls


# ---------------------------------------------------------------- speak selection


def test_speak_selection_plays_and_the_second_press_stops_within_a_block():
    holder = []
    tts, speaker = FakeTTS(), FakeSpeaker()
    engine, models = real_engine(holder, tts=tts, speaker=speaker)
    events: list = []
    app, clock, events = make_app(Settings(asr_model="asr", tts_model="tts"), engine=engine,
                                  events=events, selection=ScriptedSelection("Read this."))
    holder.append(app)
    try:
        key(app, clock, "speak", True)
        assert present(app.view()).state == "speaking"
        tts.gate.release()
        pump_until(app, lambda: kinds(events, "speaking"))  # first audio before the rest exists
        assert kinds(events, "speaking")[0]["text"] == "Read this." and tts.yielded == 1
        tts.gate.release()
        pump_until(app, lambda: len(speaker.written) == 2)
        key(app, clock, "speak", False)
        key(app, clock, "speak", True, 0.5)
        assert speaker.stopped_at == 2  # silenced in the key handler, not after a chunk
        for _ in range(5):
            tts.gate.release()
        pump_until(app, lambda: kinds(events, "spoken"))
        assert len(speaker.written) == 2 and speaker.closed
        assert kinds(events, "spoken")[0]["stopped"] is True
        assert present(app.view()).state == "idle"
    finally:
        engine.shutdown()


def test_speak_checks_permission_and_selection_first():
    app, clock, ev = make_app(missing={"accessibility"}, selection=ScriptedSelection("x"))
    key(app, clock, "speak", True)
    assert present(app.view()).state == "needs_permission" and app.engine.calls == []
    app, clock, ev = make_app(selection=ScriptedSelection("   "))
    key(app, clock, "speak", True)
    key(app, clock, "speak", False, 0.05)
    advance(app, clock, 0.05)
    advance(app, clock, 0.6)  # Cmd-C copied nothing either
    assert present(app.view()).state == "error" and app.engine.calls == []
    assert "nothing selected" in kinds(ev, "error")[-1]["message"]


def test_copy_fallback_waits_for_the_keys_and_keeps_the_clipboard():
    clip = MemoryClipboard("same text")
    before = clip.snapshot()
    app, clock, ev = make_app(clipboard=clip, selection=ScriptedSelection(None))
    ins = app.ports.inserter
    ins.selected, ins.mods = "same text", True  # the chord's modifiers are still held
    key(app, clock, "speak", True)
    advance(app, clock, 1.0)
    assert ins.calls == [] and app.engine.calls == []  # no Cmd-C while they are down
    ins.mods = False
    key(app, clock, "speak", False)
    advance(app, clock, 0.05)  # the chord's up is confirmed: Cmd-C, then the copy is read
    advance(app, clock, 0.05)
    # the selection equals the old clipboard: still read (the sentinel changed it first)
    assert ins.calls == [("copy", None)]
    assert [c for c in app.engine.calls if c[0] == "speak"][0][2] == "same text"
    assert clip.snapshot() == before and clip.read_text() != SENTINEL


def test_copy_fallback_with_nothing_selected_restores_and_says_so():
    clip = MemoryClipboard("mine")
    before = clip.snapshot()
    app, clock, ev = make_app(clipboard=clip, selection=ScriptedSelection(None))
    key(app, clock, "speak", True)
    key(app, clock, "speak", False, 0.05)
    advance(app, clock, 0.05)
    advance(app, clock, 0.6)  # the app never copied
    assert app.ports.inserter.calls == [("copy", None)] and app.engine.calls == []
    assert "nothing selected" in kinds(ev, "error")[-1]["message"]
    assert clip.snapshot() == before


def test_copy_fallback_gives_up_when_the_keys_stay_down():
    app, clock, ev = make_app(selection=ScriptedSelection(None))
    app.ports.inserter.mods = True
    key(app, clock, "speak", True)
    advance(app, clock, 3.5)
    assert app.ports.inserter.calls == [] and not app.busy
    assert "release the keys" in kinds(ev, "error")[-1]["message"]


# ---------------------------------------------------------------- models, settings, menu


def test_idle_unload_after_the_setting_and_never_while_busy():
    app, clock, ev = make_app(Settings(unload_after_min=10, preload_asr=False))
    app.post(ModelStatus("asr", app.settings.asr_model, "ready"))
    app.pump()
    key(app, clock, "dictate", True)
    advance(app, clock, 0.3)
    advance(app, clock, 11 * 60)  # a long hands-free... no: a held key; still busy
    assert "unload" not in app.engine.names()
    key(app, clock, "dictate", False)
    advance(app, clock, 0.05)
    app.post(Final(app.engine.calls[0][1], "ok", 1.0))
    app.pump()
    advance(app, clock, 9 * 60)
    assert "unload" not in app.engine.names()
    advance(app, clock, 61)
    assert ("unload", "asr") in app.engine.calls


class QuietGate:
    """A store whose model is on disk but slow to load: "loading" (no download) until the
    gate opens."""

    def __init__(self, gate: threading.Event):
        self.gate = gate

    def ensure(self, model_id, progress, kind=None):
        assert self.gate.wait(10)
        return model_id


def test_an_unloaded_model_reloads_on_the_hotkey_with_loading_shown_and_nothing_lost():
    """Unloaded after the idle minutes; the hotkey starts the dictation at once: the menu
    shows "loading" (and that the words are kept) while the model loads again, and the
    first dictation, spoken during the load, is inserted whole."""
    gate = threading.Event()
    gate.set()
    holder: list = []
    engine, models = real_engine(holder, store=QuietGate(gate))
    app, clock, events = make_app(Settings(asr_model="asr", tts_model="tts",
                                           unload_after_min=10), engine=engine)
    holder.append(app)
    try:
        app.engine.load("asr", "asr")
        pump_until(app, lambda: app.models["asr"].status == "ready")
        advance(app, clock, 10 * 60 + 1)
        pump_until(app, lambda: app.models["asr"].status == "unloaded")
        gate.clear()  # the reload now takes a while
        key(app, clock, "dictate", True)
        advance(app, clock, 0.3)
        for _ in range(5):
            app.ports.microphone.push(SOUND)
        pump_until(app, lambda: app.models["asr"].status == "loading")
        menu = present(app.view())
        assert menu.state == "loading" and app.view().listening
        assert "Listening: what you say is kept until the model is ready" in [
            it.title for it in menu.items]
        inserted_once_ready(app, clock, events, gate, "loading")  # the model is back
    finally:
        gate.set()
        engine.shutdown()


def test_models_unload_by_default_only_on_machines_of_16_gb_or_less():
    from mlx_speech.app.settings import default_unload_after_min

    assert [default_unload_after_min(gb << 30) for gb in (8, 16, 24, 64)] == [10, 10, 0, 0]
    assert Settings().unload_after_min == default_unload_after_min()
    assert Settings.from_json({"unload_after_min": 30}).unload_after_min == 30  # chosen: kept


def test_menu_actions_change_and_persist_settings(tmp_path):
    saved = []
    app, clock, ev = make_app(save_settings=saved.append)
    app.post(ModelStatus("asr", app.settings.asr_model, "ready"))
    app.post(MenuAction("asr_model:mlx-community/Voxtral-Mini-4B-Realtime-2602-4bit"))
    app.post(MenuAction("toggle:double_tap"))
    app.post(MenuAction("login_item"))
    app.pump()
    s = saved[-1]
    assert s.asr_model.endswith("-4bit") and s.toggle == "double_tap" and s.login_item
    assert ("load", "asr", s.asr_model) in app.engine.calls
    menu = present(app.view())
    picker = next(it for it in menu.items if it.title == "Speech model")
    assert [c.title for c in picker.children if c.checked] == ["Voxtral Realtime 4-bit"]
    save_settings(s, tmp_path / "app.json")
    assert load_settings(tmp_path / "app.json") == s


def test_settings_file_is_forgiving(tmp_path):
    p = tmp_path / "app.json"
    assert load_settings(p) == Settings()
    p.write_text('{"toggle": "triple", "hold_delay_ms": "slow", "silent_after_s": 3, '
                 '"login_item": 1, "voice": "casual_male", "future_key": 5}')
    s = load_settings(p)
    assert (s.toggle, s.hold_delay_ms, s.silent_after_s, s.login_item, s.voice) == (
        "tap", 250, 3, False, "casual_male")
    p.write_text("not json")
    assert load_settings(p) == Settings()


def test_recent_menu_paste_and_copy():
    app, clock, ev = make_app()
    app.recent.appendleft(__import__("mlx_speech.app.core", fromlist=["RecentItem"])
                          .RecentItem("older", True, "typed"))
    app.recent.appendleft(__import__("mlx_speech.app.core", fromlist=["RecentItem"])
                          .RecentItem("newest", False))
    menu = present(app.view())
    recent = next(it for it in menu.items if it.title == "Recent")
    assert [c.title for c in recent.children] == ["\u2022 newest", "older"]
    app.post(MenuAction(recent.children[1].children[1].id))  # Copy "older"
    app.pump()
    assert app.ports.clipboard.read_text() == "older"


def test_quit_finishes_a_dictation_in_flight():
    app, clock, ev = make_app()
    key(app, clock, "dictate", True)
    advance(app, clock, 0.3)
    sid = app.capture.sid
    app.post(Quit())
    app.pump()
    assert ("finish", sid) in app.engine.calls and not app.done
    app.post(Final(sid, "last words", 1.0))
    advance(app, clock, 0.1)
    assert not app.done  # the key is still down: nothing typed yet
    key(app, clock, "dictate", False)
    advance(app, clock, 0.05)
    assert app.ports.inserter.calls == [("typed", "last words")] and app.done


def test_committer_tail():
    c = Committer()
    c.add("  so the")
    c.add(" plan for next week is simple")
    assert c.text == "so the plan for next week is simple"
    assert c.committed == "so the plan for next week is" and c.forming == "simple"
    assert c.tail(20) == "\u2026next week is simple"
    assert c.tail(18) == "\u2026week is simple"  # never half a word




def test_download_progress_is_in_bytes():
    from mlx_speech.app.engine import byte_progress

    got = []
    Bar = byte_progress(lambda done, total: got.append((done, total)))
    files = Bar(total=3, unit="it")  # huggingface_hub's file counter: not bytes
    files.update(1)
    b = Bar(total=0, unit="B")
    b.total = 1000  # the hub grows the total as files start
    b.update(250)
    b.update(250)
    assert got == [(250, 1000), (500, 1000)]


def test_a_model_that_cannot_load_is_an_error_not_a_hang():
    from mlx_speech.app.engine import Engine
    from mlx_speech.errors import CheckpointError

    def load(folder):
        raise CheckpointError(f"{folder} is not a supported checkpoint")

    holder: list = []
    engine = Engine(lambda ev: holder[0].post(ev), store=Store(), load=load).start()
    events: list = []
    app, clock, events = make_app(Settings(asr_model="m"), engine=engine, events=events)
    holder.append(app)
    try:
        hold_to_talk(app, clock)
        pump_until(app, lambda: not app.busy)
        msgs = [e["message"] for e in kinds(events, "error")]
        assert "cannot load m: m is not a supported checkpoint" in msgs
        assert present(app.view()).state == "error" and app.models["asr"].status == "failed"
    finally:
        engine.shutdown()


def test_a_duplex_model_is_not_taken_for_speech_to_text():
    """A Moshi model has `.session` too; the app asks the model's kind."""
    from mlx_speech.app.engine import Engine

    class Duplex:
        kind, sample_rate, frame_size = "duplex", 24000, 1920

        def session(self, **kw):
            raise AssertionError("a duplex session was opened for dictation")

    holder: list = []
    engine = Engine(lambda ev: holder[0].post(ev), store=Store(), load=lambda f: Duplex()).start()
    app, clock, events = make_app(Settings(asr_model="kyutai/moshiko"), engine=engine,
                                  events=[])
    holder.append(app)
    try:
        hold_to_talk(app, clock)
        pump_until(app, lambda: not app.busy)
        msgs = [e["message"] for e in kinds(events, "error")]
        assert ("cannot load kyutai/moshiko: kyutai/moshiko is a full-duplex model, not "
                "speech-to-text; use mlx_speech.chat") in msgs, msgs
        assert app.models["asr"].status == "failed"
    finally:
        engine.shutdown()


def test_the_store_refuses_another_kind_before_downloading_weights(monkeypatch):
    from pathlib import Path

    import mlx_speech.hub as hub
    from mlx_speech.app.engine import HubStore
    from mlx_speech.errors import CheckpointError

    tts = Path(__file__).parents[1] / "golden" / "voxtral_tts" / "ckpt"
    with pytest.raises(CheckpointError, match="is a Voxtral TTS model, not speech-to-text; "
                                              "use mlx_speech.say"):
        HubStore().ensure(str(tts), lambda d, t: None, kind="asr")
    assert HubStore().ensure(str(tts), lambda d, t: None, kind="tts") == str(tts)
    asked = []
    monkeypatch.setattr(hub, "_download", lambda repo, p, tqdm_class=None: asked.append(p) or tts)
    with pytest.raises(CheckpointError, match="acme/tts is a Voxtral TTS model"):
        HubStore().ensure("acme/tts", lambda d, t: None, kind="asr")
    assert asked == [hub.CONFIG_FILES]  # the configs only: no weights were fetched


# ---------------------------------------------------------------- permissions, login, insertion


class Hotkeys:
    """A hotkeys port: starts only once `allowed`."""

    def __init__(self):
        self.allowed, self.on, self.starts = False, False, 0

    def start(self):
        self.starts += 1
        self.on = self.on or self.allowed
        return self.on

    def running(self):
        return self.on

    def stop(self):
        self.on = False


class Perms:
    def __init__(self, **states):
        self.states = {"input_monitoring": "denied", "accessibility": "denied",
                       "microphone": "not_determined", **states}
        self.requested, self.opened = [], []

    def state(self, kind):
        return self.states[kind]

    def request(self, kind):
        self.requested.append(kind)

    def open_settings(self, kind):
        self.opened.append(kind)


def test_permissions_are_states_asked_once_and_polled_until_granted():
    from mlx_speech.app.events import PermissionChanged

    app, clock, ev = make_app()
    hk, perms = Hotkeys(), Perms()
    app.ports.hotkeys, app.ports.permissions = hk, perms
    app.start()
    assert perms.requested == ["input_monitoring", "accessibility", "microphone"]
    assert app.view().needs == ("input_monitoring", "accessibility", "microphone")
    menu = present(app.view())
    assert menu.items[0].title == ("Permission needed: Input Monitoring, Accessibility, "
                                   "Microphone")
    app.post(MenuAction("open_settings:microphone"))  # not asked yet: the prompt again
    app.post(MenuAction("open_settings:input_monitoring"))
    app.pump()
    assert perms.requested[-1] == "microphone" and perms.opened == ["input_monitoring"]
    advance(app, clock, 2.0)
    assert perms.requested.count("accessibility") == 1  # asked once, then polled
    perms.states["microphone"] = "granted"
    app.post(PermissionChanged("microphone"))  # the prompt's answer
    app.pump()
    assert app.view().needs == ("input_monitoring", "accessibility")
    hk.allowed = True  # Input Monitoring switched on in System Settings
    perms.states.update(input_monitoring="granted", accessibility="granted")
    advance(app, clock, 1.6)
    assert hk.on and app.view().needs == () and present(app.view()).state == "idle"
    hk.on = False  # the tap died: it is restarted at the next poll
    advance(app, clock, 1.6)
    assert hk.on


def test_login_item_errors_are_shown_and_the_setting_stays():
    from mlx_speech.errors import MlxSpeechError

    class Login:
        def __init__(self):
            self.on, self.fail = False, None

        def enabled(self):
            return self.on

        def set(self, on):
            if self.fail:
                raise MlxSpeechError(self.fail)
            self.on = on
            return "ok"

    saved = []
    app, clock, ev = make_app(save_settings=saved.append)
    app.ports.login_item = li = Login()
    li.on = True  # already on (the plist exists): the menu says so at start
    app.start()
    assert app.settings.login_item
    li.fail = "launchctl not found"
    app.post(MenuAction("login_item"))
    app.pump()
    assert app.settings.login_item and li.on  # unchanged
    assert kinds(ev, "error")[-1]["message"] == ("cannot change Launch at login: "
                                                 "launchctl not found")
    li.fail = None
    app.post(MenuAction("login_item"))
    app.pump()
    assert not app.settings.login_item and not li.on and not saved[-1].login_item


@pytest.mark.parametrize("result,words", [
    (InsertResult.SECURE_INPUT, "Secure Input is on"),
    (InsertResult.NO_TARGET, "no app had the focus"),
])
def test_text_that_cannot_be_typed_stays_in_recent(result, words):
    app, clock, ev = make_app()
    app.ports.inserter.result = result
    sid = hold_to_talk(app, clock)
    app.post(Final(sid, "keep me", 1.0))
    app.pump()
    assert app.recent[0].text == "keep me" and not app.recent[0].inserted
    assert words in kinds(ev, "error")[-1]["message"] and kinds(ev, "inserted") == []


def test_insertion_waits_for_modifiers_then_gives_up_into_recent():
    app, clock, ev = make_app()
    ins = app.ports.inserter
    ins.mods = True
    sid = hold_to_talk(app, clock)
    app.post(Final(sid, "first", 1.0))
    app.pump()
    advance(app, clock, 1.0)
    assert ins.calls == []
    ins.mods = False
    advance(app, clock, 0.05)
    assert ins.calls == [("typed", "first")]
    ins.mods = True
    sid = hold_to_talk(app, clock)
    app.post(Final(sid, "second", 1.0))
    app.pump()
    advance(app, clock, 3.1)  # held too long: never typed later by surprise
    assert ins.calls == [("typed", "first")]
    assert app.recent[0].text == "second" and not app.recent[0].inserted


def test_quit_stops_speech_and_is_bounded():
    app, clock, ev = make_app(selection=ScriptedSelection("read this"))
    key(app, clock, "speak", True)
    assert app.speaking
    app.post(Quit())
    app.pump()
    sid = [c for c in app.engine.calls if c[0] == "speak"][0][1]
    assert ("stop_speaking", sid) in app.engine.calls and app.done
    app, clock, ev = make_app()
    hold_to_talk(app, clock)  # its final never comes (the model is stuck downloading)
    app.post(Quit())
    app.pump()
    advance(app, clock, 5.0)
    assert not app.done
    advance(app, clock, 3.5)
    assert app.done


def test_key_events_carry_their_own_time():
    app, clock, ev = make_app()
    t0 = clock.t
    clock.t += 0.4  # the pump ran late: both events are handled now
    app.post(Key("dictate", True, t0))
    app.post(Key("dictate", False, t0 + 0.3))
    app.pump()
    advance(app, clock, 0.05)
    assert app.capture is None and app.pending  # a hold, released: not hands-free


def test_long_titles_are_cut():
    from mlx_speech.app.core import ModelInfo, View
    from mlx_speech.app.menu import ITEM_CHARS

    v = View(Settings(), listening=True, mode="hold", partial="word " * 200,
             asr=ModelInfo("a" * 300, "failed", error="e" * 500), error=None,
             notice="n" * 300)
    menu = present(v)
    titles = []

    def walk(items):
        for it in items:
            titles.append(it.title)
            walk(it.children)
    walk(menu.items)
    assert max(len(t) for t in titles) <= ITEM_CHARS
    assert len(menu.title) <= 20 and menu.title.startswith("\u25cf \u2026")
    v = View(Settings(), error="x" * 1000)
    assert len(present(v).items[0].title) <= ITEM_CHARS


def test_speech_ended_stops_hands_free_only():
    from mlx_speech.app.events import SpeechEnded

    app, clock, ev = make_app()
    sid = hold_to_talk(app, clock) + 1
    key(app, clock, "dictate", True)
    advance(app, clock, 0.3)  # held: push-to-talk ignores a detector
    app.post(SpeechEnded(sid))
    app.pump()
    assert app.capture is not None and app.capture.sid == sid
    key(app, clock, "dictate", False)
    advance(app, clock, 0.05)
    key(app, clock, "dictate", True, 0.5)  # a tap: hands-free
    key(app, clock, "dictate", False, 0.05)
    advance(app, clock, 0.05)
    sid = app.capture.sid
    app.post(SpeechEnded(sid - 1))  # a stale one
    app.pump()
    assert app.capture is not None
    app.post(SpeechEnded(sid))
    app.pump()
    assert app.capture is None and ("finish", sid) in app.engine.calls
