"""mlx_speech.transcribe: speech to text from files or the microphone.

    mlx_speech.transcribe meeting.wav [--format txt|json|srt|vtt] [-o OUT]
    mlx_speech.transcribe --live [--timestamps] [--silence-ms 500] [--delay-ms 480]
        [--save-audio heard.wav]
    mlx_speech.transcribe --model nvidia/nemotron-speech-streaming-en-0.6b --live --latency-ms 160

Results go to stdout (or -o), logs and progress to stderr. --live ends a line at each pause
(the Silero VAD: `pip install --no-deps silero-vad`; --no-vad for one endless line).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import DEFAULT_ASR_MODEL
from .cliutil import (
    add_quantize_args,
    add_window_args,
    log,
    quantize_kwargs,
    run_cli,
    window_kwargs,
)
from .errors import MlxSpeechError

FORMATS = ("txt", "json", "srt", "vtt")
PROGRESS_MIN_SECONDS = 60.0


def segments_from_words(words, max_gap: float = 0.8, max_len: float = 10.0, breaks=()):
    """Group words into cues: split after . ? ! or at a pause or a long run, and before the
    first word at or after each of `breaks` (seconds: where the VAD found a pause ending,
    see `pause_breaks`)."""
    from .writers import Segment

    segs, cur = [], []
    breaks, b = sorted(breaks), 0
    for w in words:
        crossed = False
        while b < len(breaks) and w.start >= breaks[b]:
            b += 1
            crossed = True
        if cur and (crossed or w.start - cur[-1].end > max_gap
                    or w.end - cur[0].start > max_len):
            segs.append(cur)
            cur = []
        cur.append(w)
        if w.text.endswith((".", "?", "!", "。", "？", "！")):
            segs.append(cur)
            cur = []
    if cur:
        segs.append(cur)
    return [Segment(s[0].start, s[-1].end, " ".join(w.text for w in s)) for s in segs]


def pause_break_steps(vad, audio, silence_ms: int = 500, piece_s: float = 16.384):
    """`pause_breaks` a piece at a time: yields None after each `piece_s` of audio through the
    VAD (so a server's engine can step live streams in between), then the breaks."""
    import mlx.core as mx
    import numpy as np

    from .audio.turns import FRAME, SpeechStarted, TurnConfig, TurnDetector

    det, state = TurnDetector(TurnConfig(silence_duration_ms=silence_ms)), vad.make_state(1)
    x = np.pad(np.asarray(audio, np.float32), (0, -len(audio) % FRAME))  # as Silero pads
    starts, step = [], int(piece_s * 16000) // FRAME * FRAME
    for i in range(0, len(x), step):
        probs, state = vad(mx.array(x[None, i:i + step]), state)
        mx.eval(probs, *state.arrays())
        starts += [e.start for e in det.push(np.array(probs[0])) if isinstance(e, SpeechStarted)]
        yield None
    yield [s / 16000 for s in starts[1:]]


def pause_breaks(vad, audio, silence_ms: int = 500) -> list[float]:
    """Where speech resumes after each pause of `silence_ms` or more in a whole clip (16 kHz),
    in seconds (the turns' starts, prefix padding included; the first turn's left out)."""
    *_, breaks = pause_break_steps(vad, audio, silence_ms)
    return breaks


def _progress_bar(total_s: float):
    if total_s < PROGRESS_MIN_SECONDS:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=round(total_s), unit="s", file=sys.stderr, desc="transcribing",
               leave=False)

    def update(done_s: float, _total: float) -> None:
        bar.update(round(done_s) - bar.n)

    return bar, update


def transcribe_file(model, path: str, args) -> str:
    from .audio.io import load_audio
    from .writers import write_transcript

    audio, _ = load_audio(path, model.sample_rate, log=log)
    total = len(audio) / model.sample_rate
    bar, update = _progress_bar(total)
    try:
        result = model.transcribe(audio, model.sample_rate, progress=update,
                                  **_mode(model, args))
    finally:
        if bar is not None:
            bar.close()
    segments = segments_from_words(result.words)
    extra = {"file": str(path), "duration": round(total, 3),
             "words": [{"text": w.text, "start": round(w.start, 3), "end": round(w.end, 3)}
                       for w in result.words]}
    return write_transcript(args.format, result.text, segments, None, extra=extra)


