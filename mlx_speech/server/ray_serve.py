"""Ray Serve: the server as a Serve deployment, its replicas behind Ray's HTTP and WebSocket
proxy (the `cluster` extra; imported only by `mlx_speech.server --ray` and `serve run`).

Each replica is one server as `mlx_speech.server` makes it (`app_from_args`: its own engine
thread, its models loaded when used and freed when idle, the same options), and its FastAPI
app, every route unchanged, is the deployment's ingress. A WebSocket (realtime, /api/chat) is
one Serve request: it stays on the replica that accepted it for its whole life, and counts as
one ongoing request while it is open, so autoscaling on ongoing requests
(`target_ongoing_requests`) scales on REST requests and open sessions together. Every response
and handshake carries `x-mlx-speech-replica` (the replica's Ray actor name).

A replica that is lost (its process or its machine gone) takes its sessions with it. Ray's
proxy would drop their sockets without a word; `proxy_middlewares` (loaded by every proxy
through RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH, which `--ray` sets and a cluster sets at
`ray start`) closes them with 1012 (service restart: reconnect) and answers a request cut off
before its response with a 503. Serve sends new sessions to the replicas left and replaces
the lost one.

    mlx_speech.server --ray --replicas 2 --model A --model B     # one machine
    serve run docs/serve_config.yaml                             # a cluster (docs/scaling.md)

A Ray instance `--ray` starts itself keeps its own sockets on loopback (the command sets
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported, Ray's default on macOS); only the
proxy listens on --host.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading

from ..cliutil import log
from ..errors import MlxSpeechError, optional

with optional("cluster", "Ray Serve (mlx_speech.server --ray, serve run)"):
    import ray
    from ray import serve

NAME = "mlx_speech"  # the Serve application and deployment
REPLICA_HEADER = b"x-mlx-speech-replica"
CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = "mlx_speech.server.ray_serve:proxy_middlewares"
REPLICA_LOST = 1012  # the WebSocket close code of a session whose replica is gone
# a replica's requests and sessions at once, past which Serve queues (the server's own
# default limit is 64 live sessions, plus REST requests beside them)
MAX_ONGOING = 96
DRIVER_ONLY = ("ray", "replicas", "port", "verbose")  # options of the command, not a replica's


# -- the options of a replica ---------------------------------------------------------------
def server_argv(options: dict) -> list[str]:
    """`mlx_speech.server`'s command line for `options` ({option: value}, the long option
    names with _ or -: a list repeats the option, True is a flag, None or False leaves it
    out): a Serve config's `args` are the command's own options."""
    argv = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    return argv


def parse_options(options: dict):
    """The server's parsed arguments for `options`; MlxSpeechError for a bad one."""
    import io

    from .options import build_parser

    argv = server_argv(options)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(argv)
    except SystemExit:
        why = err.getvalue().strip().removeprefix("error: ") or "cannot parse them"
        raise MlxSpeechError(f"bad server options {' '.join(argv)}: {why}") from None


def replica_options(args) -> dict:
    """A parsed command line's options, as a replica takes them (those that differ from the
    defaults, without the driver's own: --ray, --replicas, --port)."""
    from .options import build_parser

    defaults = vars(build_parser().parse_args(["--model", "x"]))
    return {k: v for k, v in vars(args).items()
            if k not in DRIVER_ONLY and (k == "model" or v != defaults.get(k))}


# -- the deployment -----------------------------------------------------------------------------
class ReplicaHeader:
    """ASGI middleware of a replica: `x-mlx-speech-replica: <actor name>` on every response
    and WebSocket handshake."""

    def __init__(self, app, name: str):
        self.app, self.name = app, name.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)

        async def tagged(msg):
            if msg["type"] in ("http.response.start", "websocket.accept",
                               "websocket.http.response.start"):
                msg = {**msg, "headers": [*msg.get("headers", ()),
                                          (REPLICA_HEADER, self.name)]}
            await send(msg)

        await self.app(scope, receive, tagged)


@serve.ingress()
class Replica:
    """One server: the app, engine and models `mlx_speech.server OPTIONS` would serve."""

    def __init__(self, options: dict):
        from .options import app_from_args
        from .security import resolve_api_key

        args = parse_options(options)
        args.api_key = resolve_api_key(args.api_key, args.api_key_file)
        self.server, self.engine = app_from_args(args)  # (`app` is Serve's own attribute)
        self.name = ray.get_runtime_context().get_actor_name() or "replica"

    def __serve_build_asgi_app__(self):
        return ReplicaHeader(self.server, self.name)

    def check_health(self) -> None:
        """Serve replaces a replica whose engine thread died."""
        if not self.engine.healthy:
            raise RuntimeError(f"the engine is not running ({self.engine.failed or 'stopped'})")

    def __del__(self):
        self.engine.stop(timeout=5.0)


