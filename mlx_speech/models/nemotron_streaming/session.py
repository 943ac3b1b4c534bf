"""Streaming transcription session and the RNN-T greedy loop (the only syncing code)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ...text.spm import StreamingDecoder
from .. import asr
from ..asr import Word, group_words
from .config import FRAME_MS
from .features import StreamingNemoLogMel
from .transducer import DecoderState, Model

if TYPE_CHECKING:
    from . import NemotronStreaming

MAX_MEL_PER_CALL = 800  # bounds one encoder call (a big feed is split): 8 s of audio
CLEAR_CACHE_EVERY = 256


@dataclass
class Transcript(asr.Transcript):
    frames: list[int] = field(default_factory=list)  # encoder frame (80 ms) of each token


def words_from_tokens(ids: list[int], frames: list[int], tokenizer) -> list[Word]:
    """A word starts at a piece with a leading space; it spans its tokens' frames."""
    sec = FRAME_MS / 1000
    return group_words((tokenizer.token_bytes(t), f * sec, (f + 1) * sec, False)
                       for t, f in zip(ids, frames, strict=True))


def greedy_decode(model: Model, frames: mx.array, state: DecoderState,
                  ) -> tuple[list[int], list[int], DecoderState]:
    """Frame-synchronous RNN-T greedy over projected encoder frames (T, dim).

    Per frame: emit argmax tokens until blank or `max_symbols` emissions, then move
    on; the predictor advances only on emissions. Runs of blank frames are found
    with one joint call over all remaining frames, so syncs scale with tokens, not
    frames. Returns (tokens, frame index of each, new state).
    """
    c = model.config
    blank, max_symbols = c.blank_id, c.max_symbols
    tokens: list[int] = []
    where: list[int] = []
    t, T = 0, frames.shape[0]
    while t < T:
        ks = np.array(mx.argmax(model.joint(frames[t:], state.g[0]), axis=-1))
        hit = np.flatnonzero(ks != blank)
        if not len(hit):
            break
        t += int(hit[0])
        k, n = int(ks[hit[0]]), 0
        while True:
            tokens.append(k)
            where.append(t)
            state = model.decoder(mx.array([k], mx.int32), state)
            n += 1
            if n == max_symbols:
                break
            k = int(mx.argmax(model.joint(frames[t], state.g[0])).item())
            if k == blank:
                break
        t += 1
    return tokens, where, state


class Session:
    """Feed 16 kHz mono float32 audio in any chunk sizes; get text as it is decoded.

    Tokens equal offline transcription for any chunking and from the first
    chunk on: the mel frames, the subsampling, the block-aligned attention and
    the predictor all carry exact state. Work per chunk is bounded.
    """

    def __init__(self, owner: NemotronStreaming, latency_ms: int | None = None):
        self.owner, self.model = owner, owner.model
        cfg = owner.config
        self.right_context = cfg.right_context(latency_ms)
        self.latency_ms = (self.right_context + 1) * FRAME_MS
        self.mel = StreamingNemoLogMel(owner.features)
        self.enc_state = self.model.encoder.make_state(self.right_context)
        self.dec_state = self.model.make_decoder_state()
        self.token_ids: list[int] = []
        self.frames: list[int] = []
        self.n_frames = 0  # encoder frames decoded so far
        self.finished = False
        self.done = False  # RNN-T has no end-of-stream token; same interface as Voxtral
        self._detok = StreamingDecoder(owner.tokenizer)
        self._calls = 0

    def _run(self, mel: np.ndarray, final: bool = False) -> str:
        out = []
        starts = range(0, max(len(mel), 1), MAX_MEL_PER_CALL)
        for i in starts:
            last = final and i == starts[-1]
            chunk = mx.array(mel[None, i: i + MAX_MEL_PER_CALL]).astype(self.model.dtype)
            x = self.model.encoder(chunk, state=self.enc_state, final=last)
            x = self.model.encoder_projector(x)
            mx.eval(x, self.enc_state.arrays())
            if x.shape[1] == 0:
                continue
            toks, where, self.dec_state = greedy_decode(self.model, x[0], self.dec_state)
            self.token_ids += toks
            self.frames += [self.n_frames + w for w in where]
            self.n_frames += x.shape[1]
            out += [self._detok.add(k) for k in toks]
            self._calls += 1
            if self._calls % CLEAR_CACHE_EVERY == 0:
                mx.clear_cache()
        return "".join(out)

    def feed(self, samples: np.ndarray) -> str:
        """Append 16 kHz mono samples; returns the text decoded since the last call."""
        return self.owner.feed_many([(self, samples)])[0]

    def finish(self) -> str:
        """End of audio: flush the last frames exactly as offline and the text."""
        return self.owner.finish_many([self])[0]

    # -- stepping (driven by the owner's feed_many / finish_many) ---------------
    def _feed(self, x: np.ndarray) -> str:
        mel = self.mel.feed(x)
        return self._run(mel) if len(mel) else ""

    def _finish(self) -> str:
        if self.finished:
            return ""
        self.finished = True
        mel = self.mel.finish()
        out = self._run(mel, final=True) if self.mel.emitted else ""
        mx.clear_cache()
        return out + self._detok.flush()

    @property
    def seconds(self) -> float:
        return self.mel.n_samples / self.owner.sample_rate

    def result(self) -> Transcript:
        tk = self.owner.tokenizer
        return Transcript(tk.decode(self.token_ids), list(self.token_ids),
                          words_from_tokens(self.token_ids, self.frames, tk),
                          [f * FRAME_MS / 1000 for f in self.frames], list(self.frames))
