"""Checks at the edge: one schema per client message, REST body and query.

Every value a client sends is checked here, by type and range, before any of it reaches a
handler's logic or the engine; the vocabulary (hotwords, boost, OpenAI's prompt as phrases) is
parsed here once into a `Vocabulary`, and a REST request's speaker labels (diarize) decided. A
bad value raises `Invalid(param, message)`; each route answers it in its protocol's own error
shape (an `invalid_request_error` event on the realtime socket, a 400 JSON body naming the
field on REST, an 0x05 message on Kyutai's socket).

Schemas are small callables `(value, param) -> value`; objects check only the fields they
name (clients send extra fields, which are ignored as OpenAI's and vLLM's servers do). bool
is never taken for an int or a number, and a list or object is never taken for a string.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from ..errors import MlxSpeechError
from ..models.base import DELAY_NAMES

SEED_MAX = 2**63 - 1
# what real clients send: telephony 8 kHz up to 48 kHz (OpenAI's default is 24 kHz)
STREAM_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
# uploaded files may also be hi-res; a rate outside this list is refused (its resampling
# filter, sized by the rates' ratio, could be hundreds of MB)
FILE_RATES = STREAM_RATES + (88200, 96000, 176400, 192000)
MAX_TEXT_CHARS = 4096  # one /v1/audio/speech input (OpenAI's own limit)
MAX_ROLE_CHARS = 4000  # a PersonaPlex role prompt
MAX_NAME_CHARS = 512  # model ids, voice names, formats
MAX_MS = 600_000  # turn-detection durations (10 min)

Check = Callable[[object, str], object]


class Invalid(ValueError):
    """A client value failed its check: `param` names the field (dotted path)."""

    def __init__(self, param: str, message: str, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code  # code: the error code, when not the route's own


def _type_name(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def string(choices: Iterable[str] | None = None, max_len: int = MAX_NAME_CHARS,
           nonempty: bool = False) -> Check:
    allowed = tuple(choices) if choices is not None else None

    def check(v, param):
        if not isinstance(v, str):
            raise Invalid(param, f"{param} must be a string, got {_type_name(v)}")
        if len(v) > max_len:
            raise Invalid(param, f"{param} is longer than {max_len} characters")
        if nonempty and not v.strip():
            raise Invalid(param, f"{param} must be non-empty text")
        if allowed is not None and v not in allowed:
            shown = v if len(v) <= 40 else v[:40] + "..."
            raise Invalid(param, f"{param} must be one of {', '.join(allowed)}, got {shown!r}")
        return v

    return check


def integer(lo: int, hi: int, choices: Iterable[int] | None = None) -> Check:
    allowed = tuple(choices) if choices is not None else None

    def check(v, param):
        if not isinstance(v, int) or isinstance(v, bool):
            raise Invalid(param, f"{param} must be an integer, got {_type_name(v)}")
        if allowed is not None and v not in allowed:
            raise Invalid(param, f"{param} must be one of {', '.join(map(str, allowed))}")
        if not lo <= v <= hi:
            raise Invalid(param, f"{param} must be in {lo}..{hi}")
        return v

    return check


def number(lo: float, hi: float) -> Check:
    def check(v, param):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
            raise Invalid(param, f"{param} must be a number, got {_type_name(v)}")
        if not lo <= v <= hi:
            raise Invalid(param, f"{param} must be in [{lo:g}, {hi:g}]")
        return v

    return check


def boolean(v, param):
    if not isinstance(v, bool):
        raise Invalid(param, f"{param} must be true or false, got {_type_name(v)}")
    return v


def nullable(inner: Check) -> Check:
    def check(v, param):
        return None if v is None else inner(v, param)

    return check


def anything(v, param):
    return v


def obj(fields: dict[str, Check], required: Iterable[str] = ()) -> Check:
    """A JSON object; the named fields checked when present (null is "absent" only where a
    field's check is `nullable`)."""
    need = tuple(required)

    def check(v, param):
        if not isinstance(v, dict):
            raise Invalid(param, f"{param} must be an object, got {_type_name(v)}")
        for k in need:
            if k not in v:
                raise Invalid(f"{param}.{k}", f"{param}.{k} is required")
        for k, c in fields.items():
            if k in v:
                c(v[k], f"{param}.{k}" if param else k)
        return v

    return check


def list_of(inner: Check, max_len: int = 16) -> Check:
    def check(v, param):
        if not isinstance(v, list):
            raise Invalid(param, f"{param} must be a list, got {_type_name(v)}")
        if len(v) > max_len:
            raise Invalid(param, f"{param} has more than {max_len} entries")
        for i, x in enumerate(v):
            inner(x, f"{param}[{i}]")
        return v

    return check


# ---------------------------------------------------------------- the vocabulary


MAX_PROMPT_WORDS, MAX_PROMPT_CHARS = 4, 60


def prompt_phrases(prompt: str | None) -> list[str]:
    """OpenAI's `prompt` as its phrases (for `Vocabulary.parse`), or [] when it reads as
    prose. The rule: a prompt is a phrase list when, split at commas and newlines, every item
    is at most 4 words and 60 characters and none ends a sentence (`.`, `!`, `?`); e.g.
    "Kubernetes, LinTO, mlx speech". Any other prompt (prose) is ignored. An explicit
    `hotwords` wins over `prompt`."""
    import re

    if not isinstance(prompt, str) or not prompt.strip():
        return []
    items = [p.strip() for p in re.split(r"[,\n]", prompt)]
    items = [p for p in items if p]
    if not items or any(len(p.split()) > MAX_PROMPT_WORDS or len(p) > MAX_PROMPT_CHARS
                        or p[-1] in ".!?" for p in items):
        return []
    return items


def hotwords_value(v, param: str):
    """The sizes of a hotwords value, checked without parsing it (constant time for a string,
    one pass over a list's lengths): a comma-separated string of at most MAX_INPUT_CHARS
    characters, or a list of at most MAX_PHRASES strings of at most MAX_INPUT_CHARS in all.
    `vocabulary` then parses it (on a worker thread: server/vocabulary.py)."""
    from ..text.vocabulary import MAX_INPUT_CHARS, MAX_PHRASES

    if isinstance(v, str):
        if len(v) > MAX_INPUT_CHARS:
            raise Invalid(param, f"{param} is longer than {MAX_INPUT_CHARS} characters (at "
                          f"most {MAX_PHRASES} phrases)")
        return v
    if not isinstance(v, list):
        raise Invalid(param, f"{param} must be a list of phrases or a comma-separated string, "
                      f"got {_type_name(v)}")
    if len(v) > MAX_PHRASES:
        raise Invalid(param, f"at most {MAX_PHRASES} hotwords, got {len(v)}")
    if not all(isinstance(p, str) for p in v):
        raise Invalid(param, f"{param} must be strings")
    if sum(map(len, v)) > MAX_INPUT_CHARS:
        raise Invalid(param, f"{param} hold more than {MAX_INPUT_CHARS} characters in all")
    return v


def boost_value(v, param: str):
    """A boost: a number, or a number written as text (REST forms send text)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise Invalid(param, f"{param} must be a number, got {_type_name(v)}")
    if isinstance(v, str) and len(v) > 32:
        raise Invalid(param, f"{param} must be a number")
    return v


def vocabulary(hotwords=None, prompt=None, boost=None, param: str = "hotwords"):
    """A request's vocabulary (a `Vocabulary`, or None: nothing to boost), parsed once:
    `hotwords` (a list or a comma-separated string), else OpenAI's `prompt` when it reads as
    a phrase list (`prompt_phrases`), weighted by `boost` (None or "": the default). Sizes
    are checked before any parsing; the parse is linear in the input. Raises
    Invalid(param, reason)."""
    from ..text.vocabulary import Vocabulary

    if hotwords is not None:
        hotwords_value(hotwords, param)
    if boost not in (None, ""):
        boost_value(boost, param)
    try:
        return Vocabulary.parse(hotwords if hotwords else prompt_phrases(prompt),
                                None if boost in (None, "") else boost)
    except MlxSpeechError as e:
        raise Invalid(param, str(e)) from None


# ---------------------------------------------------------------- realtime events

_name = nullable(string())
_event_id = nullable(string(max_len=128))
_audio = string(max_len=1 << 30)  # base64; its size is bounded by the frame limit

_hotwords = nullable(hotwords_value)
_boost = nullable(boost_value)

VLLM_EVENTS: dict[str, Check] = {
    "session.update": obj({"model": _name, "event_id": _event_id, "diarize": nullable(boolean),
                           "hotwords": _hotwords, "boost": _boost, "language": _name}),
    "input_audio_buffer.append": obj({"audio": _audio}, required=("audio",)),
    "input_audio_buffer.commit": obj({"final": nullable(boolean)}),
}

_turn_detection = nullable(obj({
    "type": string(("server_vad", "semantic_vad")),
    "threshold": nullable(number(0.0, 1.0)),
    "prefix_padding_ms": nullable(integer(0, MAX_MS)),
    "silence_duration_ms": nullable(integer(0, MAX_MS)),
    "idle_timeout_ms": nullable(integer(0, MAX_MS)),
    "eagerness": nullable(string()),
    "create_response": anything,
    "interrupt_response": anything,
}))
_transcription = nullable(obj({
    "model": _name, "delay": nullable(string(DELAY_NAMES)), "language": _name,
    "prompt": nullable(string(max_len=MAX_TEXT_CHARS)), "diarize": nullable(boolean),
    "hotwords": _hotwords, "boost": _boost,
}))
_format = nullable(obj({"type": string(), "rate": integer(8000, 48000, STREAM_RATES)}))
_session = obj({
    "type": string(),
    "model": _name,
    "input_audio_format": nullable(string()),
    "input_audio_transcription": _transcription,
    "turn_detection": _turn_detection,
    "include": nullable(list_of(string())),
    "audio": nullable(obj({"input": nullable(obj({
        "format": _format, "transcription": _transcription,
        "turn_detection": _turn_detection, "noise_reduction": anything,
    }))})),
})

OPENAI_EVENTS: dict[str, Check] = {
    "session.update": obj({"event_id": _event_id, "session": _session}, required=("session",)),
    "transcription_session.update": obj({"event_id": _event_id, "session": _session},
                                        required=("session",)),
    "input_audio_buffer.append": obj({"event_id": _event_id, "audio": _audio},
                                     required=("audio",)),
    "input_audio_buffer.commit": obj({"event_id": _event_id}),
    "input_audio_buffer.clear": obj({"event_id": _event_id}),
}


def realtime_event(event: dict, openai: bool) -> None:
    """Check one realtime client event (a dict); unknown types are left to the handler."""
    t = event.get("type")
    if not isinstance(t, str):
        raise Invalid("type", f"type must be a string, got {_type_name(t)}")
    schema = (OPENAI_EVENTS if openai else VLLM_EVENTS).get(t)
    if openai:
        _event_id(event.get("event_id"), "event_id")
    if schema is not None:
        schema(event, "")


def append_samples(b64: str) -> int:
    """The number of pcm16 samples a base64 append carries (an upper bound, without
    decoding it): for refusing an oversize append before any work is done on it."""
    return len(b64) * 3 // 8


# ---------------------------------------------------------------- speech, text streamed in

MAX_DELTA_CHARS = 4096  # one input_text.append
MAX_GENERATION_CHARS = 65536  # one generation's text (appends up to its flush)
MAX_PENDING_CHARS = 16384  # text given and not started yet: past it, an append is refused
MAX_CLAUSE_WORDS = 400
MAX_MESSAGE_CHARS = 1 << 16  # a whole message (a delta's 4096 characters, JSON-escaped, fit)
SPEECH_STREAM_FORMATS = ("pcm", "opus")


@functools.lru_cache(maxsize=4)
def _speech_stream_events(max_frames_cap: int) -> dict[str, Check]:
    session = obj({
        "model": _name, "voice": _name, "seed": nullable(integer(0, SEED_MAX)),
        "response_format": nullable(string(SPEECH_STREAM_FORMATS)),
        "clause_words": nullable(integer(1, MAX_CLAUSE_WORDS)),
        "max_frames": nullable(integer(1, max_frames_cap)),
    })
    bare = obj({"event_id": _event_id})
    return {
        "session.update": obj({"event_id": _event_id, "session": session},
                              required=("session",)),
        "input_text.append": obj({"event_id": _event_id,
                                  "text": string(max_len=MAX_DELTA_CHARS)}, required=("text",)),
        "input_text.flush": bare, "input_text.end": bare, "speech.cancel": bare,
    }


def speech_stream_event(event: dict, max_frames_cap: int) -> bool:
    """Check one client event of WS /v1/audio/speech/stream; False for an unknown type."""
    t = event.get("type")
    if not isinstance(t, str):
        raise Invalid("type", f"type must be a string, got {_type_name(t)}")
    _event_id(event.get("event_id"), "event_id")
    schema = _speech_stream_events(max_frames_cap).get(t)
    if schema is None:
        return False
    schema(event, "")
    return True


# ---------------------------------------------------------------- the language


def language(model, value, param: str = "language") -> str | None:
    """A client's `language` for `model` (OpenAI's ISO 639-1 `de`, a locale `de-DE` or `de_DE`,
    `auto`; None or "": none). For a model that takes languages (`model.languages`): the name
    its sessions take (`model.resolve_language`; an unknown one lists them). For a model that
    takes none: None for `auto`, else the language as given when the model transcribes it (a
    hint it does not need: `en` for the English Nemotron), else refused. Raises Invalid."""
    from ..text.language_names import english_name, language_code

    if value is None or value == "":
        return None
    value = string()(value, param)
    if model.languages is not None:
        try:
            return model.resolve_language(value)[0]
        except MlxSpeechError as e:
            raise Invalid(param, f"{param}: {e}") from None
    if value.strip().lower() == "auto":
        return None
    if language_code(value) in model.spoken:
        return value.strip()
    spoken = ", ".join(f"{english_name(c) or c} ({c})" for c in model.spoken)
    raise Invalid(param, f"{param}: {model.name} takes no language and transcribes only "
                  f"{spoken}; got {value!r}")


# ---------------------------------------------------------------- REST


def speech_body(body, max_frames_cap: int, max_chars: int = MAX_TEXT_CHARS) -> dict:
    """POST /v1/audio/speech: the JSON body."""
    obj({
        "model": _name,
        "input": string(max_len=max_chars, nonempty=True),
        "voice": _name,
        "response_format": _name,
        "stream_format": _name,
        "instructions": nullable(string(max_len=MAX_TEXT_CHARS)),
        "speed": nullable(number(0.25, 4.0)),
        "seed": nullable(integer(0, SEED_MAX)),
        "max_frames": nullable(integer(1, max_frames_cap)),
    }, required=("input",))(body, "")
    return body


TRANSCRIPTION_FIELDS = ("model", "response_format", "stream", "language", "prompt",
                        "temperature", "chunking_strategy", "boost", "diarize")
HOTWORDS_FIELDS = ("hotwords", "hotwords[]")


def transcription_form(form) -> None:
    """POST /v1/audio/transcriptions: every named field is text (not a file), of bounded
    length; `stream` a boolean word; timestamp granularities word or segment."""
    from starlette.datastructures import UploadFile

    for k in TRANSCRIPTION_FIELDS:
        for v in form.getlist(k):
            if isinstance(v, UploadFile):
                raise Invalid(k, f"{k} must be a text field, not a file")
            string(max_len=MAX_TEXT_CHARS if k == "prompt" else MAX_NAME_CHARS)(v, k)
    for k in ("timestamp_granularities[]", "timestamp_granularities"):
        for v in form.getlist(k):
            if isinstance(v, UploadFile):
                raise Invalid(k, f"{k} must be a text field, not a file")
            string(("word", "segment"))(v, k)
    s = form.get("stream")
    if isinstance(s, str) and s and s.lower() not in ("true", "false", "1", "0"):
        raise Invalid("stream", "stream must be true or false")


def _form_text(form, name: str) -> str | None:
    v = form.get(name)
    return v if isinstance(v, str) and v != "" else None


def form_vocabulary(form):
    """POST /v1/audio/transcriptions: `hotwords` / `hotwords[]` (text fields; several values,
    or commas, make one list), `prompt`, `boost` -> the request's vocabulary (`vocabulary`)."""
    from ..text.vocabulary import MAX_INPUT_CHARS

    items = [string(max_len=MAX_INPUT_CHARS)(v, k) for k in HOTWORDS_FIELDS
             for v in form.getlist(k)]
    return vocabulary(",".join(items) or None, _form_text(form, "prompt"),
                      _form_text(form, "boost"))


