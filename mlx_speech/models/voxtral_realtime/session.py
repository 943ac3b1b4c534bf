"""Streaming transcription: a session's explicit state over a shared loaded model, and the
batched step that advances any number of sessions together.

One tick (`feed_batch`) runs batched encoder chunks, then batched decoder steps: each
step stacks the sessions that have a position ready on the batch axis, with per-row
ring caches, RoPE clocks, masks, re-anchoring, conv tails and delay conditioning. A
lone session is a batch of one (the same code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ...audio.mel import LogMel, StreamingLogMel
from ...nn import ConvCache, RingBatch, sampling, stack_rows
from ...nn import boost as _boost
from ...nn.cache import fixed_shapes
from ...text.tekken import StreamingDetokenizer
from ..asr import (
    CLEAR_CACHE_EVERY,
    TokenLogprobs,
    Transcript,
    Word,
    drain_cut,
    group_words,
)
from .config import FRAME_MS, MEL_PER_TOKEN, RIGHT_PAD_EXTRA_TOKENS, TOKEN_SAMPLES
from .model import EncoderState

if TYPE_CHECKING:
    from ...text.vocabulary import Vocabulary
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
        self._mel_todo = np.zeros((0, a.n_mels), np.float32)  # whole tokens, not encoded
        self._audio: list[mx.array] = []  # embeddings not yet fed, (1, n, dim) each
        self._audio_base = 0  # decoder position of self._audio's first row
        self._n_audio = 0  # positions with an embedding so far
        self.position = 0  # next decoder position to feed
        # (batched array, row) refs: the last generated token (next input), and the
        # generated token not yet read into token_ids
        self._last: tuple[mx.array, int] | None = None
        self._unread: tuple[mx.array, mx.array | None, int] | None = None  # token, logprob
        self.token_ids: list[int] = []  # since the last drain()
        self._drained = 0  # tokens drain() released
        self.n_samples = 0
        self.finished = self.done = False
        self._detok = StreamingDetokenizer(tk)
        self._started_text = False
        self._ingest(self.mel.feed(np.zeros(a.n_left_pad_tokens * TOKEN_SAMPLES)))

    # -- audio side ---------------------------------------------------------
    def _ingest(self, frames: np.ndarray) -> None:
        """Queue whole tokens' mel frames for the (batched) encoder."""
        mel = np.concatenate([self._mel_pending, frames]) if len(self._mel_pending) else frames
        n = len(mel) // MEL_PER_TOKEN * MEL_PER_TOKEN
        self._mel_pending = mel[n:]
        if n:
            self._mel_todo = np.concatenate([self._mel_todo, mel[:n]])

    def _take_audio(self, p0: int, p1: int) -> mx.array:
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
    def _emit(self, tok: int, lp: float | None = None) -> str:
        self.token_ids.append(tok)
        if self.lp is not None:
            self.lp.add(tok, lp)
        if self.booster is not None:
            self.booster.advance(tok)
        if tok == self.eos:
            self.done = True
            return ""
        s = self._detok.add(tok)
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
    def _take_samples(self, x: np.ndarray) -> None:
        """Queue new audio for the encoder."""
        self.n_samples += len(x)
        if len(x) and not self.done:  # after EOS the audio is not needed
            self._ingest(self.mel.feed(x))

    def _take_end(self) -> int:
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
                          words_from_tokens(ids, self.tokenizer, self.word, first),
                          [(first + k) * FRAME_MS / 1000 for k in range(len(ids))], lps)


def words_from_tokens(ids: list[int], tokenizer, word_id: int, first: int = 0) -> list[Word]:
    """Token k covers real audio [80k, 80k + 80) ms (the prompt absorbs the delay); `first`:
    the session index of ids[0]."""
    sec = FRAME_MS / 1000
    return group_words((tokenizer.token_bytes(t) if not tokenizer.is_special(t) else b"",
                        (first + k) * sec, (first + k + 1) * sec, t == word_id)
                       for k, t in enumerate(ids))


# -- the batched step ----------------------------------------------------------
def _padded(n: int) -> int:
    """Rows a step of `n` sessions runs with: with fixed shapes (GPU backends) a power of two,
    the rows past `n` copies of the first row, dropped after the step."""
    return 1 << (n - 1).bit_length() if fixed_shapes() else n


def _chunk(n: int) -> int:
    """Tokens one encoder call takes of `n` ready: a power of two with fixed shapes."""
    return 1 << (n.bit_length() - 1) if fixed_shapes() else n


