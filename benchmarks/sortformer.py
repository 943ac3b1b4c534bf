"""Streaming Sortformer diarization cost: ms per 80 ms of audio, 1..32 batched streams, beside
the Nemotron ASR step on the same streams (what `--diarize` adds to live transcription).

    python benchmarks/sortformer.py [--config tiny|full-narrow|full] [--layers N]
        [--sizes 1,2,4,8,16,32] [--chunks N] [--warmup N] [--dtype float32|bfloat16]
        [--no-asr]

Builds random-weight checkpoints in memory: the diarizer with the released model's streaming
setup for 1.04 s latency (chunk 6 frames, right context 7, FIFO 188, cache 188, update period
144; the model card's low-latency row) and `--config` widths (`full`: 17 conformer layers x 512,
18 transformer layers x 192, 117 M parameters; `full-narrow`: the real widths, `--layers`
conformer and transformer layers, default 2, so it runs on a small CPU; `tiny`: 2 x 32). For
each batch size B, B sessions each get 480 ms of audio per tick (one diarizer chunk) through
one `feed_many`; ticks are timed after `--warmup` ticks. Every step has the same shapes from
the first chunk on (the cache and FIFO are fixed buffers, masked while they fill), so the
network costs the same before and after they fill; the host-side cache compression, which
starts once they are full, is small beside it. Prints the median
ms per tick, per 80 ms of audio per stream, and, beside it, the same for a Nemotron ASR of the
matching `--config` (benchmarks/nemotron_streaming.py's random checkpoint, 560 ms latency
blocks, fed the same audio). Numbers only; no assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

STREAMING = dict(chunk_len=6, chunk_right_context=7, chunk_left_context=1, fifo_len=188,
                 spkcache_len=188, spkcache_update_period=144)
CONFIGS = {
    "tiny": dict(d_model=32, n_heads=4, ff_hidden=64, subsampling_channels=8, n_layers=2,
                 tf_d_model=16, tf_heads=2, tf_ff_hidden=32, tf_layers=2),
    "full-narrow": dict(d_model=512, n_heads=8, ff_hidden=2048, subsampling_channels=256,
                        n_layers=2, tf_d_model=192, tf_heads=8, tf_ff_hidden=768, tf_layers=2),
    "full": dict(d_model=512, n_heads=8, ff_hidden=2048, subsampling_channels=256,
                 n_layers=17, tf_d_model=192, tf_heads=8, tf_ff_hidden=768, tf_layers=18),
}
TICK = 6 * 1280  # samples: one 480 ms diarizer chunk


def random_diarizer(config: str, layers: int | None, dtype):
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten, tree_unflatten

    from mlx_speech.models.sortformer import SortformerDiarizer
    from mlx_speech.models.sortformer.config import SortformerConfig
    from mlx_speech.models.sortformer.model import Sortformer

    kw = dict(CONFIGS[config])
    if layers:
        kw["n_layers"] = kw["tf_layers"] = layers
    cfg = SortformerConfig(**kw, **STREAMING).check()
    model = Sortformer(cfg)
    rng = np.random.default_rng(0)
    params = [(k, mx.array(rng.normal(0, 0.5 / np.sqrt(v.shape[-1]), v.shape).astype(np.float32))
               if v.ndim > 1 else v) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return SortformerDiarizer(model, cfg)


def stream_audio(seconds: float, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    f = rng.uniform(150, 400) + 120 * np.sin(2 * np.pi * rng.uniform(0.3, 1.5) * t)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / 16000) * (np.sin(2 * np.pi * 0.2 * t) > -0.3)
    return (x + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def tick_ms(owner, open_session, n: int, ticks: int, skip: int) -> list[float]:
    sessions = [open_session() for _ in range(n)]
    audios = [stream_audio(ticks * TICK / 16000 + 0.1, seed=k) for k in range(n)]
    times = []
    for t in range(ticks):
        pairs = [(s, a[t * TICK: (t + 1) * TICK]) for s, a in zip(sessions, audios, strict=True)]
        t0 = time.perf_counter()
        owner.feed_many(pairs)
        if t >= skip:
            times.append((time.perf_counter() - t0) * 1000)
    return times


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=sorted(CONFIGS), default="full-narrow")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--sizes", default="1,2,4,8,16,32")
    p.add_argument("--chunks", type=int, default=3, help="timed ticks per batch size")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--no-asr", action="store_true", help="skip the Nemotron ASR column")
    args = p.parse_args()

    import mlx.core as mx

    dtype = getattr(mx, args.dtype)
    sizes = [int(s) for s in args.sizes.split(",")]
    diar = random_diarizer(args.config, args.layers, dtype)
    skip = args.warmup + 2  # the first tick has no chunk yet (right context); then warm-up
    asr = None
    if not args.no_asr:
        import nemotron_streaming as nb

        from mlx_speech.models.nemotron_streaming import load

        folder = Path(tempfile.mkdtemp(prefix="sortformer-bench-"))
        name = args.config if args.config in nb.CONFIGS else "tiny"
        nb.write_random_checkpoint(folder, name, args.layers, blank_bias=8.0)
        asr = load(folder, dtype=dtype)
    c = diar.config
    print(f"diarizer {args.config}: {c.n_layers} conformer x {c.d_model}, {c.tf_layers} "
          f"transformer x {c.tf_d_model}, {args.dtype}; chunk {c.chunk_len} frames (480 ms) "
          f"+ right context {c.chunk_right_context}, FIFO {c.fifo_len}, cache {c.spkcache_len}")
    head = f"{'B':>4} {'diar ms/tick':>13} {'diar ms/80ms':>13}"
    if asr is not None:
        head += f" {'asr ms/tick':>12} {'asr ms/80ms':>12} {'diar/asr':>9}"
    print(head)
    for b in sizes:
        d = statistics.median(tick_ms(diar, diar.session, b, skip + args.chunks, skip))
        row = f"{b:>4} {d:>13.1f} {d / 6 / b:>13.2f}"
        if asr is not None:
            a = statistics.median(tick_ms(asr, lambda: asr.session(560), b,
                                          2 + args.chunks, 2))
            row += f" {a:>12.1f} {a / 6 / b:>12.2f} {d / a:>9.2f}"
        print(row, flush=True)
    print("ms/80ms: per stream and per 80 ms of audio (tick / 6 / B)")


if __name__ == "__main__":
    main()
