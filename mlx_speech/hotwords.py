"""Command-line vocabulary options (`--hotwords`, `--hotwords-file`, `--boost`), shared by
the commands that run an ASR session."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from .errors import MlxSpeechError
from .text.context_graph import DEFAULT_BOOST, check_boost, parse_hotwords


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
                parse_hotwords([line])
            except MlxSpeechError as e:
                why = re.sub(r"^hotword 1\b", f"line {i}", str(e))
                raise MlxSpeechError(f"hotwords file {path}: {why}") from None
    return lines


def from_args(args) -> dict:
    """Session keywords ({} without phrases); checked before any model loads."""
    phrases = parse_hotwords(args.hotwords) if args.hotwords else []
    if args.hotwords_file:
        phrases = parse_hotwords(phrases + read_file(args.hotwords_file))
    if args.boost is not None:
        check_boost(args.boost)
        if not phrases:
            raise MlxSpeechError("--boost needs --hotwords or --hotwords-file")
    if not phrases:
        return {}
    return {"hotwords": phrases, "boost": DEFAULT_BOOST if args.boost is None else args.boost}
