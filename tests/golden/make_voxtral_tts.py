"""Write the Voxtral TTS goldens: a tiny random checkpoint + mlx-audio 0.6.2 outputs.

    python tests/golden/make_voxtral_tts.py      # needs mlx-audio==0.6.2 (no torch)

Writes tests/golden/voxtral_tts/ckpt/ in the REAL Mistral layout (params.json
with `*_str` fields, consolidated.safetensors with Mistral key names and
weight-normed codec convs, tekken.json, voice_embedding/<name>.safetensors) and
golden.npz with mlx-audio's prompt state, codes and waveforms. Weights are
fp16-representable and stored as fp16; mlx-audio runs them in fp32.

Noise: mlx-audio draws one un-keyed `mx.random.normal((1, n_acoustic))` per frame
after `mx.random.seed(seed)`; we check that equals the keyed split scheme of
mlx_speech.models.voxtral_tts.step (draw_noise) and store it too.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.support.tekken import write_tekken  # noqa: E402

OUT = Path(__file__).parent / "voxtral_tts"
SEED, FRAMES, TEXT = 3, 6, "Hi there."
NUM_SPECIAL = 100
VOICES = {"casual_male": 3, "neutral_female": 5}

PARAMS = {
    "dim": 64, "n_layers": 2, "head_dim": 16, "hidden_dim": 128, "n_heads": 4, "n_kv_heads": 2,
    "rope_theta": 1e6, "norm_eps": 1e-5, "vocab_size": NUM_SPECIAL + 256, "max_seq_len": 4096,
    "model_type": "voxtral_tts", "max_position_embeddings": 4096,
    "multimodal": {
        "bos_token_id": 1,
        "audio_model_args": {
            "semantic_codebook_size": 30, "acoustic_codebook_size": 21, "n_acoustic_codebook": 4,
            "audio_token_id": 24, "begin_audio_token_id": 25, "input_embedding_concat_type": "sum",
            "p_uncond": 0.0, "text_feature_bugged": False, "condition_dropped_token_id": 42,
            "audio_encoding_args": {"codebook_pattern": "parallel", "num_codebooks": 5,
                                    "sampling_rate": 24000, "frame_rate": 12.5},
            "acoustic_transformer_args": {"input_dim": 64, "dim": 64, "n_layers": 1,
                                          "head_dim": 16, "hidden_dim": 128, "n_heads": 4,
                                          "n_kv_heads": 2, "use_biases": False,
                                          "rope_theta": 10000.0, "sigma": 1e-5,
                                          "sigma_max": 1.0},
        },
        "audio_tokenizer_args": {
            "channels": 1, "sampling_rate": 24000, "pretransform_patch_size": 240,
            "patch_proj_kernel_size": 7, "semantic_codebook_size": 30, "semantic_dim": 8,
            "acoustic_codebook_size": 21, "acoustic_dim": 4, "conv_weight_norm": True,
            "causal": True, "attn_sliding_window_size": 16,
            "half_attn_window_upon_downsampling": True, "dim": 32, "hidden_dim": 64,
            "head_dim": 16, "n_heads": 2, "n_kv_heads": 2, "qk_norm_eps": 1e-6,
            "qk_norm": True, "use_biases": False, "norm_eps": 0.01, "layer_scale": True,
            "layer_scale_init": 0.01, "decoder_transformer_lengths_str": "1,1,1,1",
            "decoder_convs_kernels_str": "3,4,4,4", "decoder_convs_strides_str": "1,2,2,2",
            "voice": {name: i for i, name in enumerate(VOICES)},
        },
    },
}


def mlxa_model():
    from mlx_audio.tts.models.voxtral_tts.voxtral_tts import Model, ModelConfig

    cfg = ModelConfig(
        dim=64, n_layers=2, head_dim=16, hidden_dim=128, n_heads=4, n_kv_heads=2,
        vocab_size=NUM_SPECIAL + 256, semantic_codebook_size=30, acoustic_codebook_size=21,
        n_acoustic_codebook=4, num_codebooks=5, acoustic_dim=64, acoustic_n_layers=1,
        acoustic_head_dim=16, acoustic_hidden_dim=128, acoustic_n_heads=4, acoustic_n_kv_heads=2,
        tokenizer_dim=32, tokenizer_hidden_dim=64, tokenizer_n_heads=2, tokenizer_n_kv_heads=2,
        tokenizer_head_dim=16, tokenizer_semantic_dim=8, tokenizer_acoustic_dim=4,
        tokenizer_decoder_transformer_lengths_str="1,1,1,1",
    )
    return Model(cfg)


def randomize(model) -> None:
    """Every float perturbed; zero-init conv directions / codebook made random;
    layer scales ~0.3 so the codec transformers matter; semantic END row zeroed."""
    mx.random.seed(0)

    def pert(name, p):
        if not mx.issubdtype(p.dtype, mx.floating):
            return p
        if name.endswith("original1") or name.endswith("embedding_sum"):
            p = mx.random.normal(p.shape)
        elif name.endswith("cluster_usage"):
            p = mx.random.uniform(0.5, 2.0, p.shape)
        elif name.endswith(("attention_scale", "ffn_scale")):
            p = 0.3 + 0.1 * mx.random.normal(p.shape)
        else:
            p = p + 0.05 * mx.random.normal(p.shape)
        return p.astype(mx.float16).astype(mx.float32)  # exactly representable in fp16

    flat = [(k, pert(k, v)) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(flat))
    w = model.acoustic_transformer.semantic_codebook_output.weight
    w[1] = 0.0  # END logit 0: never the argmax here
    model.acoustic_transformer.semantic_codebook_output.weight = w
    model.eval()


def mistral_name(k: str) -> str:
    lm = "language_model.model.model."
    if k.startswith(lm):
        k = k[len(lm):]
        if k.startswith("embed_tokens."):
            return "mm_audio_embeddings.tok_embeddings." + k[len("embed_tokens."):]
        for a, b in [("self_attn.q_proj", "attention.wq"), ("self_attn.k_proj", "attention.wk"),
                     ("self_attn.v_proj", "attention.wv"), ("self_attn.o_proj", "attention.wo"),
                     ("mlp.gate_proj", "feed_forward.w1"), ("mlp.down_proj", "feed_forward.w2"),
                     ("mlp.up_proj", "feed_forward.w3"), ("input_layernorm", "attention_norm"),
                     ("post_attention_layernorm", "ffn_norm")]:
            k = k.replace(a, b)
        return k
    if k.startswith("audio_codebook_embeddings."):
        return "mm_audio_embeddings." + k
    assert k.startswith(("acoustic_transformer.", "audio_tokenizer.")), k
    return k


def prompt_ids(n_voice: int) -> list[int]:
    return [1, 25] + [24] * n_voice + [36] + [b + NUM_SPECIAL for b in TEXT.encode()] + [35, 25]


def keyed_noise(seed: int, n: int, dim: int) -> mx.array:
    state, rows = mx.random.key(seed), []
    for _ in range(n):
        state, sub = mx.random.split(state)
        rows.append(mx.random.normal((1, dim), key=sub))
    return mx.concatenate(rows)


def hand_loop(model, ids, voice, audio_step: bool):
    """mlx-audio's generate() loop, by hand, returning codes and the prefill state."""
    from mlx_audio.lm.models.cache import make_prompt_cache

    lm = model.language_model.model.model
    x = mx.array(ids)[None]
    cache = make_prompt_cache(model.language_model.model)
    hidden = lm(x, cache=cache, input_embeddings=model._build_input_embeddings(x, voice))
    h0 = hidden[:, -1]
    if audio_step:
        hidden = lm(mx.array([[24]]), cache=cache)
    mx.random.seed(SEED)
    frames = []
    for _ in range(FRAMES):
        codes = model.acoustic_transformer.decode_one_frame(hidden[:, -1])
        assert codes[0, 0].item() > 1
        frames.append(codes)
        e = model.audio_codebook_embeddings["embeddings"](model._codes_to_global_indices(codes))
        hidden = lm(mx.array([[24]]), cache=cache, input_embeddings=e.sum(1, keepdims=True))
    return mx.concatenate(frames), h0


