"""A tiny streaming Sortformer, ours against NeMo's own torch streaming loop, on one CPU thread.

    python benchmarks/sortformer_nemo.py [--nemo-python /work/nemo-venv/bin/python]
        [--rounds 5] [--seconds 10]

Both sides load the same `.nemo` archive (tests/golden/sortformer/tiny.nemo: NeMo 3.0's
`SortformerEncLabelModel` with the released model's structure at tiny widths and a scaled-down
streaming setup) and diarize the same clip (tests/data/voices_3spk.wav, repeated to
`--seconds`) as a stream: NeMo with `streaming_mode=True` (`forward_streaming`: mel, then one
`forward_streaming_step` per chunk), ours with one session fed the whole clip, then finished.
Each round times one clip on each side (a NeMo process and this one, taking turns; ours plain
and with its compiled step, `MLX_SPEECH_COMPILE`), torch with one thread and MLX on its CPU
stream. Prints the median ms per streaming step (the clip's steps are the same on both sides)
and the ratios ours / NeMo. Numbers only; no assertions. Needs NeMo
(`pip install torch==2.13.0 "nemo-toolkit[asr]==3.0.0"`) in the interpreter given.

On the CPU both sides are bound by their matrix products: the header's `CPU BLAS` line is MLX's
(`mlx_speech doctor`); torch brings its own. Linux wheels of mlx[cpu] bundle the reference BLAS;
`LD_PRELOAD` of OpenBLAS (docs/doctor.md) replaces it (torch keeps its own, built in).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine import cpu_blas  # noqa: E402

NEMO = ROOT / "tests" / "golden" / "sortformer" / "tiny.nemo"
CLIP = ROOT / "tests" / "data" / "voices_3spk.wav"

NEMO_SIDE = """
import json, logging, sys, time
import numpy as np, soundfile as sf, torch
torch.set_num_threads(1)
logging.getLogger("nemo_logger").setLevel(logging.ERROR)
from nemo.collections.asr.models import SortformerEncLabelModel
model = SortformerEncLabelModel.restore_from(sys.argv[1], map_location="cpu").eval()
model.streaming_mode = True
wav = np.load(sys.argv[2])
x = torch.from_numpy(wav)[None]
n = torch.tensor([x.shape[1]])
steps = [0]
inner = model.forward_streaming_step
def counted(*a, **k):
    steps[0] += 1
    return inner(*a, **k)
model.forward_streaming_step = counted
for line in sys.stdin:  # one clip per line read
    steps[0] = 0
    t = time.perf_counter()
    with torch.no_grad():
        p = model.forward(audio_signal=x, audio_signal_length=n)
    ms = 1e3 * (time.perf_counter() - t)
    got = {"ms": ms, "steps": steps[0], "frames": int(p.shape[1])}
    print("RESULT", json.dumps(got), flush=True)
"""


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nemo-python", default="/work/nemo-venv/bin/python")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()

    import mlx.core as mx

    import mlx_speech

    wav, sr = sf.read(CLIP, dtype="float32")
    reps = int(np.ceil(args.seconds * sr / len(wav)))
    wav = np.tile(wav, reps)[: int(args.seconds * sr)]
    tmp = Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
    np.save(tmp / "clip.npy", wav)
    peer = subprocess.Popen([args.nemo_python, "-c", NEMO_SIDE, str(NEMO), str(tmp / "clip.npy")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    model = mlx_speech.load(str(NEMO))

    def ours(compiled: bool) -> tuple[float, int]:
        os.environ["MLX_SPEECH_COMPILE"] = "1" if compiled else "0"
        t = time.perf_counter()
        s = model.session()
        got = model.feed_many([(s, wav)])[0]
        rest = model.finish_many([s])[0]
        mx.eval()
        return 1e3 * (time.perf_counter() - t), len(got) + len(rest)

    def theirs() -> dict:
        peer.stdin.write("go\n")
        peer.stdin.flush()
        while not (line := peer.stdout.readline()).startswith("RESULT "):
            if not line:
                raise SystemExit("the NeMo process ended; run it alone to see why")
        return json.loads(line.split(" ", 1)[1])

    ours(False), ours(True), ours(True), theirs()  # warm all (compiled: traced at its shapes)
    mine, fast, nemo = [], [], []
    for _ in range(args.rounds):
        mine.append(ours(False))
        fast.append(ours(True))
        nemo.append(theirs())
    os.environ.pop("MLX_SPEECH_COMPILE", None)
    peer.stdin.close()
    peer.wait()
    steps = nemo[0]["steps"]
    ours_ms = statistics.median(m for m, _ in mine) / steps
    fast_ms = statistics.median(m for m, _ in fast) / steps
    nemo_ms = statistics.median(r["ms"] for r in nemo) / steps
    print(f"sortformer_nemo: {args.seconds:g} s clip, {steps} streaming steps; frames "
          f"ours {mine[0][1]}, NeMo {nemo[0]['frames']}; mlx {mx.__version__} "
          f"{mx.default_device()}, torch 1 thread; medians of {args.rounds} rounds")
    print(f"CPU BLAS: {cpu_blas()}")
    print(f"ms per streaming step: ours {ours_ms:.2f} (compiled {fast_ms:.2f}), NeMo "
          f"{nemo_ms:.2f}; ratio ours/NeMo {ours_ms / nemo_ms:.2f} (compiled "
          f"{fast_ms / nemo_ms:.2f})")


if __name__ == "__main__":
    main()
