"""`WS /api/chat`: Kyutai's binary duplex protocol for Moshi / PersonaPlex.

Every WebSocket message is binary: a kind byte, then the payload. 0x00 handshake (sent by
the server once the session is ready), 0x01 Ogg/Opus audio at the model's rate (24 kHz) both
ways, 0x02 utf-8 text (server to client), 0x05 error (utf-8 message). Query parameters:
`model`, `voice` (or `voice_prompt`), `role` (or `text_prompt`), `seed`, and `format`: `opus`
(default, Kyutai's clients) or `pcm`, where 0x01 payloads are raw 16-bit little-endian mono
PCM at the model's rate both ways (what the browser page speaks: no codec in the page).
Conversations are stepped one 80 ms frame per engine tick each, on the engine thread, so
several can run at once (Kyutai's own servers take one at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np
from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect

from . import limits
from .common import AsyncSink, ModelNotFound, Served, answer_subprotocol, pcm16_bytes
from .jobs import BufferFull, Conversation
from .models import ModelUnavailable
from .security import resolve_voice
from .validate import Invalid, kyutai_query

log = logging.getLogger("mlx_speech.server")

HANDSHAKE, AUDIO, TEXT, ERROR = b"\x00", b"\x01", b"\x02", b"\x05"


class _Pcm16:
    """The `format=pcm` codec: 16-bit little-endian mono both ways (same API as sphn's)."""

    def append_bytes(self, data: bytes) -> np.ndarray:
        if len(data) % 2:
            raise ValueError("pcm audio must have an even number of bytes")
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0

    def append_pcm(self, x: np.ndarray) -> bytes:
        return pcm16_bytes(x)


def add_routes(app: FastAPI, served: Served) -> None:
    @app.websocket("/api/chat")
    async def chat(ws: WebSocket):
        await ws.accept(subprotocol=answer_subprotocol(ws))
        try:
            await _chat(ws, served)
        except WebSocketDisconnect:
            pass
        except Exception as e:  # a bug, not the client's: say so, once, then close
            log.exception("/api/chat failed")
            with contextlib.suppress(Exception):
                await ws.send_bytes(ERROR + f"internal error ({type(e).__name__})".encode())
                await ws.close(1011)


async def _chat(ws: WebSocket, served: Served) -> None:
    """A conversation, holding its model (loaded first when it is not: the handshake byte
    comes once it is, and the session is ready) until the socket closes."""
    try:
        qp = kyutai_query(ws.query_params)
        if (qp.get("format") or "opus") not in ("opus", "pcm"):
            raise Invalid("format", "format must be opus or pcm")
        lease = await served.acquire(qp.get("model"), "duplex")
    except (Invalid, ModelNotFound, ModelUnavailable) as e:
        await ws.send_bytes(ERROR + str(e).encode())
        await ws.close()
        return
    try:
        await _converse(ws, served, qp, lease.model)
    finally:
        lease.release()


async def _converse(ws: WebSocket, served: Served, qp: dict, model) -> None:
    try:
        voice = qp.get("voice") or qp.get("voice_prompt")
        voice = resolve_voice(model, voice, served.voices_dir) if voice else None
    except Invalid as e:
        await ws.send_bytes(ERROR + str(e).encode())
        await ws.close()
        return
    if not served.engine.healthy:
        await ws.send_bytes(ERROR + b"the engine is not running")
        await ws.close()
        return
    fmt = qp.get("format") or "opus"
    if fmt == "opus":
        try:
            import sphn
        except ImportError:
            from ..errors import install_hint

            await ws.send_bytes(ERROR + b"the server needs the sphn package for Opus: "
                                + install_hint("server").encode())
            await ws.close()
            return
    kwargs = {}
    role = qp.get("role") or qp.get("text_prompt")
    if voice:
        kwargs["voice"] = voice
    if role:
        kwargs["role"] = role
    seed = qp.get("seed")
    if seed is not None:  # checked by kyutai_query: 0..2**63-1
        kwargs["seed"] = int(seed)
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    s = served.engine.submit(Conversation(model, lambda: model.session(**kwargs),
                                          AsyncSink(q, loop)))
    if fmt == "opus":
        reader = sphn.OpusStreamReader(model.sample_rate)
        writer = sphn.OpusStreamWriter(model.sample_rate)
    else:
        reader = writer = _Pcm16()
    ready = asyncio.Event()

    async def send_loop():
        while True:
            ev = await q.get()
            if ev[0] == "ready":
                await ws.send_bytes(HANDSHAKE)
                ready.set()
            elif ev[0] == "audio":  # encoding off the event loop
                data = await asyncio.to_thread(writer.append_pcm, ev[1])
                if data:
                    await ws.send_bytes(AUDIO + data)
            elif ev[0] == "text":
                await ws.send_bytes(TEXT + ev[1].encode())
            elif ev[0] == "error":
                await ws.send_bytes(ERROR + ev[2].encode())
                await ws.close()
                return

    sender = asyncio.create_task(send_loop())
    try:
        while True:
            recv = asyncio.create_task(ws.receive())
            done, _ = await asyncio.wait({recv, sender}, timeout=served.idle_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if sender in done:  # closed after an error
                recv.cancel()
                return
            if not done:
                recv.cancel()
                await ws.send_bytes(ERROR + b"idle timeout")
                return
            msg = recv.result()
            if msg["type"] == "websocket.disconnect":
                return
            data = msg.get("bytes")
            if not data:
                continue
            if q.qsize() > limits.MAX_BACKLOG:  # the client sends but does not read
                await ws.send_bytes(ERROR + b"the client is not reading the conversation's "
                                    b"audio; closing")
                await ws.close(1008)
                return
            if data[:1] == AUDIO:
                try:  # decoding off the event loop
                    pcm = await asyncio.to_thread(reader.append_bytes, data[1:])
                except ValueError as e:
                    await ws.send_bytes(ERROR + str(e).encode())
                    continue
                if len(pcm):
                    try:
                        s.push(np.asarray(pcm, np.float32))
                    except BufferFull as e:
                        await ws.send_bytes(ERROR + str(e).encode())
            # other kinds (control, ping) are ignored, as Kyutai's server does
    except WebSocketDisconnect:
        pass
    finally:
        s.close()
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
