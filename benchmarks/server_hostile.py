"""The server under hostile input (issue 31): each attack of the round-two review, run against a
server process on loopback while a normal client uses it.

    python benchmarks/server_hostile.py [--attacks hotwords,graph,churn,buffers,uploads,
        diarization,shutdown] [--seconds 15] [--root DIR]

Each attack gets a fresh `python -m mlx_speech.server --model tests/golden/nemotron --diarizer
tests/golden/sortformer/tiny.nemo --port 0` (the tiny checkpoints in the real formats; --root
serves another checkout's code, e.g. a worktree of an older commit, to the same attacks). A
first normal session loads and warms the model; then for --seconds the attack runs while:

* /health is asked every 20 ms: p50, p95 and max answer times (acceptance: p95 < 100 ms,
  max < 1 s);
* a normal realtime session (vLLM's dialect, 2 s of audio sent in real time, 100 ms a
  message) runs again and again: the worst time from its last audio to its
  `transcription.done` (acceptance: < 5 s), and how many sessions failed;
* the server's resident memory is sampled every 200 ms: before, and the largest growth
  (acceptance: < 500 MB for the vocabulary attacks, < 300 MB for buffers and uploads);
* afterwards, with every client gone, the server's CPU seconds in the next 5 s (work left
  running for clients who left: ~0 when every job ended with its client).

The attacks (issue 31's findings):
  hotwords     REST `hotwords=w0,...,w39999` (269 KB) and the same list in OpenAI's and vLLM's
               session.update, two attackers in a loop (finding 1)
  graph        two attackers, each a new socket per list: 10,000 distinct 200-character
               phrases, and a distinct list of 90,000 tokens (under the bound) used by an
               utterance (finding 2)
  churn        one socket: a new 1000-phrase list with each 0.1 s utterance every 10 ms, then
               gone (finding 3)
  buffers      one vLLM socket: commit, 1.5 s append, final, as fast as it can; one OpenAI
               socket: 1.5 s append and commit (finding 4)
  uploads      eight clients posting a 30 min 48 kHz stereo FLAC of silence (~0.3 MB), each
               leaving when the attack ends (finding 5)
  diarization  `diarized_json` on a 30 min upload, the client leaving after a third of the
               attack (finding 6)
  shutdown     four such uploads and a realtime socket pending, then SIGTERM: the time to exit
               and what the clients got (finding 7)
Numbers only, no assertions (tests/server/test_server_hostile2.py proves the mechanisms).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import io
import json
import os
import random
import signal
import string
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import speechlike  # noqa: E402
from tests.support.server import pcm16, server_process, wav_bytes  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"
MODEL = str(GOLDEN / "nemotron")
DIARIZER = str(GOLDEN / "sortformer" / "tiny.nemo")
ATTACKS = ("hotwords", "graph", "churn", "buffers", "uploads", "diarization", "shutdown")
LIMIT_MB = {"hotwords": 500, "graph": 500, "churn": 500, "buffers": 300, "uploads": 300,
            "diarization": 300}
CLIENT_WAIT_S = 120.0  # the most any client waits for one answer


# -- the server process and what it costs ------------------------------------------------------
def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    except OSError:  # not Linux
        return int(subprocess.check_output(["ps", "-o", "rss=", "-p", str(pid)])) / 1024


def cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:  # not Linux: [[dd-]hh:]mm:ss.ss
        t = subprocess.check_output(["ps", "-o", "time=", "-p", str(pid)], text=True).strip()
        days, _, t = t.rpartition("-")
        return sum(float(p) * 60 ** i for i, p in enumerate(reversed(t.split(":")))) + (
            86400 * int(days or 0))


class Server:
    def __init__(self, root: Path):
        env = {**os.environ, "PYTHONPATH": str(root)}
        self.proc, port = server_process(
            [sys.executable, "-m", "mlx_speech.server", "--model", MODEL, "--diarizer", DIARIZER],
            cwd=root, env=env, stdout=subprocess.DEVNULL)
        self.base, self.ws = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Watch:
    """/health every 20 ms and the server's RSS every 200 ms, from threads."""

    def __init__(self, srv: Server):
        self.srv, self.stop = srv, threading.Event()
        self.lags: list[float] = []
        self.rss: list[float] = []
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self.health, self.mem)]

    def health(self) -> None:
        import httpx

        with httpx.Client(timeout=CLIENT_WAIT_S) as c:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    c.get(self.srv.base + "/health")
                except httpx.HTTPError:
                    pass
                self.lags.append(time.perf_counter() - t0)
                time.sleep(0.02)

    def mem(self) -> None:
        while not self.stop.is_set():
            try:
                self.rss.append(rss_mb(self.srv.proc.pid))
            except (OSError, subprocess.CalledProcessError, StopIteration):
                return
            time.sleep(0.2)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(CLIENT_WAIT_S)


