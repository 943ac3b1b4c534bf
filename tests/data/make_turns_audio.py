"""Makes tests/data/turns_*.wav: espeak-ng speech (real phrases, real intonation) at 16 kHz.

    python tests/data/make_turns_audio.py   # needs espeak-ng (apt-get install espeak-ng)

Used by the turn-detection and realtime-client tests (tests/support/turns_audio.py composes them
with pauses and background noise). Re-running with another espeak-ng version may change
the samples slightly; the tests derive every expected position from the files themselves.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mlx_speech.audio.resample import resample  # noqa: E402

HERE = Path(__file__).parent
PHRASES = {
    "please": "Please call me back tomorrow morning.",
    "meeting": "Is the meeting still on?",
    "go": "I think that we should go.",
    "comma": "I think that we should,",
}


def main() -> None:
    for name, text in PHRASES.items():
        with tempfile.TemporaryDirectory() as d:
            raw = Path(d) / "raw.wav"
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(raw), text],
                           check=True)
            x, sr = sf.read(raw, dtype="float32")
        out = HERE / f"turns_{name}.wav"
        sf.write(out, resample(x, sr, 16000), 16000, subtype="PCM_16")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
