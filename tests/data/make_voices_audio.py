"""Makes tests/data/voices_3spk.wav and voices_3spk.json: three espeak-ng voices in turns.

    python tests/data/make_voices_audio.py   # needs espeak-ng (apt-get install espeak-ng)

A male, a female and a second male voice (different espeak-ng voices and pitches) speak in
turns, with silences between some turns and one overlap (voice 3 starts before voice 2 has
finished). The JSON lists each utterance's speaker, start and end in seconds, so the
diarization tests can check the plumbing against where the voices really are. Re-running with
another espeak-ng version may change the samples slightly; tests read positions from the JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mlx_speech.audio.resample import resample  # noqa: E402

HERE = Path(__file__).parent
SR = 16000
VOICES = {1: ("en-us+m3", "40"), 2: ("en-gb+f4", "70"), 3: ("en-us+m7", "20")}
# (speaker, text, gap before it in seconds; negative: overlap with the previous utterance)
TURNS = [
    (1, "Good morning, shall we start the meeting?", 0.3),
    (2, "Yes, the numbers look good this week.", 0.6),
    (3, "I have a question about the budget.", -0.5),
    (1, "Go ahead.", 0.8),
    (2, "We can talk about it later.", 0.4),
]


def speak(voice: str, pitch: str, text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "raw.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-p", pitch, "-s", "170", "-w", str(raw), text],
                       check=True)
        x, sr = sf.read(raw, dtype="float32")
    x = resample(x, sr, SR)
    nz = np.flatnonzero(np.abs(x) > 1e-3)  # trim espeak's own leading/trailing silence
    return x[nz[0]: nz[-1] + 1]


def main() -> None:
    parts, meta, end = [], [], 0
    for spk, text, gap in TURNS:
        x = speak(*VOICES[spk], text)
        start = max(0, end + int(gap * SR))
        parts.append((start, x))
        meta.append({"speaker": spk, "text": text, "start": start / SR,
                     "end": (start + len(x)) / SR})
        end = start + len(x)
    total = end + int(0.4 * SR)
    out = np.zeros(total, np.float32)
    for start, x in parts:
        out[start: start + len(x)] += 0.5 * x
    sf.write(HERE / "voices_3spk.wav", out, SR, subtype="PCM_16")
    (HERE / "voices_3spk.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote voices_3spk.wav ({total / SR:.2f} s) and voices_3spk.json")


if __name__ == "__main__":
    main()