def _stack_tails(convs: list[ConvCache]) -> ConvCache:
    """Per-stream conv tails -> one batched ConvCache (zeros for fresh streams)."""
    have = [c.tail for c in convs if c.tail is not None]
    out = ConvCache()
    if have:
        zero = mx.zeros_like(have[0])
        tails = [c.tail if c.tail is not None else zero for c in convs]
        out.tail = tails[0] if len(tails) == 1 else mx.concatenate(tails, axis=0)
    return out


def encode(owner: VoxtralRealtime, sessions: list[Session]) -> None:
    """Run every queued whole token of mel through the encoder, batched (with fixed shapes
    in chunks of a power-of-two number of tokens, whatever the feed sizes)."""
    m = owner.model
    while True:
        active = [s for s in sessions if len(s._mel_todo)]
        if not active:
            return
        n = _chunk(min(min(len(s._mel_todo) for s in active) // MEL_PER_TOKEN,
                            active[0].enc_chunk_tokens))
        F, B = n * MEL_PER_TOKEN, len(active)
        rows = active + [active[0]] * (_padded(B) - B)
        mel = mx.array(np.stack([s._mel_todo[:F] for s in rows]))
        n_conv, n_kv = len(active[0].enc_state.conv), len(active[0].enc_state.kv)
        state = EncoderState(
            [_stack_tails([s.enc_state.conv[j] for s in rows]) for j in range(n_conv)],
            [RingBatch.gather([s.enc_state.kv[j] for s in active], size=len(rows))
             for j in range(n_kv)])
        emb = m.embed_audio(mel, state)
        mx.async_eval(emb, state.arrays())
        for i, s in enumerate(active):
            s._mel_todo = s._mel_todo[F:]
            s._audio.append(emb[i: i + 1] if len(rows) > 1 else emb)
            s._n_audio += n
            for j, c in enumerate(state.conv):
                s.enc_state.conv[j].tail = c.tail[i: i + 1] if len(rows) > 1 else c.tail


def _scales(owner: VoxtralRealtime, group: list[Session]) -> list[mx.array]:
    """Per-layer ffn scales of the rows: shared when every row has the same delay."""
    key = tuple(s.n_delay for s in group)
    if all(k == key[0] for k in key):
        return group[0].ffn_scales
    cache = owner._scale_stacks
    if key not in cache:
        if len(cache) > 64:
            cache.clear()
        cache[key] = [mx.concatenate([s.ffn_scales[j] for s in group])[:, None]
                      for j in range(len(group[0].ffn_scales))]
    return cache[key]


def _read(rows: list[Session], k: int = 0) -> list:
    """The unread token (k=1: its logprob, None when not computed) of each row: one host
    read per batched array."""
    lists: dict[int, list] = {}
    out = []
    for s in rows:
        a, i = s._unread[k], s._unread[-1]
        if a is not None and id(a) not in lists:
            lists[id(a)] = a.tolist()
        out.append(None if a is None else lists[id(a)][i])
    return out


def _read_emit(rows: list[Session], out: dict[int, list[str]]) -> None:
    unread = [s for s in rows if s._unread is not None]
    for s, tok, lp in zip(unread, _read(unread), _read(unread, 1), strict=True):
        out[id(s)].append(s._emit(tok, lp))
        s._unread = None


def choose(owner: VoxtralRealtime, rows: list[Session], logits: mx.array, boosted: bool):
    """The next token of each row from its (B, vocab) logits: the one place a decoder step
    turns logits into tokens (rows past len(rows) are padding). Greedy, after each row's
    phrase-boosting bias when `boosted`; with the chosen tokens' logprobs (the model's own
    log-softmax) when a row asked. Both are queued for evaluation."""
    bias = None
    if boosted:
        pad = [None] * (logits.shape[0] - len(rows))
        bias = _boost.bias([s.booster for s in rows] + pad, owner.config.decoder.vocab_size,
                           logits.dtype)
    tok = sampling.greedy(logits, bias)
    lp = sampling.chosen_logprob(logits, tok) if any(s.lp is not None for s in rows) else None
    mx.async_eval(tok, *([] if lp is None else [lp]))
    return tok, lp


