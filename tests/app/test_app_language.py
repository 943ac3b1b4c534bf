"""The app's language setting, for speech models that take one (Nemotron 3.5): per speech model
(model id -> name), its menu listing the loaded model's own languages (`model.languages`) and
none for a model that takes none, older settings files (without it) read cleanly, and a name
the model does not take falling back to its default."""

from __future__ import annotations

import json

from mlx_speech.app.engine import _session_kwargs
from mlx_speech.app.events import MenuAction, ModelStatus
from mlx_speech.app.menu import present
from mlx_speech.app.settings import ASR_MODELS, DEFAULT_ASR, Settings, load_settings, save_settings
from mlx_speech.errors import MlxSpeechError
from mlx_speech.registry import family
from tests.app.helpers_fakes import FakeASR, key, make_app, pump_until, real_engine

N35 = "nvidia/nemotron-3.5-asr-streaming-0.6b"
NAMES = ("auto", "de", "de-DE", "en", "en-US", "es", "es-ES", "fr", "fr-FR")


class FakeMultilingualASR(FakeASR):
    """A speech model that takes languages (as Nemotron 3.5's tiny checkpoint names them)."""

    languages = NAMES

    def resolve_language(self, name):
        if name not in NAMES:
            raise MlxSpeechError(f"unknown language {name!r}; this model takes {', '.join(NAMES)}")
        return name, NAMES.index(name)


def test_the_multilingual_model_is_in_the_picker():
    (entry,) = [m for m in ASR_MODELS if m[0] == N35]
    assert entry[2] == "nemotron3_5_asr" and family(entry[2]).languages  # takes languages
    assert family("voxtral_realtime").languages is None


def test_older_settings_files_read_cleanly(tmp_path):
    p = tmp_path / "app.json"
    p.write_text(json.dumps({"asr_model": N35, "latency_ms": {N35: 560}, "voice": "x"}))
    s = load_settings(p)  # a file from before the setting: every model its default
    assert s.language == {} and s.asr_model == N35 and s.latency_ms == {N35: 560}
    save_settings(s.replace(language={N35: "de-DE"}), p)
    assert load_settings(p).language == {N35: "de-DE"}
    p.write_text(json.dumps({"language": {N35: "fr", "a": "", "b": 3, "c": "x" * 40}}))
    assert load_settings(p).language == {N35: "fr"}
    p.write_text(json.dumps({"language": "de"}))  # not a per-model table: dropped
    assert load_settings(p).language == {}


def _language_menu(app):
    settings = next(it for it in present(app.view()).items if it.title == "Settings")
    menus = [it for it in settings.children if it.title == "Language"]
    return [(c.title, c.id, c.checked) for c in menus[0].children] if menus else None


def test_menu_lists_the_loaded_models_languages_and_sets_one_per_model():
    saved = []
    app, clock, ev = make_app(Settings(asr_model=N35, preload_asr=False),
                              save_settings=saved.append)
    assert _language_menu(app) is None  # not loaded, none set: nothing to offer yet
    app.post(ModelStatus("asr", N35, "ready", languages=NAMES))
    app.pump()
    assert _language_menu(app) == [("Model default", "language:", True),
                                   ("Detect automatically", "language:auto", False),
                                   ("English (en-US)", "language:en-US", False),
                                   ("French (fr-FR)", "language:fr-FR", False),
                                   ("German (de-DE)", "language:de-DE", False),
                                   ("Spanish (es-ES)", "language:es-ES", False)]
    app.post(MenuAction("language:de-DE"))
    app.pump()
    assert saved[-1].language == {N35: "de-DE"}
    assert [t for t, _, c in _language_menu(app) if c] == ["German (de-DE)"]
    key(app, clock, "dictate", True)
    begin = next(c for c in app.engine.calls if c[0] == "begin")
    assert begin[2] == N35 and begin[3]["language"] == "de-DE"
    key(app, clock, "dictate", False, dt=0.1)
    app.post(MenuAction(f"asr_model:{DEFAULT_ASR}"))  # Voxtral: takes none, no menu
    app.pump()
    assert _language_menu(app) is None and saved[-1].language == {N35: "de-DE"}
    app.post(ModelStatus("asr", DEFAULT_ASR, "ready", latencies=(240, 480)))
    app.pump()
    assert _language_menu(app) is None
    app.post(MenuAction(f"asr_model:{N35}"))  # back: the one set for it, until it loads
    app.pump()
    assert _language_menu(app) == [("Model default", "language:", False),
                                   ("German (de-DE)", "language:de-DE", True)]
    app.post(MenuAction("language:"))
    app.pump()
    assert saved[-1].language == {}


def test_engine_reports_the_models_languages_and_checks_the_setting(capsys):
    holder: list = []
    eng, models = real_engine(holder, asr=FakeMultilingualASR())
    app, clock, ev = make_app(Settings(asr_model="asr", tts_model="tts"), engine=eng)
    holder.append(app)
    try:
        pump_until(app, lambda: app.view().asr.status == "ready")
        assert app.view().asr.languages == NAMES
    finally:
        eng.shutdown()
    multi, plain = FakeMultilingualASR(), FakeASR()
    assert _session_kwargs(multi, {"language": "de"}) == {"language": "de"}
    assert _session_kwargs(multi, {"language": None}) == {}
    assert _session_kwargs(multi, {"language": "xx"}) == {}  # not one of its names: default
    assert "default language instead: unknown language 'xx'" in capsys.readouterr().err
    assert _session_kwargs(plain, {"language": "de"}) == {}  # a model that takes none
    assert "Fake speech-to-text takes no language" in capsys.readouterr().err
