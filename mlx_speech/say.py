"""mlx_speech.say: text to speech, played as it is generated or written to a file.

    mlx_speech.say "Hello."                                 # through the speakers
    mlx_speech.say "Hello." --voice neutral_female -o hello.wav
    echo "long text..." | mlx_speech.say -o story.flac       # text from stdin (or "-")
    my_llm_client | mlx_speech.say -                         # each sentence as it arrives
    mlx_speech.say --list-voices

Text from stdin is spoken as it is read: each sentence as soon as it has arrived (the
model's `stream_text`), so a program writing its reply bit by bit is heard while it writes.

Output formats: wav, flac, ogg (Vorbis), opus, mp3, pcm (raw 16-bit little-endian
mono); the default comes from the -o extension. Logs and progress go to stderr.
"""

from __future__ import annotations

import codecs
import inspect
import io
import os
import sys
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

from .cliutil import ArgumentParser, add_quantize_args, log, quantize_kwargs, ranged, run_cli
from .errors import MlxSpeechError
from .registry import check_loaded

DEFAULT_TTS_MODEL = "mistralai/Voxtral-4B-TTS-2603"
FORMATS = ("wav", "flac", "ogg", "opus", "mp3", "pcm")
LONG_TEXT_CHARS = 400  # longer texts get a progress bar even when stderr is not a terminal
NO_SPEAKER_HINT = "; use -o FILE to write a file instead"


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="mlx_speech.say", description=__doc__)
    p.add_argument("text", nargs="?", help='text to speak; "-" or nothing reads stdin')
    p.add_argument("--model", default=DEFAULT_TTS_MODEL,
                   help=f"hub repo id or local folder (default {DEFAULT_TTS_MODEL})")
    p.add_argument("--voice", help="voice name (see --list-voices; default: the model's)")
    p.add_argument("-o", "--output", help="write audio to this file instead of playing it")
    p.add_argument("--format", choices=FORMATS, type=str.lower,
                   help="output format (default: from the -o extension)")
    p.add_argument("--seed", type=ranged(int, 0, 2**63 - 1), default=0,
                   help="sampling seed (default 0)")
    p.add_argument("--max-frames", type=int, help="stop after this many audio frames")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                   help="compute dtype (default: the checkpoint's)")
    p.add_argument("--device", help="audio output device (name or index) for playback")
    p.add_argument("--list-voices", action="store_true", help="print the model's voices and exit")
    add_quantize_args(p)
    p.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    return p


def read_text(arg: str | None, stdin=None) -> str | Iterator[str]:
    """The text argument, or for None / "-" stdin's text as it arrives (an iterator of pieces,
    read up to the first non-blank one here: empty input fails before any load)."""
    if arg is not None and arg != "-":
        if not arg.strip():
            raise MlxSpeechError("the text to speak is empty (only whitespace)")
        return arg.strip()
    stdin = sys.stdin if stdin is None else stdin
    if stdin is None or stdin.isatty():
        raise MlxSpeechError('give the text to speak, e.g. mlx_speech.say "Hello.", '
                             "or pipe it on stdin")
    pieces = stdin_pieces(stdin)
    head = []
    for piece in pieces:
        head.append(piece)
        if piece.strip():
            return chain(["".join(head)], pieces)
    if not head:
        raise MlxSpeechError("stdin is empty: no text to speak")
    raise MlxSpeechError("the text to speak is empty (only whitespace)")


def stdin_pieces(stdin) -> Iterator[str]:
    """Text from stdin as soon as it is written (not line by line, not at its end)."""
    try:
        fd = stdin.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # a stand-in with no file
        yield from iter(stdin.readline, "")
        return
    decode = codecs.getincrementaldecoder(getattr(stdin, "encoding", None) or "utf-8")(
        errors="replace").decode
    while data := os.read(fd, 1 << 16):
        if text := decode(data):
            yield text
    if text := decode(b"", final=True):
        yield text


def _device(arg: str | None) -> int | str | None:
    return int(arg) if arg is not None and arg.isdigit() else arg