def _mode(model, args) -> dict:
    """The streaming-mode option each model family takes."""
    from .models.voxtral_realtime import VoxtralRealtime

    if isinstance(model, VoxtralRealtime):
        if args.latency_ms is not None:
            raise MlxSpeechError("--latency-ms is for Nemotron; Voxtral takes --delay-ms")
        return {"delay_ms": args.delay_ms}
    if args.delay_ms is not None:
        raise MlxSpeechError("--delay-ms is for Voxtral; Nemotron takes --latency-ms")
    return {"latency_ms": args.latency_ms}


class _AudioLog:
    """--save-audio: every block the session received, written as it arrives
    (float wav keeps the samples exact; other formats are 16-bit)."""

    def __init__(self, path: str, sample_rate: int):
        import soundfile as sf

        subtype = "FLOAT" if path.lower().endswith(".wav") else None
        try:
            self.file = sf.SoundFile(path, "w", samplerate=sample_rate, channels=1,
                                     subtype=subtype)
        except (sf.LibsndfileError, OSError, TypeError, ValueError) as e:
            raise MlxSpeechError(f"cannot write {path}: {e}") from None
        self.path = path

    def write(self, block) -> None:
        self.file.write(block)

    def close(self) -> None:
        self.file.close()


def _clock(seconds: float) -> str:
    h, rem = divmod(seconds, 3600)
    m, sec = divmod(rem, 60)
    return f"{int(h):02d}:{int(m):02d}:{sec:06.3f}"


class LiveLines:
    """--live's core, device-free: audio blocks in (`feed`), text out (`write`).

    With a VAD (`mlx_speech.models.silero_vad`) each turn of speech is its own session and
    each pause ends its line (`timestamps`: the line starts with the time its turn's audio
    begins); without one, one endless line, a new session after an end-of-stream token.
    Sessions are drained as they go and turns forget their audio, so a day-long run holds
    constant memory: the transcript streams out, none of it is kept.
    """

    def __init__(self, model, mode: dict, write, vad=None, silence_ms: int = 500,
                 timestamps: bool = False):
        from .audio.turns import TurnAudio, TurnConfig, TurnDetector

        self.model, self.mode, self.write, self.vad = model, mode, write, vad
        self.timestamps = timestamps
        self.session = None if vad is not None else model.session(**mode)
        self.turns = None
        if vad is not None:
            if model.sample_rate != 16000:
                raise MlxSpeechError("the VAD takes 16 kHz audio")
            self.turns = TurnAudio(TurnDetector(TurnConfig(silence_duration_ms=silence_ms)))
            self.vad_state = vad.make_state(1)
        self.line_start: float | None = None  # the open turn's start (s)
        self.line_open = False  # text was written on the current line

    def _text(self, text: str) -> None:
        if not text:
            return
        if not self.line_open:
            text = text.lstrip()
            if not text:
                return
            if self.timestamps and self.line_start is not None:
                text = f"[{_clock(self.line_start)}] {text}"
            self.line_open = True
        self.write(text)

    def _end_line(self) -> None:
        if self.line_open:
            self.write("\n")
        self.line_open = False

    def _feed_session(self, x) -> None:
        self._text(self.session.feed(x))
        self.session.drain()  # the text is out: keep nothing of it

    def feed(self, block) -> None:
        if self.turns is None:
            self._feed_session(block)
            if self.session.done:  # EOS: start over on the same model
                self._end_line()
                self.session = self.model.session(**self.mode)
            return
        self.turns.push(block)
        actions, self.vad_state = self.turns.run_vad(self.vad, self.vad_state)
        for a in actions:
            if a[0] == "start":
                self.session = self.model.session(**self.mode)
                self.line_start = a[1] / 16000
            elif a[0] == "audio":
                self._feed_session(a[1])
            elif a[0] == "stop":
                self.close_turn()

    def close_turn(self) -> None:
        if self.session is not None:
            self._text(self.session.finish())
            self.session.drain()
        self.session = None
        self._end_line()

    def finish(self) -> None:
        """End of audio: the open turn's (or the endless line's) last text."""
        if self.turns is not None:
            for a in self.turns.commit():  # the open turn takes every sample heard
                if a[0] == "audio":
                    self._feed_session(a[1])
        self.close_turn()


def load_live_vad(args):
    """The Silero VAD for --live: --vad PATH, else the silero-vad wheel's weights when they are
    installed (without them one endless line, and a note saying so); None with --no-vad."""
    if args.no_vad:
        return None
    from .errors import CheckpointError
    from .models.silero_vad import load_vad

    try:
        return load_vad(args.vad)
    except CheckpointError as e:
        if args.vad is not None:
            raise
        log(f"note: no line breaks at pauses ({e})")
        return None


