"""Per-tick time of the streaming families, this tree against another revision, interleaved
in one process (paired ticks: A's tick, then B's, then B's, then A's...).

    python benchmarks/steps_ab.py [--base main] [--models voxtral,nemotron,sortformer]
        [--config tiny|full-narrow] [--sizes 1,4] [--ticks N] [--warmup N]

The revision `--base` of mlx_speech/ is unpacked (git archive) into a temp folder as the
package `mlx_speech_base`, beside this tree's `mlx_speech`; both load the same random
checkpoint (benchmarks/voxtral_realtime.py, benchmarks/nemotron_streaming.py,
benchmarks/sortformer.py). For each batch size B, B sessions per side each get one frame per
tick (Voxtral: 80 ms; Nemotron: one 160 ms block; Sortformer: one 480 ms chunk) through one
`feed_many` (its text or frames read), the two sides' ticks alternating. Prints per side the
median wall ms and CPU ms (the process's user + system time) per tick after `--warmup`
ticks, and the median of the paired ratios this/base (below 1: this tree is faster). Numbers
only; no assertions.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import batched_asr as ba  # noqa: E402
import nemotron_streaming as nb  # noqa: E402
import sortformer as sb  # noqa: E402
import voxtral_realtime as vb  # noqa: E402

BASE = "mlx_speech_base"


def unpack_base(rev: str, into: Path) -> None:
    """mlx_speech/ at `rev` -> into/mlx_speech_base (its relative imports stay inside it)."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "mlx_speech"],
                         check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    (into / "mlx_speech").rename(into / BASE)
    sys.path.insert(0, str(into))


def tick_pairs(sides, frame: int, n: int, ticks: int) -> list[list[tuple[float, float]]]:
    """(wall ms, cpu ms) per tick of each side's n sessions, the sides' ticks alternating."""
    sessions = [[open_() for _ in range(n)] for _, open_ in sides]
    audios = [ba.stream_audio(ticks * frame / 16000 + 0.1, seed=k) for k in range(n)]
    out: list[list[tuple[float, float]]] = [[] for _ in sides]
    for t in range(ticks):
        order = range(len(sides)) if t % 2 == 0 else reversed(range(len(sides)))
        for i in order:
            owner = sides[i][0]
            pairs = [(s, a[t * frame: (t + 1) * frame])
                     for s, a in zip(sessions[i], audios, strict=True)]
            w0, c0 = time.perf_counter(), time.process_time()
            owner.feed_many(pairs)
            out[i].append(((time.perf_counter() - w0) * 1e3, (time.process_time() - c0) * 1e3))
    return out


def report(name: str, sides, frame: int, sizes: list[int], ticks: int, warmup: int) -> None:
    print(f"\n{name}")
    print(f"{'B':>3} {'this ms':>9} {'base ms':>9} {'wall x':>7} {'this cpu':>9} "
          f"{'base cpu':>9} {'cpu x':>7}")
    for b in sizes:
        this, base = (t[warmup:] for t in tick_pairs(sides, frame, b, warmup + ticks))
        med = [statistics.median(x[k] for x in side) for side in (this, base) for k in (0, 1)]
        ratio = [statistics.median(a[k] / max(c[k], 1e-6) for a, c in zip(this, base,
                                                                           strict=True))
                 for k in (0, 1)]
        print(f"{b:>3} {med[0]:>9.2f} {med[2]:>9.2f} {ratio[0]:>7.3f} {med[1]:>9.2f} "
              f"{med[3]:>9.2f} {ratio[1]:>7.3f}")


def voxtral(pkgs, folder: Path, config: str):
    vb.write_checkpoint(folder, vb.CONFIGS[config]["enc"], vb.CONFIGS[config]["dec"],
                        mx.float32, seed=0)
    sides = []
    for p in pkgs:
        owner = importlib.import_module(f"{p}.models.voxtral_realtime").load(folder)

        def open_(o=owner):
            s = o.session(vb.DELAY_MS)
            s.eos = -1  # random weights may emit EOS; a timed stream never ends
            return s

        sides.append((owner, open_))
    return sides, vb.TOKEN_SAMPLES


def nemotron(pkgs, folder: Path, config: str):
    nb.write_random_checkpoint(folder, config, None, blank_bias=4.5)
    sides = []
    for p in pkgs:
        owner = importlib.import_module(f"{p}.models.nemotron_streaming").load(folder)
        sides.append((owner, lambda o=owner: o.session(160)))
    return sides, 2 * vb.TOKEN_SAMPLES


def sortformer(pkgs, folder: Path, config: str):
    from mlx.utils import tree_flatten

    params = None
    sides = []
    for p in pkgs:
        cfg_mod = importlib.import_module(f"{p}.models.sortformer.config")
        model_mod = importlib.import_module(f"{p}.models.sortformer.model")
        cfg = cfg_mod.SortformerConfig(**sb.CONFIGS[config], **sb.STREAMING).check()
        model = model_mod.Sortformer(cfg)
        if params is None:
            rng = np.random.default_rng(0)
            params = [(k, mx.array(rng.normal(0, 0.5 / np.sqrt(v.shape[-1]), v.shape)
                                   .astype(np.float32)) if v.ndim > 1 else v)
                      for k, v in tree_flatten(model.parameters())]
        model.load_weights(params)
        mx.eval(model.parameters())
        owner = importlib.import_module(f"{p}.models.sortformer").SortformerDiarizer(model, cfg)
        sides.append((owner, lambda o=owner: o.session()))
    return sides, sb.TICK


FAMILIES = {"voxtral": voxtral, "nemotron": nemotron, "sortformer": sortformer}


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="the git revision to compare against")
    ap.add_argument("--models", default=",".join(FAMILIES))
    ap.add_argument("--config", choices=["tiny", "full-narrow"], default="tiny")
    ap.add_argument("--sizes", default="1,4")
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=12)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="steps_ab_") as tmp:
        unpack_base(args.base, Path(tmp) / "pkg")
        pkgs = ["mlx_speech", BASE]
        print(f"this tree vs {args.base} | device {mx.default_device()} | mlx {mx.__version__} | "
              f"{args.config} | median of {args.ticks} paired ticks after {args.warmup}")
        for name in args.models.split(","):
            (Path(tmp) / name).mkdir()
            sides, frame = FAMILIES[name](pkgs, Path(tmp) / name, args.config)
            report(f"{name} {args.config}", sides, frame, sizes, args.ticks, args.warmup)


if __name__ == "__main__":
    main()
