"""Batched streaming ASR: per-step time vs the number of sessions stepped together.

    python benchmarks/batched_asr.py [--model voxtral|nemotron|nemotron35|both]
        [--config tiny|full-narrow|full] [--sizes 1,2,4,8,16,32] [--steps N] [--warmup N]
        [--dtype float32|bfloat16] [--latency-ms 80|160|320|560|1120] [--long-ticks N]
        [--long-size B] [--blank-bias 4.5]

Writes the random checkpoints of benchmarks/voxtral_realtime.py and
benchmarks/nemotron_streaming.py (`full-narrow`: the real widths with 2 layers)
to a temp dir, then for each batch size B opens B sessions (each its own audio)
and times ticks: one `owner.feed_many` call in which every session gets one
frame (Voxtral: 80 ms, one encoder chunk and one decoder step per session;
Nemotron: one (r+1) x 80 ms block of the latency mode, encoder + RNN-T greedy; Nemotron 3.5
(`nemotron35`): the same plus the language prompt and its 13088-entry joint, the sessions of a
batch in different languages, `auto` among them, 320 ms also a mode),
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

Also printed: the streams that fit one real-time tick (the largest measured B whose median
tick is within the frame's duration, and the estimate frame / per-stream ms at the largest
B), the KV/state memory per stream (now, and for Voxtral at the full decoder and encoder
windows, where a stream's rings stop growing), and with `--long-ticks N` the per-tick time of
`--long-size` streams over a long run (N ticks, reported per tenth: the rings grow, fill and
wrap, so fresh sessions alone understate a long stream's tick). `full` has the real layer
counts (weights drawn with mx.random; a GPU's job: on this CPU check it builds with
`--sizes 1 --steps 1 --warmup 0`).

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

from mlx_speech.models.nemotron_streaming import LATENCY_MS_35  # noqa: E402

SIZES = [1, 2, 4, 8, 16, 32]


def stream_audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    f = rng.uniform(150, 400) + 120 * np.sin(2 * np.pi * rng.uniform(0.3, 1.5) * t)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / 16000)
    return (x + 0.03 * rng.standard_normal(len(t))).astype(np.float32)


def tick_ms(owner, open_session: Callable[[], object], frame_samples: int, n: int,
            steps: int, warmup: int, lead_ticks: int, batched: bool = True,
            keep: list | None = None) -> list[float]:
    """Per-tick wall ms of n sessions each fed one frame per tick.

    The first `lead_ticks + warmup` ticks (prompt prefill, cache warm-up) are
    not timed. `batched=False` steps the same sessions one `feed` at a time.
    `keep`: gets the sessions (to measure their state).
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
    if keep is not None:
        keep.extend(sessions)
    return times


