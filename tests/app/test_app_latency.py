"""The app's one latency setting: per speech model (model id -> ms), its menu listing the loaded
model's own choices (`model.latency.values()`), older settings files (Voxtral's delay_ms,
Nemotron's latency_ms) migrated when read, and a value the model does not take falling back to
its default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_speech.app.cli import check_latency
from mlx_speech.app.engine import _session_kwargs
from mlx_speech.app.events import MenuAction, ModelStatus
from mlx_speech.app.menu import present
from mlx_speech.app.settings import ASR_MODELS, DEFAULT_ASR, Settings, load_settings, save_settings
from mlx_speech.errors import MlxSpeechError
from tests.app.helpers_fakes import FakeASR, key, make_app, pump_until, real_engine

GOLDEN = Path(__file__).parents[1] / "golden"
NEMOTRON = "nvidia/nemotron-speech-streaming-en-0.6b"
VOXTRAL = [mid for mid, _, t in ASR_MODELS if t == "voxtral_realtime"]


def test_older_settings_files_are_migrated(tmp_path):
    p = tmp_path / "app.json"
    p.write_text(json.dumps({"delay_ms": 960, "latency_ms": 160}))
    s = load_settings(p)
    assert s.latency_ms == {**dict.fromkeys(VOXTRAL, 960), NEMOTRON: 160}
    assert len(VOXTRAL) == 3 and DEFAULT_ASR in VOXTRAL
    # a speech model of unknown family takes the one value set; two would be a guess
    p.write_text(json.dumps({"asr_model": "me/custom", "latency_ms": 560, "delay_ms": None}))
    assert load_settings(p).latency_ms == {NEMOTRON: 560, "me/custom": 560}
    p.write_text(json.dumps({"asr_model": "me/custom", "latency_ms": 560, "delay_ms": 480}))
    assert "me/custom" not in load_settings(p).latency_ms
    p.write_text(json.dumps({"delay_ms": "slow", "latency_ms": True}))
    assert load_settings(p).latency_ms == {}
    # the new form round-trips; bad entries are dropped
    save_settings(Settings(latency_ms={DEFAULT_ASR: 240}), p)
    assert load_settings(p).latency_ms == {DEFAULT_ASR: 240}
    p.write_text(json.dumps({"latency_ms": {DEFAULT_ASR: 240, "x": -80, "y": "1", "z": True}}))
    assert load_settings(p).latency_ms == {DEFAULT_ASR: 240}


def _latency_menu(app):
    settings = next(it for it in present(app.view()).items if it.title == "Settings")
    menu = next(it for it in settings.children if it.title == "Latency")
    return [(c.title, c.id, c.checked) for c in menu.children]


def test_menu_lists_the_loaded_models_latencies_and_sets_one_per_model():
    saved = []
    app, clock, ev = make_app(Settings(preload_asr=False), save_settings=saved.append)
    assert _latency_menu(app) == [("Model default", "latency_ms:", True)]  # not loaded yet
    app.post(ModelStatus("asr", app.settings.asr_model, "ready", latencies=(240, 480, 960)))
    app.pump()
    assert _latency_menu(app) == [("Model default", "latency_ms:", True),
                                  ("240 ms", "latency_ms:240", False),
                                  ("480 ms", "latency_ms:480", False),
                                  ("960 ms", "latency_ms:960", False)]
    app.post(MenuAction("latency_ms:960"))
    app.pump()
    assert saved[-1].latency_ms == {DEFAULT_ASR: 960}
    assert [t for t, _, c in _latency_menu(app) if c] == ["960 ms"]
    app.post(MenuAction(f"asr_model:{NEMOTRON}"))  # another model: its own (default) latency
    app.post(MenuAction("latency_ms:160"))
    app.pump()
    assert saved[-1].latency_ms == {DEFAULT_ASR: 960, NEMOTRON: 160}
    assert _latency_menu(app) == [("Model default", "latency_ms:", False),
                                  ("160 ms", "latency_ms:160", True)]  # until it loads
    key(app, clock, "dictate", True)
    begin = next(c for c in app.engine.calls if c[0] == "begin")
    assert begin[2] == NEMOTRON and begin[3]["latency_ms"] == 160
    app.post(MenuAction("latency_ms:"))
    app.pump()
    assert saved[-1].latency_ms == {DEFAULT_ASR: 960}


def test_engine_reports_the_models_latencies_and_checks_the_setting(capsys):
    holder: list = []
    eng, models = real_engine(holder)
    app, clock, ev = make_app(Settings(asr_model="asr", tts_model="tts"), engine=eng)
    holder.append(app)
    try:
        pump_until(app, lambda: app.view().asr.status == "ready")
        assert app.view().asr.latencies == (80, 160, 560, 1120) == FakeASR.latency.values()
    finally:
        eng.shutdown()
    asr = FakeASR()
    assert _session_kwargs(asr, {"latency_ms": 560}) == {"latency_ms": 560}
    assert _session_kwargs(asr, {"latency_ms": 480}) == {}  # not one of its modes: default
    assert "one of 80, 160, 560, 1120 ms, got 480" in capsys.readouterr().err


def test_cli_latency_is_checked_against_the_speech_model():
    assert check_latency(DEFAULT_ASR, 960) == 960
    assert check_latency(NEMOTRON, 560) == 560
    with pytest.raises(MlxSpeechError, match="one of 80, 160, 560, 1120"):
        check_latency(NEMOTRON, 480)
    assert check_latency(str(GOLDEN / "nemotron"), 160) == 160  # a folder: its config says
    with pytest.raises(MlxSpeechError, match="one of 80, 160, 560, 1120"):
        check_latency(str(GOLDEN / "nemotron"), 240)
    assert check_latency("someone/unknown", 240) == 240  # checked when it loads
    with pytest.raises(MlxSpeechError, match="multiple of 80"):
        check_latency("someone/unknown", 100)
