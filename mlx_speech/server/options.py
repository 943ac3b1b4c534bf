"""mlx_speech.server: serve speech models over OpenAI's, vLLM's and Kyutai's protocols.

    mlx_speech.server --model mistralai/Voxtral-Mini-4B-Realtime-2602 [--model ...]
        [--host 127.0.0.1] [--port 8000] [--api-key KEY | --api-key-file PATH] [--quantize N]
        [--allowed-origin https://app.example] [--allowed-host speech.lan] [--voices DIR]
        [--max-sessions N] [--max-connections-per-ip N]
        [--preload] [--unload-after-s N] [--load-timeout-s N] [--ray [--replicas N]]

A page for trying every served model in a browser is at http://HOST:PORT/ .
Endpoints: GET /health, GET /v1/models, POST /v1/audio/transcriptions, POST
/v1/audio/speech, WS /v1/realtime (vLLM's dialect; OpenAI's with ?intent=transcription),
WS /api/chat (Kyutai's Moshi protocol). One engine thread runs every model step; live
transcription streams of one model are batched into shared steps.

Each model is checked at start (its kind, from its config files) and loaded when a request
first names it (--preload: all at start); --unload-after-s N frees a model no request or
session has used for N seconds, and the next request loads it again (docs/scaling.md).
--ray serves the same app as a Ray Serve deployment of --replicas N processes behind Ray's
proxy (the `cluster` extra; a cluster is started from a `serve run` config, docs/scaling.md).

Binds 127.0.0.1 unless told otherwise. --api-key (or --api-key-file, or the
MLX_SPEECH_API_KEY environment variable) is checked on HTTP and on WebSocket handshakes
(Authorization: Bearer KEY). Browser requests and WebSockets are accepted only from this
server's own page and --allowed-origin origins (default: loopback pages only), and only with
a Host that is an IP address, localhost or an --allowed-host name (DNS rebinding). Limits and
refusals: docs/server.md. Needs the `server` extra (fastapi, uvicorn, python-multipart,
websockets, sphn).
"""

from __future__ import annotations

from ..cliutil import ArgumentParser, add_window_args, log, ranged, window_kwargs
from ..errors import MlxSpeechError, optional


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="mlx_speech.server", description=__doc__)
    p.add_argument("--model", action="append", required=True,
                   help="hub repo id or local folder; repeat to serve several. Clients name a "
                        "model by exactly this string")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=ranged(int, 0, 65535), default=8000,
                   help="port to listen on (default 8000; 0: any free port, shown at start)")
    p.add_argument("--api-key", help="require this key (Authorization: Bearer KEY) on HTTP and "
                                     "WebSocket requests (also: --api-key-file, or the "
                                     "MLX_SPEECH_API_KEY environment variable, unseen by ps)")
    p.add_argument("--api-key-file", metavar="PATH", help="read the API key from this file")
    p.add_argument("--quantize", type=int, choices=(4, 8), help="quantize weights at load")
    add_window_args(p, ranged_by_argparse=True)  # every server flag: argparse checks it
    p.add_argument("--allowed-origin", action="append", default=[], type=origin,
                   help="browser Origin allowed for WebSockets and CORS (repeatable; default: "
                        "loopback pages only)")
    p.add_argument("--allowed-host", action="append", default=[],
                   help="a host name clients may use to reach the server (repeatable; IP "
                        "addresses and localhost always work; others are refused against DNS "
                        "rebinding)")
    p.add_argument("--voices", metavar="DIR",
                   help="a folder of voice files clients may name (by file name) on /api/chat")
    p.add_argument("--max-sessions", type=ranged(int, 1),
                   help="live realtime + chat sessions at once (default 64; with a "
                        "full-duplex model, the conversations whose KV caches fit in half the "
                        "memory left after the weights); past it a WebSocket is closed with 1013")
    p.add_argument("--max-connections-per-ip", type=ranged(int, 1), default=32,
                   help="concurrent requests and WebSockets from one address (default 32); "
                        "past it 503 / 1013")
    p.add_argument("--max-upload-mb", type=ranged(float, above=0), default=200.0,
                   help="largest request body in MB (default 200); larger is a 413")
    p.add_argument("--max-upload-s", type=ranged(float, above=0), default=10800.0,
                   help="most audio an upload may hold, in seconds (default 10800: 3 hours); "
                        "checked from the file's header before decoding, with its decoded "
                        "size (duration x rate x channels) at most that much 48 kHz stereo; "
                        "past it a 413")
    p.add_argument("--forwarded-allow-ips", metavar="IPS",
                   help="behind a proxy: the proxies' addresses (comma-separated, or *) whose "
                        "X-Forwarded-For names the client (default: none; the peer address is "
                        "the client, for --max-connections-per-ip)")
    p.add_argument("--max-buffer-s", type=ranged(float, above=0), default=60.0,
                   help="seconds of audio a live stream may queue before buffer_full")
    p.add_argument("--idle-timeout-s", type=ranged(float, above=0), default=300.0,
                   help="close a WebSocket after this long without client events")
    p.add_argument("--vad", metavar="PATH",
                   help="Silero VAD weights for server_vad / semantic_vad turn detection (a "
                        ".onnx or .safetensors file, folder or hub repo; default: Silero's "
                        "release model, shipped with mlx_speech)")
    p.add_argument("--no-vad", action="store_true",
                   help="no server-side turn detection (clients commit each turn)")
    p.add_argument("--diarizer", metavar="MODEL",
                   help="speaker diarization model (e.g. mlx-community/diar_streaming_"
                        "sortformer_4spk-v2.1-fp16): response_format=diarized_json and "
                        "diarize=true on verbose_json")
    p.add_argument("--preload", action="store_true",
                   help="load every model at start (default: each when a request first "
                        "names it)")
    p.add_argument("--unload-after-s", type=ranged(float, 0), metavar="N",
                   help="free a model no request or session has used for N seconds (its "
                        "weights and MLX's cache); the next request loads it again")
    p.add_argument("--load-timeout-s", type=ranged(float, above=0), default=300.0, metavar="N",
                   help="how long a request waits for its model to load before a 503 "
                        "(default 300)")
    p.add_argument("--ray", action="store_true",
                   help="serve through Ray Serve: --replicas processes behind Ray's proxy on "
                        "--host/--port (a local Ray instance, or the cluster RAY_ADDRESS "
                        "names; needs the `cluster` extra)")
    p.add_argument("--replicas", type=ranged(int, 1), default=1, metavar="N",
                   help="with --ray: server replicas (each its own process, engine and models)")
    p.add_argument("--no-batch", action="store_true",
                   help="debug/benchmark: step live streams one at a time")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    return p