# -- clients -----------------------------------------------------------------------------------
def b64(x: np.ndarray) -> str:
    return base64.b64encode(pcm16(x).tobytes()).decode()


def ev_json(**kw) -> str:
    return json.dumps(kw)


async def connect(srv: Server, query: str = ""):
    import websockets

    ws = await websockets.connect(srv.ws + "/v1/realtime" + query, max_size=None,
                                  open_timeout=CLIENT_WAIT_S)
    await ws.recv()  # session.created
    return ws


async def answer(ws) -> dict:
    """The next event, or {"type": "no answer"} after CLIENT_WAIT_S (a server that took an
    update silently)."""
    try:
        return json.loads(await asyncio.wait_for(ws.recv(), CLIENT_WAIT_S))
    except asyncio.TimeoutError:
        return {"type": "no answer"}


def code_of(ev: dict) -> str:
    """An event as the attacker's tally names it: its type, an error by its code."""
    if ev.get("type") != "error":
        return ev.get("type", "?")
    err = ev.get("error")
    return "error " + str(err.get("code") if isinstance(err, dict) else ev.get("code"))


async def normal_session(srv: Server, audio: np.ndarray) -> float:
    """vLLM's dialect, the audio sent in real time: seconds from its last audio to the
    result."""
    ws = await connect(srv)
    try:
        await ws.send(ev_json(type="session.update", model=MODEL))
        await ws.send(ev_json(type="input_audio_buffer.commit"))
        t_next = time.perf_counter()
        for i in range(0, len(audio), 1600):
            await ws.send(ev_json(type="input_audio_buffer.append", audio=b64(audio[i:i + 1600])))
            t_next += 0.1
            await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
        end = time.perf_counter()
        await ws.send(ev_json(type="input_audio_buffer.commit", final=True))
        while True:
            ev = await answer(ws)
            if ev["type"] == "transcription.done":
                return time.perf_counter() - end
            if ev["type"] in ("error", "no answer"):
                raise RuntimeError(ev)
    finally:
        await ws.close()


async def normal_loop(srv: Server, stop: asyncio.Event) -> tuple[list[float], int]:
    audio = speechlike(2.0, seed=11)
    lags, failed = [], 0
    while not stop.is_set():
        try:
            lags.append(await asyncio.wait_for(normal_session(srv, audio), CLIENT_WAIT_S))
        except Exception:
            failed += 1
            await asyncio.sleep(0.5)
    return lags, failed


def phrases(n: int, chars: int, rng: random.Random) -> list[str]:
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(chars)) for _ in range(n)]


# -- the attacks: each returns what the attacker got back, tallied ------------------------------
async def attack_hotwords(srv: Server, seconds: float, files: dict) -> collections.Counter:
    import httpx

    got: collections.Counter = collections.Counter()
    big = ",".join(f"w{i}" for i in range(40000))
    wav = wav_bytes(speechlike(0.5))
    deadline = time.monotonic() + seconds

    async def one(c):
        r = await c.post(srv.base + "/v1/audio/transcriptions", files={"file": ("a.wav", wav)},
                         data={"model": MODEL, "hotwords": big})
        got[f"REST {r.status_code}"] += 1
        ws = await connect(srv, "?intent=transcription")
        await ws.send(ev_json(type="session.update", session={
            "type": "transcription", "audio": {"input": {"transcription": {
                "model": MODEL, "hotwords": big}}}}))
        got["openai " + code_of(await answer(ws))] += 1
        await ws.close()
        ws = await connect(srv)
        await ws.send(ev_json(type="session.update", model=MODEL, hotwords=big.split(",")))
        got["vllm " + code_of(await answer(ws))] += 1
        await ws.close()

    async def attacker():
        async with httpx.AsyncClient(timeout=CLIENT_WAIT_S) as c:
            while time.monotonic() < deadline:
                await one(c)

    await asyncio.gather(attacker(), attacker())
    return got


async def attack_graph(srv: Server, seconds: float, files: dict) -> collections.Counter:
    got: collections.Counter = collections.Counter()
    deadline = time.monotonic() + seconds
    utterance = b64(speechlike(0.5, seed=3))

    async def giant(rng):  # within the documented phrase limits, past the token bound
        ws = await connect(srv)
        await ws.send(ev_json(type="session.update", model=MODEL, hotwords=phrases(10000, 200,
                                                                                    rng)))
        got["giant " + code_of(await answer(ws))] += 1
        await ws.close()

    async def largest(rng):  # a new list of 90,000 tokens, under the bound, then used
        ws = await connect(srv)
        await ws.send(ev_json(type="session.update", model=MODEL, hotwords=phrases(450, 200, rng)))
        for ev in (ev_json(type="input_audio_buffer.commit"),
                   ev_json(type="input_audio_buffer.append", audio=utterance),
                   ev_json(type="input_audio_buffer.commit", final=True)):
            await ws.send(ev)
        while (ev := await answer(ws))["type"] == "transcription.delta":
            pass
        got["largest " + code_of(ev)] += 1
        await ws.close()

    async def attacker(seed):
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            await giant(rng)
            await largest(rng)

    await asyncio.gather(attacker(1), attacker(2))
    return got


