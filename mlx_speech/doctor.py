"""mlx_speech doctor: one screen about this machine, to read first and paste into a bug report.

    mlx_speech doctor            # MLX and its backend, its CPU matmul speed, Python, the
                                 # models in the Hugging Face cache, free disk, the hub, audio
                                 # devices, VAD, extras
    mlx_speech doctor --offline  # no network request (HF_HUB_OFFLINE=1 does the same)
    mlx_speech doctor --json     # the same rows as JSON

Every row is `name  status  detail`; status is ok, warn, FAIL or n/a (could not check, and why).
It loads no model and makes at most one network request (the hub, with a short timeout).
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
from importlib import metadata
from pathlib import Path

from .cliutil import ArgumentParser

OK, WARN, FAIL, NA = "ok", "warn", "FAIL", "n/a"
HUB_TIMEOUT_S = 2.0

Row = tuple[str, str, str]


def render(rows: list[Row]) -> str:
    w = max(len(name) for name, _, _ in rows)
    return "\n".join(f"{name:<{w}}  {status:<4}  {detail}" for name, status, detail in rows)


def human_size(n: float) -> str:
    from .hub import human_size as h

    return h(n)


def python_row() -> Row:
    from . import DISTRIBUTION, __version__

    mac = platform.mac_ver()[0]
    osname = (f"macOS {mac}" if mac else f"{platform.system()} {platform.release()}")
    return ("mlx_speech", OK, f"{__version__} ({DISTRIBUTION}), Python "
            f"{platform.python_version()} ({sys.executable}), {osname} {platform.machine()}")


OTHER_PROJECT = "mlx-speech"  # on the package index: another project, the same import name


def _norm(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def conflict_rows(dists=None) -> list[Row]:
    """One line when another distribution also installs the `mlx_speech` package here (the
    package index's `mlx-speech` is a different project): both write the same files, so which
    one `import mlx_speech` gets depends on the install order."""
    from . import DISTRIBUTION

    ours = _norm(DISTRIBUTION)
    rows, seen = [], set()
    for d in metadata.distributions() if dists is None else dists:
        name = d.metadata["Name"] or ""
        if _norm(name) in (ours, *seen):
            continue
        top = (d.read_text("top_level.txt") or "").split()
        if _norm(name) == OTHER_PROJECT or "mlx_speech" in top:
            seen.add(_norm(name))
            rows.append(("conflict", WARN, f"{name} {d.version} is installed here too and "
                         "also provides the mlx_speech package (another project with the same "
                         f"import name): pip uninstall {name}, then reinstall this one "
                         f"({DISTRIBUTION})"))
    return rows


def mlx_row() -> Row:
    """MLX's version and the backend it runs on (Metal, CUDA or CPU), with the GPU's name and
    memory when MLX says them."""
    try:
        import mlx.core as mx
    except ImportError as e:
        from .errors import backend_extra

        first = (str(e).splitlines() or [""])[0]
        return ("mlx", FAIL, f"MLX has no backend here ({first}): {backend_extra()}")
    version = getattr(mx, "__version__", "?")
    backend = "CPU"
    try:
        if mx.metal.is_available():
            backend = "Metal"
        elif hasattr(mx, "cuda") and mx.cuda.is_available():
            backend = "CUDA"
    except Exception:  # an old MLX without the query
        pass
    info = {}
    try:
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
    except Exception:
        pass
    name = info.get("device_name") or info.get("name") or ""
    mem = info.get("memory_size") or info.get("total_memory") or 0
    detail = f"{version}, {backend}" + (f": {name}" if name else "")
    if mem and backend != "CPU":
        detail += f", {human_size(mem)} memory"
    if backend == "CPU":
        detail += " (no GPU backend: models run slowly)"
    return ("mlx", OK if backend != "CPU" else WARN, detail)


BLAS_OK_GFLOPS = 20.0  # below this, MLX's CPU matmuls run on a reference BLAS
OPENBLAS_PATHS = ("/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
                  "/usr/lib/aarch64-linux-gnu/libopenblas.so.0", "/usr/lib64/libopenblas.so.0",
                  "/usr/lib/libopenblas.so.0")


def cpu_matmul_gflops(n: int = 256, rounds: int = 3) -> float:
    """The best of `rounds` float32 (n x n) @ (n x n) products on MLX's CPU stream, in GFLOP/s
    (about 10 ms at the reference BLAS's speed)."""
    import time

    import mlx.core as mx

    with mx.stream(mx.cpu):
        a = mx.random.normal((n, n), key=mx.random.key(0))
        b = mx.random.normal((n, n), key=mx.random.key(1))
        mx.eval(a, b, a @ b)
        best = float("inf")
        for _ in range(rounds):
            t = time.perf_counter()
            mx.eval(a @ b)
            best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def loaded_blas(maps: str | None = None) -> list[str]:
    """The BLAS libraries this process has mapped (Linux: /proc/self/maps), by file name."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    paths = [fields[5] for fields in map(str.split, maps.splitlines()) if len(fields) >= 6]
    return sorted({Path(p).name for p in paths if "blas" in Path(p).name.lower()})


def blas_row(gflops: float | None = None, libs: list[str] | None = None,
             system: str | None = None, found: str | None = None) -> Row:
    """How fast MLX multiplies matrices on the CPU. Linux wheels of mlx[cpu] bundle the
    reference BLAS (a few GFLOP/s: tens of times below an optimized one), which bounds every
    model run on the CPU, batched or not; preloading OpenBLAS replaces it for the whole
    process (MLX calls the standard BLAS symbols)."""
    system = system or platform.system()
    try:
        gflops = cpu_matmul_gflops() if gflops is None else gflops
    except Exception as e:  # no backend at all: the mlx row says why
        return ("cpu blas", NA, f"could not multiply on the CPU ({type(e).__name__})")
    libs = loaded_blas() if libs is None else libs
    detail = (f"float32 matmul {gflops:.1f} GFLOP/s on MLX's CPU stream"
              + (f" ({', '.join(libs)})" if libs else ""))
    if gflops >= BLAS_OK_GFLOPS or system != "Linux":
        return ("cpu blas", OK, detail)
    if found is None:
        found = next((p for p in OPENBLAS_PATHS if Path(p).exists()), "")
    fix = (f"run with LD_PRELOAD={found}" if found else
           "install OpenBLAS (Debian/Ubuntu: apt install libopenblas0-pthread) and run with "
           "LD_PRELOAD=<its libopenblas.so.0>")
    return ("cpu blas", WARN, f"{detail}: a reference BLAS, so CPU runs are slow; {fix} "
            "(MLX then multiplies with OpenBLAS, tens of times faster; OPENBLAS_NUM_THREADS "
            "sets its threads)")


def _cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _model_type(snapshot: Path) -> str:
    """What `load` makes of a cached snapshot: its config files, or (a NeMo release) the one
    `.nemo` archive it holds."""
    from .hub import CONFIG_FILES, detect_model_type
    from .registry import ARCHIVES, MODELS, archive_type, kind_of

    try:
        archives = [p for p in snapshot.iterdir() if p.suffix in ARCHIVES]
        if len(archives) == 1 and not any((snapshot / f).exists() for f in CONFIG_FILES):
            t = archive_type(archives[0])
        else:
            t = detect_model_type(snapshot)
    except Exception:
        return "not a model mlx_speech loads"
    if t not in MODELS:
        return f"{t}: not supported"
    try:
        return f"{t}, {kind_of(t)}"
    except ImportError:  # the family's code needs MLX, which cannot load (the mlx row says why)
        return t


def cache_rows() -> tuple[list[Row], list[dict]]:
    """The models in the Hugging Face cache with their sizes (and what mlx_speech makes of
    each), then the free disk where the cache lives."""
    try:
        from huggingface_hub import scan_cache_dir
    except ImportError as e:  # pragma: no cover - a core dependency
        return [("model cache", NA, f"huggingface_hub missing ({e})")], []
    cache = _cache_dir()
    rows: list[Row] = []
    models: list[dict] = []
    if not cache.is_dir():
        rows.append(("model cache", OK, f"{cache}: empty (nothing downloaded yet)"))
    else:
        try:
            info = scan_cache_dir(cache)
        except Exception as e:
            rows.append(("model cache", WARN, f"{cache}: cannot scan ({e})"))
        else:
            repos = sorted((r for r in info.repos if r.repo_type == "model"),
                           key=lambda r: r.repo_id.lower())
            rows.append(("model cache", OK, f"{cache}: {len(repos)} models, "
                         f"{human_size(sum(r.size_on_disk for r in repos))}"))
            for r in repos:
                revs = sorted(r.revisions, key=lambda v: v.last_modified, reverse=True)
                kind = _model_type(Path(revs[0].snapshot_path)) if revs else "no snapshot"
                models.append({"repo": r.repo_id, "bytes": r.size_on_disk, "type": kind})
                rows.append(("  " + r.repo_id, OK, f"{human_size(r.size_on_disk)} ({kind})"))
    where = cache
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
        rows.append(("free disk", OK if free > 10e9 else WARN,
                     f"{human_size(free)} at {where}" + ("" if free > 10e9 else
                                                         " (the 4B models need ~9 GB each)")))
    except OSError as e:
        rows.append(("free disk", NA, f"cannot check {where}: {e.strerror or e}"))
    return rows, models


def hub_row(offline: bool, timeout: float = HUB_TIMEOUT_S) -> Row:
    from .hub import offline as hub_offline

    if offline or hub_offline():
        why = "--offline" if offline else "HF_HUB_OFFLINE is set"
        return ("hub", NA, f"not checked ({why})")
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    url = constants.ENDPOINT.rstrip("/") + "/api/models?limit=1"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                                    timeout=timeout) as r:
            return ("hub", OK, f"{constants.ENDPOINT} answers (HTTP {r.status})")
    except urllib.error.HTTPError as e:
        return ("hub", WARN, f"{constants.ENDPOINT} answers HTTP {e.code}")
    except Exception as e:
        why = getattr(e, "reason", None) or e
        return ("hub", WARN, f"{constants.ENDPOINT} unreachable in {timeout:.0f} s ({why}): "
                "downloads will fail; models already in the cache load with HF_HUB_OFFLINE=1")


def audio_rows() -> list[Row]:
    from .audio.devices import sounddevice_module
    from .errors import DeviceError

    try:
        sd = sounddevice_module()
    except DeviceError as e:
        return [("audio", NA, f"not checked: {e} (audio files still work)")]
    rows = []
    for kind, label in (("input", "microphone"), ("output", "speaker")):
        try:
            d = sd.query_devices(kind=kind)
            n = sum(1 for x in sd.query_devices() if x[f"max_{kind}_channels"] > 0)
            rows.append((label, OK, f"{d['name']} (default; {n} {kind} devices)"))
        except Exception:
            rows.append((label, WARN, f"no audio {kind} device"))
    return rows


def vad_row() -> Row:
    try:
        from .models.silero_vad import packaged_weights

        p = packaged_weights()
    except ImportError as e:
        from .errors import is_mlx_import_error

        if not is_mlx_import_error(e):
            raise
        return ("vad", NA, "not checked: MLX cannot load (see the mlx row)")
    except Exception as e:
        return ("vad", WARN, f"no Silero VAD weights: {str(e).splitlines()[0]}")
    return ("vad", OK, f"Silero VAD weights: {p}")


def extras_row() -> Row:
    """Which of the package's extras have all their packages installed."""
    import re

    from . import DISTRIBUTION

    try:
        reqs = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return ("extras", NA, f"{DISTRIBUTION} is not installed as a package (a source "
                "checkout): cannot tell which extras are there")
    extras: dict[str, list[str]] = {}
    for req in reqs:
        m = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if not m:
            continue
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
        if name == "mlx" and (b := re.match(r"mlx\[(\w+)\]", req)):  # its backend's wheel
            e = b.group(1)
            name = "mlx-cpu" if e == "cpu" else f"mlx-cuda-{e[4:]}" if e[4:] else "mlx-cuda"
        marker = req.split(";", 1)[1] if ";" in req else ""
        if "sys_platform" in marker and f"'{sys.platform}'" not in marker and \
                f'"{sys.platform}"' not in marker:
            continue  # a package this platform does not need
        extras.setdefault(m.group(1), []).append(name)
    have, missing = [], []
    for extra, pkgs in sorted(extras.items()):
        if extra in ("dev", "reference"):
            continue
        absent = [p for p in pkgs if not _installed(p)]
        if absent:
            missing.append(f"{extra} (needs {', '.join(absent)})")
        else:
            have.append(extra)
    detail = f"installed: {', '.join(have) or 'none'}"
    if missing:
        detail += f"; not: {'; '.join(missing)}"
    return ("extras", OK, detail)


def _installed(dist: str) -> bool:
    from . import DISTRIBUTION

    if _norm(dist) == _norm(DISTRIBUTION):
        return True
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


def collect(offline: bool = False) -> tuple[list[Row], dict]:
    rows: list[Row] = [python_row(), *conflict_rows(), mlx_row(), blas_row()]
    cache, models = cache_rows()
    rows += cache
    rows.append(hub_row(offline))
    rows += audio_rows()
    rows.append(vad_row())
    rows.append(extras_row())
    return rows, {"models": models}


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="mlx_speech doctor", description=__doc__)
    p.add_argument("--offline", action="store_true", help="make no network request")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rows, extra = collect(offline=args.offline)
    unchecked = [name.strip() for name, status, _ in rows if status == NA]
    if args.json:
        print(json.dumps({"rows": [{"name": n.strip(), "status": s, "detail": d}
                                   for n, s, d in rows], **extra, "not_checked": unchecked},
                         indent=2))
    else:
        print(render(rows))
        if unchecked:
            print(f"\nnot checked: {', '.join(unchecked)} (see each row for why)")
    return 0


if __name__ == "__main__":
    from mlx_speech.cliutil import exit_with

    exit_with(main())
