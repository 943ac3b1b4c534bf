"""Streaming transcription: a session's explicit state over a shared loaded model (the
family's batched step, `step.py`, advances any number of sessions together)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ...audio import LogMel, StreamingLogMel
from ...text import StreamingDetokenizer
from ..asr import (
    TokenLogprobs,
    Transcript,
    Word,
    drain_cut,
    group_words,
)
from .config import FRAME_MS, MEL_PER_TOKEN, RIGHT_PAD_EXTRA_TOKENS, TOKEN_SAMPLES

if TYPE_CHECKING:
    from ...text import Vocabulary
    from . import VoxtralRealtime

ENCODER_CHUNK_TOKENS = 32  # bound on one encoder call (a big feed is split)

MAX_DELAY_MS = 2400


def delay_tokens(owner: VoxtralRealtime, delay_ms: int) -> int:
    return owner.latency.check(delay_ms) // FRAME_MS


class Session:
    """Feed 16 kHz mono float32 audio in any chunk sizes; get text as it is decoded.

    Token ids equal offline transcription for any chunking: the mel is computed
    on the offline frame grid and every stage carries exact state. Work per
    chunk is bounded (ring KV caches, conv tails, consumed audio dropped).
    """

    def __init__(self, owner: VoxtralRealtime, delay_ms: int | None = None,
                 vocabulary: Vocabulary | None = None, logprobs: bool = False):
        cfg = owner.config
        self.lp = TokenLogprobs() if logprobs else None  # log-softmax of each token
        self.booster = owner.booster(vocabulary)  # phrase boosting walk, or None
        self.owner, self.model, self.tokenizer = owner, owner.model, owner.tokenizer
        a = cfg.audio
        self.delay_ms = a.delay_ms if delay_ms is None else delay_ms
        self.latency_ms = self.delay_ms  # the name both ASR families' sessions use
        self.n_delay = delay_tokens(owner, self.delay_ms)
        tk = self.tokenizer
        self.bos, self.eos = tk.special_id("<s>"), tk.special_id("</s>")
        self.pad, self.word = tk.special_id("[STREAMING_PAD]"), tk.special_id("[STREAMING_WORD]")
        self.prompt = [self.bos] + [self.pad] * (a.n_left_pad_tokens + self.n_delay)
        enc = cfg.encoder
        frames_per_token = MEL_PER_TOKEN // 2  # conv stem stride 2
        # a chunk must fit between the window and the RoPE limit (re-anchoring)
        room = (enc.max_position - enc.sliding_window) // frames_per_token
        self.enc_chunk_tokens = max(1, min(ENCODER_CHUNK_TOKENS, room))
        self.enc_state = self.model.make_encoder_state(self.enc_chunk_tokens * frames_per_token,
                                                       owner.kv_bits)
        # one ring size for every delay, so sessions with different delays share steps
        longest_prompt = 1 + a.n_left_pad_tokens + MAX_DELAY_MS // FRAME_MS
        self.dec_cache = self.model.make_decoder_cache(longest_prompt, owner.kv_bits)
        self.ffn_scales = self.model.ffn_scales(self.n_delay)
        self.mel = StreamingLogMel(LogMel(a.sample_rate, a.n_fft, a.hop, a.n_mels,
                                          a.log_mel_max))
        self._mel_pending = np.zeros((0, a.n_mels), np.float32)
        self.mel_todo = np.zeros((0, a.n_mels), np.float32)  # whole tokens, not encoded
        self._audio: list[mx.array] = []  # embeddings not yet fed, (1, n, dim) each
        self._audio_base = 0  # decoder position of self._audio's first row
        self.n_audio = 0  # positions with an embedding so far
        self.position = 0  # next decoder position to feed
        # (batched array, row) refs: the last generated token (next input), and the
        # generated token not yet read into token_ids
        self.last: tuple[mx.array, int] | None = None
        self.unread: tuple[mx.array, mx.array | None, int] | None = None  # token, logprob
        self.token_ids: list[int] = []  # since the last drain()
        self._drained = 0  # tokens drain() released
        self.n_samples = 0
        self.finished = self.done = False
        self.detok = StreamingDetokenizer(tk)
        self._started_text = False
        self._ingest(self.mel.feed(np.zeros(a.n_left_pad_tokens * TOKEN_SAMPLES)))

    # -- audio side ---------------------------------------------------------
    def _ingest(self, frames: np.ndarray) -> None:
        """Queue whole tokens' mel frames for the (batched) encoder."""
        mel = np.concatenate([self._mel_pending, frames]) if len(self._mel_pending) else frames
        n = len(mel) // MEL_PER_TOKEN * MEL_PER_TOKEN
        self._mel_pending = mel[n:]
        if n:
            self.mel_todo = np.concatenate([self.mel_todo, mel[:n]])

    def add_audio(self, emb: mx.array, n_tokens: int) -> None:
        """The encoder's embeddings (1, n, dim) of the next `n_tokens` whole tokens of
        `mel_todo` (dropped from it)."""
        self.mel_todo = self.mel_todo[n_tokens * MEL_PER_TOKEN:]
        self._audio.append(emb)
        self.n_audio += n_tokens

    def take_audio(self, p0: int, p1: int) -> mx.array:
        """Embeddings for positions [p0, p1); drops everything before p1."""
        rows, need, base = [], p1 - p0, self._audio_base
        while need:
            a = self._audio[0]
            i0 = p0 - base
            take = min(a.shape[1] - i0, need)
            rows.append(a[:, i0: i0 + take])
            need -= take
            p0 += take
            if i0 + take == a.shape[1]:
                self._audio.pop(0)
                base += a.shape[1]
            else:
                self._audio[0] = a[:, i0 + take:]
                base = p0
        self._audio_base = base
        return rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=1)

    # -- text side ----------------------------------------------------------
    def emit(self, tok: int, lp: float | None = None) -> str:
        self.token_ids.append(tok)
        if self.lp is not None:
            self.lp.add(tok, lp)
        if self.booster is not None:
            self.booster.advance(tok)
        if tok == self.eos:
            self.done = True
            return ""
        s = self.detok.add(tok)
        if not self._started_text and s:
            s = s.lstrip()
            self._started_text = bool(s)
        return s

    # -- public API -----------------------------------------------------------
    def feed(self, samples: np.ndarray) -> str:
        """Append 16 kHz mono samples; returns the text decoded since the last call."""
        return self.owner.feed_many([(self, samples)])[0]

    def finish(self) -> str:
        """End of audio: pad with silence exactly as offline does and flush the text."""
        return self.owner.finish_many([self])[0]

    # -- stepping (driven by the owner's feed_many / finish_many) ---------------
    def take_samples(self, x: np.ndarray) -> None:
        """Queue new audio for the encoder."""
        self.n_samples += len(x)
        if len(x) and not self.done:  # after EOS the audio is not needed
            self._ingest(self.mel.feed(x))

    def take_end(self) -> int:
        """End of audio: queue the offline right padding; returns the decode limit."""
        self.finished = True
        a = self.owner.config.audio
        align = (-self.n_samples) % TOKEN_SAMPLES
        right = (self.n_delay + 1 + RIGHT_PAD_EXTRA_TOKENS) * TOKEN_SAMPLES
        total = a.n_left_pad_tokens * TOKEN_SAMPLES + self.n_samples + align + right
        self._ingest(self.mel.feed(np.zeros(align + right), final_frames=total // a.hop))
        # like transformers' generate, the last audio position is never fed
        return total // TOKEN_SAMPLES - 1

    @property
    def seconds(self) -> float:
        return self.n_samples / self.owner.config.audio.sample_rate

    def result(self) -> Transcript:
        """Everything decoded (since the last `drain`): text, ids, words, token times."""
        lps = None if self.lp is None else list(self.lp.values)
        return self._transcript(self.token_ids, self._drained, strip=True, lps=lps)

    def drain(self) -> Transcript:
        """The transcript decoded so far, then forgotten, so a session that runs for days
        holds constant memory: every token before the last word, which may still grow (its
        tokens stay for the next drain or `result`). Times stay session-absolute; texts are
        not stripped, so the drained texts and the last result's joined are the whole."""
        cut = drain_cut(self.token_ids, self.tokenizer.token_bytes, lambda t: t == self.word)
        ids, first = self.token_ids[:cut], self._drained
        del self.token_ids[:cut]
        self._drained += cut
        lps = None
        if self.lp is not None:
            lps = self.lp.values[:cut]
            del self.lp.values[:cut]
        return self._transcript(ids, first, strip=False, lps=lps)

    def _transcript(self, ids: list[int], first: int, strip: bool, lps=None) -> Transcript:
        text = self.tokenizer.decode(ids)
        return Transcript(text.strip() if strip else text, list(ids),
                          words_from_tokens(ids, self.tokenizer, self.word, first, self.seconds),
                          [(first + k) * FRAME_MS / 1000 for k in range(len(ids))], lps)


def words_from_tokens(ids: list[int], tokenizer, word_id: int, first: int = 0,
                      audio_s: float | None = None) -> list[Word]:
    """Token k covers real audio [80k, 80k + 80) ms (the prompt absorbs the delay), within the
    `audio_s` seconds of audio given; `first`: the session index of ids[0]."""
    sec = FRAME_MS / 1000
    return group_words(((tokenizer.token_bytes(t) if not tokenizer.is_special(t) else b"",
                         (first + k) * sec, (first + k + 1) * sec, t == word_id)
                        for k, t in enumerate(ids)), audio_s)
