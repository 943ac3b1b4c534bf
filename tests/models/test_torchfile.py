"""mlx_speech.models.torchfile: torch.save archives read without torch and without running code."""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.errors import CheckpointError
from mlx_speech.models.torchfile import flatten_tensors, load_torch, non_tensor_leaves

ROOT = Path(__file__).resolve().parents[2]


# ---- a hand-written torch.save archive, so CI without torch covers the reader ----

def _g(module: str, name: str) -> bytes:  # GLOBAL
    return b"c" + f"{module}\n{name}\n".encode()


def _s(text: str) -> bytes:  # BINUNICODE
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _i(n: int) -> bytes:  # BININT
    return b"J" + struct.pack("<i", n)


def _tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def _tensor(storage_cls: str, key: str, numel: int, offset: int, size, stride) -> bytes:
    """_rebuild_tensor_v2(persistent storage, offset, size, stride, False, OrderedDict())."""
    pid = _tup(_s("storage"), _g("torch", storage_cls), _s(key), _s("cpu"), _i(numel)) + b"Q"
    return (_g("torch._utils", "_rebuild_tensor_v2") + b"(" + pid + _i(offset)
            + _tup(*map(_i, size)) + _tup(*map(_i, stride)) + b"\x89"
            + _g("collections", "OrderedDict") + b")R" + b"tR")


def _archive(pkl: bytes, storages: dict[str, bytes], byteorder: str = "little") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:  # stored, as torch writes it
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", byteorder)
        for key, raw in storages.items():
            z.writestr(f"archive/data/{key}", raw)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def _hand_made(byteorder: str = "little") -> bytes:
    e = "<" if byteorder == "little" else ">"
    f32 = np.arange(6, dtype=f"{e}f4").tobytes()  # storage 0: 0..5
    bf16 = np.array([0x3F80, 0xC000, 0x4040], dtype=f"{e}u2").tobytes()  # 1.0, -2.0, 3.0
    pkl = (b"\x80\x02}(" + _s("t") + _tensor("FloatStorage", "0", 6, 0, (3, 2), (1, 3))
           + _s("tail") + _tensor("FloatStorage", "0", 6, 4, (2,), (1,))
           + _s("nested") + b"](" + _tensor("BFloat16Storage", "1", 3, 0, (3,), (1,))
           + _s("text") + _i(7) + b"e"
           + b"u.")
    return _archive(pkl, {"0": f32, "1": bf16}, byteorder)


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_hand_made_archive_without_torch(byteorder):
    obj = load_torch(_hand_made(byteorder))
    assert set(obj) == {"t", "tail", "nested"}
    # stride (1, 3) over 0..5 is the transpose of [[0, 1, 2], [3, 4, 5]]
    assert obj["t"].dtype == mx.float32
    np.testing.assert_array_equal(np.array(obj["t"]), np.arange(6.0).reshape(2, 3).T)
    np.testing.assert_array_equal(np.array(obj["tail"]), [4.0, 5.0])  # offset view, shared
    b = obj["nested"][0]
    assert b.dtype == mx.bfloat16
    np.testing.assert_array_equal(np.array(b.astype(mx.float32)), [1.0, -2.0, 3.0])
    assert obj["nested"][1:] == ["text", 7]


def test_float64_never_becomes_an_mlx_array(no_float64, tmp_path, capsys):
    """A GPU op on a float64 array raises; the reader narrows in numpy, so no float64 MLX
    array exists at any point (the emulation raises on creating one), converting included."""
    f64 = (np.arange(6) * 0.75 - 1).astype("<f8")
    pkl = (b"\x80\x02}(" + _s("w") + _tensor("DoubleStorage", "0", 6, 0, (2, 3), (3, 1))
           + _s("t") + _tensor("DoubleStorage", "0", 6, 1, (2,), (3,))
           + _s("f") + _tensor("FloatStorage", "1", 2, 0, (2,), (1,)) + b"u.")
    raw = _archive(pkl, {"0": f64.tobytes(), "1": np.ones(2, "<f4").tobytes()})
    from mlx_speech.convert import convert

    (tmp_path / "d.pt").write_bytes(raw)
    (out,) = convert(tmp_path / "d.pt", tmp_path / "d.safetensors", progress=False)
    assert "2 float64 tensor(s) as float32 (w, t)" in capsys.readouterr().err
    got = mx.load(str(out))
    assert {k: v.dtype for k, v in got.items()} == {"w": mx.float32, "t": mx.float32,
                                                    "f": mx.float32}
    narrowed = []
    obj = load_torch(raw, narrowed=narrowed)
    assert [a.dtype for a in obj.values()] == [mx.float32] * 3
    assert narrowed[0] is obj["w"] and narrowed[1] is obj["t"] and len(narrowed) == 2
    for k, ref in (("w", f64.reshape(2, 3)), ("t", f64[[1, 4]])):
        np.testing.assert_array_equal(np.array(obj[k]), ref.astype(np.float32))
        np.testing.assert_array_equal(np.array(got[k]), ref.astype(np.float32))


