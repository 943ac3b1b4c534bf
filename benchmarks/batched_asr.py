"""Batched streaming ASR: per-step time vs the number of sessions stepped together.

    python benchmarks/batched_asr.py [--model voxtral|nemotron|both]
        [--config tiny|full-narrow] [--sizes 1,2,4,8,16,32] [--steps N] [--warmup N]
        [--dtype float32|bfloat16] [--latency-ms 80|160|560|1120]

Writes the random checkpoints of benchmarks/voxtral_realtime.py and
benchmarks/nemotron_streaming.py (`full-narrow`: the real widths with 2 layers)
to a temp dir, then for each batch size B opens B sessions (each its own audio)
and times ticks: one `owner.feed_many` call in which every session gets one
frame (Voxtral: 80 ms, one encoder chunk and one decoder step per session;
Nemotron: one (r+1) x 80 ms block of the latency mode, encoder + RNN-T greedy),
synced (the text is read). Prints the median tick ms after the prompt and
`--warmup` ticks, per-stream ms, and the ratios "8 batched streams / 1 stream"
(target <= 2.5x) and "8 batched / 8 sequential" (the same 8 sessions stepped one
`feed` at a time, as without batching). Numbers only; no assertions.

The "<= 2.5x" target assumes a step bound by reading the weights (Metal, CUDA):
B rows then cost little more than one. The Linux CPU wheel of MLX runs fp32
matmuls on the bundled reference (netlib) BLAS, which reads W once per row, so
an fp32 (8, d) @ W costs 8x a (1, d) @ W and a batched fp32 tick at real widths
costs about B single ticks (bf16 goes through MLX's own kernels: about 0.5x per
row batched); benchmarks/batched_asr_profile.py splits this per component. The
tiny config shows the per-step overhead that batching removes.

`tick_ms(owner, open_session, frame_samples, n, steps, warmup, batched)` is
importable (benchmarks/server.py reuses it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import nemotron_streaming as nb  # noqa: E402
import voxtral_realtime as vb  # noqa: E402

SIZES = [1, 2, 4, 8, 16, 32]


def stream_audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    f = rng.uniform(150, 400) + 120 * np.sin(2 * np.pi * rng.uniform(0.3, 1.5) * t)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / 16000)
    return (x + 0.03 * rng.standard_normal(len(t))).astype(np.float32)


def tick_ms(owner, open_session: Callable[[], object], frame_samples: int, n: int,
            steps: int, warmup: int, lead_ticks: int, batched: bool = True) -> list[float]:
    """Per-tick wall ms of n sessions each fed one frame per tick.

    The first `lead_ticks + warmup` ticks (prompt prefill, cache warm-up) are
    not timed. `batched=False` steps the same sessions one `feed` at a time.
    """
    ticks = lead_ticks + warmup + steps
    sessions = [open_session() for _ in range(n)]
    audios = [stream_audio(ticks * frame_samples / 16000 + 0.1, seed=k) for k in range(n)]
    times = []
    for t in range(ticks):
        pairs = [(s, a[t * frame_samples: (t + 1) * frame_samples])
                 for s, a in zip(sessions, audios, strict=True)]
        t0 = time.perf_counter()
        if batched:
            owner.feed_many(pairs)
        else:
            for s, c in pairs:
                s.feed(c)
        if t >= lead_ticks + warmup:
            times.append((time.perf_counter() - t0) * 1000)
    for s in sessions:
        s.finished = True  # no flush needed; the sessions are dropped
    return times


def report(name: str, run: Callable[[int, bool], list[float]], sizes: list[int]) -> None:
    """Median and min tick ms per batch size (min: least disturbed by a shared CPU)."""
    print(f"\n{name}")
    print(f"{'B':>4} {'median ms':>10} {'min ms':>10} {'min/stream':>10} {'min x B=1':>10}")
    med, low = {}, {}
    for b in sizes:
        t = run(b, True)
        med[b], low[b] = statistics.median(t), min(t)
        print(f"{b:>4} {med[b]:>10.2f} {low[b]:>10.2f} {low[b] / b:>10.2f} "
              f"{low[b] / low[sizes[0]]:>10.2f}")
    if 8 in med and 1 in med:
        t = run(8, False)
        seq, seq_low = statistics.median(t), min(t)
        print(f"8 batched / 1 stream:      {med[8] / med[1]:.2f}x median, "
              f"{low[8] / low[1]:.2f}x min  (target <= 2.5x)")
        print(f"8 batched / 8 sequential:  {med[8] / seq:.2f}x median, {low[8] / seq_low:.2f}x "
              f"min  ({low[8]:.1f} ms vs {seq_low:.1f} ms per tick, min)")


def bench_voxtral(folder: Path, config: str, dtype: mx.Dtype, sizes: list[int], steps: int,
                  warmup: int) -> None:
    import mlx_speech

    enc, dec = vb.CONFIGS[config]["enc"], vb.CONFIGS[config]["dec"]
    vb.write_checkpoint(folder, enc, dec, dtype, seed=0)
    vr = mlx_speech.load(folder)
    lead = vb.N_DELAY + 2  # ticks until the prompt's audio is there

    def run(b: int, batched: bool) -> list[float]:
        return tick_ms(vr, lambda: vr.session(vb.DELAY_MS), vb.TOKEN_SAMPLES, b, steps,
                       warmup, lead, batched)

    report(f"Voxtral Realtime {config}: encoder {enc['n_layers']}x{enc['dim']}, decoder "
           f"{dec['n_layers']}x{dec['dim']} vocab {dec['vocab_size']}; one 80 ms frame per "
           f"session per tick", run, sizes)


def bench_nemotron(folder: Path, config: str, dtype: mx.Dtype, sizes: list[int], steps: int,
                   warmup: int, latency_ms: int) -> None:
    from mlx_speech.models.nemotron_streaming import load

    nb.write_random_checkpoint(folder, config, None, blank_bias=4.5)
    nm = load(folder, dtype=dtype)
    frame = (nb.LATENCY_MS[latency_ms] + 1) * vb.TOKEN_SAMPLES

    def run(b: int, batched: bool) -> list[float]:
        return tick_ms(nm, lambda: nm.session(latency_ms), frame, b, steps, warmup, 1, batched)

    report(f"Nemotron {config}: {nb.CONFIGS[config]['layers']} conformer layers x "
           f"{nb.CONFIGS[config]['hidden_size']}; one {latency_ms} ms block per session per "
           f"tick", run, sizes)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["voxtral", "nemotron", "both"], default="both")
    ap.add_argument("--config", choices=["tiny", "full-narrow"], default="full-narrow")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(vb.DTYPES), default="float32")
    ap.add_argument("--latency-ms", type=int, choices=sorted(nb.LATENCY_MS), default=160)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    dtype = vb.DTYPES[args.dtype]
    print(f"Batched streaming ASR | device {mx.default_device()} | mlx {mx.__version__} | "
          f"dtype {args.dtype} | median of {args.steps} ticks after {args.warmup} warm-up")
    with tempfile.TemporaryDirectory(prefix="batched_asr_") as tmp:
        if args.model in ("voxtral", "both"):
            (Path(tmp) / "vr").mkdir()
            bench_voxtral(Path(tmp) / "vr", args.config, dtype, sizes, args.steps, args.warmup)
        if args.model in ("nemotron", "both"):
            bench_nemotron(Path(tmp) / "nm", args.config, dtype, sizes, args.steps,
                           args.warmup, args.latency_ms)


if __name__ == "__main__":
    main()
