"""mlx_speech.transcribe: speech to text from files or the microphone.

    mlx_speech.transcribe meeting.wav [--format txt|json|srt|vtt] [-o OUT]
    mlx_speech.transcribe --live [--timestamps] [--words] [--silence-ms 500] [--latency-ms 480]
        [--save-audio heard.wav] [--diarize [--diarizer MODEL]]
    mlx_speech.transcribe --model nvidia/nemotron-speech-streaming-en-0.6b --live --latency-ms 160
    mlx_speech.transcribe --model nvidia/nemotron-3.5-asr-streaming-0.6b --language de talk.wav

Results go to stdout (or -o), logs and progress to stderr. --live ends a line at each pause
(the Silero VAD, shipped with mlx_speech; --no-vad for one endless line).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from . import DEFAULT_ASR_MODEL, hotwords
from .cliutil import (
    ArgumentParser,
    add_quantize_args,
    add_window_args,
    log,
    quantize_kwargs,
    ranged,
    run_cli,
    window_kwargs,
)
from .errors import MlxSpeechError
from .transcript import (  # noqa: F401 (pause_break_steps, pause_breaks: re-exported)
    FORMATS,
    format_turns,
    pause_break_steps,
    pause_breaks,
    segments_from_words,
    speaker_name,
)

PROGRESS_MIN_SECONDS = 60.0
SPEAKER_HOLD_MAX = 200  # --live --diarize: words held while no speaker has been heard yet


FEED_S = 2.0  # seconds of audio per session feed: a first Ctrl-C is heard within one


def _progress_bar(total_s: float | None):
    if total_s is None or total_s < PROGRESS_MIN_SECONDS:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=round(total_s), unit="s", file=sys.stderr, desc="transcribing",
               leave=False)

    def update(done_s: float, _total: float) -> None:
        bar.update(min(bar.total, round(done_s)) - bar.n)

    return bar, update


def transcribe_file(model, path: str, args, stop=None) -> str:
    """The transcript of one file in `args.format`, decoded and fed block by block (memory
    stays flat however long the file is). `stop` (a threading.Event, set by a first Ctrl-C)
    ends it early at a block boundary: the text so far is returned, and
    `args.interrupted_at` says where (seconds), else it is None."""
    from .audio.decode import decode
    from .writers import write_transcript

    blocks = decode(path, model.sample_rate, block_s=FEED_S, log=log)
    total = blocks.info.duration
    bar, update = _progress_bar(total)
    session = model.session(**_mode(args))
    diarizer = getattr(args, "diarizer_model", None)  # --diarize
    speakers = None
    if diarizer is not None:
        from .diarize import SpeakerTracker

        speakers = SpeakerTracker(diarizer)  # the same blocks, beside the ASR session
    fed = 0
    args.interrupted_at = None
    try:
        for block in blocks:
            session.feed(block)
            if speakers is not None:
                speakers.feed(block)
            fed += len(block)
            if update is not None:
                update(fed / model.sample_rate, total)
            if stop is not None and stop.is_set():
                args.interrupted_at = fed / model.sample_rate
                break
        else:
            session.finish()
            if speakers is not None:
                speakers.finish()
    finally:
        if bar is not None:
            bar.close()
    result = session.result()
    heard = fed / model.sample_rate
    segments = segments_from_words(result.words)
    extra = {"file": str(path), "duration": round(heard if total is None else total, 3),
             **({"transcribed": round(heard, 3)} if args.interrupted_at is not None else {}),
             "words": [{"text": w.text, "start": round(w.start, 3), "end": round(w.end, 3)}
                       for w in result.words]}
    if result.language is not None:  # detected (or given) by models that tell
        extra["language"] = result.language
    text = result.text
    if speakers is not None:  # --diarize: txt gets a line per speaker turn
        from .diarize import from_frames

        d = from_frames(result, speakers.probs.copy())
        for row, w in zip(extra["words"], d.words, strict=True):
            row["speaker"] = speaker_name(w.speaker)
        text = format_turns(d.turns()) if args.format == "txt" else text
        segments = d.segments
    return write_transcript(args.format, text, segments, None, extra=extra)


def _mode(args) -> dict:
    """The session options: `latency_ms` (the one name both ASR families take) and the
    vocabulary (parsed once, from the command line)."""
    latency = {} if args.latency_ms is None else {"latency_ms": args.latency_ms}
    return {**latency, **hotwords.session_keywords(args.vocabulary)}


def check_latency(model_type: str, latency_ms: int | None) -> None:
    """--latency-ms against what the model family takes (from its config, before loading;
    `load(kind="asr")` has already refused other kinds)."""
    if latency_ms is not None:
        from .registry import family

        family(model_type).latency.check(latency_ms)


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

    With a `diarizer` (`--diarize`) its streaming session hears every block beside the ASR
    (`diarize.SpeakerTracker`), and lines are made of the words once their speaker frames
    exist: "Speaker N: ..." , a new line at each pause and each change of speaker, each word
    labelled as offline `diarize.transcribe` labels it (`timestamps`: a line starts with its
    first word's time).
    """

    def __init__(self, model, mode: dict, write, vad=None, silence_ms: int = 500,
                 timestamps: bool = False, words: bool = False, diarizer=None,
                 diarizer_streaming: dict | None = None):
        from .audio.turns import TurnAudio, TurnConfig, TurnDetector

        self.model, self.mode, self.write, self.vad = model, mode, write, vad
        self.timestamps = timestamps
        self.words = [] if words else None  # the line's words, written when it ends
        self.speakers = None
        if diarizer is not None:
            from .diarize import SpeakerTracker

            if model.sample_rate != diarizer.sample_rate:
                raise MlxSpeechError(f"the diarizer takes {diarizer.sample_rate} Hz audio, "
                                     f"the model {model.sample_rate} Hz")
            self.speakers = SpeakerTracker(diarizer, **(diarizer_streaming or {}))
            self.queue: list = []  # words (times on the stream's clock) and None (a pause)
            self.speaker: int | None = None  # the open line's speaker
        self.heard = 0  # samples fed
        self.t0 = 0.0  # where the session's audio starts on the stream's clock (s)
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

    def _take(self, words) -> None:
        """A session's finished words: the line's (--words), or the speaker queue's."""
        if self.speakers is not None:
            self.queue += [replace(w, start=w.start + self.t0, end=w.end + self.t0)
                           for w in words]
        elif self.words is not None:
            self.words += words

    def _feed_session(self, x) -> None:
        text = self.session.feed(x)
        if self.speakers is None:
            self._text(text)
        self._take(self.session.drain().words)  # the text is out: keep nothing of it

    def feed(self, block) -> None:
        self.heard += len(block)
        if self.speakers is not None:
            self.speakers.feed(block)  # the same samples, on this (the MLX) thread
        if self.turns is None:
            self._feed_session(block)
            if self.session.done:  # EOS: start over on the same model
                self._take(self.session.result().words)
                self._line_break()
                self.session = self.model.session(**self.mode)
                self.t0 = self.heard / self.model.sample_rate
        else:
            self.turns.push(block)
            actions, self.vad_state = self.turns.run_vad(self.vad, self.vad_state)
            for a in actions:
                if a[0] == "start":
                    self.session = self.model.session(**self.mode)
                    self.line_start = self.t0 = a[1] / 16000
                elif a[0] == "audio":
                    self._feed_session(a[1])
                elif a[0] == "stop":
                    self.close_turn()
        if self.speakers is not None:
            self._label()

    def close_turn(self) -> None:
        if self.session is not None:
            text = self.session.finish()
            if self.speakers is None:
                self._text(text)
            self._take(self.session.result().words)
            self.session.drain()
        self.session = None
        self._line_break()

    def _line_break(self) -> None:
        if self.speakers is not None:
            self.queue.append(None)  # the line ends once the words before it are labelled
            return
        self._end_line()
        self._write_words()

    def _label(self, final: bool = False) -> None:
        """--diarize: write the queued words whose speaker frames exist (all when `final`),
        in order; none while nobody has spoken yet (offline gives those words the first
        speaker), unless final or too many wait."""
        tr = self.speakers
        n = 0
        while n < len(self.queue) and (final or self.queue[n] is None
                                       or tr.covers(self.queue[n])):
            n += 1
        ready = self.queue[:n]
        words = [w for w in ready if w is not None]
        labels = tr.label(words)
        if labels and labels[0] is None and not final and len(words) < SPEAKER_HOLD_MAX:
            return
        del self.queue[:n]
        it = iter(labels)
        for w in ready:
            if w is None:
                self._end_line()
                self._write_words()
                continue
            label = next(it)
            if self.line_open and label != self.speaker:
                self._end_line()
                self._write_words()
            if not self.line_open:
                self.speaker, self.line_start = label, w.start
                name = speaker_name(label)
                self._text(f"{name}: {w.text}" if name else w.text)
            else:
                self.write(" " + w.text)
            if self.words is not None:
                self.words.append(w)

    def _write_words(self) -> None:
        """--words: the line's word times (the model's own), on the line below it."""
        if self.words:
            t0 = 0.0 if self.speakers is not None else (self.line_start or 0.0)
            self.write("  " + " ".join(f"[{_clock(t0 + w.start)}-{_clock(t0 + w.end)}] "
                                       f"{w.text}" for w in self.words) + "\n")
        if self.words is not None:
            self.words = []

    def finish(self) -> None:
        """End of audio: the open turn's (or the endless line's) last text."""
        if self.turns is not None:
            for a in self.turns.commit():  # the open turn takes every sample heard
                if a[0] == "audio":
                    self._feed_session(a[1])
        self.close_turn()
        if self.speakers is not None:
            self.speakers.finish()
            self._label(final=True)
            self._end_line()
            self._write_words()


