"""Command-line vocabulary options (`--hotwords`, `--hotwords-file`, `--boost`), shared by
the commands that run an ASR session, parsed once into a `Vocabulary` (sessions take it through
`text.vocabulary.session_keywords`)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from .errors import MlxSpeechError
from .text.vocabulary import (
    DEFAULT_BOOST,
    Vocabulary,
    phrases,
    session_keywords,  # noqa: F401 (the commands hand it on)
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hotwords", metavar="A,B",
                   help="phrases to favour (comma-separated), e.g. 'Kubernetes,LinTO'")
    p.add_argument("--hotwords-file", metavar="FILE",
                   help="phrases to favour, one per line ('#' starts a comment)")
    p.add_argument("--boost", type=float, default=None, metavar="SCORE",
                   help=f"phrase boosting weight (default {DEFAULT_BOOST}; 0: off)")


def read_file(path: str | Path) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MlxSpeechError(f"cannot read hotwords file {path}: "
                             f"{getattr(e, 'strerror', None) or e}") from None
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    for i, line in enumerate(lines, 1):  # a phrase at fault is named by its line
        if line:
            try:
                phrases([line])
            except MlxSpeechError as e:
                why = re.sub(r"^hotword 1\b", f"line {i}", str(e))
                raise MlxSpeechError(f"hotwords file {path}: {why}") from None
    return lines


def from_args(args) -> Vocabulary | None:
    """The command line's vocabulary (None without phrases, or with --boost 0); checked
    before any model loads."""
    hotwords = args.hotwords or None
    if args.hotwords_file:  # the flag's phrases, then the file's lines (a line is one phrase)
        hotwords = phrases(hotwords) + read_file(args.hotwords_file)
    vocabulary = Vocabulary.parse(hotwords, args.boost)
    if vocabulary is None and args.boost is not None and (args.boost != 0 or not hotwords):
        raise MlxSpeechError("--boost needs --hotwords or --hotwords-file")
    return vocabulary
