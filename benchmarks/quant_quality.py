"""Quality cost of on-the-fly quantization, per family, on the random test checkpoints.

    python benchmarks/quant_quality.py [--bits 8 4] [--group-size 64]

Each family runs the same inputs in float32, in bf16 (`load(..., dtype=bfloat16)`) and quantized
(`load(..., dtype=bfloat16, quantize=B, group_size=G)`, the family's keep rule applied):
Voxtral Realtime and Moshi teacher-forced next-token logits, Voxtral TTS the semantic-head
logits along the prompt, Nemotron the encoder output (the tiny checkpoint's joint is
ill-conditioned: bf16 alone moves its logits by a third of their range). Prints the max / mean
|error| relative to the float32 row's max |value| and the argmax agreement with float32; the
bf16 row is the floor quantization adds to. Random weights are not trained ones: read the
numbers as the size of the rounding each setting adds, not as word error rates. Numbers only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlx_speech  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized import quality  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"


def compare(ref: mx.array, got: mx.array) -> tuple[float, float, float]:
    """Max / mean logit error relative to each row's largest |logit|, and argmax agreement: the
    metric benchmarks/quantized.py reports, so the two benchmarks read alike."""
    r, g = np.array(ref.astype(mx.float32)), np.array(got.astype(mx.float32))
    return quality(r.reshape(-1, r.shape[-1]), g.reshape(-1, g.shape[-1]))


def voxtral_realtime(folder: Path, **kw) -> mx.array:
    m = mlx_speech.load(folder, **kw).model
    rng = np.random.default_rng(0)
    T = 64
    mel = mx.array(rng.standard_normal((1, 8 * T, 128)).astype(np.float32))
    tokens = mx.array(rng.integers(0, 1100, (1, T)))
    return m(tokens, m.embed_audio(mel), m.ffn_scales(6))


def moshi(folder: Path, **kw) -> mx.array:
    d = mlx_speech.load(folder, **kw)
    lm, rng = d.lm, np.random.default_rng(0)
    T = 32
    toks = np.concatenate([rng.integers(0, lm.config.text_card, (1, 1, T)),
                           rng.integers(0, lm.config.card, (1, lm.config.n_q, T))], axis=1)
    _, logits = lm.forward_tokens(mx.array(toks))
    return logits


def voxtral_tts(folder: Path, **kw) -> mx.array:
    t = mlx_speech.load(folder, **kw)
    voice = t.voices[0]
    ids = t.prompt_ids("Hello there, how are you today?", t._voices[voice].shape[0])
    h = t.model.hidden(t.model.embed_prompt(ids, t._voices[voice], t.ids["audio"]))[0]
    return t.model.acoustic_transformer.semantic_codebook_output(h)


def nemotron(folder: Path, **kw) -> mx.array:
    asr = mlx_speech.load(folder, **kw)
    m = asr.model
    audio = np.load(GOLDEN / "nemotron" / "golden.npz")["audio"]
    mel = mx.array(np.asarray(asr.features(audio)))[None].astype(m.dtype)
    return m.encoder(mel, 13)


def vr_mid(tmp: Path) -> Path:
    """Voxtral Realtime at mid widths (encoder 256, decoder 512, 2 layers each)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from voxtral_realtime import write_checkpoint

    d = tmp / "vr_mid"
    d.mkdir()
    write_checkpoint(d, dict(dim=256, n_layers=2, n_heads=4, head_dim=64, hidden_dim=1024,
                             sliding_window=750),
                     dict(dim=512, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=64,
                          hidden_dim=1536, vocab_size=1100, sliding_window=8192),
                     mx.float32, 0)
    return d


def main(argv=None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, nargs="+", default=[8, 4])
    ap.add_argument("--group-size", type=int, default=64)
    args = ap.parse_args(argv)
    from tests.support.moshi import write_folder
    from tests.support.tekken import VOXTRAL_AUDIO, write_tekken

    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        vr = tmp / "vr_tiny"
        shutil.copytree(GOLDEN / "quantized" / "voxtral_realtime" / "fp32", vr)
        write_tekken(vr / "tekken.json", [], vocab_size=1100, audio=VOXTRAL_AUDIO)
        import json

        kw = json.loads((GOLDEN / "quantized" / "moshi" / "lm_config.json").read_text())
        mo = write_folder(tmp / "moshi", kw, GOLDEN / "quantized" / "moshi" / "model.safetensors")
        cases = [
            ("Voxtral Realtime tiny (64)", voxtral_realtime, vr, args.group_size),
            ("Voxtral Realtime mid (256/512)", voxtral_realtime, vr_mid(tmp), args.group_size),
            ("Moshi tiny (64)", moshi, mo, args.group_size),
            ("Voxtral TTS tiny (64)", voxtral_tts, GOLDEN / "voxtral_tts" / "ckpt",
             args.group_size),
            ("Nemotron tiny (32, group 32) enc", nemotron, GOLDEN / "nemotron", 32),
        ]
        print(f"mlx {mx.__version__} | {mx.default_device()} | baseline float32 | "
              "relative error = |x - fp32| / max|fp32| per row; quantized models run in bf16")
        print(f"{'model':34s} {'weights':>8s} {'max rel':>9s} {'mean rel':>9s} "
              f"{'argmax agree':>13s}")
        bf16 = {"dtype": mx.bfloat16}
        for name, fn, folder, group in cases:
            ref = fn(folder, dtype=mx.float32)
            rows = [("bf16", bf16)] + [(f"q{b}-g{group}", {**bf16, "quantize": b,
                                                            "group_size": group})
                                       for b in args.bits]
            for label, kw in rows:
                mx_, mean_, agree = compare(ref, fn(folder, **kw))
                print(f"{name:34s} {label:>8s} {mx_:9.4f} {mean_:9.5f} {agree:13.3f}")


if __name__ == "__main__":
    main()