def load_live_vad(args):
    """The Silero VAD for --live: --vad PATH, else Silero's release model shipped with
    mlx_speech (should it be missing, one endless line and a note saying so); None with
    --no-vad."""
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


def live(model, args, vad=None, diarizer=None, output: Path | None = None) -> None:
    """The microphone through `model`; `vad` from `load_live_vad` (None: one endless line);
    `diarizer` (--diarize): lines labelled with their speaker; `output` (-o): the same text
    written to that file as it comes (flushed, so a Ctrl-C or a crash loses nothing)."""
    from .audio.devices import QUIET_REPORT_S, Microphone
    from .cliutil import stop_on_ctrl_c

    mode = _mode(args)
    copy = None
    if output is not None:
        try:
            copy = open(output, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
        except OSError as e:
            raise MlxSpeechError(f"cannot write {output}: {e.strerror or e}") from None

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        if copy is not None:
            copy.write(text)
            copy.flush()

    streaming = {}
    if diarizer is not None:
        from .diarize import live_streaming

        streaming = live_streaming(diarizer)
    lines = LiveLines(model, mode, write, vad, args.silence_ms, args.timestamps, args.words,
                      diarizer, streaming)
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
        lines.finish()
    finally:
        if saved is not None:
            saved.close()
        if copy is not None:
            copy.close()
            log(f"wrote {output}")
    if problem:
        log(f"warning: {problem}")
    if mic.dropped:
        log(f"warning: {mic.dropped} audio blocks were dropped (the model fell behind)")
    if saved is not None:
        log(f"wrote {saved.path}")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="mlx_speech.transcribe", description=__doc__)
    p.add_argument("files", nargs="*", help="audio files (wav, flac, ogg, mp3, ...)")
    p.add_argument("--model", default=DEFAULT_ASR_MODEL, help="hub repo id or local folder")
    p.add_argument("--live", action="store_true", help="transcribe the microphone")
    p.add_argument("--save-audio", metavar="FILE",
                   help="--live: also write the audio the session received to FILE")
    p.add_argument("--timestamps", action="store_true",
                   help="--live: start each line with the time its speech began")
    p.add_argument("--words", action="store_true",
                   help="--live: after each line, its words with their start and end times")
    p.add_argument("--silence-ms", type=ranged(int, 1), default=500,
                   help="--live: a pause this long ends the line (default 500)")
    p.add_argument("--vad", metavar="PATH",
                   help="--live: Silero VAD weights (default: Silero's release model, "
                        "shipped with mlx_speech)")
    p.add_argument("--no-vad", action="store_true",
                   help="--live: no VAD; one endless line")
    p.add_argument("--latency-ms", "--delay-ms", dest="latency_ms", type=int, default=None,
                   help="streaming latency (default: the model's): Voxtral takes a multiple of "
                        "80 ms, Nemotron 80, 160, 560 or 1120, Nemotron 3.5 also 320 "
                        "(--delay-ms is its older name)")
    p.add_argument("--language", default=None,
                   help="the spoken language, for models that take one (Nemotron 3.5: a locale "
                        "such as de-DE, a code such as de, or auto, its default: it detects "
                        "the language and json output reports it)")
    hotwords.add_arguments(p)
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="output format (default: from -o's extension, else txt)")
    p.add_argument("-o", "--output", help="output file (a folder for several inputs)")
    p.add_argument("--diarize", action="store_true",
                   help="label speakers (txt and --live: a line per speaker turn; srt: prefix; "
                        "vtt: <v Speaker N>; json: speaker per word and segment)")
    p.add_argument("--diarizer", metavar="MODEL", default=None,
                   help="diarization model for --diarize (default: streaming Sortformer "
                        "v2.1, mlx-community fp16)")
    add_quantize_args(p)
    add_window_args(p)
    p.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    return p


