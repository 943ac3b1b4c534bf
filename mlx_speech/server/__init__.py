"""mlx_speech.server: serve speech models over OpenAI's, vLLM's and Kyutai's protocols.

The command (`main`); its options and the app they build: server/options.py (`--help` prints
them); Ray Serve replicas (`--ray`): server/ray_serve.py; models loaded when used:
server/models.py. Docs: docs/server.md, docs/scaling.md.
"""

from __future__ import annotations

from ..cliutil import log, run_cli
from ..errors import MlxSpeechError, optional
from .options import app_from_args, bind, build_parser, load_server_vad, make_app


def serve(app, sock, engine, forwarded_allow_ips: list[str] | None = None) -> None:
    """Run uvicorn on the socket `bind` made, with the timeouts and the shutdown of
    `limits.make_server` (proxy headers only from `forwarded_allow_ips`)."""
    from .limits import make_server

    host, port = sock.getsockname()[:2]
    make_server(app, engine, host, port,
                forwarded_allow_ips=forwarded_allow_ips).run(sockets=[sock])


def _run(args) -> None:
    with optional("server", "the server"):  # all of it, before loading any model
        import fastapi  # noqa: F401
        import python_multipart  # noqa: F401  (FastAPI's form parser, for uploads)
        import sphn  # noqa: F401  (Opus)
        import uvicorn  # noqa: F401
        import websockets  # noqa: F401  (uvicorn's WebSocket protocol)
    from .security import resolve_api_key

    args.api_key = resolve_api_key(args.api_key, args.api_key_file)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        log(f"warning: listening on {args.host} without --api-key: anyone who can reach this "
            "address can use the models")
    if len(set(args.model)) != len(args.model):
        twice = next(m for m in args.model if args.model.count(m) > 1)
        raise MlxSpeechError(f"--model {twice} is given twice")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.allowed_host:
        log("note: clients that reach this server by a host name (not an IP address) need "
            "--allowed-host NAME (DNS rebinding defence)")
    if args.voices is not None:
        from pathlib import Path

        voices = Path(args.voices).expanduser()
        if not voices.is_dir():
            raise MlxSpeechError(f"--voices {args.voices}: "
                                 + ("not a folder" if voices.exists() else "no such folder"))
    if args.vad is not None and args.no_vad:
        raise MlxSpeechError("--vad and --no-vad contradict each other; give one")
    if args.ray:
        import os

        if not os.environ.get("RAY_ADDRESS"):  # a Ray instance of our own: on loopback
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before Ray loads
        from .ray_serve import run_ray  # a missing ray: one line naming the cluster extra

        return run_ray(args)
    sock = bind(args.host, args.port)  # bind first, load after, then serve on this socket
    try:
        port = sock.getsockname()[1]
        app, engine = app_from_args(args)
        shown = "localhost" if args.host in ("127.0.0.1", "::1", "0.0.0.0", "::") else args.host
        log(f"the page: http://{shown}:{port}/")
        try:
            ips = [i.strip() for i in (args.forwarded_allow_ips or "").split(",") if i.strip()]
            serve(app, sock, engine, ips)
        finally:
            engine.stop(timeout=5.0)
    finally:
        sock.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(_run, args)


__all__ = ["app_from_args", "bind", "build_parser", "load_server_vad", "main", "make_app",
           "serve"]
