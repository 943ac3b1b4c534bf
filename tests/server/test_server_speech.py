"""Speech through the engine and over `WS /v1/audio/speech/stream`: concurrent speech jobs of one
model stepped together (one batched step a frame) each equal to its session alone, with joins,
leaves and cancels, B = 1..16, under the kernel watch; cancel stops within one frame; a socket's
generations never overlap. Over the WebSocket (a plain `websockets` client): text sent in 1-30
character deltas gives exactly the audio of the same text sent whole and of `stream_text`, the
first audio carries its time, barge-in, several generations per socket, Opus, every refusal,
and the job dropped when the client leaves."""

from __future__ import annotations

import base64
import io
import json
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
websockets = pytest.importorskip("websockets")

import soundfile as sf  # noqa: E402

import mlx_speech  # noqa: E402
from mlx_speech.nn import cache as nn_cache  # noqa: E402
from mlx_speech.server import speech_stream  # noqa: E402
from mlx_speech.server.engine import Engine  # noqa: E402
from mlx_speech.server.speech import SpeechJob  # noqa: E402
from tests.support.numbers import same_numbers  # noqa: E402
from tests.support.server import KEY, ServerThread, pcm16, run  # noqa: E402
from tests.support.voxtral import TTS_TEXTS as TEXTS  # noqa: E402
from tests.support.voxtral import TTS_VOICES as VOICES  # noqa: E402
from tests.support.voxtral import joined, spoken_alone  # noqa: E402
from tests.support.voxtral import load_ending_tts as load_ending  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "golden"
DEADLINE_S = 60.0
PATH = "/v1/audio/speech/stream"
TEXT = "Hi there! One more voice here, with a clause. Third one. And the last"


@pytest.fixture(scope="module")
def ending():
    return load_ending()


def _pieces(text: str, seed: int, largest: int = 30) -> list[str]:
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, largest)
        out.append(text[i: i + n])
        i += n
    return out


class Got:
    """A job's events: audio joined, the done info or the error."""

    def __init__(self):
        self.audio, self.done, self.error = [], None, None

    def __call__(self, ev):
        if ev[0] == "audio":
            self.audio.append(ev[1])
        elif ev[0] == "done":
            self.done = ev[1]
        else:
            self.error = ev

    @property
    def samples(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)


def _setup(k: int) -> dict:
    return dict(voice=VOICES[k % 2], seed=k, max_frames=(9, 14, 20, 30)[k % 4],
                first_frames=(4, 1, 3)[k % 3], chunk_frames=(4, 16, 5)[k % 3])


@pytest.mark.parametrize("fixed", [False, True], ids=["cpu-shapes", "fixed-shapes"])
def test_speech_jobs_batched_equal_each_alone(ending, kernels, monkeypatch, fixed):
    """16 jobs join eight a tick: whole texts (as REST gives them) and texts fed a piece a tick
    (as the WebSocket does), two leave early (client gone), one is cancelled: each job's audio
    is its session's alone, the batches grow to 16 and shrink back, one step_many a tick."""
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", fixed)
    tts = ending
    calls = []
    real = tts.step_many
    monkeypatch.setattr(tts, "step_many", lambda ss: (calls.append(len(ss)), real(ss))[1])
    eng = Engine()  # not started: this thread steps it
    jobs, gots, pieces = [], [], {}
    leave, cancel = {3: 6, 7: 9}, (11, 10)  # job -> tick it leaves; (job, tick) cancelled
    for tick in range(400):
        if tick < 2:
            for k in range(8 * tick, 8 * tick + 8):
                kw, text = _setup(k), TEXTS[k % 4]
                got = Got()
                if k % 2:  # fed a piece a tick, then flushed
                    make = lambda kw=kw: tts.session(**kw)  # noqa: E731
                    pieces[k] = _pieces(text, k, largest=20)
                else:
                    make = lambda kw=kw, text=text: tts.session(**kw, text=text)  # noqa: E731
                jobs.append(eng.submit(SpeechJob(tts, make, got)))
                gots.append(got)
        for k, ps in pieces.items():
            if ps:
                jobs[k].feed(ps.pop(0))
                if not ps:
                    jobs[k].flush()
        for k, t in leave.items():
            if t == tick:
                jobs[k].close()
        if tick == cancel[1]:
            jobs[cancel[0]].cancel()
        n = len(calls)
        busy = eng.step()
        assert len(calls) - n <= 1  # one batched call a tick for the one model
        if not busy and tick > 2 and not eng.open_jobs:
            break
    assert eng.open_jobs == 0
    assert 16 in calls and len(set(calls)) >= 6, calls
    for k, got in enumerate(gots):
        kw, text = _setup(k), TEXTS[k % 4]
        ref = (spoken_alone(tts, text, **kw) if k % 2 else
               joined(tts.stream(text, kw["voice"], kw["seed"], kw["max_frames"],
                                 first_frames=kw["first_frames"],
                                 chunk_frames=kw["chunk_frames"])))
        x = got.samples
        assert got.error is None, (k, got.error)
        if k in leave or k == cancel[0]:
            assert len(x) < len(ref) and same_numbers(x, ref[: len(x)]), k
            assert (got.done is None) == (k in leave), k  # a cancel says it is done
        else:
            assert got.done == {"frames": got.done["frames"], "segments": got.done["segments"],
                                "cancelled": False}
            assert len(ref) and same_numbers(x, ref), k


