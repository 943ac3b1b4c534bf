"""Nemotron streaming ASR configuration (transformers config.json layout) and the languages of
the prompted model (Nemotron 3.5 ASR streaming).

Languages: the checkpoint names them in a prompt dictionary: locales (`de-DE`), bare codes (`de`)
and `auto`, each mapped to one of `num_prompts` slots (several names may share a slot). A session
conditions the model on one slot (a one-hot joined to the encoder output: model.py's
`PromptProjector`). With `auto` the model detects the language and emits a tag piece such as
`<de-DE>` (after a sentence, in the release); tags stay in `token_ids` (token parity with NeMo)
but print nothing, and the last one is the session's detected language.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...errors import MlxSpeechError

SAMPLE_RATE = 16_000
HOP = 160
N_FFT = 512
WIN = 400
PREEMPHASIS = 0.97
FRAME_MS = 80  # one encoder frame = 8 mel frames
LATENCY_MS = {1120: 13, 560: 6, 160: 1, 80: 0}  # streaming latency -> right context (frames)


@dataclass
class EncoderConfig:
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 8
    intermediate_size: int = 4096
    attention_bias: bool = False
    convolution_bias: bool = False
    conv_kernel_size: int = 9
    subsampling_factor: int = 8
    subsampling_conv_channels: int = 256
    subsampling_conv_kernel_size: int = 3
    subsampling_conv_stride: int = 2
    num_mel_bins: int = 128
    scale_input: bool = True  # the transformers default when config.json omits it
    left_context: int = 70  # sliding_window - 1
    default_right_context: int = 13
    max_position_embeddings: int = 5000
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def n_subsampling_layers(self) -> int:
        return self.subsampling_factor.bit_length() - 1

    @property
    def subsampled_freqs(self) -> int:
        k, s = self.subsampling_conv_kernel_size, self.subsampling_conv_stride
        f = self.num_mel_bins
        for _ in range(self.n_subsampling_layers):
            f = (f + (k - 1) + (s - 1) - k) // s + 1
        return f


@dataclass
class NemotronStreamingConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    vocab_size: int = 1025  # SentencePiece pieces + blank
    blank_id: int = 1024
    decoder_hidden_size: int = 640
    num_decoder_layers: int = 2
    max_symbols: int = 10
    supported_right_contexts: tuple[int, ...] = (13, 6, 1, 0)
    # the language-ID prompt (Nemotron 3.5): a one-hot of num_prompts slots joins the encoder
    # output before the joint (0: no prompt, the English seed model); prompts: name -> slot
    num_prompts: int = 0
    prompt_intermediate_size: int = 0
    prompts: dict[str, int] = field(default_factory=dict)
    default_prompt: int | None = None  # the slot of sessions that name no language

    @classmethod
    def from_hf(cls, c: dict) -> NemotronStreamingConfig:
        e = c.get("encoder_config") or {}
        names = EncoderConfig.__dataclass_fields__
        kw = {k: v for k, v in e.items() if k in names}
        if "sliding_window" in e:
            kw["left_context"] = e["sliding_window"] - 1
        if "default_num_lookahead_tokens" in e:
            kw["default_right_context"] = e["default_num_lookahead_tokens"]
        enc = EncoderConfig(**kw)
        if c.get("hidden_act", "relu") != "relu" or e.get("hidden_act", "silu") != "silu":
            raise MlxSpeechError("only relu joint / silu encoder activations are supported")
        rights = c.get("supported_num_lookahead_tokens",
                       e.get("supported_num_lookahead_tokens", (13, 6, 1, 0)))
        n_prompts = c.get("num_prompts", 0)
        return cls(
            encoder=enc, vocab_size=c.get("vocab_size", 1025),
            blank_id=c.get("blank_token_id", 1024),
            decoder_hidden_size=c.get("decoder_hidden_size", 640),
            num_decoder_layers=c.get("num_decoder_layers", 2),
            max_symbols=c.get("max_symbols_per_step", 10),
            supported_right_contexts=tuple(rights),
            num_prompts=n_prompts,
            prompt_intermediate_size=c.get("prompt_intermediate_size", 2 * enc.hidden_size)
            if n_prompts else 0,
            prompts=dict(c.get("prompt_dictionary") or {}),
            default_prompt=c.get("default_prompt_id"),
        )

    def latencies(self) -> dict[int, int]:
        """This checkpoint's latency modes: ms -> right context (one 80 ms frame per block)."""
        return {(r + 1) * FRAME_MS: r for r in self.supported_right_contexts}

    def right_context(self, latency_ms: int | None) -> int:
        """Latency mode in ms -> right context in encoder frames (None: the default)."""
        modes = {**LATENCY_MS, **self.latencies()}
        if latency_ms is None:
            r = self.encoder.default_right_context
        elif latency_ms in modes:
            r = modes[latency_ms]
        else:
            known = ", ".join(str(k) for k in sorted(modes))
            raise MlxSpeechError(f"latency must be one of {known} ms, got {latency_ms}")
        if latency_ms is not None and r not in self.supported_right_contexts:
            raise MlxSpeechError(f"this model was not trained for the {latency_ms} ms latency")
        if self.encoder.left_context % (r + 1):
            raise MlxSpeechError(
                f"left context {self.encoder.left_context} is not a multiple of the "
                f"{r + 1}-frame chunk of the {(r + 1) * FRAME_MS} ms mode"
            )
        return r


