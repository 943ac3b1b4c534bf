"""The server engine's CPU time per tick: this tree's engine against another commit's, in one
process, interleaved.

    python benchmarks/engine.py [--against main] [--ticks 40] [--repeats 7]

The other commit's `mlx_speech` is extracted with `git archive` into a temporary folder and
imported as a package of its own, so both engines step the same loaded models on the same
thread (no engine thread: the benchmark calls each tick itself, `step()` here, the old
`_tick()` before it had a public name). Each block opens fresh streams, steps a few warm-up
ticks, then times `--ticks` ticks, every stream getting one 80 ms frame before each; blocks
alternate old, new, old, new... so load from other processes hits both alike. Scenarios:

* `bookkeeping`: 64 transcription streams of a model that does no work (numpy only): the
  engine's own cost per tick (grouping, queues, events);
* `asr`: 8 streams of the tiny Nemotron checkpoint (tests/golden/nemotron), batched;
* `diarizer`: 4 diarizer streams of the tiny Sortformer (tests/golden/sortformer), fed 480 ms
  per tick (its chunk); the old engine ran them through its ASR-stream wrapper.

Prints, per scenario, the median over blocks of CPU ms per tick (process time, every thread)
and wall ms per tick, and the ratio new / old (below 1: this tree is cheaper). Numbers only.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlx_speech  # noqa: E402
from mlx_speech.server import engine as new_engine  # noqa: E402
from mlx_speech.server import jobs as new_jobs  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"


def load_ref(ref: str, into: Path):
    """`ref`'s mlx_speech as the package `mlx_speech_ref` (its server.engine module)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "mlx_speech"],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    (into / "mlx_speech").rename(into / "mlx_speech_ref")
    sys.path.insert(0, str(into))
    return importlib.import_module("mlx_speech_ref.server.engine")


class NoWork:
    """A transcription model that does nothing: the engine's own cost shows."""

    sample_rate = 16000

    class Session:
        lp = None  # keeps no logprobs

        def result(self):
            return None

    def session(self):
        return self.Session()

    def feed_many(self, pairs):
        return ["" for _ in pairs]

    def finish_many(self, sessions):
        return ["" for _ in sessions]


class Old:
    """The engine before the job protocol: open_asr, _tick; a diarizer behind its wrapper."""

    def __init__(self, module):
        self.m = module
        self.diarization = importlib.import_module(module.__package__ + ".diarization")

    def engine(self):
        return self.m.Engine()

    def open(self, eng, model, diarizer: bool):
        if diarizer:
            owner = self.diarization.owner_for(model)
            return eng.open_asr(owner, owner.session, lambda ev: None)
        return eng.open_asr(model, model.session, lambda ev: None)

    def tick(self, eng):
        eng._tick()


class New:
    def engine(self):
        return new_engine.Engine()

    def open(self, eng, model, diarizer: bool):
        if diarizer:
            return eng.submit(new_jobs.DiarizerStream(model, lambda ev: None))
        return eng.submit(new_jobs.AsrStream(model, model.session, lambda ev: None))

    def tick(self, eng):
        eng.step()


def block(impl, model, n: int, frame: int, ticks: int, diarizer: bool,
          warmup: int = 3) -> tuple[float, float]:
    """(CPU ms, wall ms) per tick over `ticks` ticks of `n` fresh streams."""
    rng = np.random.default_rng(0)
    eng = impl.engine()
    streams = [impl.open(eng, model, diarizer) for _ in range(n)]
    x = (0.1 * rng.standard_normal(frame)).astype(np.float32)
    cpu = wall = 0.0
    for k in range(warmup + ticks):
        for s in streams:
            s.push(x)
        c0, w0 = time.process_time(), time.perf_counter()
        impl.tick(eng)
        if k >= warmup:
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
    for s in streams:
        s.close()
    impl.tick(eng)
    return 1e3 * cpu / ticks, 1e3 * wall / ticks


def main(argv=None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="main", help="the commit to compare with")
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--scenarios", default="bookkeeping,asr,diarizer")
    args = ap.parse_args(argv)
    import mlx.core as mx

    here = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    print(f"Engine CPU per tick: this tree ({here}, uncommitted changes included) vs "
          f"{args.against} | device {mx.default_device()} | mlx {mx.__version__} | "
          f"{args.ticks} ticks a block, {args.repeats} blocks each, interleaved")
    scenarios = {
        "bookkeeping": (lambda: NoWork(), 64, 1280, False),
        "asr": (lambda: mlx_speech.load(GOLDEN / "nemotron"), 8, 1280, False),
        "diarizer": (lambda: mlx_speech.load(GOLDEN / "sortformer" / "tiny.nemo"), 4, 7680,
                     True),
    }
    with tempfile.TemporaryDirectory() as d:
        impls = {"old": Old(load_ref(args.against, Path(d))), "new": New()}
        for name in args.scenarios.split(","):
            make, n, frame, diarizer = scenarios[name]
            model = make()
            out: dict[str, list] = {"old": [], "new": []}
            for r in range(args.repeats):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for k in order:
                    out[k].append(block(impls[k], model, n, frame, args.ticks, diarizer))
            med = {k: [statistics.median(v[i] for v in out[k]) for i in (0, 1)] for k in out}
            print(f"  {name:<12} {n:>2} streams | CPU ms/tick old {med['old'][0]:8.3f} new "
                  f"{med['new'][0]:8.3f} ratio {med['new'][0] / med['old'][0]:5.3f} | wall "
                  f"ms/tick old {med['old'][1]:8.3f} new {med['new'][1]:8.3f} ratio "
                  f"{med['new'][1] / med['old'][1]:5.3f}", flush=True)


if __name__ == "__main__":
    main()
