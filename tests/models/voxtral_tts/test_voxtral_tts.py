"""Voxtral TTS: loader, config, parity with mlx-audio 0.6.2 goldens, generation API."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_speech.errors import CheckpointError, MlxSpeechError
from mlx_speech.models import voxtral_tts as vt
from mlx_speech.models.voxtral_tts.config import VoxtralTTSConfig
from mlx_speech.models.voxtral_tts.model import Model
from mlx_speech.models.voxtral_tts.step import frame_codes
from mlx_speech.models.voxtral_tts.text import normalize, split_sentences
from tests.support.voxtral import TTS_CKPT as CKPT
from tests.support.voxtral import TTS_GOLDEN as GOLDEN
from tests.support.voxtral import random_codes as _random_codes


@pytest.fixture(scope="module")
def g():
    return dict(np.load(GOLDEN / "golden.npz"))


@pytest.fixture(scope="module")
def tts():
    return vt.load(CKPT, dtype=mx.float32, alibi="mlxa")


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "ckpt"
    shutil.copytree(CKPT, dest)
    return dest


def _edit_weights(folder: Path, fn) -> None:
    f = folder / "consolidated.safetensors"
    w = dict(mx.load(str(f)))
    fn(w)
    mx.save_safetensors(str(f), w)


# ---------------------------------------------------------------- config


FULL_PARAMS = {
    "dim": 3072, "n_layers": 26, "head_dim": 128, "hidden_dim": 9216, "n_heads": 32,
    "n_kv_heads": 8, "rope_theta": 1e6, "norm_eps": 1e-5, "vocab_size": 131072,
    "max_seq_len": 65536, "model_type": "voxtral_tts", "max_position_embeddings": 128000,
    "multimodal": {
        "bos_token_id": 1,
        "audio_model_args": {
            "semantic_codebook_size": 8192, "acoustic_codebook_size": 21,
            "n_acoustic_codebook": 36, "audio_token_id": 24, "begin_audio_token_id": 25,
            "input_embedding_concat_type": "sum", "p_uncond": 0.0,
            "text_feature_bugged": False, "condition_dropped_token_id": 42,
            "audio_encoding_args": {"codebook_pattern": "parallel", "num_codebooks": 37,
                                    "interleave_audio_tokens_per_segment": 8192,
                                    "interleave_text_tokens_per_segment": 8192,
                                    "single_trailing_segment": False,
                                    "sampling_rate": 24000, "frame_rate": 12.5},
            "acoustic_transformer_args": {"input_dim": 3072, "dim": 3072, "n_layers": 3,
                                          "head_dim": 128, "hidden_dim": 9216, "n_heads": 32,
                                          "n_kv_heads": 8, "use_biases": False,
                                          "rope_theta": 10000.0, "sigma": 1e-5,
                                          "sigma_max": 1.0}},
        "audio_tokenizer_args": {
            "channels": 1, "sampling_rate": 24000, "pretransform_patch_size": 240,
            "patch_proj_kernel_size": 7, "semantic_codebook_size": 8192, "semantic_dim": 256,
            "acoustic_codebook_size": 21, "acoustic_dim": 36, "conv_weight_norm": True,
            "causal": True, "attn_sliding_window_size": 16,
            "half_attn_window_upon_downsampling": True, "dim": 1024, "hidden_dim": 4096,
            "head_dim": 128, "n_heads": 8, "n_kv_heads": 8, "qk_norm_eps": 1e-6,
            "qk_norm": True, "use_biases": False, "norm_eps": 0.01, "layer_scale": True,
            "layer_scale_init": 0.01, "decoder_transformer_lengths_str": "2,2,2,2",
            "decoder_convs_kernels_str": "3,4,4,4", "decoder_convs_strides_str": "1,2,2,2",
            "voice": {"casual_female": 0, "casual_male": 1, "neutral_female": 3,
                      "cheerful_female": 2}}},
}


def test_full_config_gives_spec_shapes():
    c = VoxtralTTSConfig.from_params(FULL_PARAMS)
    assert c.codec.lengths == [2, 2, 2, 2] and c.codec.strides == [1, 2, 2, 2]
    assert c.codec.windows == [2, 4, 8, 16] and c.codec.frame_samples == 1920
    assert c.semantic_head_rows == 8320 and c.audio_table_rows == 9088
    assert c.code_offsets[:2] == [0, 8194] and c.code_offsets[-1] == 8194 + 35 * 23
    assert c.voices == ["casual_female", "casual_male", "cheerful_female", "neutral_female"]
    shapes = {k: v.shape for k, v in tree_flatten(Model(c).parameters())}  # lazy, never evaluated
    assert shapes["tok_embeddings.weight"] == (131072, 3072)
    assert shapes["layers.25.attention.wq.weight"] == (4096, 3072)
    assert shapes["layers.0.attention.wk.weight"] == (1024, 3072)
    assert shapes["layers.0.feed_forward.w2.weight"] == (3072, 9216)
    assert shapes["audio_codebook_embeddings.embeddings.weight"] == (9088, 3072)
    assert shapes["acoustic_transformer.semantic_codebook_output.weight"] == (8320, 3072)
    assert shapes["acoustic_transformer.input_projection.weight"] == (3072, 36)
    assert shapes["acoustic_transformer.layers.2.attention.wv.weight"] == (1024, 3072)
    assert shapes["audio_tokenizer.decoder_blocks.0.conv.weight"] == (1024, 3, 292)
    assert shapes["audio_tokenizer.decoder_blocks.6.conv.weight"] == (1024, 4, 1024)
    assert shapes["audio_tokenizer.decoder_blocks.7.layers.1.attention.q_norm.weight"] == (1024,)
    assert shapes["audio_tokenizer.output_proj.conv.weight"] == (240, 7, 1024)
    n = {p: sum(math.prod(s) for k, s in shapes.items() if k.startswith(p))
         for p in ("layers.", "acoustic_transformer.", "audio_tokenizer.")}
    assert abs(n["layers."] / 1e9 - 3.03) < 0.01
    assert abs(n["acoustic_transformer."] / 1e9 - 0.39) < 0.01
    assert abs(n["audio_tokenizer."] / 1e9 - 0.15) < 0.01


def test_alibi_slopes_option():
    c = VoxtralTTSConfig.from_params(FULL_PARAMS).codec
    assert c.alibi == "vo" and c.alibi_slopes == [2.0**-h for h in range(8)]
    c.alibi = "mlxa"
    assert c.alibi_slopes == [2.0 ** -(h + 1) for h in range(8)]


# ---------------------------------------------------------------- loading


def test_loader_reads_mistral_names(tts):
    assert tts.voices == ["casual_male", "neutral_female"]
    assert tts.sample_rate == 24000
    assert tts.config.audio_table_rows == 256  # from the weights (vllm-omni's rule says 128)
    w = mx.load(str(CKPT / "consolidated.safetensors"))
    assert "mm_audio_embeddings.tok_embeddings.weight" in w
    assert w["mm_audio_embeddings.tok_embeddings.weight"].dtype == mx.float16
    m = tts.model
    assert mx.array_equal(m.tok_embeddings.weight,
                          w["mm_audio_embeddings.tok_embeddings.weight"].astype(mx.float32))
    assert mx.array_equal(m.layers[1].feed_forward.w3.weight,
                          w["layers.1.feed_forward.w3.weight"].astype(mx.float32))


def test_loader_keeps_dtype():
    t = vt.load(CKPT)
    assert t.model.layers[0].attention.wq.weight.dtype == mx.float16
    q = t.model.audio_tokenizer.quantizer.semantic_codebook
    t32 = vt.load(CKPT, dtype=mx.bfloat16)
    assert t32.model.layers[0].attention.wq.weight.dtype == mx.bfloat16
    assert t32.model.audio_tokenizer.quantizer.semantic_codebook.embedding_sum.dtype == (
        q.embedding_sum.dtype)  # the codebook is never cast down
    a = t32.generate("Hi.", max_frames=2)
    assert a.samples.dtype == np.float32 and len(a) == 2 * 1920 and np.isfinite(a.samples).all()


def test_loader_rejects_unknown_and_missing_keys(tmp_path):
    d = _copy(tmp_path)
    _edit_weights(d, lambda w: w.update({"layers.0.attention.wz.weight": mx.zeros((2,))}))
    with pytest.raises(CheckpointError, match="layers.0.attention.wz.weight"):
        vt.load(d)
    d = _copy(tmp_path / "b")
    _edit_weights(d, lambda w: w.pop("audio_tokenizer.decoder_blocks.3.layers.0.ffn_scale"))
    with pytest.raises(CheckpointError, match="ffn_scale"):
        vt.load(d)


def test_loader_checks_inv_freq(tmp_path):
    d = _copy(tmp_path)
    key = "acoustic_transformer.time_embedding.inv_freq"
    _edit_weights(d, lambda w: w.update({key: w[key][::-1]}))
    with pytest.raises(CheckpointError, match="inv_freq"):
        vt.load(d)


MLXA_RULES = [("attention.wq", "self_attn.q_proj"), ("attention.wk", "self_attn.k_proj"),
              ("attention.wv", "self_attn.v_proj"), ("attention.wo", "self_attn.o_proj"),
              ("feed_forward.w1", "mlp.gate_proj"), ("feed_forward.w2", "mlp.down_proj"),
              ("feed_forward.w3", "mlp.up_proj"), ("attention_norm", "input_layernorm"),
              ("ffn_norm", "post_attention_layernorm")]


def test_loader_reads_mlx_community_layout(tmp_path, g, tts):
    w = mx.load(str(CKPT / "consolidated.safetensors"))
    out = {}
    for k, v in w.items():
        if k.startswith("mm_audio_embeddings.tok_embeddings."):
            k = "language_model.model.model.embed_tokens.weight"
        elif k.startswith("mm_audio_embeddings."):
            k = k[len("mm_audio_embeddings."):]
        elif k.startswith(("layers.", "norm.")):
            for a, b in MLXA_RULES:
                k = k.replace(a, b)
            k = "language_model.model.model." + k
        elif "inv_freq" in k:
            continue
        out[k] = v
    d = tmp_path / "mlx"
    shutil.copytree(CKPT / "voice_embedding", d / "voice_embedding")
    shutil.copy(CKPT / "tekken.json", d)
    mx.save_safetensors(str(d / "model.safetensors"), out)
    p = json.loads((CKPT / "params.json").read_text())
    mm, at = p["multimodal"]["audio_model_args"], p["multimodal"]["audio_tokenizer_args"]
    ac = mm["acoustic_transformer_args"]
    cfg = {k: p[k] for k in ("dim", "n_layers", "head_dim", "hidden_dim", "n_heads",
                             "n_kv_heads", "vocab_size", "rope_theta", "norm_eps")}
    cfg.update(model_type="voxtral_tts", semantic_codebook_size=30, acoustic_codebook_size=21,
               n_acoustic_codebook=4, acoustic_dim=ac["dim"], acoustic_n_layers=ac["n_layers"],
               acoustic_head_dim=16, acoustic_hidden_dim=128, acoustic_n_heads=4,
               acoustic_n_kv_heads=2, tokenizer_dim=at["dim"], tokenizer_hidden_dim=64,
               tokenizer_n_heads=2, tokenizer_n_kv_heads=2, tokenizer_head_dim=16,
               tokenizer_semantic_dim=8, tokenizer_acoustic_dim=4,
               tokenizer_decoder_transformer_lengths_str="1,1,1,1")
    (d / "config.json").write_text(json.dumps(cfg))
    other = vt.load(d, dtype=mx.float32, alibi="mlxa")
    for (k, a), (_, b) in zip(tree_flatten(other.model.parameters()),
                              tree_flatten(tts.model.parameters()), strict=True):
        assert mx.array_equal(a, b), k


def test_voice_rows_must_match_tekken(tmp_path):
    d = _copy(tmp_path)
    f = d / "voice_embedding" / "casual_male.safetensors"
    mx.save_safetensors(str(f), {"embedding": mx.zeros((4, 64))})  # tekken.json says 3
    t = vt.load(d)
    with pytest.raises(CheckpointError, match="casual_male has 4 rows"):
        t.generate("Hi.", voice="casual_male", max_frames=1)


# ---------------------------------------------------------------- parity


def test_prompt_and_backbone_match_mlx_audio(tts, g):
    voice = str(g["voice"])
    ids = tts.prompt_ids(str(g["text"]), 5)
    assert ids == g["ids"].tolist()
    prompt = tts.model.embed_prompt(ids, tts._voices[voice], tts.ids["audio"])
    h = tts.model.hidden(prompt)[0, -1]
    np.testing.assert_allclose(np.array(h), g["h0"], atol=1e-5)


def test_codes_and_waveform_match_mlx_audio(tts, g):
    args = dict(text=str(g["text"]), voice=str(g["voice"]), max_frames=len(g["codes"]))
    codes = tts.codes(seed=int(g["seed"]), **args)
    np.testing.assert_array_equal(codes, g["codes"])
    np.testing.assert_array_equal(tts.codes(noise=mx.array(g["noise"]), **args), g["codes"])
    assert not np.array_equal(tts.codes(seed=int(g["seed"]) + 1, **args), g["codes"])
    wav = tts.generate(seed=int(g["seed"]), **args).samples
    assert wav.dtype == np.float32 and wav.shape == g["wav_mlxa"].shape
    np.testing.assert_allclose(wav, g["wav_mlxa"], atol=1e-4)


def test_default_slopes_are_vllm_omni(g):
    t = vt.load(CKPT, dtype=mx.float32)
    wav = np.array(t.model.audio_tokenizer(mx.array(g["codes"])[None])[0])
    np.testing.assert_allclose(wav, g["wav_vo"], atol=1e-4)
    assert np.abs(wav - g["wav_mlxa"]).max() > 1e-2  # the option matters


def test_first_frame_option(g):
    t = vt.load(CKPT, dtype=mx.float32, first_frame="audio_step")
    codes = t.codes(str(g["text"]), str(g["voice"]), int(g["seed"]), len(g["codes"]))
    np.testing.assert_array_equal(codes, g["codes_audio_step"])
    assert not np.array_equal(codes, g["codes"])


def test_backbone_cached_steps_equal_full_recompute(tts, g):
    m = tts.model
    ids = g["ids"].tolist()
    prompt = m.embed_prompt(ids, tts._voices[str(g["voice"])], 24)
    feeds = [m.feedback(mx.array(c)[None]) for c in g["codes"][:4]]
    cache = m.make_cache()
    steps = [m.hidden(prompt, cache)[:, -1]]
    steps += [m.hidden(f, cache)[:, -1] for f in feeds[:2]]
    steps.append(m.hidden(mx.concatenate(feeds[2:], axis=1), cache)[:, -1])  # 2-token step
    full = m.hidden(mx.concatenate([prompt, *feeds], axis=1))[0]
    L = prompt.shape[1]
    for s, pos in zip(steps, [L - 1, L, L + 1, L + 3], strict=True):
        np.testing.assert_allclose(np.array(s[0]), np.array(full[pos]), atol=1e-5)


# ---------------------------------------------------------------- streaming


def test_codec_stream_equals_offline(tts):
    codec = tts.model.audio_tokenizer
    codes = _random_codes(45)
    offline = np.array(codec(mx.array(codes)[None])[0])
    from mlx_speech.models.voxtral_tts.session import CodecStream

    for first, every in [(1, 1), (4, 7), (3, 16)]:
        s = CodecStream(codec, first, every)
        parts = [p for c in codes if (p := s.push(c)) is not None]
        if (p := s.flush()) is not None:
            parts.append(p)
        assert [len(p) for p in parts][:2] == [first * 1920, every * 1920]
        np.testing.assert_allclose(np.concatenate(parts), offline, atol=1e-5)
        # bounded state: per layer the last W keys, per conv a fixed tail
        sizes = sorted(a.shape[-2] for a in s.state.arrays())
        assert sizes == sorted([2, 1, 1, 1, 6] + [2, 2, 4, 4, 8, 8, 16, 16])
    # a fresh state per chunk (no memory) must not match
    parts = [np.array(codec(mx.array(codes[i:i + 5])[None], codec.make_state())[0])
             for i in range(0, 45, 5)]
    assert np.abs(np.concatenate(parts) - offline).max() > 1e-3


def test_stream_concat_equals_generate(tts, g):
    args = dict(voice=str(g["voice"]), seed=int(g["seed"]), max_frames=len(g["codes"]))
    chunks = list(tts.stream(str(g["text"]), **args))
    assert len(chunks[0]) == 4 * 1920 and len(chunks) == 2
    joined = np.concatenate([c.samples for c in chunks])
    np.testing.assert_allclose(joined, tts.generate(str(g["text"]), **args).samples, atol=1e-5)


def test_long_text_is_chunked_with_pauses(tts, monkeypatch):
    monkeypatch.setattr(vt, "CHUNK_CHARS", 16)
    calls = []
    a = tts.generate("One two three. Four five six", max_frames=2,
                     progress=lambda d, t: calls.append((d, t)))
    pause = int(vt.PAUSE_S * 24000)
    assert len(a) == 2 * 2 * 1920 + pause
    assert not a.samples[2 * 1920 : 2 * 1920 + pause].any()
    assert calls == [(14, 28), (28, 28)]


# ---------------------------------------------------------------- errors and text


def test_errors(tts):
    with pytest.raises(MlxSpeechError, match="casual_male, neutral_female"):
        tts.generate("Hello.", voice="nobody")
    for bad in ["", "   \n\t", "\u200b"]:
        with pytest.raises(MlxSpeechError, match="empty"):
            tts.generate(bad)
    with pytest.raises(MlxSpeechError, match="no letters or digits"):
        tts.generate("\U0001f600 !!")


def test_zero_frames_is_an_error(tmp_path):
    t = vt.load(CKPT, dtype=mx.float32)
    head = t.model.acoustic_transformer.semantic_codebook_output
    w = mx.array(head.weight)
    w[1] = 100.0 * w.sum(axis=0)  # END wins everywhere the others are not huge
    head.weight = w
    m = t.model
    prompt = m.embed_prompt(t.prompt_ids("Hi.", 3), t._voices["casual_male"], 24)
    h = m.hidden(prompt)[:, -1]
    if int(m.acoustic_transformer.semantic(h)[0]) != 1:
        w[1] = 100.0 * h[0] / mx.linalg.norm(h[0])
        head.weight = w
    assert list(frame_codes(m, prompt, 5)) == []
    with pytest.raises(MlxSpeechError, match="no audio"):
        t.generate("Hi.", voice="casual_male", max_frames=5)


def test_normalize():
    assert normalize("  hello \n\n world ") == "hello world."
    assert normalize("Is it\u200b ok?") == "Is it ok?"
    assert normalize('He said "go!"') == 'He said "go!"'
    assert normalize("Done\u2026") == "Done\u2026"
    assert split_sentences("A b. C d! E f", max_chars=6) == ["A b.", "C d!", "E f."]
    assert split_sentences("A b. C d! E f") == ["A b. C d! E f."]
    long = split_sentences("word " * 50, max_chars=40)
    assert all(len(c) <= 41 for c in long) and "".join(long).count("word") == 50


def test_default_voice(tts):
    assert tts._voices.default() == "casual_male"
    assert vt.default_max_frames("Hi.") == 76
    assert vt.default_max_frames("x" * 10_000) == vt.MAX_FRAMES


@pytest.mark.reference
def test_live_against_mlx_audio(tmp_path, monkeypatch):
    pytest.importorskip("mlx_audio.tts.models.voxtral_tts")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_vt", GOLDEN.parent / "make_voxtral_tts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path)
    fresh = dict(np.load(tmp_path / "golden.npz"))
    t = vt.load(tmp_path / "ckpt", dtype=mx.float32, alibi="mlxa")
    codes = t.codes(str(fresh["text"]), str(fresh["voice"]), int(fresh["seed"]),
                    len(fresh["codes"]))
    np.testing.assert_array_equal(codes, fresh["codes"])
    wav = t.generate(str(fresh["text"]), str(fresh["voice"]), int(fresh["seed"]),
                     len(fresh["codes"])).samples
    np.testing.assert_allclose(wav, fresh["wav_mlxa"], atol=1e-4)


def test_pt_voice(tmp_path, tts, g):
    torch = pytest.importorskip("torch")
    d = _copy(tmp_path)
    (d / "voice_embedding" / "neutral_female.safetensors").unlink()
    ref = mx.load(str(CKPT / "voice_embedding" / "neutral_female.safetensors"))["embedding"]
    t = torch.from_numpy(np.array(ref.astype(mx.float32))).to(torch.bfloat16)
    torch.save(t, d / "voice_embedding" / "neutral_female.pt")
    other = vt.load(d, dtype=mx.float32, alibi="mlxa")
    v = other._voices["neutral_female"]
    assert v.dtype == mx.bfloat16 and v.shape == (5, 64)
    assert mx.array_equal(v.astype(mx.float32), ref.astype(mx.bfloat16).astype(mx.float32))
    assert other.voices == ["casual_male", "neutral_female"]


@pytest.mark.parametrize("n_layers", [1, 3])
def test_flow_head_equals_the_plain_transformer(n_layers):
    """The flow head makes the first layer's projections of the time and condition tokens once
    per frame and of token x once for both CFG halves: the codes of running every layer on
    [x, t, c] and [x, t, 0] as it stands, 64 rows at once."""
    from mlx_speech.models.voxtral_tts.config import AcousticConfig
    from mlx_speech.models.voxtral_tts.model import FlowHead

    mx.random.seed(n_layers)
    a = AcousticConfig(dim=64, n_layers=n_layers, head_dim=16, hidden_dim=128, n_heads=4,
                       n_kv_heads=2)
    fh = FlowHead(a, 48, 6, 64, 30, 21)
    h, noise = mx.random.normal((64, 48)), mx.random.normal((64, 6))
    t_table = fh.time_table()

    def plain():
        B, c = h.shape[0], fh.llm_projection(h)
        cond = mx.concatenate([c, mx.zeros_like(c)])
        x, ts = noise * a.sigma_max, fh.timesteps()
        for i in range(a.n_steps):
            p = fh.input_projection(x)
            seq = mx.stack([mx.concatenate([p, p]), mx.broadcast_to(t_table[i], cond.shape),
                            cond], axis=1)
            for layer in fh.layers:
                seq = layer(seq)
            v = fh.acoustic_codebook_output(fh.norm(seq[:, 0]))
            x = x + (a.cfg_alpha * v[:B] + (1 - a.cfg_alpha) * v[B:]) * (ts[i + 1] - ts[i])
        x = mx.clip(mx.round((mx.clip(x, -1, 1) + 1) * 10), 0, 20)
        return x.astype(mx.int32) + 2

    got = fh.acoustic(h, noise, t_table)
    assert len(set(np.array(got).ravel().tolist())) > 10  # the codes are spread
    np.testing.assert_array_equal(np.array(got), np.array(plain()))
