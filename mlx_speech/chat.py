"""mlx_speech.chat: talk with Moshi or PersonaPlex (full duplex, 80 ms frames).

    mlx_speech.chat                                     # mic in, speakers out
    mlx_speech.chat --model nvidia/personaplex-7b-v1 --voice NATF2 --role "You are a patient tutor."
    mlx_speech.chat --input question.wav -o answer.wav  # offline, the same step loop

One thread owns MLX: it takes a microphone frame, runs one model step (Mimi
encode, LM + depformer, Mimi decode) and queues the answer frame for the
speaker. The audio callbacks only touch queues. When steps fall behind the
microphone, the oldest frames are dropped (counted) so latency stays bounded;
a speaker underrun plays silence (counted). Neither stops the conversation.
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

import numpy as np

from .cliutil import ArgumentParser, add_quantize_args, log, quantize_kwargs, ranged, run_cli
from .errors import MlxSpeechError
from .registry import check_loaded

DEFAULT_DUPLEX_MODEL = "kyutai/moshiko-pytorch-bf16"


class Stats:
    """Per-step timing against the frame budget, plus frames lost either way."""

    def __init__(self, frame_s: float):
        self.frame_s = frame_s
        self.steps = 0
        self.total_s = 0.0
        self.worst_s = 0.0
        self.late = 0  # steps slower than one frame
        self.dropped = 0  # microphone frames skipped to catch up

    def add(self, seconds: float) -> None:
        self.steps += 1
        self.total_s += seconds
        self.worst_s = max(self.worst_s, seconds)
        self.late += seconds > self.frame_s

    def summary(self) -> str:
        if not self.steps:
            return "no frames processed"
        mean = self.total_s / self.steps
        return (f"{self.steps} frames, {1000 * mean:.1f} ms per step on average "
                f"({100 * mean / self.frame_s:.0f}% of the {1000 * self.frame_s:.0f} ms budget), "
                f"worst {1000 * self.worst_s:.1f} ms, {self.late} late, "
                f"{self.dropped} mic frames dropped")


def _session(model, args):
    return model.session(voice=args.voice, role=args.role, seed=args.seed, temp=args.temp,
                         temp_text=args.temp_text, user_lag=args.user_lag)


def _frames(audio: np.ndarray, frame: int):
    n = -(-len(audio) // frame) * frame
    padded = np.zeros(n, np.float32)
    padded[: len(audio)] = audio
    return padded.reshape(-1, frame)


def offline(model, args) -> None:
    """Feed a file through the same step loop; write the model's side to -o."""
    from .audio.io import load_audio, write_audio

    sr, frame = model.sample_rate, model.frame_size
    audio, _ = load_audio(args.input, sr, log=log)
    tail = np.zeros(int(round(args.tail * sr)), np.float32)  # room for the answer
    session = _session(model, args)
    stats, out = Stats(frame / sr), []
    for user in _frames(np.concatenate([audio, tail]), frame):
        t0 = time.perf_counter()
        pcm, text = session.step(user)
        stats.add(time.perf_counter() - t0)
        out.append(pcm)
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    if args.output:
        write_audio(args.output, np.concatenate(out), sr, args.format)
        log(f"wrote {args.output}")
    log(stats.summary())


SPEAKER_MAX_LAG_S = 2.0  # answer audio waiting beyond this is dropped (counted), not queued


