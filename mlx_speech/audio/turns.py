"""Turn detection: per-frame speech probabilities in, speech started / stopped out.

A VAD (Silero, `mlx_speech.models.silero_vad`) gives one speech probability per 32 ms
frame of 16 kHz audio; `TurnDetector.push` turns them into `SpeechStarted`, `SpeechStopped`
and `IdleTimeout` events at exact sample positions, with OpenAI's realtime knobs:

- `server_vad`: a turn starts when `threshold` is crossed for `MIN_SPEECH_MS` (the start
  reported `prefix_padding_ms` earlier, never before the previous turn's end) and stops after
  `silence_duration_ms` below `threshold - 0.15` (Silero's hysteresis). `idle_timeout_ms`
  reports stretches without speech. The stop position includes the silence, as OpenAI's
  `audio_end_ms` does.
- `semantic_vad`: the silence a turn needs depends on how finished the speaker sounds. Ours
  is ACOUSTIC, not semantic: intonation at the end of the speech (a statement's final fall,
  a question's rise) means "finished" and ends the turn after the eagerness' short wait;
  level pitch (a held "umm") or a small final rise (a clause ending at a comma) means
  "unfinished" and waits up to OpenAI's longest waits (8 / 4 / 2 s for low / medium / high).

Pure Python: the detector never sees audio; `frame_pitch` (numpy) computes the pitch it uses
for `semantic_vad` from the same frames the VAD saw.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16000
FRAME = 512  # samples per VAD frame (32 ms)
MIN_SPEECH_MS = 96  # speech shorter than this never starts a turn (clicks, noise bursts)
NEG_OFFSET = 0.15  # a turn goes on while the probability stays above threshold - this
MODES = ("server_vad", "semantic_vad")
# eagerness -> (wait after a finished-sounding end, longest wait), ms
EAGERNESS = {"low": (800, 8000), "medium": (500, 4000), "high": (300, 2000),
             "auto": (500, 4000)}
CUE_WINDOW_MS = 1200  # the speech before a pause that the acoustic end cue looks at
PITCH_MIN_HZ, PITCH_MAX_HZ = 60.0, 400.0


@dataclass(frozen=True)
class TurnConfig:
    """OpenAI's `turn_detection` object, with its defaults filled in."""

    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    idle_timeout_ms: int | None = None
    eagerness: str = "auto"

    @classmethod
    def from_openai(cls, d: dict) -> TurnConfig:
        """From a client's `turn_detection` dict; ValueError names a bad field."""
        if not isinstance(d, dict):
            raise ValueError("turn_detection must be an object or null")
        kind = d.get("type", "server_vad")
        if kind not in MODES:
            raise ValueError(f"turn_detection.type must be one of {', '.join(MODES)}, "
                             f"got {kind!r}")
        kw = {"type": kind}
        allowed = ({"threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms"}
                   if kind == "server_vad" else {"eagerness"})
        for k, v in d.items():
            if k in ("type", "create_response", "interrupt_response") or v is None:
                continue  # response knobs are for conversation sessions
            if k not in allowed:
                raise ValueError(f"turn_detection.{k} is not a {kind} option")
            kw[k] = v
        c = cls(**kw)
        if not (isinstance(c.threshold, (int, float)) and 0.0 <= c.threshold <= 1.0):
            raise ValueError(f"turn_detection.threshold must be in [0, 1], got {c.threshold!r}")
        for k in ("prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms"):
            v = getattr(c, k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"turn_detection.{k} must be a non-negative integer, got {v!r}")
        if c.eagerness not in EAGERNESS:
            raise ValueError(f"turn_detection.eagerness must be one of "
                             f"{', '.join(EAGERNESS)}, got {c.eagerness!r}")
        return c

    def to_openai(self) -> dict:
        if self.type == "semantic_vad":
            return {"type": "semantic_vad", "eagerness": self.eagerness}
        return {"type": "server_vad", "threshold": self.threshold,
                "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms,
                "idle_timeout_ms": self.idle_timeout_ms}


