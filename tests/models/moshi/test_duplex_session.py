"""The duplex session API on tiny checkpoints in Kyutai's hub layout (Mimi + LM + tokenizer)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import mlx_speech.models.moshi as moshi
from mlx_speech.errors import AudioError, CheckpointError, MlxSpeechError
from tests.support.moshi import (
    DELAYS,
    GOLDEN,
    build_random_lm,
    kyutai_weights,
    random_lm_kwargs,
    speech,
    write_folder,
)


@pytest.fixture(scope="module")
def kyutai(tmp_path_factory):
    """A Moshi-shaped random LM (8 + 8 audio streams, card 64) with the 24 kHz golden Mimi."""
    kw = random_lm_kwargs(card=64, n_q=16, dep_q=8, delays=DELAYS)
    weights = kyutai_weights(build_random_lm(kw))
    d = write_folder(tmp_path_factory.mktemp("ky") / "moshi", kw, weights)
    return moshi.load(d)


@pytest.fixture(scope="module")
def persona(tmp_path_factory):
    kw = json.loads((GOLDEN / "tiny_pp_config.json").read_text())
    kw["dep_q"] = 8  # as a copied Kyutai config might say: the 16 heads in the file win
    d = write_folder(tmp_path_factory.mktemp("pp") / "pp", kw, GOLDEN / "tiny_pp.safetensors")
    (d / "voices").mkdir()
    rng = np.random.default_rng(0)
    cache = np.full((1, 17, 4), 2048, np.int64)
    save_file({"embeddings": (0.1 * rng.standard_normal((3, 1, 1, 16))).astype(np.float32),
               "cache": cache}, str(d / "voices" / "NATF0.safetensors"))
    return moshi.load(d)


def run(session, frames: int, seed: int = 0):
    x = speech(frames * session.frame_size, seed=seed)
    F = session.frame_size
    return [session.step(x[i * F:(i + 1) * F]) for i in range(frames)]


def test_hub_layout_loads(kyutai):
    assert (kyutai.sample_rate, kyutai.frame_size, kyutai.roles) == (24000, 1920, False)
    assert kyutai.config.dep_q == 8 and kyutai.voices == []


def test_zeros_before_first_frame_then_audio(kyutai):
    out = run(kyutai.session(temp=0, temp_text=0), 4)
    pcm0, text0 = out[0]
    assert pcm0.shape == (1920,) and pcm0.dtype == np.float32
    assert not pcm0.any() and text0 == ""  # max_delay 1: no complete frame after one step
    assert all(np.abs(p).max() > 0 and np.isfinite(p).all() for p, _ in out[1:])


def test_seeds_reproducible(kyutai):
    a = run(kyutai.session(seed=5), 5)
    b = run(kyutai.session(seed=5), 5)
    c = run(kyutai.session(seed=6), 5)
    for (pa, ta), (pb, tb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(pa, pb)
        assert ta == tb
    assert any(not np.array_equal(pa, pc) for (pa, _), (pc, _) in zip(a, c, strict=True))


def test_sessions_share_the_model(kyutai):
    alone = run(kyutai.session(seed=1), 4)
    s1, s2 = kyutai.session(seed=1), kyutai.session(seed=2)
    x = speech(4 * 1920)
    inter = []
    for i in range(4):
        inter.append(s1.step(x[i * 1920:(i + 1) * 1920]))
        s2.step(x[i * 1920:(i + 1) * 1920][::-1].copy())
    for (pa, _), (pb, _) in zip(alone, inter, strict=True):
        np.testing.assert_array_equal(pa, pb)


def test_user_lag_setting(kyutai):
    s0, s1 = kyutai.session(temp=0, temp_text=0), kyutai.session(temp=0, temp_text=0, user_lag=1)
    assert (s0.user_lag, s1.user_lag) == (0, 1)
    a, b = run(s0, 5), run(s1, 5)
    assert any(not np.array_equal(pa, pb) for (pa, _), (pb, _) in zip(a, b, strict=True))
    with pytest.raises(MlxSpeechError, match="user_lag"):
        kyutai.session(user_lag=2)


def test_bad_input(kyutai):
    s = kyutai.session()
    with pytest.raises(AudioError, match="1920"):
        s.step(np.zeros(1000, np.float32))
    with pytest.raises(AudioError, match="float"):
        s.step(np.zeros(1920, np.int16))
    x = np.zeros(1920, np.float32)
    x[3] = np.nan
    with pytest.raises(AudioError, match="NaN"):
        s.step(x)
    with pytest.raises(MlxSpeechError, match="PersonaPlex"):
        kyutai.session(role="be nice")


def test_respond_offline(kyutai):
    x = speech(5000)
    pcm, text = kyutai.respond(x, temp=0, temp_text=0)
    assert pcm.shape == x.shape and isinstance(text, str)
    s = kyutai.session(temp=0, temp_text=0)
    first = [s.step(np.pad(x, (0, 3 * 1920 - x.size))[i * 1920:(i + 1) * 1920])[0]
             for i in range(3)]
    np.testing.assert_array_equal(pcm, np.concatenate(first)[: x.size])


def test_text_is_streamed(kyutai):
    texts = [t for _, t in run(kyutai.session(seed=3, temp_text=1.5), 12)]
    assert any(texts)  # random weights: some non-pad pieces get sampled
    assert all(set(t) <= set(" helowrdx0123456789!") for t in texts)


def test_missing_file_is_named(tmp_path):
    kw = random_lm_kwargs(card=64, n_q=16, dep_q=8, delays=DELAYS)
    d = write_folder(tmp_path / "m", kw, kyutai_weights(build_random_lm(kw)))
    (d / "tok.model").unlink()
    with pytest.raises(CheckpointError, match="tok.model"):
        moshi.load(d)


def test_personaplex_session(persona):
    assert persona.roles and persona.config.dep_q == 16
    assert persona.voices == ["NATF0"]
    s = persona.session(role="hello world!", temp=0, temp_text=0)
    # voice (3 replayed) + 2 x 6 silence + "<system> hello world! <system>" pieces
    ids = persona.tokenizer.encode("<system> hello world! <system>")
    assert s.prompt_forwards == 3 + 12 + len(ids)
    pcm, _ = s.step(speech(1920))
    assert np.abs(pcm).max() > 0  # the prompt already filled the delay: audio from step 1


def test_unknown_voice_lists_known(persona):
    with pytest.raises(MlxSpeechError, match="NATF0"):
        persona.session(voice="NOPE")
    with pytest.raises(MlxSpeechError, match="user_lag"):
        persona.session(user_lag=0)


def test_chat_cli_end_to_end(tmp_path, capsys):
    """`mlx_speech.chat --input q.wav -o a.wav` on a tiny Kyutai-layout folder."""
    import soundfile as sf

    from mlx_speech import chat

    kw = random_lm_kwargs(card=64, n_q=16, dep_q=8, delays=DELAYS)
    folder = write_folder(tmp_path / "moshi", kw, kyutai_weights(build_random_lm(kw)))
    src, dst = tmp_path / "q.wav", tmp_path / "a.flac"
    sf.write(str(src), speech(16000, sr=16000), 16000)  # resampled to 24 kHz on the way in
    rc = chat.main(["--model", str(folder), "--input", str(src), "-o", str(dst), "--tail", "0.2"])
    assert rc == 0, capsys.readouterr().err
    out, sr = sf.read(str(dst), dtype="float32")
    frames = -(-(24000 + 4800) // 1920)
    assert sr == 24000 and len(out) == frames * 1920
    assert not np.any(out[:1920]) and np.abs(out[1920 * 2:]).max() > 0  # silence, then the model
    err = capsys.readouterr().err
    assert f"{frames} frames" in err and "budget" in err