def origin(text: str) -> str:
    """--allowed-origin: what a browser sends as Origin (scheme://host[:port], nothing after),
    else it could never match."""
    import argparse
    from urllib.parse import urlsplit

    u = urlsplit(text)
    if u.scheme not in ("http", "https") or not u.netloc or u.path or u.query or u.fragment:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a browser origin: scheme://host[:port], e.g. https://app.example "
            "(no path, no trailing slash)")
    return text


def bind(host: str, port: int):
    """The listening socket, bound before any model loads: a port in use is one error line
    now, not after minutes of loading."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn binds
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except socket.gaierror as e:
        sock.close()
        raise MlxSpeechError(f"cannot listen on {host}: {e.strerror}") from None
    except OSError as e:
        sock.close()
        import errno

        if e.errno == errno.EADDRINUSE:
            raise MlxSpeechError(f"cannot listen on {host}:{port}: the port is in use (another "
                                 "server running? choose another with --port)") from None
        raise MlxSpeechError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def load_server_vad(path: str | None):
    """The VAD for turn detection: `path`, else Silero's release model shipped with mlx_speech
    (should that be missing, the server runs with client commits only, and says so)."""
    from ..errors import CheckpointError
    from ..models.silero_vad import load_vad

    try:
        return load_vad(path)
    except CheckpointError as e:
        if path is not None:
            raise
        log(f"note: no server-side turn detection (server_vad / semantic_vad): {e}")
        return None


def make_app(models, *, api_key: str | None = None,
             allowed_origins: list[str] | None = None, max_upload_bytes: int = 200 << 20,
             max_buffer_s: float = 60.0, idle_timeout_s: float = 300.0, batch: bool = True,
             vad=None, diarizer=None, host: str = "127.0.0.1",
             allowed_hosts: list[str] | None = None, voices_dir: str | None = None,
             max_sessions: int | None = None, max_per_ip: int = 32,
             max_upload_s: float = 10800.0):
    """(app, engine): the ASGI app over started engine (stop it with `engine.stop()`).

    `models`: {id: loaded model}, or a `server.models.Models` store (models loaded when
    used, freed when idle: `Models.locate(ids, unload_after_s=...)`).
    `vad`: a loaded Silero VAD (`mlx_speech.models.silero_vad.load_vad()`) for OpenAI's
    server_vad / semantic_vad turn detection; None: clients must commit each turn.
    `diarizer`: a loaded diarizer (`mlx_speech.diarize.load_diarizer()`) for speaker labels."""
    with optional("server", "the server"):
        from .app import create_app
    from .common import Served
    from .engine import Engine
    from .models import Models

    store = models if isinstance(models, Models) else Models.loaded(models)
    engine = Engine(batch=batch, max_buffer_s=max_buffer_s)
    store.attach(engine)
    engine.start()
    served = Served(store, engine, api_key, list(allowed_origins or []), max_upload_bytes,
                    idle_timeout_s, vad=vad, diarizer=diarizer, bind_host=host,
                    allowed_hosts=list(allowed_hosts or []), voices_dir=voices_dir,
                    max_sessions=max_sessions, max_per_ip=max_per_ip, max_upload_s=max_upload_s)
    return create_app(served), engine


def app_from_args(args):
    """(app, engine) as the command line asks: the models checked from their config files
    (kind, options) and, with --preload, loaded; the VAD and the diarizer loaded. A Ray
    replica builds its own the same way."""
    from .models import Models

    # the small models first: a bad --vad or --diarizer is found before the big ones are
    # checked (a hub repo's files downloaded) or loaded
    vad = None if args.no_vad else load_server_vad(args.vad)
    diarizer = None
    if args.diarizer:
        from ..diarize import load_diarizer

        log(f"loading {args.diarizer}")
        diarizer = load_diarizer(args.diarizer)
    load_kwargs = {**({"quantize": args.quantize} if args.quantize else {}),
                   **window_kwargs(args)}
    store = Models.locate(args.model, log_line=log, load_kwargs=load_kwargs,
                          unload_after_s=args.unload_after_s,
                          load_timeout_s=args.load_timeout_s)
    if args.preload:
        store.preload()
    return make_app(store, api_key=args.api_key, allowed_origins=args.allowed_origin,
                    max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
                    max_buffer_s=args.max_buffer_s, idle_timeout_s=args.idle_timeout_s,
                    batch=not args.no_batch, vad=vad, diarizer=diarizer, host=args.host,
                    allowed_hosts=args.allowed_host, voices_dir=args.voices,
                    max_sessions=args.max_sessions, max_per_ip=args.max_connections_per_ip,
                    max_upload_s=args.max_upload_s)
