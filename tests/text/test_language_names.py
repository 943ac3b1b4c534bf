"""Language names (menus, OpenAI's verbose_json): every language a served model transcribes
has its English name; codes are read from codes and locales alike."""

from __future__ import annotations

from mlx_speech.registry import MODELS, family, kind_of
from mlx_speech.text.language_names import english_name, label, language_code


def test_every_spoken_language_has_a_name():
    for t in MODELS:
        if kind_of(t) == "asr":
            cls = family(t)
            missing = [c for c in cls.spoken if english_name(c) is None]
            assert not missing, (t, missing)


def test_codes_names_and_labels():
    assert [language_code(t) for t in ("de-DE", "de_de", "DE", " pt-BR ")] == [
        "de", "de", "de", "pt"]
    assert english_name("de-DE") == "German" and english_name("zh-TW") == "Chinese"
    assert english_name("haw-US") == "Hawaiian" and english_name("xx") is None
    assert label("fr-FR") == "French (fr-FR)" and label("xx-YY") == "xx-YY"
