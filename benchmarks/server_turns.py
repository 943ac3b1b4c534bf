"""What server-side turn detection costs: extra latency per turn, and the VAD's share of a tick.

    python benchmarks/server_turns.py [--config tiny|small] [--turns 8] [--streams 1,4,16]

Writes the random Voxtral Realtime checkpoint of benchmarks/voxtral_realtime.py, serves it
in this process on loopback with the Silero VAD (the model shipped with mlx_speech), and feeds
espeak-ng phrases with pauses and background noise (tests/data/turns_*.wav) as one OpenAI
realtime client sending an 80 ms append every 80 ms:

* latency per turn, server_vad (silence 500 ms): from sending the append that holds the
  turn's last sample (`audio_end_ms`, the closing silence included) to `.completed`;
* latency per turn, turn_detection null: the same audio, the client committing at the same
  positions; from sending the commit to `.completed`;
* extra latency = the first minus the second (medians): what the VAD path adds on top of
  a client commit. The configured silence itself is not in it (a client-side VAD waits too).
  First vs last turns show whether latency grows with the number of turns;
* the VAD's share of an engine tick with N such clients at once: time in the batched VAD
  step (`TurnStream.step_many`) against time in the ASR steps, per tick that ran the VAD.

Numbers only, no assertions.
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
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import voxtral_realtime as vb  # noqa: E402
from server import CONFIGS, Uvicorn  # noqa: E402

FRAME_S = 0.08
APPEND = int(24000 * FRAME_S)  # samples per append


def speech24(turns: int, seed: int) -> np.ndarray:
    """pcm16 at 24 kHz: `turns` phrases, 0.9 s pauses, noise throughout."""
    from mlx_speech.audio.resample import resample
    from tests.support.turns_audio import scene

    names = [("please", "meeting", "go")[i % 3] for i in range(turns)]
    audio, _ = scene(names, lead_s=0.6, gap_s=0.9, tail_s=1.0, seed=seed)
    return np.round(np.clip(resample(audio, 16000, 24000), -1, 1) * 32767).astype("<i2")


async def client(url: str, pcm: np.ndarray, turn_detection, commit_at: list[int] = ()):
    """One paced client; returns [(end sample (24 kHz), latency s)] per completed item."""
    import websockets

    sent_at: dict[int, float] = {}  # 24 kHz sample count -> wall time it was sent
    done: list[tuple[str, float]] = []
    ends: dict[str, int] = {}
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "vr"}, "turn_detection": turn_detection}}}}))

        async def reader():
            commits: list[str] = []
            async for msg in ws:
                ev = json.loads(msg)
                t = ev["type"]
                if t == "input_audio_buffer.speech_stopped":
                    ends[ev["item_id"]] = ev["audio_end_ms"] * 24
                elif t == "input_audio_buffer.committed" and turn_detection is None:
                    commits.append(ev["item_id"])
                    ends[ev["item_id"]] = commit_at[len(commits) - 1]
                elif t.endswith(".completed"):
                    done.append((ev["item_id"], time.perf_counter()))
                elif t == "error":
                    raise RuntimeError(ev)

        task = asyncio.create_task(reader())
        t0 = time.perf_counter()
        todo = list(commit_at)
        for k, i in enumerate(range(0, len(pcm), APPEND)):
            chunk = pcm[i:i + APPEND]
            if todo and i + len(chunk) >= todo[0]:  # commit exactly at the position
                cut = todo.pop(0) - i
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio":
                                          base64.b64encode(chunk[:cut].tobytes()).decode()}))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                sent_at[i + cut] = time.perf_counter()
                chunk = chunk[cut:]
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(chunk.tobytes()).decode()}))
            sent_at.setdefault(i + len(pcm[i:i + APPEND]), time.perf_counter())
            await asyncio.sleep(max(0.0, t0 + (k + 1) * FRAME_S - time.perf_counter()))
        t_end = time.perf_counter()
        while len(done) < len(ends) or time.perf_counter() - t_end < 1.0:
            await asyncio.sleep(0.05)
            if time.perf_counter() - t_end > 30:
                break
        task.cancel()
    marks = sorted(sent_at.items())
    out = []
    for item, t_done in done:
        end = ends[item]
        t_sent = next(t for n, t in marks if n >= end)  # the send that held the end sample
        out.append((end, t_done - t_sent))
    return sorted(out)


def tick_shares(url: str, pcm: np.ndarray, n: int) -> tuple[float, float, int]:
    """N paced server_vad clients at once; mean ms per VAD-running tick in the turn streams'
    step and in the ASR streams' step."""
    from mlx_speech.server.jobs import AsrStream
    from mlx_speech.server.turns import TurnStream

    vad_t, asr_t = [], []
    cur = {"vad": 0.0}
    saved = {k: k.__dict__.get("step_many") for k in (TurnStream, AsrStream)}
    turn_step, asr_step = TurnStream.step_many.__func__, AsrStream.step_many.__func__

    def timed_turns(cls, engine, jobs):
        t = time.perf_counter()
        r = turn_step(cls, engine, jobs)
        cur["vad"] = time.perf_counter() - t
        return r

    def timed_asr(cls, engine, jobs):
        t = time.perf_counter()
        r = asr_step(cls, engine, jobs)
        if cur["vad"]:
            vad_t.append(cur["vad"])
            asr_t.append(time.perf_counter() - t)
        cur["vad"] = 0.0
        return r

    TurnStream.step_many, AsrStream.step_many = classmethod(timed_turns), classmethod(timed_asr)
    try:
        async def many():
            await asyncio.gather(*(client(url, pcm, {"type": "server_vad"}) for _ in range(n)))

        asyncio.run(many())
    finally:
        for kind, own in saved.items():
            if own is None:  # inherited: the class's own override goes
                del kind.step_many
            else:
                kind.step_many = own
    return 1000 * statistics.mean(vad_t), 1000 * statistics.mean(asr_t), len(vad_t)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    import mlx_speech
    from mlx_speech.models.silero_vad import load_vad
    from mlx_speech.server import make_app

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=("tiny", "small"), default="tiny")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--streams", default="1,4,16")
    args = ap.parse_args(argv)
    c = CONFIGS[args.config]
    print("Server turn detection: latency per turn and the VAD's share of a tick")
    print(f"device {mx.default_device()} | mlx {mx.__version__} | Voxtral config {args.config} "
          f"| {args.turns} turns, 80 ms appends at 24 kHz | commit {vb.git_commit()}")
    pcm = speech24(args.turns, seed=0)
    with tempfile.TemporaryDirectory() as d:
        vb.write_checkpoint(Path(d), c["enc"], c["dec"], mx.float32, 0)
        model = mlx_speech.load(d)
        app, engine = make_app({"vr": model}, vad=load_vad())
        try:
            with Uvicorn(app) as u:
                url = f"ws://127.0.0.1:{u.port}/v1/realtime?intent=transcription"
                vad_lat = asyncio.run(client(url, pcm, {"type": "server_vad"}))
                ends = [e for e, _ in vad_lat]
                null_lat = asyncio.run(client(url, pcm, None, commit_at=ends))
                for label, lat in (("server_vad", vad_lat), ("null + commit", null_lat)):
                    ms = [1000 * x for _, x in lat]
                    print(f"  {label:<14} turns {len(ms):>2}  latency ms: median "
                          f"{statistics.median(ms):7.1f}  first {ms[0]:7.1f}  last "
                          f"{ms[-1]:7.1f}  max {max(ms):7.1f}")
                extra = (statistics.median(x for _, x in vad_lat)
                         - statistics.median(x for _, x in null_lat))
                print(f"  extra latency per turn with VAD on: {1000 * extra:+.1f} ms (median)"
                      " + the configured silence_duration_ms (500)")
                for n in [int(s) for s in args.streams.split(",")]:
                    v, a, ticks = tick_shares(url, pcm[: 24000 * 6], n)
                    print(f"  {n:>3} VAD streams: per tick {v:6.2f} ms VAD step vs {a:6.2f} ms "
                          f"ASR steps ({100 * v / (v + a):4.1f}% of the tick; {ticks} ticks)")
        finally:
            engine.stop()


if __name__ == "__main__":
    main()
