"""What every command-line entry point shares: stderr logging and the error contract."""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
from collections.abc import Callable

from .errors import MlxSpeechError, is_mlx_import_error, missing_backend

USAGE_ERROR = 2  # a bad option or argument, as argparse and the shells have it


def version_line() -> str:
    from . import DISTRIBUTION, __version__

    return f"mlx_speech {__version__} ({DISTRIBUTION})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the error contract: a bad option is one `error: ...` line (exit 2, a
    usage error; bad input found later is exit 1). The description (the module's docstring) is
    printed as written. Every command has `--version`."""

    def __init__(self, *args, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)
        self.add_argument("--version", action="version", version=version_line(),
                          help="print the version and exit")

    def error(self, message: str):
        self.exit(USAGE_ERROR, f"error: {message} (see {self.prog} --help)\n")


def ranged(kind: type, low=None, high=None, *, above=None):
    """An argparse `type` that refuses values outside [low, high] (or not above `above`) with
    one line naming the range, before anything else runs: `type=ranged(int, 1, 65535)`."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a{'n integer' if kind is int else ' number'}"
                                             f": {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be more than {above}, got {text}")
        if (low is not None and value < low) or (high is not None and value > high):
            rule = (f"between {low} and {high}" if low is not None and high is not None
                    else f"at least {low}" if low is not None else f"at most {high}")
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid int value" wording is not used
    return parse


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def stop_on_ctrl_c():
    """For live loops: the first Ctrl-C sets the yielded Event (the loop finishes its
    step, flushes and reports); a second one interrupts at once. Elsewhere than in the
    main thread nothing changes (the Event just never fires)."""
    stop = threading.Event()

    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield stop
        return
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def exit_with(code: int):
    """End the process with a command's exit code. The command has ended: a Ctrl-C that comes
    while the interpreter winds down (MLX freeing its streams, files closing) is ignored rather
    than killing the process by SIGINT mid-exit, which a caller would read as a crash."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass
    sys.exit(code)


def run_cli(run: Callable[[object], None], args) -> int:
    """Run `run(args)`: bad input is one `error: ...` line and exit 1, Ctrl-C exit 130.

    Anything else is one line too: an OSError names its file, an unexpected exception says it
    is a bug to report, exit 2. `--verbose` (where a command has it) re-raises for the full
    traceback.
    """
    verbose = getattr(args, "verbose", False)
    try:
        run(args)
    except MlxSpeechError as e:
        if verbose:
            raise
        log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except OSError as e:  # the disk, the network, a device: the system's own words
        if verbose:
            raise
        where = f": {e.filename}" if e.filename else ""
        log(f"error: {e.strerror or e}{where}")
        return 1
    except Exception as e:  # a bug: one line, and how to get the traceback to report it
        if verbose:
            raise
        if is_mlx_import_error(e):  # not a bug: MLX installed without its backend
            log(f"error: {missing_backend(e)}")
            return 1
        first = (str(e).splitlines() or [""])[0]
        log(f"error: unexpected failure ({type(e).__name__}{': ' + first if first else ''}); "
            "this is a bug: please report it with the output of --verbose and mlx_speech doctor")
        return 2
    return 0


def add_quantize_args(p) -> None:
    """`--quantize N` / `--group-size G`: quantize a full-precision checkpoint on load."""
    p.add_argument("--quantize", type=int, choices=(2, 3, 4, 5, 6, 8), metavar="BITS",
                   help="quantize the weights on load to 4, 6 or 8 bits (2, 3, 5 also work); "
                        "already quantized checkpoints load as they are")
    p.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128),
                   help="quantization group size (default 64)")


def add_window_args(p, ranged_by_argparse: bool = False) -> None:
    """`--decoder-window N` / `--encoder-window M`: Voxtral Realtime's memory lever (with
    `ranged_by_argparse`, below 1 is a usage error; else the family's loader refuses it)."""
    kind = ranged(int, 1) if ranged_by_argparse else int
    p.add_argument("--decoder-window", type=kind, metavar="N",
                   help="Voxtral Realtime: attend to the last N decoder positions (default "
                        "the model's 8192): less memory per stream, slightly different text")
    p.add_argument("--encoder-window", type=kind, metavar="M",
                   help="Voxtral Realtime: attend to the last M encoder frames (default 750)")


def window_kwargs(args) -> dict:
    """The `mlx_speech.load` keyword arguments for `add_window_args`' options."""
    return {k: v for k, v in (("decoder_window", args.decoder_window),
                              ("encoder_window", args.encoder_window)) if v is not None}


def quantize_kwargs(args) -> dict:
    """The `mlx_speech.load` keyword arguments for `add_quantize_args`' options."""
    if args.quantize is None:
        return {}
    return {"quantize": args.quantize, "group_size": args.group_size}
