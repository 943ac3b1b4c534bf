"""The frame loop (backbone -> semantic + flow head -> feedback) and streamed codec decoding.

Randomness: the only random numbers are the flow head's start noise, one fp32
`normal((1, n_acoustic))` per frame. With `seed`, state = mx.random.key(seed)
and frame i draws with `state, sub = mx.random.split(state)`, key=sub: the same
numbers as mlx-audio after `mx.random.seed(seed)` (its only random calls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np

from .codec import Codec
from .config import END_AUDIO
from .model import Model

CLEAR_EVERY = 256  # frames between mx.clear_cache() calls


def frame_codes(model: Model, prompt: mx.array, max_frames: int, seed: int = 0,
                noise: mx.array | None = None, audio_step_id: int | None = None,
                decode_frame: Callable | None = None) -> Iterator[np.ndarray]:
    """Yield (n_codebooks,) int32 codes per frame until END or `max_frames`.

    `prompt` (1, L, dim) are the prompt embeddings. Frame 0 is decoded from the
    prefill state (vllm-omni, mlx-audio 0.6.2) unless `audio_step_id` is given:
    then that token is fed once more first (voxtral-tts.c, mlx-audio <= 0.5).
    `noise` (max_frames, n_acoustic) replaces the seeded draws. `decode_frame`
    (default `model.decode_frame`) may be a compiled version of it.
    """
    n_ac = model.config.n_acoustic_codebook
    decode_frame = decode_frame or model.decode_frame
    if noise is not None and noise.shape[0] < max_frames:
        raise ValueError(f"noise has {noise.shape[0]} rows for {max_frames} frames")
    cache = model.make_cache()
    t_table = model.acoustic_transformer.time_table()
    h = model.hidden(prompt, cache)[:, -1]
    if audio_step_id is not None:
        h = model.hidden(model.tok_embeddings(mx.array([[audio_step_id]])), cache)[:, -1]
    state = mx.random.key(seed)

    def build(h: mx.array, i: int) -> tuple[mx.array, mx.array]:
        nonlocal state
        if noise is not None:
            x0 = noise[i : i + 1].astype(mx.float32)
        else:
            state, sub = mx.random.split(state)
            x0 = mx.random.normal((1, n_ac), key=sub)
        codes = decode_frame(h, x0, t_table)
        return codes, model.hidden(model.feedback(codes), cache)[:, -1]

    if max_frames <= 0:
        return
    cur = build(h, 0)
    mx.async_eval(*cur)
    for i in range(max_frames):
        nxt = None
        if i + 1 < max_frames:  # queue frame i+1 before waiting for frame i
            nxt = build(cur[1], i + 1)
            mx.async_eval(*nxt)
        codes = np.array(cur[0][0])  # the one sync per frame
        if codes[0] == END_AUDIO:
            break
        yield codes
        if (i + 1) % CLEAR_EVERY == 0:
            mx.clear_cache()
        if nxt is None:
            break
        cur = nxt


class CodecStream:
    """Decode frames as they come with an explicit codec state: the joined
    output equals one offline decode and each chunk costs the same."""

    def __init__(self, codec: Codec, first: int = 4, every: int = 16):
        self.codec, self.first, self.every = codec, first, every
        self.state = codec.make_state()
        self.pending: list[np.ndarray] = []
        self.emitted = 0

    def push(self, codes: np.ndarray) -> np.ndarray | None:
        self.pending.append(codes)
        need = self.first if self.emitted == 0 else self.every
        return self._decode() if len(self.pending) >= need else None

    def flush(self) -> np.ndarray | None:
        return self._decode() if self.pending else None

    def _decode(self) -> np.ndarray:
        wav = self.codec(mx.array(np.stack(self.pending))[None], self.state)[0]
        mx.eval(wav, *self.state.arrays())
        self.emitted += len(self.pending)
        self.pending = []
        return np.array(wav.astype(mx.float32))
