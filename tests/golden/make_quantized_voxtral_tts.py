"""Write the quantized Voxtral TTS goldens with mlx-audio 0.6.2 (run once, commit).

The tiny random checkpoint golden/voxtral_tts/ckpt (fp16 values), loaded by mlx-audio in fp32,
is quantized with mlx-audio's own converter functions
(`build_quant_predicate` with the model's predicate: codec and audio-code embeddings kept,
`quantize_model`, `save_model`, `save_config`) at 4 and 6 bits, group 64 - the layout of
mlx-community/Voxtral-4B-TTS-2603-mlx-4bit / -6bit. mlx-audio then runs each quantized model
through generate()'s loop (make_voxtral_tts.hand_loop); codes and waveforms go to golden.npz.
Voices and tekken.json are taken from golden/voxtral_tts/ckpt by the tests.

    python tests/golden/make_quantized_voxtral_tts.py [OUT]     # needs mlx-audio==0.6.2
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_voxtral_tts as base  # noqa: E402

VARIANTS = {"mlx_4bit": 4, "mlx_6bit": 6}


def flat_config(bits: int) -> dict:
    """mlx-audio's flat ModelConfig fields for the tiny model (as test_voxtral_tts writes)."""
    p = base.PARAMS
    cfg = {k: p[k] for k in ("dim", "n_layers", "head_dim", "hidden_dim", "n_heads",
                             "n_kv_heads", "vocab_size", "rope_theta", "norm_eps")}
    cfg.update(model_type="voxtral_tts", semantic_codebook_size=30, acoustic_codebook_size=21,
               n_acoustic_codebook=4, acoustic_dim=64, acoustic_n_layers=1,
               acoustic_head_dim=16, acoustic_hidden_dim=128, acoustic_n_heads=4,
               acoustic_n_kv_heads=2, tokenizer_dim=32, tokenizer_hidden_dim=64,
               tokenizer_n_heads=2, tokenizer_n_kv_heads=2, tokenizer_head_dim=16,
               tokenizer_semantic_dim=8, tokenizer_acoustic_dim=4,
               tokenizer_decoder_transformer_lengths_str="1,1,1,1")
    return cfg


def main() -> None:
    from mlx_audio.convert import build_quant_predicate
    from mlx_audio.lm.convert import quantize_model, save_config, save_model

    out = (Path(sys.argv[1]) if len(sys.argv) > 1
           else Path(__file__).parent / "quantized" / "voxtral_tts")
    ckpt = base.OUT / "ckpt"
    gold = {}
    for name, bits in VARIANTS.items():
        model = base.mlxa_model()  # loaded as mlx-audio loads the Mistral folder, in fp32
        w = model.sanitize(mx.load(str(ckpt / "consolidated.safetensors")))
        model.load_weights([(k, v.astype(mx.float32)) for k, v in w.items()
                            if not k.endswith("inv_freq")], strict=True)
        model.eval()
        _, cfg = quantize_model(model, flat_config(bits), 64, bits,
                                quant_predicate=build_quant_predicate(model))
        save_model(out / name, model)
        save_config(cfg, out / name / "config.json")
        voices = {}
        for v, _n in base.VOICES.items():
            e = mx.load(str(ckpt / "voice_embedding" / f"{v}.safetensors"))["embedding"]
            voices[v] = e.astype(mx.float32)
        model._voice_embeddings = voices
        voice = "neutral_female"
        ids = base.prompt_ids(base.VOICES[voice])
        codes, h0 = base.hand_loop(model, ids, voice, audio_step=False)
        wav = model.audio_tokenizer.decode(codes[None])[0]
        gold |= {f"{name}/codes": np.array(codes), f"{name}/wav": np.array(wav),
                 f"{name}/h0": np.array(h0[0])}
        print(name, np.array(codes).tolist())
    gold |= {"ids": np.array(ids, np.int32), "voice": np.array(voice),
             "text": np.array(base.TEXT), "seed": np.array(base.SEED)}
    np.savez_compressed(out / "golden.npz", **gold)
    print(json.dumps({n: sorted(p.name for p in (out / n).iterdir()) for n in VARIANTS}))


if __name__ == "__main__":
    main()
