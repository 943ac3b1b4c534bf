"""Time to first audio through the server: text streamed in over `WS /v1/audio/speech/stream`,
and `POST /v1/audio/speech` streamed, at B concurrent voices of one Voxtral TTS model.

    python benchmarks/tts_ttfa.py [--config tiny|mid|full] [--batches 1,4,16] [--rounds 3]
        [--dtype float32|bfloat16]

Builds the random model of benchmarks/tts_batched.py (END never wins, so every voice speaks to
its cap), serves it in this process on loopback, and for each B runs B clients at once:

* WebSocket, a burst: every client sends a sentence in word-sized deltas (an LLM's tokens), the
  last one ending the sentence, and keeps its generation open; ms from sending that delta to
  receiving the first `speech.audio.delta` (client), and the `ttfa_ms` the server put in it
  (from that delta's arrival to the audio leaving); median and max over the B clients;
* WebSocket, joining: B - 1 clients are speaking (long texts), one more sends its sentence:
  the same two times for it;
* REST: B streamed `POST /v1/audio/speech` (pcm) at once: ms from sending the request to the
  first audio byte (client), and the `x-time-to-first-audio-ms` header (server);
* the engine's frame step at B (ms per batched `step_many` of B voices, measured apart with
  the codec) and each first-audio time in those steps: the first chunk is 4 frames, so a
  sentence end costs its prompt's prefill plus about 4 steps;
* throughput: audio seconds per wall second that B voices speaking at once receive, batched and
  with a second server that steps them one at a time (`--no-batch`, what the server did before
  speech jobs were batched).

Numbers only, no assertions; medians over --rounds. `--config full` has Voxtral-4B-TTS's real
shapes (about 4 B parameters: a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tts_batched as tb  # noqa: E402

from tests.support.server import ServerThread  # noqa: E402

PATH = "/v1/audio/speech/stream"
# the last delta ends the sentence: its "." and the space after it (a "." with nothing after
# it may still be "3.5": the segment is known complete at the next character, or at a flush)
SENTENCE = ["Hello", " there,", " this", " is", " a", " test", " of", " the", " voice. "]
DEADLINE_S = 600.0  # on each measurement (never hit when things work)
LONG = "Keep talking while the others start, with a sentence that goes on and on. " * 8
WORD_GAP_S = 0.02  # between deltas: an LLM writing 50 tokens a second
THROUGHPUT_S = 3.0


async def _session(ws, seed: int, max_frames: int | None = None) -> None:
    assert json.loads(await ws.recv())["type"] == "session.created"
    await ws.send(json.dumps({"type": "session.update", "session": {
        "voice": "v", "seed": seed, "max_frames": max_frames}}))
    while json.loads(await ws.recv())["type"] != "session.updated":
        pass


async def _first_delta(ws) -> dict:
    while True:
        ev = json.loads(await ws.recv())
        if ev["type"] == "speech.audio.delta":
            return ev
        if ev["type"] == "error":
            raise RuntimeError(ev["error"]["message"])


async def _speaker(url: str, seed: int, go: asyncio.Event, done: asyncio.Event,
                   firsts: list, ready: list) -> None:
    """One voice: once `go`, sends the sentence word by word and adds (client ms, server ms)
    of its first audio to `firsts`; keeps its generation open (the voice goes on being
    stepped) until `done`."""
    import websockets

    async with websockets.connect(url, max_size=None) as ws:
        await _session(ws, seed)
        ready.append(seed)
        await go.wait()
        for w in SENTENCE[:-1]:
            await ws.send(json.dumps({"type": "input_text.append", "text": w}))
            await asyncio.sleep(WORD_GAP_S)
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "input_text.append", "text": SENTENCE[-1]}))
        ev = await _first_delta(ws)
        firsts.append((1e3 * (time.perf_counter() - t0), ev["ttfa_ms"]))
        await ws.send(json.dumps({"type": "input_text.append", "text": " And more"}))
        await done.wait()
        await ws.send(json.dumps({"type": "speech.cancel"}))


async def _until(n: int, got: list, tasks: list) -> None:
    while len(got) < n:
        for t in tasks:
            if t.done() and t.exception():
                raise t.exception()
        await asyncio.sleep(0.005)


async def _busy(url: str, seed: int, ready: asyncio.Event, done: asyncio.Event) -> None:
    """A voice already speaking (a long text) until `done`."""
    import websockets

    async with websockets.connect(url, max_size=None) as ws:
        await _session(ws, seed, max_frames=2048)
        await ws.send(json.dumps({"type": "input_text.append", "text": LONG}))
        await _first_delta(ws)
        ready.set()
        await done.wait()
        await ws.send(json.dumps({"type": "speech.cancel"}))


async def ws_burst(srv, B: int) -> list[tuple[float, float]]:
    go, done, firsts, ready = asyncio.Event(), asyncio.Event(), [], []
    tasks = [asyncio.create_task(_speaker(srv.ws + PATH, 10 + i, go, done, firsts, ready))
             for i in range(B)]
    try:
        await _until(B, ready, tasks)  # every socket open and configured
        go.set()
        await _until(B, firsts, tasks)
        return firsts
    finally:
        done.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def ws_join(srv, B: int) -> tuple[float, float]:
    go, done, firsts = asyncio.Event(), asyncio.Event(), []
    readies = [asyncio.Event() for _ in range(B - 1)]
    tasks = [asyncio.create_task(_busy(srv.ws + PATH, 100 + i, r, done))
             for i, r in enumerate(readies)]
    try:
        for r in readies:
            await r.wait()
        go.set()
        tasks.append(asyncio.create_task(_speaker(srv.ws + PATH, 7, go, done, firsts, [])))
        await _until(1, firsts, tasks)
        return firsts[0]
    finally:
        done.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def throughput(srv, B: int) -> float:
    """Audio seconds the sockets of B voices speaking at once receive per wall second (all
    voices together), over THROUGHPUT_S once every voice has its first audio."""
    import websockets

    started, got, stop, counting = [], [0] * B, asyncio.Event(), [False]

    async def voice(i):
        async with websockets.connect(srv.ws + PATH, max_size=None) as ws:
            await _session(ws, 200 + i, max_frames=2048)
            await ws.send(json.dumps({"type": "input_text.append", "text": LONG}))
            await _first_delta(ws)
            started.append(i)
            while not stop.is_set():
                try:
                    ev = json.loads(await asyncio.wait_for(ws.recv(), 0.1))
                except asyncio.TimeoutError:
                    continue
                if ev["type"] == "speech.audio.delta" and counting[0]:
                    got[i] += len(base64.b64decode(ev["audio"])) // 2
            await ws.send(json.dumps({"type": "speech.cancel"}))

    tasks = [asyncio.create_task(voice(i)) for i in range(B)]
    try:
        await _until(B, started, tasks)
        counting[0] = True
        await asyncio.sleep(THROUGHPUT_S)
        counting[0] = False
        return sum(got) / 24000 / THROUGHPUT_S
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def rest_burst(srv, B: int) -> list[tuple[float, float]]:
    import httpx

    async def one(client, seed):
        t0 = time.perf_counter()
        async with client.stream("POST", srv.base + "/v1/audio/speech", json={
                "input": "".join(SENTENCE), "voice": "v", "seed": seed, "max_frames": 16,
                "response_format": "pcm"}) as r:
            body = r.aiter_bytes()
            async for chunk in body:
                if chunk:
                    client_ms = 1e3 * (time.perf_counter() - t0)
                    break
            server_ms = float(r.headers["x-time-to-first-audio-ms"])
            async for _ in body:
                pass
        return client_ms, server_ms

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as c:
        return list(await asyncio.gather(*(one(c, 20 + i) for i in range(B))))


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))


def _stats(pairs: list[tuple[float, float]]) -> tuple[float, float, float, float]:
    """(client median, client max, server median, server max)"""
    c, s = [p[0] for p in pairs], [p[1] for p in pairs]
    return statistics.median(c), max(c), statistics.median(s), max(s)


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(tb.CONFIGS), default="tiny")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=sorted(tb.DTYPES))
    args = ap.parse_args()
    dtype = tb.DTYPES[args.dtype or ("bfloat16" if args.config == "full" else "float32")]
    batches = [int(b) for b in args.batches.split(",")]
    rows: dict[int, dict[str, list]] = {B: {k: [] for k in ("burst", "join", "rest", "step",
                                                           "tput", "tput1")}
                                        for B in batches}
    with tempfile.TemporaryDirectory() as d:
        tts = tb.build(tb.CONFIGS[args.config], Path(d), dtype)
        with ServerThread({"v": tts}, max_sessions=256, max_per_ip=256) as srv:
            _run(ws_join(srv, 1))  # warm: compile, first shapes
            for _ in range(args.rounds):
                for B in batches:
                    r = rows[B]
                    r["burst"].append(_stats(_run(ws_burst(srv, B))))
                    r["join"].append(_run(ws_join(srv, B)))
                    r["rest"].append(_stats(_run(rest_burst(srv, B))))
                    r["tput"].append(_run(throughput(srv, B)))
        with ServerThread({"v": tts}, max_sessions=256, max_per_ip=256, batch=False) as srv:
            for _ in range(args.rounds):  # the same server stepping voices one at a time
                for B in batches:
                    rows[B]["tput1"].append(_run(throughput(srv, B)))
        for B in batches:  # the engine's batched frame, measured apart (the server is gone)
            rows[B]["step"] = [tb.frame_ms(tts, B, 32, codec=True)[0]
                               for _ in range(args.rounds)]

    def med(xs, k=None):
        return statistics.median(x if k is None else x[k] for x in xs)

    print(f"tts_ttfa --config {args.config} --dtype {dtype}  mlx {mx.__version__} "
          f"{mx.default_device()}  rounds {args.rounds} (medians)")
    print("time to first audio, ms: client = sent -> received on loopback; server = arrived -> "
          "left (the ttfa_ms field / x-time-to-first-audio-ms header); steps = client ms / the "
          "frame step at B")
    print(f"{'B':>3} | {'step ms':>7} | {'WS burst: client med':>20}{'max':>7}{'server med':>11}"
          f"{'steps':>6} | {'WS join: client':>15}{'server':>7}{'steps':>6} | "
          f"{'REST: client med':>16}{'max':>7}{'server med':>11}{'steps':>6}")
    for B in batches:
        r = rows[B]
        step = med(r["step"])
        bc, bx, bs = med(r["burst"], 0), med(r["burst"], 1), med(r["burst"], 2)
        jc, js = med(r["join"], 0), med(r["join"], 1)
        rc, rx, rs = med(r["rest"], 0), med(r["rest"], 1), med(r["rest"], 2)
        print(f"{B:>3} | {step:7.2f} | {bc:20.1f}{bx:7.1f}{bs:11.1f}{bc / step:6.1f} | "
              f"{jc:15.1f}{js:7.1f}{jc / step:6.1f} | {rc:16.1f}{rx:7.1f}{rs:11.1f}"
              f"{rc / step:6.1f}")
    print("audio seconds made per wall second by B voices at once, through their sockets: "
          "batched (one step_many a frame) and --no-batch (one voice a call, as before)")
    print(f"{'B':>3} | {'batched':>8}{'per voice':>10} | {'one by one':>10}{'per voice':>10} | "
          f"{'ratio':>6}")
    for B in batches:
        a, b = med(rows[B]["tput"]), med(rows[B]["tput1"])
        print(f"{B:>3} | {a:8.2f}{a / B:10.2f} | {b:10.2f}{b / B:10.2f} | {a / b:6.2f}")


if __name__ == "__main__":
    main()