def test_path_and_bytes_agree(tmp_path):
    p = tmp_path / "x.pt"
    p.write_bytes(_hand_made())
    a, b = load_torch(p), load_torch(p.read_bytes())
    assert flatten_tensors(a).keys() == flatten_tensors(b).keys() == {"t", "tail", "nested.0"}
    for k, v in flatten_tensors(a).items():
        assert mx.array_equal(v, flatten_tensors(b)[k]).item()


def test_deflated_members_are_read_too():
    src = zipfile.ZipFile(io.BytesIO(_hand_made()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for n in src.namelist():
            z.writestr(n, src.read(n))
    np.testing.assert_array_equal(np.array(load_torch(buf.getvalue())["tail"]), [4.0, 5.0])


# ---- safety ----

class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickled_code_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"w": _Evil(marker)}, protocol=2)
    assert pickle.loads(payload) == {"w": 0} and marker.exists()  # the payload is live
    marker.unlink()
    with pytest.raises(CheckpointError, match=r"refusing to load (posix|os|nt)\.system"):
        load_torch(_archive(payload, {}))
    assert not marker.exists()


@pytest.mark.parametrize("module,name", [("builtins", "eval"), ("builtins", "getattr"),
                                         ("torch", "load"), ("numpy.core.multiarray", "scalar"),
                                         ("torch.nn.modules.linear", "Linear")])
def test_other_globals_are_refused(module, name):
    with pytest.raises(CheckpointError, match=f"refusing to load {module}.{name}"):
        load_torch(_archive(b"\x80\x02" + _g(module, name) + b")R.", {}))


def test_layout_past_the_storage_is_refused():
    # a stride that would read past the 6 floats must not reach as_strided
    pkl = b"\x80\x02" + _tensor("FloatStorage", "0", 6, 0, (3, 3), (3, 1)) + b"."
    with pytest.raises(CheckpointError, match="past the end of storage 0"):
        load_torch(_archive(pkl, {"0": np.zeros(6, np.float32).tobytes()}))
    pkl = b"\x80\x02" + _tensor("FloatStorage", "0", 6, -1, (2,), (1,)) + b"."
    with pytest.raises(CheckpointError, match="bad tensor layout"):
        load_torch(_archive(pkl, {"0": np.zeros(6, np.float32).tobytes()}))


def test_missing_storage_member():
    pkl = b"\x80\x02" + _tensor("FloatStorage", "9", 1, 0, (1,), (1,)) + b"."
    with pytest.raises(CheckpointError, match="lacks archive/data/9"):
        load_torch(_archive(pkl, {}))


