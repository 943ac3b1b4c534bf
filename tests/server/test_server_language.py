"""The spoken language on the server, end to end on the tiny Nemotron 3.5 model with the real
clients: REST `language` as OpenAI's API takes it (and verbose_json / json / SSE reporting the
detected language), realtime `language` and `auto` in both dialects (the `openai` SDK for
OpenAI's, vLLM's example client for vLLM's), a model that takes no language accepting the one
it transcribes, and unknown languages refused in one line, before any work. Every transcript
is checked against the library call it stands for."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
websockets = pytest.importorskip("websockets")

import httpx  # noqa: E402

from mlx_speech.audio.resample import resample  # noqa: E402
from mlx_speech.server.validate import Invalid, language  # noqa: E402
from tests.support import server as wire  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "golden"
N35_NAMES = "auto, de, de-DE, en, en-US, es, es-ES, fr, fr-FR"
OPENAI_PARAM = "session.audio.input.transcription.language"


@pytest.fixture(scope="module")
def models():
    """`n35` takes languages, `nm` (the English Nemotron) takes none."""
    return wire.tiny_language_models("nm")


@pytest.fixture(scope="module")
def srv(models):
    with wire.ServerThread(models, api_key=wire.KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=wire.KEY, max_retries=0)


@pytest.fixture(scope="module")
def audio():
    """German words by the tiny model's reading (its `auto` hears a <de-DE> tag in them)."""
    return np.load(GOLDEN / "nemotron35" / "golden.npz")["audio"].astype(np.float32) / 32768


def expected_languages(locale: str | None) -> list[dict]:
    return [] if locale is None else [{"code": locale.split("-")[0], "locale": locale}]


# ------------------------------------------------------------------ REST


@pytest.mark.parametrize("lang", ["de", "fr-FR", "es_es", "auto", None])
def test_rest_language_conditions_the_model_and_is_reported(client, models, audio, lang):
    m = models["n35"]
    ref = m.transcribe(audio, language=lang)
    f = ("guten.wav", wire.wav_bytes(audio))
    kw = {} if lang is None else {"language": lang}  # none: the model's default (auto)
    create = client.audio.transcriptions.create
    j = create(model="n35", file=f, **kw)
    assert j.text == ref.text and "<" not in j.text
    assert [x.model_dump() for x in j.languages] == expected_languages(ref.language)
    v = create(model="n35", file=f, response_format="verbose_json", **kw)
    assert v.text == ref.text
    assert v.language == {"de-DE": "german", "fr-FR": "french", "es-ES": "spanish"}[ref.language]
    events = list(create(model="n35", file=f, stream=True, **kw))
    done = events[-1]
    assert done.type == "transcript.text.done" and done.text == ref.text
    assert [x.model_dump() for x in done.languages] == expected_languages(ref.language)
    assert create(model="n35", file=f, response_format="srt", **kw).count("<") == 0


def test_the_languages_read_differently(models, audio):
    """The requests above reach the model: its readings differ by language, and auto detects."""
    m = models["n35"]
    assert m.transcribe(audio, language="fr-FR").text != m.transcribe(audio, language="de").text
    assert m.transcribe(audio, language="auto").language == "de-DE"
    assert m.transcribe(audio, language="es_es").language == "es-ES"


@pytest.mark.parametrize("bad", ["xx", "de-XX", "german"])
def test_rest_unknown_language_is_a_400_naming_the_field_before_any_work(srv, bad):
    submitted = []
    submit = srv.engine.submit
    srv.engine.submit = lambda job: submitted.append(job) or submit(job)
    try:  # the file is no audio: the language is refused before it is read
        r = httpx.post(srv.base + "/v1/audio/transcriptions",
                       headers={"Authorization": f"Bearer {wire.KEY}"},
                       data={"model": "n35", "language": bad},
                       files={"file": ("a.wav", b"not audio at all")})
    finally:
        srv.engine.submit = submit
    assert r.status_code == 400 and submitted == []
    err = r.json()["error"]
    assert err["param"] == "language" and err["type"] == "invalid_request_error"
    msg = err["message"]
    assert "\n" not in msg and msg.startswith("language: unknown language")
    assert repr(bad) in msg and N35_NAMES in msg


def test_a_model_that_takes_no_language_accepts_the_one_it_transcribes(client, models, audio):
    m = models["nm"]  # the English Nemotron
    ref = m.transcribe(audio)
    f = ("a.wav", wire.wav_bytes(audio))
    create = client.audio.transcriptions.create
    for lang, entry in (("en", {"code": "en"}), ("en-US", {"code": "en", "locale": "en-US"}),
                        ("EN", {"code": "en"}), ("auto", {"code": "en"}), (None, {"code": "en"})):
        kw = {} if lang is None else {"language": lang}
        j = create(model="nm", file=f, **kw)
        assert j.text == ref.text, lang
        assert [x.model_dump() for x in j.languages] == [entry]
        v = create(model="nm", file=f, response_format="verbose_json", **kw)
        assert v.text == ref.text and v.language == "english"
    with pytest.raises(openai.BadRequestError) as e:
        create(model="nm", file=f, language="de")
    err = e.value.body
    assert err["param"] == "language" and "\n" not in err["message"]
    assert err["message"] == ("language: Nemotron streaming speech-to-text takes no language "
                              "and transcribes only English (en); got 'de'")


