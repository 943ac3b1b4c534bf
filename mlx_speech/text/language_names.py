"""English names of languages by ISO 639 code: how menus label a language and what OpenAI's
verbose_json calls it ("german" for `de`, as OpenAI's own transcriptions report it).

Covers every language of the served models' (`spoken`, `languages`) and the common others; a
code missing here is shown as it is.
"""

from __future__ import annotations

import re

_TAG = re.compile(r"[a-z]{2,3}(?:-[A-Za-z0-9]{2,4})?")  # a code or locale

_NAMES = """
af Afrikaans|am Amharic|ar Arabic|as Assamese|ay Aymara|az Azerbaijani|ba Bashkir|be Belarusian
bg Bulgarian|bn Bengali|bo Tibetan|br Breton|bs Bosnian|ca Catalan|cs Czech|cy Welsh|da Danish
de German|el Greek|en English|es Spanish|et Estonian|eu Basque|fa Persian|fi Finnish|fo Faroese
fr French|ga Irish|gl Galician|gn Guarani|gu Gujarati|ha Hausa|haw Hawaiian|he Hebrew|hi Hindi
hr Croatian|ht Haitian Creole|hu Hungarian|hy Armenian|id Indonesian|ig Igbo|is Icelandic
it Italian|ja Japanese|jv Javanese|ka Georgian|kk Kazakh|km Khmer|kn Kannada|ko Korean
ku Kurdish|ky Kyrgyz|la Latin|lb Luxembourgish|ln Lingala|lo Lao|lt Lithuanian|lv Latvian
mg Malagasy|mi Maori|mk Macedonian|ml Malayalam|mn Mongolian|mr Marathi|ms Malay|mt Maltese
my Burmese|nah Nahuatl|nb Norwegian Bokmal|ne Nepali|nl Dutch|nn Norwegian Nynorsk|no Norwegian
ny Chichewa|oc Occitan|or Odia|pa Punjabi|pl Polish|ps Pashto|pt Portuguese|qu Quechua
ro Romanian|ru Russian|rw Kinyarwanda|sa Sanskrit|sd Sindhi|si Sinhala|sk Slovak|sl Slovenian
sm Samoan|sn Shona|so Somali|sq Albanian|sr Serbian|su Sundanese|sv Swedish|sw Swahili|ta Tamil
te Telugu|tg Tajik|th Thai|tk Turkmen|tl Tagalog|to Tongan|tr Turkish|tt Tatar|uk Ukrainian
ur Urdu|uz Uzbek|vi Vietnamese|yi Yiddish|yo Yoruba|yue Cantonese|zh Chinese|zu Zulu
"""

NAMES: dict[str, str] = dict(
    entry.split(" ", 1) for entry in _NAMES.replace("\n", "|").split("|") if entry.strip())


def language_code(tag: str) -> str:
    """The ISO 639 code a language name starts with: "de-DE", "de_de", "DE" -> "de"."""
    return tag.strip().replace("_", "-").split("-")[0].lower()


def english_name(tag: str) -> str | None:
    """The English name of a code or locale's language ("de-DE" -> "German"); None when the
    code is not in the table."""
    return NAMES.get(language_code(tag))


def offered(names) -> tuple[str, ...]:
    """The names a language menu offers of a model's `languages`: `auto` first, then the
    locales, and the bare codes no locale stands for (`de` is an alias of `de-DE`; spellings
    such as `enGB` are left out), by their labels."""
    tags = [n for n in names if _TAG.fullmatch(n)]
    shown = [n for n in tags if "-" in n or not any(m.startswith(n + "-") for m in tags)]
    return (*(("auto",) if "auto" in names else ()), *sorted(shown, key=label))


def label(tag: str) -> str:
    """How a menu shows a language name: "German (de-DE)"; the name alone when it has none."""
    name = english_name(tag)
    return f"{name} ({tag})" if name else tag
