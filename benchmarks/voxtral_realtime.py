"""Voxtral Realtime speed: ours against mlx-audio 0.6.2 on identical random weights.

    python benchmarks/voxtral_realtime.py [--config tiny|full-narrow|full]
        [--enc-layers N --dec-layers N] [--seconds S] [--dtype float32|bfloat16] [--no-peer]

Writes a random checkpoint in the Mistral-native layout (params.json,
consolidated.safetensors, tekken.json) to a temp dir, loads it with both
implementations and prints numbers only (no assertions):

* per-step encoder / decoder ms: one 80 ms token (8 mel frames through the
  streaming encoder; one greedy decoder step incl. LM head and argmax), mx.eval
  after each, median over `--steps` after `--warmup`, run after the prefill;
* prefill: encoder over the prompt's audio (1 + 32 + delay positions) and the
  decoder prompt forward up to the first token;
* RTF: compute s / audio s of a whole streaming run fed 1280-sample chunks
  through each public streaming API (ours: session feed/finish; mlx-audio:
  create_streaming_session feed/step/close);
* peak memory from load to the end of the run (mx.get_peak_memory).

`full-narrow` keeps the real widths with few layers so it runs on a small CPU; `full` has
the real layer counts (4.4 B parameters: a GPU's job). Weights are drawn with mx.random.
The EOS row of the embedding is zeroed so random weights never stop a run early.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKEN_SAMPLES, MEL_PER_TOKEN, N_MELS = 1280, 8, 128
BOS, EOS, PAD = 1, 2, 32
N_LEFT, DELAY_MS, N_DELAY = 32, 480, 6
PROMPT = [BOS] + [PAD] * (N_LEFT + N_DELAY)
ADA_DIM, N_SPECIAL = 32, 1000

CONFIGS: dict[str, dict[str, dict[str, int]]] = {
    "tiny": {
        "enc": dict(dim=32, n_layers=2, n_heads=4, head_dim=8, hidden_dim=64, sliding_window=750),
        "dec": dict(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=12, hidden_dim=96,
                    vocab_size=1100, sliding_window=8192),
    },
    "full-narrow": {
        "enc": dict(dim=1280, n_layers=2, n_heads=32, head_dim=64, hidden_dim=5120,
                    sliding_window=750),
        "dec": dict(dim=3072, n_layers=2, n_heads=32, n_kv_heads=8, head_dim=128,
                    hidden_dim=9216, vocab_size=131072, sliding_window=8192),
    },
    "full": {  # the real layer counts: 4.4 B parameters
        "enc": dict(dim=1280, n_layers=32, n_heads=32, head_dim=64, hidden_dim=5120,
                    sliding_window=750),
        "dec": dict(dim=3072, n_layers=26, n_heads=32, n_kv_heads=8, head_dim=128,
                    hidden_dim=9216, vocab_size=131072, sliding_window=8192),
    },
}
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}


# -- checkpoint -----------------------------------------------------------------
def params_json(enc: dict[str, int], dec: dict[str, int]) -> dict:
    audio = dict(sampling_rate=16000, frame_rate=12.5, num_mel_bins=N_MELS, hop_length=160,
                 window_size=400, global_log_mel_max=1.5, transcription_format="streaming")
    encoder = dict(enc, audio_encoding_args=audio, n_kv_heads=enc["n_heads"], use_biases=True,
                   rope_theta=1e6, causal=True, norm_eps=1e-5)
    return dict(dec, use_biases=False, causal=True, rope_theta=1e6, norm_eps=1e-5,
                tied_embeddings=True, model_max_length=131072, ada_rms_norm_t_cond=True,
                ada_rms_norm_t_cond_dim=ADA_DIM,
                multimodal=dict(whisper_model_args=dict(
                    encoder_args=encoder, downsample_args=dict(downsample_factor=4))))


def mistral_shapes(enc: dict[str, int], dec: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Mistral-native consolidated.safetensors (spec §1.2)."""
    mm = "mm_streams_embeddings.embedding_module."
    w = mm + "whisper_encoder."
    e, d, ei, di = enc["dim"], dec["dim"], enc["n_heads"] * enc["head_dim"], dec["hidden_dim"]
    s: dict[str, tuple[int, ...]] = {
        w + "conv_layers.0.conv.weight": (e, N_MELS, 3), w + "conv_layers.0.conv.bias": (e,),
        w + "conv_layers.1.conv.weight": (e, e, 3), w + "conv_layers.1.conv.bias": (e,),
        w + "transformer.norm.weight": (e,),
        mm + "audio_language_projection.0.weight": (d, 4 * e),
        mm + "audio_language_projection.2.weight": (d, d),
        mm + "tok_embeddings.weight": (dec["vocab_size"], d),
        "norm.weight": (d,),
    }
    for i in range(enc["n_layers"]):
        p = f"{w}transformer.layers.{i}."
        for x in ("q", "k", "v"):
            s[p + f"attention.w{x}.weight"] = (ei, e)
        s |= {p + "attention.wq.bias": (ei,), p + "attention.wv.bias": (ei,),
              p + "attention.wo.weight": (e, ei), p + "attention.wo.bias": (e,),
              p + "attention_norm.weight": (e,), p + "ffn_norm.weight": (e,),
              p + "feed_forward.w1.weight": (enc["hidden_dim"], e),
              p + "feed_forward.w3.weight": (enc["hidden_dim"], e),
              p + "feed_forward.w2.weight": (e, enc["hidden_dim"]),
              p + "feed_forward.w2.bias": (e,)}
    q, kv = dec["n_heads"] * dec["head_dim"], dec["n_kv_heads"] * dec["head_dim"]
    for i in range(dec["n_layers"]):
        p = f"layers.{i}."
        s |= {p + "attention.wq.weight": (q, d), p + "attention.wk.weight": (kv, d),
              p + "attention.wv.weight": (kv, d), p + "attention.wo.weight": (d, q),
              p + "attention_norm.weight": (d,), p + "ffn_norm.weight": (d,),
              p + "feed_forward.w1.weight": (di, d), p + "feed_forward.w3.weight": (di, d),
              p + "feed_forward.w2.weight": (d, di),
              p + "ada_rms_norm_t_cond.0.weight": (ADA_DIM, d),
              p + "ada_rms_norm_t_cond.2.weight": (d, ADA_DIM)}
    return s


