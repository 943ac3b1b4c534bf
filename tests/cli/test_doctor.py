"""`mlx_speech doctor`: one screen about this machine, offline, quickly, saying what it could
not check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import make_voxtral_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def doctor(*args, env=None):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "mlx_speech", "doctor", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return r, time.monotonic() - t0


def _cache(tmp_path: Path) -> dict:
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny-voxtral" / "snapshots" / ("a" * 40)
    make_voxtral_checkpoint(snap, "hf")
    (cache / "models--acme--tiny-voxtral" / "refs").mkdir()
    (cache / "models--acme--tiny-voxtral" / "refs" / "main").write_text("a" * 40)
    return {"HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path)}


def test_offline_screen(tmp_path):
    r, seconds = doctor("--offline", env=_cache(tmp_path))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    for name in ("mlx_speech", "mlx", "cpu", "model", "acme/tiny-voxtral", "free", "hub", "vad",
                 "extras"):
        assert name in rows, r.stdout
    assert "Python " in rows["mlx_speech"]
    assert any(b in rows["mlx"] for b in ("Metal", "CUDA", "CPU"))
    assert "voxtral_realtime, asr" in rows["acme/tiny-voxtral"]
    assert "not checked (--offline)" in rows["hub"]
    assert "not checked: hub" in r.stdout  # what it could not check, at the end
    assert "microphone" in rows or "audio" in rows
    assert seconds < 10  # the budget is 3 s; a busy CI machine gets slack


def test_json_and_hf_hub_offline(tmp_path):
    r, _ = doctor("--json", env={**_cache(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    rows = {row["name"]: row for row in d["rows"]}
    assert rows["hub"]["status"] == "n/a" and "HF_HUB_OFFLINE" in rows["hub"]["detail"]
    assert "hub" in d["not_checked"]
    assert [m["repo"] for m in d["models"]] == ["acme/tiny-voxtral"]
    assert d["models"][0]["bytes"] > 0


def test_audio_without_sounddevice_says_so(monkeypatch):
    from mlx_speech import doctor as doc

    monkeypatch.setitem(sys.modules, "sounddevice", None)
    (row,) = doc.audio_rows()
    assert row[:2] == ("audio", "n/a") and "mlx-realtime-speech[live]" in row[2]


def test_another_mlx_speech_distribution_is_named_in_one_line(tmp_path):
    """The package index's `mlx-speech` (another project, the same import name) installed
    beside this one: doctor says so, with what to do."""
    dist = tmp_path / "site" / "mlx_speech-0.5.4.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlx-speech\nVersion: 0.5.4\n")
    (dist / "top_level.txt").write_text("mlx_speech\n")
    r, _ = doctor("--offline", env={"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path / 'site'}"})
    rows = [line for line in r.stdout.splitlines() if line.startswith("conflict ")]
    assert r.returncode == 0 and len(rows) == 1, r.stdout
    assert ("mlx-speech 0.5.4 is installed here too and also provides the mlx_speech package "
            "(another project with the same import name): pip uninstall mlx-speech, then "
            "reinstall this one (mlx-realtime-speech)") in rows[0]


def test_no_conflict_row_without_another_distribution():
    from importlib import metadata

    from mlx_speech import doctor as doc

    ours = [d for d in metadata.distributions() if d.metadata["Name"] == "pytest"]
    assert doc.conflict_rows(ours) == []


def test_a_nemo_release_in_the_cache_is_read_as_load_reads_it(tmp_path):
    """Old: NVIDIA's diarizer repo (one .nemo) was 'not a model mlx_speech loads', yet
    --diarizer loads it."""
    import shutil

    cache = tmp_path / "hub"
    repo = cache / "models--nvidia--diar_streaming_sortformer_4spk-v2.1"
    snap = repo / "snapshots" / ("b" * 40)
    snap.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "golden" / "sortformer" / "tiny.nemo",
                snap / "diar_streaming_sortformer_4spk-v2.1.nemo")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40)
    r, _ = doctor("--offline", env={"HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path)})
    row = next(line for line in r.stdout.splitlines() if "diar_streaming" in line)
    assert "(sortformer, diarizer)" in row, r.stdout


def test_cpu_blas_row_names_a_reference_blas_and_the_fix():
    from mlx_speech import doctor as d

    slow = d.blas_row(gflops=2.8, libs=["libblas-bd8a282c.so.3.10.0"], system="Linux",
                      found="/usr/lib/x86_64-linux-gnu/libopenblas.so.0")
    assert slow[:2] == ("cpu blas", d.WARN)
    assert "2.8 GFLOP/s" in slow[2] and "libblas-bd8a282c" in slow[2]
    assert "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0" in slow[2]
    missing = d.blas_row(gflops=2.8, libs=[], system="Linux", found="")
    assert "apt install libopenblas0-pthread" in missing[2]
    assert d.blas_row(gflops=90.0, libs=["libopenblas.so.0"], system="Linux")[1] == d.OK
    assert d.blas_row(gflops=2.8, libs=[], system="Darwin")[1] == d.OK  # Accelerate's own


def test_cpu_matmul_speed_is_measured_and_blas_libraries_read_from_the_maps():
    from mlx_speech import doctor as d

    assert d.cpu_matmul_gflops(n=64, rounds=1) > 0
    maps = ("7f00-7f01 r-xp 00000000 08:01 12 /x/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0\n"
            "7f02-7f03 r-xp 00000000 08:01 13 /usr/lib/libopenblasp-r0.3.21.so\n"
            "7f04-7f05 rw-p 00000000 00:00 0\n"
            "7f06-7f07 r-xp 00000000 08:01 14 /usr/lib/libc.so.6\n")
    assert d.loaded_blas(maps) == ["libblas-bd8a282c.so.3.10.0", "libopenblasp-r0.3.21.so"]
