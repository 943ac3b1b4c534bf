"""The FastAPI application: REST endpoints, security middleware, the WebSocket routes."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import secrets
import time

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile

from .common import KEY_SUBPROTOCOL, AsyncSink, ItemDeltas, ModelNotFound, Served
from .common import pcm16_bytes as _pcm16
from .jobs import AsrStream, DiarizerStream
from .languages import languages_field, verbose_language
from .limits import RETRY_AFTER_S, Limits, Shutdown, session_budget, while_connected
from .models import ModelUnavailable
from .security import Defences
from .speech import NO_AUDIO, OpusChunks, SpeechJob
from .uploads import QUEUE_S, PauseJob, UploadRefused, feed, open_upload
from .validate import Invalid, diarize_form, form_language, form_vocabulary
from .validate import speech_body as _check_speech
from .validate import transcription_form as _check_form
from .vocabulary import prepare, result_logprobs, session_factory
from .vocabulary import words_field as _words

TRANSCRIPT_FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
SPEECH_FORMATS = {"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg",
                  "opus": "audio/ogg", "pcm": "audio/pcm"}


def error_body(message: str, type_: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _http_error(status: int, message: str, code: str | None = None, param: str | None = None):
    type_ = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error",
             500: "server_error", 503: "server_error"}.get(status, "invalid_request_error")
    return HTTPException(status, error_body(message, type_, code, param))


def _own_page(origin: str, host: str) -> bool:
    """A page this server served, reached by IP or localhost (the browser page at /): its
    origin is the request's own host. A host *name* could be DNS-rebound to us, so only IP
    literals, localhost and --allowed-host names count."""
    from .security import own_page

    return own_page(origin, host)


class Guard:
    """Pure ASGI middleware: the API key on HTTP and on the WebSocket handshake, the
    WebSocket Origin allowlist (Starlette's CORS does not cover WebSockets), and the
    upload size limit (413 before the body is read, when Content-Length says so)."""

    def __init__(self, app, served: Served):
        self.app, self.served = app, served

    def key_ok(self, headers: dict[str, str], scope) -> bool:
        key = self.served.api_key
        if key is None:
            return True
        got = None
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            got = auth[7:].strip()
        got = got or headers.get("x-api-key")
        if got is None and scope["type"] == "websocket":  # browsers cannot set headers
            for p in headers.get("sec-websocket-protocol", "").split(","):
                p = p.strip()
                if p.startswith(KEY_SUBPROTOCOL):
                    got = p[len(KEY_SUBPROTOCOL):]
        return got is not None and hmac.compare_digest(got.encode(), key.encode())

    def origin_ok(self, headers: dict[str, str]) -> bool:
        from .security import origin_ok

        origin = headers.get("origin")
        if origin is None:  # not a browser
            return True
        return origin_ok(origin, headers.get("host", ""), self.served.allowed_origins,
                         tuple(h.lower() for h in self.served.allowed_hosts))

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        open_path = scope["path"] in ("/health", "/") or scope["path"].startswith("/web/")
        if scope["type"] == "websocket":
            from .security import deny_ws

            if not self.key_ok(headers, scope):
                return await deny_ws(scope, receive, send, "missing or wrong API key (send "
                                     "Authorization: Bearer KEY)", "invalid_api_key")
            if not self.origin_ok(headers):
                return await deny_ws(scope, receive, send, "Origin not allowed (start the "
                                     "server with --allowed-origin)", "origin_not_allowed")
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})["key_ok"] = self.key_ok(headers, scope)
        if not open_path and not scope["state"]["key_ok"]:
            return await _send_json(send, 401, error_body(
                "missing or wrong API key (send Authorization: Bearer KEY)",
                "authentication_error", "invalid_api_key"),
                [(b"www-authenticate", b'Bearer realm="mlx_speech"')])
        limit = self.served.max_upload_bytes
        too_large = error_body(f"the request body is over the limit of {limit} bytes",
                               code="request_too_large")
        length = headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            return await _send_json(send, 413, too_large)
        # no (honest) Content-Length, e.g. chunked: count while the app reads; past the limit
        # the app sees a disconnect, its answer is dropped and the client gets the 413
        seen, over, started = 0, False, False

        async def counted_receive():
            nonlocal seen, over
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg):
            nonlocal started
            if over:
                return
            started = True
            await send(msg)

        await self.app(scope, counted_receive, guarded_send)
        if over and not started:
            await _send_json(send, 413, too_large)


async def _send_json(send, status: int, body: dict, headers=()) -> None:
    from .limits import send_json

    await send_json(send, status, body, headers)


def create_app(served: Served) -> FastAPI:
    app = FastAPI(title="mlx_speech", docs_url=None, redoc_url=None, openapi_url=None)
    served.created = served.created or int(time.time())
    app.state.served = served

    @app.exception_handler(HTTPException)
    async def _http_exc(request: Request, exc: HTTPException):
        body = exc.detail if isinstance(exc.detail, dict) else error_body(str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(ModelNotFound)
    async def _not_found(request: Request, exc: ModelNotFound):
        status = 404 if exc.code == "model_not_found" else 400
        return JSONResponse(error_body(str(exc), "invalid_request_error", exc.code, "model"),
                            status_code=status)

    @app.exception_handler(ModelUnavailable)
    async def _unavailable(request: Request, exc: ModelUnavailable):
        if exc.code == "model_load_failed":
            return JSONResponse(error_body(str(exc), "server_error", exc.code, "model"),
                                status_code=500)
        return JSONResponse(error_body(str(exc), "server_error", exc.code), status_code=503,
                            headers={"retry-after": str(RETRY_AFTER_S)})

    @app.exception_handler(Invalid)
    async def _invalid(request: Request, exc: Invalid):
        return JSONResponse(error_body(str(exc), param=exc.param), status_code=400)

    @app.exception_handler(Exception)  # anything else: a JSON 500 (logged once, by uvicorn)
    async def _internal(request: Request, exc: Exception):
        return JSONResponse(error_body(f"internal error ({type(exc).__name__})",
                                       "server_error", "internal_error"), status_code=500)

    @app.get("/health")
    async def health(request: Request):
        e = served.engine
        if e.healthy:  # the model ids (local paths) only to key holders
            keyed = served.api_key is not None and request.scope.get("state", {}).get("key_ok")
            if keyed:  # and which of them are loaded now
                return {"status": "ok", "models": list(served.models), "loaded": [
                    m for m in served.models if served.models.state(m) == "loaded"]}
            return {"status": "ok"}
        return JSONResponse({"status": "unhealthy", "error": e.failed or "engine stopped"},
                            status_code=503)

    def model_entry(m: str) -> dict:
        return {"id": m, "object": "model", "created": served.created, "owned_by": "mlx_speech",
                "kind": served.kind(m), **served.details(m)}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_entry(m) for m in served.models]}

    @app.post("/v1/models/{model_id:path}/load")
    async def load_model(model_id: str):
        """An extension: load a model now (the page, before its tab is used) and answer its
        entry, details included; as any request naming it, it waits for the load."""
        need_engine()
        if model_id not in served.models:
            raise ModelNotFound(f"model {model_id!r} is not served here; served: "
                                f"{', '.join(served.models)}")
        (await served.models.acquire(model_id)).release()
        return model_entry(model_id)

    def need_engine():
        if not served.engine.healthy:
            why = served.engine.failed or "stopped"
            raise _http_error(503, f"the engine is not running ({why})", "engine_unavailable")

    # -- POST /v1/audio/transcriptions ------------------------------------------
    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        need_engine()
        try:
            form = await request.form(max_files=1, max_fields=32)
        except Exception as e:  # malformed multipart
            raise _http_error(400, f"cannot read the form: {e}") from None
        _check_form(form)
        f = form.get("file")
        if not isinstance(f, UploadFile):
            raise _http_error(400, "missing the audio 'file' field", param="file")
        name = served.pick(_field(form, "model"), "asr")
        fmt = _field(form, "response_format") or "json"
        if fmt not in TRANSCRIPT_FORMATS:
            raise _http_error(400, f"response_format must be one of "
                              f"{', '.join(TRANSCRIPT_FORMATS)}, got {fmt!r}",
                              param="response_format")
        stream = (_field(form, "stream") or "false").lower() in ("true", "1")
        diarize = diarize_form(form, fmt, stream, served.diarizer is not None)
        grans = set(form.getlist("timestamp_granularities[]")
                    + form.getlist("timestamp_granularities"))
        size = f.size if f.size is not None else len(await f.read())
        if size > served.max_upload_bytes:
            raise _http_error(413, f"the 'file' field ({f.filename!r}) is over the limit of "
                              f"{served.max_upload_bytes} bytes", "request_too_large", "file")
        vocabulary = await asyncio.to_thread(form_vocabulary, form)  # off the event loop
        include = form.getlist("include[]") + form.getlist("include")
        want_lp = "logprobs" in include and fmt in ("json", "verbose_json")
        loop = asyncio.get_running_loop()
        queues: dict[str, asyncio.Queue] = {}

        def sink(name: str) -> AsyncSink:
            queues[name] = asyncio.Queue()
            return AsyncSink(queues[name], loop)

        lease = await served.acquire(name, "asr")  # loaded first, when it is not
        try:  # held until its jobs are submitted: the engine's job then keeps it loaded
            model = lease.model
            language = form_language(form, model)  # before the upload is read: a 400 naming them
            rate = model.sample_rate
            try:  # from the header (and a float file's samples), before any engine work
                upload = await open_upload(f.file, f.filename, size, rate, served.max_upload_s)
            except UploadRefused as e:
                raise _http_error(e.status, str(e), e.code, "file") from None
            # the list's graph, built off the engine; held (`walk`) until the session is made
            walk = await prepare(model, vocabulary)
            room = int(QUEUE_S * rate)
            jobs = [served.engine.submit(AsrStream(
                model, session_factory(model, vocabulary, want_lp, language), sink("asr"),
                max_samples=room))]
        finally:
            lease.release()
        if diarize:  # the diarizer and the pause finder take the same blocks, alongside
            jobs.append(served.engine.submit(DiarizerStream(served.diarizer, sink("speakers"),
                                                            max_samples=room)))
        elif served.vad is not None and fmt in ("verbose_json", "srt", "vtt") and rate == 16000:
            jobs.append(served.engine.submit(PauseJob(served.vad, sink("pauses"), room)))
        feeder = asyncio.ensure_future(_feed(upload, rate, jobs, queues["asr"]))
        if stream:
            return StreamingResponse(_sse_transcript(
                queues["asr"], jobs, feeder, walk, "word" in grans, model if want_lp else None,
                model, lambda r: languages_field(model, r, language)),
                media_type="text/event-stream")
        try:  # the client gone: every job is closed, the engine drops them at its next tick
            got = await while_connected(request, _upload_results(
                queues, feeder, served.diarizer.n_speakers if diarize else 0))
        finally:
            feeder.cancel()
            for j in jobs:
                j.close()
        if got is None:
            return Response(status_code=499)
        result, seconds, frames, breaks = got
        if diarize:  # diarized_json, or diarize=true on verbose_json
            from ..diarize import from_frames
            from .diarization import diarized_json, speaker_fields

            d = from_frames(result, frames)
            if fmt == "diarized_json":
                return diarized_json(d, seconds)
            return speaker_fields(_transcript_response(fmt, result, seconds, "word" in grans,
                                                       segments=d.segments,
                                                       said=(model, language)), d)
        resp = _transcript_response(fmt, result, seconds, "word" in grans, breaks or (),
                                    said=(model, language))
        if want_lp:  # OpenAI's include[]=logprobs: {token, logprob, bytes} per token
            resp["logprobs"] = result_logprobs(model, result)
        return resp

    # -- POST /v1/audio/speech -------------------------------------------------------
    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        t_request = time.perf_counter()  # its time to first audio starts here
        need_engine()
        try:
            body = await request.json()
        except Exception:
            raise _http_error(400, "the body must be JSON") from None
        if not isinstance(body, dict):
            raise _http_error(400, "the body must be a JSON object")
        from ..models.voxtral_tts import MAX_FRAMES

        _check_speech(body, MAX_FRAMES)
        name = served.pick(body.get("model"), "tts")
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise _http_error(400, "'input' must be non-empty text", param="input")
        fmt = body.get("response_format") or "mp3"
        if fmt not in SPEECH_FORMATS:
            raise _http_error(400, f"response_format must be one of {', '.join(SPEECH_FORMATS)}"
                              f", got {fmt!r}", param="response_format")
        speed = body.get("speed", 1.0)
        if speed not in (None, 1, 1.0):
            raise _http_error(400, "only speed 1.0 is supported", param="speed")
        stream_format = body.get("stream_format") or "audio"
        if stream_format not in ("audio", "sse"):
            raise _http_error(400, "stream_format must be 'audio' or 'sse'",
                              param="stream_format")
        voice = body.get("voice") or None
        seed = body.get("seed")
        if seed is None:
            seed = secrets.randbelow(2**31)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise _http_error(400, "seed must be a non-negative integer", param="seed")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise _http_error(400, "stream must be true or false", param="stream")
        max_frames = body.get("max_frames")
        if max_frames is not None and (not isinstance(max_frames, int) or max_frames <= 0):
            raise _http_error(400, "max_frames must be a positive integer", param="max_frames")
        # pcm and opus stream as frames are decoded, every 4 frames (320 ms): a player
        # starting on the first chunk never waits, where generation is faster than real time,
        # for a bigger one (4 then 16 frames needed 4x real time at the first join); wav too
        # with `stream: true` (an extension; its header then carries the unknown-size marker).
        # mp3, flac and wav otherwise come whole, wav with its exact sizes: made with
        # generate()'s chunking, same samples
        streaming = stream_format == "sse" or fmt in ("pcm", "opus") or (fmt == "wav" and stream)
        chunking = ({"first_frames": 4, "chunk_frames": 4} if streaming
                    else {"first_frames": 128, "chunk_frames": 128})
        # one speech session, stepped a frame per engine tick with every other speech job of
        # this model (one batched forward): exactly `stream()`'s audio for this text
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        lease = await served.acquire(name, "tts")  # loaded first, when it is not
        try:  # held until its job is submitted: the engine's job then keeps it loaded
            model = lease.model
            if voice is not None and voice not in model.voices:
                raise _http_error(400, f"unknown voice {voice!r}; voices: "
                                  f"{', '.join(model.voices) or 'none'}", param="voice")
            job = served.engine.submit(SpeechJob(model, lambda: model.session(
                voice=voice, seed=seed, max_frames=max_frames, text=text, **chunking),
                AsyncSink(q, loop)))
        finally:
            lease.release()
        headers = {"x-seed": str(seed)}
        sr = model.sample_rate
        if streaming:  # the status line waits for the first audio (its time is a header)
            try:  # the client gone: the job is closed, the engine drops it at its next tick
                first = await while_connected(request, _first_speech(q))
            except BaseException:
                job.close()
                raise
            if first is None:
                job.close()
                return Response(status_code=499)
            headers[TTFA_HEADER] = _ms_since(t_request)
            events = _speech_events(first, q)
            if stream_format == "sse":
                return StreamingResponse(_sse_speech(events, job),
                                         media_type="text/event-stream", headers=headers)
            return StreamingResponse(_stream_speech(events, job, fmt, sr),
                                     media_type=SPEECH_FORMATS[fmt], headers=headers)
        try:  # the client gone: the job is closed, the engine drops it at its next tick
            got = await while_connected(request, _collect_speech(q, t_request))
        finally:
            job.close()
        if got is None:
            return Response(status_code=499)
        chunks, headers[TTFA_HEADER] = got
        samples = np.concatenate(chunks)
        data = await asyncio.to_thread(
            lambda: wav_bytes(samples, sr) if fmt == "wav" else encode_audio(samples, sr, fmt))
        return Response(data, media_type=SPEECH_FORMATS[fmt], headers=headers)

    from .kyutai import add_routes as add_kyutai
    from .page import add_routes as add_page
    from .realtime import add_routes as add_realtime
    from .speech_stream import add_routes as add_speech_stream

    add_realtime(app, served)
    add_speech_stream(app, served)
    add_kyutai(app, served)
    add_page(app)
    app.state.shutdown = Shutdown()  # begun by limits.make_server's Server
    app.add_middleware(Limits, max_per_ip=served.max_per_ip, max_sessions=lambda: (
        served.max_sessions or session_budget(served.models.budgets())),  # models load later
        shutdown=app.state.shutdown)
    app.add_middleware(Guard, served=served)
    app.add_middleware(Defences, served=served)  # outermost: Host, Origin, content type
    if served.allowed_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(served.allowed_origins),
                           allow_credentials=False, allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"])
    return app


def _field(form, name: str) -> str | None:
    v = form.get(name)
    return v if isinstance(v, str) and v != "" else None


TTFA_HEADER = "x-time-to-first-audio-ms"  # from the request to its first audio, on the server


def _ms_since(t0: float) -> str:
    return f"{1e3 * (time.perf_counter() - t0):.1f}"


def _speech_failed(ev) -> HTTPException:
    """A speech job's ("error", code, message), or a ("done", info) without a frame."""
    if ev[0] == "done":
        return _http_error(500, NO_AUDIO, "no_audio")
    status = {"invalid_request": 400, "server_shutdown": 503}.get(ev[1], 500)
    return _http_error(status, f"speech generation failed: {ev[2]}", ev[1])


async def _first_speech(q: asyncio.Queue):
    """The job's first audio event (an HTTP error when it fails or says nothing first)."""
    ev = await q.get()
    if ev[0] != "audio":
        raise _speech_failed(ev)
    return ev


async def _speech_events(first, q: asyncio.Queue):
    yield first
    while True:
        yield await q.get()


async def _collect_speech(q: asyncio.Queue, t_request: float) -> tuple[list, str]:
    """Every audio chunk of the job, and its time to first audio (ms, as the header says)."""
    chunks, ttfa = [], ""
    while True:
        ev = await q.get()
        if ev[0] == "audio":
            ttfa = ttfa or _ms_since(t_request)
            chunks.append(ev[1])
        elif ev[0] == "done" and ev[1]["frames"]:
            return chunks, ttfa
        else:
            raise _speech_failed(ev)


async def _feed(upload, rate: int, jobs: list, q: asyncio.Queue) -> float:
    """`uploads.feed`, a refusal also told through the transcription's queue (`q`): a
    streamed answer, already under way, ends with it as an error event."""
    try:
        return await feed(upload, rate, jobs)
    except UploadRefused as e:
        q.put_nowait(("error", e.code, str(e)))
        raise


def _job_failed(ev, what: str = "transcription") -> HTTPException:
    """A job's ("error", code, message) as an HTTP error: a bad upload 400, one past the
    limits 413, a shutdown 503, the rest 500."""
    status = {"invalid_audio": 400, "upload_too_long": 413,
              "server_shutdown": 503}.get(ev[1], 500)
    msg = ev[2] if status in (400, 413) else f"{what} failed: {ev[2]}"
    return _http_error(status, msg, ev[1], "file" if status in (400, 413) else None)


async def _await_done(q: asyncio.Queue, what: str = "transcription"):
    """A job's ("done", ...) event; its error as an HTTP error."""
    while True:
        ev = await q.get()
        if ev[0] == "done":
            return ev
        if ev[0] == "error":
            raise _job_failed(ev, what)


async def _speaker_frames(q: asyncio.Queue, n_speakers: int):
    """A diarizer stream's frames, all of them."""
    from ..diarize import FrameLog

    frames = FrameLog(n_speakers)
    while True:
        ev = await q.get()
        if ev[0] == "frames":
            frames.add(ev[1])
        elif ev[0] == "done":
            return frames.frames
        else:
            raise _job_failed(ev, "diarization")


async def _upload_results(queues: dict, feeder, n_speakers: int) -> tuple:
    """(result, seconds, speaker frames or None, pause breaks or None) of an upload's jobs."""
    try:
        seconds = await feeder
    except UploadRefused as e:
        raise _http_error(e.status, str(e), e.code, "file") from None
    result = (await _await_done(queues["asr"]))[2]
    frames = breaks = None
    if "speakers" in queues:
        frames = await _speaker_frames(queues["speakers"], n_speakers)
    if "pauses" in queues:
        breaks = (await _await_done(queues["pauses"], "pause detection"))[1]
    return result, seconds, frames, breaks


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _sse_error(ev) -> str:
    """An engine ("error", code, message) event as an SSE error event."""
    return _sse({"type": "error", "error": error_body(ev[2], "server_error", ev[1])["error"]})


async def _sse_transcript(q: asyncio.Queue, jobs: list, feeder, walk, words: bool = False,
                          lp_model=None, model=None, languages=lambda result: {}):
    """`transcript.text.delta` events, then `transcript.text.done`; with word timestamps asked
    for (an extension: OpenAI's streaming has none) the done event also carries `words`;
    `lp_model` (include[]=logprobs): both carry OpenAI's `logprobs`, each delta exactly its
    own tokens'; `languages(result)`: the done event's `languages` (server/languages.py). The
    upload is decoded into the stream meanwhile (`feeder`); `walk` holds the vocabulary's
    graph until the stream's session is made."""
    text = ItemDeltas(model.tokenizer)
    try:
        while True:
            ev = await q.get()
            if ev[0] == "delta":
                d, lp = text.add(ev)
                if d:
                    yield _sse({"type": "transcript.text.delta", "delta": d,
                                **({"logprobs": lp} if lp else {})})
            elif ev[0] == "done":
                result = ev[2]
                d, lp = text.final(result.text)
                if d:
                    yield _sse({"type": "transcript.text.delta", "delta": d,
                                **({"logprobs": lp} if lp else {})})
                seconds = await feeder
                done = {"type": "transcript.text.done", "text": result.text,
                        **languages(result),
                        "usage": {"type": "duration", "seconds": round(seconds, 3)}}
                if words:
                    done["words"] = _words(result)
                if lp_model is not None:
                    done["logprobs"] = result_logprobs(lp_model, result)
                yield _sse(done)
                yield "data: [DONE]\n\n"
                return
            else:
                yield _sse_error(ev)
                return
    finally:
        feeder.cancel()
        for j in jobs:
            j.close()


def _transcript_response(fmt: str, result, seconds: float, words: bool, breaks=(),
                         segments=None, *, said: tuple):
    """`said`: (the model, the request's checked language), for the language fields
    (server/languages.py)."""
    model, language = said
    from ..transcript import format_srt, format_vtt, segments_from_words

    if fmt == "text":
        return PlainTextResponse(result.text + "\n")
    if segments is None:
        segments = segments_from_words(result.words, breaks=breaks)
    if fmt == "srt":
        return PlainTextResponse(format_srt(segments))
    if fmt == "vtt":
        return PlainTextResponse(format_vtt(segments), media_type="text/vtt")
    if fmt == "json":
        return {"text": result.text, **languages_field(model, result, language),
                "usage": {"type": "duration", "seconds": round(seconds, 3)}}
    out = {
        "task": "transcribe", "language": verbose_language(model, result, language),
        "duration": round(seconds, 3), "text": result.text,
        "segments": [{"id": i, "seek": 0, "start": round(s.start, 3), "end": round(s.end, 3),
                      "text": s.text, "tokens": [], "temperature": 0.0, "avg_logprob": 0.0,
                      "compression_ratio": 0.0, "no_speech_prob": 0.0}
                     for i, s in enumerate(segments)],
        "usage": {"type": "duration", "seconds": round(seconds, 3)},
    }
    if words:
        out["words"] = _words(result)
    return out


def encode_audio(samples: np.ndarray, sr: int, fmt: str) -> bytes:
    """A whole clip in `fmt` (the audio writers' own encoding, via a temporary file)."""
    import tempfile
    from pathlib import Path

    from ..audio.io import write_audio

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"speech.{fmt}"
        write_audio(path, samples, sr, fmt)
        return path.read_bytes()


UNKNOWN_SIZE = 0xFFFFFFFF  # a chunked WAV stream's RIFF and data sizes, as streaming servers do


def _wav_header(sr: int, n_samples: int | None = None) -> bytes:
    """A 16-bit mono WAV header: the exact sizes for `n_samples`, or the unknown-size marker
    (None: a chunked stream, whose length nobody knows when the header goes out)."""
    import struct

    data = UNKNOWN_SIZE if n_samples is None else 2 * n_samples
    riff = UNKNOWN_SIZE if n_samples is None else 36 + data
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sr, sr * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


def wav_bytes(samples: np.ndarray, sr: int) -> bytes:
    """A whole clip as 16-bit mono WAV with exact sizes: the samples a stream would carry."""
    return _wav_header(sr, len(samples)) + _pcm16(samples)


async def _stream_speech(events, job, fmt: str, sr: int):
    """Bytes as frames are decoded: pcm and wav chunk by chunk, opus as an Ogg stream."""
    opus = OpusChunks(sr) if fmt == "opus" else None
    if fmt == "wav":
        yield _wav_header(sr)
    try:
        async for ev in events:
            if ev[0] == "audio":
                if opus is None:
                    yield _pcm16(ev[1])
                elif out := await asyncio.to_thread(opus.push, ev[1]):
                    yield out
            elif ev[0] == "done":
                if opus is not None and (out := opus.finish()):
                    yield out
                return
            else:
                return  # the status line is gone: end the body early
    finally:
        job.close()


async def _sse_speech(events, job):
    """speech.audio.delta events carry base64 16-bit little-endian mono PCM at 24 kHz."""
    n = 0
    try:
        async for ev in events:
            if ev[0] == "audio":
                n += len(ev[1])
                yield _sse({"type": "speech.audio.delta",
                            "audio": base64.b64encode(_pcm16(ev[1])).decode()})
            elif ev[0] == "done":
                yield _sse({"type": "speech.audio.done",
                            "usage": {"input_tokens": 0, "output_tokens": n // 1920,
                                      "total_tokens": n // 1920}})
                return
            else:
                yield _sse_error(ev)
                return
    finally:
        job.close()