@dataclass(frozen=True)
class SpeechStarted:
    start: int  # first sample of the turn (prefix padding included)
    at: int  # sample position where this was decided


@dataclass(frozen=True)
class SpeechStopped:
    end: int  # one past the turn's last sample (the closing silence included)


@dataclass(frozen=True)
class IdleTimeout:
    start: int  # the stretch without speech, [start, end)
    end: int


def _ms_to_samples(ms: float) -> int:
    return int(round(ms * SAMPLE_RATE / 1000))


def _ramp(x: float, lo: float, hi: float) -> float:
    return min(max((x - lo) / (hi - lo), 0.0), 1.0)


def end_of_turn_score(pitch: list[float]) -> float:
    """How finished the speech before a pause sounds, 0 (mid-phrase) .. 1 (finished).

    `pitch` (Hz, 0 = unvoiced) of the speech frames before the pause, oldest first; the
    intonation of its last two voiced frames (the tail) decides. A statement ends low: the
    tail is 3 semitones or more below the median and not rising over the last voiced frames
    (1 when so). A question ends high: the tail 5 semitones or more above the lowest point
    of the last 0.3 s (1). Level pitch (a held "umm") or a small final rise (a clause ending
    at a comma, "and ...") scores near 0. Too little voicing to tell: 0.5.
    """
    st = [12.0 * math.log2(p) for p in pitch if p > 0]  # semitones
    if len(st) < 6:
        return 0.5
    tail = (st[-1] + st[-2]) / 2
    before = st[-6:-2]  # the four voiced frames before the tail
    fall = float(np.median(st[:-2])) - tail
    final_rise = tail - sum(before) / len(before)
    question_rise = tail - min(st[-10:-2])
    statement = _ramp(fall, 0.5, 3.0) * (1.0 - _ramp(final_rise, 0.5, 1.5))
    return max(statement, _ramp(question_rise, 3.0, 5.0))


def semantic_wait_ms(eagerness: str, score: float) -> float:
    """The silence that ends a turn whose end scored `score` (see end_of_turn_score)."""
    short, longest = EAGERNESS[eagerness]
    return short + (longest - short) * (1.0 - score) ** 2