def tekken_pieces(n: int) -> list[bytes]:
    """n distinct multi-byte pieces (all 2-byte strings, then 3-byte ones)."""
    combos = itertools.chain.from_iterable(
        itertools.product(range(256), repeat=k) for k in (2, 3))
    return [bytes(c) for c in itertools.islice(combos, max(0, n))]


def write_checkpoint(folder: Path, enc: dict[str, int], dec: dict[str, int], dtype: mx.Dtype,
                     seed: int) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.support.tekken import VOXTRAL_AUDIO, write_tekken

    key = mx.random.key(seed)  # drawn by MLX (numpy takes minutes for 4.4 B parameters)
    tensors: dict[str, mx.array] = {}
    for name, shape in mistral_shapes(enc, dec).items():
        key, sub = mx.random.split(key)
        x = mx.random.uniform(-(3**0.5), 3**0.5, shape, key=sub)  # unit variance; fast
        x = x * (0.1 if "norm" in name else 0.02)
        if "norm" in name:
            x = x + 1.0
        if name.endswith("tok_embeddings.weight"):
            x[EOS] = 0.0  # logit 0 never wins: random weights cannot end the run
        tensors[name] = x.astype(dtype)
        mx.eval(tensors[name])
    mx.save_safetensors(str(folder / "consolidated.safetensors"), tensors)
    del tensors
    (folder / "params.json").write_text(json.dumps(params_json(enc, dec), indent=2))
    write_tekken(folder / "tekken.json", tekken_pieces(dec["vocab_size"] - N_SPECIAL - 256),
                 vocab_size=dec["vocab_size"], audio=VOXTRAL_AUDIO)


# -- measurement ------------------------------------------------------------------
@dataclass
class Result:
    load_s: float = 0.0
    prefill_enc_ms: float = 0.0
    prefill_dec_ms: float = 0.0
    enc_ms: list[float] = field(default_factory=list)
    dec_ms: list[float] = field(default_factory=list)
    run_s: float = 0.0
    tokens: list[int] = field(default_factory=list)
    peak_mb: float = 0.0


def reset_peak() -> None:
    gc.collect()
    mx.clear_cache()
    if hasattr(mx, "reset_peak_memory"):
        mx.reset_peak_memory()


