"""The menu-bar app's latency and idle cost, measured through `mlx_speech.app --simulate`.

    python benchmarks/app.py [--asr tiny,full-narrow] [--tts tiny,mid] [--runs 3]

Runs the real core, engine, library and audio devices against a private PulseAudio (the
test fixture's daemon: a FIFO-fed microphone, a null-sink speaker) and prints numbers only:

* release -> inserted: from writing "release dictate" (after 2 s of speech fed in real
  time) to reading the "inserted" event (or, when the random model heard no text, the
  return to idle): the 40 ms release debounce, closing the microphone, decoding the audio
  still queued, `finish()` and the insertion;
* hotkey -> first audio: from "press speak" to the "speaking" event (the first chunk is in
  the speaker's queue); warm (model loaded; the cold first press is printed apart) and
  press -> spoken (the whole utterance played);
* peers, in this process on the same checkpoints: the library's `transcribe()` of the same
  2 s of audio, and the first chunk of `stream()`; the ratios show the app's overhead;
* idle CPU (% of one core over 5 s) and resident memory of the app process with no model
  and with the model(s) loaded; a bare `python -c "import mlx.core"` is the memory baseline.

Checkpoints are random: `tiny` = the tests' golden checkpoints; `full-narrow` = Voxtral
Realtime's real widths with 2+2 layers (benchmarks/voxtral_realtime.py); `mid` = a
768-wide Voxtral TTS (benchmarks/voxtral_tts.py, needs mlx-audio to build it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tests.app.helpers_sim import Sim  # noqa: E402
from tests.conftest import make_voxtral_checkpoint, speechlike  # noqa: E402

TEXT = "The quarterly numbers are in, and they look better than we feared."


# ---------------------------------------------------------------- checkpoints
def asr_checkpoint(name: str, tmp: Path) -> Path:
    if name == "tiny":
        return make_voxtral_checkpoint(tmp / "asr-tiny")
    import mlx.core as mx
    import voxtral_realtime as vrb

    c = vrb.CONFIGS[name]
    folder = tmp / f"asr-{name}"
    folder.mkdir()
    vrb.write_checkpoint(folder, dict(c["enc"]), dict(c["dec"]), mx.float32, seed=0)
    return folder


def tts_checkpoint(name: str, tmp: Path) -> tuple[Path, str]:
    if name == "tiny":
        return ROOT / "tests" / "golden" / "voxtral_tts" / "ckpt", "neutral_female"
    import mlx.core as mx
    import voxtral_tts as vtb

    folder = tmp / f"tts-{name}"
    folder.mkdir()
    vtb.build_checkpoint(vtb.CONFIGS[name], folder, mx.float32)
    return folder, "v"


# ---------------------------------------------------------------- process measurements
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def idle_cost(pid: int, seconds: float = 5.0) -> tuple[float, float]:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0), rss_mb(pid)


def baseline_rss() -> float:
    code = "import mlx.core, os; print(open('/proc/self/status').read())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    return next(int(x.split()[1]) / 1024 for x in out.splitlines() if x.startswith("VmRSS"))


def is_state(*names):
    return lambda e: e["event"] == "state" and e["state"] in names


# ---------------------------------------------------------------- scenarios
def dictation(pulse, folder: Path, runs: int) -> dict:
    sim = Sim(["--asr-model", folder], pulse.env)
    try:
        sim.until(lambda e: is_state("idle")(e) and any(
            x.get("state") == "loading" for x in sim.events), timeout=600)
        cpu, mem = idle_cost(sim.proc.pid)
        lat, how = [], []
        for r in range(runs):
            audio = speechlike(2.0, seed=r)
            sim.send("press dictate")
            sim.until(is_state("listening"))
            feed = pulse.feed_mic(np.concatenate([audio, np.zeros(24000, np.float32)]))
            deadline = time.monotonic() + 30
            while feed.sent < len(audio):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the microphone feed stalled ({feed.sent} samples)")
                feed.wait(0.005)
            t = time.monotonic()
            sim.send("release dictate")
            ev = sim.until(lambda e: e["event"] == "inserted" or is_state("idle", "error")(e),
                           timeout=600)
            lat.append(ev["recv"] - t)
            how.append(ev.get("how", "nothing heard"))
            if ev["event"] == "inserted":
                sim.until(is_state("idle", "error"), timeout=600)
            feed.close()
        return {"idle_cpu": cpu, "idle_mb": mem, "release_ms": [1000 * x for x in lat],
                "how": how}
    finally:
        sim.quit(timeout=120)


def speak(pulse, folder: Path, voice: str, runs: int) -> dict:
    sim = Sim(["--tts-model", folder, "--voice", voice, "--no-preload", "--max-frames", "40"],
              pulse.env)
    try:
        sim.until(is_state("idle"))
        cpu0, mem0 = idle_cost(sim.proc.pid)
        sim.send(f"select {TEXT}")
        first, whole = [], []
        for _ in range(runs + 1):
            t = time.monotonic()
            sim.send("press speak", "release speak")
            ev = sim.until(lambda e: e["event"] in ("speaking", "error"), timeout=600)
            first.append(ev["recv"] - t)
            done = sim.until(lambda e: e["event"] == "spoken", timeout=600)
            whole.append((done["recv"] - t, done["seconds"]))
            sim.until(is_state("idle", "error"), timeout=600)
        cpu1, mem1 = idle_cost(sim.proc.pid)
        return {"idle_cpu_no_model": cpu0, "idle_mb_no_model": mem0, "idle_cpu": cpu1,
                "idle_mb": mem1, "cold_first_ms": 1000 * first[0],
                "first_ms": [1000 * x for x in first[1:]], "whole": whole[1:]}
    finally:
        sim.quit(timeout=120)


def library_asr(folder: Path, runs: int) -> float:
    """The peer: the library alone, in this process, on the same audio: seconds for
    `transcribe()` of 2 s (all the work the app spreads over the recording and the release)."""
    import mlx_speech

    m = mlx_speech.load(folder)
    times = []
    for r in range(runs):
        t = time.perf_counter()
        m.transcribe(speechlike(2.0, seed=r), 16000)
        times.append(time.perf_counter() - t)
    return med(times)


def library_tts_first(folder: Path, voice: str, runs: int) -> float:
    """The peer: seconds to the first chunk of `stream()` in this process (warm)."""
    import mlx_speech

    tts = mlx_speech.load(folder)
    times = []
    for _ in range(runs + 1):
        t = time.perf_counter()
        it = tts.stream(TEXT, voice=voice, max_frames=40)
        next(it)
        times.append(time.perf_counter() - t)
        it.close()
    return med(times[1:])


def med(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def log(msg: str) -> None:
    print(msg, flush=True)


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--asr", default="tiny,full-narrow")
    ap.add_argument("--tts", default="tiny,mid")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from tests.support.pulse import Pulse, _skip_reason

    reason = _skip_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        pulse = Pulse(tmp / "pulse")
        pulse.start()
        try:
            log(f"baseline: python + import mlx.core: {baseline_rss():.0f} MB resident")
            for name in filter(None, args.asr.split(",")):
                folder = asr_checkpoint(name, tmp)
                r = dictation(pulse, folder, args.runs)
                log(f"dictation, Voxtral Realtime {name}: release -> inserted median "
                      f"{med(r['release_ms']):.0f} ms (runs: "
                      + ", ".join(f"{x:.0f} ms {h}" for x, h in zip(r["release_ms"], r["how"],
                                                                    strict=True))
                      + f"); idle with the model loaded: {r['idle_cpu']:.1f}% CPU, "
                      f"{r['idle_mb']:.0f} MB")
                peer = library_asr(folder, args.runs)
                log(f"  peer: the library's transcribe() of the same 2 s in-process "
                    f"{1000 * peer:.0f} ms; app release -> inserted / that = "
                    f"{med(r['release_ms']) / (1000 * peer):.2f}")
            for name in filter(None, args.tts.split(",")):
                folder, voice = tts_checkpoint(name, tmp)
                r = speak(pulse, folder, voice, args.runs)
                whole = ", ".join(f"{w:.2f} s for {s:.2f} s of audio" for w, s in r["whole"])
                log(f"speak selection, Voxtral TTS {name}: hotkey -> first audio median "
                      f"{med(r['first_ms']):.0f} ms warm ({r['cold_first_ms']:.0f} ms cold, "
                      f"incl. the load); press -> spoken: {whole}")
                peer = library_tts_first(folder, voice, args.runs)
                log(f"  peer: the library's stream() first chunk in-process {1000 * peer:.0f} ms;"
                    f" app hotkey -> first audio / that = {med(r['first_ms']) / (1000 * peer):.2f}")
                log(f"  idle: no model {r['idle_cpu_no_model']:.1f}% CPU, "
                      f"{r['idle_mb_no_model']:.0f} MB; TTS model loaded {r['idle_cpu']:.1f}% "
                      f"CPU, {r['idle_mb']:.0f} MB")
        finally:
            pulse.stop()


if __name__ == "__main__":
    main()