def live(model, args) -> None:
    from .audio.devices import QUIET_REPORT_S, Microphone
    from .cliutil import stop_on_ctrl_c

    mode = _mode(model, args)
    vad = load_live_vad(args)

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    lines = LiveLines(model, mode, write, vad, args.silence_ms, args.timestamps)
    saved = _AudioLog(args.save_audio, model.sample_rate) if args.save_audio else None
    mic = Microphone(sample_rate=model.sample_rate, block_samples=1280)
    problem = None
    try:
        with mic, stop_on_ctrl_c() as stop:
            log("listening... (Ctrl-C to stop)")
            try:
                while not stop.is_set():
                    block = mic.read_watched(0.1, lambda m: log(f"warning: {m}"))
                    if block is None:
                        if mic.ended:
                            break
                        continue
                    if saved is not None:
                        saved.write(block)
                    lines.feed(block)
            except KeyboardInterrupt:
                pass
            problem = mic.problem(QUIET_REPORT_S)
    finally:
        if saved is not None:
            saved.close()
    lines.finish()
    if problem:
        log(f"warning: {problem}")
    if mic.dropped:
        log(f"warning: {mic.dropped} audio blocks were dropped (the model fell behind)")
    if saved is not None:
        log(f"wrote {saved.path}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlx_speech.transcribe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", help="audio files (wav, flac, ogg, mp3, ...)")
    p.add_argument("--model", default=DEFAULT_ASR_MODEL, help="hub repo id or local folder")
    p.add_argument("--live", action="store_true", help="transcribe the microphone")
    p.add_argument("--save-audio", metavar="FILE",
                   help="--live: also write the audio the session received to FILE")
    p.add_argument("--timestamps", action="store_true",
                   help="--live: start each line with the time its speech began")
    p.add_argument("--silence-ms", type=int, default=500,
                   help="--live: a pause this long ends the line (default 500)")
    p.add_argument("--vad", metavar="PATH",
                   help="--live: Silero VAD weights (default: the silero-vad wheel's)")
    p.add_argument("--no-vad", action="store_true",
                   help="--live: no VAD; one endless line")
    p.add_argument("--delay-ms", type=int, default=None,
                   help="Voxtral: transcription delay, a multiple of 80 ms (default: the model's)")
    p.add_argument("--latency-ms", type=int, default=None, choices=(80, 160, 560, 1120),
                   help="Nemotron: streaming latency mode (default: the model's)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="output format (default: from -o's extension, else txt)")
    p.add_argument("-o", "--output", help="output file (a folder for several inputs)")
    add_quantize_args(p)
    add_window_args(p)
    p.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    return p


def _run(args) -> None:
    if not args.files and not args.live:
        raise MlxSpeechError("give one or more audio files, or --live")
    if args.format is None:
        ext = Path(args.output).suffix.lstrip(".") if args.output else ""
        args.format = ext if ext in FORMATS else "txt"
    if args.delay_ms is not None:
        from .models.voxtral_realtime.session import delay_tokens

        delay_tokens(args.delay_ms)  # fail before loading a big model
    for f in args.files:
        if not Path(f).exists():
            raise MlxSpeechError(f"no such file: {f}")
    if args.live and args.files:
        raise MlxSpeechError("give audio files or --live, not both")
    if not args.live and (args.timestamps or args.no_vad or args.vad):
        raise MlxSpeechError("--timestamps, --vad and --no-vad are for --live")
    if args.save_audio:
        if not args.live:
            raise MlxSpeechError("--save-audio is for --live")
        from .audio.io import check_writable

        check_writable(args.save_audio)
    if args.live:
        from .audio.devices import check_live_audio

        check_live_audio()
    import mlx_speech

    log(f"loading {args.model}")
    model = mlx_speech.load(args.model, **quantize_kwargs(args), **window_kwargs(args))
    if args.live:
        live(model, args)
        return
    many = len(args.files) > 1
    for f in args.files:
        text = transcribe_file(model, f, args)
        if args.output:
            out = Path(args.output)
            if many:
                out.mkdir(parents=True, exist_ok=True)
                out = out / (Path(f).stem + "." + args.format)
            try:
                out.write_text(text, encoding="utf-8")
            except OSError as e:
                raise MlxSpeechError(f"cannot write {out}: {e.strerror}") from None
            log(f"wrote {out}")
        else:
            if many:
                print(f"== {f}")
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(_run, args)


if __name__ == "__main__":
    sys.exit(main())
