"""Server-side turn detection (OpenAI's server_vad / semantic_vad) on real speech: espeak-ng
phrases with pauses and background noise, through the real Silero VAD, on loopback; and the
realtime clients voice apps are built with, unmodified: the OpenAI Agents SDK's voice STT model
(semantic_vad, never commits), LiveKit Agents' `openai.STT(use_realtime=True)` stream
(server_vad) and pipecat's OpenAI realtime STT service (turn_detection null, commits from its
own Silero VAD), each fed two phrases with a pause and background noise at real-time pace.
What went over the wire is recorded server-side for the event timing and id checks.

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
import os
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
websockets = pytest.importorskip("websockets")

import mlx_speech  # noqa: E402
from mlx_speech.audio.resample import resample  # noqa: E402
from tests.support.server import ServerThread, pcm16  # noqa: E402
from tests.support.turns_audio import scene, silero  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "golden"
DEADLINE_S = 60.0
# where the VAD puts turn edges, against the phrases' true speech edges: onsets within 100 ms
# (32 ms frames); offsets 0..250 ms late: Silero's probability decays for 100-200 ms after
# the last sound before the silence count starts
ONSET_TOL_S = 0.1
OFFSET_LAG_S = (-0.05, 0.25)
PAUSE_S = 0.8


@pytest.fixture(scope="module")
def vad():
    return silero()


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


def check_items(items, models, name, audio16, spans, end_extra_s, prefix_s=0.3, chain=True):
    """Each item: its span brackets a phrase (prefix padding before, never reaching into the
    previous item; the closing silence after), its transcript is the library's for exactly
    that span, non-empty; ids chained."""
    assert len(items) == len(spans), [(i["start"], i.get("end")) for i in items]
    prev = None
    for it, (on, off) in zip(items, spans, strict=True):
        start, end = it["start"] / 1000, it["end"] / 1000
        want = max(on - prefix_s, it["floor"] / 1000)
        assert abs(start - want) < ONSET_TOL_S, (start, on, prefix_s)
        lag = end - (off + end_extra_s)
        assert OFFSET_LAG_S[0] < lag < OFFSET_LAG_S[1], (end, off, end_extra_s)
        ref = models[name].transcribe(audio16[it["start"] * 16: it["end"] * 16]).text
        assert it["transcript"] == ref, (it["transcript"], ref)
        assert ref or name == "vr"
        assert it["previous_item_id"] == prev or not chain
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
        committed, done, ended = set(), set(), False
        while not ended or committed - done:  # the commit's answer, then every item done
            ev = json.loads(await ws.recv())
            events.append(ev)
            if ev["type"] == "error":
                assert ev["error"]["code"] == "input_audio_buffer_commit_empty", ev
                assert ev["error"]["event_id"] == "last"
                ended = True
            elif ev["type"] == "input_audio_buffer.committed":
                committed.add(ev["item_id"])
            elif ev["type"].endswith(".completed"):
                done.add(ev["item_id"])
    return items_of(events), [e["type"] for e in events if e["type"] != "error"]


def items_of(events: list[dict]) -> list[dict]:
    """Per item, from the event stream: start/end ms, deltas, transcript, previous id."""
    items: dict[str, dict] = {}
    for e in events:
        t = e["type"]
        if t == "input_audio_buffer.speech_started":
            items[e["item_id"]] = {"id": e["item_id"], "start": e["audio_start_ms"],
                                   "deltas": [], "order": [t]}
        elif t == "input_audio_buffer.timeout_triggered":
            items[e["item_id"]] = {"id": e["item_id"], "start": e["audio_start_ms"],
                                   "end": e["audio_end_ms"], "deltas": [], "order": [t],
                                   "idle": True}
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
    out = list(items.values())
    for a, b in zip([None] + out, out, strict=False):  # where the item before ended
        b["floor"] = a.get("end", 0) if a is not None else 0
    return out


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
    assert ev["type"] == "error" and "--vad PATH" in ev["error"]["message"]


def test_server_vad_after_a_plain_install(models, speech, monkeypatch):
    """`pip install -e ".[cpu,server]"` alone (no silero-vad wheel, no torch): the server's
    default VAD is Silero's release model from mlx_speech's package data, and a server_vad
    session yields its turns."""
    import sys
    from importlib import metadata

    from mlx_speech.models import silero_vad as sv
    from mlx_speech.server import load_server_vad

    real = metadata.distribution

    def without_wheel(name):
        if name.lower().replace("_", "-") == "silero-vad":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", without_wheel)
    for mod in ("silero_vad", "torch", "onnxruntime"):
        monkeypatch.setitem(sys.modules, mod, None)  # `import silero_vad` -> ImportError
    read = []
    monkeypatch.setattr(sv, "read_onnx", lambda f, _r=sv.read_onnx: read.append(f) or _r(f))
    vad = load_server_vad(None)
    assert vad is not None and read == [sv.PACKAGED]
    assert sv.PACKAGED.parent.parent == Path(sv.__file__).parent  # inside the package
    audio16, pcm, spans = speech
    td = {"type": "server_vad", "silence_duration_ms": 500}
    with ServerThread({"nm": models["nm"]}, vad=vad) as s:
        items, _ = asyncio.run(asyncio.wait_for(raw_client(s, "nm", pcm, td), DEADLINE_S))
    check_items(items, models, "nm", server_audio(pcm), spans, end_extra_s=0.5)


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


# ============================================================ real clients

CHUNK_S = 0.05  # what a microphone callback hands over


class Wire:
    """What went over the wire, server-side, per connection: the JSON events the server sent
    and the client events it received, in order."""

    def __init__(self):
        self.sent: dict[int, list[dict]] = {}
        self.received: dict[int, list[dict]] = {}

    def one(self) -> tuple[list[dict], list[dict]]:
        (ws,) = self.sent
        return self.sent[ws], self.received.get(ws, [])


@pytest.fixture
def wire(monkeypatch):
    from starlette.websockets import WebSocket

    w = Wire()
    send, receive = WebSocket.send_text, WebSocket.receive

    async def send_text(self, data):
        w.sent.setdefault(id(self), []).append(json.loads(data))
        return await send(self, data)

    async def receive_(self):
        msg = await receive(self)
        if msg.get("text"):
            w.received.setdefault(id(self), []).append(json.loads(msg["text"]))
        return msg

    monkeypatch.setattr(WebSocket, "send_text", send_text)
    monkeypatch.setattr(WebSocket, "receive", receive_)
    return w


def appended(received: list[dict]) -> list[np.ndarray]:
    """The pcm16 (as float32) a client appended, split at its commits."""
    parts, cur = [], []
    for e in received:
        if e["type"] == "input_audio_buffer.append":
            cur.append(np.frombuffer(base64.b64decode(e["audio"]), "<i2"))
        elif e["type"] == "input_audio_buffer.commit":
            parts.append(cur)
            cur = []
    parts.append(cur)
    return [np.concatenate(p).astype(np.float32) / 32768 if p else np.zeros(0, np.float32)
            for p in parts]


def the_connection(wire) -> list[dict]:
    return wire.one()[0]


def items_from_wire(events: list[dict]) -> list[dict]:
    return items_of(events)


async def paced(pcm: np.ndarray, rate: int, push, chunk_s: float = CHUNK_S) -> None:
    """`push(int16 chunk)` every `chunk_s`, on the wall clock (real time)."""
    n = int(rate * chunk_s)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for k, i in enumerate(range(0, len(pcm), n)):
        await push(pcm[i:i + n])
        await asyncio.sleep(max(0.0, t0 + (k + 1) * chunk_s - loop.time()))


# ------------------------------------------------------------ OpenAI Agents SDK


def test_openai_agents_sdk_voice_stt(srv, models, speech, wire):
    pytest.importorskip("agents")
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import set_tracing_disabled
    from agents.voice import StreamedAudioInput, STTModelSettings
    from agents.voice.models.openai_stt import OpenAISTTModel
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    audio16, pcm, spans = speech

    async def run():
        client = AsyncOpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0)
        inp = StreamedAudioInput()
        session = await OpenAISTTModel("nm", client).create_session(
            inp, STTModelSettings(), False, False)

        async def feed():
            await paced(pcm, 24000, inp.add_audio)
            await inp.add_audio(None)  # end of input: the SDK's final commit, then clear

        feeder = asyncio.create_task(feed())
        turns = [t async for t in session.transcribe_turns()]
        await feeder
        return turns

    turns = asyncio.run(asyncio.wait_for(run(), DEADLINE_S))
    events = the_connection(wire)
    sent = events[1]["session"]["audio"]["input"]["turn_detection"]
    assert sent == {"type": "semantic_vad", "eagerness": "auto"}  # what the SDK asked for
    items = items_from_wire(events)
    assert turns == [it["transcript"] for it in items]
    # a finished sentence ends its turn after semantic_vad's short wait (auto: 500 ms), never
    # the longest (4 s); the spans' transcripts are checked against the library
    check_items(items, models, "nm", server_audio(pcm), spans, end_extra_s=0.5)


# ------------------------------------------------------------ LiveKit Agents


def test_livekit_agents_openai_stt_stream(srv, models, speech, wire):
    pytest.importorskip("livekit.plugins.openai")
    from livekit import rtc
    from livekit.agents import stt as lk_stt
    from livekit.agents import utils
    from livekit.plugins import openai as lk_openai

    audio16, pcm, spans = speech

    async def run():
        finals = []
        async with utils.http_context.open():
            stt = lk_openai.STT(model="nm", base_url=srv.base + "/v1", api_key="unused",
                                use_realtime=True)
            stream = stt.stream()

            async def push(chunk):
                stream.push_frame(rtc.AudioFrame(chunk.tobytes(), 24000, 1, len(chunk)))

            async def read():
                async for ev in stream:
                    if ev.type == lk_stt.SpeechEventType.FINAL_TRANSCRIPT:
                        finals.append(ev.alternatives[0].text)

            reader = asyncio.create_task(read())
            await paced(pcm, 24000, push)
            while len(finals) < len(spans) and not reader.done():
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # anything more (there must be nothing) would land here
            await stream.aclose()
            reader.cancel()
            await stt.aclose()
        return finals

    finals = asyncio.run(asyncio.wait_for(run(), DEADLINE_S))
    events = the_connection(wire)
    td = events[1]["session"]["audio"]["input"]["turn_detection"]
    assert td["type"] == "server_vad" and td["silence_duration_ms"] == 350  # LiveKit's own
    items = items_from_wire(events)
    assert finals == [it["transcript"] for it in items]
    check_items(items, models, "nm", server_audio(pcm), spans, end_extra_s=0.35,
                prefix_s=td["prefix_padding_ms"] / 1000)


# ------------------------------------------------------------ pipecat


def test_pipecat_openai_realtime_stt_with_its_own_vad(srv, models, speech, wire):
    """pipecat's default: turn_detection null, a commit at each VADUserStoppedSpeakingFrame
    of its local Silero VAD (the ONNX model it ships, through onnxruntime: offline)."""
    pytest.importorskip("pipecat")
    pytest.importorskip("onnxruntime")
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import EndFrame, InputAudioRawFrame, TranscriptionFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.audio.vad_processor import VADProcessor
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.services.openai.stt import OpenAIRealtimeSTTService

    audio16, _, _ = speech
    pcm = np.round(np.clip(audio16, -1, 1) * 32767).astype("<i2")  # a 16 kHz pipeline
    finals: list[str] = []

    class Collect(FrameProcessor):
        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, TranscriptionFrame):
                finals.append(frame.text)
            await self.push_frame(frame, direction)

    async def run():
        stt = OpenAIRealtimeSTTService(
            api_key="unused", base_url=srv.ws + "/v1/realtime",
            settings=OpenAIRealtimeSTTService.Settings(model="nm"))
        task = PipelineTask(Pipeline([VADProcessor(vad_analyzer=SileroVADAnalyzer()), stt,
                                      Collect()]),
                            params=PipelineParams(audio_in_sample_rate=16000),
                            enable_rtvi=False)

        async def feed():
            while not stt._session_ready:  # the service is up once session.updated came
                await asyncio.sleep(0.02)

            async def push(chunk):
                await task.queue_frame(InputAudioRawFrame(chunk.tobytes(), 16000, 1))

            await paced(pcm, 16000, push, chunk_s=0.02)
            t0 = asyncio.get_running_loop().time()
            while len(finals) < 2 and asyncio.get_running_loop().time() - t0 < 10:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            await task.queue_frame(EndFrame())

        feeder = asyncio.create_task(feed())
        await PipelineRunner(handle_sigint=False).run(task)
        await feeder

    asyncio.run(asyncio.wait_for(run(), DEADLINE_S))
    events, received = wire.one()
    assert events[1]["session"]["audio"]["input"]["turn_detection"] is None
    commits = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert len(commits) == 2  # one per phrase: nothing from the noise
    assert [c["previous_item_id"] for c in commits] == [None, commits[0]["item_id"]]
    done = {e["item_id"]: e["transcript"] for e in events
            if e["type"] == "conversation.item.input_audio_transcription.completed"}
    assert [done[c["item_id"]] for c in commits] == finals
    # each item is what the client appended between commits, transcribed as the library does
    for x, text in zip(appended(received)[:2], finals, strict=True):
        assert text == models["nm"].transcribe(x, sample_rate=24000).text and text


# ============================================================ REST segments


def test_rest_verbose_json_segments_follow_pauses(srv, models, vad):
    """With a VAD, no segment spans a pause: the three phrases give three segments (the tiny
    model's words have no sentence ends and no gaps long enough to split otherwise)."""
    import httpx

    from mlx_speech.transcribe import pause_breaks, segments_from_words
    from tests.support.server import wav_bytes

    audio, spans = scene(("please", "meeting", "go"), lead_s=0.5, gap_s=0.7, tail_s=0.5)
    r = httpx.post(srv.base + "/v1/audio/transcriptions", timeout=DEADLINE_S,
                   files={"file": ("a.wav", wav_bytes(audio))},
                   data={"model": "nm", "response_format": "verbose_json"})
    segs = r.json()["segments"]
    ref = models["nm"].transcribe(audio)
    breaks = pause_breaks(vad, audio)
    assert len(breaks) == 2
    assert [(s["start"], s["end"], s["text"]) for s in segs] == [
        (round(s.start, 3), round(s.end, 3), s.text)
        for s in segments_from_words(ref.words, breaks=breaks)]
    assert len(segs) == 3 and len(segments_from_words(ref.words)) == 1
    for (a, b), brk, (on, _) in zip(zip(segs, segs[1:], strict=False), breaks, spans[1:],
                                    strict=True):
        assert a["start"] < brk <= b["start"]  # a segment per side of each pause
        assert abs(brk - (on - 0.3)) < ONSET_TOL_S  # the pause ends where speech resumes


def test_idle_timeout_commits_the_silent_stretch(srv, models, speech):
    """server_vad's idle_timeout_ms: timeout_triggered, then the silent stretch is an item of
    its own (committed, added, transcribed: the library's text of exactly that stretch); the
    speech turns are unchanged."""
    audio16, pcm, spans = speech
    td = {"type": "server_vad", "idle_timeout_ms": 400}

    async def go():
        url = srv.ws + "/v1/realtime?intent=transcription&model=nm"
        events = []
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {"turn_detection": td}}}}))
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm.tobytes()).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            committed, done, ended = set(), set(), False
            while not ended or committed - done:  # the commit's error, then every item done
                ev = json.loads(await ws.recv())
                events.append(ev)
                ended |= ev["type"] == "error"
                if ev["type"] == "input_audio_buffer.committed":
                    committed.add(ev["item_id"])
                elif ev["type"].endswith(".completed"):
                    done.add(ev["item_id"])
        return events

    events = asyncio.run(asyncio.wait_for(go(), DEADLINE_S))
    a16 = server_audio(pcm)
    timeouts = [e for e in events if e["type"] == "input_audio_buffer.timeout_triggered"]
    assert timeouts and timeouts[0]["audio_start_ms"] == 0
    assert 400 <= timeouts[0]["audio_end_ms"] < 400 + 32
    done = {e["item_id"]: e["transcript"] for e in events if e["type"].endswith(".completed")}
    for t in timeouts:
        i = events.index(t)
        assert [e["type"] for e in events[i + 1: i + 3]] == [
            "input_audio_buffer.committed", "conversation.item.added"]
        seg = a16[t["audio_start_ms"] * 16: t["audio_end_ms"] * 16]
        assert done[t["item_id"]] == models["nm"].transcribe(seg).text
    items = items_of(events)
    assert [it["previous_item_id"] for it in items] == [None] + [it["id"] for it in items[:-1]]
    check_items([it for it in items if not it.get("idle")], models, "nm", a16, spans,
                end_extra_s=0.5, chain=False)


def test_concurrent_streams_share_batched_vad_calls(srv, models, monkeypatch):
    """Three clients at once, each its own speech: each gets its turns exactly as alone, and
    the engine ran their VAD frames in shared batched calls."""
    import mlx_speech.server.turns as turns

    sizes = []
    group = turns._vad_group

    def counted(streams):
        sizes.append(len(streams))
        return group(streams)

    monkeypatch.setattr(turns, "_vad_group", counted)
    orders = [("meeting", "go"), ("go", "please"), ("please", "meeting")]
    scenes = [scene(o, lead_s=0.5, gap_s=PAUSE_S, tail_s=0.9, seed=i)
              for i, o in enumerate(orders)]
    pcms = [pcm16(resample(a, 16000, 24000)) for a, _ in scenes]
    td = {"type": "server_vad"}

    async def all_clients():
        return await asyncio.gather(*(raw_client(srv, "nm", p, td) for p in pcms))

    results = asyncio.run(asyncio.wait_for(all_clients(), DEADLINE_S))
    for (items, _), p, (_, spans) in zip(results, pcms, scenes, strict=True):
        check_items(items, models, "nm", server_audio(p), spans, end_extra_s=0.5)
    assert max(sizes) > 1, sizes
