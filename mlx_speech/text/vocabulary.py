"""A vocabulary: the phrases a transcription should favour and how strongly.

Parsed and checked once, at the edge where a value comes in (CLI flags, REST fields, realtime
events, the app's settings, the Python API's `hotwords=`), into one `Vocabulary` that travels
inward unchanged to the session; each model turns it into its own context graph (cached per
model). Parsing costs time linear in the input, and its size is bounded before any work: a
string longer than `MAX_INPUT_CHARS` or a list longer than `MAX_PHRASES` items is refused
before it is split or read. A model's graph of a list holds at most `MAX_GRAPH_TOKENS` tokens
(every phrase as the model reads it: Voxtral reads each twice, with and without a leading
space); a list past it is refused when its graph is built, before any more of it is read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import MlxSpeechError

DEFAULT_BOOST = 1.0  # the weight of the graph's scores on the logits (NeMo's alpha)
MAX_PHRASES = 10000
MAX_PHRASE_CHARS = 200
MAX_BOOST = 100.0
MAX_GRAPH_TOKENS = 100_000  # tokens in one list's context graph (its build stays well under 1 s)
# a comma-separated string of MAX_PHRASES longest phrases, with the separators
MAX_INPUT_CHARS = MAX_PHRASES * (MAX_PHRASE_CHARS + 1)


def phrases(hotwords: str | Iterable[str] | None) -> list[str]:
    """A list or a comma/newline-separated string -> clean phrases (white space folded, order
    kept, duplicates dropped), in time linear in the input; sizes are checked first."""
    if hotwords is None:
        return []
    if isinstance(hotwords, str):
        if len(hotwords) > MAX_INPUT_CHARS:
            raise MlxSpeechError(f"hotwords: at most {MAX_PHRASES} phrases of at most "
                                 f"{MAX_PHRASE_CHARS} characters ({MAX_INPUT_CHARS} characters "
                                 f"in all), got {len(hotwords)} characters")
        items: Iterable = hotwords.replace("\n", ",").split(",")
    elif isinstance(hotwords, (list, tuple)):
        if len(hotwords) > MAX_PHRASES:
            raise MlxSpeechError(f"at most {MAX_PHRASES} hotwords, got {len(hotwords)}")
        items = hotwords
    else:
        raise MlxSpeechError("hotwords must be a list of phrases or a comma-separated string")
    seen: dict[str, None] = {}  # insertion-ordered set: linear, not a list lookup
    for n, p in enumerate(items, 1):
        if not isinstance(p, str):
            raise MlxSpeechError("hotwords must be strings")
        if len(p) > MAX_PHRASE_CHARS and len(" ".join(p.split())) > MAX_PHRASE_CHARS:
            raise MlxSpeechError(f"hotword {n} is longer than {MAX_PHRASE_CHARS} characters")
        p = " ".join(p.split())
        if p:
            seen[p] = None
    if len(seen) > MAX_PHRASES:
        raise MlxSpeechError(f"at most {MAX_PHRASES} hotwords, got {len(seen)}")
    return list(seen)


def check_boost(boost) -> float:
    """The boost weight as a float in [0, MAX_BOOST]; a one-line error otherwise."""
    if isinstance(boost, bool):
        raise MlxSpeechError(f"boost must be a number, got {boost!r}")
    try:
        b = float(boost)
    except (TypeError, ValueError):
        raise MlxSpeechError(f"boost must be a number, got {boost!r}") from None
    if not (math.isfinite(b) and 0 <= b <= MAX_BOOST):
        raise MlxSpeechError(f"boost must be between 0 and {MAX_BOOST:g}, got {boost!r}")
    return b


@dataclass(frozen=True)
class Vocabulary:
    """Phrases to favour (clean, distinct, in order) and their boost weight."""

    phrases: tuple[str, ...]
    boost: float = DEFAULT_BOOST

    @classmethod
    def parse(cls, hotwords=None, boost=None) -> Vocabulary | None:
        """From a client's values (a list or a comma/newline-separated string; a number or
        None for the default): None when there is nothing to boost (no phrases, or boost 0).
        Raises MlxSpeechError with a one-line reason."""
        b = DEFAULT_BOOST if boost is None else check_boost(boost)
        found = phrases(hotwords)
        if not found or b == 0:
            return None
        return cls(tuple(found), b)


def session_keywords(vocabulary: Vocabulary | None) -> dict:
    """The session keywords that carry `vocabulary` to a model ({} for None): the one way
    every front door (CLI, server, app) hands its parsed vocabulary to `model.session`, which
    takes the value as it is (no second parse)."""
    return {} if vocabulary is None else {"vocabulary": vocabulary}
