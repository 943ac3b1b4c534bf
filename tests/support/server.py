"""Shared by the server tests (tests/server/, tests/web/test_web.py,
tests/project/test_readme.py)
and docs/web/screenshots.py: the server on a loopback port in a thread, the audio a client
sends, and vLLM's realtime example client."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from mlx_speech.server import make_app

DEADLINE_S = 60.0  # bound on every wait for the server (never hit when things work)
KEY = "test-key"  # the API key of tests/server/test_server.py's server; vllm_client's default


def loopback_socket() -> socket.socket:
    """A listening socket on a port the system picks, kept open for the server to serve on:
    no window in which another process could take the port (nor any fixed port)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


class ServerThread:
    """uvicorn in a thread on a free loopback port; always shut down."""

    def __init__(self, models, **kw):
        import uvicorn

        self.app, self.engine = make_app(models, **kw)
        self.serve(uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0,
                                                 log_level="error")))

    def serve(self, server) -> None:
        """Run `server` (a uvicorn.Server) on a loopback socket bound now."""
        self.sock = loopback_socket()
        self.port = self.sock.getsockname()[1]
        self.server = server
        self.thread = threading.Thread(target=server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            assert time.time() - t0 < DEADLINE_S and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(DEADLINE_S)
        self.engine.stop()
        self.sock.close()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


class HostileServer(ServerThread):
    """ServerThread, served as `python -m mlx_speech.server` serves (header deadline,
    keep-alive, shutdown and proxy-header settings of `limits.make_server`)."""

    def __init__(self, models, header_timeout_s: float = 10.0,
                 forwarded_allow_ips: list[str] | None = None, **kw):
        from mlx_speech.server.limits import make_server

        self.app, self.engine = make_app(models, **kw)
        self.serve(make_server(self.app, self.engine, "127.0.0.1", 0,
                               header_timeout_s=header_timeout_s, log_level="error",
                               forwarded_allow_ips=forwarded_allow_ips))


def server_process(command: list[str], **popen) -> tuple[subprocess.Popen, int]:
    """A server command (`python -m mlx_speech.server ...`) run with `--port 0`: the process
    and the port it bound, read from its "the page: http://...:PORT/" line (waited for, twice
    DEADLINE_S at most). Its stderr keeps being read (into `proc.err_lines`), so the server
    never blocks writing to it."""
    import queue
    import re

    proc = subprocess.Popen([*command, "--port", "0"], stderr=subprocess.PIPE, text=True,
                            **popen)
    proc.err_lines = []
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stderr:
            proc.err_lines.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    t0 = time.time()
    while True:
        try:
            line = lines.get(timeout=max(0.1, 2 * DEADLINE_S - (time.time() - t0)))
        except queue.Empty:
            line = None
        if line is None:
            proc.kill()
            raise AssertionError("the server did not start: " + "".join(proc.err_lines)[-3000:])
        if m := re.search(r"the page: http://[^:/]+:(\d+)/", line):
            return proc, int(m.group(1))


def wav_bytes(x: np.ndarray, sr: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, subtype="FLOAT", format="WAV")
    return buf.getvalue()


def pcm16(x: np.ndarray) -> np.ndarray:
    """What a pcm16 client sends (and what the server decodes, / 32768)."""
    return np.round(np.clip(x, -1, 1) * 32767).astype("<i2")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))


def tiny_language_models(english: str = "nm") -> dict:
    """The tiny Nemotron 3.5 (`n35`: takes languages) and the tiny English Nemotron (named
    `english`: takes none), loaded."""
    import mlx_speech

    golden = Path(__file__).parents[1] / "golden"
    return {"n35": mlx_speech.load(golden / "nemotron35" / "tiny.nemo"),
            english: mlx_speech.load(golden / "nemotron")}


async def append_and_commit(conn, pcm: np.ndarray, chunk_bytes: int) -> None:
    """One turn of an `openai` SDK realtime connection: base64 appends, then the commit."""
    b = pcm.tobytes()
    for i in range(0, len(b), chunk_bytes):
        await conn.input_audio_buffer.append(audio=base64.b64encode(b[i:i + chunk_bytes]).decode())
    await conn.input_audio_buffer.commit()


async def vllm_client(srv, model: str, pcm: np.ndarray, pace_s: float = 0.0,
                      chunk_bytes: int = 4096, headers=None, update: dict | None = None,
                      deltas_out: list | None = None) -> tuple[str, dict]:
    """vLLM's examples/online_serving/openai_realtime_client.py, step by step; `update`: more
    fields of its session.update (vLLM's `language`); `deltas_out`: gets every delta event."""
    import websockets

    async with websockets.connect(srv.ws + "/v1/realtime",
                                  additional_headers=headers or {"Authorization":
                                                                 f"Bearer {KEY}"}) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "model": model, **(update or {})}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))  # start
        b = pcm.tobytes()
        for i in range(0, len(b), chunk_bytes):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(b[i:i + chunk_bytes]).decode()}))
            if pace_s:
                await asyncio.sleep(pace_s)
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        deltas = []
        while True:
            ev = json.loads(await ws.recv())
            if ev["type"] == "transcription.delta":
                deltas.append(ev["delta"])
                if deltas_out is not None:
                    deltas_out.append(ev)
            elif ev["type"] == "transcription.done":
                return "".join(deltas), ev
            else:
                raise AssertionError(ev)


async def kyutai_talk(url: str, packets: list[bytes], n_audio: int, n_text: int,
                      headers=None, wait_s: float = 5.0) -> tuple[bytes, str]:
    """A Kyutai-protocol client: after the handshake byte, each Opus packet as an 0x01 message;
    then the server's audio bytes and text until there are `n_audio` and `n_text` of them, or
    nothing came for `wait_s` (the server sent less than expected)."""
    import websockets

    async with websockets.connect(url, additional_headers=headers or {}, max_size=None) as ws:
        assert await ws.recv() == b"\x00"
        for p in packets:
            await ws.send(b"\x01" + p)
        audio, text = b"", ""
        while len(audio) < n_audio or len(text) < n_text:
            try:
                m = await asyncio.wait_for(ws.recv(), wait_s)
            except asyncio.TimeoutError:
                break
            assert m[:1] in (b"\x01", b"\x02"), m
            if m[:1] == b"\x01":
                audio += m[1:]
            else:
                text += m[1:].decode()
        return audio, text
