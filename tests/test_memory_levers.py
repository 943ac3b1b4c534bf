"""Opt-in memory levers for many long Voxtral Realtime streams: smaller sliding windows
(exactly the reference's output with the same windows) and an 8-bit KV cache (bounded logit
error). Defaults stay exact (the other Voxtral tests)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlx_speech
from mlx_speech.errors import MlxSpeechError
from tests.conftest import GOLDEN

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
    from tests.test_batched_asr import NEMOTRON

    with pytest.raises(MlxSpeechError, match="take no decoder_window option"):
        mlx_speech.load(NEMOTRON, decoder_window=16)