def peak_mb() -> tuple[float, str]:
    if hasattr(mx, "get_peak_memory"):
        return mx.get_peak_memory() / 2**20, "mx.get_peak_memory"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "ru_maxrss, process-wide"


def timed(fn: Callable[[], mx.array]) -> tuple[mx.array, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3


def run_steps(r: Result, mel: np.ndarray, steps: int, warmup: int,
              enc: Callable[[np.ndarray], mx.array],
              dec: Callable[[mx.array, int], mx.array]) -> None:
    """Prefill, then one encoder + one decoder step per token; all mx.eval'd."""
    P = len(PROMPT)
    audio, r.prefill_enc_ms = timed(lambda: enc(mel[: P * MEL_PER_TOKEN]))
    _, r.prefill_dec_ms = timed(lambda: dec(audio, -1))
    for k in range(warmup + steps):
        p = P + k
        a, te = timed(lambda p=p: enc(mel[p * MEL_PER_TOKEN: (p + 1) * MEL_PER_TOKEN]))
        _, td = timed(lambda a=a, p=p: dec(a, p))
        if k >= warmup:
            r.enc_ms.append(te)
            r.dec_ms.append(td)


def stream_chunks(audio: np.ndarray) -> list[np.ndarray]:
    return [audio[i: i + TOKEN_SAMPLES] for i in range(0, len(audio), TOKEN_SAMPLES)]


def bench_ours(folder: Path, mel: np.ndarray, audio: np.ndarray, steps: int,
               warmup: int) -> Result:
    import mlx_speech
    from mlx_speech.models.voxtral_realtime.model import EncoderState
    from mlx_speech.models.voxtral_realtime.session import ENCODER_CHUNK_TOKENS
    from mlx_speech.nn import RingBatch

    r = Result()
    reset_peak()
    t0 = time.perf_counter()
    vr = mlx_speech.load(folder)
    r.load_s = time.perf_counter() - t0
    m = vr.model
    state = m.make_encoder_state(ENCODER_CHUNK_TOKENS * MEL_PER_TOKEN // 2)  # as the session
    state = EncoderState(state.conv, [RingBatch.gather([r]) for r in state.kv])  # batch of 1
    caches = [RingBatch.gather([r]) for r in m.make_decoder_cache(len(PROMPT))]
    scales = m.ffn_scales(N_DELAY)
    mx.eval(scales)
    last: list[mx.array] = []

    def enc(chunk: np.ndarray) -> mx.array:
        parts = []
        for t in range(0, len(chunk), ENCODER_CHUNK_TOKENS * MEL_PER_TOKEN):
            x = mx.array(chunk[t: t + ENCODER_CHUNK_TOKENS * MEL_PER_TOKEN][None])
            parts.append(m.embed_audio(x, state))
            mx.eval(parts[-1], state.arrays())
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)

    def dec(a: mx.array, pos: int) -> mx.array:
        toks = mx.array([PROMPT]) if pos < 0 else last[-1][:, None]
        h = m.hidden(toks, a, scales, caches)
        last.append(mx.argmax(m.logits(h[:, -1]), axis=-1))  # as the session
        mx.eval(last[-1])
        return last[-1]

    run_steps(r, mel, steps, warmup, enc, dec)
    s = vr.session(DELAY_MS)
    t0 = time.perf_counter()
    for chunk in stream_chunks(audio):
        s.feed(chunk)
    s.finish()
    r.run_s = time.perf_counter() - t0
    r.tokens = list(s.token_ids)
    r.peak_mb = peak_mb()[0]
    return r


def load_peer(folder: Path):
    """mlx-audio's own load steps (Model, sanitize, load_weights, post_load_hook).

    Its loader reads an mlx-community config.json; the config here comes from
    params.json. AudioEncoder hard-codes the adapter to 3072 outputs, so other
    decoder widths get correctly shaped adapter Linears (as the oracle does).
    """
    import mlx.nn as nn
    from mlx_audio.stt.models.voxtral_realtime.config import ModelConfig
    from mlx_audio.stt.models.voxtral_realtime.voxtral_realtime import Model

    p = json.loads((folder / "params.json").read_text())
    wm = p["multimodal"]["whisper_model_args"]
    e = wm["encoder_args"]
    enc_keys = ("dim", "n_layers", "n_heads", "head_dim", "hidden_dim", "n_kv_heads",
                "norm_eps", "rope_theta", "sliding_window")
    dec_keys = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim",
                "vocab_size", "norm_eps", "rope_theta", "sliding_window",
                "ada_rms_norm_t_cond_dim")
    cfg = ModelConfig(
        encoder_args={k: e[k] for k in enc_keys}
        | {"downsample_factor": wm["downsample_args"]["downsample_factor"]},
        decoder={k: p[k] for k in dec_keys}, transcription_delay_ms=DELAY_MS)
    model = Model(cfg)
    if p["dim"] != 3072:
        ds = cfg.encoder_args.downsample_factor
        model.encoder.audio_language_projection_0 = nn.Linear(e["dim"] * ds, p["dim"], bias=False)
        model.encoder.audio_language_projection_2 = nn.Linear(p["dim"], p["dim"], bias=False)
    weights = model.sanitize(mx.load(str(folder / "consolidated.safetensors")))
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    model.eval()
    return Model.post_load_hook(model, folder)


