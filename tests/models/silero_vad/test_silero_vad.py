"""Silero VAD in MLX: parity with Silero's own ONNX (and JIT) on real speech, streaming ==
offline, batched == alone (streams joining and leaving), loading every layout, clear errors.

Real weights: Silero's release model as mlx_speech ships it (mlx_speech/models/silero_vad/data/,
copied from the `silero-vad` 6.2.3 wheel), checked against onnxruntime running that same file.
The wheel's other files (its op15 ONNX, the port's safetensors of snakers4/silero-vad#768, the
JIT) are compared too when the wheel is installed (`pip install --no-deps silero-vad`); those
tests skip without it. The clips are espeak-ng speech with pauses and background noise
(tests/data/make_vad_speech.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import soundfile as sf

import mlx_speech
from mlx_speech.errors import AudioError, CheckpointError, MlxSpeechError
from mlx_speech.models.silero_vad import (
    FRAME,
    SAMPLE_RATE,
    SileroVAD,
    VADState,
    frame_probs,
    load_vad,
    packaged_weights,
    wheel_weights,
)

DATA = Path(__file__).parents[2] / "data"
CLIPS = json.loads((DATA / "vad_speech.json").read_text())
PARITY_ATOL = 1e-5  # measured on CPU: <= 1.0e-6 against onnxruntime, 1.2e-6 against the JIT
STREAM_ATOL = 1e-6  # measured 0.0 on CPU; only GEMM row counts differ between chunkings


@pytest.fixture(scope="module")
def release_onnx() -> Path:  # Silero's v6.2 release model, shipped in the package
    return packaged_weights()


@pytest.fixture(scope="module")
def wheel_dir() -> Path:
    """The `silero-vad` wheel's data folder (optional: its extra files), or skip."""
    try:
        return wheel_weights().parent
    except CheckpointError as e:
        pytest.skip(f"{e}: the wheel's own files are not compared")


@pytest.fixture(scope="module")
def vad_release(release_onnx) -> SileroVAD:  # Silero's v6.2 release weights, from its ONNX
    return load_vad(release_onnx)


@pytest.fixture(scope="module")
def silero_safetensors(release_onnx, tmp_path_factory) -> Path:
    """The release weights in Silero's safetensors layout (the wheel's silero_vad_16k file's
    names and PyTorch shapes: convs (out, in, k), lstm_cell.*)."""
    from mlx_speech.models.silero_vad.onnxfile import read_onnx

    f = tmp_path_factory.mktemp("silero") / "silero_vad_16k.safetensors"
    mx.save_safetensors(str(f), {k: mx.array(v) for k, v in read_onnx(release_onnx).items()})
    return f


@pytest.fixture(scope="module")
def vad(silero_safetensors) -> SileroVAD:  # loaded through Silero's safetensors layout
    return load_vad(silero_safetensors)


def test_the_default_is_the_packaged_release_model(vad_release, release_onnx):
    """load_vad() is Silero's silero_vad.onnx shipped in the package (what Silero's JIT,
    pipecat and LiveKit run), the file its provenance note names, with Silero's MIT notice."""
    import mlx_speech.models.silero_vad as sv

    assert release_onnx == Path(sv.__file__).parent / "data" / "silero_vad.onnx"
    note = (release_onnx.parent / "README.md").read_text()
    want = re.search(r"sha256: `([0-9a-f]{64})`", note).group(1)
    assert hashlib.sha256(release_onnx.read_bytes()).hexdigest() == want
    assert "6.2.3" in note
    lic = (release_onnx.parent / "LICENSE").read_text()
    assert lic.startswith("MIT License") and "Copyright (c) 2020-present Silero Team" in lic
    _same(vad_release, load_vad())


def test_packaged_model_is_the_wheels(wheel_dir, release_onnx):
    assert (wheel_dir / "silero_vad.onnx").read_bytes() == release_onnx.read_bytes()


def clip(name: str) -> np.ndarray:
    x, sr = sf.read(DATA / CLIPS[name]["file"], dtype="float32")
    assert sr == SAMPLE_RATE
    return np.pad(x, (0, -len(x) % FRAME))


def offline(model: SileroVAD, x: np.ndarray) -> np.ndarray:
    probs, _ = model(mx.array(x[None]))
    mx.eval(probs)
    return np.array(probs[0])


