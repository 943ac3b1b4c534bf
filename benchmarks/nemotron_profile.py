"""Where a Nemotron streaming tick goes: graph ops, host syncs and time, encoder vs greedy
RNN-T, float32 vs bfloat16, for B sessions fed one 160 ms block per tick.

    python benchmarks/nemotron_profile.py [--config tiny|full-narrow|full] [--layers N]
        [--sizes 1,4,16] [--ticks 12] [--lead 2]

Writes a random transformers-layout checkpoint (benchmarks/nemotron_streaming.py), then per
dtype and batch size runs `lead` untimed ticks and `ticks` timed ones, and prints numbers only:

* ops: primitives in each tick's evaluated graphs (the encoder call, then every greedy
  round's joint and predictor), counted from `mx.export_to_dot` before each `mx.eval` or host
  read: on a GPU each is (about) one kernel launch;
* syncs: host synchronisations per tick (`mx.eval` in the step, one read per greedy round);
* enc ms / greedy ms: wall time of the encoder call and of the greedy loop (min over ticks:
  least disturbed by a shared CPU), and their sum per stream;
* shapes: distinct attention shapes over the timed ticks (fixed-size caches: one).

The bf16 / fp32 ratio column compares the same B. Found with it (MLX 0.32 CPU, Linux): see
docs/gpu_kernels.md.
"""

from __future__ import annotations

import argparse
import io
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

import nemotron_streaming as nb  # noqa: E402

from mlx_speech.models.nemotron_streaming import load  # noqa: E402
from mlx_speech.models.nemotron_streaming import step as nstep  # noqa: E402


class Probe:
    """Counts graph ops and host syncs; times the encoder call and the greedy loop."""

    def __init__(self):
        self.ops = self.syncs = 0
        self.enc = self.greedy = 0.0
        self.shapes: set = set()
        self.on = False

    def count(self, *arrays) -> None:
        if not self.on:
            return
        f = io.StringIO()
        mx.export_to_dot(f, *[a for a in arrays if isinstance(a, mx.array)])
        self.ops += f.getvalue().count("shape=rectangle")
        self.syncs += 1

    def install(self, owner) -> None:
        model = owner.model
        real_eval, real_greedy = mx.eval, nstep.greedy_decode
        enc, joint, sdpa = model.encoder.__class__.__call__, type(model.joint).__call__, \
            mx.fast.scaled_dot_product_attention
        probe = self

        def eval_(*args):
            flat = [a for x in args for a in (x if isinstance(x, list) else [x])]
            probe.count(*flat)
            return real_eval(*args)

        def greedy(*args, **kw):
            t0 = time.perf_counter()
            out = real_greedy(*args, **kw)
            probe.greedy += time.perf_counter() - t0
            return out

        def encoder_call(self_, *args, **kw):
            probe.t_enc = time.perf_counter()
            return enc(self_, *args, **kw)

        def joint_call(self_, *args, **kw):
            out = joint(self_, *args, **kw)
            probe.count(out)  # each greedy round reads the joint's argmax on the host
            return out

        def attention(q, k, v, **kw):
            probe.shapes.add((q.shape, k.shape))
            return sdpa(q, k, v, **kw)

        def step(*args, **kw):
            t0 = time.perf_counter()
            g0 = probe.greedy
            out = real_step(*args, **kw)
            probe.enc += time.perf_counter() - t0 - (probe.greedy - g0)
            return out

        real_step = owner.steps.stepper.step
        mx.eval = eval_
        nstep.greedy_decode = greedy
        owner.steps.stepper.step = step
        type(model.encoder).__call__ = encoder_call
        type(model.joint).__call__ = joint_call
        mx.fast.scaled_dot_product_attention = attention


def run(folder: Path, dtype: mx.Dtype, b: int, ticks: int, lead: int) -> dict:
    nm = load(folder, dtype=dtype)
    probe = Probe()
    probe.install(nm)
    frame = 2 * 1280  # one 160 ms block
    sessions = [nm.session(160) for _ in range(b)]
    rng = np.random.default_rng(0)
    n = (lead + ticks) * frame
    audio = [(0.3 * np.sin(np.arange(n) * (0.05 + 0.01 * k))
              + 0.03 * rng.standard_normal(n)).astype(np.float32) for k in range(b)]
    enc, greedy, ops, syncs = [], [], [], []
    for t in range(lead + ticks):
        probe.on = t >= lead
        probe.enc = probe.greedy = 0.0
        probe.ops = probe.syncs = 0
        nm.feed_many([(s, a[t * frame: (t + 1) * frame]) for s, a in zip(sessions, audio,
                                                                         strict=True)])
        if probe.on:
            enc.append(probe.enc * 1000)
            greedy.append(probe.greedy * 1000)
            ops.append(probe.ops)
            syncs.append(probe.syncs)
    return {"enc": min(enc), "greedy": min(greedy), "ops": float(np.median(ops)),
            "syncs": float(np.median(syncs)), "shapes": len(probe.shapes)}


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(nb.CONFIGS), default="full-narrow")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--ticks", type=int, default=12)
    ap.add_argument("--lead", type=int, default=2)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"# mlx {mx.__version__} device {mx.default_device()} config {args.config} "
          f"layers {args.layers}; 160 ms mode, one block per session per tick")
    print("dtype      B   ops  syncs  enc_ms  greedy_ms  ms/stream  shapes  vs_fp32")
    with tempfile.TemporaryDirectory() as tmp:
        folder = nb.write_random_checkpoint(Path(tmp) / "nm", args.config, args.layers,
                                            blank_bias=4.5)
        base = {}
        for dt in ("float32", "bfloat16"):
            for b in sizes:
                r = run(folder, getattr(mx, dt), b, args.ticks, args.lead)
                total = r["enc"] + r["greedy"]
                base.setdefault(b, total)
                print(f"{dt:9s} {b:3d} {r['ops']:5.0f} {r['syncs']:6.1f} {r['enc']:7.1f} "
                      f"{r['greedy']:10.1f} {total / b:10.2f} {r['shapes']:7d} "
                      f"{total / base[b]:8.2f}")


if __name__ == "__main__":
    main()
