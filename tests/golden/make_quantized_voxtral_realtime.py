"""Write the quantized Voxtral Realtime goldens with mlx-audio and voxmlx (run once, commit).

A random float32 checkpoint in the Mistral-native layout (benchmarks/voxtral_realtime.py's
writer, widths 64 so every layer quantizes) is turned into the published MLX layouts by
their producers' own code:

- `mlx_audio_4bit/`: mlx-audio's `quantize_model` + `save_model` + `save_config` with its
  Voxtral predicate (the current converter: embeddings and adapter quantized);
- `mlx_audio_4bit_keep/`: the same with the embedding and adapter kept in bf16 (the
  published mlx-community ...-2602-4bit);
- `mlx_audio_fp16/`: the same names, not quantized, in float16 (mlx-community ...-fp16);
- `voxmlx_6bit/`, `voxmlx_8bit/`: voxmlx 0.0.2's own `convert` (params.json + quantization).

Each producer's model then runs a fixed mel through its encoder + adapter and greedily decodes
(teacher-forced full forwards) from the streaming prompt; adapter outputs, the logits that
chose each token and the tokens go to golden.npz (tekken.json is left to the tests).

    pip install mlx-audio==0.6.2; pip install --target /tmp/site voxmlx==0.0.2 --no-deps
    PYTHONPATH=/tmp/site python tests/golden/make_quantized_voxtral_realtime.py [OUT]
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from voxtral_realtime import params_json, write_checkpoint  # noqa: E402

ENC = dict(dim=64, n_layers=2, n_heads=4, head_dim=16, hidden_dim=128, sliding_window=750)
DEC = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128,
           vocab_size=1100, sliding_window=8192)
BOS, PAD, N_LEFT, N_DELAY, DELAY_MS = 1, 32, 32, 6, 480
PROMPT = [BOS] + [PAD] * (N_LEFT + N_DELAY)
N_TOKENS, SEED = 48, 3


def test_mel() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    mel = 0.5 * rng.standard_normal((128, 8 * N_TOKENS))
    return mel.astype(np.float16).astype(np.float32)  # stored as float16, exactly


def mlx_audio_model(src: Path):
    """mlx-audio's Model for our widths (its adapter is hard-coded to 3072 outputs)."""
    from mlx_audio.stt.models.voxtral_realtime.config import ModelConfig
    from mlx_audio.stt.models.voxtral_realtime.voxtral_realtime import Model

    p = json.loads((src / "params.json").read_text())
    e = p["multimodal"]["whisper_model_args"]["encoder_args"]
    cfg = {"model_type": "voxtral_realtime",
           "encoder_args": {k: e[k] for k in ENC} | {"n_kv_heads": e["n_heads"],
                                                      "downsample_factor": 4},
           "decoder": {k: p[k] for k in DEC} | {"ada_rms_norm_t_cond_dim": 32},
           "transcription_delay_ms": DELAY_MS}
    model = Model(ModelConfig.from_dict(cfg))
    model.encoder.audio_language_projection_0 = nn.Linear(4 * ENC["dim"], DEC["dim"], bias=False)
    model.encoder.audio_language_projection_2 = nn.Linear(DEC["dim"], DEC["dim"], bias=False)
    return model, cfg


def write_mlx_audio(src: Path, out: Path, bits: int | None, group: int | None,
                    keep_emb: bool = False) -> None:
    """As mlx_audio.convert does; `bits=None`: not quantized, saved in float16 (the -fp16)."""
    from mlx_audio.convert import build_quant_predicate
    from mlx_audio.lm.convert import quantize_model, save_config, save_model

    model, cfg = mlx_audio_model(src)
    model.load_weights(list(model.sanitize(mx.load(str(src / "consolidated.safetensors")))
                            .items()))
    if bits is None:
        model.load_weights([(k, v.astype(mx.float16))
                            for k, v in tree_flatten(model.parameters())])
        save_model(out, model)
        save_config(cfg, out / "config.json")
        shutil.copy(src / "tekken.json", out / "tekken.json")
        return
    predicate = build_quant_predicate(model)
    if keep_emb:  # the published 4bit: embedding (tied head) and adapter stay bf16
        base = predicate

        def predicate(p, m):
            return base(p, m) and "tok_embeddings" not in p and "audio_language" not in p
    model.load_weights(list(dict(tree_flatten(model.parameters())).items()))
    _, cfg = quantize_model(model, cfg, group, bits, quant_predicate=predicate)
    save_model(out, model)
    save_config(cfg, out / "config.json")
    shutil.copy(src / "tekken.json", out / "tekken.json")


