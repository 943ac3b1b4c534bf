"""Phrase boosting: what 0, 10 and 1000 phrases add to a decoding step.

Two measurements, each a ratio against a peer timed in the same run:

1. The per-step boosting work alone (host-side sparse part of the graph state, the bias and
   the boosted argmax) on (1, V) logits, against the tied LM head of Voxtral Realtime
   (3072 x 131072 matmul: a part of every Voxtral decoder step, so the ratio to a whole step
   is lower still), and for Nemotron's vocabulary (1025) against its joint + predictor
   round at full width (640 / 1024).
2. End to end: a model (default: the tiny Nemotron golden; `--model PATH` for a real one)
   transcribing the same audio with 0, 10 and 1000 phrases; the time ratio to 0 phrases.
   Tiny models overstate the share (their steps cost almost nothing).

    python benchmarks/boosting.py [--model PATH] [--seconds 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlx_speech.nn import boost, sampling  # noqa: E402
from mlx_speech.text.context_graph import Booster, ContextGraph  # noqa: E402


def timeit(fn, n: int = 20) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def random_graph(n: int, vocab: int, rng) -> ContextGraph | None:
    if n == 0:
        return None
    seqs = [list(rng.integers(0, vocab, rng.integers(2, 7))) for _ in range(n)]
    return ContextGraph(seqs, vocab)


def _phrase(g: ContextGraph, rng) -> list[int]:
    """The tokens of a random path from the root (a phrase prefix), then one random token."""
    out, node = [], 0
    while (arcs := g.children(node)) and rng.random() < 0.9:
        tok, node = arcs[rng.integers(0, len(arcs))]
        out.append(tok)
    return out + [int(rng.integers(0, g.vocab_size))]


def op_cost(vocab: int, peer, peer_name: str, rng, n_steps: int = 40) -> None:
    logits = mx.random.normal((1, vocab))
    mx.eval(logits)
    t_peer = timeit(peer, 5)
    print(f"  V={vocab}: {peer_name} {t_peer * 1e3:.2f} ms")
    base = None
    for n in (0, 10, 1000):
        g = random_graph(n, vocab, rng)
        walk = Booster(g, 1.0) if g is not None else None
        # the walk follows phrases (and random tokens between them): states off the root
        toks = rng.integers(0, vocab, n_steps)
        if g is not None:
            seq = [t for _ in range(n_steps) for t in _phrase(g, rng)]
            toks[: len(seq)] = seq[:n_steps]
        k = [0]

        def step(walk=walk, toks=toks, k=k):
            b = boost.bias([walk], vocab) if walk is not None else None
            out = sampling.greedy(logits, b)
            mx.eval(out)
            if walk is not None:
                walk.advance(int(toks[k[0] % n_steps]))
                k[0] += 1

        t = timeit(step, n_steps)
        base = t if base is None else base
        print(f"    {n:5d} phrases: {t * 1e3:.3f} ms per step (boost extra "
              f"{(t - base) * 1e3:+.3f} ms = {(t - base) / t_peer:.1%} of the {peer_name})")


def end_to_end(path: str, seconds: float, rng) -> None:
    import mlx_speech

    model = mlx_speech.load(path)
    audio = (0.1 * rng.standard_normal(int(seconds * model.sample_rate))).astype(np.float32)
    words = ["".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(3, 9)))
             for _ in range(2000)]
    lists = {0: None, 10: [" ".join(words[i:i + 2]) for i in range(0, 20, 2)],
             1000: [" ".join(words[i:i + 2]) for i in range(0, 2000, 2)]}
    model.transcribe(audio[: model.sample_rate], hotwords=lists[1000])  # warm up, build graph
    base = None
    for n, hw in lists.items():
        t = timeit(lambda hw=hw: model.transcribe(audio, hotwords=hw), 3)
        base = t if base is None else base
        print(f"  {n:5d} phrases: {t:.3f} s for {seconds:g} s of audio "
              f"(x{t / base:.3f} of no phrases)")


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(ROOT / "tests" / "golden" / "nemotron"))
    p.add_argument("--seconds", type=float, default=8.0)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print(f"device: {mx.default_device()}")
    print("1. boosting work per step vs a model's own per-step work")
    h = mx.random.normal((1, 3072))
    w = mx.random.normal((131072, 3072)) * 0.02
    mx.eval(h, w)
    op_cost(131072, lambda: mx.eval(h @ w.T), "Voxtral LM head", rng)
    e = mx.random.normal((1, 1, 640))
    wj = mx.random.normal((1025, 640)) * 0.02
    wl = mx.random.normal((4 * 640, 640)) * 0.02
    mx.eval(e, wj, wl)

    def joint_round():  # the joint head plus a 2-layer LSTM step: a greedy round's work
        g = e.reshape(1, 640)
        for _ in range(4):
            g = mx.tanh(g @ wl.T)[:, :640]
        mx.eval(mx.argmax(mx.maximum(e + g, 0) @ wj.T, axis=-1))

    op_cost(1024, joint_round, "Nemotron greedy round", rng)
    print(f"2. end to end: {args.model}")
    end_to_end(args.model, args.seconds, rng)


if __name__ == "__main__":
    main()