def test_cancel_stops_within_one_frame(ending):
    """Cancelled between ticks: the next tick makes no frame for it and says it is done.
    Cancelled from another thread while the engine runs: at most the frame in flight more."""
    tts = ending
    eng = Engine()
    a, b = Got(), Got()
    ja = eng.submit(SpeechJob(tts, lambda: tts.session(seed=1, max_frames=40), a))
    jb = eng.submit(SpeechJob(tts, lambda: tts.session(seed=2, max_frames=40), b))
    for j in (ja, jb):
        j.feed(TEXTS[1])
        j.flush()
    for _ in range(5):
        eng.step()
    frames = ja.session.frames
    ja.cancel()
    eng.step()
    assert ja.session.frames == frames and a.done["cancelled"] and jb.session.frames > frames
    # while the engine runs
    eng = Engine().start()
    try:
        first = threading.Event()
        c = Got()

        def sink(ev):
            c(ev)
            first.set()

        jc = eng.submit(SpeechJob(tts, lambda: tts.session(seed=5, max_frames=2000), sink))
        jc.feed("A long text that goes on " * 20)
        assert first.wait(DEADLINE_S)
        jc.cancel()
        at = jc.session.frames  # at least its frames when cancelled
        t0 = time.monotonic()
        while c.done is None:
            assert time.monotonic() - t0 < DEADLINE_S
            time.sleep(0.01)
        assert c.done["cancelled"] and jc.session.frames <= at + 1
    finally:
        eng.stop()


def test_a_sockets_generations_do_not_overlap(ending):
    """A job `after` another is not stepped until that one is done; then it speaks its own
    audio, as alone."""
    tts = ending
    eng = Engine()
    a, b = Got(), Got()
    ja = eng.submit(SpeechJob(tts, lambda: tts.session(seed=4, max_frames=6, text=TEXTS[0]), a))
    jb = eng.submit(SpeechJob(tts, lambda: tts.session(seed=5, max_frames=6, text=TEXTS[1]), b,
                              after=ja))
    while a.done is None:
        eng.step()
        assert not b.audio and jb.session.frames == 0
    while b.done is None:
        eng.step()
    assert np.array_equal(b.samples, joined(tts.stream(TEXTS[1], seed=5, max_frames=6,
                                                       first_frames=4, chunk_frames=16)))


# ------------------------------------------------------------------ the WebSocket


@pytest.fixture(scope="module")
def tts():
    return mlx_speech.load(GOLDEN / "voxtral_tts" / "ckpt")


@pytest.fixture(scope="module")
def srv(tts):
    with ServerThread({"tts": tts}, api_key=KEY, allowed_origins=["https://app.example"]) as s:
        yield s