def test_not_torch_files(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        load_torch(tmp_path / "absent.pt")
    with pytest.raises(CheckpointError, match="is a folder"):
        load_torch(tmp_path)
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.pt is not a torch zip archive"):
        load_torch(tmp_path / "empty.pt")
    (tmp_path / "notes.pt").write_text("hello")
    with pytest.raises(CheckpointError, match="not a torch zip archive$"):
        load_torch(tmp_path / "notes.pt")
    legacy = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps({}, protocol=2)
    with pytest.raises(CheckpointError, match="legacy torch.save format.*re-save"):
        load_torch(legacy)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("readme.txt", "hi")
    with pytest.raises(CheckpointError, match="no data.pkl"):
        load_torch(buf.getvalue(), name="other.zip")


# ---- flattening ----

def test_flatten_tensors():
    a, b, c = mx.zeros(1), mx.ones(2), mx.arange(3)
    obj = collections.OrderedDict(x={"y": a, "n": 3}, z=[b, (c, None)], s="str")
    assert list(flatten_tensors(obj)) == ["x.y", "z.0", "z.1.0"]
    assert flatten_tensors(obj, "m")["m.z.1.0"] is c
    assert flatten_tensors(a) == {"": a} and flatten_tensors(a, "embedding") == {"embedding": a}
    assert flatten_tensors({1: a}) == {"1": a}
    assert non_tensor_leaves(obj) == ["x.n", "z.1.1", "s"]
    with pytest.raises(CheckpointError, match="same name 'x.y'"):
        flatten_tensors({"x.y": a, "x": {"y": b}})


# ---- against real torch.save output ----

DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32",
          "int64", "bool", "uint16", "uint32", "uint64", "complex64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_matches_torch(dtype):
    torch = pytest.importorskip("torch")
    t = (torch.arange(-6, 18) * 0.75).reshape(4, 6)
    if dtype.startswith("uint") or dtype == "bool":
        t = t.abs()
    t = t.to(getattr(torch, dtype))
    buf = io.BytesIO()
    torch.save({"full": t, "view": t[1:, ::2].T}, buf)
    got = load_torch(buf.getvalue())
    want = {"bool": "bool_", "float64": "float32"}.get(dtype, dtype)  # float64: see above
    assert got["full"].dtype == getattr(mx, want)
    for key, ref in (("full", t), ("view", t[1:, ::2].T)):
        if dtype in ("bfloat16", "float64"):  # numpy has no bf16: compare as float32
            ref, arr = ref.float().numpy(), np.array(got[key].astype(mx.float32))
        else:
            ref, arr = ref.numpy(), np.array(got[key])
        assert arr.shape == ref.shape and arr.dtype == ref.dtype
        np.testing.assert_array_equal(arr, ref)


def test_structures_match_torch(tmp_path):
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(3, 2)
    base = torch.randn(5, 4)
    obj = {
        "sd": lin.state_dict(),  # an OrderedDict with _metadata
        "param": torch.nn.Parameter(torch.ones(2)),
        "list": [base, base[2:], base.T, (torch.tensor(2.5), "x", 3, None, b"\x00\xff")],
        "empty": torch.zeros(0, 3),
        "size": torch.Size([2, 3]),
    }
    torch.save(obj, tmp_path / "s.pt")
    got = load_torch(tmp_path / "s.pt")
    assert isinstance(got["sd"], collections.OrderedDict) and list(got["sd"]) == ["weight", "bias"]
    np.testing.assert_array_equal(np.array(got["sd"]["weight"]), lin.weight.detach().numpy())
    np.testing.assert_array_equal(np.array(got["param"]), [1.0, 1.0])
    for g, r in zip(got["list"][:3], obj["list"][:3], strict=True):
        np.testing.assert_array_equal(np.array(g), r.numpy())
    scalar, *rest = got["list"][3]
    assert scalar.shape == () and scalar.item() == 2.5
    assert rest == ["x", 3, None, b"\x00\xff"]
    assert got["empty"].shape == (0, 3) and tuple(got["size"]) == (2, 3)
    flat = flatten_tensors(got)
    assert set(flat) == {"sd.weight", "sd.bias", "param", "list.0", "list.1", "list.2",
                         "list.3.0", "empty"}
    # a bare tensor
    torch.save(torch.arange(4, dtype=torch.bfloat16), tmp_path / "bare.pt")
    bare = load_torch(tmp_path / "bare.pt")
    assert isinstance(bare, mx.array) and bare.dtype == mx.bfloat16


def test_unsupported_dtype_is_named():
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save(torch.zeros(2, dtype=torch.float8_e4m3fn), buf)
    with pytest.raises(CheckpointError, match="float8_e4m3fn is not supported by MLX"):
        load_torch(buf.getvalue())


def test_import_does_not_load_torch():
    code = "import sys, mlx_speech.models.torchfile; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, check=True)
    assert r.stdout.strip() == "False"


def test_loader_reads_either_tensor_file_and_names_a_bad_one(tmp_path):
    """`loading.read_tensors`: the one reader of a voice or weights file, either format."""
    from mlx_speech.errors import CheckpointError
    from mlx_speech.models.loading import read_tensors

    (tmp_path / "v.pt").write_bytes(_hand_made())
    pt = read_tensors(tmp_path / "v.pt", "voice")
    mx.save_safetensors(str(tmp_path / "v.safetensors"), {"t": pt["t"], "tail": pt["tail"]})
    st = read_tensors(tmp_path / "v.safetensors", "voice")
    assert set(st) == {"t", "tail"}
    np.testing.assert_array_equal(np.array(st["t"]), np.array(pt["t"]))
    for name in ("bad.pt", "bad.safetensors"):
        (tmp_path / name).write_bytes(b"not a tensor file")
        with pytest.raises(CheckpointError, match=name):  # one line naming the file
            read_tensors(tmp_path / name, "voice")
