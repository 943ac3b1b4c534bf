"""Where a batched Voxtral Realtime tick spends its time: components at B=1 x8
sequential vs B=8 batched, plus bare `x @ W.T` at the real widths.

    python benchmarks/batched_asr_profile.py [--config tiny|full-narrow|full]
        [--dtype float32|bfloat16] [--reps N] [--no-matmul]

Each component is evaluated on its own (`mx.eval` boundaries here only, never in
library code): encoder chunk (8 mel frames), decoder layers (one position), the
decoder ring mask, the tied LM head and its argmax. "8 x B=1" is the same work
for 8 streams one at a time, each on its own ring caches. Numbers only.

Found with it (MLX 0.32 CPU wheel, Linux): the batched tick costs what the 8
single ticks cost, because fp32 matmuls go to the wheel's bundled reference
BLAS, where (8, d) @ W.T streams W once per row (no reuse: 1.0x the 8 single
calls); bf16 uses MLX's own GEMM, where 8 rows cost ~0.54x of 8 single calls.
"""

from __future__ import annotations

import argparse
import os
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

from mlx_speech.models.voxtral_realtime.config import MEL_PER_TOKEN  # noqa: E402
from mlx_speech.models.voxtral_realtime.model import EncoderState  # noqa: E402
from mlx_speech.nn import ConvCache, RingBatch  # noqa: E402


def best_ms(f, reps: int) -> float:
    f()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        out.append((time.perf_counter() - t0) * 1000)
    return min(out)


def matmuls(reps: int) -> None:
    print("\nbare x @ W.T, ms (min): 8 x (1, d) one eval each | (8, d) | ratio batched/seq")
    shapes = [(1280, 5120), (3072, 4096), (3072, 9216), (3072, 131072)]
    for dt in (mx.float32, mx.bfloat16):
        for din, dout in shapes:
            w = mx.random.normal((dout, din)).astype(dt)
            x8 = mx.random.normal((8, din)).astype(dt)
            mx.eval(w, x8)
            xs = [x8[i: i + 1] for i in range(8)]
            seq = best_ms(lambda w=w, xs=xs: [mx.eval(x @ w.T) for x in xs], reps)
            bat = best_ms(lambda w=w, x8=x8: mx.eval(x8 @ w.T), reps)
            print(f"  {str(dt):14} {din:>5}x{dout:<6} seq {seq:9.1f}  batch {bat:9.1f}  "
                  f"{bat / seq:5.2f}x")


def components(folder: Path, config: str, dtype: mx.Dtype, reps: int, fill: int) -> None:
    import mlx_speech

    enc, dec = vb.CONFIGS[config]["enc"], vb.CONFIGS[config]["dec"]
    vb.write_checkpoint(folder, enc, dec, dtype, seed=0)
    vr = mlx_speech.load(folder)
    m = vr.model
    sessions = [vr.session(vb.DELAY_MS) for _ in range(8)]
    rng = np.random.default_rng(0)
    n_mels = m.config.encoder.n_mels
    mel = mx.array(rng.standard_normal((8, MEL_PER_TOKEN, n_mels)).astype(np.float32))
    D = m.config.decoder.dim
    # fill every decoder ring to `fill` positions, each row on its own home
    for s in sessions:
        caches = [RingBatch.gather([c]) for c in s.dec_cache]
        h = m.hidden(mx.zeros((1, fill), mx.int32), mx.zeros((1, fill, D), m.dtype),
                     s.ffn_scales, caches)
        mx.eval(h, [a for c in caches for a in c.state])
    tok = mx.zeros((8, 1), mx.int32)
    aud = mx.array(rng.standard_normal((8, 1, D)).astype(np.float32)).astype(m.dtype)
    scales = sessions[0].ffn_scales

    def enc_kv(idx):
        return [RingBatch.gather([sessions[i].enc_state.kv[j] for i in idx])
                for j in range(len(sessions[0].enc_state.kv))]

    def dec_kv(idx):
        return [RingBatch.gather([sessions[i].dec_cache[j] for i in idx])
                for j in range(len(m.layers))]

    def rewind(caches, n):  # undo the clocks so every rep does the same work
        for c in caches:
            for r in c.rows:
                r.offset -= n

    def enc_step(idx, kv):
        x = m.embed_audio(mel[mx.array(idx)], EncoderState([ConvCache(), ConvCache()], kv))
        mx.eval(x, [a for c in kv for a in c.state])
        rewind(kv, x.shape[1] * m.config.audio.downsample)

    def dec_step(idx, kv):
        sl = mx.array(idx)
        h = m.hidden(tok[sl], aud[sl], scales, kv)
        mx.eval(h, [a for c in kv for a in c.state])
        rewind(kv, 1)

    one, all8 = [[i] for i in range(8)], list(range(8))
    h8 = mx.random.normal((8, D)).astype(m.dtype)
    mx.eval(h8)
    rows = {}

    def seq_vs_batch(name, seq, bat):
        rows[name] = (best_ms(seq, reps), best_ms(bat, reps))

    # each mode runs on its own homes: 8 one-row batches, then one 8-row batch
    e1, d1 = [enc_kv(i) for i in one], [dec_kv(i) for i in one]
    e8, d8 = enc_kv(all8), dec_kv(all8)
    seq_vs_batch("encoder chunk (8 mel)",
                 lambda: [enc_step(i, e) for i, e in zip(one, e1, strict=True)],
                 lambda: enc_step(all8, e8))
    seq_vs_batch("decoder layers (1 pos)",
                 lambda: [dec_step(i, d) for i, d in zip(one, d1, strict=True)],
                 lambda: dec_step(all8, d8))
    seq_vs_batch("decoder mask", lambda: [mx.eval(d[0].make_mask(1)) for d in d1],
                 lambda: mx.eval(d8[0].make_mask(1)))
    seq_vs_batch("LM head + argmax",
                 lambda: [mx.eval(mx.argmax(m.logits(h8[i: i + 1]), -1)) for i in range(8)],
                 lambda: mx.eval(mx.argmax(m.logits(h8), -1)))
    print(f"\nVoxtral {config} {dtype}: ms (min of {reps}), 8 streams; decoder rings at {fill}")
    print(f"  {'component':28} {'8 x B=1':>9} {'B=8':>9} {'ratio':>6}")
    for k, (a, b) in rows.items():
        print(f"  {k:28} {a:9.1f} {b:9.1f} {b / a:6.2f}")


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(vb.CONFIGS), default="full-narrow")
    ap.add_argument("--dtype", choices=sorted(vb.DTYPES), default="float32")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--fill", type=int, default=8)
    ap.add_argument("--no-matmul", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vr").mkdir()
        components(Path(tmp) / "vr", args.config, vb.DTYPES[args.dtype], args.reps, args.fill)
    if not args.no_matmul:
        matmuls(args.reps)


if __name__ == "__main__":
    main()
