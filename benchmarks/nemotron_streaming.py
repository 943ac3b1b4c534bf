"""Nemotron streaming ASR speed per latency mode, on random weights, against mlx-audio.

    python benchmarks/nemotron_streaming.py [--config tiny|full-narrow|full]
        [--layers N] [--seconds S] [--modes 1120,560,160,80] [--dtype float32|bfloat16]
        [--model FOLDER] [--blank-bias B] [--no-peer]

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
on a small CPU; `full` is the real 24-layer shape. The defaults (full-narrow,
2 layers, 12 s) keep the whole run, peer included, near 3 minutes on a 2-core
CPU. The default `--blank-bias 8` makes the random full-narrow model emit no
tokens (pure encoder + blank-decoding timing); `--blank-bias 4.5` makes it emit
some, which gives the token-id comparison something to compare.

Peer (skip with `--no-peer`): mlx-audio's `nemotron_asr` loads the SAME folder
through `mlx_audio.stt.utils.load_model` (its transformers-layout `_from_hf` path)
and is driven with the same audio in the same (r+1) x 1280-sample chunks, per
chunk: `StreamingLogMelSpectrogram.push` -> `ConformerStreamingState.push` (context
[left, r], its default first block of 8(r+1) mel frames, the exact one) ->
`apply_prompt` + `materialize` (its mx.eval) -> `GreedyDecoderState.decode` (syncs
per frame), i.e. its live session's per-chunk work without the queue. The two
models run one after the other (ours freed first), so each peak counts only its
own weights. Then a table gives ours, the peer and ours/peer for chunk ms, RTF
and peak memory, and whether the token ids agree (else the first mismatch). The
peer drops special pieces (`<unk>`) from its output; ours' ids are filtered the
same way before comparing. If mlx-audio is missing or fails in a mode, that part
prints "peer skipped: <reason>" and the run goes on.
"""

from __future__ import annotations

import argparse
import gc
import json
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

from mlx_speech.models.nemotron_streaming.config import FRAME_MS, LATENCY_MS  # noqa: E402

PEER = "mlx-audio nemotron_asr"
LOOKAHEADS = [13, 6, 1, 0]  # right contexts of the four latency modes

CONFIGS = {
    "tiny": dict(hidden_size=32, num_attention_heads=4, intermediate_size=64,
                 subsampling_conv_channels=8, layers=2, pred=24, vocab=32),
    "full-narrow": dict(hidden_size=1024, num_attention_heads=8, intermediate_size=4096,
                        subsampling_conv_channels=256, layers=2, pred=640, vocab=1024),
    "full": dict(hidden_size=1024, num_attention_heads=8, intermediate_size=4096,
                 subsampling_conv_channels=256, layers=24, pred=640, vocab=1024),
}


def write_random_checkpoint(out: Path, name: str, layers: int | None, blank_bias: float,
                            seed: int = 0, prompted: bool = False) -> Path:
    """`prompted`: Nemotron 3.5 (`nemotron3_5_asr`): the language prompt (128 slots, the
    release's dictionary), its 13088-entry vocabulary (the real joint head) and the 320 ms
    mode; the transformers layout, languages in processor_config.json."""
    from mlx.utils import tree_flatten

    from mlx_speech.models.nemotron_streaming.config import NemotronStreamingConfig, release_prompts
    from mlx_speech.models.nemotron_streaming.model import Model

    c = dict(CONFIGS[name])
    n_layers = layers or c.pop("layers")
    c.pop("layers", None)
    pred, vocab = c.pop("pred"), c.pop("vocab")
    lookaheads = LOOKAHEADS
    if prompted:
        vocab = 13087 if name != "tiny" else vocab
        lookaheads = [13, 6, 3, 1, 0]
    cfg = {
        "model_type": "nemotron_asr_streaming", "architectures": ["NemotronAsrStreamingForRNNT"],
        "vocab_size": vocab + 1,
        "blank_token_id": vocab, "decoder_hidden_size": pred, "num_decoder_layers": 2,
        "max_symbols_per_step": 10, "hidden_act": "relu",
        "encoder_config": dict(c, num_hidden_layers=n_layers, num_mel_bins=128,
                               attention_bias=False, convolution_bias=False,
                               conv_kernel_size=9, scale_input=False, sliding_window=71,
                               default_num_lookahead_tokens=13, subsampling_factor=8,
                               max_position_embeddings=5000),
    }
    if prompted:  # the release's left context (56) takes the 320 ms blocks of 4 frames
        cfg.update(model_type="nemotron3_5_asr", architectures=["Nemotron3_5AsrForRNNT"],
                   num_prompts=128, prompt_intermediate_size=2 * c["hidden_size"],
                   default_prompt_id=101)
        cfg["encoder_config"].update(sliding_window=57, supported_num_lookahead_tokens=lookaheads)
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
    # mlx-audio's `_from_hf` reads the supported lookaheads from the processor config
    proc = {"supported_num_lookahead_tokens": lookaheads}
    if prompted:
        proc.update(prompt_dictionary=release_prompts(), num_prompts=128)
    (out / "processor_config.json").write_text(json.dumps(proc))
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


