"""Silero VAD cost per 32 ms frame: ours (MLX) against onnxruntime running Silero's ONNX.

    python benchmarks/vad.py [--sizes 1,4,16,64] [--steps 100] [--repeats 5] [--no-compile]

Both run the same weights (`silero_vad.onnx`, Silero's v6.2 release, shipped with mlx_speech;
onnxruntime: `pip install onnxruntime`) on the same CPU, in the same process, in
interleaved blocks. Streaming: N streams each get one 512-sample frame per step; ours is one
`vad(audio (N, 512), state)` call plus `mx.eval`, onnxruntime one `session.run` on the batch
(input (N, 576) with the 64 context samples, state (2, N, 128)), single-threaded as Silero's
OnnxWrapper configures it. Offline: one 10 s clip, ours in one call, onnxruntime frame by frame
as Silero's own `audio_forward` does. Prints the median over `--repeats` blocks of `--steps`
steps: ms per step, ms per frame, and the ratio ours / onnxruntime (below 1: ours is faster).
Numbers only; no assertions.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlx_speech.models.silero_vad import FRAME, load_vad, packaged_weights  # noqa: E402


def timed(steps_a, steps_b, n_steps: int, repeats: int, warmup: int = 10):
    """Median ms per step of two step functions over `repeats` blocks of `n_steps` calls,
    the blocks interleaved (a, b, a, b...) so load from other processes hits both alike."""
    for _ in range(warmup):
        steps_a()
        steps_b()
    blocks: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for fn, out in ((steps_a, blocks[0]), (steps_b, blocks[1])):
            t = time.perf_counter()
            for _ in range(n_steps):
                fn()
            out.append((time.perf_counter() - t) / n_steps * 1e3)
    return statistics.median(blocks[0]), statistics.median(blocks[1])


def ours_stream(vad, n: int, rng):
    frames = [mx.array(rng.uniform(-0.3, 0.3, (n, FRAME)).astype(np.float32)) for _ in range(8)]
    st = {"state": vad.make_state(n), "i": 0}

    def step():
        probs, st["state"] = vad(frames[st["i"] % 8], st["state"])
        mx.eval(probs, *st["state"].arrays())
        st["i"] += 1

    return step


def ort_session(onnx: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(onnx), opts, providers=["CPUExecutionProvider"])


def ort_stream(sess, n: int, rng):
    frames = rng.uniform(-0.3, 0.3, (8, n, FRAME)).astype(np.float32)
    st = {"state": np.zeros((2, n, 128), np.float32), "ctx": np.zeros((n, 64), np.float32),
          "i": 0}
    sr = np.array(16000, np.int64)

    def step():
        x = np.concatenate([st["ctx"], frames[st["i"] % 8]], axis=1)
        _, st["state"] = sess.run(None, {"input": x, "state": st["state"], "sr": sr})
        st["ctx"] = x[:, -64:]
        st["i"] += 1

    return step


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16,64")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="run ours with mx.compile off")
    args = ap.parse_args(argv)
    try:
        import onnxruntime as ort
    except ImportError:
        print("needs onnxruntime: pip install onnxruntime", file=sys.stderr)
        return 1
    if args.no_compile:
        mx.disable_compile()
    onnx = packaged_weights()
    vad, sess = load_vad(onnx), ort_session(onnx)
    rng = np.random.default_rng(0)
    print(f"# {platform.machine()} {platform.processor() or ''} | mlx {mx.__version__} on "
          f"{mx.default_device()}{' (compile off)' if args.no_compile else ''} | "
          f"onnxruntime {ort.__version__}, 1 thread | weights {onnx.name}")
    print(f"{'streams':>8} {'ours ms/step':>13} {'ours ms/frame':>14} {'ort ms/step':>12} "
          f"{'ort ms/frame':>13} {'ours/ort':>9}")
    for n in (int(s) for s in args.sizes.split(",")):
        a, b = timed(ours_stream(vad, n, rng), ort_stream(sess, n, rng), args.steps,
                     args.repeats)
        print(f"{n:>8} {a:>13.3f} {a / n:>14.4f} {b:>12.3f} {b / n:>13.4f} {a / b:>9.2f}")

    clip = rng.uniform(-0.3, 0.3, 16000 * 10 // FRAME * FRAME).astype(np.float32)
    x = mx.array(clip[None])

    def ours_offline():
        probs, _ = vad(x)
        mx.eval(probs)

    step = ort_stream(sess, 1, rng)
    frames = len(clip) // FRAME

    def ort_offline():
        for _ in range(frames):
            step()

    a, b = timed(ours_offline, ort_offline, 1, args.repeats, warmup=1)
    print(f"offline 10 s ({frames} frames, 1 stream): ours {a:.1f} ms ({a / frames:.4f} "
          f"ms/frame), onnxruntime {b:.1f} ms ({b / frames:.4f} ms/frame), ours/ort "
          f"{a / b:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
