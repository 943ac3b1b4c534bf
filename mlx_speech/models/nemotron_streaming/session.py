"""Streaming transcription session (stepped by step.py through the owner's feed_many)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...text.spm import StreamingDecoder
from .. import asr
from ..asr import TokenLogprobs, Word, drain_cut, group_words
from ..nemo.features import StreamingNemoLogMel
from .config import FRAME_MS

if TYPE_CHECKING:
    from ...text.vocabulary import Vocabulary
    from . import NemotronStreaming


@dataclass
class Transcript(asr.Transcript):
    frames: list[int] = field(default_factory=list)  # encoder frame (80 ms) of each token


def words_from_tokens(ids: list[int], frames: list[int], tokenizer,
                      audio_s: float | None = None) -> list[Word]:
    """A word starts at a piece with a leading space; it spans its tokens' frames (within the
    `audio_s` seconds of audio given)."""
    sec = FRAME_MS / 1000
    return group_words(((tokenizer.token_bytes(t), f * sec, (f + 1) * sec, False)
                        for t, f in zip(ids, frames, strict=True)), audio_s)


class Session:
    """Feed 16 kHz mono float32 audio in any chunk sizes; get text as it is decoded.

    Tokens equal offline transcription for any chunking and from the first
    chunk on: the mel frames, the subsampling, the block-aligned attention and
    the predictor all carry exact state. Work per chunk is bounded.
    """

    def __init__(self, owner: NemotronStreaming, latency_ms: int | None = None,
                 vocabulary: Vocabulary | None = None, logprobs: bool = False,
                 language: str | None = None):
        self.owner, self.model = owner, owner.model
        # the language prompt's name and slot (None, None: a model without one)
        self.language, self.prompt = owner.resolve_language(language)
        self._detected: str | None = None  # the last language tag drained
        self.lp = TokenLogprobs() if logprobs else None  # the joint's log-softmax per token
        self.booster = owner.booster(vocabulary)  # phrase boosting walk, or None
        cfg = owner.config
        self.right_context = cfg.right_context(latency_ms)
        self.latency_ms = (self.right_context + 1) * FRAME_MS
        self.mel = StreamingNemoLogMel(owner.features)
        self.enc_state = self.model.encoder.make_state(self.right_context)
        self.dec_state = self.model.make_decoder_state()
        self.token_ids: list[int] = []  # since the last drain()
        self.frames: list[int] = []
        self.n_frames = 0  # encoder frames decoded so far
        self.finished = False
        self.done = False  # RNN-T has no end-of-stream token; same interface as Voxtral
        self.detok = StreamingDecoder(owner.tokenizer)

    def feed(self, samples: np.ndarray) -> str:
        """Append 16 kHz mono samples; returns the text decoded since the last call."""
        return self.owner.feed_many([(self, samples)])[0]

    def finish(self) -> str:
        """End of audio: flush the last frames exactly as offline and the text."""
        return self.owner.finish_many([self])[0]

    @property
    def seconds(self) -> float:
        return self.mel.n_samples / self.owner.sample_rate

    @property
    def detected_language(self) -> str | None:
        """The language the model names in its last tag (`auto`, or a model that tags what it
        hears), else the locale of the session's language; None: not known (yet)."""
        tags = self.owner.language_tags
        for t in reversed(self.token_ids):
            if t in tags:
                return tags[t]
        if self._detected is not None:
            return self._detected
        return None if self.language is None else self.owner.languages_info.locale(self.language)

    def result(self) -> Transcript:
        """Everything decoded (since the last `drain`): text, ids, words, token times."""
        tk = self.owner.tokenizer
        return Transcript(tk.decode(self.token_ids), list(self.token_ids),
                          words_from_tokens(self.token_ids, self.frames, tk, self.seconds),
                          [f * FRAME_MS / 1000 for f in self.frames],
                          None if self.lp is None else list(self.lp.values),
                          self.detected_language, frames=list(self.frames))

    def drain(self) -> Transcript:
        """The transcript decoded so far, then forgotten, so a session that runs for days
        holds constant memory: every token before the last word, which may still grow (its
        tokens stay for the next drain or `result`). Texts are the pieces' bytes, unstripped,
        so drained texts join without losing the spaces between words."""
        tk = self.owner.tokenizer
        cut = drain_cut(self.token_ids, tk.token_bytes)
        ids, frames = self.token_ids[:cut], self.frames[:cut]
        del self.token_ids[:cut], self.frames[:cut]
        lps = None
        if self.lp is not None:
            lps = self.lp.values[:cut]
            del self.lp.values[:cut]
        tags = self.owner.language_tags
        self._detected = next((tags[t] for t in reversed(ids) if t in tags), self._detected)
        language = self.detected_language
        text = b"".join(tk.token_bytes(t) for t in ids).decode("utf-8", "replace")
        return Transcript(text, ids, words_from_tokens(ids, frames, tk, self.seconds),
                          [f * FRAME_MS / 1000 for f in frames], lps, language, frames=frames)
