"""The PulseAudio fixture itself: what a PortAudio program in a subprocess records from the
virtual microphone is what the test fed, and what it plays reaches the speaker's monitor."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from tests.support.pulse import align, favoured, without_gaps

RECORD = """
import sys, numpy as np, sounddevice as sd
y = sd.rec(int(sys.argv[2]), samplerate=16000, channels=1, dtype='float32', blocking=True)
np.save(sys.argv[1], y[:, 0])
"""

# blocking writes into a one-second buffer: a player starved of CPU for a moment on a busy
# machine still has audio queued (an ALSA xrun would drop samples; this checks the monitor,
# not the player's scheduling); stop() plays out what is queued
PLAY = """
import sys, numpy as np, sounddevice as sd
x = np.load(sys.argv[1])
with sd.OutputStream(samplerate=24000, channels=1, dtype="float32", latency=1.0) as s:
    s.write(x)
"""


def tone(n: int, rate: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    return (0.4 * np.sin(2 * np.pi * 330 * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)


def test_microphone_delivers_the_fed_samples(pulse, tmp_path):
    x = tone(16000, 16000)
    out = tmp_path / "rec.npy"
    proc = subprocess.Popen([sys.executable, "-c", RECORD, str(out), "24000"],
                            env=dict(os.environ, **pulse.env), preexec_fn=favoured)
    pulse.wait_client("source-outputs")  # fed before, the samples would go nowhere
    feed = pulse.feed_mic(np.concatenate([np.zeros(4000, np.float32), x,
                                          np.zeros(16000, np.float32)]))
    assert proc.wait(timeout=60) == 0
    assert feed.wait(5)
    feed.close()
    y = np.load(out)
    start = align(y, x)
    # s16 in the FIFO, PortAudio's float32 out of it (it divides by 32768): bit exact
    np.testing.assert_array_equal(y[start:start + len(x)] * 32768, np.round(x * 32767))


def test_speaker_monitor_records_what_was_played(pulse, tmp_path):
    x = tone(12000, 24000, seed=1)
    # PortAudio's first moments on the pulse plugin may be lost, and what the server still
    # buffers when the player exits (a few ms idle, a few hundred on a busy machine): a second
    # of silence before, two after
    padded = np.concatenate([np.zeros(24000, np.float32), x, np.zeros(48000, np.float32)])
    np.save(tmp_path / "x.npy", padded)
    with pulse.record_speaker() as rec:
        subprocess.run([sys.executable, "-c", PLAY, str(tmp_path / "x.npy")],
                       env=dict(os.environ, **pulse.env), check=True, timeout=60,
                       preexec_fn=favoured)
    # PulseAudio plays silence where a player runs late: every sample played still arrives,
    # in order (the tone's noise never holds 16 zeros)
    y = without_gaps(rec.samples)
    start = align(y, x)
    # PulseAudio converts float32 to s16 itself: equal to 16-bit precision (one step)
    np.testing.assert_allclose(y[start:start + len(x)], x, atol=1.5 / 32767)
