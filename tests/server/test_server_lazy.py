"""Models loaded when a request first names them and freed when idle (server/models.py): the
kind checked at start from the config files, /v1/models and /health saying what is loaded,
realtime clients told while a model loads, a bounded wait, the memory freed on unload and the
next request answered exactly as the library does. Time is a fake clock the test advances."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
websockets = pytest.importorskip("websockets")

import httpx  # noqa: E402

import mlx_speech  # noqa: E402
from mlx_speech.registry import MODELS, model_module  # noqa: E402
from mlx_speech.server.models import Models  # noqa: E402
from tests.conftest import speechlike  # noqa: E402
from tests.support.server import DEADLINE_S, ServerThread, pcm16, run, wav_bytes  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "golden"
NM, TTS = GOLDEN / "nemotron", GOLDEN / "voxtral_tts" / "ckpt"
IDLE_S = 30.0


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def nm_ref():
    return mlx_speech.load(NM)


def store(clock=None, **kw) -> Models:
    return Models.locate({"nm": NM, "tts": TTS}.values(), clock=clock or time.monotonic, **kw)


def ids(s: Models) -> tuple[str, str]:
    return tuple(s)


def idle_store(nm_ref, seconds: float, seed: int):
    """(clock, store freeing models after IDLE_S, the ASR id, audio, its transcript)."""
    clock = Clock()
    s = store(clock, unload_after_s=IDLE_S)
    x = speechlike(seconds, seed=seed)
    return clock, s, ids(s)[0], x, nm_ref.transcribe(x).text


def wait_until(cond, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < DEADLINE_S, what
        time.sleep(0.02)


def sweeps_after(s: Models, srv) -> None:
    """Wait until the engine has looked at the idle models twice more (each loop of the
    engine thread runs the sweep, at least every 0.5 s when idle)."""
    n = s.sweeps
    srv.engine.wake()
    wait_until(lambda: s.sweeps >= n + 2, "the engine did not sweep")


def transcribe(srv, model: str, x: np.ndarray, headers=None) -> httpx.Response:
    return httpx.post(srv.base + "/v1/audio/transcriptions", timeout=DEADLINE_S,
                      headers=headers,
                      data={"model": model}, files={"file": ("a.wav", wav_bytes(x))})


def test_checked_at_start_loaded_when_named_and_listed(nm_ref):
    s = store()
    nm, tts = ids(s)
    assert [s.state(m) for m in s] == ["not_loaded", "not_loaded"]
    with ServerThread(s, api_key="k") as srv:
        auth = {"Authorization": "Bearer k"}
        listed = httpx.get(srv.base + "/v1/models", headers=auth).json()["data"]
        assert [(m["id"], m["kind"], m["loaded"], m["state"]) for m in listed] == [
            (nm, "asr", False, "not_loaded"), (tts, "tts", False, "not_loaded")]
        assert "sample_rate" not in listed[0]  # known once loaded
        assert httpx.get(srv.base + "/health", headers=auth).json() == {
            "status": "ok", "models": [nm, tts], "loaded": []}
        x = speechlike(1.5, seed=4)
        r = transcribe(srv, nm, x, auth)
        assert r.status_code == 200 and r.json()["text"] == nm_ref.transcribe(x).text
        listed = httpx.get(srv.base + "/v1/models", headers=auth).json()["data"]
        assert [(m["loaded"], m.get("sample_rate")) for m in listed] == [(True, 16000),
                                                                        (False, None)]
        assert httpx.get(srv.base + "/health", headers=auth).json() == {
            "status": "ok", "models": [nm, tts], "loaded": [nm]}
        assert s.entries[nm].loads == 1 and s.entries[tts].loads == 0
        # the page loads a model before its tab is used (an extension), and gets its details
        r = httpx.post(srv.base + f"/v1/models/{tts}/load", headers=auth, timeout=DEADLINE_S)
        assert r.status_code == 200 and r.json()["loaded"] and r.json()["sample_rate"] == 24000
        assert "casual_male" in r.json()["voices"] and s.entries[tts].loads == 1
        assert httpx.post(srv.base + "/v1/models/nope/load", headers=auth).status_code == 404


def test_the_kind_is_checked_before_anything_loads(monkeypatch, capsys):
    """A diarizer given to --model: one error line from its config files; no model's
    weights are read (every family's loader fails the test)."""
    from mlx_speech import server as srv_mod

    for t in MODELS:
        monkeypatch.setattr(model_module(t), "load",
                            lambda *a, **k: pytest.fail("a model was loaded"))
    sortformer = GOLDEN / "sortformer" / "tiny.nemo"
    assert srv_mod.main(["--model", str(NM), "--model", str(sortformer), "--port", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {sortformer} is a Sortformer speaker diarization model, not "
                   "speech-to-text or text-to-speech or full-duplex"], err


def test_idle_unload_frees_the_memory_and_the_next_request_reloads(nm_ref):
    """After IDLE_S without a request, the engine drops the model: MLX active memory goes
    back to what it was before the load (the model's weights are gone, not only unlisted);
    the next request loads it again and answers as the library does."""
    clock, s, nm, x, want = idle_store(nm_ref, 1.2, 8)
    with ServerThread(s) as srv:
        assert transcribe(srv, nm, x).json()["text"] == want
        e = s.entries[nm]
        weights = e.budget[0]
        load = e.memory["load"]
        assert load["after"]["active"] - load["before"]["active"] >= weights > 100_000
        clock.t += IDLE_S - 1
        sweeps_after(s, srv)
        assert s.state(nm) == "loaded"  # not idle long enough
        clock.t += 2
        wait_until(lambda: e.unloads == 1, "the idle model was not unloaded")
        assert s.state(nm) == "not_loaded"
        freed = e.memory["unload"]
        # the weights are gone: back to the no-model baseline (within 1% of the weights,
        # and the acceptance's 50 MB), MLX's buffer cache emptied
        assert freed["after"]["active"] <= load["before"]["active"] + weights // 100
        assert freed["after"]["active"] <= load["before"]["active"] + (50 << 20)
        assert freed["before"]["active"] - freed["after"]["active"] >= weights
        assert freed["after"]["cache"] == 0
        r = transcribe(srv, nm, x)  # loads it again
        assert r.status_code == 200 and r.json()["text"] == want and e.loads == 2


def test_an_open_session_keeps_its_model_and_realtime_clients_hear_the_load(nm_ref):
    """A realtime session holds its model however long it is idle; the client is told
    `model.loading` / `model.loaded` when its model had to be loaded (both dialects). Once
    the last session closes the model is freed after IDLE_S."""
    clock, s, nm, x, want = idle_store(nm_ref, 1.0, 2)
    with ServerThread(s) as srv:
        async def session():
            async with websockets.connect(srv.ws + "/v1/realtime") as ws:
                assert json.loads(await ws.recv())["type"] == "session.created"
                await ws.send(json.dumps({"type": "session.update", "model": nm}))
                loading, loaded = json.loads(await ws.recv()), json.loads(await ws.recv())
                assert loading == {"type": "model.loading", "model": nm}
                assert loaded["type"] == "model.loaded" and loaded["seconds"] >= 0
                clock.t += 10 * IDLE_S  # idle far longer than IDLE_S, the socket open
                await asyncio.to_thread(sweeps_after, s, srv)
                assert s.state(nm) == "loaded"
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                b = pcm16(x).tobytes()
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(b).decode()}))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
                while (ev := json.loads(await ws.recv()))["type"] != "transcription.done":
                    assert ev["type"] == "transcription.delta", ev
                return ev["text"]

        assert run(session()) == want
        clock.t += IDLE_S + 1
        wait_until(lambda: s.state(nm) == "not_loaded", "the model was not freed")

        async def openai_dialect():  # ?model=: held (and loaded) as the socket opens
            async with websockets.connect(srv.ws + f"/v1/realtime?intent=transcription"
                                          f"&model={nm}") as ws:
                got = [json.loads(await ws.recv())["type"] for _ in range(3)]
                assert s.state(nm) == "loaded"
                return got

        assert run(openai_dialect()) == ["session.created", "model.loading", "model.loaded"]