async def _connect(srv, headers=None):
    ws = await websockets.connect(srv.ws + PATH, additional_headers=headers or {
        "Authorization": f"Bearer {KEY}"})
    ev = json.loads(await ws.recv())
    assert ev["type"] == "session.created" and ev["session"]["model"] == "tts"
    return ws


async def _until(ws, kind: str) -> tuple[list[dict], dict]:
    """Events up to the first of type `kind`: (those before, that one)."""
    before = []
    while True:
        ev = json.loads(await ws.recv())
        if ev["type"] == kind:
            return before, ev
        before.append(ev)


def _pcm(deltas: list[dict]) -> np.ndarray:
    parts = [np.frombuffer(base64.b64decode(e["audio"]), "<i2") for e in deltas
             if e["type"] == "speech.audio.delta"]
    return np.concatenate(parts) if parts else np.zeros(0, "<i2")


async def _speak(srv, pieces: list[str], session: dict) -> tuple[np.ndarray, list, dict]:
    """One generation on a fresh socket: (pcm16, its events, speech.audio.done)."""
    ws = await _connect(srv)
    try:
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        _, upd = await _until(ws, "session.updated")
        assert {k: upd["session"][k] for k in session} == session
        for p in pieces:
            await ws.send(json.dumps({"type": "input_text.append", "text": p}))
        await ws.send(json.dumps({"type": "input_text.end"}))
        evs, done = await _until(ws, "speech.audio.done")
        with pytest.raises(websockets.ConnectionClosedOK):  # end: closed after the audio
            await ws.recv()
        return _pcm(evs), evs, done
    finally:
        await ws.close()


def test_text_in_pieces_equals_the_text_whole(srv, tts):
    """The same text whole and in 1-30 character deltas (three cuts): the same pcm16, which is
    `stream_text`'s audio (4-frame chunks) as pcm16; the first delta carries `ttfa_ms`."""
    session = {"voice": "neutral_female", "seed": 4, "max_frames": 9}
    whole, evs, done = run(_speak(srv, [TEXT], session))
    ref = joined(tts.stream_text(TEXT, voice="neutral_female", seed=4, max_frames=9,
                                 first_frames=4, chunk_frames=4))
    assert np.array_equal(whole, pcm16(ref))
    assert evs[0]["type"] == "speech.audio.delta" and evs[0]["ttfa_ms"] > 0
    assert all("ttfa_ms" not in e for e in evs[1:])
    assert done["ttfa_ms"] == evs[0]["ttfa_ms"] and done["cancelled"] is False
    assert done["usage"] == {"characters": len(TEXT), "segments": 4, "frames": 36,
                             "audio_seconds": round(len(whole) / 24000, 3)}
    for seed in range(3):
        got, _, d = run(_speak(srv, _pieces(TEXT, seed, [1, 7, 30][seed]), session))
        assert np.array_equal(got, whole), seed
        assert d["usage"] == done["usage"]
    # a clause after 3 words cuts the second sentence: other segments, other audio
    got, _, d = run(_speak(srv, _pieces(TEXT, 9), {**session, "clause_words": 3}))
    assert d["usage"]["segments"] == 5
    ref = joined(tts.stream_text(TEXT, voice="neutral_female", seed=4, max_frames=9,
                                 first_frames=4, chunk_frames=4, clause_words=3))
    assert np.array_equal(got, pcm16(ref))