def run_mode(open_session: Callable, x: np.ndarray, latency_ms: int) -> dict:
    s = open_session(latency_ms)
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
        chunk=chunk, ids=list(s.token_ids), frames=list(s.frames),
    )


TABLE_HEAD = "mode_ms chunks first_ms median_ms p90_ms flat rtf tokens peak_mb"


def print_row(r: dict) -> None:
    print(f"{r['mode']:7d} {r['chunks']:6d} {r['first_ms']:8.1f} {r['median_ms']:9.1f} "
          f"{r['p90_ms']:6.1f} {r['flat']:4.2f} {r['rtf']:5.3f} {r['tokens']:6d} "
          f"{r['peak_mb']:7.1f}")


# -- peer: mlx-audio nemotron_asr ---------------------------------------------------
class PeerSession:
    """mlx-audio's streaming pieces, called per chunk as its live session calls them.

    `create_streaming_session` would add a thread-safe queue and a cooperative
    `step()` loop, and starts with a 1+8r mel first block that puts later blocks
    one frame off the offline grid; its `ConformerStreamingState` default (a first
    block of 8(r+1) mel frames) is exact, so that is what this drives.
    """

    def __init__(self, model, latency_ms: int):
        from mlx_audio.stt.models.nemotron_asr import (
            ConformerStreamingState,
            StreamingLogMelSpectrogram,
        )
        from mlx_audio.stt.models.nemotron_asr.rnnt import GreedyDecoderState

        if latency_ms not in LATENCY_MS:
            raise ValueError(f"no lookahead for a {latency_ms} ms mode")
        left, r = model.default_att_context_size[0], LATENCY_MS[latency_ms]
        known = [list(c) for c in model.encoder_config.att_context_size]
        if [left, r] not in known:
            raise ValueError(f"context [{left}, {r}] is not in its att_context_size {known}")
        self.model, self.right_context = model, r
        self.dtype = model.joint.enc.weight.dtype
        pre = model.preprocessor_config
        self.frame_sec = model.encoder_config.subsampling_factor * pre.hop_length / pre.sample_rate
        self.mel = StreamingLogMelSpectrogram(pre)
        self.encoder = ConformerStreamingState(model.encoder, att_context_size=[left, r])
        self.decoder = GreedyDecoderState(model)
        self.n_frames = 0
        self.token_ids: list[int] = []
        self.frames: list[int] = []

    def _run(self, mel: mx.array, final: bool) -> None:
        for h in self.encoder.push(mel.astype(self.dtype), final=final):
            h = self.model.apply_prompt(h, self.model.default_language)
            self.encoder.materialize(h)
            for t in self.decoder.decode(h, self.n_frames):
                self.token_ids.append(t.id)
                self.frames.append(round(t.start / self.frame_sec))
            self.n_frames += h.shape[1]

    def feed(self, samples: np.ndarray) -> None:
        self._run(self.mel.push(mx.array(samples)), final=False)

    def finish(self) -> None:
        self._run(self.mel.flush(), final=True)


def load_peer(folder: Path, dtype: mx.Dtype):
    """mlx-audio's own loader on our folder: config.json (nemotron_asr_streaming) goes
    through `ModelConfig._from_hf`, the HF weight names through `Model.sanitize`."""
    from mlx_audio.stt.utils import load_model

    model = load_model(Path(folder), strict=True)
    if dtype != mx.float32:
        model.set_dtype(dtype)
    return model


