"""The browser page: `GET /` and its files under `/web/`, plain files shipped in the package
(`server/web/`, no build step, nothing fetched from elsewhere). They hold no secret, so they are
served without the API key; the page asks for the key and sends it with every API call."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, HTTPException
from fastapi.responses import Response

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# same origin only: scripts, styles, workers and sockets from this server; audio/downloads as blobs
HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data: blob:; media-src 'self' blob:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; "
                               "frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def page_files() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, media type) for every file of the page."""
    root = resources.files("mlx_speech.server") / "web"
    out = {}
    for f in root.iterdir():
        suffix = "." + f.name.rsplit(".", 1)[-1]
        if f.is_file() and suffix in TYPES:
            out[f.name] = (f.read_bytes(), TYPES[suffix])
    return out


def add_routes(app: FastAPI) -> None:
    files = page_files()  # read once: a fixed set of names, nothing else on disk is reachable

    def serve(name: str) -> Response:
        if name not in files:
            raise HTTPException(404, {"error": {"message": f"no page file {name!r}",
                                                "type": "not_found_error", "param": None,
                                                "code": None}})
        data, media = files[name]
        return Response(data, media_type=media, headers=HEADERS)

    @app.get("/", include_in_schema=False)
    async def index():
        return serve("index.html")

    @app.get("/web/{name}", include_in_schema=False)
    async def web_file(name: str):
        return serve(name)
