"""The vocabulary's server rules and the transcription extras: OpenAI's `prompt` read as a
phrase list when it is one, logprobs and word times in OpenAI's shapes, and the session
factory that carries a request's vocabulary (parsed once, in server/validate.py).

The `prompt` rule: a prompt is a phrase list when, split at commas and newlines, every item
is at most 4 words and 60 characters and none ends a sentence (`.`, `!`, `?`); e.g.
"Kubernetes, LinTO, mlx speech". Any other prompt (prose) is ignored, as before. An explicit
`hotwords` wins over `prompt`.
"""

from __future__ import annotations

import functools
import re

from ..text.vocabulary import session_keywords

MAX_PROMPT_WORDS, MAX_PROMPT_CHARS = 4, 60


def prompt_phrases(prompt: str | None) -> list[str]:
    """OpenAI's `prompt` as its phrases (for `Vocabulary.parse`), or [] when it reads as
    prose."""
    if not isinstance(prompt, str) or not prompt.strip():
        return []
    items = [p.strip() for p in re.split(r"[,\n]", prompt)]
    items = [p for p in items if p]
    if not items or any(len(p.split()) > MAX_PROMPT_WORDS or len(p) > MAX_PROMPT_CHARS
                        or p[-1] in ".!?" for p in items):
        return []
    return items


LOGPROBS_INCLUDE = "item.input_audio_transcription.logprobs"


def logprob_entries(model, pairs) -> list[dict]:
    """OpenAI's logprobs entries ({token, logprob, bytes}) for (id, logprob) pairs; special
    tokens (Voxtral's streaming pads and word markers) carry no text and are left out."""
    from ..models.asr import logprob_items

    tk = model.tokenizer
    return [e for e in logprob_items(tk, pairs) if e["bytes"]]


def result_logprobs(model, result) -> list[dict]:
    return logprob_entries(model, zip(result.token_ids, result.logprobs or [], strict=False))


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