def report_long(run: Callable[[int, bool], list[float]], b: int, ticks: int) -> None:
    """Tick ms of b streams over `ticks` ticks, per tenth of the run."""
    if ticks <= 0:
        return
    t = run(b, True, ticks)
    k = max(1, len(t) // 10)
    parts = [t[i: i + k] for i in range(0, len(t), k)]
    print(f"long run, {b} stream(s), {len(t)} ticks: median tick ms per tenth: "
          + " ".join(f"{statistics.median(p):.1f}" for p in parts)
          + f" | max {max(t):.1f}")


def fit(med: dict[int, float], frame_ms: float) -> str:
    """Streams that fit one real-time tick: measured, and estimated from the largest B."""
    ok = [b for b, m in med.items() if m <= frame_ms]
    top = max(med)
    est = int(frame_ms / (med[top] / top))
    return (f"streams per real-time tick ({frame_ms:.0f} ms): {max(ok) if ok else 0} measured "
            f"(of {sorted(med)}), about {est} estimated from B={top}'s per-stream time")


def mib(n: float) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def report(name: str, run: Callable[..., list[float]], sizes: list[int],
           frame_ms: float) -> dict[int, float]:
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
    print(fit(med, frame_ms))
    return med


def voxtral_memory(vr, s) -> str:
    """A stream's ring caches now, and at the full windows (capacity x layers x K and V)."""
    now = sum(a.nbytes for r in s.dec_cache + s.enc_state.kv for a in r.state)
    c, item = vr.config, vr.model.dtype.size
    d, e = c.decoder, c.encoder
    dec = d.n_layers * 2 * d.n_kv_heads * d.head_dim * s.dec_cache[0].capacity * item
    enc = e.n_layers * 2 * e.n_heads * e.head_dim * s.enc_state.kv[0].capacity * item
    return (f"memory per stream: {mib(now)} of ring caches now; at the full windows "
            f"{mib(dec + enc)} (decoder {d.sliding_window} positions: {mib(dec)}, encoder "
            f"{e.sliding_window} frames: {mib(enc)})")


def bench_voxtral(folder: Path, config: str, dtype: mx.Dtype, sizes: list[int], steps: int,
                  warmup: int, long_ticks: int, long_size: int) -> None:
    import mlx_speech

    enc, dec = vb.CONFIGS[config]["enc"], vb.CONFIGS[config]["dec"]
    vb.write_checkpoint(folder, enc, dec, dtype, seed=0)
    vr = mlx_speech.load(folder)
    lead = vb.N_DELAY + 2  # ticks until the prompt's audio is there
    kept: list = []

    def run(b: int, batched: bool, n: int = steps) -> list[float]:
        kept.clear()
        return tick_ms(vr, lambda: vr.session(vb.DELAY_MS), vb.TOKEN_SAMPLES, b, n,
                       warmup, lead, batched, kept)

    report(f"Voxtral Realtime {config}: encoder {enc['n_layers']}x{enc['dim']}, decoder "
           f"{dec['n_layers']}x{dec['dim']} vocab {dec['vocab_size']}; one 80 ms frame per "
           f"session per tick", run, sizes, 80.0)
    print(voxtral_memory(vr, kept[0]))
    report_long(run, long_size, long_ticks)
    if long_ticks > 0:
        print("after the long run: " + voxtral_memory(vr, kept[0]))


LANGUAGES = ["auto", "en-US", "de-DE", "fr-FR", "es-ES", "ja-JP", "hi-IN", "pt-BR"]


def bench_nemotron(folder: Path, config: str, dtype: mx.Dtype, sizes: list[int], steps: int,
                   warmup: int, latency_ms: int, long_ticks: int, long_size: int,
                   prompted: bool = False, blank_bias: float = 4.5) -> None:
    from mlx_speech.models.nemotron_streaming import load

    nb.write_random_checkpoint(folder, config, None, blank_bias=blank_bias, prompted=prompted)
    nm = load(folder, dtype=dtype)
    frame = (nm.config.latencies()[latency_ms] + 1) * vb.TOKEN_SAMPLES
    kept: list = []
    opened = iter(range(1 << 30))

    def open_session():
        if not prompted:
            return nm.session(latency_ms)
        return nm.session(latency_ms, language=LANGUAGES[next(opened) % len(LANGUAGES)])

    def run(b: int, batched: bool, n: int = steps) -> list[float]:
        kept.clear()
        return tick_ms(nm, open_session, frame, b, n, warmup, 1, batched, kept)

    name = "Nemotron 3.5 (languages mixed in a batch)" if prompted else "Nemotron"
    report(f"{name} {config}: {nb.CONFIGS[config]['layers']} conformer layers x "
           f"{nb.CONFIGS[config]['hidden_size']}, vocab {nm.config.vocab_size}; one "
           f"{latency_ms} ms block per session per tick", run, sizes, frame / 16)
    state = sum(a.nbytes for a in kept[0].enc_state.arrays())
    print(f"memory per stream: {mib(state)} of encoder state (bounded: left context)")
    report_long(run, long_size, long_ticks)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["voxtral", "nemotron", "nemotron35", "both"],
                    default="both", help="both: voxtral and nemotron")
    ap.add_argument("--config", choices=["tiny", "full-narrow", "full"], default="full-narrow")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(vb.DTYPES), default="float32")
    ap.add_argument("--latency-ms", type=int, choices=sorted(LATENCY_MS_35), default=160,
                    help="Nemotron's latency mode (320: Nemotron 3.5 only)")
    ap.add_argument("--long-ticks", type=int, default=0,
                    help="also time --long-size streams over this many ticks (a long stream)")
    ap.add_argument("--long-size", type=int, default=1, help="streams in the long run")
    ap.add_argument("--blank-bias", type=float, default=4.5,
                    help="Nemotron's random joint: the blank logit's bias (random frames are "
                         "alike, so a stream emits max_symbols tokens per frame or none; 8: "
                         "none, the encoder and one joint call per tick)")
    args = ap.parse_args(argv)
    if args.latency_ms not in nb.LATENCY_MS and args.model in ("nemotron", "both"):
        ap.error(f"--latency-ms {args.latency_ms} is a Nemotron 3.5 mode (--model nemotron35)")
    sizes = [int(x) for x in args.sizes.split(",")]
    dtype = vb.DTYPES[args.dtype]
    print(f"Batched streaming ASR | device {mx.default_device()} | mlx {mx.__version__} | "
          f"dtype {args.dtype} | median of {args.steps} ticks after {args.warmup} warm-up")
    with tempfile.TemporaryDirectory(prefix="batched_asr_") as tmp:
        if args.model in ("voxtral", "both"):
            (Path(tmp) / "vr").mkdir()
            bench_voxtral(Path(tmp) / "vr", args.config, dtype, sizes, args.steps, args.warmup,
                          args.long_ticks, args.long_size)
        if args.model in ("nemotron", "both"):
            bench_nemotron(Path(tmp) / "nm", args.config, dtype, sizes, args.steps,
                           args.warmup, args.latency_ms, args.long_ticks, args.long_size,
                           blank_bias=args.blank_bias)
        if args.model == "nemotron35":
            bench_nemotron(Path(tmp) / "nm35", args.config, dtype, sizes, args.steps,
                           args.warmup, args.latency_ms, args.long_ticks, args.long_size,
                           prompted=True, blank_bias=args.blank_bias)


if __name__ == "__main__":
    main()
