"""Shared by the server tests (tests/test_server*.py, tests/test_web.py, tests/test_readme.py)
and docs/web/screenshots.py: the server on a loopback port in a thread, and the audio a client
sends."""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import time

import numpy as np
import soundfile as sf

from mlx_speech.server import make_app

DEADLINE_S = 60.0  # bound on every wait for the server (never hit when things work)


class ServerThread:
    """uvicorn in a thread on a free loopback port; always shut down."""

    def __init__(self, models, **kw):
        import uvicorn

        self.app, self.engine = make_app(models, **kw)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

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

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


def wav_bytes(x: np.ndarray, sr: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, subtype="FLOAT", format="WAV")
    return buf.getvalue()


def pcm16(x: np.ndarray) -> np.ndarray:
    """What a pcm16 client sends (and what the server decodes, / 32768)."""
    return np.round(np.clip(x, -1, 1) * 32767).astype("<i2")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))
