"""What freeing an idle model gives back: MLX memory before the load, loaded, and after the
server unloaded it (`mlx_speech.server --unload-after-s`), then the reload.

    python benchmarks/idle_unload.py [--config tiny|full-narrow|full] [--dtype bfloat16]
        [--unload-after-s 2]

Writes the random Voxtral Realtime checkpoint of benchmarks/voxtral_realtime.py (default
full-narrow: the real widths, 2 layers each, ~1.3 GB in bf16), serves it from a model store
that loads it when first named (server/models.py) on a loopback port, and:
1. measures MLX active / peak / cache memory with no model loaded (the baseline);
2. transcribes a 2 s clip over REST (the model loads), and measures again;
3. waits until the engine unloads it after --unload-after-s idle, and reads the store's
   measurement after the unload (gc, mx.clear_cache());
4. transcribes again (a reload): same text, and the load time.
Prints MB; numbers only, no assertions (the test is tests/server/test_server_lazy.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import voxtral_realtime as vb  # noqa: E402

MB = 1 << 20


def mb(n: int) -> str:
    return f"{n / MB:.1f} MB"


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # float32 compared: no TF32
    import httpx

    from mlx_speech.server.models import Models, measure_free
    from tests.conftest import speechlike
    from tests.support.server import ServerThread, wav_bytes

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=vb.CONFIGS, default="full-narrow")
    p.add_argument("--dtype", choices=vb.DTYPES, default="bfloat16")
    p.add_argument("--unload-after-s", type=float, default=2.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "vr"
        folder.mkdir()
        t0 = time.perf_counter()
        cfg = vb.CONFIGS[args.config]
        vb.write_checkpoint(folder, cfg["enc"], cfg["dec"], vb.DTYPES[args.dtype], 0)
        size = (folder / "consolidated.safetensors").stat().st_size
        print(f"checkpoint {args.config} {args.dtype}: {mb(size)} written in "
              f"{time.perf_counter() - t0:.1f} s")
        base = measure_free()
        print(f"no model loaded: MLX active {mb(base['active'])}, cache {mb(base['cache'])}")
        store = Models.locate([str(folder)], unload_after_s=args.unload_after_s,
                              log_line=lambda line: print("  server:", line))
        e = store.entries[str(folder)]
        x = speechlike(2.0, seed=1)
        with ServerThread(store) as srv:
            def ask() -> tuple[str, float]:
                t = time.perf_counter()
                r = httpx.post(srv.base + "/v1/audio/transcriptions", timeout=600,
                               data={"model": str(folder)},
                               files={"file": ("a.wav", wav_bytes(x))})
                r.raise_for_status()
                return r.json()["text"], time.perf_counter() - t

            text, s1 = ask()
            load = e.memory["load"]
            print(f"first request {s1:.2f} s (load {e.load_s:.2f} s): MLX active "
                  f"{mb(load['before']['active'])} -> {mb(load['after']['active'])}, peak "
                  f"{mb(load['after']['peak'])}; weights {mb(e.budget[0])}")
            t = time.perf_counter()
            while e.unloads < 1:
                time.sleep(0.05)
            freed = e.memory["unload"]
            print(f"unloaded {time.perf_counter() - t:.2f} s after the answer: MLX active "
                  f"{mb(freed['before']['active'])} -> {mb(freed['after']['active'])}, cache "
                  f"{mb(freed['before']['cache'])} -> {mb(freed['after']['cache'])}; "
                  f"{mb(freed['after']['active'] - base['active'])} above the no-model baseline")
            text2, s2 = ask()
            print(f"next request {s2:.2f} s (reload {e.load_s:.2f} s), same text: "
                  f"{text2 == text}")
    print(f"mlx {mx.__version__}, {mx.default_device()}")


if __name__ == "__main__":
    main()
