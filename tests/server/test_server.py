"""mlx_speech.server end to end on loopback, with the real clients: the `openai` SDK (REST and
`client.realtime.connect`), a client written exactly like vLLM's realtime example, and a
Kyutai-protocol client. Every answer is checked against the library call it stands for."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
websockets = pytest.importorskip("websockets")

import httpx  # noqa: E402
import soundfile as sf  # noqa: E402

import mlx_speech  # noqa: E402
from mlx_speech.audio.resample import resample  # noqa: E402
from tests.conftest import speechlike  # noqa: E402
from tests.support.server import (  # noqa: E402
    KEY,
    ServerThread,
    kyutai_talk,
    pcm16,
    run,
    vllm_client,
    wav_bytes,
)

GOLDEN = Path(__file__).parents[1] / "golden"
GOOD_ORIGIN = "https://app.example"
MAX_UPLOAD = 1 << 20


@pytest.fixture(scope="module")
def models(vr_dir, tmp_path_factory):
    from tests.support.moshi import tiny_kyutai_moshi

    ky = tiny_kyutai_moshi(tmp_path_factory.mktemp("ky") / "moshi")
    return {"vr": mlx_speech.load(vr_dir), "nm": mlx_speech.load(GOLDEN / "nemotron"),
            "tts": mlx_speech.load(GOLDEN / "voxtral_tts" / "ckpt"), "moshi": mlx_speech.load(ky)}


@pytest.fixture(scope="module")
def srv(models):
    with ServerThread(models, api_key=KEY, allowed_origins=[GOOD_ORIGIN],
                      max_upload_bytes=MAX_UPLOAD, max_buffer_s=4.0) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)


def check_exact_wav(wav: bytes, want: np.ndarray) -> None:
    """A whole WAV whose RIFF and data sizes are exact: Python's `wave` and soundfile read the
    true length, and the samples are `want` within 1 LSB."""
    import wave

    assert wav[:4] == b"RIFF" and int.from_bytes(wav[4:8], "little") == len(wav) - 8
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == len(want)
        got = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.int32)
    info = sf.info(io.BytesIO(wav))
    assert info.frames == len(want) and info.samplerate == 24000
    assert len(got) == len(want) and np.abs(got - want).max() <= 1


# ------------------------------------------------------------------ REST


def test_health_models_and_unknown_model(srv, client):
    assert httpx.get(srv.base + "/health").json()["status"] == "ok"
    assert [m.id for m in client.models.list()] == ["vr", "nm", "tts", "moshi"]
    with pytest.raises(openai.NotFoundError, match="'whisper-1' is not served here; served: "
                                                   "vr, nm, tts, moshi"):
        client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav_bytes(
            speechlike(0.5))))


@pytest.mark.parametrize("name", ["nm", "vr"])
def test_transcriptions_every_format(client, models, name):
    from mlx_speech.transcribe import segments_from_words
    from mlx_speech.transcript import format_srt, format_vtt

    x = speechlike(2.0, seed=3)
    ref = models[name].transcribe(x)
    segs = segments_from_words(ref.words)
    f = ("a.wav", wav_bytes(x))
    create = client.audio.transcriptions.create
    assert create(model=name, file=f).text == ref.text
    assert create(model=name, file=f, response_format="text").strip() == ref.text
    assert create(model=name, file=f, response_format="srt") == format_srt(segs)
    assert create(model=name, file=f, response_format="vtt") == format_vtt(segs)
    v = create(model=name, file=f, response_format="verbose_json",
               timestamp_granularities=["word", "segment"])
    assert v.text == ref.text and abs(v.duration - 2.0) < 1e-6
    assert [(w.word, w.start, w.end) for w in v.words] == [
        (w.text, round(w.start, 3), round(w.end, 3)) for w in ref.words]
    assert [(s.start, s.end, s.text) for s in v.segments] == [
        (round(s.start, 3), round(s.end, 3), s.text) for s in segs]
    events = list(create(model=name, file=f, stream=True))
    assert events[-1].type == "transcript.text.done" and events[-1].text == ref.text
    assert "".join(e.delta for e in events[:-1]) == ref.text
    if name == "nm":
        assert len(ref.text) > 20 and len(events) > 2  # real text, streamed in pieces


def test_speech_bytes_equal_generate(client, models, srv):
    tts = models["tts"]
    text = "Hello there."
    ref = tts.generate(text, voice="casual_male", seed=7, max_frames=24).samples
    create = client.audio.speech.create
    # flac and mp3 are made whole, with generate()'s own chunking: the same bytes
    from mlx_speech.server.app import encode_audio

    for fmt in ("flac", "mp3"):
        got = create(model="tts", input=text, voice="casual_male", response_format=fmt,
                     extra_body={"seed": 7, "max_frames": 24}).content
        assert got == encode_audio(ref, 24000, fmt), fmt
    # pcm, opus, SSE (and wav with stream: true) stream as frames are decoded (4 frames a
    # chunk): streamed codec chunks equal the whole decode to float rounding, so within 1 LSB
    want = pcm16(ref).astype(np.int32)
    with client.audio.speech.with_streaming_response.create(
            model="tts", input=text, voice="casual_male", response_format="pcm",
            extra_body={"seed": 7, "max_frames": 24}) as r:
        parts = list(r.iter_bytes())
    got = np.frombuffer(b"".join(parts), "<i2").astype(np.int32)
    assert len(parts) > 1 and len(got) == len(want) and np.abs(got - want).max() <= 1
    wav = create(model="tts", input=text, voice="casual_male", response_format="wav",
                 extra_body={"seed": 7, "max_frames": 24}).content
    check_exact_wav(wav, want)
    with client.audio.speech.with_streaming_response.create(
            model="tts", input=text, voice="casual_male", response_format="wav",
            extra_body={"seed": 7, "max_frames": 24, "stream": True}) as r:
        assert "content-length" not in r.headers  # chunked: nobody knows the length yet
        parts = list(r.iter_bytes())
    wav = b"".join(parts)
    assert len(parts) > 1 and wav[4:8] == wav[40:44] == b"\xff" * 4  # the unknown-size marker
    assert np.abs(np.frombuffer(wav[44:], "<i2") - want).max() <= 1
    opus = create(model="tts", input=text, voice="casual_male", response_format="opus",
                  extra_body={"seed": 7, "max_frames": 24}).content
    dec, sr = sf.read(io.BytesIO(opus), dtype="float32")
    assert sr in (24000, 48000) and abs(len(dec) / sr - len(ref) / 24000) < 0.1
    with httpx.stream("POST", srv.base + "/v1/audio/speech", headers={
            "Authorization": f"Bearer {KEY}"}, json={
            "model": "tts", "input": text, "voice": "casual_male", "seed": 7, "max_frames": 24,
            "stream_format": "sse", "response_format": "pcm"}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    got = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), "<i2")
    assert np.abs(got.astype(np.int32) - want).max() <= 1
    # no seed: a random one, reported in x-seed, reproduces the bytes
    r = client.audio.speech.with_raw_response.create(
        model="tts", input=text, voice="neutral_female", response_format="flac",
        extra_body={"max_frames": 24})
    seed = int(r.headers["x-seed"])
    again = tts.generate(text, voice="neutral_female", seed=seed, max_frames=24).samples
    assert r.content == encode_audio(again, 24000, "flac")
    with pytest.raises(openai.BadRequestError, match="unknown voice 'nobody'; voices: "
                                                     "casual_male, neutral_female"):
        create(model="tts", input=text, voice="nobody")
    with pytest.raises(openai.BadRequestError, match="stream must be true or false"):
        create(model="tts", input=text, voice="casual_male", response_format="wav",
               extra_body={"stream": "yes"})


# ------------------------------------------------------------------ realtime


async def openai_realtime(srv, model: str, pcm24: np.ndarray) -> tuple[str, str]:
    c = openai.AsyncOpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    async with c.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "transcription": {"model": model}, "turn_detection": None}}})
        b = pcm24.tobytes()
        for i in range(0, len(b), 4800):  # 100 ms appends
            await conn.input_audio_buffer.append(audio=base64.b64encode(b[i:i + 4800]).decode())
        await conn.input_audio_buffer.commit()
        deltas, seen = [], []
        async for ev in conn:
            seen.append(ev.type)
            if ev.type == "conversation.item.input_audio_transcription.delta":
                deltas.append(ev.delta)
            elif ev.type == "conversation.item.input_audio_transcription.completed":
                assert seen[:3] == ["session.created", "session.updated",
                                    "input_audio_buffer.committed"]
                return "".join(deltas), ev.transcript
            assert ev.type != "error", ev


@pytest.mark.parametrize("name", ["nm", "vr"])
def test_openai_sdk_realtime_equals_transcribe_at_24k(srv, models, name):
    pcm = pcm16(resample(speechlike(2.0, seed=4), 16000, 24000))
    joined, transcript = run(openai_realtime(srv, name, pcm))
    ref = models[name].transcribe(pcm.astype(np.float32) / 32768, sample_rate=24000)
    assert joined == transcript == ref.text


@pytest.mark.parametrize("name", ["nm", "vr"])
def test_vllm_example_client_equals_transcribe(srv, models, name):
    pcm = pcm16(speechlike(2.0, seed=5))
    joined, done = run(vllm_client(srv, name, pcm))
    ref = models[name].transcribe(pcm.astype(np.float32) / 32768)
    assert joined == done["text"] == ref.text
    u = done["usage"]
    assert u["completion_tokens"] == len(ref.token_ids)
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_eight_concurrent_streams_at_real_time_pace(srv, models):
    """Each stream its own audio, 80 ms appends every 80 ms: each transcript equals the same
    audio transcribed alone, and the engine did batch streams into shared steps."""
    names = ["nm", "vr"] * 4
    pcms = [pcm16(speechlike(2.0, seed=10 + i)) for i in range(8)]
    before = dict(srv.engine.batch_sizes)

    async def all_streams():
        return await asyncio.gather(*(vllm_client(srv, n, p, pace_s=0.08, chunk_bytes=2560)
                                      for n, p in zip(names, pcms, strict=True)))

    results = run(all_streams())
    for n, p, (joined, done) in zip(names, pcms, results, strict=True):
        ref = models[n].transcribe(p.astype(np.float32) / 32768)
        assert joined == done["text"] == ref.text
    grew = {k: v - before.get(k, 0) for k, v in srv.engine.batch_sizes.items()}
    assert any(k > 1 and v > 0 for k, v in grew.items()), grew


# ------------------------------------------------------------------ faults


async def _errors_then_healthy(srv):
    hdr = {"Authorization": f"Bearer {KEY}"}
    async with websockets.connect(srv.ws + "/v1/realtime", additional_headers=hdr) as ws:
        await ws.recv()

        async def expect(msg, code):
            await ws.send(msg)
            ev = json.loads(await ws.recv())
            assert ev["type"] == "error" and ev["code"] == code and isinstance(ev["error"], str), ev

        await expect("{not json", "invalid_json")
        await expect(json.dumps({"type": "input_audio_buffer.append", "audio": "@@@"}),
                     "invalid_audio")
        await expect(json.dumps({"type": "response.create"}), "unknown_event")
        await expect(json.dumps({"type": "input_audio_buffer.commit"}), "model_not_validated")
        await expect(json.dumps({"type": "session.update", "model": "gpt-4o"}), "model_not_found")
        # more than max_buffer_s (4 s) before the start commit: buffer_full, chunk not taken
        big = base64.b64encode(pcm16(speechlike(5.0)).tobytes()).decode()
        await expect(json.dumps({"type": "input_audio_buffer.append", "audio": big}),
                     "buffer_full")
    # OpenAI dialect: its error shape
    async with websockets.connect(srv.ws + "/v1/realtime?intent=transcription",
                                  additional_headers=hdr) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"transcription": {"model": "nope"}}}}}))
        ev = json.loads(await ws.recv())
        assert ev["type"] == "error" and ev["error"]["code"] == "model_not_found"
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        ev = json.loads(await ws.recv())
        assert ev["error"]["code"] == "input_audio_buffer_commit_empty"
    # disconnect mid-stream: the session is freed at once
    ws = await websockets.connect(srv.ws + "/v1/realtime", additional_headers=hdr)
    await ws.recv()
    await ws.send(json.dumps({"type": "session.update", "model": "nm"}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(
        pcm16(speechlike(1.0)).tobytes()).decode()}))
    await asyncio.sleep(0.3)
    ws.transport.abort()  # no close frame
    t0 = time.time()
    while srv.engine.open_jobs:
        assert time.time() - t0 < 10, "the session of a gone client was not freed"
        await asyncio.sleep(0.05)


def test_fault_cases_then_still_correct(srv, models, client):
    run(_errors_then_healthy(srv))
    # missing / wrong API key, on HTTP and on the WebSocket handshake
    r = httpx.get(srv.base + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(srv.base + "/v1/models", headers={"Authorization": "Bearer no"}
                     ).status_code == 401
    for hdr in ({}, {"Authorization": "Bearer no"},
                {"Authorization": f"Bearer {KEY}", "Origin": "https://evil.example"}):
        with pytest.raises(websockets.exceptions.InvalidStatus) as e:
            run(websockets.connect(srv.ws + "/v1/realtime", additional_headers=hdr).__aenter__())
        assert e.value.response.status_code == 403
    # a browser page on the allowed origin (key as the subprotocol OpenAI's browser SDK uses)

    async def browser():
        async with websockets.connect(
                srv.ws + "/v1/realtime", origin=GOOD_ORIGIN,
                subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
            return json.loads(await ws.recv())["type"]

    assert run(browser()) == "session.created"
    # oversize upload: 413
    with pytest.raises(openai.APIStatusError) as e:
        client.audio.transcriptions.create(model="nm", file=("big.wav", wav_bytes(
            np.zeros(MAX_UPLOAD // 4 + 100, np.float32))))
    assert e.value.status_code == 413

    def chunked():  # no Content-Length: counted as it is read
        body = wav_bytes(np.zeros(MAX_UPLOAD // 4 + 100, np.float32))
        head = (b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nnm\r\n--b\r\n"
                b"Content-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
                b"Content-Type: audio/wav\r\n\r\n")
        yield head
        for i in range(0, len(body), 65536):
            yield body[i:i + 65536]
        yield b"\r\n--b--\r\n"

    r = httpx.post(srv.base + "/v1/audio/transcriptions", content=chunked(), headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "multipart/form-data; boundary=b"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # an upload that is not audio: the field and the file's name, no Python object
    r = httpx.post(srv.base + "/v1/audio/transcriptions", headers={
        "Authorization": f"Bearer {KEY}"}, data={"model": "nm"},
        files={"file": ("notes.txt", b"not audio at all", "text/plain")})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "file", err
    assert err["message"].startswith("the 'file' field ('notes.txt'): cannot read the audio")
    assert "0x" not in err["message"] and "BytesIO" not in err["message"], err
    # still healthy and correct
    assert httpx.get(srv.base + "/health").status_code == 200
    x = speechlike(1.5, seed=9)
    assert client.audio.transcriptions.create(model="nm", file=("a.wav", wav_bytes(x))
                                              ).text == models["nm"].transcribe(x).text


def test_model_step_failure_is_an_error_event(srv, models, client, monkeypatch):
    def boom(pairs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(models["nm"], "feed_many", boom)
    f = ("a.wav", wav_bytes(speechlike(0.5)))
    with pytest.raises(openai.InternalServerError, match="out of memory"):
        client.audio.transcriptions.create(model="nm", file=f)
    with pytest.raises(openai.APIError, match="model step failed: out of memory"):
        list(client.audio.transcriptions.create(model="nm", file=f, stream=True))  # SSE error
    with pytest.raises(AssertionError, match="model step failed: out of memory.*processing_error"):
        run(vllm_client(srv, "nm", pcm16(speechlike(0.5))))
    monkeypatch.undo()
    assert httpx.get(srv.base + "/health").status_code == 200
    pcm = pcm16(speechlike(1.0, seed=2))
    joined, _ = run(vllm_client(srv, "nm", pcm))
    assert joined == models["nm"].transcribe(pcm.astype(np.float32) / 32768).text


def test_a_failed_stream_takes_appends_until_its_error_arrives():
    """The engine fails a stream on its thread and its error reaches the client through the
    event loop; appends the loop reads in between are taken quietly, so no error of the
    connection's own overtakes the stream's (the client sees processing_error first)."""
    from types import SimpleNamespace

    from mlx_speech.server.engine import Engine
    from mlx_speech.server.jobs import AsrStream, BufferFull

    events = []
    s = Engine().submit(AsrStream(SimpleNamespace(sample_rate=16000), None, events.append, 16000))
    s.fail("processing_error", "model step failed: out of memory")
    s.push(np.zeros(1280, np.float32))
    assert events == [("error", "processing_error", "model step failed: out of memory")]
    s.end()  # what the client ended itself still refuses audio, at once
    with pytest.raises(BufferFull):
        s.push(np.zeros(1280, np.float32))


def test_engine_death_fails_open_sessions_and_health(models):
    """A dead engine thread: every open session gets an error event, /health is 503 and new
    requests are refused, instead of clients hanging (vLLM's and mlx-lm's failures)."""
    with ServerThread({"nm": models["nm"]}, idle_timeout_s=0.5) as s:
        async def idle():  # a client that sends nothing (and has no turn in flight)
            async with websockets.connect(s.ws + "/v1/realtime") as ws:
                await ws.recv()
                ev = json.loads(await ws.recv())
                with pytest.raises(websockets.exceptions.ConnectionClosed):
                    await ws.recv()
                return ev

        assert run(idle())["code"] == "idle_timeout"

        async def scenario():
            async with websockets.connect(s.ws + "/v1/realtime") as ws:
                await ws.recv()
                await ws.send(json.dumps({"type": "session.update", "model": "nm"}))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                t0 = time.time()
                while not s.engine.open_jobs:
                    assert time.time() - t0 < 10
                    await asyncio.sleep(0.02)
                await asyncio.sleep(1.0)  # idle, but a turn is in flight: no timeout

                def die():
                    raise MemoryError("allocation failed")

                s.engine.step = die
                s.engine.wake()
                return json.loads(await ws.recv())

        ev = run(scenario())
        assert ev["type"] == "error" and ev["code"] == "processing_error"
        assert "allocation failed" in ev["error"]
        r = httpx.get(s.base + "/health")
        assert r.status_code == 503 and "allocation failed" in r.json()["error"]
        r = httpx.post(s.base + "/v1/audio/transcriptions", files={
            "file": ("a.wav", wav_bytes(speechlike(0.5)))}, data={"model": "nm"})
        assert r.status_code == 503


# ------------------------------------------------------------------ Kyutai /api/chat


def test_kyutai_protocol_equals_session_step(srv, models):
    """The client's Opus stream is decoded by the server exactly as by sphn here, so the
    expected answer is `session.step()` on those frames; the server's Opus bytes must equal
    sphn's encoding of the stepped PCM, and its text the stepped text."""
    import sphn

    moshi = models["moshi"]
    F = moshi.frame_size
    rng = np.random.default_rng(0)
    user = (0.3 * np.sin(2 * np.pi * 220 * np.arange(12 * F) / 24000)
            + 0.05 * rng.standard_normal(12 * F)).astype(np.float32)
    w = sphn.OpusStreamWriter(24000)
    packets = [w.append_pcm(user[i:i + 960]) for i in range(0, len(user), 960)]
    packets = [p for p in packets if p]
    r = sphn.OpusStreamReader(24000)
    pcm = np.concatenate([r.append_bytes(p) for p in packets])
    n = len(pcm) // F
    assert n >= 6
    session = moshi.session(seed=3)
    ew = sphn.OpusStreamWriter(24000)
    want_audio, want_text = b"", ""
    for i in range(n):
        out, text = session.step(pcm[i * F:(i + 1) * F])
        want_audio += ew.append_pcm(out)
        want_text += text

    audio, text = run(kyutai_talk(srv.ws + "/api/chat?seed=3", packets, len(want_audio),
                                  len(want_text), {"Authorization": f"Bearer {KEY}"}))
    assert len(want_audio) > 0
    assert audio == want_audio and text == want_text


