"""The frame loop of many prompts at once: one batched forward per frame.

A `Track` is the model state of one prompt being voiced: its rows (last hidden state,
random key, each layer's keys/values) live in a `Batch` of arrays beside the other tracks
that stepped with it, with its own clock (`pos`). `start_tracks` prefills prompts (batched by
length), `step_tracks` queues the next frame of every live track as one forward (backbone
step, semantic head and the 7-step flow head over all rows) and reads the frame queued the call
before: the one host read per frame overlaps the next frame's compute. Tracks join and leave
at any call; each track's codes are what it would get alone (rows share matmuls, never a
reduction; extra cache slots are masked out exactly), and a track alone is a batch of one.

`frame_step` is that forward as a function of explicit state in and out (arrays in, arrays
out, no Python state), so it can be compiled per shape. With `fixed_shapes()` (GPU backends)
batches are padded to powers of two (pad rows copy the first row; their results are dropped),
prompts to a power-of-two length, and attention sees every allocated cache slot (masked), so a
stream reuses a few shapes; on the CPU shapes follow the data (cheaper there).

Randomness: each track draws from its own key (`mx.random.key(seed)`, split once per frame,
as frame_codes always did), so a track's noise does not depend on its neighbours.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np

from ...nn import fixed_shapes, stack_rows
from .config import END_AUDIO
from .model import Model

CLEAR_EVERY = 256  # batched frames between mx.clear_cache() calls
SLOTS_STEP = 256  # cache slots grow in powers of two from here (as nn.transformer.KVCache)
MIN_PROMPT = 16  # with fixed shapes, prompts are padded to a power of two from here
_frames_run = [0]


def padded(n: int) -> int:
    """Rows a step of `n` tracks runs with: a power of two with fixed shapes, else n."""
    return 1 << (n - 1).bit_length() if fixed_shapes() else n


def slots(end: int) -> int:
    """Cache slots held once `end` positions were written."""
    return max(SLOTS_STEP, 1 << (end - 1).bit_length())


def prompt_length(n: int) -> int:
    """Rows a prefill of an n-position prompt runs with (fixed shapes: a power of two)."""
    return max(MIN_PROMPT, 1 << (n - 1).bit_length()) if fixed_shapes() else n


# -- the forward as a function of explicit state -----------------------------------------------
class Slots:
    """One layer's keys/values in one step, as the cache protocol attention asks for
    (`rope_offset`, `make_mask`, `update_and_fetch`) over explicit arrays: row b writes its
    positions pos[b].. and attention sees slots [0, attend)."""

    def __init__(self, keys: mx.array | None, values: mx.array | None, pos: mx.array,
                 n_slots: int, attend: int | None, mask):
        self.keys, self.values, self.rope_offset = keys, values, pos
        self.n_slots, self.attend, self.mask = n_slots, attend, mask

    def make_mask(self, length: int):
        return self.mask

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        B, H, L, _ = k.shape
        if self.keys is None:  # a prefill: fresh slots in the attention's dtype
            self.keys = mx.zeros((B, H, self.n_slots, k.shape[-1]), k.dtype)
            self.values = mx.zeros((B, H, self.n_slots, v.shape[-1]), v.dtype)
        at = self.rope_offset[:, None]
        if L > 1:
            at = at + mx.arange(L)[None]
        idx = at[:, None, :, None]
        self.keys = mx.put_along_axis(self.keys, idx, k, axis=2)
        self.values = mx.put_along_axis(self.values, idx, v, axis=2)
        if self.attend is None or self.attend == self.n_slots:
            return self.keys, self.values
        return self.keys[:, :, : self.attend], self.values[:, :, : self.attend]


def backbone_step(model: Model, x: mx.array, pos: mx.array, kv: list | None,
                  n_slots: int, attend: int | None = None, mask: str | None = "rows"):
    """x (B, L, dim) at positions pos[b] .. pos[b] + L - 1 -> (B, L, dim) final-normed hidden
    states and the layers' new (keys, values), each (B, n_kv_heads, n_slots, head_dim).

    `kv` None starts fresh slots (a prefill). Attention sees slots [0, attend) (None: all):
    `mask` "rows" hides each row's slots past its own position, "causal" is the plain causal
    mask (rows in step from 0, attend == L), None no mask (every row sees every slot)."""
    L = x.shape[1]
    n = n_slots if attend is None else attend
    if mask == "rows":
        q = pos[:, None] + mx.arange(L)[None]
        mask = (mx.arange(n)[None, None] <= q[:, :, None])[:, None]
    caches = [Slots(None, None, pos, n_slots, attend, mask) for _ in model.layers]
    if kv is not None:
        for c, (k, v) in zip(caches, kv, strict=True):
            c.keys, c.values = k, v
    h = model.hidden(x, caches)
    return h, [(c.keys, c.values) for c in caches]


def draw_noise(keys: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """(B, 2) random keys -> the keys after one split each, and (B, n) fp32 normal draws
    (row b: `normal((n,), key=split(keys[b])[1])`, the numbers mlx-audio draws alone)."""
    pairs = mx.vmap(mx.random.split)(keys)
    x0 = mx.vmap(lambda k: mx.random.normal((n,), key=k))(pairs[:, 1])
    return pairs[:, 0], x0


def frame_step(model: Model, decode: Callable, t_table: mx.array, h: mx.array, keys: mx.array,
               pos: mx.array, kv: list, noise: mx.array | None = None,
               given: mx.array | None = None, attend: int | None = None,
               mask: str | None = "rows"):
    """One frame of B rows, explicit state in and out (no host read, no Python state):
    h (B, dim) last hidden states, keys (B, 2) random keys, pos (B,) int32 positions written
    so far, kv the layers' (keys, values) (B, n_kv_heads, S, head_dim) ->
    codes (B, n_codebooks) int32, the next h, keys and kv (positions are pos + 1).

    `decode` is `model.decode_frame` or a compiled version of it; `noise` (B, n_acoustic)
    replaces the draws of the rows where `given` (B,) is true. `attend` / `mask` as in
    `backbone_step`."""
    keys, x0 = draw_noise(keys, model.config.n_acoustic_codebook)
    if noise is not None:
        x0 = mx.where(given[:, None], noise.astype(mx.float32), x0)
    codes = decode(h, x0, t_table)
    out, kv = backbone_step(model, model.feedback(codes), pos, kv, kv[0][0].shape[2],
                            attend, mask)
    return codes, out[:, -1], keys, kv


# -- tracks: the per-prompt state, and the batched calls ------------------------------------------
class Batch:
    """The arrays one call made: row i belongs to tracks[i]; rows past them pad the batch."""

    def __init__(self, h: mx.array, keys: mx.array, kv: list, tracks: list[Track]):
        self.h, self.keys, self.kv, self.tracks = h, keys, kv, tracks
        for i, t in enumerate(tracks):
            t.home, t.index = self, i

    @property
    def size(self) -> int:
        return self.h.shape[0]

    @property
    def n_slots(self) -> int:
        return self.kv[0][0].shape[2]

    def arrays(self) -> list[mx.array]:
        return [self.h, self.keys, *(a for kv in self.kv for a in kv)]


class Track:
    """One prompt being voiced: `prompt` (1, L, dim) embeddings, up to `max_frames` frames
    drawn from `mx.random.key(seed)` (or the rows of `noise`, (max_frames, n_acoustic)).

    `done` once END was read or every frame was read; `frames` counts the frames queued."""

    def __init__(self, prompt: mx.array, max_frames: int, seed: int = 0,
                 noise: mx.array | None = None, t_table: mx.array | None = None):
        if noise is not None and noise.shape[0] < max_frames:
            raise ValueError(f"noise has {noise.shape[0]} rows for {max_frames} frames")
        self.prompt, self.max_frames, self.seed, self.noise = prompt, max_frames, seed, noise
        self.t_table = t_table
        self.home: Batch | None = None
        self.index = 0
        self.pos = 0  # positions written to the cache (prompt, then one per frame)
        self.frames = 0
        self.unread: tuple[mx.array, int] | None = None  # last queued frame: (codes, row)
        self.ended = False

    @property
    def live(self) -> bool:
        """Another frame may be queued."""
        return not self.ended and self.frames < self.max_frames

    @property
    def done(self) -> bool:
        return not self.live and self.unread is None

    def release(self) -> None:
        self.home = self.unread = self.prompt = None


def _pad(kv: list, n: int) -> list:
    if kv[0][0].shape[2] == n:
        return kv
    widths = [(0, 0), (0, 0), (0, n - kv[0][0].shape[2]), (0, 0)]
    return [(mx.pad(k, widths), mx.pad(v, widths)) for k, v in kv]


def gather(tracks: list[Track], size: int, n_slots: int) -> tuple[mx.array, mx.array, list]:
    """The tracks' rows (h, keys, kv with n_slots slots) as batched arrays of `size` rows, the
    rows past the tracks copies of the first: the arrays of their home as they are when the
    same tracks step together again (no copy)."""
    h0 = tracks[0].home
    if (h0.size == size and len(h0.tracks) == len(tracks)
            and all(t.home is h0 and t.index == i for i, t in enumerate(tracks))):
        return h0.h, h0.keys, _pad(h0.kv, n_slots)
    refs = [(t.home, t.index) for t in tracks]
    refs += [refs[0]] * (size - len(tracks))
    homes = {id(b): b for b, _ in refs}
    kvs = {k: _pad(b.kv, n_slots) for k, b in homes.items()}
    h = stack_rows([(b.h, i) for b, i in refs])
    keys = stack_rows([(b.keys, i) for b, i in refs])
    kv = [(stack_rows([(kvs[id(b)][j][0], i) for b, i in refs]),
           stack_rows([(kvs[id(b)][j][1], i) for b, i in refs]))
          for j in range(len(h0.kv))]
    return h, keys, kv


def _frame_mask(pos: list[int], n: int) -> str | None:
    """No mask when every row has written every slot attention sees."""
    return None if all(p + 1 == n for p in pos) else "rows"


def start_tracks(model: Model, tracks: list[Track], audio_step_id: int | None = None) -> None:
    """Prefill the tracks' prompts, batched by (bucketed) length; their first frames come from
    the next `step_tracks`. `audio_step_id`: feed that token once more first (§5.1)."""
    groups: dict[int, list[Track]] = {}
    for t in tracks:
        if t.live:
            groups.setdefault(prompt_length(t.prompt.shape[1]), []).append(t)
    for P, g in groups.items():
        size = padded(len(g))
        rows = g + [g[0]] * (size - len(g))
        x = [t.prompt if t.prompt.shape[1] == P
             else mx.pad(t.prompt, [(0, 0), (0, P - t.prompt.shape[1]), (0, 0)]) for t in rows]
        x = x[0] if size == 1 else mx.concatenate(x)
        ends = [t.prompt.shape[1] for t in rows]
        n = slots(P + (audio_step_id is not None))
        exact = not fixed_shapes() and all(e == P for e in ends)
        h, kv = backbone_step(model, x, mx.zeros((size,), mx.int32), None, n,
                              P if exact else None, "causal" if exact else "rows")
        h = h[:, -1] if exact else h[mx.arange(size), mx.array(ends) - 1]
        if audio_step_id is not None:
            tok = model.tok_embeddings(mx.full((size, 1), audio_step_id, mx.int32))
            attend = P + 1 if exact else None
            h, kv = backbone_step(model, tok, mx.array(ends, mx.int32), kv, n, attend,
                                  _frame_mask(ends, attend or n))
            h = h[:, -1]
        keys = mx.stack([mx.random.key(t.seed) for t in rows])
        t_table = model.acoustic_transformer.time_table()
        for t, e in zip(g, ends, strict=False):
            t.pos = e + (audio_step_id is not None)
            t.t_table = t_table if t.t_table is None else t.t_table
        Batch(h, keys, kv, g)


def step_tracks(model: Model, tracks: list[Track], decode: Callable | None = None,
                frame: Callable | None = None) -> list[np.ndarray | None]:
    """Queue the next frame of every live track (one batched forward), then read the frame
    each track queued the call before: its (n_codebooks,) int32 codes, or None (nothing was
    queued, or it was END: the track is then `done`). Tracks must be started.

    `frame(key, ...)`: `frame_step`'s arguments after `decode`, compiled per shape key
    (`nn.compiled.CompiledStep`); used at the fixed shapes, where a stream's frames share a
    few shapes (on the CPU's shapes attention's length changes every frame)."""
    decode = decode or model.decode_frame
    prev = [t.unread for t in tracks]
    going = [t for t in tracks if t.live]
    for t in tracks:
        t.unread = None
    if going:
        _queue(model, going, decode, frame if fixed_shapes() else None)
    out: list[np.ndarray | None] = [None] * len(tracks)
    read: dict[int, np.ndarray] = {}
    for k, (t, u) in enumerate(zip(tracks, prev, strict=True)):
        if u is None:
            continue
        a, i = u
        if id(a) not in read:
            read[id(a)] = np.array(a)  # one host read per batched frame
        codes = read[id(a)][i]
        if codes[0] == END_AUDIO:
            t.ended, t.unread = True, None
        else:
            out[k] = codes
    for t in tracks:
        if t.done:
            t.release()
    return out


def _queue(model: Model, going: list[Track], decode: Callable,
           frame: Callable | None = None) -> None:
    n, size = len(going), padded(len(going))
    pos = [t.pos for t in going]
    pos += [pos[0]] * (size - n)
    n_slots = max(slots(max(pos) + 1), max(t.home.n_slots for t in going))
    h, keys, kv = gather(going, size, n_slots)
    attend = None if fixed_shapes() else max(pos) + 1
    noise = given = None
    if any(t.noise is not None for t in going):  # rows given (tests), the others drawn
        zero = mx.zeros((model.config.n_acoustic_codebook,), mx.float32)
        rows = [zero if t.noise is None else t.noise[t.frames].astype(mx.float32)
                for t in going]
        noise = mx.stack(rows + [rows[0]] * (size - n))
        given = mx.array([t.noise is not None for t in going]
                         + [going[0].noise is not None] * (size - n))
    args = (going[0].t_table, h, keys, mx.array(pos, mx.int32), kv, noise, given, attend,
            _frame_mask(pos, attend or n_slots))
    if frame is None:
        codes, h, keys, kv = frame_step(model, decode, *args)
    else:
        key = (size, n_slots, h.dtype, noise is None, attend, args[-1])
        codes, h, keys, kv = frame(key, *args)
    home = going[0].home  # dropped below: its arrays can be donated to this step
    b = Batch(h, keys, kv, going)
    for t in going:
        t.unread = (codes, t.index)
        t.pos += 1
        t.frames += 1
    del home
    mx.async_eval(codes, *b.arrays())
    _frames_run[0] += 1
    if _frames_run[0] % CLEAR_EVERY == 0:
        mx.clear_cache()


def frame_codes(model: Model, prompt: mx.array, max_frames: int, seed: int = 0,
                noise: mx.array | None = None, audio_step_id: int | None = None,
                decode_frame: Callable | None = None) -> Iterator[np.ndarray]:
    """Yield (n_codebooks,) int32 codes per frame of one prompt until END or `max_frames`: a
    track alone (a batch of one).

    `prompt` (1, L, dim) are the prompt embeddings. Frame 0 is decoded from the prefill state
    (vllm-omni, mlx-audio 0.6.2) unless `audio_step_id` is given: then that token is fed once
    more first (voxtral-tts.c, mlx-audio <= 0.5). `noise` (max_frames, n_acoustic) replaces
    the seeded draws. `decode_frame` (default `model.decode_frame`) may be compiled."""
    t = Track(prompt, max_frames, seed, noise)
    if t.done:
        return
    start_tracks(model, [t], audio_step_id)
    while not t.done:
        codes = step_tracks(model, [t], decode_frame)[0]
        if codes is not None:
            yield codes
