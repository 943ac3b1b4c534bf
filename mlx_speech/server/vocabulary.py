"""Phrase boosting requests: the REST `hotwords` / `boost` fields, OpenAI's `prompt` read as a
phrase list when it is one, and the realtime `session.update` extension.

The `prompt` rule: a prompt is a phrase list when, split at commas and newlines, every item
is at most 4 words and 60 characters and none ends a sentence (`.`, `!`, `?`); e.g.
"Kubernetes, LinTO, mlx speech". Any other prompt (prose) is ignored, as before. An explicit
`hotwords` wins over `prompt`.
"""

from __future__ import annotations

import functools
import re

from ..errors import MlxSpeechError
from ..text.context_graph import DEFAULT_BOOST, check_boost, parse_hotwords

MAX_PROMPT_WORDS, MAX_PROMPT_CHARS = 4, 60


def prompt_phrases(prompt: str | None) -> list[str]:
    """OpenAI's `prompt` as a phrase list, or [] when it reads as prose."""
    if not isinstance(prompt, str) or not prompt.strip():
        return []
    items = [p.strip() for p in re.split(r"[,\n]", prompt)]
    items = [p for p in items if p]
    if not items or any(len(p.split()) > MAX_PROMPT_WORDS or len(p) > MAX_PROMPT_CHARS
                        or p[-1] in ".!?" for p in items):
        return []
    return parse_hotwords(items)


def request_vocabulary(hotwords=None, prompt=None, boost=None) -> dict:
    """Session keywords ({}: nothing to boost). `hotwords`: a list or a comma-separated
    string. Raises MlxSpeechError with a one-line reason."""
    if hotwords is not None and not isinstance(hotwords, (str, list)):
        raise MlxSpeechError("hotwords must be a list of phrases or a comma-separated string")
    phrases = parse_hotwords(hotwords) if hotwords else prompt_phrases(prompt)
    b = DEFAULT_BOOST if boost in (None, "") else check_boost(boost)
    if not phrases or b == 0:
        return {}
    return {"hotwords": phrases, "boost": b}


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
    """The (id, logprob) pairs a session decoded since the last call; None when the session
    does not keep logprobs (no work then)."""
    lp = getattr(session, "lp", None)
    return lp.take() if lp is not None and lp.new else None


def session_factory(model, vocab: dict, **kw):
    """`model.session` with the vocabulary (and any streaming-mode keywords) bound."""
    kw = {**kw, **vocab}
    return functools.partial(model.session, **kw) if kw else model.session