async def attack_churn(srv: Server, seconds: float, files: dict) -> collections.Counter:
    got: collections.Counter = collections.Counter()
    ws = await connect(srv)

    async def reader():
        async for m in ws:
            got[code_of(json.loads(m))] += 1

    tally = asyncio.ensure_future(reader())
    deadline, k = time.monotonic() + seconds, 0
    tiny = b64(speechlike(0.1, seed=4))
    try:
        while time.monotonic() < deadline:
            k += 1
            await ws.send(ev_json(type="session.update", model=MODEL,
                                  hotwords=[f"p{k}x{i}" for i in range(1000)]))
            await ws.send(ev_json(type="input_audio_buffer.commit"))
            await ws.send(ev_json(type="input_audio_buffer.append", audio=tiny))
            await ws.send(ev_json(type="input_audio_buffer.commit", final=True))
            await asyncio.sleep(0.01)
    finally:
        got["utterances sent"] = k
        ws.transport.abort()  # gone, its utterances still queued
        tally.cancel()
    return got


async def attack_buffers(srv: Server, seconds: float, files: dict) -> collections.Counter:
    got: collections.Counter = collections.Counter()
    deadline = time.monotonic() + seconds
    x = speechlike(1.5, seed=3)
    chunk16 = b64(x)
    chunk24 = b64(np.interp(np.arange(int(len(x) * 1.5)) / 1.5, np.arange(len(x)), x))

    async def run(ws, events: list[str], who: str):
        async def reader():
            async for m in ws:
                got[who + " " + code_of(json.loads(m))] += 1

        tally = asyncio.ensure_future(reader())
        sent = 0
        while time.monotonic() < deadline:
            for ev in events:
                await ws.send(ev)
            sent += 1.5
            await asyncio.sleep(0)  # the other attacker and the readers run too
        got[who + " audio sent (s)"] = int(sent)
        ws.transport.abort()
        tally.cancel()

    vllm = await connect(srv)
    await vllm.send(ev_json(type="session.update", model=MODEL))
    openai = await connect(srv, "?intent=transcription")
    await openai.send(ev_json(type="session.update", session={
        "type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm",
                                                                "rate": 24000},
                                                     "transcription": {"model": MODEL}}}}))
    await asyncio.gather(
        run(vllm, [ev_json(type="input_audio_buffer.commit"),
                   ev_json(type="input_audio_buffer.append", audio=chunk16),
                   ev_json(type="input_audio_buffer.commit", final=True)], "vllm"),
        run(openai, [ev_json(type="input_audio_buffer.append", audio=chunk24),
                     ev_json(type="input_audio_buffer.commit")], "openai"))
    return got


