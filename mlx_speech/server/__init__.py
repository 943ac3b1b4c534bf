"""mlx_speech.server: serve speech models over OpenAI's, vLLM's and Kyutai's protocols.

    mlx_speech.server --model mistralai/Voxtral-Mini-4B-Realtime-2602 [--model ...]
        [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--quantize N]
        [--allowed-origin https://app.example]

A page for trying every served model in a browser is at http://HOST:PORT/ .
Endpoints: GET /health, GET /v1/models, POST /v1/audio/transcriptions, POST
/v1/audio/speech, WS /v1/realtime (vLLM's dialect; OpenAI's with ?intent=transcription),
WS /api/chat (Kyutai's Moshi protocol). One engine thread runs every model step; live
transcription streams of one model are batched into shared steps.

Binds 127.0.0.1 unless told otherwise. --api-key is checked on HTTP and on WebSocket
handshakes (Authorization: Bearer KEY). Browser WebSockets are accepted only from
--allowed-origin origins (default: loopback pages only). Needs the `server` extra
(fastapi, uvicorn, python-multipart, websockets, sphn).
"""

from __future__ import annotations

import argparse

from ..cliutil import add_window_args, log, run_cli, window_kwargs
from ..errors import MlxSpeechError, optional


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlx_speech.server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True,
                   help="hub repo id or local folder; repeat to serve several. Clients name a "
                        "model by exactly this string")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="require this key (Authorization: Bearer KEY) on HTTP and "
                                     "WebSocket requests")
    p.add_argument("--quantize", type=int, choices=(4, 8), help="quantize weights at load")
    add_window_args(p)
    p.add_argument("--allowed-origin", action="append", default=[],
                   help="browser Origin allowed for WebSockets and CORS (repeatable; default: "
                        "loopback pages only)")
    p.add_argument("--max-upload-mb", type=float, default=200.0,
                   help="largest request body in MB (default 200); larger is a 413")
    p.add_argument("--max-buffer-s", type=float, default=60.0,
                   help="seconds of audio a live stream may queue before buffer_full")
    p.add_argument("--idle-timeout-s", type=float, default=300.0,
                   help="close a WebSocket after this long without client events")
    p.add_argument("--vad", metavar="PATH",
                   help="Silero VAD weights for server_vad / semantic_vad turn detection (a "
                        ".safetensors file, folder or hub repo; default: the installed "
                        "silero-vad wheel's, when there is one)")
    p.add_argument("--no-vad", action="store_true",
                   help="no server-side turn detection (clients commit each turn)")
    p.add_argument("--no-batch", action="store_true",
                   help="debug/benchmark: step live streams one at a time")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    return p


def load_models(ids: list[str], quantize: int | None = None, **load_kwargs) -> dict[str, object]:
    import mlx_speech

    from .common import model_kind

    models = {}
    for m in ids:
        if m in models:
            raise MlxSpeechError(f"--model {m} is given twice")
        log(f"loading {m}")
        model = mlx_speech.load(m, **({"quantize": quantize} if quantize else {}), **load_kwargs)
        try:
            model_kind(model)
        except ValueError as e:
            raise MlxSpeechError(f"{m}: {e}") from None
        models[m] = model
    return models


def load_server_vad(path: str | None):
    """The VAD for turn detection: `path`, else the silero-vad wheel's weights when installed
    (without them the server runs with client commits only, and says so)."""
    from ..errors import CheckpointError
    from ..models.silero_vad import load_vad

    try:
        return load_vad(path)
    except CheckpointError as e:
        if path is not None:
            raise
        log(f"note: no server-side turn detection (server_vad / semantic_vad): {e}")
        return None


def make_app(models: dict[str, object], *, api_key: str | None = None,
             allowed_origins: list[str] | None = None, max_upload_bytes: int = 200 << 20,
             max_buffer_s: float = 60.0, idle_timeout_s: float = 300.0, batch: bool = True,
             vad=None):
    """(app, engine): the ASGI app over started engine (stop it with `engine.stop()`).

    `vad`: a loaded Silero VAD (`mlx_speech.models.silero_vad.load_vad()`) for OpenAI's
    server_vad / semantic_vad turn detection; None: clients must commit each turn."""
    with optional("server", "the server"):
        from .app import create_app
    from .common import Served
    from .engine import Engine

    engine = Engine(batch=batch, max_buffer_s=max_buffer_s).start()
    served = Served(models, engine, api_key, list(allowed_origins or []), max_upload_bytes,
                    idle_timeout_s, vad=vad)
    return create_app(served), engine


def _run(args) -> None:
    with optional("server", "the server"):  # all of it, before loading any model
        import fastapi  # noqa: F401
        import python_multipart  # noqa: F401  (FastAPI's form parser, for uploads)
        import sphn  # noqa: F401  (Opus)
        import uvicorn
        import websockets  # noqa: F401  (uvicorn's WebSocket protocol)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        log(f"warning: listening on {args.host} without --api-key: anyone who can reach this "
            "address can use the models")
    models = load_models(args.model, args.quantize, **window_kwargs(args))
    vad = None if args.no_vad else load_server_vad(args.vad)
    app, engine = make_app(models, api_key=args.api_key, allowed_origins=args.allowed_origin,
                           max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
                           max_buffer_s=args.max_buffer_s, idle_timeout_s=args.idle_timeout_s,
                           batch=not args.no_batch, vad=vad)
    shown = "localhost" if args.host in ("127.0.0.1", "::1", "0.0.0.0", "::") else args.host
    log(f"the page: http://{shown}:{args.port}/")
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(_run, args)


__all__ = ["build_parser", "load_models", "load_server_vad", "main", "make_app"]
