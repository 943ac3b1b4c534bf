"""Mimi vs PyTorch moshi 0.2.13 on tiny random codecs (goldens, no torch needed).

tiny_mimi*: the spec's fixture (1600 Hz, frame 32, constant codes). mimi24k*: make_mimi.py
(24 kHz real topology, frame 1920, batch 2, 8 of 12 codebooks, varying codes).
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_speech.errors import CheckpointError
from mlx_speech.models import mimi
from mlx_speech.models.mimi import Mimi, MimiConfig
from tests.support.mimi import (
    FIXTURES,
    GOLDEN,
    TOL,
    check_streaming_matches_torch_streaming,
    load_case,
)
from tests.support.mimi import stream as _stream


@pytest.fixture(scope="module", params=list(FIXTURES))
def case(request):
    return load_case(request.param)


def test_batch_matches_torch(case):
    model, r = case
    codes = np.array(model.encode(mx.array(r["x"])))
    np.testing.assert_array_equal(codes, r["codes_batch"])
    pcm = np.array(model.decode(mx.array(r["codes_batch"])))
    assert pcm.shape == r["pcm_batch"].shape
    assert np.abs(pcm - r["pcm_batch"]).max() < TOL


def test_streaming_matches_torch_streaming(case):
    check_streaming_matches_torch_streaming(case)


def test_streaming_codes_equal_batch_before_ring_fills(case):
    model, r = case
    x = mx.array(r["x"])
    codes, _ = _stream(model, x, model.make_state(batch=x.shape[0]))
    batch = np.array(model.encode(x))
    # two transformer steps per frame: frames before context/2 see the same keys either way
    n = model.cfg.transformer.transformer.context // 2
    np.testing.assert_array_equal(codes[..., :n], batch[..., :n])
    if r["codes_batch"].std() == 0:  # tiny fixture: constant codes, equal throughout
        np.testing.assert_array_equal(codes, batch)


def test_reset_reproduces_first_session(case):
    model, r = case
    x = mx.array(r["x"])
    st = model.make_state(batch=x.shape[0])
    first = _stream(model, x, st)
    st.reset()
    second = _stream(model, x, st)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])


def test_separate_encoder_and_decoder_states(case):
    model, r = case
    x = mx.array(r["x"])
    enc, dec = model.make_encoder_state(x.shape[0]), model.make_decoder_state(x.shape[0])
    F = model.frame_size
    codes = [model.encode_step(x[..., i : i + F], enc) for i in range(0, x.shape[-1], F)]
    np.testing.assert_array_equal(np.array(mx.concatenate(codes, -1)), r["codes_stream"])
    pcm = [model.decode_step(mx.array(r["codes_stream"][..., i : i + 1]), dec)
           for i in range(r["codes_stream"].shape[-1])]
    assert np.abs(np.array(mx.concatenate(pcm, -1)) - r["pcm_stream"]).max() < TOL


def test_state_does_not_grow():
    name, n_q = FIXTURES["tiny"]
    cfg = json.loads((GOLDEN / f"{name}_config.json").read_text())
    model = mimi.load(GOLDEN / f"{name}.safetensors", config=cfg, num_codebooks=n_q)
    st = model.make_state()
    rng = np.random.default_rng(0)
    sizes = []
    for _ in range(40):
        c = model.encode_step(mx.array(0.1 * rng.standard_normal((1, 1, model.frame_size)),
                                       dtype=mx.float32), st)
        model.decode_step(c, st)
        mx.eval(st.arrays())
        sizes.append(sum(a.size for a in st.arrays()))
    assert sizes[10] == sizes[-1] and sizes[-1] > 0


def test_num_codebooks_prefix_and_bounds():
    name = "mimi24k"
    cfg = json.loads((GOLDEN / f"{name}_config.json").read_text())
    model = mimi.load(GOLDEN / f"{name}.safetensors", config=cfg, num_codebooks=3)
    r = np.load(GOLDEN / f"{name}_ref.npz")
    np.testing.assert_array_equal(np.array(model.encode(mx.array(r["x"]))),
                                  r["codes_batch"][:, :3])
    with pytest.raises(ValueError):
        model.num_codebooks = 13
    with pytest.raises(ValueError):
        model.encode_step(mx.zeros((1, 1, model.frame_size + 1)), model.make_state())


def _weights(name):
    return dict(mx.load(str(GOLDEN / f"{name}.safetensors")))


def test_loader_is_strict_and_accepts_variants(tmp_path):
    cfg = json.loads((GOLDEN / "tiny_mimi_config.json").read_text())
    r = np.load(GOLDEN / "tiny_mimi_ref.npz")
    w = _weights("tiny_mimi")

    missing = dict(w)
    del missing["encoder.model.3.conv.conv.bias"]
    mx.save_safetensors(str(tmp_path / "a.safetensors"), missing)
    with pytest.raises(CheckpointError, match="encoder.model.3.conv.bias"):
        mimi.load(tmp_path / "a.safetensors", config=cfg, num_codebooks=4)

    extra = dict(w, **{"encoder.model.99.conv.conv.weight": mx.zeros((1, 1, 1))})
    mx.save_safetensors(str(tmp_path / "b.safetensors"), extra)
    with pytest.raises(CheckpointError, match="unexpected key"):
        mimi.load(tmp_path / "b.safetensors", config=cfg, num_codebooks=4)

    # split attention names, legacy codebook names and a weight-norm pair load identically
    alt = {}
    for k, v in w.items():
        if k.endswith("self_attn.in_proj_weight"):
            alt[k.replace("in_proj_weight", "in_projs.0.weight")] = v
        elif k.endswith("_codebook.embedding_sum"):
            alt[k.replace("embedding_sum", "embed_avg")] = v
        elif k.endswith("_codebook.cluster_usage"):
            alt[k.replace("cluster_usage", "cluster_size")] = v
        elif k == "decoder.model.0.conv.conv.weight":
            n = mx.sqrt((v * v).sum(axis=(1, 2), keepdims=True))
            alt[k + "_g"], alt[k + "_v"] = n, 3.0 * v
            alt[k.replace("weight", "bias")] = w[k.replace("weight", "bias")]
        else:
            alt[k] = v
    mx.save_safetensors(str(tmp_path / "c.safetensors"), alt)
    model = mimi.load(tmp_path / "c.safetensors", config=cfg, num_codebooks=4)
    pcm = np.array(model.decode(mx.array(r["codes_batch"])))
    assert np.abs(pcm - r["pcm_batch"]).max() < TOL


def test_folder_layout_and_default_config(tmp_path):
    cfg = MimiConfig()
    assert (cfg.sample_rate, cfg.frame_size, cfg.resample_stride) == (24000, 1920, 2)
    assert cfg.seanet.hop_length == 960 and cfg.transformer.transformer.context == 250
    n = sum(v.size for k, v in tree_flatten(Mimi(cfg).parameters()) if "vq.layers" not in k)
    assert 79.2e6 < n < 79.4e6  # spec 1: ~79.3 M parameters + codebooks
    with pytest.raises(CheckpointError):
        mimi.load(tmp_path)
    # Kyutai folder: config.json names the weights and a separate Mimi json
    (tmp_path / "m.safetensors").write_bytes((GOLDEN / "mimi24k.safetensors").read_bytes())
    (tmp_path / "mc.json").write_text((GOLDEN / "mimi24k_config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(
        {"mimi_name": "m.safetensors", "mimi_config_name": "mc.json", "dep_q": 8}))
    model = mimi.load(tmp_path)
    r = np.load(GOLDEN / "mimi24k_ref.npz")
    np.testing.assert_array_equal(np.array(model.encode(mx.array(r["x"]))), r["codes_batch"])


@pytest.mark.reference
def test_real_checkpoint_names_map_onto_real_config():
    pytest.importorskip("moshi")
    torch = pytest.importorskip("torch")
    from moshi.models.loaders import get_mimi

    with torch.device("meta"):
        ref = get_mimi(None, device="meta")
    fused = {}
    for k, v in ref.state_dict().items():
        if k.endswith("._embedding"):
            continue
        k = k.replace("in_projs.0.weight", "in_proj_weight").replace("out_projs.0.", "out_proj.")
        fused[k] = mx.zeros(tuple(v.shape))  # lazy: never evaluated
    got = mimi.remap(fused, MimiConfig())
    want = dict(tree_flatten(Mimi(MimiConfig()).parameters()))
    assert set(got) == set(want)
    assert all(tuple(got[k].shape) == tuple(want[k].shape) for k in want)