def _step(owner: VoxtralRealtime, rows: list[Session], tokens: mx.array,
          audio: mx.array, out: dict[int, list[str]] | None = None):
    """One decoder forward of `rows` (padded to the bucketed batch size): (B, L) tokens and
    (B, L, dim) audio -> the next token of each row and their logprobs (or None), queued for
    evaluation. The rows' unread tokens are read into `out` while this step runs (before
    choosing, when a row boosts phrases: the bias needs them)."""
    m, B = owner.model, len(rows)
    caches = [RingBatch.gather([s.dec_cache[j] for s in rows], size=tokens.shape[0])
              for j in range(len(m.layers))]
    full = rows + [rows[0]] * (tokens.shape[0] - B)
    h = m.hidden(tokens, audio, _scales(owner, full), caches)
    # only the last position needs the (vocab-sized) head
    logits = m.logits(h[:, -1])
    boosted = any(s.booster for s in rows)
    if boosted and out is not None:  # the phrase bias needs the unread tokens: read first
        mx.async_eval(logits)
        _read_emit(rows, out)
    nxt = choose(owner, rows, logits, boosted)  # step p+1 runs while step p's are read
    if out is not None:
        _read_emit(rows, out)
    return nxt


def _pad_rows(a: mx.array, size: int) -> mx.array:
    """Fill a (B, ...) array up to `size` rows with copies of its first row."""
    extra = size - a.shape[0]
    return a if not extra else mx.concatenate([a, mx.repeat(a[:1], extra, axis=0)])


def decode(owner: VoxtralRealtime, sessions: list[Session], limits: list[int]) -> list[str]:
    """Feed every position < min(limit, positions with audio) of each session, in
    batched steps; returns each session's new text."""
    out: dict[int, list[str]] = {id(s): [] for s in sessions}
    end = {id(s): min(lim, s._n_audio) for s, lim in zip(sessions, limits, strict=True)}
    # prompt prefill for sessions that reached it, batched by prompt length
    fresh = [s for s in sessions if s._last is None and not s.done
             and end[id(s)] >= len(s.prompt)]
    for P in sorted({len(s.prompt) for s in fresh}):
        g = [s for s in fresh if len(s.prompt) == P]
        size = _padded(len(g))
        x = _pad_rows(mx.concatenate([s._take_audio(0, P) for s in g]), size)
        last, lp = _step(owner, g, _pad_rows(mx.array([s.prompt for s in g]), size), x)
        for i, s in enumerate(g):
            s._last, s._unread = (last, i), (last, lp, i)
            s.position = P
    while True:
        rows = [s for s in sessions if s._last is not None and not s.done
                and s.position < end[id(s)]]
        if not rows:
            break
        size, refs = _padded(len(rows)), [s._last for s in rows]
        a0 = refs[0][0]
        if a0.shape[0] == size and all(a is a0 and j == i for i, (a, j) in enumerate(refs)):
            refs += [(a0, i) for i in range(len(rows), size)]  # the last step's padding
        else:
            refs += [refs[0]] * (size - len(rows))
        tokens = stack_rows(refs)
        a = [s._take_audio(s.position, s.position + 1) for s in rows]
        a = _pad_rows(a[0] if len(a) == 1 else mx.concatenate(a), size)
        nxt, lp = _step(owner, rows, tokens[:, None], a, out)
        for i, s in enumerate(rows):
            s.position += 1
            s._last, s._unread = (nxt, i), (nxt, lp, i)
        owner._steps += 1
        if owner._steps % CLEAR_CACHE_EVERY == 0:
            mx.clear_cache()
    _read_emit([s for s in sessions if not s.done], out)
    for s in sessions:
        s._unread = None
    return ["".join(out[id(s)]) for s in sessions]


def feed_batch(owner: VoxtralRealtime, sessions: list[Session],
               audios: list[np.ndarray]) -> list[str]:
    for s, x in zip(sessions, audios, strict=True):
        s._take_samples(x)
    live = [s for s in sessions if not s.done]  # after EOS the audio is not needed
    encode(owner, live)
    texts = dict(zip(map(id, live), decode(owner, live, [s._n_audio for s in live]),
                     strict=True))
    return [texts.get(id(s), "") for s in sessions]


def finish_batch(owner: VoxtralRealtime, sessions: list[Session]) -> list[str]:
    live = [s for s in sessions if not s.finished]
    limits = [s._take_end() for s in live]
    encode(owner, [s for s in live if not s.done])
    texts = decode(owner, live, limits)
    out = {id(s): t + s._detok.flush() for s, t in zip(live, texts, strict=True)}
    mx.clear_cache()
    return [out.get(id(s), "") for s in sessions]
