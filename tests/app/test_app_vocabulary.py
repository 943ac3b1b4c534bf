"""The menu-bar app's vocabulary: a list in the settings, passed to every dictation session
(phrase boosting), kept across restarts; bad entries fall back."""

from __future__ import annotations

import json
from pathlib import Path

from mlx_speech.app.engine import _session_kwargs
from mlx_speech.app.settings import Settings, load_settings, save_settings
from mlx_speech.text.vocabulary import Vocabulary, session_keywords
from tests.app.helpers_fakes import key, make_app

GOLDEN = Path(__file__).parents[1] / "golden"


def test_vocabulary_settings_round_trip_and_fall_back(tmp_path):
    p = tmp_path / "settings.json"
    save_settings(Settings(vocabulary=["Kubernetes", "LinTO"], vocabulary_boost=2.0), p)
    s = load_settings(p)
    assert (s.vocabulary, s.vocabulary_boost) == (["Kubernetes", "LinTO"], 2.0)
    p.write_text(json.dumps({"vocabulary": ["ok", 3, "", None], "vocabulary_boost": -4}))
    s = load_settings(p)
    assert (s.vocabulary, s.vocabulary_boost) == (["ok"], 1.0)
    p.write_text(json.dumps({"vocabulary": "not a list"}))
    assert load_settings(p).vocabulary == []


def test_dictation_sessions_get_the_vocabulary():
    app, clock, _ = make_app(Settings(preload_asr=False, vocabulary=["quick brown", "time"],
                                      vocabulary_boost=2.0))
    key(app, clock, "dictate", True)
    begin = next(c for c in app.engine.calls if c[0] == "begin")
    assert begin[3]["vocabulary"] == Vocabulary(("quick brown", "time"), 2.0)


def test_engine_session_keywords_boost_the_model():
    import mlx_speech

    nm = mlx_speech.load(GOLDEN / "nemotron")
    v = Vocabulary(("quick brown", "time"), 2.0)
    kw = _session_kwargs(nm, {"latency_ms": None, "vocabulary": v})
    assert kw == session_keywords(v) and kw
    assert nm.session(**kw).booster is not None
    assert _session_kwargs(nm, {"latency_ms": 160, "vocabulary": None}) == {"latency_ms": 160}
