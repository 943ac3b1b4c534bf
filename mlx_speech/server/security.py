"""Browser-facing defences that hold without an API key, the key's sources, and voices.

- `Defences` (pure ASGI middleware, outermost): refuses a `Host` that is not an IP address,
  localhost, the bind name or an `--allowed-host` (DNS rebinding: a page on evil.example whose
  name was re-pointed at 127.0.0.1 sends `Host: evil.example`); refuses HTTP requests whose
  `Origin` is neither this server's own nor allowed (a page elsewhere may not POST speech or
  uploads here); refuses JSON routes' bodies that are not `application/json` (a cross-site
  `text/plain` POST needs no CORS preflight).
- `resolve_api_key`: --api-key, --api-key-file or the MLX_SPEECH_API_KEY environment variable
  (argv is visible to every user in `ps`).
- `resolve_voice`: a client's voice name to one of the model's voices or a file under the
  operator's `--voices DIR`; never a path from the client.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

from .validate import Invalid

JSON_ROUTES = ("/v1/audio/speech",)
VOICE_SUFFIXES = (".safetensors", ".pt", ".wav", ".flac", ".ogg", ".mp3")
NOT_A_VOICE = "not a voice of this model"


def _hostname(host: str) -> str | None:
    """The name in a Host header ("name", "name:port", "[v6]:port"), lowercased; None when
    it does not parse."""
    try:
        u = urlsplit("//" + host)
        name = u.hostname
        u.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        return None
    return name.lower().rstrip(".") if name else None


def host_ok(host: str, allowed: tuple[str, ...]) -> bool:
    """An IP literal, localhost (or *.localhost) or an allowed name."""
    name = _hostname(host)
    if not name:
        return False
    if name == "localhost" or name.endswith(".localhost") or name in allowed:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _loopback_origin(u) -> bool:
    return u.hostname in ("localhost", "127.0.0.1", "::1")


def own_page(origin: str, host: str, allowed_hosts: tuple[str, ...] = ()) -> bool:
    """A page this server served: its origin is the request's own host and port, reached by
    IP, localhost or an --allowed-host name (any other name could be DNS-rebound to us)."""
    try:
        u = urlsplit(origin)
        name = (u.hostname or "").lower()
        if name != "localhost" and name not in allowed_hosts:
            ipaddress.ip_address(name)
    except ValueError:
        return False
    return u.scheme in ("http", "https") and u.netloc.lower() == host.lower()


def origin_ok(origin: str, host: str, allowed_origins: list[str],
              allowed_hosts: tuple[str, ...] = ()) -> bool:
    """The server's own page, an --allowed-origin, or (with none configured) a loopback
    page."""
    if own_page(origin, host, allowed_hosts):
        return True
    if allowed_origins:
        return origin in allowed_origins
    try:
        u = urlsplit(origin)
        return u.scheme in ("http", "https") and _loopback_origin(u)
    except ValueError:
        return False


def _error(message: str, code: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}


class Defences:
    def __init__(self, app, served):
        self.app, self.served = app, served
        bind = _hostname(served.bind_host or "") or ""
        self.hosts = tuple(h.lower().rstrip(".") for h in [*served.allowed_hosts, bind] if h)

    async def __call__(self, scope, receive, send):
        from .limits import send_json

        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if not host_ok(host, self.hosts):
            msg = (f"Host {host[:80]!r} is not served here (DNS rebinding defence); the "
                   "operator can allow a name with --allowed-host")
            if scope["type"] == "websocket":
                return await deny_ws(scope, receive, send, msg, "host_not_allowed")
            return await send_json(send, 421, _error(msg, "host_not_allowed"))
        if scope["type"] == "http":
            origin = headers.get("origin")
            if origin is not None and not origin_ok(origin, host, self.served.allowed_origins,
                                                    self.hosts):
                return await send_json(send, 403, _error(
                    f"Origin {origin[:80]!r} is not allowed (start the server with "
                    "--allowed-origin for a page elsewhere)", "origin_not_allowed"))
            if scope["method"] == "POST" and scope["path"] in JSON_ROUTES:
                ctype = headers.get("content-type", "").split(";")[0].strip().lower()
                if ctype != "application/json" and not ctype.endswith("+json"):
                    return await send_json(send, 415, _error(
                        f"the body must be JSON (Content-Type: application/json), got "
                        f"{ctype[:60] or 'none'!r}", "unsupported_media_type"))
        return await self.app(scope, receive, send)


async def deny_ws(scope, receive, send, message: str, code: str, status: int = 403) -> None:
    """Refuse a WebSocket handshake with an HTTP answer whose JSON body says why (ASGI's
    denial-response extension, which uvicorn has); else a plain close carrying the reason."""
    import json

    msg = await receive()
    if msg["type"] != "websocket.connect":
        return
    if "websocket.http.response" in (scope.get("extensions") or {}):
        body = json.dumps(_error(message, code)).encode()
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})


def resolve_api_key(api_key: str | None, api_key_file: str | None) -> str | None:
    """--api-key, else the first line of --api-key-file, else $MLX_SPEECH_API_KEY."""
    from ..errors import MlxSpeechError

    if api_key and api_key_file:
        raise MlxSpeechError("give --api-key or --api-key-file, not both")
    if api_key_file:
        try:
            key = Path(api_key_file).expanduser().read_text().strip().splitlines()
        except OSError as e:
            raise MlxSpeechError(f"cannot read --api-key-file {api_key_file}: "
                                 f"{e.strerror}") from None
        if not key or not key[0].strip():
            raise MlxSpeechError(f"--api-key-file {api_key_file} is empty")
        return key[0].strip()
    return api_key or os.environ.get("MLX_SPEECH_API_KEY") or None


def resolve_voice(model, voice: str, voices_dir: str | None) -> str | Path:
    """A client's voice: one of `model.voices` (a trailing .pt is dropped, as Kyutai's clients
    send file names), else a file directly under `voices_dir` named `voice` (with or without
    its suffix). Anything else, whatever exists on disk, is `Invalid("voice", NOT_A_VOICE)`."""
    name = voice.removesuffix(".pt")
    if name in model.voices:
        return name
    if voice in model.voices:
        return voice
    if voices_dir and voice and "/" not in voice and "\\" not in voice \
            and not voice.startswith(".") and "\x00" not in voice:
        root = Path(voices_dir).resolve()
        names = [voice] if voice.endswith(VOICE_SUFFIXES) else [voice + s
                                                                 for s in VOICE_SUFFIXES]
        for n in names:
            p = (root / n).resolve()
            if p.parent == root and p.is_file():
                return p
    known = ", ".join(model.voices) or "none"
    raise Invalid("voice", f"{NOT_A_VOICE} (voices: {known})")
