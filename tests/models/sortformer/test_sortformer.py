"""Streaming Sortformer diarization: parity with NeMo 3.0 on a tiny random model saved as a real
`.nemo` (tests/golden/make_sortformer.py), on three espeak-ng voices in turns with an overlap.

What these can show with random weights: the network, the streaming speaker cache / FIFO
algorithm and the segment rule compute what NeMo computes, any chunking and any batching give
the same frames, and the checkpoint layouts load the same. What they cannot show: that the
speakers found are the right ones (random weights know no voices)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import soundfile as sf

from mlx_speech.errors import CheckpointError
from mlx_speech.models import sortformer
from mlx_speech.models.sortformer import streaming as streaming_mod
from mlx_speech.models.sortformer.config import SortformerConfig
from mlx_speech.models.sortformer.weights import nemo_name, remap
from mlx_speech.nn import cache as nn_cache
from mlx_speech.nn import compiled
from tests.support.gpu_emulation import TieOrderNumpy
from tests.support.numbers import assert_same_numbers

GOLDEN = Path(__file__).parents[2] / "golden" / "sortformer"
NEMO = GOLDEN / "tiny.nemo"
AUDIO = Path(__file__).parents[2] / "data" / "voices_3spk.wav"
NET_TOL = 1e-4  # the network from NeMo's own features (measured: about 1e-6)
# from audio: our mel is float64 (NeMo's torch.stft is float32, 1e-4 apart in the log domain)
AUDIO_TOL = 5e-4


@pytest.fixture(scope="module")
def model():
    return sortformer.load(NEMO)


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(GOLDEN / "golden.npz"))


@pytest.fixture(scope="module")
def wav():
    x, sr = sf.read(AUDIO, dtype="float32")
    assert sr == 16000
    return x


def _seg_rows(segs) -> list[tuple]:
    return [(s.speaker, s.start, s.end) for s in segs]


def _ref_rows(arr) -> list[tuple]:
    return [(int(a), float(b), float(c)) for a, b, c in arr.tolist()]


def test_loads_through_the_registry(model):
    import mlx_speech

    m = mlx_speech.load(NEMO)
    assert isinstance(m, sortformer.SortformerDiarizer)
    assert m.kind == "diarizer" and m.n_speakers == 4
    assert m.config.chunk_len == 6 and m.config.fifo_len == 16  # from model_config.yaml


def test_offline_network_matches_nemo(model, golden):
    probs = np.array(model.model(mx.array(golden["mel"])[None])[0])
    assert probs.shape == golden["offline_mel"].shape
    np.testing.assert_allclose(probs, golden["offline_mel"], atol=NET_TOL, rtol=0)


def test_streaming_matches_nemo_streaming(model, golden):
    s = model.session()
    probs = np.concatenate([s.feed_features(golden["mel"]), s.finish()])
    assert probs.shape == golden["streaming"].shape
    np.testing.assert_allclose(probs, golden["streaming"], atol=NET_TOL, rtol=0)
    # the streaming algorithm matters here: NeMo's streamed and offline outputs differ
    assert np.abs(golden["streaming"] - golden["offline_mel"]).max() > 0.05
    assert _seg_rows(sortformer.segments(probs)) == _ref_rows(golden["streaming_segments"])


def test_from_audio_matches_nemo(model, golden, wav):
    st = model.diarize(wav)
    np.testing.assert_allclose(st.probs, golden["streaming"], atol=AUDIO_TOL, rtol=0)
    assert _seg_rows(st.segments) == _ref_rows(golden["streaming_segments"])
    off = model.diarize(wav, streaming=False)  # NeMo's offline forward: peak-normalised audio
    np.testing.assert_allclose(off.probs, golden["offline"], atol=AUDIO_TOL, rtol=0)
    assert _seg_rows(off.segments) == _ref_rows(golden["offline_segments"])


def test_segment_rule_is_nemos(golden):
    for k in ("offline", "streaming"):
        ref = _ref_rows(golden[f"{k}_segments"])
        assert len(ref) > 10
        assert _seg_rows(sortformer.segments(golden[k])) == ref


def test_any_chunking_gives_the_same_frames(model, wav):
    whole = model.session()
    ref = np.concatenate([whole.feed(wav), whole.finish()])
    rng = np.random.default_rng(0)
    s, got, i = model.session(), [], 0
    while i < len(wav):
        n = int(rng.integers(1, 9000))
        got.append(s.feed(wav[i: i + n]))
        i += n
    got.append(s.finish())
    got = np.concatenate(got)
    np.testing.assert_array_equal(got, ref)
    assert s.time == pytest.approx(len(ref) * 0.08)


def test_frames_arrive_as_soon_as_a_chunk_and_its_right_context_exist(model, wav):
    c = model.config
    s = model.session()
    need = (c.chunk_len + c.chunk_right_context) * 8 * 160 + 240  # + the last window's tail
    assert len(s.feed(wav[: need - 400])) == 0
    assert len(s.feed(wav[need - 400: need])) == c.chunk_len


def test_batched_equals_alone(model, golden, wav):
    short = wav[: int(6.4 * 16000)]
    late = np.concatenate([np.zeros(8000, np.float32), wav[16000 * 3:]])
    audios = [wav, short, late]
    alone = []
    for a in audios:
        s = model.session()
        alone.append(np.concatenate([s.feed(a), s.finish()]))
    np.testing.assert_allclose(alone[1], golden["short_streaming"], atol=AUDIO_TOL, rtol=0)
    sessions = [model.session() for _ in audios]
    got = [[] for _ in audios]
    sizes = [3000, 7000, 5000]
    pos = [0, 0, 0]
    while any(p < len(a) for p, a in zip(pos, audios, strict=True)):
        live = [i for i in range(3) if pos[i] < len(audios[i])]
        outs = model.feed_many([(sessions[i], audios[i][pos[i]: pos[i] + sizes[i]])
                                for i in live])
        for i, o in zip(live, outs, strict=True):
            got[i].append(o)
            pos[i] += sizes[i]
    for i, o in enumerate(model.finish_many(sessions)):
        got[i].append(o)
    for g, a in zip(got, alone, strict=True):
        assert_same_numbers(np.concatenate(g), a, atol=1e-5)


def test_fixed_shapes_per_step(model, wav, monkeypatch):
    compiled.reset()  # every step shape reaches the spy (compiled steps trace it again)
    shapes = set()
    real = model.model.infer

    def spy(x, lengths=None):
        shapes.add(tuple(x.shape))
        assert min(x.shape) > 0
        return real(x, lengths)

    monkeypatch.setattr(model.model, "infer", spy)
    s = model.session()
    s.feed(wav)
    s.finish()
    assert len(shapes) == 1  # (1, spkcache_len + fifo_len + chunk frames with context, d)


def test_no_fifo_and_other_streaming_parameters(model, wav):
    # the released default has fifo_len 0; no zero-size buffer, finite outputs
    s = model.session(fifo_len=0, chunk_len=10, spkcache_update_period=10)
    probs = np.concatenate([s.feed(wav), s.finish()])
    assert probs.shape == (125, 4) and np.isfinite(probs).all()
    with pytest.raises(CheckpointError):
        model.session(no_such_parameter=1)


def test_bad_input_is_one_clear_error(model):
    from mlx_speech.errors import MlxSpeechError

    s, other = model.session(), model.session()
    with pytest.raises(MlxSpeechError):
        model.feed_many([(s, np.zeros(10, np.float32)), (s, np.zeros(10, np.float32))])
    with pytest.raises(MlxSpeechError):
        model.feed_many([(other, np.zeros(10, np.float32)),
                         (s, np.full(10, np.nan, np.float32))])
    assert other.n_mel == 0  # nothing fed when any input is bad
    s.finish()
    with pytest.raises(MlxSpeechError):
        s.feed(np.zeros(10, np.float32))


def test_compression_keeps_speakers_in_arrival_order(model):
    c = model.config
    rng = np.random.default_rng(1)
    n = c.spkcache_len + 12
    preds = rng.uniform(0, 1, (n, c.n_spk)).astype(np.float32)
    frames, disabled = streaming_mod.compress(preds, c)
    assert frames.shape == (c.spkcache_len,) and disabled.sum() >= c.n_spk
    # grouped by speaker in slot order, time order within each speaker
    kept = frames[~disabled]
    assert len(kept) and (kept < n).all()


def _tie_config():
    """Two speakers, a 6-frame cache (one silence slot per speaker) and no boosts, so the
    selection is the scores' own top 6 (min_pos large: no score is replaced by -inf)."""
    return SortformerConfig(
        n_spk=2, spkcache_len=6, spkcache_sil_frames_per_spk=1, strong_boost_rate=0.0,
        weak_boost_rate=0.0, min_pos_scores_rate=10.0, scores_boost_latest=0.0).check()