def main(out: Path = OUT) -> None:
    model = mlxa_model()
    randomize(model)
    ckpt = out / "ckpt"
    (ckpt / "voice_embedding").mkdir(parents=True, exist_ok=True)
    (ckpt / "params.json").write_text(json.dumps(PARAMS, indent=1))
    flat = {mistral_name(k): v.astype(mx.float16) for k, v in tree_flatten(model.parameters())}
    half = 32  # acoustic dim 64: vllm-omni's persistent inv_freq buffer
    flat["acoustic_transformer.time_embedding.inv_freq"] = mx.exp(
        -math.log(10000.0) * mx.arange(half, dtype=mx.float32) / half)
    mx.save_safetensors(str(ckpt / "consolidated.safetensors"), flat)

    write_tekken(ckpt / "tekken.json", [], num_special=NUM_SPECIAL,
                 audio={"sampling_rate": 24000, "frame_rate": 12.5,
                        "voice_num_audio_tokens": VOICES})

    mx.random.seed(1)
    voices = {}
    for name, n in VOICES.items():
        v = (0.5 * mx.random.normal((n, 64))).astype(mx.float16)
        mx.save_safetensors(str(ckpt / "voice_embedding" / f"{name}.safetensors"),
                            {"embedding": v})
        voices[name] = v.astype(mx.float32)
    voice = "neutral_female"
    model._voice_embeddings = voices

    # noise: mlx-audio's un-keyed draws == our keyed split scheme
    mx.random.seed(SEED)
    unkeyed = mx.concatenate([mx.random.normal((1, 4)) for _ in range(FRAMES)])
    noise = keyed_noise(SEED, FRAMES, 4)
    assert mx.array_equal(unkeyed, noise).item(), "noise schemes differ"

    ids = prompt_ids(VOICES[voice])
    codes, h0 = hand_loop(model, ids, voice, audio_step=False)
    codes_step, _ = hand_loop(model, ids, voice, audio_step=True)
    wav = model.audio_tokenizer.decode(codes[None])[0]

    # the real generate() loop, with the prompt ids injected (no mistral-common here)
    model.tokenizer = object()
    model._encode_text = lambda text, v: ids
    mx.random.seed(SEED)
    gen = list(model.generate(TEXT, voice=voice, max_tokens=FRAMES))
    gen_wav = gen[-1].audio
    diff = mx.abs(gen_wav - wav).max().item()
    assert gen_wav.shape == wav.shape and diff == 0.0, f"generate() differs from loop: {diff}"

    slopes_vo = mx.array([2.0 ** (-8.0 * h / 2) for h in range(2)])
    model.audio_tokenizer._alibi_slopes = slopes_vo
    wav_vo = model.audio_tokenizer.decode(codes[None])[0]

    np.savez_compressed(
        out / "golden.npz", ids=np.array(ids, np.int32), h0=np.array(h0[0]),
        noise=np.array(noise), codes=np.array(codes), codes_audio_step=np.array(codes_step),
        wav_mlxa=np.array(wav), wav_vo=np.array(wav_vo), seed=np.array(SEED),
        voice=np.array(voice), text=np.array(TEXT))
    print("codes", np.array(codes).tolist())
    print("codes_audio_step", np.array(codes_step).tolist())
    print("wav", wav.shape, float(mx.abs(wav).max()), "vo vs mlxa",
          float(mx.abs(wav - wav_vo).max()))
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
