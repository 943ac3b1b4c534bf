"""`transcribe --language` end to end on the tiny Nemotron 3.5 model (subprocesses, like a
user): the language conditions the model, `auto` detects it (json reports it, text never holds
a tag), and a language a model does not take is refused in one line before its weights load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mlx_speech.models.nemotron_streaming import load
from tests.support.cli import run

GOLDEN = Path(__file__).parents[1] / "golden" / "nemotron35"


@pytest.fixture(scope="module")
def wav(tmp_path_factory):
    p = tmp_path_factory.mktemp("audio") / "guten.wav"
    audio = np.load(GOLDEN / "golden.npz")["audio"]
    sf.write(p, audio, 16000, subtype="PCM_16")  # the golden's int16 samples, exactly
    return p


@pytest.fixture(scope="module")
def model():
    return load(GOLDEN / "tiny.nemo")


def test_transcribe_language_and_auto(wav, model):
    nemo = str(GOLDEN / "tiny.nemo")
    r = run("mlx_speech.transcribe", str(wav), "--model", nemo, "--language", "de",
            "--latency-ms", "320", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ref = model.transcribe(str(wav), latency_ms=320, language="de")
    assert doc["text"] == ref.text.strip() and doc["language"] == "de-DE"
    r = run("mlx_speech.transcribe", str(wav), "--model", nemo, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # the release's default: auto
    ref = model.transcribe(str(wav), language="auto")
    assert doc["text"] == ref.text.strip() and doc["language"] == "de-DE"
    assert "<" not in doc["text"]
    assert [w["text"] for w in doc["words"]] == [w.text for w in ref.words]
    r = run("mlx_speech.transcribe", str(wav), "--model", str(GOLDEN / "hf"), "--language",
            "fr-FR")
    assert r.returncode == 0, r.stderr
    assert r.stdout == model.transcribe(str(wav), language="fr-FR").text.strip() + "\n"


def test_unknown_languages_are_refused_in_one_line(wav, vr_dir):
    r = run("mlx_speech.transcribe", str(wav), "--model", str(GOLDEN / "tiny.nemo"),
            "--language", "xx")
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown language 'xx'" in lines[0]
    assert "auto, de, de-DE, en, en-US, es, es-ES, fr, fr-FR" in lines[0]
    r = run("mlx_speech.transcribe", str(wav), "--model", str(vr_dir), "--language", "de")
    assert r.returncode == 1 and "take no language option" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    seed = str(Path(__file__).parents[1] / "golden" / "nemotron")
    r = run("mlx_speech.transcribe", str(wav), "--model", seed, "--language", "de")
    assert r.returncode == 1 and "English only" in r.stderr


@pytest.mark.parametrize("fmt", ["srt", "vtt", "txt"])
def test_subtitles_and_text_hold_no_language_tag(wav, model, fmt):
    """srt, vtt and txt carry the text alone (no language field): the words of `auto`, whose
    tags never reach them."""
    from mlx_speech.transcribe import segments_from_words
    from mlx_speech.writers import format_srt, format_txt, format_vtt

    r = run("mlx_speech.transcribe", str(wav), "--model", str(GOLDEN / "tiny.nemo"),
            "--language", "auto", "--format", fmt)
    assert r.returncode == 0, r.stderr
    ref = model.transcribe(str(wav), language="auto")
    assert ref.language == "de-DE"  # a tag was emitted
    segs = segments_from_words(ref.words)
    want = {"srt": format_srt(segs), "vtt": format_vtt(segs), "txt": format_txt(ref.text)}[fmt]
    assert r.stdout.strip() == want.strip() and "<" not in r.stdout