def test_a_slow_load_is_a_bounded_wait_and_a_failed_one_an_error(monkeypatch, nm_ref):
    """A request waits for its model up to --load-timeout-s, then gets a 503 with
    Retry-After (the load goes on; /v1/models says "loading"); a load that raises is a 500
    naming the cause, and the next request tries again."""
    gate, calls = threading.Event(), []
    real = mlx_speech.load

    def slow_load(path, **kw):
        calls.append(path)
        if len(calls) == 1:
            raise OSError("disk on fire")
        gate.wait(DEADLINE_S)
        return real(path, **kw)

    monkeypatch.setattr(mlx_speech, "load", slow_load)
    s = store()
    nm, _ = ids(s)
    x = speechlike(1.0, seed=5)
    with ServerThread(s) as srv:
        r = transcribe(srv, nm, x)
        assert r.status_code == 500 and r.json()["error"]["code"] == "model_load_failed"
        assert "disk on fire" in r.json()["error"]["message"]
        s.load_timeout_s = 0.3
        r = transcribe(srv, nm, x)  # tries again: this load hangs past the timeout
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "model_loading"
        assert s.state(nm) == "loading"
        gate.set()
        wait_until(lambda: s.state(nm) == "loaded", "the load did not finish")
        r = transcribe(srv, nm, x)
        assert r.status_code == 200 and r.json()["text"] == nm_ref.transcribe(x).text
        assert len(calls) == 2  # one load for the waiters, none for the loaded model


def test_the_speech_socket_hears_its_model_load_and_speaks_as_the_library():
    """WS /v1/audio/speech/stream with the only TTS model not loaded yet: the socket holds
    it as it opens (`model.loading`, `model.loaded`), then speaks exactly `stream_text`."""
    from mlx_speech.server.common import pcm16_bytes
    from tests.support.voxtral import joined

    s = Models.locate([str(TTS)])
    (tts,) = ids(s)[:1]
    ref = mlx_speech.load(TTS)
    want = joined(ref.stream_text("Hello there.", voice="casual_male", seed=3, max_frames=8,
                                  first_frames=4, chunk_frames=4))
    with ServerThread(s) as srv:
        async def talk():
            async with websockets.connect(srv.ws + "/v1/audio/speech/stream") as ws:
                kinds = [json.loads(await ws.recv())["type"] for _ in range(3)]
                await ws.send(json.dumps({"type": "session.update", "session": {
                    "voice": "casual_male", "seed": 3, "max_frames": 8}}))
                await ws.send(json.dumps({"type": "input_text.append", "text": "Hello there."}))
                await ws.send(json.dumps({"type": "input_text.end"}))
                pcm = b""
                while (ev := json.loads(await ws.recv()))["type"] != "speech.audio.done":
                    if ev["type"] == "speech.audio.delta":
                        pcm += base64.b64decode(ev["audio"])
                return kinds, pcm

        kinds, pcm = run(talk())
    assert kinds == ["session.created", "model.loading", "model.loaded"]
    assert pcm == pcm16_bytes(want) and s.entries[tts].loads == 1
