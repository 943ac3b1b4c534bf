"""Voxtral Realtime's batched step (through the one stepper, `models/stepper.py`).

One tick (`Steps.feed`) runs batched encoder chunks, then batched decoder steps: each step
stacks the sessions that have a position ready on the batch axis, with per-row ring caches,
RoPE clocks, masks, re-anchoring, conv tails and delay conditioning. A lone session is a
batch of one (the same code).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...nn import (
    CompiledStep,
    ConvCache,
    RingBatch,
    RingStep,
    boost_bias,
    chosen_logprob,
    compile_enabled,
    greedy,
    stack_rows,
    write_start,
)
from ..stepper import Batch, Stepper, chunk_size
from .config import MEL_PER_TOKEN, VoxtralRealtimeConfig
from .model import EncoderState, Model, reanchor
from .session import Session


class Steps:
    """The family's step over a loaded model: `feed` / `finish` advance sessions together."""

    def __init__(self, model: Model, config: VoxtralRealtimeConfig):
        self.model, self.config = model, config
        self._scale_stacks: dict[tuple[int, ...], list[mx.array]] = {}
        self.encoder = Stepper(self._encode)  # one group: every session with mel queued
        self.prompts = Stepper(self._prefill, key=lambda s, length: length)
        self.decoder = Stepper(self._decode)
        # the steps compiled at their shapes (nn.compiled; the caches explicit in and out)
        self.encoder_step = CompiledStep(self._encoder_graph, "voxtral_realtime.encoder")
        self.decoder_step = CompiledStep(self._decoder_graph, "voxtral_realtime.decoder")

    # -- encoder ------------------------------------------------------------------
    def _encode(self, batch: Batch[Session], _items) -> list[None]:
        """The next whole tokens of every row's queued mel through the encoder (with fixed
        shapes a power-of-two number of tokens, whatever the feed sizes)."""
        streams = batch.streams
        n = chunk_size(min(min(len(s.mel_todo) for s in streams) // MEL_PER_TOKEN,
                           streams[0].enc_chunk_tokens))
        F = n * MEL_PER_TOKEN
        mel = batch.stack_host([s.mel_todo[:F] for s in streams])
        states = [s.enc_state for s in streams]
        conv = []
        for j in range(len(states[0].conv)):
            c = ConvCache()
            c.tail = batch.stack([st.conv[j].tail for st in states])
            conv.append(c)
        kv = [RingBatch.gather([st.kv[j] for st in states], size=batch.size)
              for j in range(len(states[0].kv))]
        state = EncoderState(conv, kv)
        if compile_enabled() and all(c.tail is not None for c in conv) and kv[0].keys is not None:
            emb = self._encode_compiled(mel, state)
        else:
            emb = self.model.embed_audio(mel, state)
        mx.async_eval(emb, state.arrays())
        tails = [batch.rows_of(c.tail) for c in state.conv]
        for i, (s, e) in enumerate(zip(streams, batch.rows_of(emb), strict=True)):
            s.add_audio(e, n)
            for c, t in zip(s.enc_state.conv, tails, strict=True):
                c.tail = t[i]
        return [None] * batch.n

    def _encode_compiled(self, mel: mx.array, state: EncoderState) -> mx.array:
        """`embed_audio` as one compiled graph: the conv tails and rings in and out."""
        e = self.config.encoder
        L = mel.shape[1] // 2  # encoder frames (conv stem stride 2)
        reanchor(state.kv, L, e.max_position, e.head_dim, e.rope_theta)
        kv = state.kv
        n = [c.prepare(L) for c in kv][0]
        offsets, rope = kv[0].clocks()
        kind = kv[0].mask_kind(L, n)
        start = _start(kv[0], L)
        key = (mel.shape, n, kind, kv[0].kv_bits, start is None)
        emb, tails, keys, values = self.encoder_step(
            key, mel, [c.tail for c in state.conv], [c.keys for c in kv], [c.values for c in kv],
            offsets, rope, _ring(kv[0]), kind, start)
        for c, t in zip(state.conv, tails, strict=True):
            c.tail = t
        for c, k, v in zip(kv, keys, values, strict=True):
            c.advance(k, v, L)
        return emb

    def _encoder_graph(self, mel, tails, keys, values, offsets, rope, ring, kind, start):
        conv = []
        for t in tails:
            c = ConvCache()
            c.tail = t
            conv.append(c)
        views = [RingStep(k, v, offsets, rope, *ring, kind, start)
                 for k, v in zip(keys, values, strict=True)]
        emb = self.model.embed_audio(mel, EncoderState(conv, views))
        return (emb, [c.tail for c in conv], [r.keys for r in views],
                [r.values for r in views])

    def encode(self, sessions: list[Session]) -> None:
        """Run every queued whole token of mel through the encoder, batched."""
        self.encoder.run(sessions, lambda s: True if len(s.mel_todo) else None)

    # -- decoder ------------------------------------------------------------------
    def _scales(self, rows: list[Session]) -> list[mx.array]:
        """Per-layer ffn scales of the rows: shared when every row has the same delay."""
        key = tuple(s.n_delay for s in rows)
        if all(k == key[0] for k in key):
            return rows[0].ffn_scales
        cache = self._scale_stacks
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[key] = [mx.concatenate([s.ffn_scales[j] for s in rows])[:, None]
                          for j in range(len(rows[0].ffn_scales))]
        return cache[key]

    def choose(self, rows: list[Session], logits: mx.array, boosted: bool):
        """The next token of each row from its (B, vocab) logits: the one place a decoder step
        turns logits into tokens (rows past len(rows) are padding). Greedy, after each row's
        phrase-boosting bias when `boosted`; with the chosen tokens' logprobs (the model's own
        log-softmax) when a row asked. Both are queued for evaluation."""
        bias = None
        if boosted:
            pad = [None] * (logits.shape[0] - len(rows))
            bias = boost_bias([s.booster for s in rows] + pad, self.config.decoder.vocab_size,
                              logits.dtype)
        tok = greedy(logits, bias)
        lp = chosen_logprob(logits, tok) if any(s.lp is not None for s in rows) else None
        mx.async_eval(tok, *([] if lp is None else [lp]))
        return tok, lp

    def _forward(self, batch: Batch[Session], tokens: mx.array, audio: mx.array,
                 out: dict[int, str] | None = None):
        """One decoder forward of the batch's rows: (size, L) tokens and (size, L, dim) audio
        -> the next token of each row and their logprobs (or None), queued for evaluation.
        The rows' unread tokens are read into `out` while this step runs (before choosing,
        when a row boosts phrases: the bias needs them)."""
        m, rows = self.model, batch.streams
        caches = [RingBatch.gather([s.dec_cache[j] for s in rows], size=batch.size)
                  for j in range(len(m.layers))]
        scales = self._scales(batch.rows)
        boosted = any(s.booster for s in rows)
        want_lp = any(s.lp is not None for s in rows)
        if compile_enabled() and tokens.shape[1] == 1 and caches[0].keys is not None:
            logits, nxt = self._decode_compiled(tokens, audio, scales, caches,
                                                None if boosted else want_lp)
        else:
            h = m.hidden(tokens, audio, scales, caches)
            logits = m.logits(h[:, -1])  # only the last position needs the (vocab-sized) head
            nxt = None
        if boosted and out is not None:  # the phrase bias needs the unread tokens: read first
            mx.async_eval(logits)
            read_emit(rows, out)
        if nxt is None:
            nxt = self.choose(rows, logits, boosted)  # step p+1 runs while step p's are read
        else:
            mx.async_eval(nxt[0], *([] if nxt[1] is None else [nxt[1]]))
        if out is not None:
            read_emit(rows, out)
        return nxt

    def _decode_compiled(self, tokens: mx.array, audio: mx.array, scales: list[mx.array],
                         caches: list[RingBatch], choose: bool | None):
        """One decoder position as one compiled graph, the rings in and out. `choose`: also
        the greedy token (and its logprob when True) in the graph; None: the logits only
        (phrase boosting chooses on the host's bias). Returns (logits or None, (token,
        logprob) or None)."""
        d = self.config.decoder
        reanchor(caches, 1, d.max_position, d.head_dim, d.rope_theta)
        n = [c.prepare(1) for c in caches][0]
        offsets, rope = caches[0].clocks()
        kind = caches[0].mask_kind(1, n)
        start = _start(caches[0], 1)
        key = (tokens.shape, scales[0].shape, n, kind, caches[0].kv_bits, choose, start is None)
        out, lp, keys, values = self.decoder_step(
            key, tokens, audio, scales, [c.keys for c in caches], [c.values for c in caches],
            offsets, rope, _ring(caches[0]), kind, choose, start)
        for c, k, v in zip(caches, keys, values, strict=True):
            c.advance(k, v, 1)
        return (out, None) if choose is None else (None, (out, lp))

    def _decoder_graph(self, tokens, audio, scales, keys, values, offsets, rope, ring, kind,
                       choose, start):
        views = [RingStep(k, v, offsets, rope, *ring, kind, start)
                 for k, v in zip(keys, values, strict=True)]
        h = self.model.hidden(tokens, audio, scales, views)
        out = self.model.logits(h[:, -1])
        lp = None
        if choose is not None:
            logits, out = out, greedy(out, None)
            lp = chosen_logprob(logits, out) if choose else None
        return out, lp, [r.keys for r in views], [r.values for r in views]

    def _prefill(self, batch: Batch[Session], lengths: list[int]) -> list[str]:
        """The prompt of every row (one prompt length per batch), at position 0."""
        P = lengths[0]
        streams = batch.streams
        audio = batch.stack([s.take_audio(0, P) for s in streams])
        tokens = mx.array(batch.padded([s.prompt for s in streams]))
        last, lp = self._forward(batch, tokens, audio)
        for i, s in enumerate(streams):
            s.last, s.unread = (last, i), (last, lp, i)
            s.position = P
        return [""] * batch.n

    def _decode(self, batch: Batch[Session], _positions) -> list[str]:
        """One position of every row: its last token and its audio embedding."""
        rows, size = batch.streams, batch.size
        refs = [s.last for s in rows]
        a0 = refs[0][0]
        if a0.shape[0] == size and all(a is a0 and j == i for i, (a, j) in enumerate(refs)):
            refs += [(a0, i) for i in range(batch.n, size)]  # the last step's padding
        else:
            refs = batch.padded(refs)
        tokens = stack_rows(refs)
        audio = batch.stack([s.take_audio(s.position, s.position + 1) for s in rows])
        out: dict[int, str] = {}
        nxt, lp = self._forward(batch, tokens[:, None], audio, out)
        for i, s in enumerate(rows):
            s.position += 1
            s.last, s.unread = (nxt, i), (nxt, lp, i)
        return [out.get(id(s), "") for s in rows]

    def decode(self, sessions: list[Session], limits: list[int]) -> list[str]:
        """Feed every position < min(limit, positions with audio) of each session, in
        batched steps; returns each session's new text."""
        end = {id(s): min(lim, s.n_audio) for s, lim in zip(sessions, limits, strict=True)}
        # prompt prefill for sessions that reached it, batched by prompt length
        if any(s.last is None for s in sessions):
            self.prompts.run(sessions, lambda s: len(s.prompt) if (
                s.last is None and not s.done and end[id(s)] >= len(s.prompt)) else None)
        texts = self.decoder.run(sessions, lambda s: s.position if (
            s.last is not None and not s.done and s.position < end[id(s)]) else None)
        out = {id(s): "".join(texts[id(s)]) for s in sessions}
        read_emit([s for s in sessions if not s.done], out)
        for s in sessions:
            s.unread = None
        return [out[id(s)] for s in sessions]

    # -- a tick -------------------------------------------------------------------
    def feed(self, sessions: list[Session], audios: list[np.ndarray]) -> list[str]:
        for s, x in zip(sessions, audios, strict=True):
            s.take_samples(x)
        live = [s for s in sessions if not s.done]  # after EOS the audio is not needed
        self.encode(live)
        texts = dict(zip(map(id, live), self.decode(live, [s.n_audio for s in live]),
                         strict=True))
        return [texts.get(id(s), "") for s in sessions]

    def finish(self, sessions: list[Session]) -> list[str]:
        live = [s for s in sessions if not s.finished]
        limits = [s.take_end() for s in live]
        self.encode([s for s in live if not s.done])
        texts = self.decode(live, limits)
        out = {id(s): t + s.detok.flush() for s, t in zip(live, texts, strict=True)}
        mx.clear_cache()
        return [out.get(id(s), "") for s in sessions]