# -- languages (the prompt dictionary, `language=`, the tags) ----------------------------------
AUTO = "auto"
_CODE = re.compile(r"[a-z]{2,3}(?:-[A-Za-z0-9]{2,4})?")  # a code or locale (not `enGB`)
_TAG = re.compile(r"<([a-z]{2,3}(?:-[A-Za-z0-9]{2,4})?)>")

# The release's prompt dictionary (nvidia/nemotron-3.5-asr-streaming-0.6b, model_defaults), slot:
# names. Only for a transformers-layout folder that lacks its processor_config.json (where
# transformers keeps the dictionary); .nemo archives and converted folders carry their own.
_RELEASE = """
0 en-US en|1 en-GB enGB|2 es-ES esES|3 es-US es|4 zh-CN zh-ZH|5 zh-TW|6 hi-IN hi hi-HI|7 ar-AR ar
8 fr-FR fr|9 de-DE de|10 ja-JP ja-JA|11 ru-RU ru|12 pt-BR|13 pt-PT pt|14 ko-KR ko ko-KO|15 it-IT it
16 nl-NL nl|17 pl-PL pl|18 tr-TR tr|19 uk-UA uk|20 ro-RO ro|21 el-GR el|22 cs-CZ cs|23 hu-HU hu
24 sv-SE sv|25 da-DK da|26 fi-FI fi|27 no-NO no|28 sk-SK sk|29 hr-HR hr|30 bg-BG bg|31 lt-LT lt
32 th-TH|33 vi-VN|34 id-ID|35 ms-MY|36 bn-IN|37 ur-PK|38 fa-IR|39 ta-IN|40 te-IN|41 mr-IN
42 gu-IN|43 kn-IN|44 ml-IN|45 si-LK|46 ne-NP|47 km-KH|48 sw-KE|49 am-ET|50 ha-NG|51 zu-ZA
52 yo-NG|53 ig-NG|54 af-ZA|55 rw-RW|56 so-SO|57 ny-MW|58 ln-CD|59 or-KE|60 et-EE et|61 lv-LV lv
62 sl-SI sl|64 he-IL|65 ku-TR|66 az-AZ|67 ka-GE|68 hy-AM|69 uz-UZ|70 tg-TJ|71 ky-KG|80 qu-PE
81 ay-BO|82 gn-PY|83 nah-MX|96 mi-NZ|97 haw-US|98 sm-WS|99 to-TO|100 fr-CA|101 auto|102 mt-MT
103 nb-NO nb|104 nn-NO nn
"""


