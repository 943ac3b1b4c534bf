"""`WS /api/chat`: Kyutai's binary duplex protocol for Moshi / PersonaPlex.

Every WebSocket message is binary: a kind byte, then the payload. 0x00 handshake (sent by
the server once the session is ready), 0x01 Ogg/Opus audio at the model's rate (24 kHz) both
ways, 0x02 utf-8 text (server to client), 0x05 error (utf-8 message). Query parameters:
`model`, `voice` (or `voice_prompt`), `role` (or `text_prompt`), `seed`. Conversations are
stepped one 80 ms frame per engine tick each, on the engine thread, so several can run at
once (Kyutai's own servers take one at a time).
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect

from .common import AsyncSink, ModelNotFound, Served
from .engine import BufferFull

HANDSHAKE, AUDIO, TEXT, ERROR = b"\x00", b"\x01", b"\x02", b"\x05"


def add_routes(app: FastAPI, served: Served) -> None:
    @app.websocket("/api/chat")
    async def chat(ws: WebSocket):
        await ws.accept()
        qp = ws.query_params
        try:
            _, model = served.find(qp.get("model"), "duplex")
        except ModelNotFound as e:
            await ws.send_bytes(ERROR + str(e).encode())
            await ws.close()
            return
        if not served.engine.healthy:
            await ws.send_bytes(ERROR + b"the engine is not running")
            await ws.close()
            return
        try:
            import sphn
        except ImportError:
            await ws.send_bytes(ERROR + b"the server needs sphn for Opus: "
                                b"pip install 'mlx-speech[server]'")
            await ws.close()
            return
        kwargs = {}
        voice = qp.get("voice") or qp.get("voice_prompt")
        role = qp.get("role") or qp.get("text_prompt")
        if voice:
            kwargs["voice"] = voice.removesuffix(".pt")
        if role:
            kwargs["role"] = role
        seed = qp.get("seed")
        if seed is not None:
            if not seed.isdigit():
                await ws.send_bytes(ERROR + b"seed must be a non-negative integer")
                await ws.close()
                return
            kwargs["seed"] = int(seed)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        s = served.engine.open_duplex(model, lambda: model.session(**kwargs),
                                      AsyncSink(q, loop))
        reader = sphn.OpusStreamReader(model.sample_rate)
        writer = sphn.OpusStreamWriter(model.sample_rate)
        ready = asyncio.Event()

        async def send_loop():
            while True:
                ev = await q.get()
                if ev[0] == "ready":
                    await ws.send_bytes(HANDSHAKE)
                    ready.set()
                elif ev[0] == "audio":
                    data = writer.append_pcm(ev[1])
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
                if data[:1] == AUDIO:
                    pcm = reader.append_bytes(data[1:])
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