def _is_folder(out: str, n_inputs: int) -> bool:
    """-o names a folder for several inputs, an existing folder, or a path ending in /."""
    return n_inputs > 1 or Path(out).is_dir() or out.endswith(("/", os.sep))


def plan_outputs(args) -> list[Path | None]:
    """Where each input's transcript goes (None: stdout), decided and checked before any work.

    -o is a file for one input and a folder for several (or an existing folder, or a path
    ending in /), where each input gets `<stem>.<format>`, or `<name>.<format>` (talk.wav.vtt)
    when two inputs share a stem; two inputs that would still write one file are refused. A
    file's extension must agree with --format (which defaults to it; else txt)."""
    from .audio.io import check_writable

    files = args.files
    if not args.output:
        args.format = args.format or "txt"
        return [None] * len(files)
    out = Path(args.output)
    if not _is_folder(args.output, len(files)):
        ext = out.suffix.lstrip(".").lower()
        if args.format is None:
            if ext and ext not in FORMATS:
                raise MlxSpeechError(f"cannot write {out}: unknown transcript format {ext!r}; "
                                     f"use one of {', '.join(FORMATS)} (or --format)")
            args.format = ext or "txt"
        elif ext in FORMATS and ext != args.format:  # x.srt with --format json
            raise MlxSpeechError(f"cannot write {out}: its extension says {ext}, --format says "
                                 f"{args.format}; make them agree (e.g. -o "
                                 f"{out.with_suffix('.' + args.format).name})")
        check_writable(out)
        return [out]
    args.format = args.format or "txt"
    if out.exists() and not out.is_dir():
        raise MlxSpeechError(f"-o {out}: several inputs need a folder, and this is a file")
    ext = out.suffix.lstrip(".").lower()
    if not out.exists() and ext in FORMATS and not args.output.endswith(("/", os.sep)):
        raise MlxSpeechError(f"-o {out} names a file, but {len(files)} inputs write one "
                             "transcript each: give a folder (e.g. -o transcripts/)")
    parent = out if out.exists() else out.parent
    if not parent.is_dir():
        raise MlxSpeechError(f"cannot write {out}: {parent} does not exist")
    check_writable(parent / ".mlx_speech_check")
    seen: dict[str, str] = {}
    for f in files:
        key = str(Path(f).resolve())
        if key in seen:
            raise MlxSpeechError(f"{f} is given twice")
        seen[key] = f
    stems = [Path(f).stem for f in files]
    names = [(Path(f).stem if stems.count(Path(f).stem) == 1 else Path(f).name)
             + "." + args.format for f in files]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise MlxSpeechError(f"{files[names.index(name)]} and {files[i]} would both write "
                                 f"{out / name}: rename one, or transcribe them to different "
                                 "folders")
    return [out / name for name in names]