@pytest.mark.parametrize("order", ["stable", "reversed"])
def test_compression_ties_keep_the_lower_speakers_copy_of_a_shared_frame(monkeypatch, order):
    """A frame both speakers hold with equal probabilities has equal finite scores in both
    speakers' columns; with one place left, the rule keeps the lower speaker slot's copy,
    whatever order a sort lists the tie in (NeMo leaves it to torch.topk: docs/diarization.md,
    known differences)."""
    c = _tie_config()
    preds = np.full((7, 2), 0.05, np.float32)
    preds[0, 0] = preds[1, 1] = preds[2, 1] = 0.9  # one speaker each: positive scores
    preds[4] = [0.8, 0.8]  # both speakers, equally: two equal finite (negative) scores
    scores = streaming_mod._scores(preds, c)
    assert np.isfinite(scores[4]).all() and scores[4, 0] == scores[4, 1] < 0
    monkeypatch.setattr(streaming_mod, "np", TieOrderNumpy(order))
    frames, disabled = streaming_mod.compress(preds, c)
    # slots grouped by speaker (time order within): speaker 0 keeps frames 0 and 4 and its
    # silence slot, speaker 1 frames 1, 2 and its silence slot; frame 4 is not kept twice
    assert frames.tolist() == [0, 4, 0, 1, 2, 0]
    assert disabled.tolist() == [False, False, True, False, False, True]


