"""A private PulseAudio daemon with a virtual microphone and speaker, for device tests.

The session-scoped fixture `pulse` starts `pulseaudio` on its own socket under a
temporary folder (own HOME / runtime / state dirs, no system or user config read,
no autospawn, never exits while idle) and kills it at the end of the session:

- the speaker is a null sink (`speaker`, s16le mono at `pulse.speaker_rate`, 24 kHz);
- the microphone is a pipe source (`mic`, s16le mono at `pulse.mic_rate`, 16 kHz)
  reading a FIFO that tests write into;
- both are the server defaults, so PortAudio / sounddevice opening the ALSA
  `default` device (libasound2-plugins' pulse plugin) in a process started with
  `pulse.env` plays into the sink and records from the FIFO.

It skips, with the reason, when `pulseaudio`/`pactl`/`parec` or PortAudio (the
sounddevice module and libportaudio) or the ALSA pulse plugin is missing, or
the daemon does not come up.

API (all on the object the fixture returns):

    pulse.env                      # {"PULSE_SERVER": ..., ...}: add to a subprocess' env
    pulse.mic_rate, pulse.speaker_rate
    feed = pulse.feed_mic(samples, sample_rate=16000, realtime=True)
        # a thread writes the float samples as s16le into the FIFO, in 20 ms pieces
        # at real-time pace (or as fast as the pipe takes them); then keeps the
        # FIFO open (silence never comes by itself: a pipe source only delivers
        # what is written, so a paused or closed feed is a microphone that went quiet)
    feed.pause() / feed.resume()   # stop / go on writing (the mic goes quiet)
    feed.close()                   # close the FIFO (the writer goes away)
    feed.wait(timeout=None)        # until every sample has been written; True if so
    feed.sent                      # samples written so far
    with pulse.record_speaker() as rec:   # `parec` on the sink's monitor
        ...                               # play something
    rec.samples                    # float32 mono at speaker_rate, once the block ends
    with pulse.unplugged("mic" | "speaker"):
        ...                        # the device is unloaded (gone), then loaded back
    with pulse.stalled_speaker():  # the sink is suspended: it takes no audio
        ...
    pulse.pactl(*args)             # run pactl against this daemon, return stdout
    pulse.wait_client("source-outputs" | "sink-inputs")  # until a PortAudio client is on
    align(recorded, reference)     # module function: offset of reference inside recorded

Only one feed at a time makes sense (there is one FIFO); feed_mic closes the
previous one. Run the program under test in a subprocess with `env=pulse.env`
added: PortAudio reads the ALSA configuration once per process, and the pulse
plugin is the ALSA default only where PULSE_SERVER points at a running server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

MIC_RATE = 16000
SPEAKER_RATE = 24000
_PIECE_S = 0.02  # real-time writes in 20 ms pieces


def align(recorded, reference) -> int:
    """Where `reference` starts inside `recorded` (the lag of the best cross-correlation)."""
    y = np.asarray(recorded, np.float64)
    x = np.asarray(reference, np.float64)
    if len(y) < len(x) or not len(x):
        raise ValueError(f"recording too short: {len(y)} samples for {len(x)}")
    n = 1 << int(np.ceil(np.log2(len(y) + len(x))))
    c = np.fft.irfft(np.fft.rfft(y, n) * np.conj(np.fft.rfft(x, n)), n)[: len(y) - len(x) + 1]
    return int(np.argmax(c))


def favoured() -> None:
    """A subprocess `preexec_fn`: run the audio program ahead of ordinary work (nice -10), as
    audio programs ask for a real-time priority, so a busy machine does not starve its audio
    callbacks into underruns that drop samples (an ALSA xrun). Where raising the priority is
    not permitted, it runs as it is."""
    try:
        os.nice(-10)
    except OSError:
        pass


def without_gaps(samples, min_run: int = 16) -> np.ndarray:
    """`samples` less every run of `min_run` or more exact zeros: the silence PulseAudio plays
    when a player underruns (on a busy machine), wherever it falls."""
    x = np.asarray(samples, np.float32)
    zero = np.concatenate([[False], x == 0, [False]])
    edges = np.flatnonzero(zero[1:] != zero[:-1])  # run starts and ends, alternating
    keep = np.ones(len(x), bool)
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        if b - a >= min_run:
            keep[a:b] = False
    return x[keep]


def _end(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to a process we started; kill it if it is still there after 5 s."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _to_s16(samples) -> bytes:
    x = np.clip(np.asarray(samples, np.float32).reshape(-1), -1.0, 1.0)
    return np.round(x * 32767.0).astype("<i2").tobytes()


class MicFeed:
    """A thread writing s16le samples into the microphone FIFO."""

    def __init__(self, fifo: Path, data: bytes, rate: int, realtime: bool):
        self._fifo, self._data, self._rate, self._realtime = fifo, data, rate, realtime
        self._go = threading.Event()
        self._go.set()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._fd: int | None = None
        self.sent = 0  # samples written
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="mic-feed")
        self._thread.start()

    def _run(self) -> None:
        try:
            # O_RDWR never blocks waiting for a reader (the pipe source holds one open)
            self._fd = os.open(self._fifo, os.O_RDWR)
            piece = max(1, int(self._rate * _PIECE_S)) * 2
            t0, written = time.monotonic(), 0
            for i in range(0, len(self._data), piece):
                if not self._go.is_set():
                    paused_at = time.monotonic()
                    while not self._go.wait(0.05):
                        if self._stop.is_set():
                            return
                    t0 += time.monotonic() - paused_at
                if self._stop.is_set():
                    return
                chunk = self._data[i:i + piece]
                if self._realtime:
                    ahead = t0 + written / self._rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                os.write(self._fd, chunk)
                written += len(chunk) // 2
                self.sent = written
            self._done.set()
        except BaseException as e:  # reported by wait()
            self.error = e
            self._done.set()

    def pause(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every sample was written (True), or `timeout` passed (False)."""
        done = self._done.wait(timeout)
        if self.error is not None:
            raise self.error
        return done

    def close(self) -> None:
        """Stop writing and close the FIFO: the microphone's writer goes away."""
        self._stop.set()
        self._go.set()
        self._thread.join(timeout=5)
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class Recording:
    samples: np.ndarray = np.zeros(0, np.float32)
    raw: Path | None = None  # the file parec writes while recording
    rate: int = 0

    def settle(self, seconds: float, timeout: float = 60.0) -> None:
        """Until parec has recorded `seconds` more of the monitor (so whatever the device
        still held has come through): an audio-clock wait, not a wall-clock one, which a busy
        machine would stretch. Fails after `timeout` (nothing recorded at all)."""
        start = self.raw.stat().st_size
        want = start + 2 * int(seconds * self.rate)
        deadline = time.monotonic() + timeout
        while self.raw.stat().st_size < want:
            assert time.monotonic() < deadline, "the speaker's monitor stopped recording"
            time.sleep(0.02)