def compare_ids(a: list[int], fa: list[int], b: list[int], fb: list[int]) -> str:
    """Agreement of two token-id lists, else the first mismatch (index, frame)."""
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), None)
    if i is None and len(a) == len(b):
        return f"agree ({n} ids)" + (": trivially, lower --blank-bias" if not n else "")
    if i is None:
        who, f = ("peer", fb[n]) if len(b) > len(a) else ("ours", fa[n])
        return f"first mismatch at id {n} (frame {f}): only {who} goes on"
    return f"first mismatch at id {i}: ours {a[i]}@frame {fa[i]}, peer {b[i]}@frame {fb[i]}"


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def run_peer(folder: Path, x: np.ndarray, modes: list[int], ours: dict[int, dict],
             ours_mel: np.ndarray, dtype: mx.Dtype, dtype_name: str) -> None:
    print()
    try:
        from importlib.metadata import version

        peer_version = version("mlx-audio")
        from mlx_audio.stt.models.nemotron_asr import tokenizer as peer_tokenizer
        from mlx_audio.stt.models.nemotron_asr.audio import log_mel_spectrogram
    except Exception as e:  # the peer is optional
        print(f"peer skipped: cannot import {PEER} ({type(e).__name__}: {e})")
        return
    try:
        model = load_peer(folder, dtype)
        default_ms = (model.default_att_context_size[1] + 1) * FRAME_MS
        warm = PeerSession(model, default_ms)  # warm-up, as ours: 1 s in the default mode
        warm.feed(x[:16000])
        warm.finish()
    except Exception as e:
        print(f"peer skipped: {PEER} cannot load or run this folder ({type(e).__name__}: {e})")
        return
    mel = log_mel_spectrogram(mx.array(x), model.preprocessor_config)
    mel = np.array(mel.reshape(-1, mel.shape[-1]), dtype=np.float32)
    n = min(len(mel), len(ours_mel))
    d = np.abs(mel[:n] - ours_mel[:n]).max(axis=1)
    e = model.encoder_config
    print(f"# peer: mlx-audio {peer_version} nemotron_asr dtype {dtype_name} layers {e.n_layers} "
          f"d {e.d_model} contexts {e.att_context_size}; same folder, audio and chunks")
    print("# peer per feed(): StreamingLogMelSpectrogram.push -> ConformerStreamingState.push "
          "-> materialize -> GreedyDecoderState.decode;")
    print("# its first block is 8(r+1) mel frames, one more than the first chunk yields, so "
          "its first feed() only buffers (first_ms) and its blocks come one chunk later")
    print(f"# offline mel frames: ours {len(ours_mel)} peer {len(mel)}; max|diff| over common "
          f"frames {d.max():.2e} (at frame {int(d.argmax())}), interior {d[2:-2].max():.2e}")
    print(TABLE_HEAD)
    peer: dict[int, dict | str] = {}
    for ms in modes:
        try:
            peer[ms] = run_mode(lambda m: PeerSession(model, m), x, ms)
            print_row(peer[ms])
        except Exception as err:  # keep going with the other modes
            peer[ms] = f"peer skipped: {type(err).__name__}: {err}"
            print(f"{ms:7d} {peer[ms]}")
    special = {i for i, p in enumerate(model.vocabulary) if peer_tokenizer.is_special_piece(p)}

    print()
    print("# ours vs peer; ratio = ours/peer (< 1: ours faster or smaller); chunk = samples fed "
          "per feed() to both, (r+1) x 1280;")
    print("# median_ms: per chunk after the first; ids: special pieces "
          f"({len(special)}, e.g. <unk>) dropped from ours as the peer drops them")
    print(f"{'mode_ms':>7} {'chunk':>6} | {'median_ms ours':>14} {'peer':>7} {'ratio':>5} | "
          f"{'rtf ours':>8} {'peer':>6} {'ratio':>5} | {'peak_mb ours':>12} {'peer':>7} "
          f"{'ratio':>5} | {'ids ours':>8} {'peer':>5} | token ids")
    for ms in modes:
        o, p = ours[ms], peer[ms]
        if isinstance(p, str):
            print(f"{ms:7d} {o['chunk']:6d} | {o['median_ms']:14.1f} {p}")
            continue
        keep = [k for k, t in enumerate(o["ids"]) if t not in special]
        ids, frames = [o["ids"][k] for k in keep], [o["frames"][k] for k in keep]
        print(f"{ms:7d} {o['chunk']:6d} | {o['median_ms']:14.1f} {p['median_ms']:7.1f} "
              f"{ratio(o['median_ms'], p['median_ms']):5.2f} | {o['rtf']:8.3f} {p['rtf']:6.3f} "
              f"{ratio(o['rtf'], p['rtf']):5.2f} | {o['peak_mb']:12.1f} {p['peak_mb']:7.1f} "
              f"{ratio(o['peak_mb'], p['peak_mb']):5.2f} | {len(ids):8d} {p['tokens']:5d} | "
              f"{compare_ids(ids, frames, p['ids'], p['frames'])}")


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=sorted(CONFIGS), default="full-narrow")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--modes", default="1120,560,160,80")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--blank-bias", type=float, default=8.0,
                    help="joint bias of blank in the random model: sets the token rate")
    ap.add_argument("--no-peer", action="store_true", help=f"skip the {PEER} comparison")
    a = ap.parse_args()

    from mlx_speech.models.nemotron_streaming import load

    modes = [int(v) for v in a.modes.split(",")]
    dtype = getattr(mx, a.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        folder = a.model or write_random_checkpoint(Path(tmp) / "ckpt", a.config, a.layers,
                                                       a.blank_bias)
        m = load(folder, dtype=dtype)
        x = audio(a.seconds)
        m.transcribe(x[:16000])  # warm-up: kernels, allocator
        e = m.config.encoder
        print(f"# mlx {mx.__version__} device {mx.default_device()} dtype {a.dtype} "
              f"layers {e.num_hidden_layers} d {e.hidden_size} audio {a.seconds:.0f} s")
        print(TABLE_HEAD)
        ours = {}
        for ms in modes:
            ours[ms] = run_mode(m.session, x, ms)
            print_row(ours[ms])
        if a.no_peer:
            return
        ours_mel = m.features(x)
        del m  # the peer runs alone: each peak holds one model's weights
        gc.collect()
        mx.clear_cache()
        run_peer(folder, x, modes, ours, ours_mel, dtype, a.dtype)


if __name__ == "__main__":
    main()
