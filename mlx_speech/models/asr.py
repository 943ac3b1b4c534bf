"""What the ASR models share: results, offline-as-streaming, strict weight loading."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ..audio.io import check_audio, load_audio
from ..errors import CheckpointError, MlxSpeechError
from ..nn import quant
from ..text.context_graph import DEFAULT_BOOST  # noqa: F401 (re-exported to the models)

PIECE_SECONDS = 10  # offline transcription feeds the session this much at a time
CLEAR_CACHE_EVERY = 256  # batched steps between mx.clear_cache calls (every streaming model)


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


def group_words(items) -> list[Word]:
    """(piece bytes, start_s, end_s, is_word_marker) per token -> words.

    A word starts at a marker token (its time pins the word's start), at a piece
    with a leading space, or at the first piece after only whitespace.
    """
    words: list[Word] = []
    buf, start, end, pinned = b"", 0.0, 0.0, False

    def close():
        text = buf.decode("utf-8", "replace").strip()
        if text:
            words.append(Word(text, start, end))

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


def make_booster(owner, hotwords, boost: float, vocab: int,
                 tokenizations: Callable[[str], list[list[int]]],
                 transparent: Callable[[int], bool] | None = None):
    """A session's phrase-boosting walk (None: no phrases or boost 0). The graph of a phrase
    list is built once per model (`owner._graphs`) and shared by its sessions."""
    from ..text import context_graph as cg

    phrases, alpha = cg.parse_hotwords(hotwords), cg.check_boost(boost)
    if not phrases or alpha == 0:
        return None
    cache = owner.__dict__.setdefault("_graphs", cg.GraphCache())

    def build() -> cg.ContextGraph:
        seqs = []
        for p in phrases:
            for ids in tokenizations(p):
                if ids and ids not in seqs:
                    seqs.append(ids)
        return cg.ContextGraph(seqs, vocab)

    return cg.Booster(cache.get(tuple(phrases), build), alpha, transparent)


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
        b = tokenizer.token_bytes(tok) if not _special(tokenizer, tok) else b""
        out.append({"token": b.decode("utf-8", "replace"), "logprob": float(lp),
                    "bytes": list(b)})
    return out


def _special(tokenizer, tok: int) -> bool:
    f = getattr(tokenizer, "is_special", None)
    return bool(f and f(tok))


class StreamingASR:
    """Batched stepping shared by the streaming ASR wrappers.

    `feed_many` / `finish_many` are the one way sessions advance: `Session.feed`
    is a batch of one. Subclasses implement `_feed_batch(sessions, audios)` and
    `_finish_batch(sessions)`, given validated input (distinct, unfinished
    sessions of this owner, checked float32 audio).
    """

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


def check_sessions(owner, sessions) -> None:
    """Every session is `owner`'s, and none is listed twice (a batched call's sessions)."""
    seen = set()
    for s in sessions:
        if getattr(s, "owner", None) is not owner:
            raise MlxSpeechError("a session belongs to another model")
        if id(s) in seen:
            raise MlxSpeechError("a session may appear only once per call")
        seen.add(id(s))


def checked_pairs(owner, pairs) -> tuple[list, list[np.ndarray]]:
    """A batched feed's `[(session, chunk)]` checked before any session is fed: the sessions
    (`check_sessions`, none finished) and their chunks as float32 mono."""
    sessions = [s for s, _ in pairs]
    check_sessions(owner, sessions)
    for s in sessions:
        if s.finished:
            raise MlxSpeechError("session already finished; start a new one")
    return sessions, [check_audio(c) for _, c in pairs]


def transcribe_with(session, audio: np.ndarray | str | Path, sample_rate: int,
                    progress: Callable[[float, float], None] | None = None) -> Transcript:
    """Offline transcription is the streaming session fed in large pieces, so the
    two give the same tokens. `progress(done_s, total_s)` is called per piece."""
    rate = session.owner.sample_rate
    if isinstance(audio, (str, Path)):
        audio, _ = load_audio(audio, rate)
    else:
        audio = check_audio(audio)
        if sample_rate != rate:
            from ..audio.resample import resample

            audio = resample(audio, sample_rate, rate)
    piece, total = PIECE_SECONDS * rate, len(audio) / rate
    for i in range(0, len(audio), piece):
        session.feed(audio[i: i + piece])
        if progress is not None:
            progress(min(len(audio), i + piece) / rate, total)
    session.finish()
    return session.result()


def raise_missing(expected: set[str], got) -> None:
    missing = sorted(expected - set(got))
    if missing:
        more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint is missing key {missing[0]!r}{more}")


def raise_unmatched(expected: set[str], got, where) -> None:
    """A missing key, else a key no parameter takes: an error naming the first."""
    raise_missing(expected, got)
    extra = sorted(set(got) - expected)
    if extra:
        more = f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(f"{where}: unexpected key {extra[0]!r}{more}")


def load_strict(model, weights: dict[str, mx.array], where, dtype: mx.Dtype | None,
                quantize: int | None = None, group_size: int = 64,
                keep: quant.Keep | None = None, expect: dict | None = None) -> None:
    """Shapes checked, every parameter set, then one eval reads the mapped files.

    Modules the file stores quantized (`<path>.scales`) are swapped in first, with the
    bits / group size their tensors say (`expect`: what the checkpoint declares). `quantize`
    (bits) then quantizes the rest on the fly, except what `keep(path, module)` keeps, one
    module at a time; `weights` is emptied first (callers must hold no other reference to the
    file's arrays), so full-precision tensors are freed as soon as they are quantized.
    """
    if quantize is not None:
        quant.check_params(quantize, group_size)
    try:
        quant.quantize_from_weights(model, weights, expect)
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {e}") from None
    for k, p in tree_flatten(model.parameters()):
        if tuple(weights[k].shape) != tuple(p.shape):
            raise CheckpointError(f"weight {k!r} has shape {tuple(weights[k].shape)}, "
                                  f"config expects {tuple(p.shape)}")
    items = list(weights.items())
    if dtype is not None:  # packed quantized weights and fp-mode scales stay as they are
        items = [(k, v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v)
                 for k, v in items]
    if quantize is not None:
        weights.clear()
    model.load_weights(items, strict=True)
    del items
    model.eval()
    try:
        if quantize is not None:
            quant.quantize(model, quantize, group_size, keep=keep)
        mx.eval(model.parameters())
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        raise CheckpointError(f"cannot read weights in {where}: {msg}") from None
