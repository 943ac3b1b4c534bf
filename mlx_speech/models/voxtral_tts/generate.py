"""Streamed codec decoding, many streams at once.

A `CodecStream` holds one stream's codec state and the frames not decoded yet; a chunk is due
at `first` frames, then every `every` frames. `decode_streams` decodes the pending frames of
many streams in one codec call per group of streams whose chunk and state have the same
shapes (padded to a power of two with fixed shapes): each stream gets what it would get alone.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...nn.cache import fixed_shapes
from .codec import Codec, CodecState
from .step import padded


class CodecStream:
    """Decode frames as they come with an explicit codec state: the joined
    output equals one offline decode and each chunk costs the same."""

    def __init__(self, codec: Codec, first: int = 4, every: int = 16):
        self.codec, self.first, self.every = codec, first, every
        self.state = codec.make_state()
        self.pending: list[np.ndarray] = []
        self.emitted = 0

    @property
    def need(self) -> int:
        """Frames the next chunk takes."""
        return self.first if self.emitted == 0 else self.every

    def add(self, codes: np.ndarray) -> None:
        self.pending.append(codes)

    def due(self, final: bool = False) -> bool:
        """A chunk is ready: `need` frames are pending (`final`: any frame, the stream's end)."""
        return len(self.pending) >= self.need or (final and bool(self.pending))

    def push(self, codes: np.ndarray) -> np.ndarray | None:
        self.add(codes)
        return decode_streams([self])[0] if self.due() else None

    def flush(self) -> np.ndarray | None:
        return decode_streams([self], [True])[0] if self.pending else None


def _slots(state: CodecState) -> list[tuple[object, str]]:
    """Every array a codec state holds, as (holder, attribute)."""
    out = [(t, "x") for t in (*state.convs, state.out)]
    return out + [(c, a) for st in state.kv for c in st for a in ("k", "v")]


def _signature(state: CodecState) -> tuple:
    return tuple(None if (a := getattr(o, n)) is None else a.shape for o, n in _slots(state))


def decode_streams(streams: list[CodecStream],
                   final: list[bool] | None = None) -> list[np.ndarray]:
    """Decode every pending frame of each stream (a stream's end when `final`): one codec call
    per group of streams with the same chunk length and state shapes. Returns each stream's
    float32 samples.

    With fixed shapes a stream's last chunk is padded to a whole chunk by repeating its last
    frame (the codec is causal: the real frames' samples do not see the padding; the state is
    then spent)."""
    final = final or [False] * len(streams)
    groups: dict[tuple, list[tuple[CodecStream, np.ndarray, int]]] = {}
    for s, end in zip(streams, final, strict=True):
        codes, n = np.stack(s.pending), len(s.pending)
        if end and fixed_shapes() and n < s.need:
            codes = np.concatenate([codes, np.repeat(codes[-1:], s.need - n, axis=0)])
        groups.setdefault((len(codes), _signature(s.state)), []).append((s, codes, n))
        s.emitted += n
        s.pending = []
    out: dict[int, mx.array] = {}
    for g in groups.values():
        size = padded(len(g))
        rows = g + [g[0]] * (size - len(g))
        codec = g[0][0].codec
        fs = codec.config.frame_samples
        if size == 1:
            s, codes, n = g[0]
            wav = codec(mx.array(codes)[None], s.state)
            out[id(s)] = wav[0, : n * fs]
            continue
        state = codec.make_state()
        for (o, name), *parts in zip(_slots(state), *(_slots(s.state) for s, _, _ in rows),
                                     strict=True):
            got = [getattr(po, pn) for po, pn in parts]
            setattr(o, name, None if got[0] is None else mx.concatenate(got))
        wav = codec(mx.array(np.stack([c for _, c, _ in rows])), state)
        for i, (s, _, n) in enumerate(g):
            out[id(s)] = wav[i, : n * fs]
            for (o, name), (so, sn) in zip(_slots(state), _slots(s.state), strict=True):
                a = getattr(o, name)
                setattr(so, sn, None if a is None else a[i: i + 1])
    mx.eval(list(out.values()), *(s.state.arrays() for s in streams))
    return [np.array(out[id(s)].astype(mx.float32)) for s in streams]
