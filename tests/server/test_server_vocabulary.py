"""Phrase boosting through the server: REST `hotwords` / `prompt` / `boost`, realtime
`session.update` in both dialects (the openai SDK and a raw websockets client); every answer
equals the library call with the same phrases."""

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

import mlx_speech  # noqa: E402
from mlx_speech.server.vocabulary import prompt_phrases  # noqa: E402
from tests.support.numbers import assert_same_numbers  # noqa: E402
from tests.support.server import KEY, ServerThread, pcm16, wav_bytes  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "golden"
PHRASES, BOOST = ["quick brown", "time"], 2.0  # the NeMo golden's case: it changes the text


@pytest.fixture(scope="module")
def nm():
    return mlx_speech.load(GOLDEN / "nemotron")


@pytest.fixture(scope="module")
def srv(nm, vr_model):
    with ServerThread({"nm": nm, "vr": vr_model}, api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def audio():
    x = np.load(GOLDEN / "nemotron" / "golden.npz")["audio"]
    return pcm16(x).astype(np.float32) / 32768  # what every client below sends


def test_prompt_rule():
    assert prompt_phrases("Kubernetes, LinTO, mlx speech") == ["Kubernetes", "LinTO",
                                                                "mlx speech"]
    assert prompt_phrases("Kubernetes") == ["Kubernetes"]
    assert prompt_phrases("The following is a talk about Kubernetes.") == []
    assert prompt_phrases("Hi there. We discuss k8s, helm and more today with friends") == []
    assert prompt_phrases("") == [] and prompt_phrases(None) == []


def test_rest_hotwords_prompt_and_boost(srv, nm, audio):
    boosted = nm.transcribe(audio, hotwords=PHRASES, boost=BOOST).text
    plain = nm.transcribe(audio).text
    assert boosted != plain

    def post(**data):
        r = httpx.post(srv.base + "/v1/audio/transcriptions",
                       headers={"Authorization": f"Bearer {KEY}"},
                       files={"file": ("a.wav", wav_bytes(audio))},
                       data={"model": "nm", **data}, timeout=60)
        return r

    assert post(hotwords=",".join(PHRASES), boost=str(BOOST)).json()["text"] == boosted
    assert post(prompt="quick brown, time", boost=str(BOOST)).json()["text"] == boosted
    assert post(prompt="A story about a quick brown fox.", boost="2").json()["text"] == plain
    assert post(hotwords="quick brown", boost="0").json()["text"] == plain
    assert post().json()["text"] == plain
    r = post(hotwords="x", boost="lots")
    assert r.status_code == 400 and "boost must be" in r.json()["error"]["message"]
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    t = client.audio.transcriptions.create(model="nm", file=("a.wav", wav_bytes(audio)),
                                           prompt="quick brown, time",
                                           extra_body={"boost": BOOST})
    assert t.text == boosted


async def _openai(srv, pcm, transcription):
    c = openai.AsyncOpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    async with c.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000},
            "transcription": transcription, "turn_detection": None}}})
        b = pcm.tobytes()
        for i in range(0, len(b), 4800):
            await conn.input_audio_buffer.append(audio=base64.b64encode(b[i:i + 4800]).decode())
        await conn.input_audio_buffer.commit()
        async for ev in conn:
            assert ev.type != "error", ev
            if ev.type == "session.updated":
                tr = ev.session.audio.input.transcription
                echoed = (tr.model_extra or {}).get("hotwords")
            if ev.type == "conversation.item.input_audio_transcription.completed":
                return ev.transcript, echoed


async def _vllm(srv, pcm16k, update):
    async with websockets.connect(srv.ws + "/v1/realtime",
                                  additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "model": "nm", **update}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        b = pcm16k.tobytes()
        for i in range(0, len(b), 8000):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(b[i:i + 8000]).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        while True:
            ev = json.loads(await ws.recv())
            assert ev["type"] != "error", ev
            if ev["type"] == "transcription.done":
                return ev["text"]


