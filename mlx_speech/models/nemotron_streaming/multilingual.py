"""NVIDIA Nemotron 3.5 ASR streaming (`nemotron3_5_asr`): the Nemotron family's model with a
language-ID prompt (NeMo's `EncDecRNNTBPEModelWithPrompt`, about 40 locales, punctuation and
capitals, `auto` language detection).

The same encoder, decoder, sessions and batched stepping as the English seed model; what it
adds is `prompt.py` (the one-hot prompt joined to the encoder output) and `languages.py` (the
prompt dictionary, `language=`, the tags it emits). This module is what the registry names for
the model type: the class (its latency modes and the release's languages, known before any
load) and the family's loader.
"""

from __future__ import annotations

from ..base import Latency
from . import NemotronStreaming, check_load_options, load, weight_patterns
from .languages import release_codes, release_prompts

__all__ = ["LATENCY_MS", "Nemotron35Streaming", "check_load_options", "load", "weight_patterns"]

# streaming latency -> right context (frames): the seed model's modes and 320 ms (r = 3)
LATENCY_MS = {1120: 13, 560: 6, 320: 3, 160: 1, 80: 0}


class Nemotron35Streaming(NemotronStreaming):
    """A loaded Nemotron 3.5 model: `languages` is its checkpoint's (the class attribute: the
    release's, for checks before a load); sessions and `transcribe` take `language=`."""

    name = "Nemotron 3.5 streaming speech-to-text"
    # the seed model's modes and 320 ms (a checkpoint may support fewer: its sessions say)
    latency = Latency("Nemotron 3.5's latency", 1120, {"minimal": 80, "low": 160, "medium": 560,
                                                       "high": 1120, "xhigh": 1120},
                      choices_ms=tuple(sorted(LATENCY_MS)))
    languages = tuple(sorted(release_prompts(), key=str.lower))
    spoken = release_codes()
