"""Voxtral TTS, many voices at once: per-frame cost of B concurrent speech sessions stepped
together (one batched forward per frame) against one, and time to first audio.

    python benchmarks/tts_batched.py [--config tiny|mid|full] [--batches 1,4,16]
        [--steps 48] [--dtype float32|bfloat16]

Builds a random model of the chosen size in memory (the semantic END row zeroed, so no voice
stops early) and prints numbers only (no assertions):

* per frame, B sessions: ms per `step_many` call in steady state (every session makes one
  frame per call), with their codec chunks (16 frames) decoded as they fall due, and without
  the codec (`model`); the ratio to B = 1 ("today" is B times one: sessions stepped one by one);
* time to first audio after a sentence end: a new session joins B - 1 running ones and is fed
  one whole sentence; ms from the feed to its first audio (4 frames), and that in frame steps;
* `stream_text` alone: ms from the text piece that ends the first sentence to the first chunk.

`--config full` has Voxtral-4B-TTS's real shapes (about 4 B parameters: a GPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.tekken import write_tekken  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from machine import cpu_blas  # noqa: E402
from voxtral_tts import CONFIGS as PEER_CONFIGS  # noqa: E402  (tiny, mid: same as there)
from voxtral_tts import N_SPECIAL  # noqa: E402

CONFIGS = {
    **{name: {**c, "vocab": N_SPECIAL + 256} for name, c in PEER_CONFIGS.items()},
    "full": dict(dim=3072, n_layers=26, head_dim=128, hidden_dim=9216, n_heads=32,
                 n_kv_heads=8, semantic=8192, n_ac=36, a_layers=3, c_dim=1024, c_hidden=4096,
                 c_heads=8, c_lengths="2,2,2,2", n_voice=64, vocab=131072, sem_dim=256),
}
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}
TEXT = "Hello there, this is a long test sentence that keeps every voice busy for a while"
SENTENCE = "Hello there, this is a test. "


def params(c: dict) -> dict:
    return {
        "dim": c["dim"], "n_layers": c["n_layers"], "head_dim": c["head_dim"],
        "hidden_dim": c["hidden_dim"], "n_heads": c["n_heads"], "n_kv_heads": c["n_kv_heads"],
        "rope_theta": 1e6, "norm_eps": 1e-5, "vocab_size": c["vocab"],
        "multimodal": {
            "audio_model_args": {
                "semantic_codebook_size": c["semantic"], "acoustic_codebook_size": 21,
                "n_acoustic_codebook": c["n_ac"],
                "acoustic_transformer_args": {
                    "dim": c["dim"], "n_layers": c["a_layers"], "head_dim": c["head_dim"],
                    "hidden_dim": c["hidden_dim"], "n_heads": c["n_heads"],
                    "n_kv_heads": c["n_kv_heads"]}},
            "audio_tokenizer_args": {
                "semantic_codebook_size": c["semantic"], "semantic_dim": c.get("sem_dim", 16),
                "acoustic_codebook_size": 21, "acoustic_dim": c["n_ac"], "dim": c["c_dim"],
                "hidden_dim": c["c_hidden"], "head_dim": c["c_dim"] // c["c_heads"],
                "n_heads": c["c_heads"], "n_kv_heads": c["c_heads"],
                "decoder_transformer_lengths_str": c["c_lengths"],
                "decoder_convs_kernels_str": "3,4,4,4", "decoder_convs_strides_str": "1,2,2,2"}}}


def build(c: dict, folder: Path, dtype: mx.Dtype):
    """A random in-memory model with the real code paths (tokenizer and voice from files)."""
    from mlx_speech.models.voxtral_tts import VoxtralTTS
    from mlx_speech.models.voxtral_tts.config import Voices, VoxtralTTSConfig
    from mlx_speech.models.voxtral_tts.model import Model
    from mlx_speech.text.tekken import Tekken

    mx.random.seed(0)
    model = Model(VoxtralTTSConfig.from_params(params(c)))
    flat = []
    for k, p in tree_flatten(model.parameters()):
        if k.endswith(("embedding_sum", ".conv.weight")):
            p = 0.05 * mx.random.normal(p.shape)
        elif k.endswith("cluster_usage"):
            p = mx.random.uniform(0.5, 2.0, p.shape)
        if k.endswith("semantic_codebook_output.weight"):
            p = p * (mx.arange(p.shape[0]) != 1)[:, None]  # END never wins
        flat.append((k, p.astype(dtype)))
    model.update(tree_unflatten(flat))
    model.eval()
    mx.eval(model.parameters())
    write_tekken(folder / "tekken.json", [], num_special=N_SPECIAL)
    (folder / "voice_embedding").mkdir()
    mx.save_safetensors(str(folder / "voice_embedding" / "v.safetensors"),
                        {"embedding": (0.5 * mx.random.normal((c["n_voice"], c["dim"])))
                         .astype(dtype)})
    voices = Voices(folder / "voice_embedding", {"v": c["n_voice"]}, c["dim"])
    return VoxtralTTS(model, Tekken.from_file(folder / "tekken.json"), voices)


def sessions(tts, n: int, seed0: int = 0, codec: bool = True):
    big = 10**6
    out = []
    for i in range(n):
        s = tts.session("v", seed=seed0 + i, max_frames=4096,
                        **({} if codec else {"first_frames": big, "chunk_frames": big}))
        s.feed(TEXT)
        s.finish()
        out.append(s)
    return out


def frame_ms(tts, B: int, steps: int, codec: bool) -> tuple[float, float]:
    """Mean wall and CPU (this process, all threads) ms per step_many call of B sessions in
    steady state (a multiple of the 16-frame chunk, so codec decodes count at their rate)."""
    ss = sessions(tts, B, codec=codec)
    for _ in range(24):  # prefill, the first chunk, one full chunk: every shape seen
        tts.step_many(ss)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps):
        tts.step_many(ss)
    ms = 1e3 * (time.perf_counter() - t) / steps, 1e3 * (time.process_time() - c) / steps
    for s in ss:
        s.cancel()
    tts.step_many(ss)
    return ms


def first_audio(tts, B: int) -> tuple[float, int]:
    """ms from feeding one whole sentence to a session joining B - 1 running ones to its first
    audio, and the step_many calls that took."""
    others = sessions(tts, B - 1, seed0=100)
    for _ in range(24):
        if others:
            tts.step_many(others)
    s = tts.session("v", seed=7)
    t = time.perf_counter()
    s.feed(SENTENCE)
    calls = 0
    while True:
        calls += 1
        if tts.step_many([*others, s])[-1] is not None:
            break
    ms = 1e3 * (time.perf_counter() - t)
    for x in (*others, s):
        x.cancel()
    tts.step_many([*others, s])
    return ms, calls


def stream_text_first_audio(tts) -> float:
    """ms from the piece that completes a sentence to stream_text's first chunk (the text
    source then stays open, as an LLM still writing)."""
    sent, more = threading.Event(), threading.Event()
    t0 = [0.0]

    def pieces():
        yield "Hello there, "
        t0[0] = time.perf_counter()
        sent.set()
        yield "this is a test. "
        more.wait(30)

    it = tts.stream_text(pieces(), "v", seed=3)
    next(it)
    ms = 1e3 * (time.perf_counter() - t0[0])
    more.set()
    it.close()
    return ms


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3, help="B = 1, 4, 16 measured in turn, "
                    "this many times; medians (a drifting machine moves every B alike)")
    ap.add_argument("--dtype", choices=sorted(DTYPES))
    args = ap.parse_args()
    dtype = DTYPES[args.dtype or ("bfloat16" if args.config == "full" else "float32")]
    batches = [int(b) for b in args.batches.split(",")]
    got: dict[int, list] = {B: [] for B in batches}
    with tempfile.TemporaryDirectory() as d:
        tts = build(CONFIGS[args.config], Path(d), dtype)
        stream_text_first_audio(tts)  # warm: compile B = 1, the first shapes
        for _ in range(args.rounds):
            for B in batches:
                got[B].append((*frame_ms(tts, B, args.steps, codec=True),
                               *frame_ms(tts, B, args.steps, codec=False), *first_audio(tts, B)))
        st = statistics.median(stream_text_first_audio(tts) for _ in range(3))
    med = {B: [statistics.median(r[k] for r in rs) for k in range(6)] for B, rs in got.items()}
    print(f"tts_batched --config {args.config} --dtype {dtype}  mlx {mx.__version__} "
          f"{mx.default_device()}  steps {args.steps}  rounds {args.rounds} (medians)")
    print(f"CPU BLAS: {cpu_blas()}")
    print("per step_many call, every voice making one frame; ratio = to B = 1 (stepped one by "
          "one it would be B)")
    print(f"{'B':>3} | {'with codec: wall ms':>19}{'ratio':>7}{'cpu ms':>8}{'ratio':>7} | "
          f"{'model: wall ms':>14}{'ratio':>7}{'cpu ms':>8}{'ratio':>7} | "
          f"{'first audio ms':>14}{'calls':>6}{'frames':>7}")
    b0 = med[batches[0]]
    for B in batches:
        w, c, mw, mc, ttfa, calls = med[B]
        print(f"{B:>3} | {w:19.2f}{w / b0[0]:7.2f}{c:8.2f}{c / b0[1]:7.2f} | "
              f"{mw:14.2f}{mw / b0[2]:7.2f}{mc:8.2f}{mc / b0[3]:7.2f} | "
              f"{ttfa:14.1f}{calls:6.0f}{ttfa / w:7.1f}")
    print(f"stream_text alone: {st:.1f} ms from the piece ending a sentence to the first chunk")


if __name__ == "__main__":
    main()
