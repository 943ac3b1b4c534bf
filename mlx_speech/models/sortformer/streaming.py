"""NeMo's streaming Sortformer (`forward_streaming` + `SortformerModules.streaming_update`),
many streams per call, fixed shapes per step.

Per stream, NeMo keeps pre-encoded frames (after subsampling, before the conformer layers):
a speaker cache ("spkcache", at most `spkcache_len` frames chosen to represent every speaker
seen so far, in arrival order) and a FIFO of the latest `fifo_len` frames. Each step pre-encodes
one chunk of `chunk_len` frames plus `chunk_left_context` / `chunk_right_context` frames of
context, runs the whole network over [spkcache, FIFO, chunk], and keeps the chunk's own
probabilities. The chunk then joins the FIFO; when the FIFO overflows, its oldest frames
(at least `spkcache_update_period`) move to the cache, updating the mean silence embedding;
when the cache overflows it is compressed: per-frame speaker scores (high for confident,
single-speaker speech), boosted so every speaker keeps frames, the top `spkcache_len` frames
kept in time order grouped by speaker, plus silence slots filled with the mean silence
embedding. Speaker ids are therefore arrival-ordered and stay stable across the stream.

Here every stream's cache and FIFO live in one `(spkcache_len + fifo_len, d_model)` buffer
(cache rows first, then FIFO rows, then zeros), so one step is: pad each stream's chunk of mel
to the longest chunk, pre-encode the batch, gather [buffer rows in use, chunk frames] into a
fixed `(spkcache_len + fifo_len + chunk frames)` sequence right-padded with masked frames, run
`Sortformer.infer`, then decide on the host (numpy, on the small probability arrays) which
frames move where, and gather the new buffers. The decision logic follows NeMo's synchronous
`streaming_update` and `_compress_spkcache` line for line, except for one rule NeMo leaves
open: equal scores in its top-k selections are ranked by index (`_ranked`), in the per-speaker
boosts the earlier frame first, in the final selection over NeMo's speaker-major score table
the lower speaker slot, then the earlier frame. NeMo leaves ties to `torch.topk`, whose choice
is unspecified and differs by device; this rule is deterministic (a function of the scores and
their indices, whatever order a sort lists ties in).

Ties are not only between infinite scores (the silence slots, or -inf for non-speech): a frame
two speakers share with equal probabilities has equal finite scores in both speakers' columns,
and the frame can be kept twice, once per speaker. Where only one of the two copies fits, NeMo's
CPU `torch.topk` can keep the other copy than this rule does, and the frame then sits in
another speaker's part of the cache: on a 32 s four-voice clip with NeMo's streaming settings
scaled down, 14 compressions met such ties, and NeMo's probabilities and ours were up to 0.15
apart from the first of them on (docs/diarization.md, "Known differences").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import numpy as np

from ..stepper import Batch
from .config import SortformerConfig
from .model import Sortformer, conv_out_len

SUB = 8  # mel frames per diarization frame


@dataclass
class StreamState:
    """One stream's streaming state (NeMo's StreamingSortformerState, synchronous form)."""

    buffer: mx.array  # (spkcache_len + fifo_len, d_model): cache rows, FIFO rows, zeros
    mean_sil: mx.array  # (d_model,) mean embedding of the silent frames that left the FIFO
    n_spkcache: int = 0
    n_fifo: int = 0
    n_sil: int = 0
    # probabilities of the cache frames, from the step that first compressed it (None before)
    spkcache_preds: np.ndarray | None = None

    def arrays(self) -> list[mx.array]:
        return [self.buffer, self.mean_sil]


def init_state(model: Sortformer, config: SortformerConfig, dtype=mx.float32) -> StreamState:
    d = model.config.d_model
    rows = max(1, config.spkcache_len + config.fifo_len)  # never a zero-size buffer
    return StreamState(mx.zeros((rows, d), dtype), mx.zeros((d,), dtype))


@dataclass
class Chunk:
    """One step's input for one stream: mel frames [start - left, end + right)."""

    mel: np.ndarray  # (left + (end - start) + right, n_mels) float32
    left: int  # mel frames of left context
    right: int  # mel frames of right context


def chunk_bounds(start: int, n_frames: int, config: SortformerConfig,
                 final: bool) -> tuple[int, int, int] | None:
    """NeMo's streaming_feat_loader for the chunk starting at mel frame `start`, with
    `n_frames` mel frames known (all of them when `final`): (left, end, right) or None when
    the chunk cannot be formed yet (or, when final, no audio is left)."""
    step = config.chunk_len * SUB
    if final:
        if start >= n_frames:
            return None
        end = min(start + step, n_frames)
        right = min(config.chunk_right_context * SUB, n_frames - end)
    else:
        end, right = start + step, config.chunk_right_context * SUB
        if end + right > n_frames:
            return None
    left = min(config.chunk_left_context * SUB, start)
    return left, end, right


