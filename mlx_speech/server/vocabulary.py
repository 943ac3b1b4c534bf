"""The vocabulary's server side and the transcription extras: logprobs and word times in
OpenAI's shapes, and the session factory that carries a request's vocabulary (checked and
parsed once, by server/validate.py's rules: OpenAI's `prompt` read as a phrase list when it
is one, `prompt_phrases`).

The vocabulary's work stays off the event loop and off the engine's thread: a request's
values are parsed on a worker thread (`parse`), and its context graph is built on the one
vocabulary thread (`prepare`) before any session is made with it, so a list still building
stalls no stream: the stream that asked waits for it (a realtime `session.update` is answered
once its list is ready, and the audio after it is read then), every other stream steps on.
A realtime connection changes its vocabulary at most VOCABULARY_BURST times at once and once
per VOCABULARY_EVERY_S seconds after that (`ChangeRate`); a change past it is refused.
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import MlxSpeechError
from ..text.vocabulary import session_keywords
from .validate import Invalid, prompt_phrases, vocabulary  # noqa: F401 (re-exported)

VOCABULARY_BURST = 4  # vocabulary changes a realtime connection may make at once
VOCABULARY_EVERY_S = 1.0  # then one per this many seconds
# every context graph is built here, one at a time: never on the event loop or the engine
_GRAPHS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx_speech-vocabulary")


async def parse(hotwords=None, prompt=None, boost=None, param: str = "hotwords"):
    """`validate.vocabulary` on a worker thread (linear in the input, whose size the schemas
    bounded); Invalid(param, reason) for a bad list."""
    if hotwords is None and boost is None and not prompt:
        return None
    return await asyncio.to_thread(vocabulary, hotwords, prompt, boost, param)


async def prepare(model, vocab, param: str = "hotwords"):
    """Build (or find) `vocab`'s context graph for `model` on the vocabulary thread; returns
    the walk that keeps the graph alive (hold it while sessions may be made with `vocab`:
    the model's cache then finds it, and the engine never builds one). Invalid(param, reason)
    for a list past the graph's bounds."""
    if vocab is None:
        return None
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(_GRAPHS, model.booster, vocab)
    except MlxSpeechError as e:
        raise Invalid(param, str(e)) from None


class ChangeRate:
    """A token bucket: `take()` is True for at most `burst` changes at once, then one per
    `every_s` seconds."""

    def __init__(self, burst: int = VOCABULARY_BURST, every_s: float = VOCABULARY_EVERY_S):
        self.burst, self.every_s = burst, every_s
        self.tokens, self.t = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) / self.every_s)
        self.t = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def refused(self, param: str) -> Invalid:
        return Invalid(param, f"vocabulary changes are limited to {self.burst} at once and one "
                       f"every {self.every_s:g} s after that; this one was not applied (the "
                       "vocabulary stays as it was)", "rate_limited")


LOGPROBS_INCLUDE = "item.input_audio_transcription.logprobs"


def result_logprobs(model, result) -> list[dict]:
    """OpenAI's logprobs entries ({token, logprob, bytes}) of a whole result, joining to its
    text exactly (`common.token_entries`); special tokens (Voxtral's streaming pads and word
    markers) carry no text and are left out."""
    from .common import token_entries

    return token_entries(model.tokenizer, zip(result.token_ids, result.logprobs or [],
                                              strict=False), result.text)


def words_field(result) -> list[dict]:
    """The word times extension of completed items: the model's own timing (seconds from
    the item's first audio), as verbose_json's words."""
    return [{"word": w.text, "start": round(w.start, 3), "end": round(w.end, 3)}
            for w in result.words]


def new_logprobs(session):
    """The (id, logprob) pairs an ASR session decoded since the last call; None when the
    session does not keep logprobs (`session.lp` is None: no work then)."""
    lp = session.lp
    return lp.take() if lp is not None and lp.new else None


def session_factory(model, vocabulary=None, logprobs: bool = False,
                    language: str | None = None, **kw):
    """`model.session` with the vocabulary (a `Vocabulary` or None), logprobs, the language
    (checked by validate.language: passed on to a model that takes languages; a hint to one
    that takes none is not) and any streaming-mode keywords bound."""
    if language is not None and model.languages is not None:
        kw["language"] = language
    kw = {**kw, **session_keywords(vocabulary), **({"logprobs": True} if logprobs else {})}
    return functools.partial(model.session, **kw) if kw else model.session