def test_realtime_session_update_both_dialects(srv, nm, audio):
    pcm = pcm16(audio)
    boosted = nm.transcribe(audio, hotwords=PHRASES, boost=BOOST).text
    plain = nm.transcribe(audio).text
    assert boosted != plain

    def go(coro):
        return asyncio.run(asyncio.wait_for(coro, 120))

    text, echoed = go(_openai(srv, pcm, {"model": "nm", "hotwords": PHRASES, "boost": BOOST}))
    assert text == boosted and echoed == PHRASES
    text, _ = go(_openai(srv, pcm, {"model": "nm", "prompt": "quick brown, time",
                                    "boost": BOOST}))
    assert text == boosted
    assert go(_openai(srv, pcm, {"model": "nm"}))[0] == plain
    assert go(_vllm(srv, pcm, {"hotwords": PHRASES, "boost": BOOST})) == boosted
    assert go(_vllm(srv, pcm, {})) == plain


# -- logprobs and word times ---------------------------------------------------------------


async def _openai_events(srv, pcm, session_extra):
    c = openai.AsyncOpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    async with c.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.session.update(session={"type": "transcription", **session_extra,
                                           "audio": {"input": {
                                               "format": {"type": "audio/pcm", "rate": 16000},
                                               "transcription": {"model": "nm"},
                                               "turn_detection": None}}})
        b = pcm.tobytes()
        for i in range(0, len(b), 3200):
            await conn.input_audio_buffer.append(audio=base64.b64encode(b[i:i + 3200]).decode())
        await conn.input_audio_buffer.commit()
        deltas = []
        async for ev in conn:
            assert ev.type != "error", ev
            if ev.type == "conversation.item.input_audio_transcription.delta":
                deltas.append(ev)
            if ev.type == "conversation.item.input_audio_transcription.completed":
                return deltas, ev


def test_realtime_logprobs_and_words_openai_sdk(srv, nm, audio):
    from mlx_speech.server.vocabulary import words_field

    pcm = pcm16(audio)
    ref = nm.transcribe(audio, logprobs=True)
    deltas, done = asyncio.run(asyncio.wait_for(_openai_events(
        srv, pcm, {"include": ["item.input_audio_transcription.logprobs"]}), 120))
    streamed = [lp for d in deltas for lp in (d.logprobs or [])]
    assert len(streamed) == len(ref.token_ids) and len(deltas) > 2
    assert_same_numbers([lp.logprob for lp in streamed], ref.logprobs, atol=1e-5)
    assert [bytes(lp.bytes) for lp in streamed] == [nm.tokenizer.token_bytes(t)
                                                     for t in ref.token_ids]
    assert "".join(lp.token for lp in done.logprobs) == "".join(
        nm.tokenizer.token_bytes(t).decode() for t in ref.token_ids)
    assert_same_numbers([lp.logprob for lp in done.logprobs], ref.logprobs, atol=1e-5)
    assert done.model_extra["words"] == words_field(ref) and ref.words
    # a client that does not ask gets no logprobs
    deltas, done = asyncio.run(asyncio.wait_for(_openai_events(srv, pcm, {}), 120))
    assert all(d.logprobs is None for d in deltas) and done.logprobs is None
    assert done.transcript == ref.text


def test_realtime_logprobs_and_words_vllm_dialect(srv, nm, audio):
    from mlx_speech.server.vocabulary import words_field

    async def go(update):
        async with websockets.connect(srv.ws + "/v1/realtime", additional_headers={
                "Authorization": f"Bearer {KEY}"}) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "session.update", "model": "nm", **update}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            b = pcm16(audio).tobytes()
            for i in range(0, len(b), 6400):
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(b[i:i + 6400]).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
            evs = []
            while True:
                evs.append(json.loads(await ws.recv()))
                assert evs[-1]["type"] != "error", evs[-1]
                if evs[-1]["type"] == "transcription.done":
                    return evs

    ref = nm.transcribe(audio, logprobs=True)
    evs = asyncio.run(asyncio.wait_for(go({"include": [
        "item.input_audio_transcription.logprobs"]}), 120))
    streamed = [lp["logprob"] for e in evs[:-1] for lp in e.get("logprobs", [])]
    assert_same_numbers(streamed, ref.logprobs, atol=1e-5)
    assert_same_numbers([lp["logprob"] for lp in evs[-1]["logprobs"]], ref.logprobs,
                        atol=1e-5)
    assert evs[-1]["words"] == words_field(ref)
    evs = asyncio.run(asyncio.wait_for(go({}), 120))
    assert not any("logprobs" in e for e in evs) and evs[-1]["words"] == words_field(ref)


