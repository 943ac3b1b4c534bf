"""`WS /v1/audio/speech/stream`: text in as it comes (an LLM's reply), speech out as it is made.

The lifecycle is Mistral's realtime text-to-speech (the maker of Voxtral TTS; its events are
OpenAI's speech SSE names): the server opens with `session.created`; `session.update {session:
{model, voice, seed, response_format: "pcm" | "opus", clause_words, max_frames}}` is answered
`session.updated`; `input_text.append {text}` sends a piece of text, `input_text.flush` ends a
generation (its rest is spoken), `input_text.end` ends the session (the socket closes after
the last generation's audio). The server answers `speech.audio.delta {audio}` (base64: pcm16
little-endian mono at the model's rate, or the pages of one Ogg/Opus stream per generation)
and `speech.audio.done {usage}` per generation. An extension for barge-in, `speech.cancel`,
stops every generation of the socket before its next frame (`speech.audio.done` with
`cancelled: true`; audio not yet sent is dropped). Errors are OpenAI's realtime shape
`{"type": "error", "error": {type, code, message, param, event_id}}`.

Synthesis starts as soon as the text holds a sentence end (or a clause mark after
`clause_words` words; null: sentence ends only), each segment its own prompt (segment j of a
generation draws from seed + j), so the audio of a text is the same whatever pieces it came
in. The first `speech.audio.delta` of a generation and its `speech.audio.done` carry
`ttfa_ms`: from the arrival of the text that completed the generation's first segment to
that first audio leaving the server. A generation is one `SpeechJob` (server/speech.py),
stepped with every other speech job of its model in one batched forward per frame; the next
generation of a socket waits for the one before it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
import time

from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect

from . import limits
from .common import AsyncSink, ModelNotFound, Served, answer_subprotocol, pcm16_bytes
from .models import ModelUnavailable, acquire_told
from .speech import OpusChunks, SpeechJob
from .validate import (
    MAX_GENERATION_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_PENDING_CHARS,
    Invalid,
    speech_stream_event,
)

log = logging.getLogger("mlx_speech.server")

PATH = "/v1/audio/speech/stream"
CLAUSE_WORDS = 12  # the default: a clause mark cuts a segment once it has this many words
CHUNK_FRAMES = 4  # every chunk 4 frames (320 ms), as the REST streams


class Generation:
    """One generation's job and what its socket has sent of it."""

    def __init__(self, n: int, job: SpeechJob, seed: int, opus: OpusChunks | None):
        self.n, self.job, self.seed, self.opus = n, job, seed, opus
        self.chars = 0  # text given
        self.samples = 0  # audio sent
        self.ttfa_ms: float | None = None
        self.cancelled = False