class TurnDetector:
    """Speech probabilities (one per FRAME samples) -> turn events; one per stream.

    `push(probs, pitch)` takes the next frames' probabilities (and, for semantic_vad, their
    `frame_pitch`) and returns the events they cause, in order. Positions count
    samples from the stream's first frame.
    """

    def __init__(self, config: TurnConfig | None = None):
        self.reconfigure(config or TurnConfig())
        self.min_frames = max(1, math.ceil(MIN_SPEECH_MS / 32))
        self.frames = 0  # frames seen
        self.in_speech = False
        self.run = 0  # candidate speech frames (not yet a turn)
        self.run_start = 0  # its first frame
        self.silence = 0  # silent frames inside a turn
        self.wait_frames = 0  # silence that ends the current pause
        self.floor = 0  # no turn starts before this sample (the last turn's end)
        self.idle_from = 0
        n = math.ceil(CUE_WINDOW_MS / 32)
        self._pitch: deque[float] = deque(maxlen=n)  # the speech frames' pitch
        self.last_score: float | None = None  # semantic_vad: the last pause's end score

    def reconfigure(self, config: TurnConfig) -> None:
        """New knobs from the next frame on (a turn in progress goes on under them)."""
        self.config = c = config
        self.neg = max(c.threshold - NEG_OFFSET, 0.01)
        self.prefix = _ms_to_samples(c.prefix_padding_ms)
        self.idle = None if c.idle_timeout_ms in (None, 0) else _ms_to_samples(c.idle_timeout_ms)

    @property
    def position(self) -> int:
        """Samples pushed so far."""
        return self.frames * FRAME

    def earliest_start(self) -> int:
        """No event will ever refer to audio before this sample (callers may drop it)."""
        if self.in_speech:
            return self.floor
        first = self.run_start if self.run else self.frames
        keep = max(self.floor, first * FRAME - self.prefix)
        if self.idle is not None:
            keep = min(keep, self.idle_from)
        return keep

    def _wait_frames(self) -> int:
        c = self.config
        if c.type == "semantic_vad":
            self.last_score = end_of_turn_score(list(self._pitch))
            ms = semantic_wait_ms(c.eagerness, self.last_score)
        else:
            ms = c.silence_duration_ms
        return max(1, math.ceil(ms / 32))

    def push(self, probs, pitch=None) -> list:
        events: list = []
        for k, p in enumerate(probs):
            p = float(p)
            i = self.frames
            self.frames += 1
            if self.in_speech:
                if p >= self.neg:
                    self.silence = 0
                    if pitch is not None:
                        self._pitch.append(float(pitch[k]))
                    continue
                self.silence += 1
                if self.silence == 1:
                    self.wait_frames = self._wait_frames()
                if self.silence >= self.wait_frames:
                    events.append(self._stop(self.frames * FRAME))
                continue
            if self.run:
                self.run = self.run + 1 if p >= self.neg else 0
            elif p >= self.config.threshold:
                self.run, self.run_start = 1, i
                self._pitch.clear()
            if self.run and pitch is not None:
                self._pitch.append(float(pitch[k]))
            if self.run >= self.min_frames:
                start = max(self.floor, self.run_start * FRAME - self.prefix)
                self.in_speech, self.silence, self.run = True, 0, 0
                events.append(SpeechStarted(start, self.frames * FRAME))
            elif (not self.run and self.idle is not None
                  and self.frames * FRAME - self.idle_from >= self.idle):
                end = self.frames * FRAME
                events.append(IdleTimeout(self.idle_from, end))
                self.idle_from = self.floor = end
        return events

    def _stop(self, end: int) -> SpeechStopped:
        self.in_speech, self.silence, self.run = False, 0, 0
        self.floor = self.idle_from = end
        return SpeechStopped(end)

    def force_stop(self) -> SpeechStopped | None:
        """A client commit: end the turn in progress here (None when there is none)."""
        return self._stop(self.position) if self.in_speech else None

    def clear(self) -> None:
        """A client clear: forget the turn in progress and everything before here."""
        self.in_speech, self.silence, self.run = False, 0, 0
        self.floor = self.idle_from = self.position


def frame_pitch(frames: np.ndarray) -> np.ndarray:
    """Pitch (Hz) of each FRAME-sample frame, (n, FRAME) float32 at 16 kHz -> (n,).

    Normalized autocorrelation over 60-400 Hz; 0 where unvoiced or quieter than -50 dBFS.
    """
    x = np.asarray(frames, np.float32).reshape(-1, FRAME).astype(np.float64)
    x = x - x.mean(axis=1, keepdims=True)
    rms = np.sqrt((x * x).mean(axis=1))
    level = 20.0 * np.log10(np.maximum(rms, 1e-6))
    n = 2 * FRAME
    spec = np.fft.rfft(x, n=n, axis=1)
    ac = np.fft.irfft(spec * np.conj(spec), n=n, axis=1)[:, :FRAME]
    lo = int(SAMPLE_RATE / PITCH_MAX_HZ)
    hi = int(SAMPLE_RATE / PITCH_MIN_HZ)
    # unbiased: divide by the overlap length so long lags are not penalized
    norm = ac[:, lo:hi] / (FRAME - np.arange(lo, hi)) * FRAME / np.maximum(ac[:, :1], 1e-12)
    # the first local peak within 10% of the highest: not an octave below the true pitch
    top = norm.max(axis=1, keepdims=True)
    mid = norm[:, 1:-1]
    peaks = (mid >= norm[:, :-2]) & (mid >= norm[:, 2:]) & (mid >= 0.9 * top)
    lag = np.where(peaks.any(axis=1), np.argmax(peaks, axis=1) + 1, np.argmax(norm, axis=1))
    peak = norm[np.arange(len(x)), lag]
    pitch = np.where((peak > 0.5) & (level > -50.0), SAMPLE_RATE / (lag + lo), 0.0)
    return pitch.astype(np.float32)