async def post_and_leave(srv: Server, data: bytes, wait_s: float, got: collections.Counter,
                         **fields) -> None:
    """POST the upload, waiting for its answer at most `wait_s` (then gone)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=max(0.1, wait_s)) as c:
            r = await c.post(srv.base + "/v1/audio/transcriptions",
                             files={"file": ("long.flac", data)},
                             data={"model": MODEL, **fields})
            err = r.json().get("error") if r.headers.get("content-type", "").startswith(
                "application/json") else None
            got[f"{r.status_code} {err['code'] if err else ''}".strip()] += 1
    except httpx.TimeoutException:
        got["left before the answer"] += 1


async def attack_uploads(srv: Server, seconds: float, files: dict) -> collections.Counter:
    got: collections.Counter = collections.Counter()
    deadline = time.monotonic() + seconds

    async def client():
        while (left := deadline - time.monotonic()) > 0.5:
            await post_and_leave(srv, files["flac"], left, got)

    await asyncio.gather(*(client() for _ in range(8)))
    return got


async def attack_diarization(srv: Server, seconds: float, files: dict) -> collections.Counter:
    got: collections.Counter = collections.Counter()
    await post_and_leave(srv, files["flac"], seconds / 3, got, response_format="diarized_json")
    await asyncio.sleep(seconds * 2 / 3)
    return got


RUN = {"hotwords": attack_hotwords, "graph": attack_graph, "churn": attack_churn,
       "buffers": attack_buffers, "uploads": attack_uploads,
       "diarization": attack_diarization}


# -- the runs ----------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def one_attack(name: str, root: Path, seconds: float, files: dict) -> str:
    srv = Server(root)
    try:
        asyncio.run(normal_session(srv, speechlike(2.0, seed=11)))  # loads and warms the model
        base = rss_mb(srv.proc.pid)

        async def both():
            stop = asyncio.Event()
            normals = asyncio.ensure_future(normal_loop(srv, stop))
            try:
                got = await RUN[name](srv, seconds, files)
            finally:
                stop.set()
            return got, await normals

        with Watch(srv) as w:
            got, (lags, failed) = asyncio.run(both())
        time.sleep(0.5)
        c0 = cpu_s(srv.proc.pid)
        time.sleep(5.0)
        after = cpu_s(srv.proc.pid) - c0
        grow = max(w.rss, default=base) - base
        ok = (pct(w.lags, 95) < 0.1 and max(w.lags, default=0) < 1.0 and lags
              and max(lags) < 5.0 and not failed and grow < LIMIT_MB[name])
        tally = ", ".join(f"{k} x{v}" for k, v in sorted(got.items()))
        return (f"{name:<12} {1e3 * pct(w.lags, 50):6.1f} {1e3 * pct(w.lags, 95):7.1f} "
                f"{1e3 * max(w.lags, default=float('nan')):8.1f} | "
                f"{max(lags, default=float('nan')):6.2f} s {len(lags):3d} {failed:3d} | "
                f"{base:6.0f} {grow:+7.0f} (<{LIMIT_MB[name]}) | {after:5.2f} s | "
                f"{'yes' if ok else 'NO '} | {tally}")
    finally:
        srv.close()


def shutdown(root: Path, files: dict) -> str:
    """Uploads and a realtime socket pending, then SIGTERM."""
    srv = Server(root)
    got: collections.Counter = collections.Counter()

    async def scenario():
        ws = await connect(srv)
        await ws.send(ev_json(type="session.update", model=MODEL))
        await ws.send(ev_json(type="input_audio_buffer.commit"))
        uploads = [asyncio.ensure_future(post_and_leave(srv, files["flac"], CLIENT_WAIT_S, got))
                   for _ in range(4)]
        await asyncio.sleep(2.0)
        t0 = time.perf_counter()
        srv.proc.send_signal(signal.SIGTERM)
        import websockets

        try:
            async for _ in ws:
                pass
        except websockets.exceptions.ConnectionClosed:
            pass
        got[f"socket closed {ws.close_code}"] += 1
        await asyncio.gather(*uploads, return_exceptions=True)
        return t0

    try:
        t0 = asyncio.run(scenario())
        srv.proc.wait(60)
        took = time.perf_counter() - t0
        tally = ", ".join(f"{k} x{v}" for k, v in sorted(got.items()))
        return (f"shutdown     exit {took:.2f} s after SIGTERM (code {srv.proc.returncode}) | "
                f"{tally}")
    finally:
        srv.close()


def silence_flac(seconds: float, rate: int = 48000, channels: int = 2) -> bytes:
    buf = io.BytesIO()
    block = np.zeros((rate * 10, channels), np.float32)
    with sf.SoundFile(buf, "w", rate, channels, "PCM_16", format="FLAC") as f:
        for _ in range(int(seconds // 10)):
            f.write(block)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # the servers started inherit it
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--attacks", default=",".join(ATTACKS),
                   help=f"comma-separated, of {', '.join(ATTACKS)}")
    p.add_argument("--seconds", type=float, default=15.0, help="each attack's length")
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the checkout whose server runs (default: this one)")
    args = p.parse_args(argv)
    names = [a for a in args.attacks.split(",") if a]
    if bad := [a for a in names if a not in ATTACKS]:
        p.error(f"unknown attack {bad[0]!r}; attacks: {', '.join(ATTACKS)}")
    files = {}
    if {"uploads", "diarization", "shutdown"} & set(names):
        files["flac"] = silence_flac(1800.0)
        print(f"the upload: 30 min of 48 kHz stereo silence, FLAC, {len(files['flac'])} bytes")
    print(f"server: {args.root}, model {Path(MODEL).relative_to(ROOT)}, diarizer "
          f"{Path(DIARIZER).relative_to(ROOT)}; each attack {args.seconds:g} s")
    print("attack       /health ms: p50     p95      max | normal: worst  n  failed | "
          "RSS MB: base  growth | CPU after | within | the attacker got")
    for name in names:
        if name == "shutdown":
            print(shutdown(args.root, files), flush=True)
        else:
            print(one_attack(name, args.root, args.seconds, files), flush=True)


if __name__ == "__main__":
    main()