def release_prompts() -> dict[str, int]:
    out = {}
    for entry in _RELEASE.replace("\n", "|").split("|"):
        if entry.strip():
            slot, *names = entry.split()
            out.update((n, int(slot)) for n in names)
    return out


def release_codes() -> tuple[str, ...]:
    """The ISO 639 codes of the release's locales ("de" of "de-DE"), sorted."""
    return tuple(sorted({n.split("-")[0] for n in release_prompts() if _CODE.fullmatch(n)}))


def prompt_dictionary(raw) -> dict[str, int]:
    """The checkpoint's dictionary with string names and int slots (YAML reads a bare `no`,
    Norwegian, as False)."""
    if not isinstance(raw, dict):
        raise MlxSpeechError("the prompt dictionary is not a mapping")
    return {("no" if k is False else str(k)): int(v) for k, v in raw.items()}


def resolve(prompts: dict[str, int], language: str) -> tuple[str, int]:
    """`language` -> (the dictionary's name for it, its slot): a name as the checkpoint spells
    it, in any case and with `_` for `-`, or a bare code the dictionary lacks (`ja`: the
    lowest-slot locale of that language). Unknown: a one-line error listing the names."""
    if not isinstance(language, str) or not language.strip():
        raise MlxSpeechError(f"language must be a name such as 'de' or 'auto', got {language!r}")
    if language in prompts:
        return language, prompts[language]
    want = language.strip().replace("_", "-").lower()
    for name, slot in prompts.items():
        if name.lower() == want:
            return name, slot
    if "-" not in want:
        found = [(slot, i, name) for i, (name, slot) in enumerate(prompts.items())
                 if name.lower().split("-")[0] == want]  # lowest slot, then as listed
        if found:
            slot, _, name = min(found)
            return name, slot
    raise MlxSpeechError(f"unknown language {language!r}; this model takes "
                         f"{', '.join(sorted(prompts, key=str.lower))}")


@dataclass(frozen=True)
class Languages:
    """A loaded prompted model's languages: dictionary, default name and tag pieces."""

    prompts: dict[str, int]
    default: str
    tags: dict[int, str]  # token id -> the locale its tag names

    @classmethod
    def build(cls, prompts: dict[str, int], default_slot: int | None, pieces) -> Languages:
        """`pieces`: the tokenizer's piece strings, in id order."""
        if default_slot is not None and default_slot in prompts.values():
            default = AUTO if prompts.get(AUTO) == default_slot else \
                min(n for n, s in prompts.items() if s == default_slot)
        else:
            default = AUTO if AUTO in prompts else min(prompts, key=prompts.get)
        tags = {}
        for i, piece in enumerate(pieces):
            m = _TAG.fullmatch(piece)
            if m and m.group(1) != AUTO and ("-" in m.group(1) or m.group(1) in prompts):
                tags[i] = m.group(1)
        return cls(dict(prompts), default, tags)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.prompts, key=str.lower))

    def resolve(self, language: str | None) -> tuple[str, int]:
        return resolve(self.prompts, self.default if language is None else language)

    def locale(self, name: str) -> str | None:
        """What a session conditioned on `name` reports before any tag: the slot's first
        locale (`de` -> `de-DE`); None for `auto`."""
        if name == AUTO:
            return None
        slot = self.prompts[name]
        return next((n for n, s in self.prompts.items() if s == slot and "-" in n), name)


def check_language(config: dict, language: str) -> None:
    """`language` against a config.json's languages (before any weights load): a one-line
    error listing them, or saying the model takes none."""
    prompts = config.get("prompt_dictionary")
    if not prompts:
        raise MlxSpeechError(f"this model is English only and takes no language "
                             f"(got {language!r})")
    resolve(prompts, language)