def test_compression_does_not_depend_on_the_order_of_ties(monkeypatch):
    """Coarse probabilities (ties everywhere, in the boosts and in the final selection, finite
    and infinite): the same cache under any tie order of the host's sorts."""
    model_config = SortformerConfig(n_spk=4, spkcache_len=24, spkcache_sil_frames_per_spk=2).check()
    rng = np.random.default_rng(3)
    for trial in range(20):
        preds = (rng.integers(0, 5, (40, 4)) / 4).astype(np.float32)
        preds[rng.integers(0, 40, 6)] = preds[rng.integers(0, 40, 6)]  # repeated rows too
        got = []
        for order in ("stable", "reversed"):
            monkeypatch.setattr(streaming_mod, "np", TieOrderNumpy(order))
            got.append(streaming_mod.compress(preds, model_config))
        monkeypatch.undo()
        for a, b in zip(*got, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"trial {trial}")


def _nemo_state(model):
    from mlx_speech.models.nemo.checkpoint import read_archive

    _, sd, _ = read_archive(NEMO, tokenizer=False)
    return sd


def test_strict_loading_names_the_key(model):
    from mlx.utils import tree_flatten

    expected = set(dict(tree_flatten(model.model.parameters())))
    sd = _nemo_state(model)
    bad = dict(sd, **{"encoder.layers.0.extra.weight": mx.zeros((1,))})
    with pytest.raises(CheckpointError, match="encoder.layers.0.extra.weight"):
        remap(bad, expected)
    missing = {k: v for k, v in sd.items() if "single_hidden_to_spks.bias" not in k}
    with pytest.raises(CheckpointError, match="single_hidden_to_spks.bias"):
        remap(missing, expected)