def form_language(form, model) -> str | None:
    """POST /v1/audio/transcriptions: `language` for `model` (`language`), before any work."""
    return language(model, _form_text(form, "language"))


def diarize_form(form, fmt: str, stream: bool, have_diarizer: bool) -> bool:
    """Whether to label speakers: response_format=diarized_json, or diarize=true (Mistral's
    field) with verbose_json; Invalid when the server has no diarizer or the form cannot hold
    speakers."""
    on = fmt == "diarized_json" or (_form_text(form, "diarize") or "false").lower() in (
        "true", "1")
    if not on:
        return False
    if not have_diarizer:
        raise Invalid("diarize" if fmt != "diarized_json" else "response_format",
                      "this server has no diarizer (start it with --diarizer)")
    if fmt not in ("diarized_json", "verbose_json"):
        raise Invalid("diarize", "diarize=true needs response_format verbose_json (or use "
                      "diarized_json)")
    if stream:
        raise Invalid("stream", "speaker labels are not streamed; use stream=false")
    return True


# ---------------------------------------------------------------- Kyutai query


def kyutai_query(qp) -> dict:
    """WS /api/chat's query parameters, checked; returns {name: str} of those given."""
    out = {}
    for k, limit in (("model", MAX_NAME_CHARS), ("voice", MAX_NAME_CHARS),
                     ("voice_prompt", MAX_NAME_CHARS), ("role", MAX_ROLE_CHARS),
                     ("text_prompt", MAX_ROLE_CHARS), ("format", 16), ("seed", 32)):
        v = qp.get(k)
        if v is None:
            continue
        if len(v) > limit:
            if k == "seed":
                raise Invalid(k, "seed must be a non-negative integer")
            raise Invalid(k, f"{k} is longer than {limit} characters")
        out[k] = v
    seed = out.get("seed")
    if seed is not None and (not seed.isascii() or not seed.isdigit() or int(seed) > SEED_MAX):
        raise Invalid("seed", "seed must be a non-negative integer")
    fmt = out.get("format")
    if fmt is not None and fmt not in ("opus", "pcm", ""):
        raise Invalid("format", "format must be opus or pcm")
    return out