class TurnAudio:
    """A stream's audio routed into turns: what a VAD-driven transcriber needs, without the VAD.

    `push(samples)` takes any amount of 16 kHz audio; `frames()` gives the whole frames the
    VAD has not seen yet; `step(probs, pitch)` takes its probabilities for them and returns
    actions, in order:

        ("start", start)            a turn begins at sample `start` (prefix padding included)
        ("audio", samples)          the open turn's next samples (its prefix first)
        ("stop", end)               the turn ends at `end` (after its closing silence)
        ("idle", start, end, samples)   idle_timeout_ms without speech: that stretch

    The audio of consecutive turns never overlaps and none inside a turn is skipped; audio
    between turns is kept only as far back as a later turn's prefix could reach, so memory
    stays bounded however long the stream runs. An open turn gets audio once the VAD has seen
    it (at most one frame later than it arrived); `commit()` ends it at the last sample pushed.
    """

    def __init__(self, detector: TurnDetector):
        self.detector = detector
        self.buf = np.zeros(0, np.float32)  # samples [base, received)
        self.base = 0
        self.received = 0
        self.sent = 0  # the open turn has every sample before this

    @property
    def open(self) -> bool:
        return self.detector.in_speech

    @property
    def seen(self) -> int:
        """Samples the VAD has seen (whole frames)."""
        return self.detector.position

    def push(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32).reshape(-1)
        self.buf = np.concatenate([self.buf, x]) if len(self.buf) else x.copy()
        self.received += len(x)

    def frames(self) -> np.ndarray:
        """(n, FRAME) whole frames the VAD has not seen yet."""
        n = (self.received - self.seen) // FRAME
        i = self.seen - self.base
        return self.buf[i: i + n * FRAME].reshape(n, FRAME)

    def _span(self, a: int, b: int) -> np.ndarray:
        return self.buf[a - self.base: b - self.base].copy()

    def step(self, probs, pitch=None) -> list[tuple]:
        out: list[tuple] = []
        for ev in self.detector.push(probs, pitch):
            if isinstance(ev, SpeechStarted):
                out.append(("start", ev.start))
                self.sent = ev.start
            elif isinstance(ev, SpeechStopped):
                out += self._send(ev.end)
                out.append(("stop", ev.end))
            else:
                out.append(("idle", ev.start, ev.end, self._span(ev.start, ev.end)))
        if self.open:
            out += self._send(self.seen)
        self._trim()
        return out

    def _send(self, upto: int) -> list[tuple]:
        if upto <= self.sent:
            return []
        x = self._span(self.sent, upto)
        self.sent = upto
        return [("audio", x)]

    def commit(self) -> list[tuple]:
        """A client commit: the open turn takes every sample pushed and ends; [] if none."""
        if not self.open:
            return []
        out = self._send(self.received)
        end = self.received
        self.detector.force_stop()
        self.detector.floor = self.detector.idle_from = end
        self._trim()
        return out + [("stop", end)]

    def run_vad(self, vad, state):
        """A lone stream's step: `vad` (a Silero VAD, `state` its VADState for one stream) over
        the frames it has not seen; (actions as `step` gives them, the new state). Evaluates
        (the caller owns this MLX thread); a server batches streams instead (server/turns.py)."""
        frames = self.frames()
        if not len(frames):
            return [], state
        import mlx.core as mx

        probs, state = vad(mx.array(frames.reshape(1, -1)), state)
        mx.eval(probs, *state.arrays())
        return self.step(np.array(probs[0])), state

    def clear(self) -> None:
        """Forget the open turn and everything pushed so far."""
        self.detector.clear()
        self.detector.floor = self.detector.idle_from = self.received
        self._trim()

    def _trim(self) -> None:
        # an open turn has had everything before `sent`; otherwise keep what a turn may still
        # start with, and the frames the VAD has not seen
        keep = self.sent if self.open else min(self.detector.earliest_start(), self.seen)
        if keep > self.base:
            self.buf = self.buf[keep - self.base:]
            self.base = keep
