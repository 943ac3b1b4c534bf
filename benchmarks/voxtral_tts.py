"""Voxtral TTS speed: ours against mlx-audio 0.6.2 on identical random weights.

    python benchmarks/voxtral_tts.py [--config tiny|mid] [--frames N]
        [--dtype float32|bfloat16] [--no-peer]

Builds a random mlx-audio model of the chosen size, writes it in the Mistral
layout (params.json, consolidated.safetensors, tekken.json, one voice) to a temp
dir, loads it with our loader and prints numbers only (no assertions):

* per-frame ms, split: backbone step (feedback embedding + one cached position),
  flow head (semantic argmax + 7 Euler steps with CFG), codec (streamed decode
  cost per frame: ours 16-frame chunks continuing a codec state, mlx-audio its
  own 25-frame chunks re-decoded with 16 context frames); mx.eval after each,
  median of --steps;
* end-to-end RTF (compute s / audio s) of `generate` for --frames frames, and
  time to first audio of the streaming APIs (both asked for a 4-frame first chunk).

The semantic END row is zeroed so random weights never stop early. `mid` keeps
all widths modest so it runs on 2 CPU cores in under 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.tekken import write_tekken  # noqa: E402

N_SPECIAL = 100
CONFIGS = {
    "tiny": dict(dim=64, n_layers=2, head_dim=16, hidden_dim=128, n_heads=4, n_kv_heads=2,
                 semantic=30, n_ac=4, a_layers=1, c_dim=32, c_hidden=64, c_heads=2,
                 c_lengths="1,1,1,1", n_voice=8),
    "mid": dict(dim=768, n_layers=4, head_dim=64, hidden_dim=2048, n_heads=12, n_kv_heads=4,
                semantic=1024, n_ac=36, a_layers=3, c_dim=256, c_hidden=1024, c_heads=4,
                c_lengths="2,2,2,2", n_voice=50),
}
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}


def build_checkpoint(c: dict, folder: Path, dtype: mx.Dtype):
    from mlx_audio.tts.models.voxtral_tts.voxtral_tts import Model, ModelConfig

    sys.path.insert(0, str(ROOT / "tests" / "golden"))
    from make_voxtral_tts import mistral_name

    vocab = N_SPECIAL + 256
    c_head_dim = c["c_dim"] // c["c_heads"]
    cfg = ModelConfig(
        dim=c["dim"], n_layers=c["n_layers"], head_dim=c["head_dim"], hidden_dim=c["hidden_dim"],
        n_heads=c["n_heads"], n_kv_heads=c["n_kv_heads"], vocab_size=vocab,
        semantic_codebook_size=c["semantic"], n_acoustic_codebook=c["n_ac"],
        num_codebooks=c["n_ac"] + 1, acoustic_dim=c["dim"], acoustic_n_layers=c["a_layers"],
        acoustic_head_dim=c["head_dim"], acoustic_hidden_dim=c["hidden_dim"],
        acoustic_n_heads=c["n_heads"], acoustic_n_kv_heads=c["n_kv_heads"],
        tokenizer_dim=c["c_dim"], tokenizer_hidden_dim=c["c_hidden"],
        tokenizer_n_heads=c["c_heads"], tokenizer_n_kv_heads=c["c_heads"],
        tokenizer_head_dim=c_head_dim, tokenizer_semantic_dim=16, tokenizer_acoustic_dim=c["n_ac"],
        tokenizer_decoder_transformer_lengths_str=c["c_lengths"])
    model = Model(cfg)
    mx.random.seed(0)

    def pert(k, p):
        if k.endswith(("original1", "embedding_sum")):
            p = mx.random.normal(p.shape)
        elif k.endswith("cluster_usage"):
            p = mx.random.uniform(0.5, 2.0, p.shape)
        else:
            p = p + 0.02 * mx.random.normal(p.shape)
        return p.astype(dtype)

    model.update(tree_unflatten([(k, pert(k, v)) for k, v in tree_flatten(model.parameters())]))
    w = model.acoustic_transformer.semantic_codebook_output.weight
    w[1] = 0.0
    model.acoustic_transformer.semantic_codebook_output.weight = w
    model.eval()
    mx.eval(model.parameters())

    params = {
        "dim": c["dim"], "n_layers": c["n_layers"], "head_dim": c["head_dim"],
        "hidden_dim": c["hidden_dim"], "n_heads": c["n_heads"], "n_kv_heads": c["n_kv_heads"],
        "rope_theta": 1e6, "norm_eps": 1e-5, "vocab_size": vocab, "model_type": "voxtral_tts",
        "multimodal": {"audio_model_args": {
            "semantic_codebook_size": c["semantic"], "acoustic_codebook_size": 21,
            "n_acoustic_codebook": c["n_ac"],
            "acoustic_transformer_args": {
                "input_dim": c["dim"], "dim": c["dim"], "n_layers": c["a_layers"],
                "head_dim": c["head_dim"], "hidden_dim": c["hidden_dim"],
                "n_heads": c["n_heads"], "n_kv_heads": c["n_kv_heads"]}},
            "audio_tokenizer_args": {
                "semantic_codebook_size": c["semantic"], "semantic_dim": 16,
                "acoustic_codebook_size": 21, "acoustic_dim": c["n_ac"], "dim": c["c_dim"],
                "hidden_dim": c["c_hidden"], "head_dim": c_head_dim, "n_heads": c["c_heads"],
                "n_kv_heads": c["c_heads"], "decoder_transformer_lengths_str": c["c_lengths"],
                "decoder_convs_kernels_str": "3,4,4,4", "decoder_convs_strides_str": "1,2,2,2",
                "voice": {"v": 0}}}}
    (folder / "voice_embedding").mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps(params))
    mx.save_safetensors(str(folder / "consolidated.safetensors"),
                        {mistral_name(k): v for k, v in tree_flatten(model.parameters())})
    write_tekken(folder / "tekken.json", [], num_special=N_SPECIAL,
                 audio={"voice_num_audio_tokens": {"v": c["n_voice"]}})
    voice = (0.5 * mx.random.normal((c["n_voice"], c["dim"]))).astype(dtype)
    mx.save_safetensors(str(folder / "voice_embedding" / "v.safetensors"), {"embedding": voice})
    model._voice_embeddings = {"v": voice}
    return model


def median_ms(fn, steps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


def bench_ours(tts, text: str, frames: int, steps: int) -> dict:
    m = tts.model
    rows = tts._voices["v"]
    prompt = m.embed_prompt(tts.prompt_ids(text, rows.shape[0]), rows, tts.ids["audio"])
    cache = m.make_cache()
    t_table = m.acoustic_transformer.time_table()
    h = m.hidden(prompt, cache)[:, -1]
    mx.eval(h, t_table)
    n_ac = m.config.n_acoustic_codebook
    noise = mx.random.normal((1, n_ac))
    codes = m.decode_frame(h, noise, t_table)
    mx.eval(codes)

    def backbone():
        mx.eval(m.hidden(m.feedback(codes), cache)[:, -1])

    def flow():
        mx.eval(tts.decode_frame(h, noise, t_table))

    chunk = mx.array(np.tile(np.array(codes), (16, 1)))[None]
    state = m.audio_tokenizer.make_state()
    codec = median_ms(lambda: mx.eval(m.audio_tokenizer(chunk, state), *state.arrays()),
                      max(3, steps // 4)) / 16
    out = dict(backbone=median_ms(backbone, steps), flow=median_ms(flow, steps), codec=codec)
    tts.generate(text, "v", max_frames=2)  # warm
    t = time.perf_counter()
    a = tts.generate(text, "v", max_frames=frames)
    out["rtf"] = (time.perf_counter() - t) / a.duration
    t = time.perf_counter()
    next(iter(tts.stream(text, "v", max_frames=frames)))
    out["ttfa"] = time.perf_counter() - t
    return out


def bench_peer(model, ids: list[int], frames: int, steps: int) -> dict:
    from mlx_audio.lm.models.cache import make_prompt_cache

    lm = model.language_model.model.model
    x = mx.array(ids)[None]
    cache = make_prompt_cache(model.language_model.model)
    hidden = lm(x, cache=cache, input_embeddings=model._build_input_embeddings(x, "v"))
    h = hidden[:, -1]
    at = model.acoustic_transformer
    codes = at.decode_one_frame(h)
    mx.eval(codes)
    emb = model.audio_codebook_embeddings["embeddings"]
    dummy = mx.array([[24]])

    def backbone():
        e = emb(model._codes_to_global_indices(codes)).sum(1, keepdims=True)
        mx.eval(lm(dummy, cache=cache, input_embeddings=e)[:, -1])

    chunk = mx.array(np.tile(np.array(codes), (16 + 25, 1)))[None]
    codec = median_ms(lambda: mx.eval(model.audio_tokenizer.decode(chunk)), max(3, steps // 4))
    out = dict(backbone=median_ms(backbone, steps),
               flow=median_ms(lambda: mx.eval(at.decode_one_frame(h)), steps), codec=codec / 25)
    model.tokenizer = object()
    model._encode_text = lambda text, v: ids
    list(model.generate("x", voice="v", max_tokens=2))
    t = time.perf_counter()
    res = list(model.generate("x", voice="v", max_tokens=frames))
    out["rtf"] = (time.perf_counter() - t) / (res[-1].audio.shape[0] / 24000)
    t = time.perf_counter()
    next(iter(model.generate("x", voice="v", max_tokens=frames, stream=True,
                             streaming_interval=0.32)))
    out["ttfa"] = time.perf_counter() - t
    return out


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args()
    from mlx_speech.models import voxtral_tts as vt

    c, dtype = CONFIGS[args.config], DTYPES[args.dtype]
    text = "Hello there, this is a test."
    with tempfile.TemporaryDirectory() as d:
        peer = build_checkpoint(c, Path(d), dtype)
        tts = vt.load(d, alibi="mlxa")
        ids = tts.prompt_ids(text, c["n_voice"])
        ours = bench_ours(tts, text, args.frames, args.steps)
        theirs = None if args.no_peer else bench_peer(peer, ids, args.frames, args.steps)
    print(f"voxtral_tts --config {args.config} --dtype {args.dtype}  mlx {mx.__version__} "
          f"{mx.default_device()}  frames {args.frames}")
    print(f"{'':12}{'ours':>10}" + ("" if theirs is None else f"{'mlx-audio':>12}{'ratio':>8}"))
    for k, unit in [("backbone", "ms"), ("flow", "ms"), ("codec", "ms"), ("rtf", ""),
                    ("ttfa", "s")]:
        line = f"{k + ' ' + unit:12}{ours[k]:10.3f}"
        if theirs is not None:
            line += f"{theirs[k]:12.3f}{ours[k] / theirs[k]:8.2f}"
        print(line)
    frame = ours["backbone"] + ours["flow"] + ours["codec"]
    if theirs is not None:
        tf = theirs["backbone"] + theirs["flow"] + theirs["codec"]
        print(f"{'frame ms':12}{frame:10.3f}{tf:12.3f}{frame / tf:8.2f}")
    else:
        print(f"{'frame ms':12}{frame:10.3f}")


if __name__ == "__main__":
    main()
