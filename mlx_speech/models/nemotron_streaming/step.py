"""Nemotron's streaming session and its batched step (through the one stepper,
`models/stepper.py`): sessions with audio ready advance in shared encoder calls and one RNN-T
greedy loop over all of them.

A tick (`Steps.run`, from the owner's feed_many) splits each session's new mel into bounded
pieces; piece k of every session runs in round k, one encoder call per group of sessions whose
streaming state has the same shape (same piece length, latency mode, conv-buffer fill, pending
frames and attention-cache fill: in a live server, every session fed whole frames after its
first seconds). The greedy loop then runs over the group with per-row frame pointers, symbol
counts and masked predictor updates. A lone session is a batch of one (the same code).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ...nn import (
    CompiledStep,
    ConvCache,
    boost_bias,
    chosen_logprob,
    compile_enabled,
    greedy_transducer,
)
from ...text import StreamingDecoder
from .. import asr
from ..asr import TokenLogprobs, Word, drain_cut, group_words
from ..nemo import StreamingNemoLogMel
from ..stepper import Batch, Stepper
from .config import FRAME_MS
from .model import ContextKVCache, DecoderState, EncoderState, Model, StridedConvCache

if TYPE_CHECKING:
    from ...text import Vocabulary
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


# -- the batched step --------------------------------------------------------------------------
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


def joint_round(model: Model, frames: mx.array, g: mx.array, bias: mx.array | None,
                want_lp: bool) -> tuple[mx.array, mx.array | None]:
    """One greedy round's joint: projected frames (B, T, dim) and predictor outputs (B, dim)
    -> the chosen token of every (row, frame) and, when `want_lp`, its log-probability."""
    logits = model.joint(frames, g[:, None])
    ks = greedy_transducer(logits, bias, model.config.blank_id)
    return ks, chosen_logprob(logits, ks) if want_lp else None


def predict(model: Model, emit: mx.array, g: mx.array, h: list[mx.array], c: list[mx.array],
            on: mx.array | None) -> tuple[mx.array, list[mx.array], list[mx.array]]:
    """The predictor advanced by each row's emitted token (B,); rows where `on` (B,) is
    False keep their state (None: every row emitted)."""
    new = model.decoder(emit, DecoderState(g, h, c))
    if on is None:
        return new.g, new.h, new.c
    m = on[:, None]
    return (mx.where(m, new.g, g), [mx.where(m, a, b) for a, b in zip(new.h, h, strict=True)],
            [mx.where(m, a, b) for a, b in zip(new.c, c, strict=True)])


def greedy_decode(model: Model, frames: mx.array, state: DecoderState, boosters=None,
                  logprobs: list[list[float]] | None = None, joint=None, predictor=None,
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
    `joint(key, frames, g, bias, want_lp)` / `predictor(key, emit, g, h, c, on)`: the round's
    two graphs (`joint_round`, `predict`; compiled per shape key by the family's step),
    default plain. Returns per row (tokens, frame index of each) and the new state.
    """
    joint = joint or (lambda _key, *a: joint_round(model, *a))
    predictor = predictor or (lambda _key, *a: predict(model, *a))
    c = model.config
    blank, max_symbols = c.blank_id, c.max_symbols
    B, T = frames.shape[:2]
    tokens: list[list[int]] = [[] for _ in range(B)]
    where: list[list[int]] = [[] for _ in range(B)]
    t = np.zeros(B, np.int64)  # each row's current frame
    n = np.zeros(B, np.int64)  # symbols emitted at that frame so far
    while t.min() < T:
        t0 = int(t.min())
        bias = boost_bias(boosters, blank) if boosters else None
        want_lp = logprobs is not None
        ks, lp = joint((B, T - t0, bias is None, want_lp), frames[:, t0:], state.g, bias,
                       want_lp)
        if want_lp:
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
        every = bool(on.all())
        state = DecoderState(*predictor((B, every), mx.array(emit.astype(np.int32)), state.g,
                                        state.h, state.c, None if every else mx.array(on)))
        for b in np.flatnonzero(on):
            if n[b] == max_symbols:
                t[b], n[b] = t[b] + 1, 0
    return tokens, where, state


class Steps:
    """The family's step over a loaded model: `run` advances sessions together."""

    def __init__(self, model: Model):
        self.model = model
        self.stepper = Stepper(self._step, key=_signature)
        # the steps compiled at their shapes (nn.compiled; the caches explicit in and out)
        self.layers_step = CompiledStep(self._layers_graph, "nemotron.encoder")
        self.joint_step = CompiledStep(partial(joint_round, model), "nemotron.joint")
        self.predict_step = CompiledStep(partial(predict, model), "nemotron.predictor")

    def _layers(self, x: mx.array, pos_keys: list[mx.array], mask: mx.array | None,
                kv: list[ContextKVCache], conv: list[ConvCache]) -> mx.array:
        """The encoder's conformer layers over a chunk, as one compiled graph (the caches
        in and out) once every cache holds state (a stream's first chunk runs plainly)."""
        if not compile_enabled() or kv[0].keys is None or any(c.tail is None for c in conv):
            return self.model.encoder.run_layers(x, pos_keys, mask, kv, conv)
        key = (x.shape, None if mask is None else mask.shape, kv[0].keys.shape,
               conv[0].tail.shape)
        x, keys, values, tails = self.layers_step(
            key, x, pos_keys, mask, [c.keys for c in kv], [c.values for c in kv],
            [c.tail for c in conv], kv[0].size)
        for c, k, v in zip(kv, keys, values, strict=True):
            c.keys, c.values = k, v
            c.valid = min(c.size, c.valid + x.shape[1])
        for c, t in zip(conv, tails, strict=True):
            c.tail = t
        return x

    def _layers_graph(self, x, pos_keys, mask, keys, values, tails, size):
        kv, conv = [], []
        for k, v, t in zip(keys, values, tails, strict=True):
            c = ContextKVCache(size)
            c.keys, c.values = k, v
            kv.append(c)
            cc = ConvCache()
            cc.tail = t
            conv.append(cc)
        x = self.model.encoder.run_layers(x, pos_keys, mask, kv, conv)
        return x, [c.keys for c in kv], [c.values for c in kv], [c.tail for c in conv]

    def _step(self, batch: Batch[Session], pieces: list[tuple[np.ndarray, bool]]
              ) -> list[str]:
        m, streams = self.model, batch.streams
        mels, final = [mel for mel, _ in pieces], pieces[0][1]
        st = stack_encoder(batch, [s.enc_state for s in streams])
        offset = st.offset
        chunk = None  # no new mel (a final flush): nothing zero-size reaches a kernel
        if len(mels[0]):
            chunk = batch.stack_host(mels, m.dtype)
        x = m.encoder(chunk, state=st, final=final, layers=self._layers)
        if x is not None:
            x = m.project(x, batch.padded([s.prompt for s in streams]))
        mx.eval(x, st.arrays())
        split_encoder(batch, st, [s.enc_state for s in streams], offset)
        if x is None:
            return [""] * batch.n
        pad = batch.size - batch.n  # padded rows repeat row 0; their outputs are dropped
        boosters = [s.booster for s in streams] + [copy.copy(streams[0].booster)] * pad
        lps = [[] for _ in range(batch.size)] if any(s.lp is not None for s in streams) else None
        dec_in = stack_decoder(batch, [s.dec_state for s in streams])
        toks, where, dec = greedy_decode(m, x, dec_in, boosters if any(boosters) else None, lps,
                                         self.joint_step, self.predict_step)
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