class _Progress:
    """A tqdm bar on stderr: the model's (done, total) when it reports them,
    else seconds of audio made so far."""

    def __init__(self, show: bool):
        self.bar = None
        self.seconds = 0.0
        if show:
            from tqdm import tqdm

            # no rate, no unit: "speaking [00:03, 2.4 s of audio]" until the model says how
            # many parts the text has, then "speaking 2/5 parts |###  | [00:03, 2.4 s of audio]"
            self.bar = tqdm(total=None, file=sys.stderr, desc="speaking", leave=False,
                            dynamic_ncols=True, bar_format=self.UNCOUNTED)

    UNCOUNTED = "{desc} [{elapsed}{postfix}]"
    COUNTED = "{desc} {n_fmt}/{total_fmt} parts |{bar}| [{elapsed}{postfix}]"

    def model(self, done, total=None) -> None:
        if self.bar is None:
            return
        if total is not None and self.bar.total != total:
            self.bar.total = total
            self.bar.bar_format = self.COUNTED
        self.bar.n = done
        self.bar.refresh()

    def chunk(self, seconds: float) -> None:
        self.seconds += seconds
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.seconds:.1f} s of audio", refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _chunks(model, text: str | Iterator[str], args, progress: _Progress):
    kwargs = {"voice": args.voice, "seed": args.seed, "max_frames": args.max_frames}
    if not isinstance(text, str):  # stdin: each sentence as it arrives
        chunks = model.stream_text(text, **kwargs)
    else:
        if _accepts(model.stream, "progress"):
            kwargs["progress"] = progress.model
        chunks = model.stream(text, **kwargs)
    for chunk in chunks:
        progress.chunk(len(chunk.samples) / chunk.sample_rate)
        yield chunk


def play(model, text: str | Iterator[str], args, progress: _Progress) -> float:
    """Stream chunks into the speakers as they are made; returns seconds played."""
    from .audio.devices import Speaker
    from .audio.resample import resample
    from .errors import DeviceError

    sr = model.sample_rate
    speaker = Speaker(sr, max(1, sr // 25), device=_device(args.device),  # 40 ms blocks
                      prebuffer_seconds=0.2, hint=NO_SPEAKER_HINT)
    seconds = 0.0
    try:
        with speaker:
            for chunk in _chunks(model, text, args, progress):
                x = chunk.samples
                if chunk.sample_rate != sr:
                    x = resample(x, chunk.sample_rate, sr)
                speaker.write(x)
                seconds += len(x) / sr
            progress.close()  # the bar is done; the speaker still plays the tail
    except KeyboardInterrupt:
        if speaker.failure:  # why nothing more could be heard, e.g. a stalled device
            log(f"warning: {speaker.failure}")
        raise
    if speaker.failure:
        raise DeviceError(f"{speaker.failure}: playback stopped{NO_SPEAKER_HINT}")
    if speaker.underruns:
        log(f"warning: playback ran dry {speaker.underruns} time(s): generation was slower "
            "than real time here (try -o FILE)")
    return seconds


def write(model, text: str | Iterator[str], args, fmt: str, progress: _Progress) -> float:
    """Collect every chunk, then write the file in one go (never a truncated file)."""
    from .audio.clip import Audio
    from .audio.io import write_audio

    chunks = list(_chunks(model, text, args, progress))
    progress.close()
    if not chunks:
        raise MlxSpeechError("the model produced no audio for this text")
    audio = Audio.concat(chunks)
    write_audio(args.output, audio.samples, audio.sample_rate, fmt)
    return audio.duration


def _run(args) -> None:
    import mlx_speech

    if args.max_frames is not None and args.max_frames <= 0:
        raise MlxSpeechError("--max-frames must be a positive number of frames")
    text = None
    if not args.list_voices:
        text = read_text(args.text)
    fmt = None
    if args.output:  # fail before loading a multi-GB model
        from .audio.io import check_writable, output_format

        fmt = output_format(args.output, args.format)
        check_writable(args.output)
    elif args.format:
        raise MlxSpeechError("--format needs -o FILE (playback has no format)")
    elif not args.list_voices:
        from .audio.devices import check_output_device

        check_output_device(_device(args.device), hint=NO_SPEAKER_HINT)

    model = mlx_speech.load(args.model, kind="tts", log=log,  # voice and text: checked first
                            options={"voice": args.voice,  # streamed stdin: read as it comes
                                     "text": text if isinstance(text, str) else None},
                            **({"dtype": args.dtype} if args.dtype else {}),
                            **quantize_kwargs(args))
    check_loaded(args.model, model, "tts")
    if args.list_voices:
        voices = list(model.voices or [])
        print("\n".join(voices) if voices else "(this checkpoint has no voices)")
        return
    show = sys.stderr.isatty() or (isinstance(text, str) and len(text) >= LONG_TEXT_CHARS)
    progress = _Progress(show)
    try:
        if args.output:
            seconds = write(model, text, args, fmt, progress)
            log(f"wrote {args.output} ({seconds:.1f} s of audio)")
        else:
            play(model, text, args, progress)
    finally:
        progress.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.output is not None:
        args.output = str(Path(args.output).expanduser())
    return run_cli(_run, args)


if __name__ == "__main__":
    from mlx_speech.cliutil import exit_with

    exit_with(main())
