"""Speakers over REST: `response_format=diarized_json` parsed by the real `openai` SDK
(TranscriptionDiarized), Mistral's `diarize=true` on verbose_json (`speaker_id`), nothing new
when diarization is not asked for, and one clear 400 when the server has no diarizer. Tiny
Nemotron ASR and tiny Sortformer on the three-voice espeak-ng recording."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import mlx_speech  # noqa: E402
from tests.support.server import ServerThread  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "golden"
KEY = "diarize-key"
AUDIO = Path(__file__).parents[1] / "data" / "voices_3spk.wav"


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

    return diarize_result(asr.transcribe(x), x, diar)


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
    assert [s["speaker_id"] for s in segs] == [f"speaker_{s.speaker + 1}" for s in d.segments]
    words = v.model_dump()["words"]
    assert [w["speaker_id"] for w in words] == [f"speaker_{w.speaker + 1}" for w in d.words]
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


websockets = pytest.importorskip("websockets")


def test_realtime_completed_items_carry_a_speaker(setup):
    import asyncio
    import base64
    import json

    from mlx_speech.audio.resample import resample

    srv, asr, diar, x = setup
    pcm = (np.clip(resample(x, 16000, 24000), -1, 1) * 32767).astype(np.int16)
    halves = [pcm[: len(pcm) // 2], pcm[len(pcm) // 2:]]

    async def go(diarize: bool):
        url = srv.ws + "/v1/realtime?intent=transcription&model=nm"
        done = []
        async with websockets.connect(url, subprotocols=[
                "realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
            tr = {"model": "nm", **({"diarize": True} if diarize else {})}
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 24000}, "transcription": tr,
                    "turn_detection": None}}}}))
            for half in halves:  # two items, one speaker numbering across them
                b = half.tobytes()
                for i in range(0, len(b), 9600):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(b[i:i + 9600]).decode()}))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            updated = None
            while len(done) < 2:
                ev = json.loads(await asyncio.wait_for(ws.recv(), 120))
                assert ev["type"] != "error", ev
                if ev["type"] == "session.updated":
                    updated = ev
                if ev["type"].endswith(".completed"):
                    done.append(ev)
        return updated, done

    updated, done = asyncio.run(go(True))
    assert updated["session"]["audio"]["input"]["transcription"]["diarize"] is True
    for ev in done:
        assert re.fullmatch(r"Speaker \d", ev["speaker"]), ev
        if "speaker_segments" in ev:
            segs = ev["speaker_segments"]
            assert len({s["speaker"] for s in segs}) > 1
            assert " ".join(s["text"] for s in segs).split() == ev["transcript"].split()
    assert done[0]["speaker"] == "Speaker 1"
    _, plain = asyncio.run(go(False))
    assert all("speaker" not in ev and "speaker_segments" not in ev for ev in plain)
    assert [e["transcript"] for e in plain] == [e["transcript"] for e in done]


def test_item_speaker_fields_on_the_connection_timeline():
    from mlx_speech.models.asr import Transcript, Word
    from mlx_speech.server.diarization import ConnectionSpeakers

    sp = ConnectionSpeakers.__new__(ConnectionSpeakers)
    from mlx_speech.diarize import SpeakerTurns

    sp.turns, sp.starts, sp.pushed, sp.base = SpeakerTurns(), {}, 0, 0
    probs = np.zeros((50, 4), np.float32)
    probs[:25, 2] = 0.9  # slot 2 for the first 2 s, slot 0 after
    probs[25:, 0] = 0.9
    from mlx_speech.diarize import FrameLog

    sp.log = FrameLog(4)
    sp.log.add(probs)
    sp.pushed = 16000  # item a starts 1 s into the connection
    sp.start_item("a")
    words = [Word("one", 0.1, 0.4), Word("two", 0.5, 0.8), Word("three", 1.2, 1.6)]
    f = sp.fields("a", Transcript("one two three", [], words))
    assert f["speaker"] == "Speaker 1"  # two words at 1.1-1.8 s: slot 2
    assert f["speaker_segments"] == [
        {"speaker": "Speaker 1", "start": 0.1, "end": 0.8, "text": "one two"},
        {"speaker": "Speaker 2", "start": 1.2, "end": 1.6, "text": "three"}]
    sp.base = 32000  # a VAD turn starting at TurnStream sample 8000
    sp.start_item("b", 8000)
    g = sp.fields("b", Transcript("x", [], [Word("x", 0.0, 0.3)]))
    assert g == {"speaker": "Speaker 2"}  # 2.5 s on the connection: slot 0, named second


def test_vllm_dialect_utterances_carry_a_speaker(setup):
    import asyncio
    import base64
    import json

    srv, asr, diar, x = setup
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int16)
    halves = [pcm[: len(pcm) // 2], pcm[len(pcm) // 2:]]

    async def go(diarize: bool):
        done = []
        async with websockets.connect(srv.ws + "/v1/realtime", additional_headers={
                "Authorization": f"Bearer {KEY}"}) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.update", "model": "nm",
                                      **({"diarize": True} if diarize else {})}))
            for half in halves:  # two utterances on one connection
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                b = half.tobytes()
                for i in range(0, len(b), 8000):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(b[i:i + 8000]).decode()}))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
                while True:
                    ev = json.loads(await asyncio.wait_for(ws.recv(), 120))
                    assert ev["type"] in ("transcription.delta", "transcription.done"), ev
                    if ev["type"] == "transcription.done":
                        done.append(ev)
                        break
        return done

    done = asyncio.run(go(True))
    assert done[0]["speaker"] == "Speaker 1"
    assert all(re.fullmatch(r"Speaker \d", ev["speaker"]) for ev in done)
    plain = asyncio.run(go(False))
    assert all("speaker" not in ev for ev in plain)
    assert [e["text"] for e in plain] == [e["text"] for e in done]


def test_each_surface_names_the_library_speakers_its_own_way():
    """The table of docs/diarization.md: the library's speaker numbers (0 first, None: nobody
    heard) as the command line, OpenAI's diarized_json, verbose_json and realtime show them."""
    from mlx_speech.diarize import DiarizedTranscript, SpeakerWord, speaker_segments
    from mlx_speech.server.diarization import diarized_json, speaker_fields
    from mlx_speech.transcript import (
        format_json,
        format_srt,
        format_turns,
        format_vtt,
        speaker_name,
    )

    def transcript(speakers):
        words = [SpeakerWord(f"w{i}.", i, i + 0.5, s) for i, s in enumerate(speakers)]
        return DiarizedTranscript(" ".join(w.text for w in words), words,
                                  np.zeros((0, 4), np.float32), speaker_segments(words))

    d = transcript([0, 0, 1, 2, 1])
    assert [s.speaker for s in d.segments] == [0, 0, 1, 2, 1]
    assert format_turns(d.turns()) == ("Speaker 1: w0. w1.\nSpeaker 2: w2.\nSpeaker 3: w3.\n"
                                       "Speaker 2: w4.")
    assert format_srt(d.segments).split("\n")[2] == "Speaker 1: w0."
    assert format_vtt(d.segments).split("\n")[3] == "<v Speaker 1>w0."
    assert [s["speaker"] for s in json.loads(format_json(d.text, d.segments))["segments"]] == [
        "Speaker 1", "Speaker 1", "Speaker 2", "Speaker 3", "Speaker 2"]
    assert [s["speaker"] for s in diarized_json(d, 3.0)["segments"]] == list("AABCB")
    out = speaker_fields({"segments": [{} for _ in d.segments], "words": [{} for _ in d.words]},
                         d)
    assert [s["speaker_id"] for s in out["segments"]] == [
        "speaker_1", "speaker_1", "speaker_2", "speaker_3", "speaker_2"]
    assert [w["speaker_id"] for w in out["words"]] == [s["speaker_id"] for s in out["segments"]]
    assert speaker_name(0) == "Speaker 1" and speaker_name(None) is None  # realtime `speaker`
    quiet = transcript([None, None])  # nobody heard: no label where one may be left out
    assert format_turns(quiet.turns()) == "w0. w1."
    assert "Speaker" not in format_srt(quiet.segments) + format_vtt(quiet.segments)
    assert [s["speaker"] for s in diarized_json(quiet, 1.0)["segments"]] == ["A", "A"]
    assert [s["speaker_id"] for s in speaker_fields({"segments": [{}, {}]}, quiet)[
        "segments"]] == [None, None]
