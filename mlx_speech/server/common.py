"""What the endpoints share: served models, the bridge from engine events to asyncio,
streamed-text bookkeeping. No FastAPI here."""

from __future__ import annotations

import asyncio
import codecs
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
    max_upload_s: float = 10800.0  # seconds of audio an upload may hold (server/uploads.py)

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


class TokenDeltas:
    """Deltas cut at token boundaries, each carrying exactly the logprobs of its own text (for
    clients that asked for logprobs): a token's text is what its bytes add to the transcript
    (a character split over tokens belongs to the token that completes it); the transcript's
    leading whitespace belongs to no token (an item's first token is shown without the space
    its text does not have, in `token` and `bytes` alike), and a token whose text ends in
    whitespace waits until text follows it. So each delta's tokens join to its text, the
    deltas join to the transcript, and a delta with no text carries no logprobs."""

    def __init__(self, tokenizer):
        self.tk = tokenizer
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.started = False  # some text was seen (leading whitespace is gone)
        self.held: list[list] = []  # [text, bytes, logprob] of tokens not sent yet
        self.sent = ""

    def _take(self, pairs) -> None:
        for tok, lp in pairs:
            b = b"" if self.tk.is_special(tok) else self.tk.token_bytes(tok)
            if not b:  # markup (pads, word markers, language tags): no text, not listed
                continue
            text = self.utf8.decode(b)
            if not self.started:
                shown = text.lstrip()
                cut = text[: len(text) - len(shown)].encode()
                b = b[len(cut):] if b.startswith(cut) else b
                text, self.started = shown, bool(shown)
            self.held.append([text, b, float(lp)])

    def _release(self, n: int) -> tuple[str, list[dict]]:
        out, self.held = self.held[:n], self.held[n:]
        text = "".join(e[0] for e in out)
        if not text:
            return "", []
        self.sent += text
        return text, [{"token": t, "logprob": lp, "bytes": list(b)} for t, b, lp in out]

    def add(self, pairs) -> tuple[str, list[dict]]:
        """The next delta's text and logprob entries, given the (id, logprob) pairs decoded
        since the last call; ("", []) while nothing can be sent yet."""
        self._take(pairs)
        for n in range(len(self.held), 0, -1):
            text = self.held[n - 1][0]
            if text and not text[-1].isspace():
                return self._release(n)
        return "", []

    def final(self, transcript: str) -> tuple[str, list[dict]]:
        """The last delta: the tokens still held, without the trailing whitespace the
        `transcript` does not have. Should the tokens not spell the transcript (a tokenizer
        whose text is not its tokens' bytes), the rest of the text comes without logprobs."""
        if self.held:
            self.held[-1][0] += self.utf8.decode(b"", final=True)
        rest = transcript[len(self.sent):] if transcript.startswith(self.sent) else None
        joined = "".join(e[0] for e in self.held)
        extra = joined[len(rest):] if rest is not None and joined.startswith(rest) else None
        if extra is None or extra.strip():
            self.held = []
            if rest:
                self.sent += rest
            return rest or "", []
        for e in reversed(self.held):  # drop the trailing whitespace, token by token
            if not extra:
                break
            keep = e[0][: max(0, len(e[0]) - len(extra))]
            gone = e[0][len(keep):]
            e[1] = e[1][: len(e[1]) - len(gone.encode())] if e[1].endswith(gone.encode()) \
                else e[1]
            e[0], extra = keep, extra[: len(extra) - len(gone)]
        return self._release(len(self.held))


class ItemDeltas:
    """An item's deltas from its engine events: cut at token boundaries with their logprobs
    (`TokenDeltas`) when its session keeps logprobs (its events carry the tokens), else text
    deltas (`TextDeltas`). `add(event)` and `final(transcript)` give (text, entries)."""

    def __init__(self, tokenizer):
        self.tk = tokenizer
        self.text = TextDeltas()
        self.tokens: TokenDeltas | None = None

    def add(self, ev) -> tuple[str, list[dict]]:
        """An engine ("delta", text[, pairs]) event."""
        if len(ev) > 2:
            if self.tokens is None:
                self.tokens = TokenDeltas(self.tk)
            return self.tokens.add(ev[2])
        if self.tokens is not None:  # the tokens carry the text
            return "", []
        return self.text.add(ev[1]), []

    def final(self, transcript: str) -> tuple[str, list[dict]]:
        if self.tokens is not None:
            return self.tokens.final(transcript)
        return self.text.final(transcript), []


def token_entries(tokenizer, pairs, transcript: str) -> list[dict]:
    """A whole transcript's logprob entries, as `TokenDeltas` cuts them: joined, their tokens
    are the transcript (completed items, REST `include[]=logprobs`)."""
    d = TokenDeltas(tokenizer)
    _, first = d.add(pairs)
    _, last = d.final(transcript)
    return first + last


def pcm16_bytes(x: np.ndarray) -> bytes:
    """float32 [-1, 1] -> 16-bit little-endian PCM bytes (x 32767, rounded)."""
    return np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def usage(result, seconds: float) -> dict:
    n_out = len(result.token_ids)
    n_in = int(round(seconds / 0.08))
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
