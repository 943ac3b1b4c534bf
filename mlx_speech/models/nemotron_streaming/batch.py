"""Batched stepping: sessions with audio ready advance in shared encoder calls and
one RNN-T greedy loop over all of them.

A tick (`feed_many`) splits each session's new mel into bounded pieces; piece k
of every session runs in one encoder call per group of sessions whose streaming
state has the same shape (same piece length, latency mode, conv-buffer fill,
pending frames and attention-cache fill: in a live server, every session fed
whole frames after its first seconds). The greedy loop then runs over the group
with per-row frame pointers, symbol counts and masked predictor updates. A lone
session is a batch of one (the same code).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ...nn import ConvCache
from ...nn import boost as _boost
from ..asr import CLEAR_CACHE_EVERY
from .encoder import ContextKVCache, EncoderState, StridedConvCache
from .transducer import DecoderState, Model

if TYPE_CHECKING:
    from . import NemotronStreaming
    from .session import Session

MAX_MEL_PER_CALL = 800  # bounds one encoder call (a big feed is split): 8 s of audio
# Pad a group to a power of two with copies of its first row (dropped after the step): GPU
# backends build a cuDNN graph per input shape (attention, convolutions), so a server's changing
# session count then reuses a few shapes. On the CPU a padded row costs a real one: None = GPU only.
PAD_BATCH: bool | None = None


def _padded(n: int) -> int:
    on = PAD_BATCH if PAD_BATCH is not None else mx.default_device().type == mx.DeviceType.gpu
    return 1 << (n - 1).bit_length() if on else n


def _len(a: mx.array | None) -> int:
    return -1 if a is None else a.shape[1]


def _signature(s: Session, n_mel: int, final: bool) -> tuple:
    """Sessions with equal signatures have equally shaped encoder state."""
    st = s.enc_state
    return (n_mel, final, st.right_context, tuple(_len(c.buf) for c in st.subsampling),
            _len(st.pending), st.offset % (st.right_context + 1))


def _cat(arrays: list[mx.array | None]) -> mx.array | None:
    if arrays[0] is None:
        return None
    return arrays[0] if len(arrays) == 1 else mx.concatenate(arrays, axis=0)


def _stack_encoder(states: list[EncoderState]) -> EncoderState:
    s0 = states[0]
    if len(states) == 1:
        return s0
    sub = []
    for j in range(len(s0.subsampling)):
        c = StridedConvCache()
        c.buf = _cat([st.subsampling[j].buf for st in states])
        sub.append(c)
    lengths = [st.kv[0].valid for st in states]
    kv = []
    for j in range(len(s0.kv)):  # every cache is kv.size long (masked zeros in front)
        c = ContextKVCache(s0.kv[j].size)
        c.keys, c.values = (_cat(_fill_fresh([getattr(st.kv[j], name) for st in states]))
                            for name in ("keys", "values"))
        kv.append(c)
    conv = []
    for j in range(len(s0.conv)):
        c = ConvCache()
        c.tail = _cat(_fill_fresh([st.conv[j].tail for st in states]))
        conv.append(c)
    return EncoderState(s0.right_context, sub, kv, conv, _cat([st.pending for st in states]),
                        s0.offset, s0.pos_shape, s0.pos_keys, lengths)


def _fill_fresh(tails: list[mx.array | None]) -> list[mx.array | None]:
    """Conv tails and KV caches of streams not started yet are zeros, as their caches start
    (a KV cache's zeros are masked)."""
    have = [t for t in tails if t is not None]
    if not have or len(have) == len(tails):
        return tails
    zero = mx.zeros_like(have[0])
    return [zero if t is None else t for t in tails]


def _row(a: mx.array | None, i: int) -> mx.array | None:
    return None if a is None else a[i: i + 1]


def _split_encoder(b: EncoderState, states: list[EncoderState], offset: int) -> None:
    if len(states) == 1:
        return
    n = b.offset - offset  # frames through the layers in this call, every row
    for i, st in enumerate(states):
        for c, bc in zip(st.subsampling, b.subsampling, strict=True):
            c.buf = _row(bc.buf, i)
        for c, bc in zip(st.kv, b.kv, strict=True):
            if bc.keys is not None:
                c.keys, c.values = bc.keys[i: i + 1], bc.values[i: i + 1]
                c.valid = min(c.size, c.valid + n)  # this row's real frames
        for c, bc in zip(st.conv, b.conv, strict=True):
            c.tail = _row(bc.tail, i)
        st.pending, st.offset = _row(b.pending, i), b.offset
        st.pos_shape, st.pos_keys = b.pos_shape, b.pos_keys


def _stack_decoder(states: list[DecoderState]) -> DecoderState:
    if len(states) == 1:
        return states[0]
    n = len(states[0].h)
    return DecoderState(_cat([s.g for s in states]),
                        [_cat([s.h[j] for s in states]) for j in range(n)],
                        [_cat([s.c[j] for s in states]) for j in range(n)])


def _split_decoder(b: DecoderState, states: list[DecoderState]) -> list[DecoderState]:
    if len(states) == 1:
        return [b]
    return [DecoderState(_row(b.g, i), [_row(h, i) for h in b.h], [_row(c, i) for c in b.c])
            for i in range(len(states))]


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


def _step(owner: NemotronStreaming, group: list[Session], mels: list[np.ndarray],
          final: bool) -> list[str]:
    m = owner.model
    n = len(group)
    pad = _padded(n) - n  # padded rows repeat row 0; their outputs are dropped
    st = _stack_encoder([s.enc_state for s in group] + [group[0].enc_state] * pad)
    offset = st.offset
    chunk = None  # no new mel (a final flush): nothing zero-size reaches a kernel
    if len(mels[0]):
        chunk = mx.array(np.stack(mels + [mels[0]] * pad)).astype(m.dtype)
    x = m.encoder(chunk, state=st, final=final)
    if x is not None:
        x = m.project(x, [s.prompt for s in group] + [group[0].prompt] * pad)
    mx.eval(x, st.arrays())
    _split_encoder(st, [s.enc_state for s in group], offset)
    if x is None:
        return [""] * n
    dec_in = [s.dec_state for s in group] + [group[0].dec_state] * pad
    boosters = [s.booster for s in group] + [copy.copy(group[0].booster)] * pad
    lps = [[] for _ in range(n + pad)] if any(s.lp is not None for s in group) else None
    toks, where, dec = greedy_decode(m, x, _stack_decoder(dec_in),
                                     boosters if any(boosters) else None, lps)
    toks, where = toks[:n], where[:n]
    out = []
    for s, tk, wh, d in zip(group, toks, where, _split_decoder(dec, [s.dec_state for s in group]),
                            strict=True):
        s.dec_state = d
        if s.lp is not None:
            for k, v in zip(tk, lps[len(out)], strict=True):
                s.lp.add(k, v)
        s.token_ids += tk
        s.frames += [s.n_frames + w for w in wh]
        s.n_frames += x.shape[1]
        out.append("".join(s._detok.add(k) for k in tk))
    owner._calls += 1
    if owner._calls % CLEAR_CACHE_EVERY == 0:
        mx.clear_cache()
    return out


def run(owner: NemotronStreaming, sessions: list[Session], mels: list[np.ndarray | None],
        final: bool) -> list[str]:
    """Encode and decode each session's new mel (None: nothing to run), batched."""
    out = {id(s): [] for s in sessions}
    pieces = {}
    for s, mel in zip(sessions, mels, strict=True):
        if mel is not None:
            pieces[id(s)] = [mel[i: i + MAX_MEL_PER_CALL]
                             for i in range(0, max(len(mel), 1), MAX_MEL_PER_CALL)]
    k = 0
    while True:
        items = [(s, pieces[id(s)][k], final and k == len(pieces[id(s)]) - 1)
                 for s in sessions if id(s) in pieces and k < len(pieces[id(s)])]
        if not items:
            break
        groups: dict[tuple, list] = {}
        for s, mel, last in items:
            groups.setdefault(_signature(s, len(mel), last), []).append((s, mel, last))
        for g in groups.values():
            texts = _step(owner, [s for s, _, _ in g], [mel for _, mel, _ in g], g[0][2])
            for (s, _, _), text in zip(g, texts, strict=True):
                out[id(s)].append(text)
        k += 1
    return ["".join(out[id(s)]) for s in sessions]