def _mlx_audio_folder(model, tmp_path, dtype=np.float32) -> Path:
    """The layout mlx-audio's sortformer converter writes (and mlx-community publishes): its
    key names, MLX conv layouts with 1x1 convs kept as convs, an extra sinusoid table."""
    sd = _nemo_state(model)
    out = {}
    for k, w in sd.items():
        if k.startswith("preprocessor.") or k.endswith("num_batches_tracked"):
            continue
        name = nemo_name(k)
        w = np.array(w)
        if w.ndim == 4:
            w = w.transpose(0, 2, 3, 1)
        elif w.ndim == 3:
            w = w.transpose(0, 2, 1)
        out[name] = mx.array(w.astype(dtype))
    out["tf_encoder.embed_positions.weight"] = mx.zeros((1500, model.config.tf_d_model))
    folder = tmp_path / f"mlx_audio_{np.dtype(dtype).name}"
    folder.mkdir()
    mx.save_safetensors(str(folder / "model.safetensors"), out)
    cfg = model.config.to_mlx_audio()
    cfg["dtype"] = np.dtype(dtype).name
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_mlx_audio_layout_loads_the_same(model, wav, tmp_path):
    import mlx_speech

    folder = _mlx_audio_folder(model, tmp_path)
    names = mx.load(str(folder / "model.safetensors"))
    assert names["fc_encoder.layers.0.conv.pointwise_conv1.weight"].ndim == 3
    assert any(re.match(r"fc_encoder\.subsampling\.layers_3\.weight", k) for k in names)
    x = wav[: 16000 * 4]
    np.testing.assert_allclose(mlx_speech.load(folder).probabilities(x),
                               model.probabilities(x), atol=1e-5, rtol=0)
    m16 = mlx_speech.load(_mlx_audio_folder(model, tmp_path, np.float16))  # the -fp16 repo
    assert m16.model.fc_encoder.layers[0].conv.pointwise_conv1.weight.dtype == mx.float16
    assert np.isfinite(m16.probabilities(x)).all()


def test_convert_round_trip(model, wav, tmp_path):
    import mlx_speech
    from mlx_speech.convert import convert

    out = convert(NEMO, tmp_path / "conv", progress=False)[0]
    assert json.loads((out / "mlx_speech.json").read_text())["model_type"] == "sortformer"
    m = mlx_speech.load(out)
    x = wav[: 16000 * 4]
    assert_same_numbers(m.probabilities(x), model.probabilities(x))


def test_quantize_on_load_keeps_the_stem_and_heads(model, wav):
    import mlx.nn as nn

    q = sortformer.load(NEMO, quantize=8, group_size=32)
    assert isinstance(q.model.fc_encoder.layers[0].feed_forward1.linear1, nn.QuantizedLinear)
    assert isinstance(q.model.tf_encoder.layers[0].fc2, nn.QuantizedLinear)  # width 32
    assert not isinstance(q.model.fc_encoder.subsampling.linear, nn.QuantizedLinear)
    assert not isinstance(q.model.sortformer_modules.single_hidden_to_spks, nn.QuantizedLinear)
    probs = q.probabilities(wav[: 16000 * 3])
    assert probs.shape == (38, 4) and np.isfinite(probs).all()


def test_hub_repo_holding_only_the_nemo(tmp_path):
    """NVIDIA's repo has no config.json, only `diar_streaming_sortformer_4spk-v2.1.nemo`."""
    import os
    import shutil
    import subprocess
    import sys

    cache = tmp_path / "hub"
    repo = cache / "models--nvidia--tiny-sortformer"
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    shutil.copy(NEMO, snap / "tiny-sortformer.nemo")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path),
               PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    code = ("import mlx_speech; m = mlx_speech.load('nvidia/tiny-sortformer'); "
            "print(m.kind, m.config.chunk_len)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["diarizer", "6"]


def test_gpu_batch_padding_changes_nothing(model, wav, monkeypatch):
    """On GPU backends a step's batch is padded to a power of two with copies of its first row
    (fewer shapes for the backend's graph caches); forced on here, three streams step as four
    and give what they give alone."""
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)
    compiled.reset()  # every step shape reaches the spy (compiled steps trace it again)
    sizes = []
    real = model.model.infer

    def spy(x, lengths=None):
        sizes.append(x.shape[0])
        return real(x, lengths)

    monkeypatch.setattr(model.model, "infer", spy)
    audios = [wav[: 16000 * 3], wav[16000: 16000 * 5], wav[: 16000 * 2]]
    sessions = [model.session() for _ in audios]
    got = model.feed_many(list(zip(sessions, audios, strict=True)))
    got = [np.concatenate([g, f]) for g, f in zip(got, model.finish_many(sessions), strict=True)]
    assert 4 in sizes and set(sizes) <= {1, 2, 4}
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", False)
    for a, g in zip(audios, got, strict=True):
        s = model.session()
        assert_same_numbers(g, np.concatenate([s.feed(a), s.finish()]), atol=1e-5)
