"""`WS /v1/realtime`: live transcription in two dialects, chosen per connection.

vLLM's (no `intent` in the query): `session.update` names the model at the top level; the
first `input_audio_buffer.commit` (final false) starts transcribing 16 kHz pcm16 appends,
`commit` with `final: true` ends the utterance; `transcription.delta` / `transcription.done`;
errors are `{"type": "error", "error": "<message>", "code": ...}`.

OpenAI's GA transcription dialect (`?intent=transcription`, what `openai`'s
`client.realtime.connect` speaks): `session.update {session: {type: "transcription", audio:
{input: {format: {type: "audio/pcm", rate: 24000}, transcription: {model}}}}}`; appends
stream at once (resampled to the model's rate with the exact streaming resampler); a commit
ENDS the turn; `input_audio_buffer.committed`,
`conversation.item.input_audio_transcription.delta` / `.completed`; errors are
`{"type": "error", "error": {"type", "code", "message", ...}}`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import secrets
import time

import numpy as np
from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect

from ..audio.resample import StreamingResampler
from .common import AsyncSink, ItemDeltas, ModelNotFound, Served, answer_subprotocol, usage
from .diarization import NO_SPEAKERS, ConnectionSpeakers
from .jobs import AsrStream, Budget, BufferFull
from .languages import language_field, languages_field
from .models import ModelUnavailable, acquire_told
from .turns import TurnStream
from .validate import Invalid, append_samples, language, realtime_event
from .vocabulary import (
    LOGPROBS_INCLUDE,
    ChangeRate,
    parse,
    prepare,
    result_logprobs,
    session_factory,
    words_field,
)

log = logging.getLogger("mlx_speech.server")
BIG_MESSAGE = 1 << 16  # bytes: JSON this large is parsed on a worker thread

VLLM_RATE = 16000
OPENAI_RATE = 24000
MAX_ITEMS = 8  # items (utterances, turns) of one connection being transcribed at once
TOO_MANY_ITEMS = (f"this connection has {MAX_ITEMS} items still being transcribed (the limit); "
                  "wait for one to complete; this audio was not taken")


def _pcm16(b64) -> np.ndarray:
    """base64 pcm16 little-endian -> float32 (int16 / 32768, as vLLM decodes it)."""
    if not isinstance(b64, str):
        raise ValueError("'audio' must be a base64 string")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("'audio' is not valid base64") from None
    if len(raw) % 2:
        raise ValueError("pcm16 audio must have an even number of bytes")
    return np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0


def _feed(stream, speakers, x: np.ndarray) -> None:
    """Audio an item or the turns take, and the connection's speakers beside it (one
    timeline); BufferFull when the stream's queue is full."""
    stream.push(x)
    speakers.push(x)


