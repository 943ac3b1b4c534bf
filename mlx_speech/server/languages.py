"""The spoken language in the server's answers, one rule for every endpoint.

A transcript's language is what the model detected or was given (`Transcript.language`, a
locale such as "de-DE"); for a model that takes no language, the language the client named
(a hint it transcribes), else the model's only language (English for the English Nemotron);
else unknown. Each protocol says it in its own form:

- verbose_json `language`: OpenAI's lowercase English name ("german"; "" when unknown).
- json, SSE `transcript.text.done`, OpenAI realtime `...transcription.completed`: OpenAI's
  `languages`, `[{"code": "de", "locale": "de-DE"}]` (`locale`, ours, where the language has a
  region); `[]` when a model that takes languages detected none; absent when a model that
  takes none has no language to report.
- vLLM realtime `transcription.done`: our `language`, "de-DE" (absent when unknown).
"""

from __future__ import annotations

from ..text.language_names import english_name, language_code


def spoken_language(model, result, given: str | None) -> str | None:
    """The transcript's language (a locale or a code), or None when unknown. `given`: the
    client's language as validate.language returned it."""
    if result.language is not None:
        return result.language
    if model.languages is None:
        if given is not None:
            return given
        if len(model.spoken) == 1:
            return model.spoken[0]
    return None


def verbose_language(model, result, given: str | None) -> str:
    """verbose_json's `language`: the English name in lowercase, as OpenAI reports it."""
    tag = spoken_language(model, result, given)
    if tag is None:
        return ""
    name = english_name(tag)
    return name.lower() if name else tag


def languages_field(model, result, given: str | None) -> dict:
    """OpenAI's `languages` ([{code}], with our `locale` where the language has a region), as
    a dict to merge into an answer; {} when the model takes none and the language is unknown."""
    tag = spoken_language(model, result, given)
    if tag is None:
        return {} if model.languages is None else {"languages": []}
    entry = {"code": language_code(tag)}
    if "-" in tag.replace("_", "-"):
        entry["locale"] = tag
    return {"languages": [entry]}


def language_field(model, result, given: str | None) -> dict:
    """vLLM's dialect: our `language` extension on transcription.done ({} when unknown)."""
    tag = spoken_language(model, result, given)
    return {} if tag is None else {"language": tag}
