"""Limits with polite refusals, work that stops with its client, and a shutdown that exits.

- `Limits`: concurrent sessions (realtime, chat and speech-stream WebSockets) and connections
  per client IP. Past a limit a WebSocket is accepted and closed with 1013 (try again later)
  and a reason, an HTTP request answered 503 with `Retry-After`.
- `HeaderTimeoutH11`: uvicorn's h11 protocol with a deadline on each request's headers (a
  client that sends them a byte at a time is cut; uvicorn itself waits forever).
- `while_connected`: a non-streamed request's wait, cancelled when its client leaves.
- `Server`: uvicorn's server that, on SIGTERM/SIGINT, answers every pending request at once
  with a 503 JSON error (`server_shutdown`, whatever the engine is doing), fails every engine
  job, closes WebSockets with a close frame (1012) and exits within its grace period
  (GRACEFUL_S). Proxy headers (X-Forwarded-For) are read only from `--forwarded-allow-ips`
  peers; by default the peer address is the client (the per-IP limit counts it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os

log = logging.getLogger("mlx_speech.server")

SESSION_PATHS = ("/v1/realtime", "/api/chat", "/v1/audio/speech/stream")
RETRY_AFTER_S = 5
DEFAULT_MAX_PER_IP = 32
HEADER_TIMEOUT_S = 10.0
BODY_IDLE_S = 30.0  # a request body that stalls this long is given up (as a disconnect)
MAX_BACKLOG = 250  # engine events (80 ms frames: 20 s) queued for a client that does not read
KEEP_ALIVE_S = 5.0
GRACEFUL_S = 3.0
TRY_AGAIN_LATER = 1013


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def duplex_session_bytes(model) -> int:
    """A conversation's memory: its LM's KV cache (keys and values of every layer over the
    whole context, 16-bit), plus ~64 MB of Mimi state and buffers."""
    c = model.config
    return 2 * c.num_layers * (c.context or 3000) * c.dim * 2 + (64 << 20)


def default_max_sessions(models: dict) -> int:
    """64 live sessions (transcription sessions are small, a streaming encoder's cache, and
    batched into shared steps); with a full-duplex model, as many conversations as half the
    machine's memory holds after the weights (each has its own KV cache: ~1.6 GB for a 7B
    Moshi at its 3000-step context), between 1 and 64."""
    try:
        budgets = [(m.kind, m.weight_bytes(), duplex_session_bytes(m) if m.kind == "duplex"
                    else 0) for m in models.values()]
    except Exception:  # a model without the expected config: a fixed guess
        return 8
    return session_budget(budgets)


def session_budget(budgets: list[tuple]) -> int:
    """`default_max_sessions` from (kind, weight bytes, bytes per duplex session) of each
    model (a server that loads models when used knows those of the models loaded so far)."""
    per = [b for kind, _, b in budgets if kind == "duplex"]
    if not per:
        return 64
    ram = _physical_memory()
    if ram is None:
        return 8
    weights = sum(w for _, w, _ in budgets)
    return int(min(64, max(1, (ram // 2 - weights) // max(per))))


def _client_ip(scope) -> str:
    c = scope.get("client")
    return c[0] if c else "?"


async def refuse_ws(scope, receive, send, code: int, reason: str) -> None:
    """Accept, then close with `code` and `reason` (a close before accepting is a bare 403
    that says nothing to the client). The subprotocol is answered as the route would."""
    from .common import KEY_SUBPROTOCOL

    msg = await receive()
    if msg["type"] != "websocket.connect":
        return
    offered = [p for p in scope.get("subprotocols") or [] if not p.startswith(KEY_SUBPROTOCOL)]
    await send({"type": "websocket.accept", "subprotocol": offered[0] if offered else None})
    await send({"type": "websocket.close", "code": code, "reason": reason[:120]})


async def send_json(send, status: int, body: dict, headers=()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data})


def _busy(message: str, code: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": code}}


SHUTDOWN = "the server is shutting down; try again later"


class Shutdown:
    """The server's shutdown, seen by every request: `begin()` (on the event loop) wakes
    whatever waits in `wait()`."""

    def __init__(self):
        self._event: asyncio.Event | None = None

    def _get(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def begin(self) -> None:
        self._get().set()

    @property
    def begun(self) -> bool:
        return self._event is not None and self._event.is_set()

    async def wait(self) -> None:
        await self._get().wait()


class Limits:
    """Pure ASGI middleware: live sessions and per-IP connections, counted while they run;
    and the shutdown of HTTP requests: once `shutdown` begins, a request still pending is
    answered 503 `server_shutdown` at once (one already streaming is ended)."""

    def __init__(self, app, max_sessions, max_per_ip: int, shutdown: Shutdown | None = None):
        self.app = app  # max_sessions: an int, or a function giving it now
        self.max_sessions, self.max_per_ip = max_sessions, max_per_ip
        self.sessions = 0
        self.per_ip: collections.Counter = collections.Counter()
        self.shutdown = shutdown or Shutdown()

    def session_limit(self) -> int:
        m = self.max_sessions
        return m() if callable(m) else m

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope["path"] == "/health":
            return await self.app(scope, receive, send)
        ip = _client_ip(scope)
        ws = scope["type"] == "websocket"
        session = ws and scope["path"] in SESSION_PATHS
        why = None
        if self.per_ip[ip] >= self.max_per_ip:
            why = (f"too many connections from this address (limit {self.max_per_ip}); "
                   "try again later", "too_many_connections")
        elif session and self.sessions >= (limit := self.session_limit()):
            why = (f"the server is at its limit of {limit} live sessions; try "
                   "again later", "server_busy")
        if why is not None:
            if ws:
                return await refuse_ws(scope, receive, send, TRY_AGAIN_LATER, why[0])
            return await send_json(send, 503, _busy(*why),
                                   [(b"retry-after", str(RETRY_AFTER_S).encode())])
        self.per_ip[ip] += 1
        self.sessions += session
        try:
            if ws:
                await self.app(scope, receive, send)
            else:
                await self._until_shutdown(scope, _body_deadline(receive), send)
        finally:
            self.sessions -= session
            self.per_ip[ip] -= 1
            if self.per_ip[ip] <= 0:
                del self.per_ip[ip]

    async def _until_shutdown(self, scope, receive, send) -> None:
        """The request, unless the server shuts down first: then it is cancelled and answered
        503 `server_shutdown` (or its streamed body ended)."""
        started = False

        async def tracked(msg):
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        if self.shutdown.begun:
            return await send_json(send, 503, _busy(SHUTDOWN, "server_shutdown"))
        task = asyncio.ensure_future(self.app(scope, receive, tracked))
        stop = asyncio.ensure_future(self.shutdown.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if not task.cancelled():
            return task.result()
        with contextlib.suppress(Exception):  # the client may be gone already
            if not started:
                await send_json(send, 503, _busy(SHUTDOWN, "server_shutdown"))
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


def _body_deadline(receive):
    """`receive` that gives up on a request body stalled for BODY_IDLE_S (a slow-body
    sender holds a connection slot no longer); after the body, it waits as before."""
    done = False

    async def timed():
        nonlocal done
        if done:
            return await receive()
        try:
            msg = await asyncio.wait_for(receive(), BODY_IDLE_S)
        except asyncio.TimeoutError:
            done = True
            return {"type": "http.disconnect"}
        if msg["type"] != "http.request" or not msg.get("more_body", False):
            done = True
        return msg

    return timed


async def while_connected(request, coro):
    """Await `coro` unless the client disconnects first; then cancel it and return None
    (the caller's `finally` frees the engine job at once)."""
    task = asyncio.ensure_future(coro)

    async def gone():
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watch = asyncio.ensure_future(gone())
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watch.cancel()
    if task in done:
        return task.result()
    with contextlib.suppress(BaseException):
        await task
    return None


def header_timeout_protocol(timeout_s: float = HEADER_TIMEOUT_S):
    """uvicorn's H11Protocol with a deadline on request headers, from the connection's
    start and again after each response (keep-alive): a slow-header sender is cut."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutH11(H11Protocol):
        _deadline = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # the headers are in: the request runs

        def handle_websocket_upgrade(self, event) -> None:
            self._disarm()  # the WebSocket protocol takes the connection over
            super().handle_websocket_upgrade(event)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

    return HeaderTimeoutH11


def make_server(app, engine, host: str, port: int, *, header_timeout_s: float = HEADER_TIMEOUT_S,
                keep_alive_s: float = KEEP_ALIVE_S, log_level: str = "info",
                forwarded_allow_ips: list[str] | None = None):
    """A uvicorn Server whose first SIGTERM/SIGINT answers pending requests 503 JSON and fails
    every engine job at once (sockets close with 1012), and that stops waiting for what
    remains after `GRACEFUL_S` seconds. `forwarded_allow_ips`: the proxies whose
    X-Forwarded-For / X-Forwarded-Proto are believed (None: none; the peer is the client)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            http=header_timeout_protocol(header_timeout_s),
                            timeout_keep_alive=keep_alive_s,
                            timeout_graceful_shutdown=GRACEFUL_S,
                            h11_max_incomplete_event_size=64 * 1024,
                            proxy_headers=bool(forwarded_allow_ips),
                            forwarded_allow_ips=list(forwarded_allow_ips or []) or None)

    # a refused WebSocket handshake is answered with an HTTP response (ASGI's denial
    # extension), which uvicorn's websockets protocol then logs as an app error: not one
    logging.getLogger("uvicorn.error").addFilter(
        lambda r: r.getMessage() != "ASGI callable returned without completing handshake.")

    stopping = app.state.shutdown  # the app's (server/app.py: create_app)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # a signal handler: no locks taken
            engine.cancel_all("the server is shutting down")
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None) -> None:  # on the event loop
            stopping.begin()  # every pending request answers now, whatever the engine does
            engine.cancel_all("the server is shutting down")
            await super().shutdown(sockets)

    return Server(config)
