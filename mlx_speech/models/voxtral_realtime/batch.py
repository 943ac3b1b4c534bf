"""Batched stepping: every session that has audio ready advances in shared steps.

One tick (`feed_many`) runs batched encoder chunks, then batched decoder steps:
each step stacks the sessions that have a position ready on the batch axis,
with per-row ring caches, RoPE clocks, masks, re-anchoring, conv tails and
delay conditioning. A lone session is a batch of one (the same code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ...nn import ConvCache, RingBatch, stack_rows
from ...nn import boost as _boost
from .config import MEL_PER_TOKEN
from .model import EncoderState

if TYPE_CHECKING:
    from . import VoxtralRealtime
    from .session import Session

CLEAR_CACHE_EVERY = 256  # decoder steps between mx.clear_cache calls


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
    """Run every queued whole token of mel through the encoder, batched."""
    m = owner.model
    while True:
        active = [s for s in sessions if len(s._mel_todo)]
        if not active:
            return
        n = min(min(len(s._mel_todo) for s in active) // MEL_PER_TOKEN,
                active[0].enc_chunk_tokens)
        F = n * MEL_PER_TOKEN
        mel = mx.array(np.stack([s._mel_todo[:F] for s in active]))
        n_conv, n_kv = len(active[0].enc_state.conv), len(active[0].enc_state.kv)
        state = EncoderState(
            [_stack_tails([s.enc_state.conv[j] for s in active]) for j in range(n_conv)],
            [RingBatch.gather([s.enc_state.kv[j] for s in active]) for j in range(n_kv)])
        emb = m.embed_audio(mel, state)
        mx.async_eval(emb, state.arrays())
        for i, s in enumerate(active):
            s._mel_todo = s._mel_todo[F:]
            s._audio.append(emb[i: i + 1] if len(active) > 1 else emb)
            s._n_audio += n
            for j, c in enumerate(state.conv):
                s.enc_state.conv[j].tail = c.tail[i: i + 1] if len(active) > 1 else c.tail


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


def _choose(rows: list[Session], logits: mx.array, bias: mx.array | None):
    """The greedy tokens (phrase bias applied) and, when a row asked, their logprobs (the
    model's own log-softmax); both evaluated asynchronously."""
    tok = _boost.greedy(logits, bias)
    lp = _boost.chosen_logprob(logits, tok) if any(s.lp is not None for s in rows) else None
    mx.async_eval(tok, *([] if lp is None else [lp]))
    return tok, lp


def _bias(rows: list[Session], h: mx.array) -> mx.array | None:
    """Each row's phrase-boosting bias (None: no row boosts)."""
    return _boost.bias([s.booster for s in rows], rows[0].owner.config.decoder.vocab_size,
                       h.dtype)


def decode(owner: VoxtralRealtime, sessions: list[Session], limits: list[int]) -> list[str]:
    """Feed every position < min(limit, positions with audio) of each session, in
    batched steps; returns each session's new text."""
    m = owner.model
    out: dict[int, list[str]] = {id(s): [] for s in sessions}
    end = {id(s): min(lim, s._n_audio) for s, lim in zip(sessions, limits, strict=True)}
    # prompt prefill for sessions that reached it, batched by prompt length
    fresh = [s for s in sessions if s._last is None and not s.done
             and end[id(s)] >= len(s.prompt)]
    for P in sorted({len(s.prompt) for s in fresh}):
        g = [s for s in fresh if len(s.prompt) == P]
        x = mx.concatenate([s._take_audio(0, P) for s in g])
        caches = [RingBatch.gather([s.dec_cache[j] for s in g]) for j in range(len(m.layers))]
        h = m.hidden(mx.array([s.prompt for s in g]), x, _scales(owner, g), caches)
        # only the last prompt position needs the (vocab-sized) head
        last, lp = _choose(g, m.logits(h[:, -1]), _bias(g, h))
        for i, s in enumerate(g):
            s._last, s._unread = (last, i), (last, lp, i)
            s.position = P
    while True:
        rows = [s for s in sessions if s._last is not None and not s.done
                and s.position < end[id(s)]]
        if not rows:
            break
        tokens = stack_rows([s._last for s in rows])
        a = [s._take_audio(s.position, s.position + 1) for s in rows]
        a = a[0] if len(a) == 1 else mx.concatenate(a)
        caches = [RingBatch.gather([s.dec_cache[j] for s in rows]) for j in range(len(m.layers))]
        h = m.hidden(tokens[:, None], a, _scales(owner, rows), caches)
        logits = m.logits(h[:, -1])
        boosted = any(s.booster for s in rows)
        if boosted:  # the phrase bias needs step p's tokens: read them first
            mx.async_eval(logits)
            _read_emit(rows, out)
        # step p+1 runs while step p's tokens are read
        nxt, lp = _choose(rows, logits, _bias(rows, h) if boosted else None)
        _read_emit(rows, out)
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