def write_voxmlx(src: Path, out: Path, bits: int, group: int) -> None:
    import voxmlx.convert as vc

    vc.download_model = lambda p: Path(p)  # a local folder, not a hub id
    vc.convert(hf_path=str(src), mlx_path=str(out), quantize=True, q_group_size=group,
               q_bits=bits)


def run_mlx_audio(folder: Path, src: Path, mel: np.ndarray) -> tuple:
    from mlx_audio.utils import apply_quantization, load_weights

    model, _ = mlx_audio_model(src)
    config = json.loads((folder / "config.json").read_text())
    weights = model.sanitize(load_weights(folder))
    apply_quantization(model, config, weights, model.model_quant_predicate)
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    model._ensure_ada_scales(DELAY_MS)
    a = model.encoder(mx.array(mel))
    d = model.decoder

    def logits(tokens):
        h, _ = d.forward(a[: len(tokens)] + d.embed_tokens(mx.array(tokens)), start_pos=0)
        return d.logits(h)

    return a, greedy(logits)


def run_voxmlx(folder: Path, mel: np.ndarray) -> tuple:
    from voxmlx.weights import load_model

    model, _ = load_model(folder)
    a = model.encode(mx.array(mel))
    t_cond = model.time_embedding(mx.array([N_DELAY], dtype=mx.float32))

    def logits(tokens):
        x = a[: len(tokens)] + model.language_model.embed(mx.array(tokens))
        return model.decode(x[None], t_cond, "causal")[0]

    return a, greedy(logits)


def greedy(logits_fn) -> tuple[np.ndarray, np.ndarray]:
    tokens = list(PROMPT)
    while len(tokens) < N_TOKENS:
        tokens.append(int(mx.argmax(logits_fn(tokens)[-1]).item()))
    logits = logits_fn(tokens)[len(PROMPT) - 1:]  # the positions that chose a token
    return np.array(tokens[len(PROMPT):]), np.array(logits.astype(mx.float32))


def main() -> None:
    out = (Path(sys.argv[1]) if len(sys.argv) > 1
           else Path(__file__).parent / "quantized" / "voxtral_realtime")
    shutil.rmtree(out, ignore_errors=True)
    src = out / "fp32"
    src.mkdir(parents=True)
    mx.random.seed(SEED)
    # float32: random weights give close logits, and bf16 rounding would flip near-ties
    write_checkpoint(src, ENC, DEC, mx.float32, SEED)
    assert json.loads((src / "params.json").read_text()) == params_json(ENC, DEC)
    write_mlx_audio(src, out / "mlx_audio_4bit", 4, 64, keep_emb=False)
    write_mlx_audio(src, out / "mlx_audio_4bit_keep", 4, 64, keep_emb=True)
    write_mlx_audio(src, out / "mlx_audio_fp16", None, None)  # compared tensor by tensor
    write_voxmlx(src, out / "voxmlx_6bit", 6, 64)
    write_voxmlx(src, out / "voxmlx_8bit", 8, 32)
    mel = test_mel()
    gold = {"mel": mel.astype(np.float16)}
    for name in ("mlx_audio_4bit", "mlx_audio_4bit_keep", "voxmlx_6bit", "voxmlx_8bit"):
        if name.startswith("mlx_audio"):
            a, (tokens, logits) = run_mlx_audio(out / name, src, mel)
        else:
            a, (tokens, logits) = run_voxmlx(out / name, mel)
        gold |= {f"{name}/adapter": np.array(a.astype(mx.float32)),
                 f"{name}/tokens": tokens, f"{name}/logits": logits}
        print(name, "tokens", tokens.tolist())
    np.savez_compressed(out / "golden.npz", **gold)
    for f in out.rglob("tekken.json"):
        f.unlink()  # the tests write it (tests/support/tekken.py)


if __name__ == "__main__":
    main()
