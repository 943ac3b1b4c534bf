"""What the ASR families share at run time: results, words, phrase boosting from a vocabulary,
token logprobs, batched feeding, offline-as-streaming. (Loading is `models/loading.py`'s.)"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..audio import audio_at
from ..errors import MlxSpeechError
from ..text.context_graph import Booster, ContextGraph, GraphCache
from ..text.vocabulary import MAX_GRAPH_TOKENS, Vocabulary
from .base import check_sessions, checked_pairs

PIECE_SECONDS = 10  # offline transcription feeds the session this much at a time


@dataclass
class Word:
    text: str
    start: float
    end: float


@dataclass
class Transcript:
    text: str
    token_ids: list[int]
    words: list[Word] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # start (s) of each token
    # the model's log-probability of each token (sessions made with logprobs=True), else None
    logprobs: list[float] | None = None
    # the spoken language: what the model detected (its last language tag), else the language
    # the session was given; None when the model does not tell
    language: str | None = None


DRAIN_HOLD_MAX = 256  # tokens `drain` may hold back for a word that could still grow


def drain_cut(ids: list[int], token_bytes: Callable[[int], bytes],
              is_marker: Callable[[int], bool] = lambda t: False) -> int:
    """How many leading tokens a session's `drain` can release: all before the last word
    start (a word marker or a piece with a leading space), whose word may still grow; all of
    them when that word has held back more than DRAIN_HOLD_MAX tokens (memory stays bounded)."""
    texty = False
    for i in range(len(ids) - 1, -1, -1):
        b = token_bytes(ids[i])
        if is_marker(ids[i]) or b[:1].isspace():
            cut = i
            break
        texty |= bool(b)
    else:
        cut = 0 if texty else len(ids)
    return len(ids) if len(ids) - cut > DRAIN_HOLD_MAX else cut


def group_words(items, audio_s: float | None = None) -> list[Word]:
    """(piece bytes, start_s, end_s, is_word_marker) per token -> words.

    A word starts at a marker token (its time pins the word's start), at a piece
    with a leading space, or at the first piece after only whitespace. `audio_s`: the
    seconds of audio given; no time runs past it (tokens decoded from the end's padding
    would).
    """
    words: list[Word] = []
    buf, start, end, pinned = b"", 0.0, 0.0, False
    last = math.inf if audio_s is None else audio_s

    def close():
        text = buf.decode("utf-8", "replace").strip()
        if text:
            words.append(Word(text, min(start, last), min(end, last)))

    for piece, t0, t1, marker in items:
        if marker:
            close()
            buf, start, end, pinned = b"", t0, t1, True
            continue
        if not piece:
            continue
        empty = not buf.strip()
        if (piece[:1].isspace() and not empty) or (empty and not pinned):
            close()
            buf, start = b"", t0
        buf += piece
        end, pinned = t1, pinned and not buf.strip()
    close()
    return words


def session_vocabulary(vocabulary: Vocabulary | None, hotwords=None,
                       boost: float | None = None) -> Vocabulary | None:
    """What a session boosts: `vocabulary` (parsed once at the caller's edge), or the Python
    API's `hotwords=` / `boost=`, parsed here (`Vocabulary.parse`: one-line errors); not both."""
    if vocabulary is None:
        return Vocabulary.parse(hotwords, boost)
    if hotwords is not None or boost is not None:
        raise MlxSpeechError("give vocabulary= or hotwords= / boost=, not both")
    if not isinstance(vocabulary, Vocabulary):
        raise MlxSpeechError("vocabulary must be a mlx_speech.text.vocabulary.Vocabulary "
                             "(or pass hotwords=)")
    return vocabulary


def make_booster(graphs: GraphCache, vocabulary: Vocabulary | None, vocab: int,
                 tokenizations: Callable[[str], list[list[int]]],
                 transparent: Callable[[int], bool] | None = None) -> Booster | None:
    """A session's phrase-boosting walk (None: no vocabulary, or boost 0). The graph of a phrase
    list is built once per model (`graphs`, the model's own cache) and shared by its sessions;
    `tokenizations(phrase)`: the id sequences a phrase may appear as. Building costs time
    linear in the phrases' tokens, at most MAX_GRAPH_TOKENS of them (past it: MlxSpeechError,
    raised before the rest is read); it is thread-safe, so a server builds off its engine
    thread and holds the walk while sessions are made with the list."""
    if vocabulary is None or not vocabulary.phrases or vocabulary.boost == 0:
        return None

    def sequences():
        seen: set[tuple[int, ...]] = set()
        for p in vocabulary.phrases:
            for ids in tokenizations(p):
                key = tuple(ids)
                if key and key not in seen:
                    seen.add(key)
                    yield ids

    def build() -> ContextGraph:
        return ContextGraph(sequences(), vocab, max_tokens=MAX_GRAPH_TOKENS)

    return Booster(graphs.get(vocabulary.phrases, build), vocabulary.boost, transparent)


class TokenLogprobs:
    """What a session made with `logprobs=True` keeps: each token's log-probability beside
    token_ids, and the (id, logprob) pairs not taken yet (`take`, for streamed deltas).
    Sessions without it hold None and do no extra work."""

    def __init__(self):
        self.values: list[float] = []  # parallel to the session's token_ids
        self.new: list[tuple[int, float]] = []

    def add(self, tok: int, lp: float) -> None:
        self.values.append(lp)
        self.new.append((tok, lp))

    def take(self) -> list[tuple[int, float]]:
        out, self.new = self.new, []
        return out


def logprob_items(tokenizer, pairs) -> list[dict]:
    """OpenAI's logprobs entries: {token, logprob, bytes} per (id, logprob)."""
    out = []
    for tok, lp in pairs:
        b = tokenizer.token_bytes(tok) if not tokenizer.is_special(tok) else b""
        out.append({"token": b.decode("utf-8", "replace"), "logprob": float(lp),
                    "bytes": list(b)})
    return out


class StreamingASR:
    """Batched stepping shared by the streaming ASR wrappers.

    `feed_many` / `finish_many` are the one way sessions advance: `Session.feed`
    is a batch of one. Subclasses implement `_feed_batch(sessions, audios)` and
    `_finish_batch(sessions)`, given validated input (distinct, unfinished
    sessions of this owner, checked float32 audio).
    """

    @classmethod
    def check_session_options(cls, folder, what: str, latency_ms=None, **_) -> None:
        """Session options checked before any weights are read (`mlx_speech.load(...,
        options=...)`): `latency_ms` among the family's latencies."""
        if latency_ms is not None:
            cls.latency.check(latency_ms)

    def _check_sessions(self, sessions) -> None:
        check_sessions(self, sessions)

    def feed_many(self, pairs: Sequence[tuple[object, np.ndarray]]) -> list[str]:
        """Feed each session its chunk (16 kHz mono float32, any size, may be empty).

        Returns each session's new text, exactly as `[s.feed(c) for s, c in pairs]`
        would, with the model work of all sessions batched into shared steps. Input
        is checked first: a bad chunk, a finished session or a session listed twice
        raises before any session is fed. Call from the one thread that owns MLX work.
        """
        sessions, audios = checked_pairs(self, pairs)
        return self._feed_batch(sessions, audios) if sessions else []

    def finish_many(self, sessions: Sequence[object]) -> list[str]:
        """End of audio for each session: as `[s.finish() for s in sessions]`."""
        sessions = list(sessions)
        self._check_sessions(sessions)
        return self._finish_batch(sessions) if sessions else []


def transcribe_with(session, audio: np.ndarray | str | Path, sample_rate: int,
                    progress: Callable[[float, float], None] | None = None) -> Transcript:
    """Offline transcription is the streaming session fed in large pieces, so the
    two give the same tokens. `progress(done_s, total_s)` is called per piece."""
    rate = session.owner.sample_rate
    if isinstance(audio, (str, Path)):  # decoded piece by piece: memory flat in its length
        from ..audio.decode import decode
        from ..audio.io import warn

        blocks = decode(audio, rate, block_s=PIECE_SECONDS, log=warn)
        total, done = blocks.info.duration or 0.0, 0
        for piece in blocks:
            session.feed(piece)
            done += len(piece)
            if progress is not None:
                progress(done / rate, max(total, done / rate))
        session.finish()
        return session.result()
    audio = audio_at(audio, rate, sample_rate)
    piece, total = PIECE_SECONDS * rate, len(audio) / rate
    for i in range(0, len(audio), piece):
        session.feed(audio[i: i + piece])
        if progress is not None:
            progress(min(len(audio), i + piece) / rate, total)
    session.finish()
    return session.result()