def test_voxtral_takes_its_own_languages_as_hints():
    """Checked from the class (the contract's class attributes), as before a load."""
    from mlx_speech.models.voxtral_realtime import VoxtralRealtime

    assert VoxtralRealtime.languages is None and len(VoxtralRealtime.spoken) == 13
    assert language(VoxtralRealtime, "de") == "de" and language(VoxtralRealtime, "pt-BR")
    assert language(VoxtralRealtime, "auto") is None and language(VoxtralRealtime, "") is None
    with pytest.raises(Invalid) as e:
        language(VoxtralRealtime, "fi", "language")
    assert e.value.param == "language" and "German (de)" in str(e.value)
    assert "takes no language" in str(e.value) and "got 'fi'" in str(e.value)
    with pytest.raises(Invalid, match="must be a string"):
        language(VoxtralRealtime, ["de"], "language")


def test_models_list_their_languages(srv, models):
    data = httpx.get(srv.base + "/v1/models",
                     headers={"Authorization": f"Bearer {wire.KEY}"}).json()["data"]
    by_id = {m["id"]: m for m in data}
    assert by_id["n35"]["languages"] == list(models["n35"].languages) == N35_NAMES.split(", ")
    assert "languages" not in by_id["nm"]  # it takes none


# ------------------------------------------------------------------ realtime, OpenAI's dialect


async def openai_turn(srv, model: str, pcm24: np.ndarray, lang=None, bad=None) -> dict:
    """One turn over the `openai` SDK's realtime client: the session.updated echo, the
    completed item, and the error events of `bad` language updates sent first."""
    c = openai.AsyncOpenAI(base_url=srv.base + "/v1", api_key=wire.KEY, max_retries=0)
    out = {"errors": []}
    async with c.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        tr = {"model": model, **({} if lang is None else {"language": lang})}
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000}, "transcription": tr,
            "turn_detection": None}}})
        for b in bad or ():
            await conn.session.update(session={"type": "transcription", "audio": {"input": {
                "transcription": {"model": model, "language": b}}}})
        await wire.append_and_commit(conn, pcm24, 9600)
        deltas = []
        async for ev in conn:
            if ev.type == "session.updated" and "updated" not in out:
                out["updated"] = ev.session.audio.input.transcription.model_dump()
            elif ev.type == "error":
                out["errors"].append(ev.error)
            elif ev.type == "conversation.item.input_audio_transcription.delta":
                deltas.append(ev.delta)
            elif ev.type == "conversation.item.input_audio_transcription.completed":
                out["deltas"], out["completed"] = "".join(deltas), ev
                return out


@pytest.mark.parametrize("lang", ["de", "fr", "auto"])
def test_openai_realtime_language_and_auto(srv, models, audio, lang):
    pcm = wire.pcm16(resample(audio, 16000, 24000))
    got = wire.run(openai_turn(srv, "n35", pcm, lang))
    ref = models["n35"].transcribe(pcm.astype(np.float32) / 32768, sample_rate=24000,
                                   language=lang)
    done = got["completed"]
    assert got["deltas"] == done.transcript == ref.text and got["errors"] == []
    assert got["updated"]["language"] == lang
    assert [x.model_dump() for x in done.languages] == expected_languages(ref.language)
    if lang != "auto":
        assert ref.language == {"de": "de-DE", "fr": "fr-FR"}[lang]


def test_openai_realtime_refuses_unknown_languages_in_one_line_and_goes_on(srv, models, audio):
    pcm = wire.pcm16(resample(audio, 16000, 24000))
    got = wire.run(openai_turn(srv, "n35", pcm, "fr", bad=["xx", "de-AT"]))
    assert [(e.code, e.param) for e in got["errors"]] == [("invalid_value", OPENAI_PARAM)] * 2
    for e, bad in zip(got["errors"], ["xx", "de-AT"], strict=True):
        assert "\n" not in e.message and f"unknown language {bad!r}" in e.message
        assert N35_NAMES in e.message
    ref = models["n35"].transcribe(pcm.astype(np.float32) / 32768, sample_rate=24000,
                                   language="fr")  # the refused updates changed nothing
    assert got["completed"].transcript == ref.text


def test_openai_realtime_english_model_takes_english_only(srv, models, audio):
    pcm = wire.pcm16(resample(audio[:32000], 16000, 24000))
    got = wire.run(openai_turn(srv, "nm", pcm, "en", bad=["de"]))
    ref = models["nm"].transcribe(pcm.astype(np.float32) / 32768, sample_rate=24000)
    assert got["completed"].transcript == ref.text
    assert [x.model_dump() for x in got["completed"].languages] == [{"code": "en"}]
    (e,) = got["errors"]
    assert e.param == OPENAI_PARAM and "transcribes only English (en); got 'de'" in e.message


