"""Nemotron streaming ASR: parity with transformers (committed goldens) in all four
latency modes, streaming == offline from the first chunk, bounded state, strict
loading and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.errors import AudioError, CheckpointError, MlxSpeechError
from mlx_speech.models.nemo.features import NemoLogMel, StreamingNemoLogMel
from mlx_speech.models.nemotron_streaming import load
from tests.support.nemo import transformers_features

GOLDEN = Path(__file__).parents[2] / "golden" / "nemotron"
MODES = {1120: 13, 560: 6, 160: 1, 80: 0}  # latency ms -> right context


@pytest.fixture(scope="module")
def ng():
    return dict(np.load(GOLDEN / "golden.npz"))


@pytest.fixture(scope="module")
def nm():
    return load(GOLDEN)


def speechlike(seconds: float, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    seg = (t * 3).astype(int)
    f0 = rng.uniform(120, 900, seg.max() + 1)[seg]
    amp = rng.choice([0.002, 0.1, 0.5], seg.max() + 1)[seg]
    x = amp * np.sin(2 * np.pi * np.cumsum(f0) / 16000)
    return (x + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def _chunks(x, sizes):
    i, k = 0, 0
    while i < len(x):
        n = sizes[k % len(sizes)]
        yield x[i: i + n]
        i, k = i + n, k + 1


# -- mel front end ----------------------------------------------------------------

def test_mel_matches_reference(ng):
    mel = NemoLogMel()(ng["audio"])
    assert mel.shape == ng["mel"].shape == (len(ng["audio"]) // 160, 128)
    d = np.abs(mel - ng["mel"])
    assert d.max() < 5e-4 and d.mean() < 1e-5  # fp32 torch STFT vs float64


@pytest.mark.parametrize("sizes", [[1], [159, 161], [400], [3, 5000, 1, 1279], [16000]])
def test_streaming_mel_is_exact(ng, sizes):
    audio = ng["audio"][:20000] if sizes == [1] else ng["audio"]
    m = NemoLogMel()
    s = StreamingNemoLogMel(m)
    parts = [s.feed(c) for c in _chunks(audio, sizes)] + [s.finish()]
    np.testing.assert_array_equal(np.concatenate(parts), m(audio))


def test_mel_lookahead_and_short_audio():
    m = NemoLogMel()
    s = StreamingNemoLogMel(m)
    assert len(s.feed(np.zeros(359, np.float32))) == 1  # frame t needs samples < 160t + 200
    assert len(s.feed(np.zeros(1, np.float32))) == 1 and s.emitted == 2
    assert m(np.zeros(159, np.float32)).shape == (0, 128)
    s = StreamingNemoLogMel(m)
    assert len(s.feed(np.ones(100, np.float32))) == 0 and len(s.finish()) == 0


# -- encoder ------------------------------------------------------------------------

@pytest.mark.parametrize("r", [13, 6, 1, 0])
def test_encoder_matches_reference(nm, ng, r):
    enc = nm.model.encoder(mx.array(ng["mel"][None]), r)
    np.testing.assert_allclose(np.array(enc[0]), ng[f"encoder_r{r}"], atol=1e-4)


def _stream_encoder(model, mel, r, sizes):
    st = model.encoder.make_state(r)
    outs, i, k = [], 0, 0
    while i < mel.shape[1]:
        n = sizes[k % len(sizes)]
        o = model.encoder(mel[:, i: i + n], state=st)  # None: no complete block yet
        mx.eval(o, st.arrays())
        assert o is None or o.shape[1] % (r + 1) == 0  # only whole blocks before the end
        assert st.kv[0].length <= model.config.encoder.left_context
        if o is not None:
            outs.append(np.array(o[0]))
        i, k = i + n, k + 1
    o = model.encoder(mel[:, :0], state=st, final=True)
    if o is not None:
        outs.append(np.array(o[0]))
    return np.concatenate(outs)


@pytest.mark.parametrize("r", [13, 6, 1, 0])
def test_streaming_encoder_equals_offline_from_first_chunk(nm, ng, r):
    mel = mx.array(ng["mel"][None])
    off = np.array(nm.model.encoder(mel, r)[0])
    rng = np.random.default_rng(r)
    for sizes in ([1 + 8 * r] + [8 * (r + 1)] * 99, [1], [8], [3, 17, 40],
                  [int(x) for x in rng.integers(1, 80, 40)]):
        st = _stream_encoder(nm.model, mel, r, sizes)
        assert st.shape == off.shape
        np.testing.assert_allclose(st, off, atol=1e-5)
    # transformers' own cache-aware stream (whole chunks) agrees too
    ref = ng[f"stream_encoder_r{r}"]
    np.testing.assert_allclose(off[: len(ref)], ref, atol=1e-4)


def test_first_chunk_needs_no_warm_up(nm, ng):
    """A zero-filled (unmasked) 14-frame KV cache would corrupt the first frames."""
    mel = mx.array(ng["mel"][None, :105])
    off = np.array(nm.model.encoder(mel, 13)[0])
    st = nm.model.encoder.make_state(13)
    first = np.array(nm.model.encoder(mel, state=st)[0])
    np.testing.assert_allclose(first, off[:14], atol=1e-5)
    bad = nm.model.encoder.make_state(13)
    dh = nm.config.encoder.head_dim
    for c in bad.kv:  # zeros taken for 14 real frames
        c.keys = c.values = mx.zeros((1, nm.config.encoder.num_attention_heads, 14, dh))
        c.valid = 14
    warm = np.array(nm.model.encoder(mel, state=bad)[0])
    assert np.abs(warm - off[:14]).max() > 1e-2


# -- tokens -------------------------------------------------------------------------

@pytest.mark.parametrize("latency_ms", [1120, 560, 160, 80])
def test_greedy_tokens_match_reference(nm, ng, latency_ms):
    r = nm.transcribe(ng["audio"], latency_ms=latency_ms)
    assert r.token_ids == [int(t) for t in ng[f"tokens_r{MODES[latency_ms]}"]]
    assert nm.config.blank_id not in r.token_ids
    assert r.text == nm.tokenizer.decode(r.token_ids)
    # the clip makes the decoder emit up to max_symbols tokens on one frame
    counts = np.bincount(r.frames)
    assert counts.max() == nm.config.max_symbols and (counts == 0).any()
    assert r.frames == sorted(r.frames) and r.token_times[-1] < len(ng["audio"]) / 16000


def test_default_latency_is_the_first_mode(nm, ng):
    assert nm.transcribe(ng["audio"]).token_ids == [int(t) for t in ng["tokens_r13"]]
    assert nm.session().latency_ms == 1120


def _stream(model, audio, sizes, latency_ms=None):
    s = model.session(latency_ms)
    text = [s.feed(c) for c in _chunks(audio, sizes)]
    text.append(s.finish())
    return s.token_ids, "".join(text)


@pytest.mark.parametrize("latency_ms", [1120, 560, 160, 80])
@pytest.mark.parametrize("sizes", [[1280], [160], [777], [3, 5000, 1, 1279, 2561]])
def test_streaming_tokens_equal_offline(nm, ng, latency_ms, sizes):
    ids, text = _stream(nm, ng["audio"], sizes, latency_ms)
    assert ids == [int(t) for t in ng[f"tokens_r{MODES[latency_ms]}"]]
    assert text == nm.tokenizer.decode(ids)


def test_streaming_one_sample_at_a_time(nm):
    audio = speechlike(0.9, seed=3)
    ref = nm.transcribe(audio, latency_ms=80).token_ids
    assert _stream(nm, audio, [1], 80)[0] == ref


def test_streaming_random_chunks(nm):
    audio = speechlike(3.3, seed=4)
    rng = np.random.default_rng(7)
    for ms in (1120, 80):
        ref = nm.transcribe(audio, latency_ms=ms).token_ids
        sizes = [int(x) for x in rng.integers(1, 4000, size=50)]
        assert _stream(nm, audio, sizes, ms)[0] == ref


def test_text_is_available_before_the_end(nm, ng):
    s = nm.session(latency_ms=80)
    got = [s.feed(c) for c in _chunks(ng["audio"][:16000], [1280])]
    assert len(s.token_ids) > 0 and "".join(got)  # emitted while streaming
    assert s.n_frames == 13  # 1 s: 99 complete mel frames -> encoder frames 0..12


def test_sessions_share_one_model(nm):
    a, b = speechlike(2.5, seed=5), speechlike(2.5, seed=6)
    ra, rb = nm.transcribe(a).token_ids, nm.transcribe(b).token_ids
    assert ra != rb
    sa, sb = nm.session(), nm.session()
    for ca, cb in zip(_chunks(a, [1000]), _chunks(b, [1000]), strict=True):
        sa.feed(ca)
        sb.feed(cb)
    sa.finish()
    sb.finish()
    assert (sa.token_ids, sb.token_ids) == (ra, rb)


def test_per_chunk_state_is_bounded(nm):
    s = nm.session(latency_ms=80)
    chunk = speechlike(0.08, seed=9)
    sizes = {}
    for i in range(1, 401):
        s.feed(chunk)
        if i in (100, 400):
            st = s.enc_state
            sizes[i] = ([a.shape for a in st.arrays()], len(s.mel.buf),
                        [a.shape for a in s.dec_state.arrays()])
    assert sizes[100] == sizes[400]
    assert s.enc_state.kv[0].length == nm.config.encoder.left_context


def test_latency_modes_are_validated(nm):
    for bad in (0, 100, 1280):
        with pytest.raises(MlxSpeechError, match="latency"):
            nm.session(latency_ms=bad)


def test_empty_silent_and_bad_audio(nm):
    r = nm.transcribe(np.zeros(0, np.float32))
    assert r.token_ids == [] and r.text == ""
    assert isinstance(nm.transcribe(np.zeros(100, np.float32)).text, str)
    assert isinstance(nm.transcribe(np.zeros(16000, np.float32)).text, str)
    s = nm.session()
    assert s.feed(np.zeros(0, np.float32)) == ""
    s.finish()
    with pytest.raises(MlxSpeechError):
        s.feed(np.zeros(10, np.float32))
    x = speechlike(1.0)
    x[100] = np.nan
    with pytest.raises(AudioError):
        nm.transcribe(x)


def test_other_sample_rates_are_resampled(nm):
    x = speechlike(2.0)
    r = nm.transcribe(x[::2].copy(), sample_rate=8000)
    assert isinstance(r.text, str) and r.frames[-1] <= 25  # 200 mel frames -> 26 encoder frames


# -- loading --------------------------------------------------------------------------

def _copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(GOLDEN, tmp_path / "m"))


def test_missing_and_unknown_keys_are_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _copy(tmp_path)
    w = load_file(d / "model.safetensors")
    w.pop("encoder.layers.1.norm_out.bias")
    w["encoder.layers.0.self_attn.bogus"] = np.zeros(3, np.float32)
    save_file(w, d / "model.safetensors")
    with pytest.raises(CheckpointError, match="encoder.layers.0.self_attn.bogus"):
        load(d)
    w.pop("encoder.layers.0.self_attn.bogus")
    save_file(w, d / "model.safetensors")
    with pytest.raises(CheckpointError, match="encoder.layers.1.norm_out.bias"):
        load(d)


def test_wrong_config_shapes_type_and_tokenizer(tmp_path):
    d = _copy(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["decoder_hidden_size"] = 16
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape"):
        load(d)
    cfg["model_type"] = "parakeet"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="not nemotron_asr_streaming"):
        load(d)
    d2 = _copy(tmp_path / "x")
    (d2 / "tokenizer.model").unlink()
    with pytest.raises(CheckpointError, match="tokenizer"):
        load(d2)


def test_truncated_weights(tmp_path):
    d = _copy(tmp_path)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load(d)


def test_weights_keep_checkpoint_layout(nm):
    m = nm.model
    assert m.dtype == mx.float32
    assert m.encoder.subsampling.conv_in.weight.shape == (8, 3, 3, 1)
    assert m.encoder.layers[0].conv.depthwise_conv.weight.shape == (32, 9, 1)
    assert float(mx.abs(m.decoder.embedding.weight[nm.config.blank_id]).max()) == 0.0


# -- reference (needs torch + transformers) ---------------------------------------------

@pytest.mark.reference
def test_fresh_audio_against_transformers(nm):
    torch = pytest.importorskip("torch")
    tr = pytest.importorskip("transformers")
    ref = tr.NemotronAsrStreamingForRNNT.from_pretrained(str(GOLDEN)).eval()
    ref.generation_config.decoder_start_token_id = nm.config.blank_id
    ref.generation_config.pad_token_id = nm.config.blank_id
    fe = transformers_features(tr, 128)
    audio = speechlike(2.7, seed=11)
    f = fe(audio, sampling_rate=16000, return_tensors="pt")
    n = int(f.attention_mask.sum())
    np.testing.assert_allclose(NemoLogMel()(audio), f.input_features[0, :n].numpy(), atol=5e-4)
    for ms, r in MODES.items():
        with torch.no_grad():
            seq = ref.generate(input_features=f.input_features, attention_mask=f.attention_mask,
                               num_lookahead_tokens=r, max_new_tokens=2000).sequences[0].tolist()
        want = [t for t in seq if t != nm.config.blank_id]
        assert _stream(nm, audio, [1111], ms)[0] == want


def test_words_carry_token_times(nm, tmp_path):
    from mlx_speech.models.nemotron_streaming.step import words_from_tokens
    from mlx_speech.text.spm import SentencePieceDecoder

    tj = {"model": {"type": "BPE", "vocab": {"<unk>": 0, "\u2581he": 1, "llo": 2, "\u2581w": 3,
                                              "orld": 4, ".": 5}, "unk_token": "<unk>"},
          "added_tokens": [{"id": 6, "content": "<blank>", "special": True}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    tk = SentencePieceDecoder.from_file(tmp_path / "tokenizer.json")
    words = words_from_tokens([1, 2, 3, 4, 5], [2, 2, 5, 6, 6], tk)
    assert [(w.text, round(w.start, 2), round(w.end, 2)) for w in words] == [
        ("hello", 0.16, 0.24), ("world.", 0.40, 0.56)]
    r = nm.transcribe(speechlike(2.0, seed=8))
    assert " ".join(w.text for w in r.words) == " ".join(r.text.split())