class _Connection:
    """One client: a reader (client events) and a writer (one queue, one sender)."""

    openai = False  # the dialect whose events realtime_event checks

    def __init__(self, ws: WebSocket, served: Served):
        self.ws, self.served = ws, served
        self.engine = served.engine
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Queue = asyncio.Queue()
        self.streams: dict[str, object] = {}  # live engine streams by item id
        self.texts: dict[str, ItemDeltas] = {}
        self.model_id: str | None = None
        self.model = None
        self.lease = None  # the connection's hold on `model` (server/models.py)
        self.vocabulary = None  # phrase boosting of the next sessions (a Vocabulary)
        self.walk = None  # holds the vocabulary's context graph (built) while it is in use
        self.vocab_rate = ChangeRate()
        # the audio all of this connection's streams have queued, and not transcribed yet:
        # at most one input buffer (the models' 16 kHz samples), however many items it opens
        self.budget = Budget(int(self.engine.max_buffer_s * VLLM_RATE))
        self.logprobs = False  # include: ["item.input_audio_transcription.logprobs"]
        self.speakers = NO_SPEAKERS  # diarize: true -> a ConnectionSpeakers
        # the spoken language: as the client gave it, and as validate.language checked it for
        # the connection's model (what the next sessions take)
        self.language_raw: str | None = None
        self.language: str | None = None

    def send(self, event: dict) -> None:
        self.out.put_nowait(("local", event))

    async def hold(self, model_id: str):
        """A lease on `model_id` (this connection's own when it is its model already); a
        model not loaded yet is loaded first, the client told by `model.loading` then
        `model.loaded` events. None, after an error event, when it cannot be had."""
        if self.lease is not None and self.lease.id == model_id:
            return self.lease
        try:
            return await acquire_told(self.served.models, model_id,
                                      lambda ev: self.send(self.model_event(ev)))
        except ModelUnavailable as e:
            self.error(e.code, str(e))
            return None

    def keep(self, lease) -> None:
        """Make `lease`'s model this connection's (the one held before is let go)."""
        self.lease = lease.instead_of(self.lease)
        self.model_id, self.model = lease.id, lease.model

    def let_go(self, lease) -> None:
        """Release `lease` unless it is the connection's own (a model named and then refused)."""
        if lease is not self.lease:
            lease.release()

    def model_event(self, event: dict) -> dict:
        return event

    def open_stream(self, item: str, make_session) -> AsrStream | None:
        """A new item's transcription stream; None when MAX_ITEMS are still open."""
        if sum(k != "turns" and not s.finished for k, s in self.streams.items()) >= MAX_ITEMS:
            return None
        s = self.engine.submit(AsrStream(self.model, make_session,
                                         AsyncSink(self.out, self.loop, item),
                                         budget=self.budget))
        self.streams[item] = s
        self.texts[item] = ItemDeltas(self.model.tokenizer)
        return s

    async def new_vocabulary(self, model, values: dict | None, param: str):
        """(vocabulary, walk) for the next sessions of `model`: `values`' hotwords / prompt /
        boost parsed on a worker thread (None: the vocabulary stays), its graph built on the
        vocabulary thread (the walk holds it). Invalid(param, ...) for a bad list, one past
        the graph's bound, or a change past the connection's rate."""
        vocab = self.vocabulary
        if values is not None:
            vocab = await parse(values.get("hotwords"), values.get("prompt"),
                                values.get("boost"), param)
            if vocab != self.vocabulary and not self.vocab_rate.take():
                raise self.vocab_rate.refused(param)
        if model is None:  # built once a model is named
            return vocab, None
        if vocab == self.vocabulary and model is self.model:
            return vocab, self.walk
        return vocab, await prepare(model, vocab, param)

    def diarize(self) -> bool:
        """Speakers on the items from now on (once per connection); False when the server
        has no diarizer."""
        if self.served.diarizer is None:
            return False
        if not self.speakers.on:
            self.speakers = ConnectionSpeakers(self.engine, self.served.diarizer,
                                               AsyncSink(self.out, self.loop, "speakers"))
        return True

    def session_factory(self, model, language: str | None = None, **kw):
        """`model`'s session factory with this connection's vocabulary and logprobs, and
        `language` (checked for `model`)."""
        return session_factory(model, self.vocabulary, self.logprobs, language, **kw)

    def check_language(self, model, event: dict, param: str) -> tuple[str | None, str | None]:
        """(as given, as checked) of the language the connection takes with `model` after
        an update: `event`'s `language` when it names one (null: none), else the one it had.
        Raises Invalid."""
        raw = event["language"] if "language" in event else self.language_raw
        return raw, language(model, raw, param)

    def set_include(self, include) -> str | None:
        """OpenAI's `include`; an error message for a bad one."""
        if include is None:
            return None
        if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
            return "include must be a list of strings"
        self.logprobs = LOGPROBS_INCLUDE in include
        return None

    async def writer(self) -> None:
        while True:
            tag, ev = await self.out.get()
            if tag == "local":
                await self.ws.send_text(json.dumps(ev))
                continue
            if tag == "speakers":
                self.speakers.event(ev)
                continue
            try:
                outs = self.engine_event(tag, ev)
            except Exception as e:  # a bug: the client hears of it, the socket carries on
                log.exception("realtime engine event %r failed", ev[0])
                outs = [{"type": "error", "error": f"internal error ({type(e).__name__})",
                         "code": "server_error"}]
            for out in outs:
                await self.ws.send_text(json.dumps(out))

    async def run(self) -> None:
        await self.ws.accept(subprotocol=answer_subprotocol(self.ws))
        writer = asyncio.create_task(self.writer())
        try:
            self.hello()
            if not self.engine.healthy:
                self.error("processing_error", f"the engine is not running "
                           f"({self.engine.failed or 'stopped'})")
                await asyncio.sleep(0)
                return
            await self.opened()
            await self.read_loop()
        except WebSocketDisconnect:
            pass
        finally:
            for s in self.streams.values():  # free every session at once
                s.close()
            self.streams.clear()
            self.speakers.close()
            if self.lease is not None:
                self.lease.release()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._drain(), 1.0)
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer
            with contextlib.suppress(Exception):
                await self.ws.close()

    async def _drain(self) -> None:
        while not self.out.empty():
            await asyncio.sleep(0.01)

    async def read_loop(self) -> None:
        while True:
            try:
                msg = await asyncio.wait_for(self.ws.receive(), self.served.idle_timeout_s)
            except asyncio.TimeoutError:
                if any(not s.finished for s in self.streams.values()):
                    continue  # waiting on the model is never a timeout
                self.error("idle_timeout", f"no client event for {self.served.idle_timeout_s:g}"
                           " s; closing")
                return
            if msg["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(msg.get("code", 1000))
            data = msg.get("text")
            if data is None:
                data = (msg.get("bytes") or b"").decode("utf-8", "replace")
            try:
                event = (await asyncio.to_thread(json.loads, data) if len(data) > BIG_MESSAGE
                         else json.loads(data))
                if not isinstance(event, dict):
                    raise ValueError
            except (ValueError, RecursionError):
                self.error("invalid_json", "the message is not a JSON object")
                continue
            try:
                realtime_event(event, self.openai)
            except Invalid as e:
                self.invalid(e, event)
                continue
            try:
                await self.handle(event)
            except Exception as e:  # a bug, not the client's: say so and keep the socket
                log.exception("realtime event %r failed", event.get("type"))
                self.error("server_error", f"internal error ({type(e).__name__})")

    def too_big(self, b64: str, rate: int) -> str | None:
        """The buffer_full message for an append longer than a whole input buffer (refused
        before it is decoded or resampled), else None."""
        n = append_samples(b64)
        if n > self.engine.max_buffer_s * rate:
            return (f"this append holds {n / rate:.1f} s of audio, more than the "
                    f"{self.engine.max_buffer_s:g} s input buffer; send smaller chunks")
        return None

    async def decode(self, b64, rate: int) -> np.ndarray:
        """An append's audio, decoded on a worker thread; BufferFull when it is too long."""
        if isinstance(b64, str) and (why := self.too_big(b64, rate)):
            raise BufferFull(why)
        if isinstance(b64, str) and len(b64) > BIG_MESSAGE:
            return await asyncio.to_thread(_pcm16, b64)
        return _pcm16(b64)

    def invalid(self, e: Invalid, event: dict) -> None:
        self.error("invalid_request_error", str(e))

    def stream_done(self, item: str) -> None:
        self.streams.pop(item, None)
        self.texts.pop(item, None)

    # dialect hooks
    def hello(self) -> None: ...
    async def opened(self) -> None: ...
    def error(self, code: str, message: str) -> None: ...
    async def handle(self, event: dict) -> None: ...
    def engine_event(self, item: str, ev) -> list[dict]: ...


class VllmConnection(_Connection):
    def __init__(self, ws, served):
        super().__init__(ws, served)
        self.pending: list[np.ndarray] = []  # audio before the first commit
        self.n_pending = 0
        self.item: str | None = None  # the running utterance
        self.n_items = 0
        self.seconds: dict[str, float] = {}

    def hello(self) -> None:
        self.send({"type": "session.created", "id": f"sess-{secrets.token_hex(12)}",
                   "created": int(time.time())})

    def error(self, code: str, message: str) -> None:
        self.send({"type": "error", "error": message, "code": code})

    async def handle(self, event: dict) -> None:
        t = event.get("type")
        if t == "session.update":
            try:
                model_id = self.served.pick(event.get("model"), "asr")
            except ModelNotFound as e:
                self.error("model_not_found", str(e))
                return
            lease = await self.hold(model_id)
            if lease is None:
                return
            try:  # vLLM's top-level `language`, for the next utterances; extension:
                raw, lang = self.check_language(lease.model, event, "language")
                asked = "hotwords" in event or "boost" in event  # hotwords / boost for them
                vocab, walk = await self.new_vocabulary(lease.model, event if asked else None,
                                                        "hotwords")
            except Invalid as e:  # the update is not applied
                self.let_go(lease)
                self.error(e.code or "invalid_value", str(e))
                return
            self.keep(lease)
            self.language_raw, self.language = raw, lang
            self.vocabulary, self.walk = vocab, walk
            if event.get("diarize") and not self.diarize():  # speakers on each utterance
                self.error("invalid_value", "this server has no diarizer (start it with "
                           "--diarizer)")
                return
            if err := self.set_include(event.get("include")):  # extension, as OpenAI's
                self.error("invalid_value", err)
        elif t == "input_audio_buffer.append":
            try:
                x = await self.decode(event.get("audio"), VLLM_RATE)
            except ValueError as e:
                self.error("invalid_audio", str(e))
                return
            except BufferFull as e:
                self.error("buffer_full", f"{e}; this chunk was not taken")
                return
            self.append(x)
        elif t == "input_audio_buffer.commit":
            if self.model is None:
                self.error("model_not_validated", "send session.update with a served model "
                           "before committing")
                return
            if self.item is None and not self.start():
                self.error("too_many_items", TOO_MANY_ITEMS)
                return
            if event.get("final"):
                self.streams[self.item].end()
                self.item = None
        else:
            self.error("unknown_event", f"unknown event type {t!r}")

    def append(self, x: np.ndarray) -> None:
        if self.item is None:  # waiting for a commit, within the connection's budget
            b = self.budget
            if self.n_pending + b.pending + len(x) > b.max_samples:
                self.error("buffer_full", f"input buffer full ({self.n_pending + b.pending} "
                           "samples queued in this connection, limit "
                           f"{b.max_samples}); this chunk was not taken")
                return
            self.pending.append(x)
            self.n_pending += len(x)
            return
        s = self.streams[self.item]
        if self.model.sample_rate != VLLM_RATE:  # never the case for the served models
            raise RuntimeError("vLLM's dialect carries 16 kHz audio")
        try:
            _feed(s, self.speakers, x)
            self.seconds[self.item] += len(x) / VLLM_RATE
        except BufferFull as e:
            self.error("buffer_full", f"{e}; this chunk was not taken")

    def start(self) -> bool:
        """A new utterance (False: too many are being transcribed)."""
        s = self.open_stream(f"utt-{self.n_items + 1}",
                             self.session_factory(self.model, self.language))
        if s is None:
            return False
        self.n_items += 1
        self.item = f"utt-{self.n_items}"
        self.seconds[self.item] = 0.0
        self.speakers.start_item(self.item)
        pending, self.pending, self.n_pending = self.pending, [], 0
        if pending:
            x = np.concatenate(pending)
            _feed(s, self.speakers, x)
            self.seconds[self.item] += len(x) / VLLM_RATE
        return True

    def engine_event(self, item: str, ev) -> list[dict]:
        text = self.texts.get(item)
        if ev[0] == "delta" and text is not None:
            d, lp = text.add(ev)
            if not d:
                return []
            return [{"type": "transcription.delta", "delta": d,
                     **({"logprobs": lp} if lp else {})}]
        if ev[0] == "done" and text is not None:
            result = ev[2]
            out = []
            d, lp = text.final(result.text)
            if d:
                out.append({"type": "transcription.delta", "delta": d,
                            **({"logprobs": lp} if lp else {})})
            extra = {"words": words_field(result)}
            if result.logprobs is not None:
                extra["logprobs"] = result_logprobs(self.model, result)
            out.append({"type": "transcription.done", "text": result.text,
                        **language_field(self.model, result, self.language),
                        "usage": usage(result, self.seconds.pop(item, 0.0)), **extra,
                        **self.speakers.fields(item, result)})
            self.stream_done(item)
            return out
        if ev[0] == "error":
            self.stream_done(item)
            if self.item == item:
                self.item = None
            return [{"type": "error", "error": ev[2], "code": ev[1]}]
        return []


NO_VAD = ("server-side turn detection needs the Silero VAD weights, which this server could "
          "not load (it was started with --no-vad, or mlx_speech's packaged weights are "
          "missing: start it with --vad PATH); until then send turn_detection: null and commit "
          "each turn")


def _ms(samples: int) -> int:
    return int(round(samples / 16.0))  # turn positions count 16 kHz samples


class OpenAIConnection(_Connection):
    """OpenAI's GA transcription dialect. With `turn_detection: null` (the default) the client
    commits each turn: a stream opens at the first append and ends at the commit, its deltas
    sent as they are decoded. With `server_vad` / `semantic_vad` the server's VAD cuts turns
    (server/turns.py): speech_started, speech_stopped, committed, conversation.item.added,
    then the item's deltas and completed, in OpenAI's order (deltas decoded before the commit
    are held until it)."""

    openai = True

    def __init__(self, ws, served):
        super().__init__(ws, served)
        self.rate = OPENAI_RATE
        self.item: str | None = None  # the turn being appended to (turn_detection null)
        self.prev: str | None = None
        self.resampler: StreamingResampler | None = None
        self.session_id = f"sess_{secrets.token_hex(12)}"
        self.bad_model: str | None = None
        self.delay: str | None = None
        self.turn_config = None  # a TurnConfig: the server cuts turns
        self.turns = None  # the TurnStream, once audio came in VAD mode
        self.held: dict[str, list[dict]] = {}  # VAD items' deltas before their commit
        self.legacy = False
        try:  # ?model=..., else the only ASR model when there is one (held once open)
            self.model_id = self.served.pick(ws.query_params.get("model"), "asr")
        except ModelNotFound as e:
            if ws.query_params.get("model"):
                self.bad_model = str(e)

    def _event_id(self) -> str:
        return f"event_{secrets.token_hex(8)}"

    def session_object(self) -> dict:
        tr = {"model": self.model_id}
        if self.language_raw is not None:
            tr["language"] = self.language_raw
        if self.delay is not None:
            tr["delay"] = self.delay
        if self.speakers.on:
            tr["diarize"] = True
        if self.vocabulary is not None:
            tr["hotwords"], tr["boost"] = list(self.vocabulary.phrases), self.vocabulary.boost
        td = self.turn_config.to_openai() if self.turn_config is not None else None
        if self.legacy:
            return {"id": self.session_id, "object": "realtime.transcription_session",
                    "input_audio_format": "pcm16", "input_audio_transcription": tr,
                    "turn_detection": td}
        inc = {"include": [LOGPROBS_INCLUDE]} if self.logprobs else {}
        return {"type": "transcription", "id": self.session_id, **inc,
                "object": "realtime.transcription_session",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": self.rate},
                                    "transcription": tr, "turn_detection": td}}}

    def hello(self) -> None:
        self.send({"type": "session.created", "event_id": self._event_id(),
                   "session": self.session_object()})
        if self.bad_model:
            self.error("model_not_found", self.bad_model)

    async def opened(self) -> None:
        if self.model_id is not None:  # the query's model: loaded now, when it is not
            lease = await self.hold(self.model_id)
            if lease is None:
                self.model_id = None
            else:
                self.keep(lease)

    def model_event(self, event: dict) -> dict:
        return {**event, "event_id": self._event_id()}

    def error(self, code: str, message: str, event_id: str | None = None,
              param: str | None = None) -> None:
        self.send(self.error_event(code, message, event_id, param))

    def error_event(self, code: str, message: str, event_id: str | None = None,
                    param: str | None = None) -> dict:
        return {"type": "error", "event_id": self._event_id(),
                "error": {"type": "invalid_request_error", "code": code, "message": message,
                          "param": param, "event_id": event_id}}

    async def handle(self, event: dict) -> None:
        t, eid = event.get("type"), event.get("event_id")
        if t in ("session.update", "transcription_session.update"):
            await self.update(event.get("session"), eid,
                              legacy=t == "transcription_session.update")
        elif t == "input_audio_buffer.append":
            try:
                x = await self.decode(event.get("audio"), self.rate)
            except ValueError as e:
                self.error("invalid_audio", str(e), eid)
                return
            except BufferFull as e:
                self.error("buffer_full", f"{e}; this chunk was not taken", eid)
                return
            await self.append(x, eid)
        elif t == "input_audio_buffer.commit":
            if self.turn_config is not None:
                if self.turns is None:
                    self.error("input_audio_buffer_commit_empty", "no audio appended", eid)
                else:
                    self.turns.control("commit", eid)
                return
            if self.item is None:
                self.error("input_audio_buffer_commit_empty", "no audio appended since the "
                           "last commit", eid)
                return
            s, item = self.streams[self.item], self.item
            try:
                _feed(s, self.speakers, self.resampler.finish())
            except BufferFull as e:
                self.error("buffer_full", f"{e}; the turn's tail was not taken", eid)
            s.end()
            for e in self.committed(item):
                self.send(e)
            self.item, self.resampler = None, None
        elif t == "input_audio_buffer.clear":
            if self.turn_config is not None:
                if self.turns is None:
                    self.send({"type": "input_audio_buffer.cleared",
                               "event_id": self._event_id()})
                else:
                    self.turns.control("clear", eid)
                return
            if self.item is not None:
                self.streams.pop(self.item).close()
                self.item, self.resampler = None, None
            self.send({"type": "input_audio_buffer.cleared", "event_id": self._event_id()})
        else:
            self.error("unknown_event", f"unknown event type {t!r}", eid)

    def committed(self, item: str) -> list[dict]:
        """input_audio_buffer.committed, then conversation.item.added for the user item."""
        out = [{"type": "input_audio_buffer.committed", "event_id": self._event_id(),
                "previous_item_id": self.prev, "item_id": item},
               {"type": "conversation.item.added", "event_id": self._event_id(),
                "previous_item_id": self.prev,
                "item": {"id": item, "type": "message", "object": "realtime.item",
                         "status": "completed", "role": "user",
                         "content": [{"type": "input_audio", "transcript": None}]}}]
        self.prev = item
        return out

    async def update(self, session, eid, legacy: bool = False) -> None:
        from ..audio.turns import TurnConfig

        if not isinstance(session, dict):
            self.error("invalid_value", "session.update needs a 'session' object", eid)
            return
        if session.get("type", "transcription") != "transcription":
            self.error("invalid_value", "this server serves transcription sessions only "
                       "(session.type 'transcription')", eid)
            return
        if legacy or "input_audio_transcription" in session or "input_audio_format" in session:
            # the beta transcription_session shape
            self.legacy = legacy
            fmt = session.get("input_audio_format")
            if fmt not in (None, "pcm16"):
                self.error("invalid_value", "only pcm16 input is supported", eid)
                return
            inp = {"transcription": session.get("input_audio_transcription") or {}}
            where = "session.input_audio_transcription"  # for errors naming a field
            if "turn_detection" in session:
                inp["turn_detection"] = session["turn_detection"]
        else:
            inp = (session.get("audio") or {}).get("input") or {}
            where = "session.audio.input.transcription"
        fmt = inp.get("format") or {}
        rate = self.rate
        if fmt:
            if fmt.get("type", "audio/pcm") != "audio/pcm":
                self.error("invalid_value", "only audio/pcm input is supported", eid)
                return
            rate = fmt.get("rate", OPENAI_RATE)
            if not isinstance(rate, int) or rate <= 0:
                self.error("invalid_value", f"bad sample rate {rate!r}", eid)
                return
            if rate != self.rate and (self.item is not None or self.turns is not None):
                self.error("invalid_value", "cannot change the rate once audio was appended",
                           eid)
                return
        turn = self.turn_config
        if "turn_detection" in inp:  # omitted: unchanged (null at first, as OpenAI's)
            td = inp["turn_detection"]
            try:
                turn = None if td is None else TurnConfig.from_openai(td)
            except ValueError as e:
                self.error("invalid_value", str(e), eid, "session.audio.input.turn_detection")
                return
            if turn is not None and self.served.vad is None:
                self.error("invalid_value", NO_VAD, eid, "session.audio.input.turn_detection")
                return
            if turn is not None and self.item is not None:
                self.error("invalid_value", "commit or clear the audio appended so far before "
                           "turning turn detection on", eid)
                return
        if err := self.set_include(session.get("include")):
            self.error("invalid_value", err, eid, "session.include")
            return
        tr = inp.get("transcription") or {}
        if tr.get("diarize") and not self.diarize():  # speakers on completed items
            self.error("invalid_value", "this server has no diarizer (start it with "
                       "--diarizer)", eid, "session.audio.input.transcription.diarize")
            return
        delay = tr.get("delay", self.delay)  # one of DELAY_NAMES (checked by realtime_event)
        model_id = self.model_id
        name = tr.get("model")
        if name is not None:
            try:
                model_id = self.served.pick(name, "asr")
            except ModelNotFound as e:
                self.error("model_not_found", str(e), eid)
                return
        if self.turns is not None and (model_id != self.model_id or delay != self.delay):
            self.error("invalid_value", "the model, delay and language are fixed once audio was "
                       "appended with turn detection on", eid)
            return
        lease = None if model_id is None else await self.hold(model_id)
        if model_id is not None and lease is None:
            return
        raw, lang = self.language_raw, self.language
        if lease is not None:  # the language for this model (OpenAI's ISO-639-1, or `auto`)
            try:
                raw, lang = self.check_language(lease.model, tr, f"{where}.language")
            except Invalid as e:
                self.let_go(lease)
                self.error("invalid_value", str(e), eid, e.param)
                return
        elif "language" in tr:
            raw = tr["language"]  # checked once a model is named
        if self.turns is not None and lang != self.language:
            self.error("invalid_value", "the model, delay and language are fixed once audio was "
                       "appended with turn detection on", eid)
            return
        model = self.model if lease is None else lease.model
        vocab, walk = self.vocabulary, self.walk
        asked = any(k in tr for k in ("hotwords", "boost", "prompt"))
        if asked or model is not self.model:  # hotwords / boost: an extension; prompt:
            try:  # OpenAI's, read as phrases. Parsed and built off the loop and the engine;
                vocab, walk = await self.new_vocabulary(  # this update waits for it
                    model, tr if asked else None, "session.audio.input.transcription")
            except Invalid as e:
                if lease is not None:
                    self.let_go(lease)
                self.error(e.code or "invalid_value", str(e), eid, e.param)
                return
        self.rate, self.delay = rate, delay
        self.language_raw, self.language = raw, lang
        if lease is not None:
            self.keep(lease)
        self.vocabulary, self.walk = vocab, walk  # the next turns' sessions take it
        if self.turns is not None:
            if turn is None:  # back to client commits: the uncommitted turn is dropped
                self.turns.close()
                self.streams.pop("turns", None)
                self.turns = self.resampler = None
            elif turn != self.turn_config:
                self.turns.control("config", turn)
        self.turn_config = turn
        self.send({"type": "transcription_session.updated" if legacy else "session.updated",
                   "event_id": self._event_id(), "session": self.session_object()})

    def make_session(self):
        """The ASR session factory for this connection's model, delay and language (engine
        thread)."""
        model, language = self.model, self.language  # the vocabulary as it is when each
        kw = {} if self.delay is None else {  # turn's session is made; OpenAI's delay names,
            "latency_ms": model.latency.preset(self.delay)}  # in the family's latencies
        return lambda: self.session_factory(model, language, **kw)()

    def invalid(self, e: Invalid, event: dict) -> None:
        eid = event.get("event_id")
        self.error("invalid_value", str(e), eid if isinstance(eid, str) else None,
                   e.param.lstrip(".") or None)

    async def append(self, x: np.ndarray, eid) -> None:
        if self.model is None:
            self.error("model_not_validated", "name a served transcription model in "
                       "session.update (session.audio.input.transcription.model)", eid)
            return
        if self.turn_config is not None:
            if self.turns is None:
                self.resampler = StreamingResampler(self.rate, 16000)
                self.turns = self.engine.submit(TurnStream(
                    self.served.vad, self.model, self.make_session(),
                    AsyncSink(self.out, self.loop, "turns"),
                    lambda item: AsyncSink(self.out, self.loop, item), self.turn_config,
                    lambda: f"item_{secrets.token_hex(8)}", budget=self.budget))
                self.streams["turns"] = self.turns
                self.speakers.start_turns()
            turns, resampler, speakers = self.turns, self.resampler, self.speakers
            y = await asyncio.to_thread(resampler.feed, x)  # off the event loop
            try:
                _feed(turns, speakers, y)
            except BufferFull as e:
                self.error("buffer_full", f"{e}; this chunk was not taken", eid)
            return
        if self.item is None:
            item = f"item_{secrets.token_hex(8)}"
            if self.open_stream(item, self.make_session()) is None:
                self.error("too_many_items", TOO_MANY_ITEMS, eid)
                return
            self.item = item
            self.resampler = StreamingResampler(self.rate, self.model.sample_rate)
            self.speakers.start_item(self.item)
        # resample first (its state must see every sample), then queue; off the event loop
        s, resampler, speakers = self.streams[self.item], self.resampler, self.speakers
        y = await asyncio.to_thread(resampler.feed, x)
        try:
            _feed(s, speakers, y)
        except BufferFull as e:
            self.error("buffer_full", f"{e}; this chunk was not taken", eid)

    def turn_event(self, ev) -> list[dict]:
        """The VAD's events (from the engine thread, in order) as OpenAI's. Returned, not
        queued: they must go out before anything queued behind them (the item's text)."""
        kind = ev[0]
        base = {"event_id": self._event_id()}
        if kind == "started":
            self.speakers.start_item(ev[1], ev[2])
            self.texts[ev[1]] = ItemDeltas(self.model.tokenizer)
            self.held[ev[1]] = []
            return [{"type": "input_audio_buffer.speech_started", **base, "item_id": ev[1],
                     "audio_start_ms": _ms(ev[2])}]
        if kind in ("stopped", "committed", "timeout"):
            item, out = ev[1], []
            if kind == "stopped":
                out.append({"type": "input_audio_buffer.speech_stopped", **base,
                            "item_id": item, "audio_end_ms": _ms(ev[2])})
            elif kind == "timeout":
                self.speakers.start_item(item, ev[2])
                self.texts[item] = ItemDeltas(self.model.tokenizer)
                out.append({"type": "input_audio_buffer.timeout_triggered", **base,
                            "item_id": item, "audio_start_ms": _ms(ev[2]),
                            "audio_end_ms": _ms(ev[3])})
            return out + self.committed(item) + self.held.pop(item, [])
        if kind == "commit_empty":
            return [self.error_event("input_audio_buffer_commit_empty", "no speech in the "
                                     "buffer since the last turn", ev[1])]
        if kind == "cleared":
            for item in [i for i in self.held]:  # the uncommitted turn is gone
                self.held.pop(item)
                self.texts.pop(item, None)
            return [{"type": "input_audio_buffer.cleared", **base}]
        if kind == "error":
            return [{"type": "error", **base, "error": {
                "type": "server_error", "code": ev[1], "message": ev[2], "param": None,
                "event_id": None}}]
        return []

    def engine_event(self, item: str, ev) -> list[dict]:
        if item == "turns":
            return self.turn_event(ev)
        text = self.texts.get(item)
        base = {"event_id": self._event_id(), "item_id": item, "content_index": 0}
        out = []
        if ev[0] == "delta" and text is not None:
            d, lp = text.add(ev)
            if d:  # an empty delta is not sent (nor logprobs without their text)
                out = [{"type": "conversation.item.input_audio_transcription.delta", **base,
                        "delta": d, **({"logprobs": lp} if lp else {})}]
        elif ev[0] == "done" and text is not None:
            result = ev[2]
            d, lp = text.final(result.text)
            if d:
                out.append({"type": "conversation.item.input_audio_transcription.delta",
                            **base, "delta": d, **({"logprobs": lp} if lp else {})})
            u = usage(result, result.token_times[-1] if result.token_times else 0.0)
            extra = {"words": words_field(result)}  # extension: the model's word times
            if result.logprobs is not None:
                extra["logprobs"] = result_logprobs(self.model, result)
            out.append({"type": "conversation.item.input_audio_transcription.completed",
                        **base, "event_id": self._event_id(), "transcript": result.text,
                        "usage": {"type": "tokens", "input_tokens": u["prompt_tokens"],
                                  "output_tokens": u["completion_tokens"],
                                  "total_tokens": u["total_tokens"]},
                        **languages_field(self.model, result, self.language), **extra,
                        **self.speakers.fields(item, result)})
            self.stream_done(item)
        elif ev[0] == "error":
            self.stream_done(item)
            self.held.pop(item, None)
            if self.item == item:
                self.item, self.resampler = None, None
            return [{"type": "error", "event_id": self._event_id(),
                     "error": {"type": "server_error", "code": ev[1], "message": ev[2],
                               "param": None, "event_id": None}}]
        if item in self.held:  # a VAD turn not committed yet: in OpenAI's order, later
            self.held[item] += out
            return []
        return out


def add_routes(app: FastAPI, served: Served) -> None:
    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket):
        cls = OpenAIConnection if ws.query_params.get("intent") else VllmConnection
        await cls(ws, served).run()
