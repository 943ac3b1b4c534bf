"""The latency Ray Serve's proxy adds, and the sessions one replica carries, in one run.

    python benchmarks/ray_proxy.py [--model tests/golden/nemotron] [--rest 40] [--rounds 40]
        [--delta-sessions 3] [--sessions 1,4,8,16] [--seconds 3]

Starts the same server twice on loopback, as subprocesses: `mlx_speech.server` (direct) and
`mlx_speech.server --ray --replicas 1` (Ray's proxy in front of one replica), and sends the
same requests to both, interleaved:
* REST: GET /v1/models (no model work), and POST /v1/audio/transcriptions of a 1 s clip
  (the model's work included);
* a realtime round trip with no model work: OpenAI's session.update -> session.updated;
* realtime deltas (vLLM's dialect): one 80 ms append every 80 ms; each delta's latency is the
  time from the last append sent before it; the p50 over --delta-sessions sessions;
* sessions per replica (through the proxy only): N paced sessions at once; their delta
  latency p50 / p95 and the completion lag (the final commit to transcription.done).
For each it prints p50 / p95 per server and the proxy's added p50. The default model is the
tiny test checkpoint, so the numbers are the serving path's (the proxy, the event loops), not a
model's (benchmarks/server.py measures that). Numbers only, no assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FRAME = 1280  # 80 ms at 16 kHz


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, ray: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "mlx_speech.server", "--model", model, "--port", str(port),
           "--no-vad", "--preload"] + (["--ray", "--replicas", "1"] if ray else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    return p, f"127.0.0.1:{port}"


def wait_up(addr: str, p: subprocess.Popen, timeout: float = 600) -> None:
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert p.poll() is None, "the server exited"
        try:
            if httpx.get(f"http://{addr}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(addr)


def speechlike(seconds: float, seed: int) -> np.ndarray:
    from tests.conftest import speechlike as s

    return s(seconds, seed)


def pcm_b64(x: np.ndarray) -> str:
    return base64.b64encode(np.round(np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3


def listing(addr: str, n: int) -> list[float]:
    import httpx

    out = []
    with httpx.Client() as c:
        for _ in range(n):
            t = time.perf_counter()
            c.get(f"http://{addr}/v1/models", timeout=60).raise_for_status()
            out.append(time.perf_counter() - t)
    return out


def rest(addr: str, model: str, wav: bytes, n: int) -> list[float]:
    import httpx

    out = []
    with httpx.Client() as c:
        for _ in range(n):
            t = time.perf_counter()
            r = c.post(f"http://{addr}/v1/audio/transcriptions", data={"model": model},
                       files={"file": ("a.wav", wav)}, timeout=120)
            out.append(time.perf_counter() - t)
            r.raise_for_status()
    return out


async def round_trips(addr: str, model: str, n: int) -> list[float]:
    import websockets

    out = []
    async with websockets.connect(f"ws://{addr}/v1/realtime?intent=transcription",
                                  max_size=None) as ws:
        await ws.recv()  # session.created
        upd = json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"transcription": {"model": model}}}}})
        for _ in range(n):
            t = time.perf_counter()
            await ws.send(upd)
            while json.loads(await ws.recv())["type"] != "session.updated":
                pass
            out.append(time.perf_counter() - t)
    return out


async def paced(addr: str, model: str, x: np.ndarray) -> tuple[list[float], float]:
    """One vLLM-dialect session at real-time pace: (delta latencies, completion lag)."""
    import websockets

    async with websockets.connect(f"ws://{addr}/v1/realtime", max_size=None) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "model": model}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        last = [time.perf_counter()]
        lat: list[float] = []

        async def reader():
            while True:
                ev = json.loads(await ws.recv())
                now = time.perf_counter()
                if ev["type"] == "transcription.delta":
                    lat.append(now - last[0])
                elif ev["type"] == "transcription.done":
                    return now
                elif ev["type"] == "error":
                    raise RuntimeError(ev)

        rd = asyncio.create_task(reader())
        t0 = time.perf_counter()
        for k, i in enumerate(range(0, len(x), FRAME)):
            await asyncio.sleep(max(0.0, t0 + k * 0.08 - time.perf_counter()))
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": pcm_b64(x[i:i + FRAME])}))
            last[0] = time.perf_counter()
        t_end = time.perf_counter()
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        done = await asyncio.wait_for(rd, 300)
        return lat, done - t_end


def line(what: str, direct: list[float], proxy: list[float]) -> None:
    print(f"{what:<34} direct p50 {pct(direct, .5):7.1f} p95 {pct(direct, .95):7.1f} | proxy "
          f"p50 {pct(proxy, .5):7.1f} p95 {pct(proxy, .95):7.1f} | added p50 "
          f"{pct(proxy, .5) - pct(direct, .5):+6.1f} ms  (n={len(direct)}/{len(proxy)})")


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # float32 compared: no TF32
    import soundfile as sf

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(ROOT / "tests" / "golden" / "nemotron"))
    p.add_argument("--rest", type=int, default=40)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--delta-sessions", type=int, default=3)
    p.add_argument("--sessions", default="1,4,8,16")
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    procs = [start(args.model, False), start(args.model, True)]
    try:
        for proc, addr in procs:
            wait_up(addr, proc)
        (_, direct), (_, proxy) = procs
        print(f"both servers up in {time.monotonic() - t0:.0f} s ({args.model})")
        import io

        buf = io.BytesIO()
        sf.write(buf, speechlike(1.0, 1), 16000, format="WAV", subtype="FLOAT")
        wav = buf.getvalue()
        rest(direct, args.model, wav, 3), rest(proxy, args.model, wav, 3)  # warm
        d, q = [], []
        for _ in range(args.rest):
            d += listing(direct, 1)
            q += listing(proxy, 1)
        line("REST GET /v1/models (no model)", d, q)
        d, q = [], []
        for _ in range(args.rest):  # interleaved: the machine's load hits both alike
            d += rest(direct, args.model, wav, 1)
            q += rest(proxy, args.model, wav, 1)
        line("REST transcription (1 s clip)", d, q)
        d, q = [], []
        for _ in range(max(1, args.rounds // 10)):
            d += asyncio.run(round_trips(direct, args.model, 10))
            q += asyncio.run(round_trips(proxy, args.model, 10))
        line("realtime round trip (no model)", d, q)
        d, q = [], []
        for i in range(args.delta_sessions):
            x = speechlike(args.seconds, 10 + i)
            d += asyncio.run(paced(direct, args.model, x))[0]
            q += asyncio.run(paced(proxy, args.model, x))[0]
        line("realtime delta (append -> delta)", d, q)
        print("sessions on one replica, through the proxy (paced 80 ms appends):")
        for n in [int(v) for v in args.sessions.split(",")]:
            async def many(n=n):
                return await asyncio.gather(*(paced(proxy, args.model,
                                                    speechlike(args.seconds, 100 + i))
                                              for i in range(n)))
            res = asyncio.run(many())
            lat = [v for r in res for v in r[0]]
            comp = [r[1] for r in res]
            print(f"  {n:3d} sessions: delta p50 {pct(lat, .5):6.1f} p95 {pct(lat, .95):6.1f} "
                  f"ms, completion lag p50 {statistics.median(comp) * 1e3:6.1f} max "
                  f"{max(comp) * 1e3:6.1f} ms")
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, _ in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    import mlx.core as mx

    print(f"mlx {mx.__version__} on {mx.default_device()}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
