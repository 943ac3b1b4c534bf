"""Server-side turn detection (OpenAI's server_vad / semantic_vad) on real speech: espeak-ng
phrases with pauses and background noise, through the real Silero VAD, on loopback.

The ASR models are tiny random-weight checkpoints, so a transcript is "text" of a tiny model:
each item's transcript must equal the library's transcription of exactly the audio span the
VAD cut (`audio_start_ms`..`audio_end_ms`; a sample lost or doubled at a boundary changes it),
and be non-empty. The same models transcribe pure noise to non-empty text too, so a turn cut
from the noise would show up as an extra item: the item count is the check for "nothing from
the noise". The tiny Voxtral's vocabulary is nearly all special tokens, so its text is often
empty: "non-empty" is checked on the tiny Nemotron, whose text never is."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
websockets = pytest.importorskip("websockets")

import mlx_speech  # noqa: E402
from mlx_speech.audio.resample import resample  # noqa: E402
from tests.test_server import GOLDEN, ServerThread, pcm16  # noqa: E402
from tests.turns_audio import scene  # noqa: E402

DEADLINE_S = 60.0
# where the VAD puts turn edges, against the phrases' true speech edges: onsets within 100 ms
# (32 ms frames); offsets 0..250 ms late: Silero's probability decays for 100-200 ms after
# the last sound before the silence count starts
ONSET_TOL_S = 0.1
OFFSET_LAG_S = (-0.05, 0.25)
PAUSE_S = 0.8


@pytest.fixture(scope="module")
def vad():
    from mlx_speech.models.silero_vad import load_vad

    try:
        return load_vad()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no Silero VAD weights ({e})")


@pytest.fixture(scope="module")
def models(vr_dir):
    return {"vr": mlx_speech.load(vr_dir), "nm": mlx_speech.load(GOLDEN / "nemotron")}


@pytest.fixture(scope="module")
def srv(models, vad):
    with ServerThread(models, vad=vad) as s:
        yield s


@pytest.fixture(scope="module")
def speech():
    """Two phrases 0.8 s apart in noise: (16 kHz audio, 24 kHz pcm16 a client sends, spans)."""
    audio, spans = scene(("meeting", "go"), lead_s=0.6, gap_s=PAUSE_S, tail_s=0.9)
    pcm = pcm16(resample(audio, 16000, 24000))
    return pcm.astype(np.float32) / 32768, pcm, spans


def server_audio(pcm24: np.ndarray) -> np.ndarray:
    """The 16 kHz audio the server's VAD and models see for what a client sent."""
    return resample(pcm24.astype(np.float32) / 32768, 24000, 16000)


def check_items(items, models, name, audio16, spans, end_extra_s):
    """Each item: its span brackets a phrase (prefix padding before, the closing silence
    after), its transcript is the library's for exactly that span, non-empty; ids chained."""
    assert len(items) == len(spans), [(i["start"], i["end"]) for i in items]
    prev = None
    for it, (on, off) in zip(items, spans, strict=True):
        start, end = it["start"] / 1000, it["end"] / 1000
        assert abs(start - (on - 0.3)) < ONSET_TOL_S, (start, on)  # 300 ms prefix padding
        lag = end - (off + end_extra_s)
        assert OFFSET_LAG_S[0] < lag < OFFSET_LAG_S[1], (end, off, end_extra_s)
        ref = models[name].transcribe(audio16[it["start"] * 16: it["end"] * 16]).text
        assert it["transcript"] == ref, (it["transcript"], ref)
        assert ref or name == "vr"
        assert it["previous_item_id"] == prev
        prev = it["id"]


async def raw_client(srv, model: str, pcm: np.ndarray, turn_detection: dict,
                     pace: float = 0.25) -> tuple[list[dict], list[str]]:
    """A hand-written client (for exact event order): 100 ms appends at 4x real time."""
    url = srv.ws + f"/v1/realtime?intent=transcription&model={model}"
    events = []
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": model}, "turn_detection": turn_detection}}}}))
        b = pcm.tobytes()
        for i in range(0, len(b), 4800):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(b[i:i + 4800]).decode()}))
            await asyncio.sleep(0.1 * pace)
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "last"}))
        while True:
            ev = json.loads(await ws.recv())
            events.append(ev)
            if ev["type"] == "error":
                assert ev["error"]["code"] == "input_audio_buffer_commit_empty", ev
                assert ev["error"]["event_id"] == "last"
                break
    return items_of(events), [e["type"] for e in events]