def test_rest_include_logprobs(srv, nm, audio):
    ref = nm.transcribe(audio, logprobs=True)
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    f = ("a.wav", wav_bytes(audio))
    t = client.audio.transcriptions.create(model="nm", file=f, include=["logprobs"])
    assert t.text == ref.text
    assert_same_numbers([lp.logprob for lp in t.logprobs], ref.logprobs, atol=1e-5)
    assert t.logprobs[0].bytes == list(nm.tokenizer.token_bytes(ref.token_ids[0]))
    assert client.audio.transcriptions.create(model="nm", file=f).logprobs is None
    v = client.audio.transcriptions.create(model="nm", file=f, include=["logprobs"],
                                           response_format="verbose_json")
    assert len(v.model_extra["logprobs"]) == len(ref.token_ids)


def test_realtime_logprobs_raw_client_openai_dialect_voxtral(srv, vr_model):
    """A raw websockets client in OpenAI's dialect; Voxtral's pads carry no text and are not
    listed."""
    from tests.conftest import speechlike

    x = pcm16(speechlike(2.0))
    audio = x.astype(np.float32) / 32768
    # the tiny model says little: a boosted phrase makes it say more (logprobs stay unbiased)
    ref = vr_model.transcribe(audio, logprobs=True, hotwords=[">"], boost=3.0)
    text_lps = [lp for t, lp in zip(ref.token_ids, ref.logprobs, strict=True)
                if not vr_model.tokenizer.is_special(t)]
    assert text_lps and len(text_lps) < len(ref.token_ids)  # text tokens, and pads left out

    async def go():
        async with websockets.connect(srv.ws + "/v1/realtime?intent=transcription&model=vr",
                                      additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "include": ["item.input_audio_transcription.logprobs"],
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                    "transcription": {"hotwords": [">"], "boost": 3.0},
                                    "turn_detection": None}}}}))
            b = x.tobytes()
            for i in range(0, len(b), 6400):
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(b[i:i + 6400]).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            evs = []
            while True:
                evs.append(json.loads(await ws.recv()))
                assert evs[-1]["type"] != "error", evs[-1]
                if evs[-1]["type"].endswith("transcription.completed"):
                    return evs

    evs = asyncio.run(asyncio.wait_for(go(), 120))
    upd = next(e for e in evs if e["type"] == "session.updated")
    assert upd["session"]["include"] == ["item.input_audio_transcription.logprobs"]
    done = evs[-1]
    assert done["transcript"] == ref.text
    assert_same_numbers([e["logprob"] for e in done["logprobs"]], text_lps, atol=1e-5)
    assert all(e["bytes"] for e in done["logprobs"])
    streamed = [lp["logprob"] for e in evs[:-1] for lp in e.get("logprobs", [])]
    assert_same_numbers(streamed, text_lps, atol=1e-5)


def test_rest_streamed_logprobs(srv, nm, audio):
    ref = nm.transcribe(audio, logprobs=True)
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    evs = list(client.audio.transcriptions.create(model="nm", file=("a.wav", wav_bytes(audio)),
                                                  include=["logprobs"], stream=True))
    streamed = [lp.logprob for e in evs[:-1] for lp in (e.logprobs or [])]
    assert_same_numbers(streamed, ref.logprobs, atol=1e-5)
    assert_same_numbers([lp.logprob for lp in evs[-1].logprobs], ref.logprobs,
                        atol=1e-5)
    assert "".join(e.delta for e in evs[:-1]) == ref.text == evs[-1].text