class Pulse:
    def __init__(self, root: Path):
        self.root = root
        self.runtime = root / "runtime"
        self.home = root / "home"
        for d in (self.runtime, self.home, root / "state"):
            d.mkdir(parents=True, exist_ok=True)
        self.socket = self.runtime / "native"
        self.fifo = root / "mic.fifo"
        self.mic_rate, self.speaker_rate = MIC_RATE, SPEAKER_RATE
        self.env = {
            "PULSE_SERVER": f"unix:{self.socket}",
            "PULSE_RUNTIME_PATH": str(self.runtime),
            "PULSE_STATE_PATH": str(root / "state"),
            "PULSE_CLIENTCONFIG": str(root / "client.conf"),
        }
        (root / "client.conf").write_text("autospawn = no\n")
        self._proc: subprocess.Popen | None = None
        self._feed: MicFeed | None = None
        self._log = None

    # ---- daemon ----
    def _modules(self) -> dict[str, str]:
        return {
            "speaker": (f"module-null-sink sink_name=speaker rate={self.speaker_rate} "
                        "format=s16le channels=1 channel_map=mono "
                        "sink_properties=device.description=virtual-speaker"),
            "mic": (f"module-pipe-source source_name=mic file={self.fifo} "
                    f"rate={self.mic_rate} format=s16le channels=1 channel_map=mono "
                    "source_properties=device.description=virtual-microphone"),
        }

    def start(self) -> None:
        script = self.root / "script.pa"
        m = self._modules()
        script.write_text(
            f"load-module module-native-protocol-unix auth-anonymous=1 socket={self.socket}\n"
            f"load-module {m['speaker']}\nload-module {m['mic']}\n"
            "set-default-sink speaker\nset-default-source mic\n")
        env = dict(os.environ, HOME=str(self.home), XDG_RUNTIME_DIR=str(self.runtime),
                   XDG_CONFIG_HOME=str(self.home / ".config"), **self.env)
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        self._log = open(self.root / "pulseaudio.log", "w")  # noqa: SIM115
        self._proc = subprocess.Popen(
            ["pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--use-pid-file=no",
             "--system=no", "--disallow-module-loading=no", "--realtime=no",
             "--high-priority=no", "--log-target=stderr",
             "-F", str(script)],
            env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            start_new_session=True, preexec_fn=favoured)  # the audio server ahead too
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if self.socket.exists() and self._pactl_ok("info"):
                return
            time.sleep(0.1)
        log = (self.root / "pulseaudio.log").read_text()[-800:]
        self.stop()
        raise RuntimeError(f"pulseaudio did not start: {log}")

    def stop(self) -> None:
        if self._feed is not None:
            self._feed.close()
        proc, self._proc = self._proc, None
        if proc is not None:
            _end(proc, signal.SIGTERM)
        if self._log is not None:
            self._log.close()

    def _pactl_ok(self, *args) -> bool:
        r = subprocess.run(["pactl", *args], env=dict(os.environ, **self.env),
                           capture_output=True, text=True, timeout=10)
        return r.returncode == 0

    def pactl(self, *args: str) -> str:
        r = subprocess.run(["pactl", *args], env=dict(os.environ, **self.env),
                           capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            raise RuntimeError(f"pactl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    # ---- microphone ----
    def feed_mic(self, samples, sample_rate: int = MIC_RATE, realtime: bool = True) -> MicFeed:
        if sample_rate != self.mic_rate:
            from mlx_speech.audio.resample import resample

            samples = resample(np.asarray(samples, np.float32), sample_rate, self.mic_rate)
        if self._feed is not None:
            self._feed.close()
        self._feed = MicFeed(self.fifo, _to_s16(samples), self.mic_rate, realtime)
        return self._feed

    # ---- speaker ----
    @contextlib.contextmanager
    def record_speaker(self):
        rec = Recording()
        raw = self.root / f"speaker-{time.monotonic_ns()}.raw"
        rec.raw, rec.rate = raw, self.speaker_rate
        with open(raw, "wb") as f:
            proc = subprocess.Popen(
                ["parec", "-d", "speaker.monitor", "--raw", "--format=s16le",
                 f"--rate={self.speaker_rate}", "--channels=1", "--latency-msec=100",
                 "--client-name=pulse-fixture"],
                env=dict(os.environ, **self.env), stdout=f, stderr=subprocess.PIPE,
                preexec_fn=favoured)
        try:
            deadline = time.monotonic() + 10
            while "pulse-fixture" not in self.pactl("list", "source-outputs"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("parec did not connect: "
                                       + proc.stderr.read().decode(errors="replace"))
                time.sleep(0.05)
            while raw.stat().st_size < self.speaker_rate // 5:  # monitor audio is flowing
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("parec records nothing")
                time.sleep(0.02)
            yield rec
            rec.settle(1.0)  # the last frames through the monitor (a deep sink buffer too)
        finally:
            _end(proc, signal.SIGINT)
        data = raw.read_bytes()
        raw.unlink()
        rec.samples = (np.frombuffer(data[: len(data) // 2 * 2], "<i2").astype(np.float32)
                       / 32767.0)

    # ---- devices that go away ----
    @contextlib.contextmanager
    def unplugged(self, kind: str):
        """Remove a device, as if unplugged; load it back after the block.

        "speaker": the null sink goes (no other sink: playback streams are killed).
        "mic": the pipe source goes, and the null sink with it (as when a USB headset
        is pulled out): otherwise PulseAudio would move recording streams to the
        sink's monitor and they would go on, silently.
        """
        kinds = {"speaker": ["speaker"], "mic": ["mic", "speaker"]}[kind]
        if kind == "mic" and self._feed is not None:
            self._feed.close()
        for k in kinds:
            self.pactl("unload-module", self._module_index(k))
        try:
            yield
        finally:
            for k in reversed(kinds):
                self.pactl("load-module", *self._modules()[k].split())
            self.pactl("set-default-sink", "speaker")
            self.pactl("set-default-source", "mic")

    def wait_client(self, what: str = "source-outputs", timeout: float = 60) -> None:
        """Until a PortAudio (ALSA plug-in) client records ("source-outputs") or plays
        ("sink-inputs") on this server."""
        deadline = time.monotonic() + timeout
        while "ALSA plug-in" not in self.pactl("list", what):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no PortAudio client in {what} after {timeout} s")
            time.sleep(0.05)

    @contextlib.contextmanager
    def stalled_speaker(self):
        """Suspend the sink: players get no more callbacks (a device that hangs)."""
        self.pactl("suspend-sink", "speaker", "1")
        try:
            yield
        finally:
            self.pactl("suspend-sink", "speaker", "0")

    def _module_index(self, name: str) -> str:
        needle = f"sink_name={name}" if name == "speaker" else f"source_name={name}"
        for line in self.pactl("list", "short", "modules").splitlines():
            if needle in line:
                return line.split()[0]
        raise RuntimeError(f"no module for {name}")


def _skip_reason() -> str | None:
    for tool in ("pulseaudio", "pactl", "parec"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install pulseaudio)"
    r = subprocess.run([sys.executable, "-c", "import sounddevice"], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"PortAudio via sounddevice is not usable ({last}); apt-get install libportaudio2"
    plugin_dirs = [Path(p) for p in ("/usr/lib/x86_64-linux-gnu/alsa-lib",
                                     "/usr/lib/aarch64-linux-gnu/alsa-lib",
                                     "/usr/lib/alsa-lib", "/usr/lib64/alsa-lib")]
    if not any((d / "libasound_module_pcm_pulse.so").exists() for d in plugin_dirs):
        return "the ALSA pulse plugin is missing (apt-get install libasound2-plugins)"
    return None


@pytest.fixture(scope="session")
def pulse(tmp_path_factory):
    """A private PulseAudio daemon: see the module docstring."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    p = Pulse(tmp_path_factory.mktemp("pulse"))
    try:
        p.start()
    except (RuntimeError, OSError) as e:
        pytest.skip(f"cannot start a private pulseaudio: {e}")
    try:
        yield p
    finally:
        p.stop()