def onnxruntime_probs(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    """Silero's ONNX through onnxruntime, driven as Silero's OnnxWrapper drives it: one
    512-sample frame per call, the previous 64 samples prepended, the state carried."""
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])
    state, ctx, out = np.zeros((2, 1, 128), np.float32), np.zeros((1, 64), np.float32), []
    for i in range(0, len(x), FRAME):
        window = np.concatenate([ctx, x[None, i:i + FRAME]], axis=1)
        p, state = sess.run(None, {"input": window, "state": state,
                                   "sr": np.array(SAMPLE_RATE, np.int64)})
        ctx = window[:, -64:]
        out.append(p[0, 0])
    return np.array(out)


# --- parity with Silero's own implementation, real speech ---------------------------------

def _check_parity(ours: np.ndarray, ref: np.ndarray, x: np.ndarray) -> None:
    assert ours.shape == ref.shape == (len(x) // FRAME,)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=PARITY_ATOL)
    assert ref.max() > 0.9 and ref.min() < 0.1  # real speech and real pauses in the clip


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_release_weights_match_silero_onnx(vad_release, release_onnx, name):
    x = clip(name)
    _check_parity(offline(vad_release, x), onnxruntime_probs(release_onnx.read_bytes(), x), x)


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_wheel_op15_onnx_matches_onnxruntime(wheel_dir, name):
    """The wheel's op15 export holds the weights as graph initializers (another reader path)."""
    onnx = wheel_dir / "silero_vad_16k_op15.onnx"
    x = clip(name)
    _check_parity(offline(load_vad(onnx), x), onnxruntime_probs(onnx.read_bytes(), x), x)


def _swap_weights(onnx: Path, weights: dict[str, np.ndarray]) -> bytes:
    """Silero's own ONNX graph with `weights` (Silero's names) swapped in, byte for byte."""
    from mlx_speech.models.silero_vad.onnxfile import read_onnx

    blob = onnx.read_bytes()
    for key, w in read_onnx(onnx).items():
        old, new = np.ascontiguousarray(w).tobytes(), weights[key].astype("<f4").tobytes()
        assert len(old) == len(new) and blob.count(old) == 1, key
        blob = blob.replace(old, new)
    return blob


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_silero_safetensors_match_silero_graph(release_onnx, tmp_path, name):
    """Another checkpoint in Silero's safetensors layout (the release weights, each scaled by
    its own random factor; the STFT basis kept): ours loads it as Silero's graph runs it."""
    from mlx_speech.models.silero_vad.onnxfile import read_onnx

    rng = np.random.default_rng(7)
    w = {k: v if k.startswith("stft") else (v * rng.uniform(0.9, 1.1, v.shape)).astype(np.float32)
         for k, v in read_onnx(release_onnx).items()}
    f = tmp_path / "other.safetensors"
    mx.save_safetensors(str(f), {k: mx.array(v) for k, v in w.items()})
    x = clip(name)
    ref = onnxruntime_probs(_swap_weights(release_onnx, w), x)
    np.testing.assert_allclose(offline(load_vad(f), x), ref, rtol=0, atol=PARITY_ATOL)
    assert not np.allclose(ref, onnxruntime_probs(release_onnx.read_bytes(), x), atol=1e-3)


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_wheel_safetensors_match_silero_graph(wheel_dir, name):
    """The wheel's safetensors is another checkpoint than its ONNX / JIT (Silero issue #768):
    run Silero's own ONNX graph with those weights swapped in, byte for byte."""
    from safetensors.numpy import load_file

    port = wheel_dir / "silero_vad_16k.safetensors"
    blob = _swap_weights(wheel_dir / "silero_vad_16k_op15.onnx", load_file(str(port)))
    x = clip(name)
    np.testing.assert_allclose(offline(load_vad(port), x), onnxruntime_probs(blob, x), rtol=0,
                               atol=PARITY_ATOL)


def test_release_weights_match_silero_jit(vad_release, wheel_dir):
    torch = pytest.importorskip("torch")
    jit = torch.jit.load(str(wheel_dir / "silero_vad.jit"), map_location="cpu").eval()
    x = clip("three_short_noisy")
    with torch.no_grad():
        ref = np.array([float(jit(torch.from_numpy(x[i:i + FRAME])[None], SAMPLE_RATE))
                        for i in range(0, len(x), FRAME)])
    np.testing.assert_allclose(offline(vad_release, x), ref, rtol=0, atol=PARITY_ATOL)


def test_speech_and_pauses_where_the_clips_have_them(vad_release):
    """Frames well inside an utterance are speech, frames well inside a pause are not."""
    for name, meta in CLIPS.items():
        p = frame_probs(vad_release, clip(name))
        t = (np.arange(len(p)) + 0.5) * FRAME / SAMPLE_RATE
        spans = [(u["start_s"], u["end_s"]) for u in meta["utterances"]]
        inside = np.zeros(len(p), bool)
        near = np.zeros(len(p), bool)
        for a, b in spans:
            inside |= (t > a + 0.15) & (t < b - 0.15)
            near |= (t > a - 0.35) & (t < b + 0.35)
        assert np.mean(p[inside] > 0.5) > 0.85, name
        assert np.all(p[~near] < 0.5), name


# --- streaming == offline, batched == alone ------------------------------------------------

def _chunkings(n: int):
    rng = np.random.default_rng(0)
    yield [1] * n
    yield [3] * (n // 3) + [n % 3]
    yield [7] * (n // 7) + [n % 7]
    cuts = np.sort(rng.choice(np.arange(1, n), size=9, replace=False))
    yield list(np.diff(np.concatenate([[0], cuts, [n]])))


def test_streaming_equals_offline(vad):
    x = clip("two_utterances")
    want = offline(vad, x)
    n = len(want)
    for sizes in _chunkings(n):
        state, got, pos = vad.make_state(1), [], 0
        for k in (int(s) for s in sizes if s):
            probs, state = vad(mx.array(x[None, pos * FRAME:(pos + k) * FRAME]), state)
            mx.eval(probs, *state.arrays())
            got.append(np.array(probs[0]))
            pos += k
        assert pos == n
        np.testing.assert_allclose(np.concatenate(got), want, rtol=0, atol=STREAM_ATOL)
    # a one-stream 1-D call is the same stream
    probs, _ = vad(mx.array(x))
    np.testing.assert_allclose(np.array(probs), want, rtol=0, atol=STREAM_ATOL)
    np.testing.assert_allclose(frame_probs(vad, x, piece_frames=37), want, rtol=0,
                               atol=STREAM_ATOL)


def test_batched_equals_alone_with_streams_joining_and_leaving(vad):
    a, b = clip("two_utterances"), clip("three_short_noisy")
    streams = {"a": a, "b": b, "c": a[::-1].copy(), "d": b[FRAME * 5:].copy()}
    alone = {k: offline(vad, v) for k, v in streams.items()}
    # (frames this step, streams active in it): streams join and leave between steps
    plan = [(4, "a"), (6, "ab"), (5, "abc"), (3, "bc"), (8, "bcd"), (2, "d"), (9, "acd")]
    states: dict[str, VADState] = {}
    pos = dict.fromkeys(streams, 0)
    got: dict[str, list] = {k: [] for k in streams}
    for k, active in plan:
        names = list(active)
        state = VADState.stack([states.get(s) or vad.make_state(1) for s in names])
        audio = np.stack([streams[s][pos[s] * FRAME:(pos[s] + k) * FRAME] for s in names])
        probs, state = vad(mx.array(audio), state)
        mx.eval(probs, *state.arrays())
        for i, s in enumerate(names):
            states[s] = state.rows(i)
            got[s].append(np.array(probs[i]))
            pos[s] += k
    for s in streams:
        ours = np.concatenate(got[s])
        np.testing.assert_allclose(ours, alone[s][:len(ours)], rtol=0, atol=STREAM_ATOL,
                                   err_msg=s)


def test_state_rows_stack_split(vad):
    st = vad.make_state(3)
    assert st.batch == 3 and st.context.shape == (3, 64) and st.h.shape == (3, 128)
    _, st = vad(mx.array(np.random.default_rng(1).uniform(-0.3, 0.3, (3, 2 * FRAME))
                         .astype(np.float32)), st)
    parts = st.split()
    assert [p.batch for p in parts] == [1, 1, 1]
    back = VADState.stack([parts[2], parts[0]])
    for a, b in zip(back.arrays(), st.rows([2, 0]).arrays(), strict=True):
        assert mx.array_equal(a, b)
    assert mx.array_equal(st.rows(-1).h, parts[2].h)
    with pytest.raises(MlxSpeechError, match="out of range"):
        st.rows([3])
    with pytest.raises(MlxSpeechError, match="at least one"):
        VADState.stack([])


# --- bad input ------------------------------------------------------------------------------

def test_bad_audio_is_one_clear_error(vad):
    ok = mx.zeros((1, FRAME))
    with pytest.raises(AudioError, match="16000 Hz audio, got 8000 Hz"):
        vad(ok, sample_rate=8000)
    with pytest.raises(AudioError, match="whole 512-sample frames"):
        vad(mx.zeros((1, 500)))
    with pytest.raises(AudioError, match="float samples"):
        vad(mx.zeros((1, FRAME), dtype=mx.int16))
    with pytest.raises(AudioError, match=r"\(batch, samples\)"):
        vad(mx.zeros((1, 1, FRAME)))
    with pytest.raises(MlxSpeechError, match="state is for 2 streams, audio has 1"):
        vad(ok, vad.make_state(2))
    probs, st = vad(mx.zeros((2, 0)))
    assert probs.shape == (2, 0) and st.batch == 2
    with pytest.raises(AudioError, match="float samples"):
        vad(np.zeros(FRAME, np.int16))
    x = clip("three_short_noisy")[:8 * FRAME]
    np.testing.assert_array_equal(np.array(vad(x.astype(np.float64))[0]), offline(vad, x))


# --- loading ----------------------------------------------------------------------------------

def _same(m1: SileroVAD, m2: SileroVAD) -> None:
    x = clip("three_short_noisy")[: 40 * FRAME]
    np.testing.assert_array_equal(offline(m1, x), offline(m2, x))


def _mlx_audio_weights(onnx: Path) -> dict[str, mx.array]:
    """Silero's weights in mlx-audio's names and layouts (what mlx-community/silero-vad-v6
    holds): nn.Conv1d (out, k, in), nn.LSTM Wx / Wh (4 * hidden, in) and one bias."""
    from mlx_speech.models.silero_vad.onnxfile import read_onnx

    s = {k: mx.array(v) for k, v in read_onnx(onnx).items()}
    w = {k: v.transpose(0, 2, 1) for k, v in s.items() if v.ndim == 3}
    w.update({k: v for k, v in s.items() if k.endswith(".bias") and "lstm" not in k})
    w["lstm.Wx"], w["lstm.Wh"] = s["lstm_cell.weight_ih"], s["lstm_cell.weight_hh"]
    w["lstm.bias"] = s["lstm_cell.bias_ih"] + s["lstm_cell.bias_hh"]
    return {f"vad_16k.{k}": v for k, v in w.items()}


def _mlx_community(onnx: Path, dest: Path, drop: str = "", add: str = "") -> Path:
    """mlx-community/silero-vad's folder: config.json + model.safetensors (the v5 repo also
    holds the 8 kHz branch under vad_8k.)."""
    dest.mkdir(parents=True)
    w = _mlx_audio_weights(onnx)
    w["vad_8k.stft_conv.weight"] = mx.zeros((130, 128, 1))
    w.pop(drop, None)
    if add:
        w[add] = mx.zeros(3)
    mx.save_safetensors(str(dest / "model.safetensors"), w)
    (dest / "config.json").write_text(json.dumps({"model_type": "silero_vad",
                                                  "branch_16k": {"chunk_size": 512}}))
    return dest


def test_loads_every_layout(vad, vad_release, release_onnx, silero_safetensors, tmp_path):
    _same(vad_release, load_vad(release_onnx.parent))  # a folder holding Silero's .onnx
    _same(vad_release, vad)  # Silero's safetensors layout
    port = tmp_path / "port"
    port.mkdir()
    (port / silero_safetensors.name).write_bytes(silero_safetensors.read_bytes())
    _same(vad_release, load_vad(port))  # a folder holding Silero's safetensors only
    community = _mlx_community(release_onnx, tmp_path / "community")
    _same(vad_release, load_vad(community))
    loaded = mlx_speech.load(community)  # the registry: config.json model_type silero_vad
    assert isinstance(loaded, SileroVAD)
    _same(vad_release, loaded)

    from mlx_speech.convert import convert_model
    from mlx_speech.hub import read_manifest

    out = convert_model(community, tmp_path / "ours", progress=False)
    assert read_manifest(out)["model_type"] == "silero_vad"
    _same(vad_release, load_vad(out))
    _same(vad_release, mlx_speech.load(out))


def test_loads_the_wheels_files(wheel_dir):
    _same(load_vad(wheel_dir / "silero_vad.onnx"), load_vad(wheel_dir))  # its data folder
    load_vad(wheel_dir / "silero_vad_16k.safetensors")


def test_loading_errors_are_one_line(vad, release_onnx, tmp_path, monkeypatch):
    jit = tmp_path / "silero_vad.jit"
    jit.write_bytes(b"PK\x03\x04")
    with pytest.raises(CheckpointError, match="not Silero VAD weights"):
        load_vad(jit)
    other = tmp_path / "other.safetensors"
    mx.save_safetensors(str(other), {"encoder.weight": mx.zeros((2, 2))})
    with pytest.raises(CheckpointError, match="not Silero VAD weights"):
        load_vad(other)
    onnx = release_onnx
    with pytest.raises(CheckpointError, match="missing key 'lstm.wh'"):
        load_vad(_mlx_community(onnx, tmp_path / "a", drop="vad_16k.lstm.Wh"))
    with pytest.raises(CheckpointError, match="unexpected key 'extra.weight'"):
        load_vad(_mlx_community(onnx, tmp_path / "b", add="vad_16k.extra.weight"))
    w = _mlx_audio_weights(onnx)
    w["vad_16k.stft_conv.weight"] = w["vad_16k.stft_conv.weight"][::-1]
    mx.save_safetensors(str(other), w)
    with pytest.raises(CheckpointError, match="not a windowed DFT basis"):
        load_vad(other)
    (tmp_path / "wrong").mkdir()
    (tmp_path / "wrong" / "config.json").write_text('{"model_type": "moshi"}')
    with pytest.raises(CheckpointError, match="'moshi' model, not silero_vad"):
        load_vad(tmp_path / "wrong")
    with pytest.raises(MlxSpeechError, match="not quantized"):
        load_vad(quantize=4)

    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(CheckpointError, match="silero-vad wheel is not installed"):
        wheel_weights()
    _same(vad, load_vad())  # no wheel needed: the packaged model
    import mlx_speech.models.silero_vad as sv

    monkeypatch.setattr(sv, "PACKAGED", tmp_path / "gone" / "silero_vad.onnx")
    with pytest.raises(CheckpointError, match="shipped with mlx_speech are missing.*reinstall"):
        load_vad()


def test_no_torch_imported_to_load_the_default():
    import subprocess
    import sys

    code = ("import sys; from mlx_speech.models.silero_vad import load_vad; load_vad(); "
            "print(sorted(m for m in ('torch', 'silero_vad', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_hub_repo_from_prefilled_cache_offline(vad_release, release_onnx, tmp_path):
    """A hub id in mlx-community's layout, as huggingface_hub caches it (no network)."""
    import subprocess
    import sys

    repo = tmp_path / "hub" / "models--mlx-community--silero-vad-v6"
    _mlx_community(release_onnx, repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    x = clip("two_utterances")[: 12 * FRAME]
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, json, numpy as np; from mlx_speech.models.silero_vad import load_vad; "
            "v = load_vad(sys.argv[1]); p, _ = v(np.load(sys.argv[2])); "
            "print(json.dumps(np.array(p).tolist()))")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"),
               HF_HOME=str(tmp_path))
    for name, ok in (("mlx-community/silero-vad-v6", True), ("mlx-community/absent", False)):
        r = subprocess.run([sys.executable, "-c", code, name, str(tmp_path / "x.npy")],
                           capture_output=True, text=True, env=env)
        if ok:
            assert r.returncode == 0, r.stderr
            np.testing.assert_array_equal(np.array(json.loads(r.stdout), np.float32),
                                          offline(vad_release, x))
        else:
            assert r.returncode != 0 and "mlx-community/absent" in r.stderr.splitlines()[-1]