def test_generations_barge_in_and_opus(srv, tts):
    """One socket: a generation flushed, a second one (seed again from `seed`: its audio is
    the text's alone), a third cancelled after its first audio (done says so, no audio after
    it), then a fourth that speaks whole; Opus pages decode to the audio's length."""
    first = "Hello there."
    second = "How are you? Fine."

    async def go():
        ws = await _connect(srv)
        await ws.send(json.dumps({"type": "session.update", "session": {
            "seed": 7, "max_frames": 12, "voice": "casual_male"}}))
        await _until(ws, "session.updated")
        out = []
        for text in (first, second):
            await ws.send(json.dumps({"type": "input_text.append", "text": text}))
            await ws.send(json.dumps({"type": "input_text.flush"}))
        for _ in range(2):
            out.append(await _until(ws, "speech.audio.done"))
        await ws.send(json.dumps({"type": "input_text.append", "text": "Stop me. " * 30}))
        before, delta = await _until(ws, "speech.audio.delta")
        await ws.send(json.dumps({"type": "speech.cancel"}))
        out.append(await _until(ws, "speech.audio.done"))
        await ws.send(json.dumps({"type": "input_text.append", "text": first}))
        await ws.send(json.dumps({"type": "input_text.flush"}))
        out.append(await _until(ws, "speech.audio.done"))
        await ws.send(json.dumps({"type": "session.update", "session": {
            "response_format": "opus"}}))
        await _until(ws, "session.updated")
        await ws.send(json.dumps({"type": "input_text.append", "text": second}))
        await ws.send(json.dumps({"type": "input_text.flush"}))
        out.append(await _until(ws, "speech.audio.done"))
        await ws.close()
        return out

    res = run(go())
    alone = {t: pcm16(joined(tts.stream_text(t, voice="casual_male", seed=7, max_frames=12,
                                             first_frames=4, chunk_frames=4)))
             for t in (first, second)}
    for (evs, done), text, n in zip(res[:2], (first, second), (1, 2), strict=True):
        assert done["generation"] == n and np.array_equal(_pcm(evs), alone[text])
    evs, done = res[2]
    assert done["cancelled"] is True and done["generation"] == 3
    assert done["usage"]["frames"] < 30 * 12  # it stopped
    evs, done = res[3]
    assert not done["cancelled"] and np.array_equal(_pcm(evs), alone[first])
    evs, done = res[4]
    ogg = b"".join(base64.b64decode(e["audio"]) for e in evs)
    dec, sr = sf.read(io.BytesIO(ogg), dtype="float32")
    assert sr in (24000, 48000) and abs(len(dec) / sr - len(alone[second]) / 24000) < 0.1


def _error(ev: dict, code: str, param=None) -> None:
    assert ev["type"] == "error" and ev["error"]["code"] == code, ev
    assert ev["error"]["param"] == param, ev


def test_refusals(srv, monkeypatch):
    """Every client value checked (validate.py) and answered with OpenAI's realtime error
    shape; the socket goes on after each; bounds on a delta, a generation and pending text."""
    monkeypatch.setattr(speech_stream, "MAX_GENERATION_CHARS", 60)

    async def go():
        ws = await _connect(srv)
        checks = [
            ("not json", "invalid_json", None),
            (json.dumps([1]), "invalid_json", None),
            (json.dumps({"type": "nope"}), "unknown_event", None),
            (json.dumps({"type": "input_text.append"}), "invalid_value", "text"),
            (json.dumps({"type": "input_text.append", "text": 5}), "invalid_value", "text"),
            (json.dumps({"type": "input_text.append", "text": "x" * 4097}), "invalid_value",
             "text"),
            (json.dumps({"type": "session.update", "session": {"clause_words": 0}}),
             "invalid_value", "session.clause_words"),
            (json.dumps({"type": "session.update", "session": {"response_format": "mp3"}}),
             "invalid_value", "session.response_format"),
            (json.dumps({"type": "session.update", "session": {"seed": -1}}), "invalid_value",
             "session.seed"),
            (json.dumps({"type": "session.update", "session": {"max_frames": 4096}}),
             "invalid_value", "session.max_frames"),
            (json.dumps({"type": "session.update", "session": {"voice": "nobody"}}),
             "invalid_value", "session.voice"),
            (json.dumps({"type": "session.update", "session": {"model": "other"}}),
             "model_not_found", "session.model"),
            ("x" * 70000, "message_too_large", None),
        ]
        for msg, code, param in checks:
            await ws.send(msg)
            _error(json.loads(await ws.recv()), code, param)
        await ws.send(json.dumps({"type": "input_text.append", "text": "An open text " * 4}))
        await ws.send(json.dumps({"type": "session.update", "session": {"seed": 1}}))
        _error(json.loads(await ws.recv()), "generation_open", "session")
        await ws.send(json.dumps({"type": "input_text.append", "text": "y" * 20}))
        _error(json.loads(await ws.recv()), "text_too_long", "text")  # 52 + 20 > 60
        await ws.send(json.dumps({"type": "speech.cancel"}))
        await _until(ws, "speech.audio.done")
        await ws.close()

    run(go())
    monkeypatch.setattr(speech_stream, "MAX_GENERATION_CHARS", 1 << 20)

    async def flood():  # 4000 characters a delta, never a sentence end: pending text bound
        ws = await _connect(srv)
        for _ in range(6):
            await ws.send(json.dumps({"type": "input_text.append", "text": "word " * 800}))
        evs, err = await _until(ws, "error")
        _error(err, "buffer_full", "text")
        await ws.send(json.dumps({"type": "speech.cancel"}))
        await _until(ws, "speech.audio.done")
        await ws.close()

    run(flood())


