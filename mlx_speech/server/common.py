"""What the endpoints share: served models, the bridge from engine events to asyncio,
streamed-text bookkeeping. No FastAPI here."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from .engine import Engine

KINDS = {"asr": "speech-to-text", "tts": "text-to-speech", "duplex": "full-duplex"}


def model_kind(model) -> str:
    """The model's `kind` (the model contract), when it is one the server serves."""
    kind = model.kind
    if kind not in KINDS:
        raise ValueError(f"cannot serve a {type(model).__name__} (kind {kind!r})")
    return kind


class ModelNotFound(Exception):
    def __init__(self, message: str, code: str = "model_not_found"):
        super().__init__(message)
        self.code = code


@dataclass
class Served:
    """The models (a `server.models.Models` store, by the id given to --model), the engine
    and the limits."""

    models: object  # server.models.Models
    engine: Engine
    api_key: str | None = None
    allowed_origins: list[str] = field(default_factory=list)
    max_upload_bytes: int = 200 * 1024 * 1024
    idle_timeout_s: float = 300.0
    created: int = 0
    vad: object | None = None  # a loaded Silero VAD: server_vad / semantic_vad turn detection
    diarizer: object | None = None  # a loaded diarizer (--diarizer): speakers in transcripts
    # hostile-input defences (server/security.py, server/limits.py)
    bind_host: str = "127.0.0.1"
    allowed_hosts: list[str] = field(default_factory=list)
    voices_dir: str | None = None
    max_sessions: int | None = None  # None: limits.default_max_sessions of the models
    max_per_ip: int = 32

    def kind(self, model_id: str) -> str:
        return self.models.kind(model_id)

    def details(self, model_id: str) -> dict:
        """What a client needs beyond the kind: whether it is loaded; once it has been, the
        sample rate, the voices (TTS, PersonaPlex), whether a duplex model takes voice and
        role prompts (`roles`: PersonaPlex), the
        languages a speech-to-text model takes (`languages`, when it takes any)."""
        out = self.models.details(model_id)
        if self.kind(model_id) == "asr" and self.diarizer is not None:
            out["diarize"] = True  # the server can label speakers (--diarizer)
        return out

    def pick(self, name: str | None, kind: str) -> str:
        """The id of the served model called `name` (None: the only one of `kind`); loads
        nothing. ModelNotFound says what is served."""
        return self.models.pick(name, kind)

    async def acquire(self, name: str | None, kind: str, loading=None):
        """A `Lease` on the served model called `name` (None: the only one of `kind`),
        loaded first when it is not (`loading(entry)` hears of that before the wait); raises
        ModelNotFound, or ModelUnavailable (server/models.py) when it cannot be loaded in
        time. Release the lease when the request or session is done (a job submitted with
        the model keeps it loaded by itself)."""
        return await self.models.acquire(self.pick(name, kind), loading)


KEY_SUBPROTOCOL = "openai-insecure-api-key."


def answer_subprotocol(ws) -> str | None:
    """The subprotocol a WebSocket handshake must name back: browsers fail a handshake whose
    answer names none of the subprotocols they offered (and browsers can only send the API key
    as one). The first offered one that is not the key, else none."""
    offered = list(ws.scope.get("subprotocols") or [])
    for p in offered:
        if not p.startswith(KEY_SUBPROTOCOL):
            return p
    return None  # never echo the key (it would sit in every proxy's response log)


class AsyncSink:
    """Engine events into an asyncio.Queue, from any thread; events tagged with `tag`."""

    def __init__(self, queue: asyncio.Queue, loop: asyncio.AbstractEventLoop, tag=None):
        self.queue, self.loop, self.tag = queue, loop, tag

    def __call__(self, event) -> None:
        item = event if self.tag is None else (self.tag, event)
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class TextDeltas:
    """Deltas whose concatenation is exactly the final transcript: leading whitespace is
    dropped and trailing whitespace held back until more text follows it."""

    def __init__(self):
        self.raw = ""
        self.sent = ""

    def add(self, text: str) -> str:
        self.raw += text
        visible = self.raw.strip()
        if not visible.startswith(self.sent):
            return ""
        delta = visible[len(self.sent):]
        self.sent = visible
        return delta

    def final(self, text: str) -> str:
        """The last delta, given the final transcript."""
        delta = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent += delta
        return delta


def pcm16_bytes(x: np.ndarray) -> bytes:
    """float32 [-1, 1] -> 16-bit little-endian PCM bytes (x 32767, rounded)."""
    return np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def usage(result, seconds: float) -> dict:
    n_out = len(result.token_ids)
    n_in = int(round(seconds / 0.08))
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