def bench_peer(folder: Path, mel: np.ndarray, audio: np.ndarray, steps: int,
               warmup: int) -> Result:
    from mlx_audio.stt.models.voxtral_realtime.streaming import (
        StreamingConvStem,
        StreamingDownsampler,
        StreamingEncoder,
    )

    r = Result()
    reset_peak()
    t0 = time.perf_counter()
    model = load_peer(folder)
    r.load_s = time.perf_counter() - t0
    model._ensure_ada_scales(DELAY_MS)
    conv, encoder, proj = (cls(model.encoder) for cls in
                           (StreamingConvStem, StreamingEncoder, StreamingDownsampler))
    d = model.decoder
    cache: list = []
    last: list[mx.array] = []

    def enc(chunk: np.ndarray) -> mx.array:  # the session's _encode_mel
        a = proj.step(encoder.step(conv.step(mx.array(chunk.T))))
        mx.eval(a)
        return a

    def dec(a: mx.array, pos: int) -> mx.array:
        if pos < 0:  # the session's _do_prefill
            h, c = d.forward(a + d.embed_tokens(mx.array(PROMPT)), start_pos=0)
            cache.append(c)
            logits = d.logits(h[-1])
        else:  # the session's _decode_some
            x = a[0] + d.tok_embeddings(last[-1].reshape(1))[0]
            h, _ = d.forward(x[None], start_pos=pos, cache=cache[0])
            logits = d.logits(h.squeeze(0))
        last.append(mx.argmax(logits))
        mx.eval(last[-1])
        return last[-1]

    run_steps(r, mel, steps, warmup, enc, dec)
    s = model.create_streaming_session(transcription_delay_ms=DELAY_MS)
    t0 = time.perf_counter()
    for chunk in stream_chunks(audio):
        s.feed(chunk)
        s.step(max_decode_tokens=1 << 30)
    s.close()
    while not s.done:
        s.step(max_decode_tokens=1 << 30)
    r.run_s = time.perf_counter() - t0
    r.tokens = list(s.generated)
    r.peak_mb = peak_mb()[0]
    return r


# -- report -----------------------------------------------------------------------
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def test_audio(seconds: float, seed: int) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    x = 0.3 * np.sin(2 * np.pi * 300 * t) * np.sin(2 * np.pi * 1.3 * t)
    return (x + 0.05 * np.random.default_rng(seed).standard_normal(len(t))).astype(np.float32)