def live(model, args, max_lag_frames: int = 3) -> None:
    from .audio.devices import QUIET_REPORT_S, Microphone, Speaker
    from .cliutil import stop_on_ctrl_c

    sr, frame = model.sample_rate, model.frame_size
    session = _session(model, args)
    stats = Stats(frame / sr)
    pending: collections.deque[np.ndarray] = collections.deque()
    speaker_warned = False
    with Speaker(sr, frame, max_seconds=SPEAKER_MAX_LAG_S) as speaker, \
            Microphone(sr, frame) as mic, stop_on_ctrl_c() as stop:
        log("listening; speak to the model (Ctrl-C to stop)")
        try:
            while not stop.is_set():
                if not speaker_warned and (problem := speaker.problem()):
                    log(f"warning: {problem}; the conversation goes on (Ctrl-C to stop)")
                    speaker_warned = True
                if not pending:
                    block = mic.read_watched(0.1, lambda m: log(f"warning: {m}"))
                    if block is None:
                        if mic.ended:
                            break
                        continue
                    pending.append(block)
                while (more := mic.read(timeout=0)) is not None:
                    pending.append(more)
                while len(pending) > max_lag_frames:  # behind: keep latency bounded
                    pending.popleft()
                    stats.dropped += 1
                t0 = time.perf_counter()
                pcm, text = session.step(pending.popleft())
                stats.add(time.perf_counter() - t0)
                speaker.offer(pcm)  # never blocks: a stalled speaker must not stop the loop
                if text:
                    sys.stdout.write(text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            pass
        finally:
            sys.stdout.write("\n")
            sys.stdout.flush()
            speaker.close(abort=True)  # the user is done: do not play out the backlog
            for problem in (mic.problem(QUIET_REPORT_S), speaker.failure):
                if problem:
                    log(f"warning: {problem}")
            stats.dropped += mic.dropped
            lost = f", {speaker.dropped} speaker frames dropped" if speaker.dropped else ""
            log(f"{stats.summary()}, {speaker.underruns} speaker underruns{lost}")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="mlx_speech.chat", description=__doc__)
    p.add_argument("--model", default=DEFAULT_DUPLEX_MODEL,
                   help=f"hub id or folder (default {DEFAULT_DUPLEX_MODEL})")
    p.add_argument("--voice", help="voice prompt: a name from --list-voices, a .pt/.safetensors "
                                   "voice or a .wav (PersonaPlex)")
    p.add_argument("--role", help="role / system text prompt (PersonaPlex)")
    p.add_argument("--input", help="offline: a recording of the user instead of the microphone")
    p.add_argument("-o", "--output", help="offline: write the model's audio here")
    p.add_argument("--format", help="output format (default: from the -o suffix)")
    p.add_argument("--tail", type=float, default=4.0,
                   help="offline: seconds of silence after the input for the answer (default 4)")
    p.add_argument("--seed", type=ranged(int, 0, 2**63 - 1), default=0,
                   help="sampling seed (default 0)")
    p.add_argument("--temp", type=ranged(float, 0.0), help="audio temperature (0 = greedy)")
    p.add_argument("--temp-text", type=ranged(float, 0.0),
                   help="text temperature (0 = greedy)")
    p.add_argument("--user-lag", type=int, choices=(0, 1),
                   help="frames between the user's audio and the step that consumes it "
                        "(default: the model family's reference behaviour)")
    add_quantize_args(p)
    p.add_argument("--list-voices", action="store_true", help="list the checkpoint's voices")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    return p


def _run(args) -> None:
    if args.output and not args.input:
        raise MlxSpeechError("-o needs --input (live mode plays through the speakers)")
    if args.tail < 0:
        raise MlxSpeechError("--tail must be >= 0")
    if args.output:
        from .audio.io import check_writable, output_format

        output_format(args.output, args.format)
        check_writable(args.output)
    elif args.format:
        raise MlxSpeechError("--format needs -o FILE")
    if args.input:
        from .audio.io import check_readable

        check_readable(args.input)
    voice = Path(args.voice).expanduser() if args.voice else None
    if voice is not None and voice.suffix and not voice.is_file():  # a file, not a voice name
        raise MlxSpeechError(f"no such voice file: {args.voice}")
    if not args.input and not args.list_voices:
        from .audio.devices import check_live_audio

        check_live_audio(speaker=True)
    import mlx_speech

    model = mlx_speech.load(args.model, kind="duplex", log=log,  # prompts: checked first
                            options={"voice": args.voice, "role": args.role},
                            **quantize_kwargs(args))
    check_loaded(args.model, model, "duplex")
    if args.list_voices:
        print("\n".join(model.voices) if model.voices else "(this checkpoint has no voices)")
        return
    if args.input:
        if not args.output:
            log("note: without -o the model's answer is not kept (only its text is printed); "
                "add -o answer.wav to write it")
        offline(model, args)
    else:
        live(model, args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(_run, args)


if __name__ == "__main__":
    from mlx_speech.cliutil import exit_with

    exit_with(main())