def test_handshake_refusals_and_the_client_leaving(srv):
    """No key, a bad Origin: refused at the handshake like the other sockets. A client gone
    mid-generation: its job is dropped (the engine holds no open job after)."""
    for headers in ({}, {"Authorization": f"Bearer {KEY}", "Origin": "https://evil.example"}):
        with pytest.raises(websockets.InvalidStatus) as e:
            run(_connect(srv, headers or {"x-nothing": "1"}))
        assert e.value.response.status_code == 403

    async def leave():
        ws = await _connect(srv)
        await ws.send(json.dumps({"type": "input_text.append", "text": "Going on. " * 40}))
        await _until(ws, "speech.audio.delta")
        await ws.close()

    run(leave())
    t0 = time.monotonic()
    while srv.engine.open_jobs:
        assert time.monotonic() - t0 < DEADLINE_S, "the gone client's job was kept"
        time.sleep(0.02)


def test_rest_reports_its_time_to_first_audio(srv):
    """POST /v1/audio/speech, streamed and whole: `x-time-to-first-audio-ms` (the stream's
    status line waits for its first audio)."""
    import httpx

    for extra in ({"response_format": "pcm"}, {"response_format": "wav"}):
        r = httpx.post(srv.base + "/v1/audio/speech", headers={
            "Authorization": f"Bearer {KEY}"}, json={"input": "Hello.", "seed": 1,
                                                      "max_frames": 8, **extra},
            timeout=DEADLINE_S)
        assert r.status_code == 200 and float(r.headers["x-time-to-first-audio-ms"]) > 0
    r = httpx.post(srv.base + "/v1/audio/speech", headers={"Authorization": f"Bearer {KEY}"},
                   json={"input": "...", "response_format": "pcm"}, timeout=DEADLINE_S)
    assert r.status_code == 400 and "no letters or digits" in r.json()["error"]["message"]


def test_idle_timeout_counts_audio_not_open_generations(tts, monkeypatch):
    """A socket speaking for longer than --idle-timeout-s (each frame made slow here) is not
    idle; one whose generation waits for text that never comes is closed, with its reason."""
    real = tts.step_many
    monkeypatch.setattr(tts, "step_many", lambda ss: (time.sleep(0.01), real(ss))[1])
    with ServerThread({"tts": tts}, idle_timeout_s=0.5) as s:
        async def go():
            ws = await _connect(s, {"x-nothing": "1"})
            await ws.send(json.dumps({"type": "session.update", "session": {"max_frames": 30}}))
            await _until(ws, "session.updated")
            await ws.send(json.dumps({"type": "input_text.append", "text": "Hi. Hi. Hi."}))
            await ws.send(json.dumps({"type": "input_text.flush"}))
            _, done = await _until(ws, "speech.audio.done")  # 90 frames: over 0.9 s
            await ws.send(json.dumps({"type": "input_text.append", "text": "No end"}))
            _, err = await _until(ws, "error")
            _error(err, "idle_timeout")
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return done

        done = run(go())
        assert done["usage"]["frames"] == 90 and not done["cancelled"]
