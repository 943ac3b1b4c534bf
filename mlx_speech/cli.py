"""`mlx_speech <command> ...` dispatcher (as mlx_lm does)."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "transcribe": "mlx_speech.transcribe",
    "say": "mlx_speech.say",
    "chat": "mlx_speech.chat",
    "convert": "mlx_speech.convert",
    "server": "mlx_speech.server",
    "app": "mlx_speech.app",
    "doctor": "mlx_speech.doctor",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--version"]:
        from .cliutil import version_line

        print(version_line())
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        cmds = ", ".join(COMMANDS)
        msg = f"usage: mlx_speech <command> [args]  (or --version)\ncommands: {cmds}"
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown command {argv[0]!r}\n{msg}", file=sys.stderr)
            return 2
        print(msg)
        return 0
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


def _entry(command: str):
    def run():
        from .cliutil import exit_with

        exit_with(importlib.import_module(COMMANDS[command]).main())

    run.__name__ = command
    return run


# the console scripts (pyproject [project.scripts]): each command's main, ended by exit_with
transcribe, say, chat, convert, server, app, doctor = map(_entry, COMMANDS)


def dispatch() -> None:
    from .cliutil import exit_with

    exit_with(main())


if __name__ == "__main__":
    dispatch()
