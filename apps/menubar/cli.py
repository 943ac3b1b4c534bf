"""mlx_speech.app: dictation anywhere and speak-selection from the macOS menu bar.

    mlx_speech.app                          # the menu-bar app (macOS)
    mlx_speech.app --install-app            # "MLX Speech.app" in ~/Applications: its own identity
    mlx_speech.app --login-item on|off      # start it at your next login (a LaunchAgent)
    mlx_speech.app --doctor                 # one screen to check (and paste in a bug report)
    mlx_speech.app --simulate [--asr-model ID] [--tts-model ID]   # headless: stdin -> JSON lines
    mlx_speech.app --preview DIR            # one PNG per state, and each menu as text

Hold the dictation hotkey (right Option) to talk, tap it for hands-free; Esc cancels.
"""

from __future__ import annotations

import argparse
import sys

from mlx_speech.cliutil import ArgumentParser, log, run_cli
from mlx_speech.errors import MlxSpeechError


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="mlx_speech.app", description=__doc__)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--simulate", action="store_true",
                      help="headless: real models and audio devices, hotkeys from stdin")
    mode.add_argument("--preview", metavar="DIR", help="write one PNG per state into DIR")
    mode.add_argument("--install-app", nargs="?", const="", metavar="DIR",
                      help="build MLX Speech.app from this Python (default ~/Applications; "
                           "elsewhere than macOS only into a DIR you name, for testing)")
    mode.add_argument("--login-item", choices=("on", "off"),
                      help="start the app at your next login, or stop doing so")
    mode.add_argument("--doctor", action="store_true",
                      help="check permissions, hotkeys, microphone, bundle and versions")
    p.add_argument("--sign", metavar="IDENTITY", default="-",
                   help="--install-app: codesign identity (default '-': ad hoc; a real one "
                        "keeps the permissions across Python upgrades)")
    p.add_argument("--report", metavar="FILE", help=argparse.SUPPRESS)  # --doctor's output
    p.add_argument("--asr-model", help="speech-to-text model (hub id or folder)")
    p.add_argument("--tts-model", help="text-to-speech model (hub id or folder)")
    p.add_argument("--voice", help="TTS voice (default: the model's)")
    p.add_argument("--max-frames", type=int, help="TTS: at most this many 80 ms frames")
    p.add_argument("--latency-ms", "--delay-ms", dest="latency_ms", type=int,
                   help="the speech model's streaming latency (default: the model's; Voxtral "
                        "takes a multiple of 80, Nemotron 80, 160, 560 or 1120; --delay-ms is "
                        "its older name)")
    p.add_argument("--no-preload", action="store_true",
                   help="load the speech model on first use instead of at start")
    p.add_argument("--save-audio", metavar="DIR",
                   help="--simulate: keep the audio each dictation's session received")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    return p


def _settings(args, base=None):
    from .settings import Settings

    s = base or Settings()
    changes = {k: v for k, v in (("asr_model", args.asr_model), ("tts_model", args.tts_model),
                                 ("voice", args.voice), ("tts_max_frames", args.max_frames))
               if v is not None}
    if args.latency_ms is not None:  # for the speech model this run uses
        asr = changes.get("asr_model", s.asr_model)
        changes["latency_ms"] = {**s.latency_ms, asr: check_latency(asr, args.latency_ms)}
    if args.no_preload:
        changes["preload_asr"] = False
    return s.replace(**changes)


def check_latency(model_id: str, ms: int) -> int:
    """--latency-ms against the speech model's family when its type is known before loading
    (a picker's model, a local folder), else as a multiple of 80 ms (the model checks the
    rest when it loads)."""
    from pathlib import Path

    from mlx_speech.hub import detect_model_type
    from mlx_speech.registry import MODELS, family

    from .settings import ASR_TYPES

    model_type = ASR_TYPES.get(model_id)
    folder = Path(model_id).expanduser()
    if model_type is None and folder.is_dir():
        try:
            model_type = detect_model_type(folder)
        except MlxSpeechError:
            model_type = None  # the load says what is wrong with it
    if model_type in MODELS and family(model_type).kind == "asr":
        return family(model_type).latency.check(ms)
    if ms <= 0 or ms % 80:
        raise MlxSpeechError(f"--latency-ms must be a multiple of 80, got {ms}")
    return ms


def _run(args) -> None:
    if args.max_frames is not None and args.max_frames <= 0:
        raise MlxSpeechError("--max-frames must be a positive number of frames")
    if args.save_audio and not args.simulate:
        raise MlxSpeechError("--save-audio is for --simulate")
    if args.doctor:
        from .doctor import main as doctor

        doctor(report=args.report)
        return
    if args.preview:
        from .preview import write_previews

        for name, text in write_previews(args.preview):
            print(f"== {name}\n{text}\n")
        return
    if args.simulate:
        from . import simulate

        simulate.run(_settings(args), save_audio=args.save_audio)
        return
    if args.install_app is not None:
        from .bundle import install_app

        if not args.install_app:  # no DIR: ~/Applications, which only macOS has
            if sys.platform != "darwin":
                raise MlxSpeechError("the app bundle is for macOS: on this system --install-app "
                                     "writes nothing to ~/Applications; name a folder to build "
                                     "it in for testing (--install-app DIR)")
            args.install_app = "~/Applications"
        path, notes = install_app(args.install_app, identity=args.sign)
        for note in notes:
            log(f"note: {note}")
        if sys.platform == "darwin":
            log(f"wrote {path}: open it, then allow Input Monitoring, Accessibility and the "
                "Microphone for MLX Speech when macOS asks (mlx_speech.app --doctor checks)")
        else:
            log(f"wrote {path} (the bundle only works on macOS)")
        return
    if args.login_item is not None:
        from .bundle import set_login_item

        log(set_login_item(args.login_item == "on"))
        return
    if sys.platform != "darwin":
        raise MlxSpeechError("the menu-bar app needs macOS; try --simulate or --preview DIR")
    from . import macos
    from .settings import load_settings

    macos.run(_settings(args, load_settings()))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli(_run, args)


if __name__ == "__main__":
    from mlx_speech.cliutil import exit_with

    exit_with(main())
