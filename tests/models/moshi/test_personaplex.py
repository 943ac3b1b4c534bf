"""PersonaPlex prompting against NVIDIA's LMGen (tests/golden/moshi/tiny_pp*), voices, loudness,
and the SentencePiece encoder used for role prompts."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.models.loading import load_safetensors
from mlx_speech.models.moshi import LmConfig, PersonaPlexGen, Sampling, build_lm
from mlx_speech.models.moshi.personaplex import (
    VoicePrompt,
    integrated_loudness,
    load_voice,
    normalize_loudness,
    run_prompt,
    wrap_system,
)
from tests.support.moshi import GOLDEN, spy_inputs

GREEDY = Sampling(0.0, 0.0, 250, 25)


@pytest.fixture(scope="module")
def pp():
    cfg = LmConfig.from_dict(json.loads((GOLDEN / "tiny_pp_config.json").read_text()))
    return build_lm(cfg, load_safetensors([GOLDEN / "tiny_pp.safetensors"]))


@pytest.fixture(scope="module")
def ref():
    return dict(np.load(GOLDEN / "tiny_pp_ref.npz"))


def _live(gen, user) -> np.ndarray:
    outs = []
    for u in user:
        o = gen.step(user=mx.array(u).reshape(1, 8, 1))
        mx.eval(gen.arrays())
        outs.append(np.array(o.tokens)[0, :, 0])
    return np.stack(outs)


def _prompted(lm, ref, voice, seen: list | None = None):
    gen = PersonaPlexGen(lm, lm.config, GREEDY)
    if seen is not None:
        seen += [spy_inputs(gen)]
    n = run_prompt(gen, voice, [int(t) for t in ref["text_prompt"]], int(ref["silence_frames"]))
    return gen, n


@pytest.mark.parametrize("compiled", ["1", "0"])
def test_prompt_and_live_match_reference(pp, ref, compiled, monkeypatch):
    monkeypatch.setenv("MLX_SPEECH_COMPILE", compiled)  # compiled steps, and plain
    spy: list = []
    gen, n = _prompted(pp, ref, VoicePrompt("v", codes=ref["voice_frames"]), spy)
    assert n == int(ref["n_prompt_forwards"])
    live = _live(gen, ref["user"])
    np.testing.assert_array_equal(np.stack([np.array(x)[0, :, 0] for x in spy[0]]),
                                  ref["seen_inputs"])
    np.testing.assert_array_equal(live, ref["live_out"])


def _stored_voice(pp, ref) -> tuple[np.ndarray, np.ndarray]:
    """What NVIDIA's save_voice_prompt_embeddings writes: the summed input embeddings of the
    voice steps that ran a forward, and the token cache after the voice prompt."""
    gen = PersonaPlexGen(pp, pp.config, GREEDY)
    seen = spy_inputs(gen)
    run_prompt(gen, VoicePrompt("v", codes=ref["voice_frames"]), None, 0)
    embeddings = [pp.embed_tokens(x) for x in seen]  # what each forward summed
    emb = np.stack([np.array(e) for e in embeddings])[:, :, None]  # [N, 1, 1, dim]
    cache = np.stack([np.stack([np.full(1, -2) if a is None else np.array(a) for a in col], 1)
                      for col in gen.cache], -1)
    return emb.reshape(len(embeddings), 1, 1, -1), cache


def test_stored_voice_replays_like_audio(pp, ref, tmp_path):
    emb, cache = _stored_voice(pp, ref)
    assert emb.shape[0] == len(ref["voice_frames"]) - 1  # the first call runs no forward
    gen, _ = _prompted(pp, ref, VoicePrompt("v", embeddings=mx.array(emb), cache=cache))
    np.testing.assert_array_equal(_live(gen, ref["user"]), ref["live_out"])
    from safetensors.numpy import save_file

    save_file({"embeddings": emb, "cache": cache.astype(np.int64)},
              str(tmp_path / "v.safetensors"))
    v = load_voice(tmp_path / "v.safetensors", None, 8)
    gen, _ = _prompted(pp, ref, v)
    np.testing.assert_array_equal(_live(gen, ref["user"]), ref["live_out"])


def test_pt_voice(pp, ref, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("mlx_speech.models.torchfile")
    emb, cache = _stored_voice(pp, ref)
    torch.save({"embeddings": torch.tensor(emb), "cache": torch.tensor(cache.astype(np.int64))},
               tmp_path / "NATX.pt")  # the layout of PersonaPlex's voices/*.pt
    v = load_voice(tmp_path / "NATX.pt", None, 8)
    assert v.embeddings.shape == emb.shape
    gen, _ = _prompted(pp, ref, v)
    np.testing.assert_array_equal(_live(gen, ref["user"]), ref["live_out"])


def test_wrap_system():
    assert wrap_system("  Be kind. ") == "<system> Be kind. <system>"
    assert wrap_system("<system> x <system>") == "<system> x <system>"


# pyloudnorm 0.1.1 `Meter(sr).integrated_loudness` of the signals below (BS.1770-4).
PYLOUDNORM = {(48000, "sine"): -3.0517119906923806, (48000, "noise"): -14.439896056895924,
              (24000, "sine"): -3.0634899207954924, (24000, "noise"): -14.723791295211152}


@pytest.mark.parametrize("sr", [48000, 24000])
def test_loudness_matches_pyloudnorm(sr):
    rng = np.random.default_rng(sr)
    t = np.arange(int(sr * 3.3)) / sr
    env = (0.5 + 0.5 * np.sin(2 * np.pi * 0.5 * t)) ** 3
    sig = {"sine": np.sin(2 * np.pi * 997 * t), "noise": 0.2 * rng.standard_normal(t.size) * env}
    for name, x in sig.items():
        assert integrated_loudness(x, sr) == pytest.approx(PYLOUDNORM[(sr, name)], abs=1e-6)
    y = normalize_loudness(0.01 * sig["noise"], sr)
    assert integrated_loudness(y, sr) == pytest.approx(-24.0, abs=1e-4)
    assert not normalize_loudness(np.zeros(sr), sr).any()


def test_spm_encoder_matches_sentencepiece(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    from mlx_speech.models.moshi import TextTokenizer

    text = (GOLDEN.parent.parent.parent / "README.md").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip()][:300]
    (tmp_path / "c.txt").write_text("\n".join(lines * 3), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "c.txt"), model_prefix=str(tmp_path / "m"),
                                   vocab_size=300, model_type="unigram", minloglevel=2,
                                   character_coverage=1.0)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    tok = TextTokenizer.from_file(tmp_path / "m.model")
    cases = lines[:80] + [wrap_system("You are a wise teacher."), "  a   b ", "漢字 ok"]
    for s in cases:
        assert tok.encode(s) == sp.encode(s), s
    ids = [i for i in sp.encode("hello world, this is a test") if i not in (0, 3)]  # EPAD, PAD
    stream = tok.stream()
    assert "".join(stream.add(i) for i in ids) + stream.flush() == sp.decode(ids)