class SpeechStream:
    """One client: a reader (client events) and a writer (one queue, one sender)."""

    def __init__(self, ws: WebSocket, served: Served):
        self.ws, self.served, self.engine = ws, served, served.engine
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Queue = asyncio.Queue()
        self.model_id, self.model = None, None
        self.lease = None  # the socket's hold on `model` (server/models.py)
        with contextlib.suppress(ModelNotFound):  # the only TTS model (held once open)
            self.model_id = served.pick(None, "tts")
        self.voice: str | None = None
        self.seed: int | None = None
        self.format = "pcm"
        self.clause_words: int | None = CLAUSE_WORDS
        self.max_frames: int | None = None
        self.open: Generation | None = None  # taking text
        self.gens: dict[int, Generation] = {}  # not done yet (speaking or queued)
        self.last: SpeechJob | None = None  # the next generation speaks after it
        self.count = 0
        self.ending = False  # input_text.end: close after the last generation
        self.active = time.monotonic()  # the last client event or audio sent (idle timeout)
        self.n_events = 0

    # -- out ---------------------------------------------------------------------------------
    def send(self, event: dict) -> None:
        self.out.put_nowait(("local", event))

    def event_id(self) -> str:
        self.n_events += 1
        return f"event_{self.n_events}"

    def error(self, code: str, message: str, param: str | None = None, eid=None) -> None:
        self.send({"type": "error", "event_id": self.event_id(), "error": {
            "type": "invalid_request_error", "code": code, "message": message, "param": param,
            "event_id": eid}})

    def session_object(self) -> dict:
        sr = self.model.sample_rate if self.model is not None else None
        return {"model": self.model_id, "voice": self.voice, "seed": self.seed,
                "response_format": self.format, "sample_rate": sr,
                "clause_words": self.clause_words, "max_frames": self.max_frames}

    async def writer(self) -> None:
        """Sends what is queued, in order; after input_text.end, closes once all is said."""
        while True:
            tag, ev = await self.out.get()
            for out in [ev] if tag == "local" else await self.engine_event(tag, ev):
                await self.ws.send_text(json.dumps(out))
                if out["type"] == "speech.audio.delta":
                    self.active = time.monotonic()
            if self.ending and not self.gens:
                await self.ws.close()
                return

    async def engine_event(self, n: int, ev) -> list[dict]:
        """Generation n's engine event as the client's events."""
        g = self.gens.get(n)
        if g is None:
            return []
        base = {"event_id": self.event_id(), "generation": n}
        if ev[0] == "audio":
            if g.cancelled:
                return []  # barge-in: what was made before the cancel is not sent
            data = (pcm16_bytes(ev[1]) if g.opus is None
                    else await asyncio.to_thread(g.opus.push, ev[1]))
            g.samples += len(ev[1])
            if not data:
                return []
            out = {"type": "speech.audio.delta", **base,
                   "audio": base64.b64encode(data).decode()}
            if g.ttfa_ms is None and g.job.text_at is not None:
                g.ttfa_ms = round(1e3 * (time.perf_counter() - g.job.text_at), 1)
                out["ttfa_ms"] = g.ttfa_ms
            return [out]
        self.gens.pop(g.n, None)
        if ev[0] == "error":
            return [{"type": "error", **base, "error": {
                "type": "server_error", "code": ev[1], "message": ev[2], "param": None,
                "event_id": None}}]
        out = []
        if g.opus is not None and not g.cancelled and (tail := g.opus.finish()):
            out.append({"type": "speech.audio.delta", **base,
                        "audio": base64.b64encode(tail).decode()})
        info = ev[1]
        seconds = g.samples / g.job.model.sample_rate
        out.append({"type": "speech.audio.done", **base, "event_id": self.event_id(),
                    "cancelled": g.cancelled or info["cancelled"], "seed": g.seed,
                    "ttfa_ms": g.ttfa_ms,
                    "usage": {"characters": g.chars, "segments": info["segments"],
                              "frames": info["frames"], "audio_seconds": round(seconds, 3)}})
        return out

    # -- in ----------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.ws.accept(subprotocol=answer_subprotocol(self.ws))
        writer = asyncio.create_task(self.writer())
        try:
            self.send({"type": "session.created", "event_id": self.event_id(),
                       "session": self.session_object()})
            if not self.engine.healthy:
                self.error("processing_error", "the engine is not running "
                           f"({self.engine.failed or 'stopped'})")
                return
            if self.model_id is not None:  # loaded now, when it is not
                if (lease := await self.hold(self.model_id, None)) is not None:
                    self.keep(lease)
            await self.read_loop(writer)
        except WebSocketDisconnect:
            pass
        finally:
            for g in self.gens.values():  # the client left: every job is dropped
                g.job.close()
            self.gens.clear()
            if self.lease is not None:
                self.lease.release()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._drain(writer), 1.0)
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer
            with contextlib.suppress(Exception):
                await self.ws.close()

    async def _drain(self, writer) -> None:
        while not self.out.empty() and not writer.done():
            await asyncio.sleep(0.01)

    async def read_loop(self, writer) -> None:
        recv = None
        try:
            while not writer.done():  # the writer ends the socket after input_text.end
                if recv is None:
                    recv = asyncio.ensure_future(self.ws.receive())
                idle = self.served.idle_timeout_s
                left = idle - (time.monotonic() - self.active)
                done, _ = await asyncio.wait({recv, writer}, timeout=max(left, 0.0),
                                             return_when=asyncio.FIRST_COMPLETED)
                if recv in done:
                    msg, recv = recv.result(), None
                    if not await self.message(msg):
                        return
                elif writer not in done and time.monotonic() - self.active >= idle:
                    self.error("idle_timeout", f"no client event and no audio for {idle:g} s; "
                               "closing")
                    return
        finally:
            if recv is not None:
                recv.cancel()

    async def message(self, msg: dict) -> bool:
        """One client message; False when the socket is to close."""
        from ..models.voxtral_tts import MAX_FRAMES

        at = time.perf_counter()
        self.active = time.monotonic()
        if msg["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(msg.get("code", 1000))
        data = msg.get("text")
        if data is None:
            self.error("invalid_json", "send JSON text messages (binary is not read here)")
            return True
        if len(data) > MAX_MESSAGE_CHARS:  # not parsed: no event here is this large
            self.error("message_too_large", f"a message holds at most {MAX_MESSAGE_CHARS} "
                       "characters (a delta at most 4096)")
            return True
        try:
            event = json.loads(data)
            if not isinstance(event, dict):
                raise ValueError
        except (ValueError, RecursionError):
            self.error("invalid_json", "the message is not a JSON object")
            return True
        eid = event.get("event_id")
        try:
            known = speech_stream_event(event, MAX_FRAMES)
        except Invalid as e:
            self.error("invalid_value", str(e), e.param.lstrip(".") or None,
                       eid if isinstance(eid, str) else None)
            return True
        if not known:
            self.error("unknown_event", f"unknown event type {event['type']!r}", None, eid)
            return True
        try:
            await self.handle(event, at)
        except Exception as e:  # a bug, not the client's: say so and keep the socket
            log.exception("speech stream event %r failed", event.get("type"))
            self.error("server_error", f"internal error ({type(e).__name__})", None, eid)
        return not (self.ending and not self.gens)  # input_text.end, nothing left to say

    async def handle(self, event: dict, at: float) -> None:
        t, eid = event["type"], event.get("event_id")
        if self.ending:
            self.error("session_ended", "input_text.end was sent: no more events", None, eid)
        elif t == "session.update":
            await self.update(event["session"], eid)
        elif t == "input_text.append":
            self.append(event["text"], at, eid)
        elif t == "input_text.flush":
            if (g := self.open or self.generation(eid)) is not None:
                g.job.flush(at)
                self.open = None
        elif t == "input_text.end":  # the socket closes after the last generation's audio
            self.ending = True
            if self.open is not None:
                self.open.job.flush(at)
                self.open = None
        elif t == "speech.cancel":  # barge-in: everything this socket is saying stops
            self.cancel_all()

    async def hold(self, model_id: str, eid):
        """A lease on `model_id` (the socket's own when it is its model already), loaded
        first when it is not (`model.loading` / `model.loaded` events); None, after an error
        event, when it cannot be had."""
        if self.lease is not None and self.lease.id == model_id:
            return self.lease
        try:
            return await acquire_told(self.served.models, model_id, lambda ev: self.send(
                {**ev, "event_id": self.event_id()}))
        except ModelUnavailable as e:
            self.error(e.code, str(e), "session.model", eid)
            return None

    def keep(self, lease) -> None:
        """Make `lease`'s model the socket's (the one held before is let go)."""
        if lease is not self.lease:
            if self.lease is not None:
                self.lease.release()
            self.lease, self.model_id, self.model = lease, lease.id, lease.model

    async def update(self, session: dict, eid) -> None:
        if self.open is not None:
            self.error("generation_open", "flush the text given so far (input_text.flush) "
                       "before changing the session", "session", eid)
            return
        lease = self.lease
        if "model" in session and session["model"] is not None:
            try:
                model_id = self.served.pick(session["model"], "tts")
            except ModelNotFound as e:
                self.error("model_not_found", str(e), "session.model", eid)
                return
            if (lease := await self.hold(model_id, eid)) is None:
                return
        model = lease.model if lease is not None else None
        voice = session.get("voice", self.voice) or None  # "" or null: the model's default
        if voice is not None and (model is None or voice not in model.voices):
            known = ", ".join(model.voices) if model is not None else "none"
            self.error("invalid_value", f"unknown voice {voice!r}; voices: {known}",
                       "session.voice", eid)
            if lease is not self.lease:
                lease.release()
            return
        if lease is not None:
            self.keep(lease)
        self.voice = voice
        self.seed = session.get("seed", self.seed)
        self.format = session.get("response_format") or self.format
        self.clause_words = session.get("clause_words", self.clause_words)
        self.max_frames = session.get("max_frames", self.max_frames)
        self.send({"type": "session.updated", "event_id": self.event_id(),
                   "session": self.session_object()})

    def generation(self, eid) -> Generation | None:
        """A new generation, taking text (None, with an error sent, without a model)."""
        if self.model is None:
            try:  # no model held: say why (none, several, or it could not be loaded)
                self.served.pick(None, "tts")
            except ModelNotFound as e:
                self.error("model_not_found", str(e), "session.model", eid)
                return None
            self.error("model_not_found", "the model could not be had (see the error "
                       "before); name it in session.update", "session.model", eid)
            return None
        model, voice, max_frames = self.model, self.voice, self.max_frames
        seed = secrets.randbelow(2**31) if self.seed is None else self.seed
        clause_words = self.clause_words

        def make():
            return model.session(voice=voice, seed=seed, max_frames=max_frames,
                                 first_frames=CHUNK_FRAMES, chunk_frames=CHUNK_FRAMES,
                                 clause_words=clause_words)

        self.count += 1
        n = self.count
        job = SpeechJob(model, make, self.sink(n), after=self.last)
        g = Generation(n, job, seed, OpusChunks(model.sample_rate)
                       if self.format == "opus" else None)
        self.gens[n] = self.open = g
        self.last = self.engine.submit(job)
        return g

    def sink(self, n: int):
        """The engine's events of generation n into the writer's queue; a client that does
        not read its audio has its generations cancelled (the queue stays bounded)."""
        put = AsyncSink(self.out, self.loop, n)

        def sink(ev) -> None:
            if ev[0] == "audio" and self.out.qsize() > limits.MAX_BACKLOG:
                self.loop.call_soon_threadsafe(self.too_slow)
                return  # dropped: its generation is being cancelled
            put(ev)

        return sink

    def cancel_all(self) -> None:
        """Every generation of the socket stops before its next frame; unsent audio dropped."""
        for g in self.gens.values():
            g.cancelled = True
            g.job.cancel()
        self.open = None

    def too_slow(self) -> None:
        if all(g.cancelled for g in self.gens.values()):
            return  # said already
        self.cancel_all()
        self.error("client_too_slow", f"more than {limits.MAX_BACKLOG} audio chunks wait for "
                   "the client to read them: its generations are cancelled")

    def append(self, text: str, at: float, eid) -> None:
        if not text:
            return
        g = self.open or self.generation(eid)
        if g is None:
            return
        if g.chars + len(text) > MAX_GENERATION_CHARS:
            self.error("text_too_long", f"a generation takes at most {MAX_GENERATION_CHARS} "
                       "characters: flush, then go on in a new one; this text was not taken",
                       "text", eid)
            return
        if g.job.pending_chars + len(text) > MAX_PENDING_CHARS:
            self.error("buffer_full", f"{MAX_PENDING_CHARS} characters are waiting to be "
                       "spoken; send more as the audio comes; this text was not taken",
                       "text", eid)
            return
        g.chars += len(text)
        g.job.feed(text, at)


def add_routes(app: FastAPI, served: Served) -> None:
    @app.websocket(PATH)
    async def speech_stream(ws: WebSocket):
        await SpeechStream(ws, served).run()
