"""Nemotron's batched step (through the one stepper, `models/stepper.py`): sessions with
audio ready advance in shared encoder calls and one RNN-T greedy loop over all of them.

A tick (`Steps.run`) splits each session's new mel into bounded pieces; piece k of every
session runs in round k, one encoder call per group of sessions whose streaming state has
the same shape (same piece length, latency mode, conv-buffer fill, pending frames and
attention-cache fill: in a live server, every session fed whole frames after its first
seconds). The greedy loop then runs over the group with per-row frame pointers, symbol
counts and masked predictor updates. A lone session is a batch of one (the same code).
"""

from __future__ import annotations

import copy

import mlx.core as mx
import numpy as np

from ...nn import ConvCache
from ...nn import boost as _boost
from ..stepper import Batch, Stepper
from .encoder import ContextKVCache, EncoderState, StridedConvCache
from .session import Session
from .transducer import DecoderState, Model

MAX_MEL_PER_CALL = 800  # bounds one encoder call (a big feed is split): 8 s of audio


def _len(a: mx.array | None) -> int:
    return -1 if a is None else a.shape[1]


def _signature(s: Session, piece: tuple[np.ndarray, bool]) -> tuple:
    """Sessions with equal signatures have equally shaped encoder state."""
    st, (mel, final) = s.enc_state, piece
    return (len(mel), final, st.right_context, tuple(_len(c.buf) for c in st.subsampling),
            _len(st.pending), st.offset % (st.right_context + 1))


def stack_encoder(batch: Batch, states: list[EncoderState]) -> EncoderState:
    """The streams' encoder states as one batched state (a lone stream's is its own).
    Caches of streams not started yet are zeros, as their caches start (masked)."""
    s0 = states[0]
    if batch.size == 1:
        return s0
    sub = []
    for j in range(len(s0.subsampling)):
        c = StridedConvCache()
        c.buf = batch.stack([st.subsampling[j].buf for st in states])
        sub.append(c)
    kv = []
    for j in range(len(s0.kv)):  # every cache is kv.size long (masked zeros in front)
        c = ContextKVCache(s0.kv[j].size)
        c.keys = batch.stack([st.kv[j].keys for st in states])
        c.values = batch.stack([st.kv[j].values for st in states])
        kv.append(c)
    conv = []
    for j in range(len(s0.conv)):
        c = ConvCache()
        c.tail = batch.stack([st.conv[j].tail for st in states])
        conv.append(c)
    return EncoderState(s0.right_context, sub, kv, conv,
                        batch.stack([st.pending for st in states]), s0.offset, s0.pos_shape,
                        s0.pos_keys, batch.padded([st.kv[0].valid for st in states]))


def split_encoder(batch: Batch, b: EncoderState, states: list[EncoderState],
                  offset: int) -> None:
    """Scatter a batched encoder state (after a call that started at `offset`) back to the
    streams' own states."""
    if batch.size == 1:
        return
    n = b.offset - offset  # frames through the layers in this call, every row
    bufs = [batch.rows_of(c.buf) for c in b.subsampling]
    keys = [batch.rows_of(c.keys) for c in b.kv]
    values = [batch.rows_of(c.values) for c in b.kv]
    tails = [batch.rows_of(c.tail) for c in b.conv]
    pending = batch.rows_of(b.pending)
    for i, st in enumerate(states):
        for c, r in zip(st.subsampling, bufs, strict=True):
            c.buf = r[i]
        for c, k, v in zip(st.kv, keys, values, strict=True):
            if k[i] is not None:
                c.keys, c.values = k[i], v[i]
                c.valid = min(c.size, c.valid + n)  # this row's real frames
        for c, r in zip(st.conv, tails, strict=True):
            c.tail = r[i]
        st.pending, st.offset = pending[i], b.offset
        st.pos_shape, st.pos_keys = b.pos_shape, b.pos_keys


def stack_decoder(batch: Batch, states: list[DecoderState]) -> DecoderState:
    if batch.size == 1:
        return states[0]
    n = len(states[0].h)
    return DecoderState(batch.stack([s.g for s in states]),
                        [batch.stack([s.h[j] for s in states]) for j in range(n)],
                        [batch.stack([s.c[j] for s in states]) for j in range(n)])


def split_decoder(batch: Batch, b: DecoderState) -> list[DecoderState]:
    if batch.size == 1:
        return [b]
    h = [batch.rows_of(a) for a in b.h]
    c = [batch.rows_of(a) for a in b.c]
    return [DecoderState(g, [r[i] for r in h], [r[i] for r in c])
            for i, g in enumerate(batch.rows_of(b.g))]