def _start(c: RingBatch, length: int) -> mx.array | None:
    """RingStep's `start` for the rows of `c` (None: an index write per row)."""
    start = write_start([r.offset for r in c.rows], length, c.capacity)
    return None if start is None else mx.array([start], mx.int32)


def _ring(c: RingBatch) -> tuple:
    """A ring's constants inside a compiled step (RingStep's capacity, window, kv_bits)."""
    return c.capacity, c.window, c.kv_bits


def _read(rows: list[Session], k: int = 0) -> list:
    """The unread token (k=1: its logprob, None when not computed) of each row: one host
    read per batched array."""
    lists: dict[int, list] = {}
    out = []
    for s in rows:
        a, i = s.unread[k], s.unread[-1]
        if a is not None and id(a) not in lists:
            lists[id(a)] = a.tolist()
        out.append(None if a is None else lists[id(a)][i])
    return out


def read_emit(rows: list[Session], out: dict[int, str]) -> None:
    """Read the rows' unread tokens (one host read per batched array), emit them, and add
    each row's new text to out[id(row)]."""
    unread = [s for s in rows if s.unread is not None]
    for s, tok, lp in zip(unread, _read(unread), _read(unread, 1), strict=True):
        out[id(s)] = out.get(id(s), "") + s.emit(tok, lp)
        s.unread = None