def items_of(events: list[dict]) -> list[dict]:
    """Per item, from the event stream: start/end ms, deltas, transcript, previous id."""
    items: dict[str, dict] = {}
    for e in events:
        t = e["type"]
        if t == "input_audio_buffer.speech_started":
            items[e["item_id"]] = {"id": e["item_id"], "start": e["audio_start_ms"],
                                   "deltas": [], "order": [t]}
        elif t.startswith(("input_audio_buffer.", "conversation.item")) and "item_id" in e:
            it = items[e["item_id"]]
            it["order"].append(t)
            if t == "input_audio_buffer.speech_stopped":
                it["end"] = e["audio_end_ms"]
            elif t == "input_audio_buffer.committed":
                it["previous_item_id"] = e["previous_item_id"]
            elif t.endswith(".delta"):
                it["deltas"].append(e["delta"])
            elif t.endswith(".completed"):
                it["transcript"] = e["transcript"]
        elif t == "conversation.item.added":
            it = items[e["item"]["id"]]
            it["order"].append(t)
            assert e["previous_item_id"] == it["previous_item_id"]
            assert e["item"]["role"] == "user" and e["item"]["type"] == "message"
    return list(items.values())


@pytest.mark.parametrize("name", ["nm", "vr"])
def test_server_vad_events_on_real_speech(srv, models, speech, name):
    audio16, pcm, spans = speech
    td = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
          "silence_duration_ms": 500}
    items, types = asyncio.run(asyncio.wait_for(raw_client(srv, name, pcm, td), DEADLINE_S))
    assert types[:2] == ["session.created", "session.updated"]
    for it in items:  # OpenAI's order; an item's deltas join to its transcript
        deltas = [t for t in it["order"] if t.endswith(".delta")]
        assert it["order"] == (["input_audio_buffer.speech_started",
                                "input_audio_buffer.speech_stopped",
                                "input_audio_buffer.committed", "conversation.item.added"]
                               + deltas
                               + ["conversation.item.input_audio_transcription.completed"])
        assert "".join(it["deltas"]) == it["transcript"]
    check_items(items, models, name, server_audio(pcm), spans, end_extra_s=0.5)


def test_session_update_turn_detection_options(srv):
    async def go():
        url = srv.ws + "/v1/realtime?intent=transcription"
        async with websockets.connect(url) as ws:
            assert json.loads(await ws.recv())["session"]["audio"]["input"][
                "turn_detection"] is None

            async def update(session, legacy=False):
                await ws.send(json.dumps({"type": "transcription_session.update" if legacy
                                          else "session.update", "session": session}))
                return json.loads(await ws.recv())

            def inp(td, **tr):
                return {"type": "transcription", "audio": {"input": {
                    "transcription": {"model": "vr", **tr}, "turn_detection": td}}}

            ev = await update(inp({"type": "semantic_vad", "eagerness": "high"}, delay="low"))
            got = ev["session"]["audio"]["input"]
            assert got["turn_detection"] == {"type": "semantic_vad", "eagerness": "high"}
            assert got["transcription"] == {"model": "vr", "delay": "low"}
            # omitted turn_detection: unchanged
            ev = await update({"type": "transcription", "audio": {"input": {}}})
            assert ev["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
            ev = await update(inp({"type": "server_vad", "threshold": 1.5}))
            assert ev["type"] == "error" and "threshold" in ev["error"]["message"]
            ev = await update(inp({"type": "server_vad"}, delay="fast"))
            assert ev["type"] == "error" and "delay" in ev["error"]["message"]
            ev = await update(inp(None))
            assert ev["session"]["audio"]["input"]["turn_detection"] is None
            # the beta shape, answered in kind
            ev = await update({"input_audio_format": "pcm16",
                               "input_audio_transcription": {"model": "nm"},
                               "turn_detection": {"type": "server_vad",
                                                  "silence_duration_ms": 350}}, legacy=True)
            assert ev["type"] == "transcription_session.updated"
            assert ev["session"]["turn_detection"]["silence_duration_ms"] == 350
            assert ev["session"]["input_audio_transcription"]["model"] == "nm"

    asyncio.run(asyncio.wait_for(go(), DEADLINE_S))


def test_no_vad_weights_is_a_clear_error(models):
    async def go(s):
        async with websockets.connect(s.ws + "/v1/realtime?intent=transcription") as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {
                    "turn_detection": {"type": "server_vad"}}}}}))
            return json.loads(await ws.recv())

    with ServerThread({"nm": models["nm"]}) as s:
        ev = asyncio.run(asyncio.wait_for(go(s), DEADLINE_S))
    assert ev["type"] == "error" and "pip install --no-deps silero-vad" in ev["error"]["message"]


def test_delay_maps_to_voxtral_delay(srv, models, speech):
    audio16, pcm, spans = speech
    items, _ = asyncio.run(asyncio.wait_for(_delay_client(srv, pcm), DEADLINE_S))
    for it in items:
        seg = server_audio(pcm)[it["start"] * 16: it["end"] * 16]
        assert it["transcript"] == models["vr"].transcribe(seg, delay_ms=240).text


async def _delay_client(srv, pcm):
    url = srv.ws + "/v1/realtime?intent=transcription"
    events = []
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {
                "transcription": {"model": "vr", "delay": "low"},
                "turn_detection": {"type": "server_vad"}}}}}))
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(pcm.tobytes()).decode()}))
        t0 = time.time()
        n = 0
        while n < 2 and time.time() - t0 < DEADLINE_S:
            ev = json.loads(await ws.recv())
            events.append(ev)
            n += ev["type"].endswith(".completed")
    return items_of(events), None