def greedy_decode(model: Model, frames: mx.array, state: DecoderState, boosters=None,
                  logprobs: list[list[float]] | None = None,
                  ) -> tuple[list[list[int]], list[list[int]], DecoderState]:
    """Frame-synchronous RNN-T greedy over projected encoder frames (B, T, dim).

    Per row and frame: emit argmax tokens until blank or `max_symbols` emissions,
    then move on; the predictor advances only on emissions (rows without one keep
    their state). Each round is one joint call over every row's remaining frames,
    so blank runs cost no extra syncs and syncs scale with tokens, not frames.
    `boosters`: per row a phrase-boosting walk or None (NeMo's GPU-PB fusion: the bias
    of the row's graph state moves the non-blank choice; advanced with each emission).
    `logprobs`: per row a list that gets each emitted token's log-probability (the joint's
    log-softmax, blank included), read with the tokens (no extra sync); None: not computed.
    Returns per row (tokens, frame index of each) and the new state.
    """
    c = model.config
    blank, max_symbols = c.blank_id, c.max_symbols
    B, T = frames.shape[:2]
    tokens: list[list[int]] = [[] for _ in range(B)]
    where: list[list[int]] = [[] for _ in range(B)]
    t = np.zeros(B, np.int64)  # each row's current frame
    n = np.zeros(B, np.int64)  # symbols emitted at that frame so far
    while t.min() < T:
        t0 = int(t.min())
        bias = _boost.bias(boosters, blank) if boosters else None
        logits = model.joint(frames[:, t0:], state.g[:, None])
        ks = _boost.greedy_transducer(logits, bias, blank)
        if logprobs is not None:
            lp = _boost.chosen_logprob(logits, ks)
            mx.eval(ks, lp)
            lp = np.array(lp)
        ks = np.array(ks)
        emit = np.full(B, blank, np.int64)
        for b in range(B):
            if t[b] >= T:
                continue
            row = ks[b, t[b] - t0:]
            hit = np.flatnonzero(row != blank)
            if not len(hit):
                t[b] = T
                continue
            f = t[b] + int(hit[0])
            if f != t[b]:
                n[b] = 0
            t[b], emit[b] = f, row[hit[0]]
            tokens[b].append(int(emit[b]))
            where[b].append(int(f))
            if boosters and boosters[b] is not None:
                boosters[b].advance(int(emit[b]))
            if logprobs is not None:
                logprobs[b].append(float(lp[b, f - t0]))
            n[b] += 1
        on = emit != blank
        if not on.any():
            break
        new = model.decoder(mx.array(emit.astype(np.int32)), state)
        if on.all():
            state = new
        else:
            m = mx.array(on)[:, None]
            state = DecoderState(mx.where(m, new.g, state.g),
                                 [mx.where(m, a, b) for a, b in zip(new.h, state.h, strict=True)],
                                 [mx.where(m, a, b) for a, b in zip(new.c, state.c, strict=True)])
        for b in np.flatnonzero(on):
            if n[b] == max_symbols:
                t[b], n[b] = t[b] + 1, 0
    return tokens, where, state


class Steps:
    """The family's step over a loaded model: `run` advances sessions together."""

    def __init__(self, model: Model):
        self.model = model
        self.stepper = Stepper(self._step, key=_signature)

    def _step(self, batch: Batch[Session], pieces: list[tuple[np.ndarray, bool]]
              ) -> list[str]:
        m, streams = self.model, batch.streams
        mels, final = [mel for mel, _ in pieces], pieces[0][1]
        st = stack_encoder(batch, [s.enc_state for s in streams])
        offset = st.offset
        chunk = None  # no new mel (a final flush): nothing zero-size reaches a kernel
        if len(mels[0]):
            chunk = batch.stack_host(mels, m.dtype)
        x = m.encoder(chunk, state=st, final=final)
        if x is not None:
            x = m.encoder_projector(x)
        mx.eval(x, st.arrays())
        split_encoder(batch, st, [s.enc_state for s in streams], offset)
        if x is None:
            return [""] * batch.n
        pad = batch.size - batch.n  # padded rows repeat row 0; their outputs are dropped
        boosters = [s.booster for s in streams] + [copy.copy(streams[0].booster)] * pad
        lps = [[] for _ in range(batch.size)] if any(s.lp is not None for s in streams) else None
        dec_in = stack_decoder(batch, [s.dec_state for s in streams])
        toks, where, dec = greedy_decode(m, x, dec_in, boosters if any(boosters) else None, lps)
        out = []
        for i, (s, d) in enumerate(zip(streams, split_decoder(batch, dec), strict=True)):
            s.dec_state = d
            if s.lp is not None:
                for k, v in zip(toks[i], lps[i], strict=True):
                    s.lp.add(k, v)
            s.token_ids += toks[i]
            s.frames += [s.n_frames + w for w in where[i]]
            s.n_frames += x.shape[1]
            out.append("".join(s.detok.add(k) for k in toks[i]))
        return out

    def run(self, sessions: list[Session], mels: list[np.ndarray | None],
            final: bool) -> list[str]:
        """Encode and decode each session's new mel (None: nothing to run), batched."""
        pieces: dict[int, list[tuple[np.ndarray, bool]]] = {}
        for s, mel in zip(sessions, mels, strict=True):
            if mel is not None:
                starts = range(0, max(len(mel), 1), MAX_MEL_PER_CALL)
                pieces[id(s)] = [(mel[i: i + MAX_MEL_PER_CALL], final and i == starts[-1])
                                 for i in starts]
        texts = self.stepper.run(sessions, lambda s: pieces[id(s)].pop(0)
                                 if pieces.get(id(s)) else None)
        return ["".join(texts[id(s)]) for s in sessions]
