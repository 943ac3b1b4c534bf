"""Speakers over REST: `response_format=diarized_json` parsed by the real `openai` SDK
(TranscriptionDiarized), Mistral's `diarize=true` on verbose_json (`speaker_id`), nothing new
when diarization is not asked for, and one clear 400 when the server has no diarizer. Tiny
Nemotron ASR and tiny Sortformer on the three-voice espeak-ng recording."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import mlx_speech  # noqa: E402
from tests.test_server import KEY, ServerThread  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
AUDIO = Path(__file__).parent / "data" / "voices_3spk.wav"


@pytest.fixture(scope="module")
def setup():
    asr = mlx_speech.load(GOLDEN / "nemotron")
    diar = mlx_speech.load(GOLDEN / "sortformer" / "tiny.nemo")
    x, _ = sf.read(AUDIO, dtype="float32")
    with ServerThread({"nm": asr}, api_key=KEY, diarizer=diar) as srv:
        yield srv, asr, diar, x


def _file(x):
    b = io.BytesIO()
    sf.write(b, x, 16000, format="WAV", subtype="FLOAT")
    return ("voices.wav", b.getvalue())


def _expected(asr, diar, x):
    from mlx_speech.diarize import diarize_result
    from mlx_speech.transcribe import segments_from_words

    return diarize_result(asr.transcribe(x), x, diar, segments_from_words)


def test_diarized_json_through_the_openai_sdk(setup):
    from openai.types.audio import TranscriptionDiarized

    srv, asr, diar, x = setup
    d = _expected(asr, diar, x)
    assert len(d.words) > 3 and len({w.speaker for w in d.words}) >= 2
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    r = client.audio.transcriptions.create(model="nm", file=_file(x),
                                           response_format="diarized_json")
    assert isinstance(r, TranscriptionDiarized)
    assert r.text == d.text and abs(r.duration - len(x) / 16000) < 1e-3
    letters = {}
    for s in d.segments:
        letters.setdefault(s.speaker, chr(ord("A") + len(letters)))
    assert [(s.start, s.end, s.text, s.speaker) for s in r.segments] == [
        (round(s.start, 3), round(s.end, 3), s.text, letters[s.speaker]) for s in d.segments]
    assert r.segments[0].speaker == "A"
    assert all(s.type == "transcript.text.segment" for s in r.segments)


def test_verbose_json_with_diarize_true(setup):
    srv, asr, diar, x = setup
    d = _expected(asr, diar, x)
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    v = client.audio.transcriptions.create(
        model="nm", file=_file(x), response_format="verbose_json",
        timestamp_granularities=["word", "segment"], extra_body={"diarize": "true"})
    segs = v.model_dump()["segments"]
    assert [s["speaker_id"] for s in segs] == [
        "speaker_" + s.speaker.split()[-1] for s in d.segments]
    words = v.model_dump()["words"]
    assert [w["speaker_id"] for w in words] == [
        "speaker_" + w.speaker.split()[-1] for w in d.words]
    plain = client.audio.transcriptions.create(model="nm", file=_file(x),
                                               response_format="verbose_json")
    assert all("speaker_id" not in s for s in plain.model_dump()["segments"])
    with pytest.raises(openai.BadRequestError, match="verbose_json"):
        client.audio.transcriptions.create(model="nm", file=_file(x), response_format="srt",
                                           extra_body={"diarize": "true"})


def test_no_diarizer_is_a_clear_400():
    asr = mlx_speech.load(GOLDEN / "nemotron")
    with ServerThread({"nm": asr}, api_key=KEY) as srv:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
        x = np.zeros(16000, np.float32)
        with pytest.raises(openai.BadRequestError, match="no diarizer"):
            client.audio.transcriptions.create(model="nm", file=_file(x),
                                               response_format="diarized_json")