# ------------------------------------------------------------------ command line


def test_command_line(monkeypatch, capsys, tmp_path):
    import subprocess
    import sys

    from mlx_speech import cli
    from mlx_speech import server as srv_mod

    root = Path(__file__).resolve().parents[2]
    code = ("import sys, mlx_speech, mlx_speech.server, mlx_speech.cli; print([m for m in "
            "('fastapi', 'uvicorn', 'starlette', 'websockets', 'openai', 'ray') if m in "
            "sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert r.stdout.strip() == "[]", r.stderr
    r = subprocess.run([sys.executable, "-m", "mlx_speech.server", "--help"],
                       capture_output=True, text=True, cwd=root)
    assert r.returncode == 0 and "--allowed-origin" in r.stdout
    with pytest.raises(SystemExit):
        cli.main(["server", "--help"])
    assert "--api-key" in capsys.readouterr().out

    seen = {}
    nm = mlx_speech.load(GOLDEN / "nemotron")

    def fake_locate(path, **kw):  # the checks at start: kind and options, from the configs
        seen[path] = kw
        return "nemotron_asr_streaming", f"/cache/{path}"

    def fake_load(path, **kw):  # --preload: loaded at start, from where locate found it
        seen["load", path] = kw
        return nm

    def fake_serve(app, sock, engine, forwarded_allow_ips=None):
        seen["bind"] = sock.getsockname()[:2]

    monkeypatch.setattr(mlx_speech, "locate", fake_locate)
    monkeypatch.setattr(mlx_speech, "load", fake_load)
    monkeypatch.setattr(srv_mod, "serve", fake_serve)
    assert srv_mod.main(["--model", "a/b", "--quantize", "4", "--port", "0", "--preload"]) == 0
    assert seen["a/b"]["quantize"] == 4 and seen["bind"][0] == "127.0.0.1" and seen["bind"][1]
    assert seen["a/b"]["kind"] == ("asr", "tts", "duplex")
    assert seen["load", "/cache/a/b"]["quantize"] == 4
    assert "warning" not in capsys.readouterr().err
    assert srv_mod.main(["--model", "m", "--host", "0.0.0.0", "--port", "0"]) == 0
    assert "warning: listening on 0.0.0.0 without --api-key" in capsys.readouterr().err
    assert srv_mod.main(["--model", "m", "--host", "0.0.0.0", "--api-key", "k",
                         "--port", "0"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert srv_mod.main(["--model", "m", "--model", "m"]) == 1
    assert "given twice" in capsys.readouterr().err


def test_port_in_use_is_one_line_before_any_load(monkeypatch, capsys):
    import socket

    from mlx_speech import server as srv_mod

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the port was bound")

    monkeypatch.setattr(mlx_speech, "load", no_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert srv_mod.main(["--model", "a/b", "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: cannot listen on 127.0.0.1:{port}: the port is in use (another "
                   "server running? choose another with --port)"]


def test_server_refuses_a_vad_before_loading_it(monkeypatch, capsys, tmp_path):
    """A served model's kind comes from its config files: a Silero VAD folder is refused
    before its weights are read."""
    import mlx_speech.models.silero_vad as sv
    from mlx_speech import server as srv_mod

    monkeypatch.setattr(sv, "load", lambda *a, **k: pytest.fail("loaded"))
    (tmp_path / "config.json").write_text('{"model_type": "silero_vad"}')
    monkeypatch.setattr(srv_mod, "serve", lambda app, sock: pytest.fail("served"))
    assert srv_mod.main(["--model", str(tmp_path), "--port", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: {tmp_path} is a Silero VAD model, not speech-to-text or "
                   "text-to-speech or full-duplex; give it to --vad")


def test_server_does_not_import_the_cli():
    import subprocess
    import sys

    code = ("import sys, mlx_speech.server.app, mlx_speech.server.realtime; "
            "print('mlx_speech.transcribe' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.stdout.strip() == "False", r.stderr


def test_text_deltas_join_to_the_final_text():
    from mlx_speech.server.common import TextDeltas

    t = TextDeltas()
    parts = [t.add(x) for x in [" ", " Hello", " ", "wor", "ld  ", "\n"]]
    assert parts == ["", "Hello", "", " wor", "ld", ""]
    assert t.final("Hello world.") == "."
    assert "".join(parts) + "." == "Hello world."


def test_kyutai_protocol_errors(srv):
    async def talk(query):
        async with websockets.connect(srv.ws + "/api/chat" + query, additional_headers={
                "Authorization": f"Bearer {KEY}"}) as ws:
            return await ws.recv()

    # a role prompt on a Kyutai model is refused by the session (made on the engine thread)
    assert run(talk("?role=tutor")) == (b"\x05voice and role prompts need a PersonaPlex "
                                         b"checkpoint")
    assert run(talk("?model=nm")).startswith(b"\x05model 'nm' is a speech-to-text model")
    assert run(talk("?seed=x")) == b"\x05seed must be a non-negative integer"
    assert httpx.get(srv.base + "/health").status_code == 200