def _scores(preds: np.ndarray, c: SortformerConfig) -> np.ndarray:
    """NeMo _get_log_pred_scores (float32)."""
    thr = np.float32(c.pred_score_threshold)
    log_p = np.log(np.maximum(preds, thr))
    log_1p = np.log(np.maximum(np.float32(1.0) - preds, thr))
    return (log_p - log_1p + log_1p.sum(axis=1, keepdims=True)
            - np.float32(math.log(0.5))).astype(np.float32)


def _ranked(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Indices that order `values` along `axis` from the largest, equal values in index order:
    decided by (value, index) pairs alone, so no sort's order of ties can change it."""
    shape = [-1 if a == axis % values.ndim else 1 for a in range(values.ndim)]
    idx = np.broadcast_to(np.arange(values.shape[axis]).reshape(shape), values.shape)
    return np.lexsort((idx, -values), axis=axis)


def _boost(scores: np.ndarray, n: int, scale: float) -> np.ndarray:
    """NeMo _boost_topk_scores: raise each speaker's n best scores by -scale*log(0.5)."""
    if n <= 0:
        return scores
    order = _ranked(scores, axis=0)[:n]  # (n, n_spk)
    cols = np.broadcast_to(np.arange(scores.shape[1]), order.shape)
    scores = scores.copy()
    scores[order, cols] -= np.float32(scale * math.log(0.5))
    return scores


def compress(preds: np.ndarray, c: SortformerConfig) -> tuple[np.ndarray, np.ndarray]:
    """NeMo _compress_spkcache on the host: (frame indices (spkcache_len,) into `preds`' frames,
    disabled (spkcache_len,) bool: a silence slot, filled with the mean silence embedding)."""
    n_frames, n_spk = preds.shape
    per_spk = c.spkcache_len // n_spk - c.spkcache_sil_frames_per_spk
    strong = math.floor(per_spk * c.strong_boost_rate)
    weak = math.floor(per_spk * c.weak_boost_rate)
    min_pos = math.floor(per_spk * c.min_pos_scores_rate)
    scores = _scores(preds, c)
    is_speech = preds > 0.5
    scores = np.where(is_speech, scores, np.float32(-np.inf))
    is_pos = scores > 0
    replace = ~is_pos & is_speech & (is_pos.sum(axis=0) >= min_pos)[None]
    scores = np.where(replace, np.float32(-np.inf), scores)
    if c.scores_boost_latest > 0:
        scores[c.spkcache_len:] += np.float32(c.scores_boost_latest)
    scores = _boost(scores, strong, 2.0)
    scores = _boost(scores, weak, 1.0)
    sil = c.spkcache_sil_frames_per_spk
    if sil > 0:
        scores = np.concatenate([scores, np.full((sil, n_spk), np.inf, np.float32)])
    total = scores.shape[0]
    flat = scores.T.reshape(-1)  # speaker-major
    top = _ranked(flat)[: c.spkcache_len]
    top = np.where(flat[top] == -np.inf, np.iinfo(np.int64).max, top)
    top = np.sort(top)
    disabled = top == np.iinfo(np.int64).max
    frames = np.where(disabled, 0, top % total)
    disabled |= frames >= total - sil
    return np.where(disabled, 0, frames), disabled


def network(model: Sortformer, mel: mx.array, mel_len: mx.array, buffers: mx.array,
            gather: mx.array, lengths: mx.array) -> tuple[mx.array, mx.array]:
    """A step's network call, one pure graph (compiled per shape, `nn.compiled`): the chunks'
    mel (B, m_max, n_mels) pre-encoded beside the streams' buffers (B, rows, d), the rows
    `gather` picks ([cache, FIFO, chunk frames], then masked padding) through the model.
    Returns (probabilities (B, t_max, n_spk), the buffers and chunk frames (B, rows + l_max,
    d) the host's update picks from)."""
    emb = model.pre_encode(mel, mel_len)  # (B, l_max, d)
    src = mx.concatenate([buffers, emb.astype(buffers.dtype)], axis=1)
    x = mx.take_along_axis(src, gather[..., None], axis=1)
    return model.infer(x, lengths), src


def _plain(model: Sortformer, _key, *args):
    return network(model, *args)


def step(model: Sortformer, config: SortformerConfig, batch: Batch[StreamState],
         chunks: list[Chunk], network: Callable | None = None) -> list[np.ndarray]:
    """Advance each stream of `batch` by one chunk (one network call over the batch's rows,
    the padding rows' outputs dropped); returns each chunk's speaker probabilities (its
    `chunk` frames, n_spk) as float32 numpy. `network(key, ...)`: the network call
    (`network` above, compiled per shape key), default plain."""
    if network is None:
        network = partial(_plain, model)
    c = config
    states, chunks = batch.rows, batch.padded(chunks)
    B = len(states)
    rows = states[0].buffer.shape[0]
    lc_max, rc_max = c.chunk_left_context, c.chunk_right_context
    m_max = (lc_max + c.chunk_len + rc_max) * SUB
    l_max = conv_out_len(m_max)
    n_mels = chunks[0].mel.shape[1]
    mel = np.zeros((B, m_max, n_mels), np.float32)
    mel_len = np.array([len(ch.mel) for ch in chunks], np.int32)
    for b, ch in enumerate(chunks):
        mel[b, : len(ch.mel)] = ch.mel
    emb_len = conv_out_len(mel_len)
    buffers = mx.stack([s.buffer for s in states])
    # the network's input: [cache, FIFO, chunk frames] contiguous, then masked padding
    t_max = rows + l_max
    gather = np.zeros((B, t_max), np.int32)
    lengths = np.zeros((B,), np.int32)
    for b, s in enumerate(states):
        n_mem = s.n_spkcache + s.n_fifo
        n = n_mem + int(emb_len[b])
        gather[b, :n_mem] = np.arange(n_mem)
        gather[b, n_mem:n] = rows + np.arange(int(emb_len[b]))
        lengths[b] = n
    probs, src = network((B, m_max, rows, buffers.dtype), mx.array(mel), mx.array(mel_len),
                         buffers, mx.array(gather), mx.array(lengths))
    if batch.size > batch.n:
        states, chunks, B = batch.streams, chunks[:batch.n], batch.n
        probs, src, emb_len = probs[:B], src[:B], emb_len[:B]
    mx.eval(probs, src)
    probs_np = np.array(probs.astype(mx.float32))

    outs, new_idx, new_dis, has_sil = [], [], [], []
    sil_w = np.zeros((B, rows + l_max), np.float32)
    sizes = []
    for b, (s, ch) in enumerate(zip(states, chunks, strict=True)):
        p = probs_np[b]
        lc = round(ch.left / SUB)
        rc = math.ceil(ch.right / SUB)
        n_s, n_f = s.n_spkcache, s.n_fifo
        n_mem = n_s + n_f
        chunk_len = int(emb_len[b]) - lc - rc
        chunk_p = p[n_mem + lc: n_mem + lc + chunk_len]
        outs.append(chunk_p.copy())
        fifo_idx = np.concatenate([np.arange(n_s, n_mem), rows + lc + np.arange(chunk_len)])
        fifo_p = np.concatenate([p[n_s:n_mem], chunk_p])
        spk_idx = np.arange(n_s)
        spk_dis = np.zeros(n_s, bool)
        spk_p = s.spkcache_preds
        new_sil = False
        if n_f + chunk_len > c.fifo_len:
            pop = max(c.spkcache_update_period, chunk_len - c.fifo_len + n_f)
            pop = min(pop, n_f + chunk_len)
            pop_idx, pop_p = fifo_idx[:pop], fifo_p[:pop]
            is_sil = pop_p.sum(axis=1) < np.float32(c.sil_threshold)
            if is_sil.any():
                sil_w[b, pop_idx[is_sil]] = 1.0
                s.n_sil, new_sil = s.n_sil + int(is_sil.sum()), True
            fifo_idx, fifo_p = fifo_idx[pop:], fifo_p[pop:]
            spk_idx = np.concatenate([spk_idx, pop_idx])
            spk_dis = np.zeros(len(spk_idx), bool)
            if spk_p is not None:
                spk_p = np.concatenate([spk_p, pop_p])
            if len(spk_idx) > c.spkcache_len:
                if spk_p is None:  # first compression: this step's probabilities of the cache
                    spk_p = np.concatenate([p[:n_s], pop_p])
                sel, spk_dis = compress(spk_p, c)
                spk_p = np.where(spk_dis[:, None], np.float32(0.0), spk_p[sel])
                spk_idx = spk_idx[sel]
        s.spkcache_preds = spk_p
        has_sil.append(new_sil)
        idx = np.zeros(rows, np.int32)
        dis = np.zeros(rows, bool)
        n_new = len(spk_idx) + len(fifo_idx)
        idx[:n_new] = np.concatenate([spk_idx, fifo_idx])
        dis[: len(spk_idx)] = spk_dis
        new_idx.append(idx)
        new_dis.append(dis)
        sizes.append((len(spk_idx), len(fifo_idx), n_new))

    # mean silence embedding (NeMo _get_silence_profile), then the new buffers
    means = mx.stack([s.mean_sil for s in states])  # (B, d)
    if any(has_sil):
        n_old = mx.array([s.n_sil - int(sil_w[b].sum()) for b, s in enumerate(states)],
                         mx.float32)[:, None]
        n_new = mx.array([max(1, s.n_sil) for s in states], mx.float32)[:, None]
        total = means * n_old + (mx.array(sil_w)[:, None, :] @ src)[:, 0]
        means = mx.where(mx.array(has_sil)[:, None], total / n_new, means)
    gathered = mx.take_along_axis(src, mx.array(np.stack(new_idx))[..., None], axis=1)
    in_use = mx.array(np.stack([np.arange(rows) < n for *_, n in sizes]))[..., None]
    disabled = mx.array(np.stack(new_dis))[..., None]
    buffers = mx.where(disabled, means[:, None, :], gathered)
    buffers = mx.where(in_use, buffers, mx.array(0, buffers.dtype))
    for b, s in enumerate(states):
        s.buffer, s.mean_sil = buffers[b], means[b]
        s.n_spkcache, s.n_fifo = sizes[b][0], sizes[b][1]
    return outs
