"""How many real-time transcription streams one server process sustains.

    python benchmarks/server.py [--config tiny|small|full-narrow] [--streams 1,2,4,8,16]
        [--seconds 3] [--dtype float32|bfloat16] [--no-peer]

Writes the random Voxtral Realtime checkpoint of benchmarks/voxtral_realtime.py, starts
servers in this process on loopback and, for each stream count N, runs N clients of
OpenAI's realtime transcription dialect at once (`?intent=transcription`, 24 kHz pcm16,
one 80 ms append every 80 ms, commit, wait for `.completed`), each with its own audio:

* ours, batched: the engine steps every ready stream in one `feed_many` per tick;
* ours, --no-batch: the same server stepping the streams one `feed_many` call each;
* mlx-audio's server (`mlx_audio.server`, its `/v1/realtime`) on identical weights.

Per run it prints, over all streams:
* chunk lag (ours only, measured in the engine): time from an append's audio reaching the
  server to the end of the model step that consumed it; p95 and max in ms after each
  stream's first 3 steps (its one-time prompt prefill, shown apart);
* completion lag: time from the last append to the `.completed` event (includes the
  end-of-turn flush, which for Voxtral decodes delay + 2 more positions);
* sustained: every stream's p95 chunk lag < one 80 ms frame (ours), resp. completion lag
  within one frame of the 1-stream completion lag (mlx-audio, which cannot be instrumented
  the same way). The largest sustained N is the headline; numbers only, no assertions.

Per-step time vs batch size (1..32) is benchmarks/batched_asr.py.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import voxtral_realtime as vb  # noqa: E402

FRAME_S = 0.08
CONFIGS = {**vb.CONFIGS, "small": {  # between the two: model work, not Python, dominates
    "enc": dict(dim=256, n_layers=4, n_heads=4, head_dim=64, hidden_dim=1024, sliding_window=750),
    "dec": dict(dim=512, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=64, hidden_dim=1536,
                vocab_size=8192, sliding_window=8192)}}
WARM_STEPS = 3  # a stream's first model steps (prompt prefill) are reported apart


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Uvicorn:
    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


def audio24(seconds: float, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    t = np.arange(int(24000 * seconds)) / 24000
    f = rng.uniform(150, 400) + 120 * np.sin(2 * np.pi * rng.uniform(0.3, 1.5) * t)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / 24000) + 0.03 * rng.standard_normal(len(t))
    return np.round(np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


async def one_stream(url: str, model: str, pcm: bytes, start: float) -> dict:
    import websockets

    chunk = int(24000 * FRAME_S) * 2
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "model": model, "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": model}, "turn_detection": None}}}}))

        async def reader():
            async for m in ws:
                ev = json.loads(m)
                if ev["type"] == "conversation.item.input_audio_transcription.completed":
                    return time.perf_counter(), ev["transcript"]
                if ev["type"] == "error":
                    raise RuntimeError(ev)

        rd = asyncio.create_task(reader())
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        t0 = time.perf_counter()
        for k, i in enumerate(range(0, len(pcm), chunk)):
            await asyncio.sleep(max(0.0, t0 + k * FRAME_S - time.perf_counter()))
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm[i:i + chunk]).decode()}))
        t_last = time.perf_counter()
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        t_done, text = await asyncio.wait_for(rd, 600)
        return {"completion_lag": t_done - t_last, "text": text}


def run_streams(url: str, model: str, n: int, seconds: float) -> list[dict]:
    """The clients run in a separate process, so they do not share the server's GIL."""
    import subprocess

    r = subprocess.run([sys.executable, __file__, "--client", url, model, str(n), str(seconds)],
                       capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise RuntimeError(f"client process failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def client_main(url: str, model: str, n: int, seconds: float) -> None:
    async def go():
        start = time.perf_counter() + 0.3
        # staggered starts, as independent clients would be
        return await asyncio.gather(*(one_stream(url, model, audio24(seconds, 100 + i),
                                                 start + (i % 8) * FRAME_S / 8)
                                      for i in range(n)))

    print(json.dumps(asyncio.run(go())))


class LagProbe:
    """In the engine: when each append's audio arrived, when the step consuming it ended."""

    def __init__(self, owner):
        from mlx_speech.server import jobs

        self.owner, self.jobs = owner, jobs
        self.pushes: dict[int, list[tuple[float, int]]] = {}  # id(input) -> (t, cumulative)
        self.lags: dict[int, list[float]] = {}
        self.streams: dict[int, object] = {}  # id(session) -> its AsrStream
        probe = self
        self._orig_push = orig_push = jobs.Input.push
        self._orig_start = orig_start = jobs.AsrStream.start

        def push(inp, x):
            orig_push(inp, x)
            log = probe.pushes.setdefault(id(inp), [])
            log.append((time.perf_counter(), (log[-1][1] if log else 0) + len(x)))

        def start(st):
            orig_start(st)
            probe.streams[id(st.session)] = st

        jobs.Input.push, jobs.AsrStream.start = push, start
        self._orig_feed = orig_feed = owner.feed_many

        def feed_many(pairs):
            out = orig_feed(pairs)
            t = time.perf_counter()
            for sess, x in pairs:
                st = probe.streams.get(id(sess))
                if st is None:
                    continue
                consumed = probe.consumed.get(id(st), 0) + len(x)
                probe.consumed[id(st)] = consumed
                for tp, cum in probe.pushes.get(id(st.input), []):
                    if cum >= consumed:  # the append that completed this feed
                        probe.lags.setdefault(id(st), []).append(t - tp)
                        break
            return out

        self.consumed: dict[int, int] = {}
        owner.feed_many = feed_many

    def reset(self):
        self.pushes.clear()
        self.lags.clear()
        self.consumed.clear()

    def close(self):
        self.jobs.Input.push, self.jobs.AsrStream.start = self._orig_push, self._orig_start
        self.owner.feed_many = self._orig_feed


def summarize(label: str, n: int, res: list[dict], chunk_lags: list[list[float]] | None,
              base_completion: float | None) -> bool:
    comp = [r["completion_lag"] for r in res]
    line = (f"  {label:<12} N={n:<3} completion lag ms: median "
            f"{1000 * statistics.median(comp):7.1f} max {1000 * max(comp):7.1f}")
    if chunk_lags is not None:
        # the first steps of a stream include its one-time prompt prefill: shown apart
        steady = [lg[WARM_STEPS:] if len(lg) > WARM_STEPS else lg for lg in chunk_lags if lg]
        p95s = [float(np.percentile(lg, 95)) for lg in steady]
        first = max(max(lg[:WARM_STEPS]) for lg in chunk_lags if lg)
        ok = bool(p95s) and max(p95s) < FRAME_S
        med = max(float(np.median(lg)) for lg in steady)
        worst = max(max(lg) for lg in steady)
        line += (f" | chunk lag ms: worst-stream median {1000 * med:6.1f} p95 "
                 f"{1000 * max(p95s):7.1f} max {1000 * worst:7.1f} (first {WARM_STEPS} "
                 f"steps: max {1000 * first:6.1f})")
    elif base_completion is None:  # the peer's own 1-stream run: the reference
        print(line + " | (its baseline)", flush=True)
        return True
    else:
        ok = max(comp) < base_completion + FRAME_S
    print(line + f" | sustained: {'yes' if ok else 'NO'}", flush=True)
    return ok


def bench_ours(folder: Path, streams: list[int], seconds: float, batch: bool,
               dtype) -> dict[int, bool]:
    import mlx_speech
    from mlx_speech.server import make_app

    model = mlx_speech.load(folder, dtype=dtype)
    app, engine = make_app({"vr": model}, batch=batch, max_buffer_s=60.0)
    probe = LagProbe(model)
    label = "ours batched" if batch else "ours 1-by-1"
    out = {}
    try:
        with Uvicorn(app) as u:
            url = f"ws://127.0.0.1:{u.port}/v1/realtime?intent=transcription"
            run_streams(url, "vr", 1, 1.0)  # warm-up
            for n in streams:
                probe.reset()
                res = run_streams(url, "vr", n, seconds)
                lags = list(probe.lags.values())
                out[n] = summarize(label, n, res, lags, None)
            sizes = dict(sorted(engine.batch_sizes.items()))
            print(f"  {label:<12} feed_many batch sizes (size: calls): {sizes}")
    finally:
        probe.close()
        engine.stop()
    return out


def bench_peer(folder: Path, streams: list[int], seconds: float) -> dict[int, bool] | None:
    try:
        if "webrtcvad" not in sys.modules:  # only its legacy endpoint uses it
            try:
                import webrtcvad  # noqa: F401
            except ImportError:
                sys.modules["webrtcvad"] = types.ModuleType("webrtcvad")
        import mlx_audio.server as mas
    except Exception as e:
        print(f"  mlx-audio    skipped: cannot import mlx_audio.server ({e!r})")
        return None
    peer = vb.load_peer(folder)
    mas.model_provider.load_model = lambda name: peer  # serve these weights under any id
    out, base = {}, None
    with Uvicorn(mas.app) as u:
        url = f"ws://127.0.0.1:{u.port}/v1/realtime?intent=transcription&model=vr"
        run_streams(url, "vr", 1, 1.0)
        for n in streams:
            res = run_streams(url, "vr", n, seconds)
            out[n] = summarize("mlx-audio", n, res, None, base)
            if n == 1:
                base = max(r["completion_lag"] for r in res)
    return out


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:
        return client_main(argv[1], argv[2], int(argv[3]), float(argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dtype", choices=sorted(vb.DTYPES))
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    dtype_name = args.dtype or ("bfloat16" if args.config == "full-narrow" else "float32")
    dtype = vb.DTYPES[dtype_name]
    c = CONFIGS[args.config]
    print("Server benchmark: real-time Voxtral Realtime streams in one process")
    print(f"device {mx.default_device()} | mlx {mx.__version__} | config {args.config} "
          f"({c['enc']['n_layers']}+{c['dec']['n_layers']} layers, decoder dim "
          f"{c['dec']['dim']}) | dtype {dtype_name} | {args.seconds:g} s per stream, 80 ms "
          f"appends at 24 kHz | commit {vb.git_commit()}")
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        vb.write_checkpoint(folder, c["enc"], c["dec"], dtype, 0)
        results = {"ours batched": bench_ours(folder, streams, args.seconds, True, dtype),
                   "ours 1-by-1": bench_ours(folder, streams, args.seconds, False, dtype)}
        if not args.no_peer:
            peer = bench_peer(folder, streams, args.seconds)
            if peer is not None:
                results["mlx-audio"] = peer
    print("max sustained real-time streams (of those tried):")
    for k, v in results.items():
        ok = [n for n in sorted(v) if all(v[m] for m in sorted(v) if m <= n)]
        note = " (relative to its own 1-stream run, assumed real-time)" if k == "mlx-audio" else ""
        print(f"  {k:<12} {max(ok) if ok else 0}{note}")


if __name__ == "__main__":
    main()
