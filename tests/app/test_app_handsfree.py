"""Hands-free dictation ends by itself after a configurable silence (the real Silero VAD on
espeak-ng speech in noise); push-to-talk and the "never" setting ignore it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from mlx_speech.app import present
from mlx_speech.app.engine import Engine
from mlx_speech.app.events import Key, MenuAction
from mlx_speech.app.settings import Settings
from tests.app.helpers_fakes import BLOCK, FakeASR, Store, make_app
from tests.support.turns_audio import RATE, scene, silero


@pytest.fixture(scope="module")
def vad():
    return silero()


def _tap(app, clock):
    for down, dt in ((True, 0.0), (False, 0.05)):
        clock.t += dt
        app.post(Key("dictate", down))
        app.pump()
    clock.t += 0.5  # past the double-tap window: a single tap, hands-free
    app.pump()


def _hold(app, clock):
    app.post(Key("dictate", True))
    app.pump()
    clock.t += 0.3
    app.pump()


def _run(vad_loader, settings: Settings, audio: np.ndarray, hold: bool = False):
    """Dictate `audio` block by block (each block waits for the engine); returns the time (s of
    audio) at which the dictation ended by itself, or None, and the app."""
    holder: list = []
    engine = Engine(lambda ev: holder[0].post(ev), store=Store(),
                    load=lambda folder: FakeASR(), vad=vad_loader).start()
    app, clock, _ = make_app(settings, engine=engine)
    holder.append(app)
    try:
        (_hold if hold else _tap)(app, clock)
        c = app.capture
        assert c is not None and c.mode == ("hold" if hold else "toggle")
        for i in range(0, len(audio) - BLOCK + 1, BLOCK):
            app.ports.microphone.push(audio[i:i + BLOCK])
            deadline = time.monotonic() + 10
            while not engine.idle() and time.monotonic() < deadline:
                time.sleep(0.002)
            app.pump(timeout=0.01)
            app.pump(timeout=0.0)
            if app.capture is None:
                return (i + BLOCK) / RATE, app
        return None, app
    finally:
        engine.shutdown()


def test_hands_free_stops_after_the_silence(vad):
    audio, spans = scene(("please", "go"), lead_s=0.5, gap_s=1.0, tail_s=3.0)
    silence_s = 2.0
    ended, app = _run(lambda: vad, Settings(preload_asr=False, handsfree_stop_ms=2000), audio)
    # the 1 s pause between phrases does not end it; 2 s after the last phrase does
    assert ended is not None, "hands-free never stopped"
    offset = spans[-1][1]
    # Silero's probability lingers for 100-250 ms after the last sound; a block is 80 ms
    assert offset + silence_s <= ended <= offset + silence_s + 0.5, (ended, spans)
    assert present(app.view()).state != "listening"


def test_never_means_only_a_tap_stops_it(vad):
    audio, _ = scene(("please",), lead_s=0.5, tail_s=3.0)
    ended, app = _run(lambda: vad, Settings(preload_asr=False, handsfree_stop_ms=0), audio)
    assert ended is None and app.capture is not None


def test_push_to_talk_is_not_stopped_by_silence(vad):
    audio, _ = scene(("please",), lead_s=0.5, tail_s=3.0)
    ended, app = _run(lambda: vad, Settings(preload_asr=False, handsfree_stop_ms=1000), audio,
                      hold=True)
    assert ended is None and app.capture is not None and app.capture.mode == "hold"


def test_without_a_vad_hands_free_goes_on_and_says_why(capsys):
    def missing():
        from mlx_speech.errors import CheckpointError

        raise CheckpointError("no Silero VAD weights found")

    audio, _ = scene(("please",), lead_s=0.5, tail_s=2.5)
    ended, app = _run(missing, Settings(preload_asr=False, handsfree_stop_ms=1000), audio)
    assert ended is None and app.capture is not None
    err = capsys.readouterr().err
    assert err.count("hands-free dictation stops only on a tap") == 1, err


def test_the_silence_is_a_menu_setting():
    app, _, _ = make_app(Settings(preload_asr=False))
    assert app.settings.handsfree_stop_ms == 2000

    def item(title):
        for top in present(app.view()).items:
            for group in top.children or ():
                if group.title == "Hands-free stops after silence":
                    return [c for c in group.children if c.title == title][0]
        raise AssertionError("no hands-free silence menu")

    assert item("2 s").checked and not item("never (tap to stop)").checked
    app.post(MenuAction(item("5 s").id))
    app.pump()
    assert app.settings.handsfree_stop_ms == 5000 and item("5 s").checked
    app.post(MenuAction(item("never (tap to stop)").id))
    app.pump()
    assert app.settings.handsfree_stop_ms == 0