def test_openai_beta_shape_takes_the_language_too(srv):
    """The beta `transcription_session.update` shape: `input_audio_transcription.language`,
    its errors naming that field, and the echo in kind."""
    async def talk():
        url = srv.ws + "/v1/realtime?intent=transcription"
        async with websockets.connect(url, additional_headers={
                "Authorization": f"Bearer {wire.KEY}"}) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            out = []
            for lang in ("xx", "de"):
                await ws.send(json.dumps({"type": "transcription_session.update", "session": {
                    "input_audio_transcription": {"model": "n35", "language": lang}}}))
                out.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            return out

    err, ok = wire.run(talk())
    assert err["type"] == "error" and err["error"]["code"] == "invalid_value"
    assert err["error"]["param"] == "session.input_audio_transcription.language"
    assert ok["type"] == "transcription_session.updated"
    assert ok["session"]["input_audio_transcription"] == {"model": "n35", "language": "de"}


# ------------------------------------------------------------------ realtime, vLLM's dialect


@pytest.mark.parametrize("lang", ["de", "es", "auto"])
def test_vllm_realtime_language_and_auto(srv, models, audio, lang):
    pcm = wire.pcm16(audio)
    joined, done = wire.run(wire.vllm_client(srv, "n35", pcm, update={"language": lang}))
    ref = models["n35"].transcribe(pcm.astype(np.float32) / 32768, language=lang)
    assert joined == done["text"] == ref.text
    assert done["language"] == ref.language == {"de": "de-DE", "es": "es-ES",
                                                "auto": "de-DE"}[lang]


def test_vllm_realtime_refuses_an_unknown_language(srv, models, audio):
    async def talk():
        async with websockets.connect(srv.ws + "/v1/realtime", additional_headers={
                "Authorization": f"Bearer {wire.KEY}"}) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.update", "model": "n35",
                                      "language": "xx"}))
            err = json.loads(await asyncio.wait_for(ws.recv(), 60))
            await ws.send(json.dumps({"type": "session.update", "model": "nm",
                                      "language": "fr"}))
            err2 = json.loads(await asyncio.wait_for(ws.recv(), 60))
            return err, err2

    err, err2 = wire.run(talk())
    assert err["type"] == "error" and err["code"] == "invalid_value"
    assert err["error"].startswith("language: unknown language 'xx'") and N35_NAMES in err["error"]
    assert "\n" not in err["error"]
    assert err2["code"] == "invalid_value" and "transcribes only English" in err2["error"]
    pcm = wire.pcm16(audio[:32000])  # a valid language after them works
    joined, done = wire.run(wire.vllm_client(srv, "nm", pcm, update={"language": "en"}))
    assert joined == models["nm"].transcribe(pcm.astype(np.float32) / 32768).text
    assert done["language"] == "en"


# ------------------------------------------------------------------ with server-side turns


def test_server_vad_turns_take_the_language_and_keep_it(models):
    """With turn detection on, each turn's session takes the language set before the audio
    (its transcript is the library's for the cut span in that language); changing it once
    audio was appended is refused, like the model and the delay."""
    from tests.support.turns_audio import scene, silero

    audio, _ = scene(("meeting",), lead_s=0.6, tail_s=0.9)
    pcm = wire.pcm16(resample(audio, 16000, 24000))
    heard = resample(pcm.astype(np.float32) / 32768, 24000, 16000)  # what the server sees

    async def talk(srv):
        url = srv.ws + "/v1/realtime?intent=transcription&model=n35"
        events = []
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": {"model": "n35", "language": "fr"},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}}))
            b = pcm.tobytes()
            for i in range(0, len(b), 4800):
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(b[i:i + 4800]).decode()}))
                if i == 4800 * 4:
                    await ws.send(json.dumps({"type": "session.update", "session": {
                        "type": "transcription", "audio": {"input": {"transcription": {
                            "model": "n35", "language": "de"}}}}}))
            while True:
                ev = json.loads(await ws.recv())
                events.append(ev)
                if ev["type"].endswith(".completed"):
                    return events

    with wire.ServerThread(models, vad=silero()) as srv:
        events = wire.run(talk(srv))
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [e["message"] for e in errors] == [
        "the model, delay and language are fixed once audio was appended with turn "
        "detection on"]
    start = next(e["audio_start_ms"] for e in events if e["type"].endswith("speech_started"))
    end = next(e["audio_end_ms"] for e in events if e["type"].endswith("speech_stopped"))
    done = events[-1]
    ref = models["n35"].transcribe(heard[start * 16: end * 16], language="fr")
    assert done["transcript"] == ref.text and ref.text
    assert done["languages"] == [{"code": "fr", "locale": "fr-FR"}] == expected_languages(
        ref.language)