def deployment(options: dict, replicas: int | str = 1, **deployment_options):
    """The Serve application of replicas serving `options` (the server's options as
    `server_argv` reads them). `deployment_options` go to `serve.deployment` (a `serve run`
    config's `deployments` entry overrides them: ray_actor_options, autoscaling_config...)."""
    parse_options(options)  # a bad option is one error here, not in every replica
    kw = {"name": NAME, "num_replicas": replicas, "max_ongoing_requests": MAX_ONGOING,
          "ray_actor_options": {"num_cpus": 0}, "health_check_period_s": 10.0,
          "graceful_shutdown_timeout_s": 5.0, **deployment_options}
    return serve.deployment(Replica, **kw).bind(options)


def app_builder(args: dict):
    """`serve run`'s entry (import_path mlx_speech.server.ray_serve:app_builder): the config's
    `args` are the server's options (docs/serve_config.yaml)."""
    return deployment(dict(args))


# -- the proxy ------------------------------------------------------------------------------
class ReplicaLost:
    """ASGI middleware in Ray's proxy: a WebSocket whose replica ended it without a close
    frame (the replica died) is closed with REPLICA_LOST; an HTTP request answered with
    nothing gets a 503 with Retry-After. Nothing is added when the client left first."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        seen = {"started": False, "ended": False}

        async def watched_receive():
            msg = await receive()
            if msg["type"] in ("websocket.disconnect", "http.disconnect"):
                seen["ended"] = True  # the client left (or ended the request body)
            return msg

        async def watched_send(msg):
            t = msg["type"]
            if t in ("websocket.accept", "http.response.start"):
                seen["started"] = True
            elif t in ("websocket.close", "websocket.http.response.start"):
                seen["ended"] = True
            await send(msg)

        try:
            await self.app(scope, watched_receive, watched_send)
        finally:
            if not seen["ended"]:
                with contextlib.suppress(Exception):
                    await self._answer(scope, send, seen["started"])

    @staticmethod
    async def _answer(scope, send, started: bool) -> None:
        if scope["type"] == "websocket" and started:
            await send({"type": "websocket.close", "code": REPLICA_LOST,
                        "reason": "the server replica of this session stopped; reconnect"})
        elif scope["type"] == "http" and not started:
            body = json.dumps({"error": {
                "message": "the server replica of this request stopped; try again",
                "type": "server_error", "param": None, "code": "replica_lost"}}).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"retry-after", b"1"),
                (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})


def proxy_middlewares() -> list:
    """RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH's callback: the proxy's middlewares."""
    from starlette.middleware import Middleware

    return [Middleware(ReplicaLost)]


# -- mlx_speech.server --ray ------------------------------------------------------------------
def run_ray(args) -> None:
    """Serve `args` through Ray Serve on this machine (or the cluster RAY_ADDRESS names):
    everything a replica would refuse is refused here first, then Ray starts, the proxy
    listens on --host/--port, and --replicas replicas serve until Ctrl-C or SIGTERM."""
    from .models import Models
    from .options import bind

    options = replica_options(args)
    if args.api_key_file or args.api_key == os.environ.get("MLX_SPEECH_API_KEY"):
        options.pop("api_key", None)  # each replica reads the file or the environment itself
    parse_options(options)
    from ..cliutil import window_kwargs

    load_kwargs = {**({"quantize": args.quantize} if args.quantize else {}),
                   **window_kwargs(args)}
    Models.locate(args.model, log_line=log, load_kwargs=load_kwargs)  # kinds, options
    bind(args.host, args.port).close()  # a port in use: one line now, not after Ray starts
    os.environ.setdefault(CALLBACK_ENV, CALLBACK)  # Ray's processes inherit it
    local = not os.environ.get("RAY_ADDRESS")
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(deployment(options, args.replicas), name=NAME, route_prefix="/")
        shown = "localhost" if args.host in ("127.0.0.1", "::1", "0.0.0.0", "::") else args.host
        log(f"the page: http://{shown}:{args.port}/ ({args.replicas} "
            f"replica{'s' if args.replicas > 1 else ''} behind Ray Serve's proxy)")
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
    finally:
        with contextlib.suppress(Exception):
            serve.delete(NAME)
        if local:
            serve.shutdown()
        ray.shutdown()
