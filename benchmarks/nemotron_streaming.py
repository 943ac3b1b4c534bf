"""Nemotron streaming ASR speed per latency mode, on random weights.

    python benchmarks/nemotron_streaming.py [--config tiny|full-narrow|full]
        [--layers N] [--seconds S] [--modes 1120,560,160,80] [--dtype float32|bfloat16]
        [--model FOLDER]

Writes a random transformers-layout checkpoint (config.json, model.safetensors,
a synthetic 1024-piece tokenizer.json) to a temp dir unless `--model` is given,
then for each latency mode feeds a session one chunk of the mode's size at a time
((r+1) x 1280 samples, as a live stream delivers it) and prints numbers only:

* chunk ms: wall time of feed() per chunk (mel + encoder + greedy RNN-T, synced),
  median and p90 after the first chunk; "first" is the first chunk alone;
* flat: median of the last 10 chunks / median of 10 chunks from the middle of
  the run (once the 70-frame attention cache is full, state is bounded, so this
  stays near 1.0 however long the stream; use --seconds >= 12);
* RTF: compute seconds / audio seconds over the whole run, finish() included;
* tokens emitted and peak memory (mx.get_peak_memory).

`full-narrow` keeps the real widths (1024, 8 heads, FFN 4096, 256 subsampling
channels, LSTM 640, 1025 classes) with `--layers` layers (default 2) so it runs
on a small CPU; `full` is the real 24-layer shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "tiny": dict(hidden_size=32, num_attention_heads=4, intermediate_size=64,
                 subsampling_conv_channels=8, layers=2, pred=24, vocab=32),
    "full-narrow": dict(hidden_size=1024, num_attention_heads=8, intermediate_size=4096,
                        subsampling_conv_channels=256, layers=2, pred=640, vocab=1024),
    "full": dict(hidden_size=1024, num_attention_heads=8, intermediate_size=4096,
                 subsampling_conv_channels=256, layers=24, pred=640, vocab=1024),
}


def write_random_checkpoint(out: Path, name: str, layers: int | None, blank_bias: float,
                            seed: int = 0) -> Path:
    from mlx.utils import tree_flatten

    from mlx_speech.models.nemotron_streaming.config import NemotronStreamingConfig
    from mlx_speech.models.nemotron_streaming.transducer import Model

    c = dict(CONFIGS[name])
    n_layers = layers or c.pop("layers")
    c.pop("layers", None)
    pred, vocab = c.pop("pred"), c.pop("vocab")
    cfg = {
        "model_type": "nemotron_asr_streaming", "vocab_size": vocab + 1,
        "blank_token_id": vocab, "decoder_hidden_size": pred, "num_decoder_layers": 2,
        "max_symbols_per_step": 10, "hidden_act": "relu",
        "encoder_config": dict(c, num_hidden_layers=n_layers, num_mel_bins=128,
                               attention_bias=False, convolution_bias=False,
                               conv_kernel_size=9, scale_input=False, sliding_window=71,
                               default_num_lookahead_tokens=13),
    }
    # build our model to learn the shapes, then save them in the torch layouts
    model = Model(NemotronStreamingConfig.from_hf(cfg))
    rng = np.random.default_rng(seed)
    weights = {}
    for k, p in tree_flatten(model.parameters()):
        shape = tuple(p.shape)
        if len(shape) == 4:
            shape = (shape[0], shape[3], shape[1], shape[2])  # mlx OHWI -> torch OIHW
        elif "pointwise_conv" in k and k.endswith("weight"):
            shape = shape + ((1, 1) if "subsampling" in k else (1,))
        elif k.endswith("depthwise_conv.weight"):
            shape = (shape[0], shape[2], shape[1])
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        w = rng.standard_normal(shape).astype(np.float32) / np.sqrt(fan_in)
        if "norm" in k and k.endswith("weight"):
            w = 1.0 + 0.1 * w
        weights[k] = w
    weights["decoder.embedding.weight"][vocab] = 0.0
    weights["joint.head.bias"][vocab] = blank_bias  # random joints rarely pick blank
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    mx.save_safetensors(str(out / "model.safetensors"),
                        {k: mx.array(v) for k, v in weights.items()})
    letters = [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(vocab - 1)]
    vocab_map = {"<unk>": 0, **{"\u2581" + s: i + 1 for i, s in enumerate(letters)}}
    (out / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "BPE", "vocab": vocab_map, "merges": [], "unk_token": "<unk>"},
        "added_tokens": [{"id": vocab, "content": "<blank>", "special": True}]}))
    return out


def audio(seconds: float, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    x = 0.3 * np.sin(2 * np.pi * (200 + 150 * np.sin(2 * np.pi * 0.7 * t)) * t)
    return (x + 0.03 * rng.standard_normal(len(t))).astype(np.float32)


def run_mode(m, x: np.ndarray, latency_ms: int) -> dict:
    s = m.session(latency_ms)
    chunk = (s.right_context + 1) * 1280
    times = []
    mx.reset_peak_memory()
    t_all = time.perf_counter()
    for i in range(0, len(x), chunk):
        t0 = time.perf_counter()
        s.feed(x[i: i + chunk])
        times.append(time.perf_counter() - t0)
    s.finish()
    total = time.perf_counter() - t_all
    rest = sorted(times[1:]) or [0.0]
    mid = len(times) // 2
    head, tail = times[mid - 5: mid + 5], times[-10:]
    return dict(
        mode=latency_ms, chunks=len(times), first_ms=1000 * times[0],
        median_ms=1000 * statistics.median(rest), p90_ms=1000 * rest[int(0.9 * (len(rest) - 1))],
        flat=statistics.median(tail) / max(statistics.median(head), 1e-9) if head else 1.0,
        rtf=total / (len(x) / 16000), tokens=len(s.token_ids),
        peak_mb=mx.get_peak_memory() / 2**20,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=sorted(CONFIGS), default="full-narrow")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--modes", default="1120,560,160,80")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--blank-bias", type=float, default=8.0,
                    help="joint bias of blank in the random model: sets the token rate")
    a = ap.parse_args()

    from mlx_speech.models.nemotron_streaming import load

    with tempfile.TemporaryDirectory() as tmp:
        folder = a.model or write_random_checkpoint(Path(tmp) / "ckpt", a.config, a.layers,
                                                       a.blank_bias)
        m = load(folder, dtype=getattr(mx, a.dtype))
        x = audio(a.seconds)
        m.transcribe(x[:16000])  # warm-up: kernels, allocator
        e = m.config.encoder
        print(f"# mlx {mx.__version__} device {mx.default_device()} dtype {a.dtype} "
              f"layers {e.num_hidden_layers} d {e.hidden_size} audio {a.seconds:.0f} s")
        print("mode_ms chunks first_ms median_ms p90_ms flat rtf tokens peak_mb")
        for ms in (int(v) for v in a.modes.split(",")):
            r = run_mode(m, x, ms)
            print(f"{r['mode']:7d} {r['chunks']:6d} {r['first_ms']:8.1f} {r['median_ms']:9.1f} "
                  f"{r['p90_ms']:6.1f} {r['flat']:4.2f} {r['rtf']:5.3f} {r['tokens']:6d} "
                  f"{r['peak_mb']:7.1f}")


if __name__ == "__main__":
    main()
