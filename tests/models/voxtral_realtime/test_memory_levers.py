"""Opt-in memory levers for many long Voxtral Realtime streams: smaller sliding windows
(exactly the reference's output with the same windows) and an 8-bit KV cache (bounded logit
error). Defaults stay exact (the other Voxtral tests)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlx_speech
from mlx_speech.errors import MlxSpeechError
from tests.conftest import GOLDEN, speechlike

NEMOTRON = Path(__file__).parents[2] / "golden" / "nemotron"

WINDOW = dict(np.load(GOLDEN / "window.npz"))  # tests/golden/make_voxtral_realtime_window.py


@pytest.fixture(scope="module")
def narrow(vr_dir):
    return mlx_speech.load(vr_dir, encoder_window=int(WINDOW["encoder_window"]),
                           decoder_window=int(WINDOW["decoder_window"]))


def test_window_override_matches_the_reference_with_that_window(narrow, golden):
    ids = narrow.transcribe(golden["audio"]).token_ids
    assert ids == [int(t) for t in WINDOW["tokens"]]
    assert ids != [int(t) for t in golden["tokens"]]  # the windows bind on this clip
    m = narrow.model
    audio = m.embed_audio(mx.array(golden["mel"][None]))
    toks = [int(t) for t in golden["prompt"]] + ids[:-1]
    logits = m(mx.array([toks]), audio[:, : len(toks)], m.ffn_scales(6))
    np.testing.assert_allclose(np.array(logits[0, -12:]), WINDOW["logits"], atol=1e-4)


def test_window_override_streams_with_smaller_rings(narrow, golden):
    s = narrow.session()
    audio = golden["audio"]
    for i in range(0, len(audio), 777):
        s.feed(audio[i: i + 777])
    s.finish()
    assert s.token_ids == [int(t) for t in WINDOW["tokens"]]
    assert s.dec_cache[0].window == 16 and s.enc_state.kv[0].window == 12


@pytest.mark.parametrize("kw", [dict(decoder_window=0), dict(encoder_window=21),
                                dict(decoder_window=1.5), dict(decoder_window=True)])
def test_bad_windows_are_refused(vr_dir, kw):
    with pytest.raises(MlxSpeechError, match="window must be"):
        mlx_speech.load(vr_dir, **kw)


def test_cli_window_flags(vr_dir, narrow, golden, tmp_path, capsys):
    import soundfile as sf

    from mlx_speech import transcribe
    from mlx_speech.server import build_parser

    wav = tmp_path / "clip.wav"
    sf.write(wav, golden["audio"], 16000)
    assert transcribe.main([str(wav), "--model", str(vr_dir), "--decoder-window", "16",
                            "--encoder-window", "12"]) == 0
    assert capsys.readouterr().out == narrow.transcribe(golden["audio"]).text + "\n"
    assert transcribe.main([str(wav), "--model", str(vr_dir), "--decoder-window", "0"]) != 0
    assert "error: decoder_window must be" in capsys.readouterr().err
    args = build_parser().parse_args(["--model", "x", "--decoder-window", "512"])
    assert (args.decoder_window, args.encoder_window) == (512, None)


def test_window_options_are_voxtral_only():
    with pytest.raises(MlxSpeechError, match="take no decoder_window option"):
        mlx_speech.load(NEMOTRON, decoder_window=16)


def _stepwise_logits(vr, kv_bits, golden) -> np.ndarray:
    """Teacher-forced logits of the golden clip, streamed through caches with `kv_bits`:
    the encoder one 80 ms token at a time, the decoder one position at a time."""
    from mlx_speech.models.voxtral_realtime.model import EncoderState
    from mlx_speech.nn import RingBatch

    m = vr.model
    st = m.make_encoder_state(4, kv_bits)
    st = EncoderState(st.conv, [RingBatch.gather([r]) for r in st.kv])
    mel = mx.array(golden["mel"][None])
    audio = mx.concatenate([m.embed_audio(mel[:, i: i + 8], st)
                            for i in range(0, mel.shape[1], 8)], axis=1)
    caches = [RingBatch.gather([r]) for r in m.make_decoder_cache(39, kv_bits)]
    scales = m.ffn_scales(6)
    prompt = [int(t) for t in golden["prompt"]]
    out = [m.logits(m.hidden(mx.array([prompt]), audio[:, :39], scales, caches)[:, -1])]
    for p, tok in enumerate(golden["tokens"][:-1], start=39):
        h = m.hidden(mx.array([[int(tok)]]), audio[:, p: p + 1], scales, caches)
        out.append(m.logits(h[:, -1]))
    return np.array(mx.concatenate(out))


def test_8bit_kv_cache_bounds_the_logit_error(vr_dir, vr_model, golden):
    exact = _stepwise_logits(vr_model, None, golden)
    q8 = mlx_speech.load(vr_dir, kv_bits=8)
    approx = _stepwise_logits(q8, 8, golden)
    assert len(exact) == len(golden["tokens"])
    np.testing.assert_allclose(exact, golden["logits"], atol=1e-4)  # the exact cache
    err = np.abs(approx - exact).max() / np.abs(exact).max()
    rms = np.sqrt(((approx - exact) ** 2).mean() / (exact ** 2).mean())
    assert 0 < err < 0.04 and rms < 0.02  # measured 0.027 and 0.011 (int8 per vector)
    assert (approx.argmax(-1) == exact.argmax(-1)).mean() >= 0.95
    s = q8.session()
    s.feed(golden["audio"])
    s.finish()
    keys = s.dec_cache[0].home.keys
    assert keys.dtype == mx.uint8 and keys.shape[-1] == 12 + 4  # int8 values, a scale
    # batched == alone with the 8-bit cache too (rows quantize independently)
    a, b = speechlike(2.5, seed=1), speechlike(1.7, seed=2)
    pair = [q8.session(), q8.session(delay_ms=160)]
    for i in range(0, len(a), 2560):
        q8.feed_many([(x, y[i: i + 2560]) for x, y in zip(pair, (a, b), strict=True)])
    q8.finish_many(pair)
    assert pair[0].token_ids == q8.transcribe(a).token_ids
    assert pair[1].token_ids == q8.transcribe(b, delay_ms=160).token_ids
    with pytest.raises(MlxSpeechError, match="kv_bits must be 8"):
        mlx_speech.load(vr_dir, kv_bits=4)