def _write(out: Path | None, text: str, header: str | None) -> None:
    """One transcript: to its file (written aside, then renamed), else to stdout."""
    if out is None:
        if header is not None:
            print(header)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    from .audio.io import atomic_output

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(out) as tmp:
        try:
            tmp.write_text(text, encoding="utf-8")
        except OSError as e:
            raise MlxSpeechError(f"cannot write {out}: {e.strerror}") from None
    log(f"wrote {out}")


def _run(args) -> None:
    from .audio.io import check_readable

    if not args.files and not args.live:
        raise MlxSpeechError("give one or more audio files, or --live")
    if args.diarizer and not args.diarize:
        raise MlxSpeechError("--diarizer needs --diarize")
    if args.live and args.files:
        raise MlxSpeechError("give audio files or --live, not both")
    if not args.live and (args.timestamps or args.no_vad or args.vad or args.words):
        raise MlxSpeechError("--timestamps, --words, --vad and --no-vad are for --live")
    args.vocabulary = hotwords.from_args(args)  # a bad list fails before loading a model
    if args.save_audio and not args.live:
        raise MlxSpeechError("--save-audio is for --live")
    if args.live:
        outs = [check_live_output(args)] if args.output else []
    else:  # every check before loading a multi-GB model
        outs = plan_outputs(args)
    for f in args.files:
        check_readable(f)
    if args.save_audio:
        from .audio.io import check_writable, output_format

        if output_format(args.save_audio) == "pcm":  # soundfile needs a header to write to
            raise MlxSpeechError(f"cannot write {args.save_audio}: --save-audio takes wav, "
                                 "flac, ogg, opus or mp3")
        check_writable(args.save_audio)
    vad = None
    if args.live:
        from .audio.devices import check_live_audio

        check_live_audio()
        vad = load_live_vad(args)  # small: a bad --vad is found before the big model loads
    args.diarizer_model = None
    if args.diarize:  # small too, and kind-checked from its config before any weights load
        from .diarize import DEFAULT_DIARIZER, load_diarizer

        log(f"loading {args.diarizer or DEFAULT_DIARIZER}")
        args.diarizer_model = load_diarizer(args.diarizer)
    import mlx_speech

    # --language is the sessions' default language, checked against the checkpoint's before its
    # weights load (a model that takes none refuses the option)
    language = {} if args.language is None else {"language": args.language}
    model = mlx_speech.load(args.model, kind="asr", log=log,
                            check=lambda t: check_latency(t, args.latency_ms),
                            **quantize_kwargs(args), **window_kwargs(args), **language)
    from .registry import check_loaded

    check_loaded(args.model, model, "asr")
    if args.live:
        live(model, args, vad, args.diarizer_model, outs[0] if outs else None)
        return
    from .cliutil import stop_on_ctrl_c

    many = len(args.files) > 1
    with stop_on_ctrl_c() as stop:
        for f, out in zip(args.files, outs, strict=True):
            text = transcribe_file(model, f, args, stop)  # a second Ctrl-C: stop at once
            _write(out, text, f"== {f}" if many else None)
            if args.interrupted_at is not None:  # what is done is written: now stop
                log(f"interrupted at {_clock(args.interrupted_at)} of {f}"
                    + (f": {out} holds the transcript so far" if out else ""))
                raise KeyboardInterrupt


def check_live_output(args) -> Path:
    """--live -o FILE: the lines as they are printed, also written to FILE (kept up to date
    line by line, so a Ctrl-C loses nothing); text only."""
    from .audio.io import check_writable

    out = Path(args.output)
    ext = out.suffix.lstrip(".").lower()
    if out.is_dir() or args.output.endswith(("/", os.sep)):
        raise MlxSpeechError(f"--live -o takes a file, and {out} is a folder")
    if (args.format or "txt") != "txt" or (ext and ext != "txt"):
        raise MlxSpeechError(f"cannot write {out}: --live writes its lines as text; give a "
                             ".txt file (or no extension)")
    args.format = "txt"
    check_writable(out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(_run, args)


if __name__ == "__main__":
    from mlx_speech.cliutil import exit_with

    exit_with(main())
