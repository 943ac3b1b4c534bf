"""Write the real-speech VAD test clips: espeak-ng utterances, pauses, background noise.

    python tests/data/make_vad_speech.py        # needs espeak-ng (apt-get install espeak-ng)

Each clip is 16 kHz mono FLAC (16-bit) in tests/data/vad_speech/, and vad_speech.json records
what a test needs to know about it: every utterance's text and its true onset / offset in
seconds (where the clean synthesized speech first / last exceeds 1e-3, before the noise is
added), the noise level and the seed. Noise runs under the whole clip, pauses included, so a
detector must tell speech from noise rather than from digital silence. The outputs are committed;
CI never runs this script (the clips depend on the espeak-ng version, recorded in the json).
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf

from mlx_speech.audio.resample import resample

SAMPLE_RATE = 16_000
HERE = Path(__file__).parent
OUT = HERE / "vad_speech"

# (name, voice, words per minute, noise kind, noise dBFS, seed, [(pause before s, text)...], tail s)
CLIPS = [
    ("two_utterances", "en-us", 165, "pink", -42.0, 1, [
        (0.6, "Hello there, this is the first sentence."),
        (1.2, "After a short pause, here is the second."),
    ], 0.7),
    ("three_short_noisy", "en-gb+f3", 175, "fan", -33.0, 2, [
        (0.5, "Turn on the lights, please."),
        (0.9, "What time is it?"),
        (0.8, "Thank you very much."),
    ], 0.6),
]


def espeak(text: str, voice: str, wpm: int) -> tuple[np.ndarray, str]:
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "--stdout", text],
                         check=True, capture_output=True).stdout
    x, sr = sf.read(io.BytesIO(wav), dtype="float32")
    version = subprocess.run(["espeak-ng", "--version"], check=True, capture_output=True,
                             text=True).stdout.strip()
    return resample(x, sr, SAMPLE_RATE), version


def trim(x: np.ndarray, level: float = 1e-3) -> np.ndarray:
    loud = np.flatnonzero(np.abs(x) > level)
    return x[loud[0]: loud[-1] + 1]


def noise(kind: str, n: int, dbfs: float, rng: np.random.Generator) -> np.ndarray:
    white = rng.standard_normal(n)
    if kind == "pink":  # 1/f-ish: sum of one-pole lowpasses at octave-spaced corners
        out = np.zeros(n)
        for fc in (40, 160, 640, 2560):
            a = np.exp(-2 * np.pi * fc / SAMPLE_RATE)
            y, acc = np.empty(n), 0.0
            for i, w in enumerate(white):
                acc = a * acc + (1 - a) * w
                y[i] = acc
            out += y / np.sqrt((1 - a) / (1 + a))  # equal power per band
    elif kind == "fan":  # broadband hiss plus a 120 Hz hum and its harmonics
        t = np.arange(n) / SAMPLE_RATE
        out = white + sum(0.8 / k * np.sin(2 * np.pi * 120 * k * t + k) for k in (1, 2, 3))
    else:
        raise ValueError(kind)
    out *= 10 ** (dbfs / 20) / np.sqrt(np.mean(out**2))
    return out


def make(name, voice, wpm, kind, dbfs, seed, parts, tail) -> dict:
    rng = np.random.default_rng(seed)
    pieces, utterances, pos = [], [], 0
    version = ""
    for pause, text in parts:
        speech, version = espeak(text, voice, wpm)
        speech = trim(speech)
        gap = int(pause * SAMPLE_RATE)
        pieces += [np.zeros(gap, np.float32), speech]
        start = pos + gap
        utterances.append({"text": text, "start_s": round(start / SAMPLE_RATE, 4),
                           "end_s": round((start + len(speech)) / SAMPLE_RATE, 4)})
        pos = start + len(speech)
    pieces.append(np.zeros(int(tail * SAMPLE_RATE), np.float32))
    clean = np.concatenate(pieces)
    x = 0.7 * clean / np.abs(clean).max() + noise(kind, len(clean), dbfs, rng)
    x = np.clip(x, -1, 1).astype(np.float32)
    OUT.mkdir(exist_ok=True)
    sf.write(OUT / f"{name}.flac", x, SAMPLE_RATE, subtype="PCM_16")
    return {"file": f"vad_speech/{name}.flac", "sample_rate": SAMPLE_RATE,
            "seconds": round(len(x) / SAMPLE_RATE, 4), "voice": voice, "wpm": wpm,
            "noise": kind, "noise_dbfs": dbfs, "seed": seed, "espeak": version,
            "utterances": utterances}


def main() -> None:
    meta = {c[0]: make(*c) for c in CLIPS}
    (HERE / "vad_speech.json").write_text(json.dumps(meta, indent=2) + "\n")
    for name, m in meta.items():
        size = (HERE / m["file"]).stat().st_size
        print(f"{name}: {m['seconds']} s, {size / 1024:.0f} KiB, "
              f"utterances {[(u['start_s'], u['end_s']) for u in m['utterances']]}")


if __name__ == "__main__":
    main()