def report(ours: Result, peer: Result | None, seconds: float) -> None:
    def row(name: str, a: float, b: float | None, fmt: str = "{:10.2f}") -> None:
        pb = fmt.format(b) if b is not None else f"{'-':>10}"
        ratio = f"{a / b:9.2f}x" if b else f"{'n/a':>10}"
        print(f"{name:<34}{fmt.format(a)}  {pb}  {ratio}")

    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else math.nan

    P = len(PROMPT)
    print(f"{'':<34}{'ours':>10}  {'mlx-audio':>10}  {'ours/peer':>10}")
    pairs: list[tuple[str, Callable[[Result], float]]] = [
        ("encoder step ms (median)", lambda r: med(r.enc_ms)),
        ("decoder step ms (median)", lambda r: med(r.dec_ms)),
        ("step total ms (enc+dec median)", lambda r: med(r.enc_ms) + med(r.dec_ms)),
        (f"prefill encoder ms ({P} tok)", lambda r: r.prefill_enc_ms),
        (f"prefill decoder ms ({P} tok)", lambda r: r.prefill_dec_ms),
        ("prefill total ms", lambda r: r.prefill_enc_ms + r.prefill_dec_ms),
        ("stream run s (1280-sample feeds)", lambda r: r.run_s),
        ("stream RTF (compute s / audio s)", lambda r: r.run_s / seconds),
        ("peak memory MiB", lambda r: r.peak_mb),
        ("load s", lambda r: r.load_s),
    ]
    for name, f in pairs:
        row(name, f(ours), f(peer) if peer else None)
    row("stream tokens", len(ours.tokens), len(peer.tokens) if peer else None, "{:10d}")
    if peer:
        n = min(len(ours.tokens), len(peer.tokens))
        diff = next((i for i in range(n) if ours.tokens[i] != peer.tokens[i]), None)
        same = "identical" if diff is None else f"first differ at token {diff}"
        print(f"stream token ids ours vs mlx-audio: {same} (over {n})")


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="full-narrow")
    ap.add_argument("--enc-layers", type=int)
    ap.add_argument("--dec-layers", type=int)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--dtype", choices=sorted(DTYPES),
                    help="default: bfloat16 for full-narrow and full, float32 for tiny")
    ap.add_argument("--steps", type=int,
                    help="timed steps after warm-up; default 10 (full, full-narrow), 50 (tiny)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-peer", action="store_true", help="skip mlx-audio")
    args = ap.parse_args(argv)

    enc, dec = dict(CONFIGS[args.config]["enc"]), dict(CONFIGS[args.config]["dec"])
    enc["n_layers"] = args.enc_layers or enc["n_layers"]
    dec["n_layers"] = args.dec_layers or dec["n_layers"]
    dtype_name = args.dtype or ("float32" if args.config == "tiny" else "bfloat16")
    dtype = DTYPES[dtype_name]
    args.steps = args.steps or (50 if args.config == "tiny" else 10)

    peer_version = None
    if not args.no_peer:
        try:
            from importlib.metadata import version

            import mlx_audio.stt.models.voxtral_realtime.voxtral_realtime  # noqa: F401

            peer_version = version("mlx-audio")
        except Exception as e:  # any import problem: the peer is optional
            print(f"peer skipped: cannot import mlx-audio voxtral_realtime ({e!r})")

    print("Voxtral Realtime benchmark")
    print(f"device {mx.default_device()} | mlx {mx.__version__} | mlx-audio "
          f"{peer_version or 'skipped'} | dtype {dtype_name} | commit {git_commit()}")
    print(f"config {args.config}: encoder {enc['n_layers']}x dim {enc['dim']} "
          f"({enc['n_heads']}x{enc['head_dim']}, ffn {enc['hidden_dim']}, "
          f"window {enc['sliding_window']}); decoder {dec['n_layers']}x dim {dec['dim']} "
          f"({dec['n_heads']}/{dec['n_kv_heads']}x{dec['head_dim']}, ffn {dec['hidden_dim']}, "
          f"vocab {dec['vocab_size']}, window {dec['sliding_window']})")
    print(f"audio {args.seconds:g} s | delay {DELAY_MS} ms | prompt {len(PROMPT)} | "
          f"per-step: median of {args.steps} after {args.warmup} warm-up | peak memory: "
          f"{peak_mb()[1]}")

    total_steps = len(PROMPT) + args.warmup + args.steps
    rng = np.random.default_rng(args.seed + 1)
    mel = (0.5 * rng.standard_normal((total_steps * MEL_PER_TOKEN, N_MELS))).astype(np.float32)
    audio = test_audio(args.seconds, args.seed)
    with tempfile.TemporaryDirectory(prefix="vr_bench_") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        write_checkpoint(folder, enc, dec, dtype, args.seed)
        size = (folder / "consolidated.safetensors").stat().st_size / 2**20
        print(f"checkpoint: {size:.0f} MiB written in {time.perf_counter() - t0:.1f} s")
        ours = bench_ours(folder, mel, audio, args.steps, args.warmup)
        peer = None
        if peer_version:
            try:
                peer = bench_peer(folder, mel, audio, args.steps, args.warmup)
            except Exception as e:  # report, keep our numbers
                print(f"peer failed: {type(e).__name__}: {e}")
    print()
    report(ours, peer, args.seconds)


if __name__ == "__main__":
    main()
