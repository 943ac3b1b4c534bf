"""Streaming generation (LMGen): delays, the token cache, sampling, Kyutai and PersonaPlex steps.

Two step semantics, both from the reference code (spec §6, §9):

* `KyutaiGen` is Kyutai's PyTorch `LMGen.step`: a cache of `max_delay + 2` columns, user tokens
  written at `offset + delay`, the input column is `offset` (initial tokens while
  `offset <= delay`), one forward per call, output `None` for the first `max_delay` calls.
  `user_lag=0` consumes a user frame in the call that receives it (Kyutai's server);
  `user_lag=1` consumes it one call later (moshi_mlx, Rust, Kyutai's offline script).
* `PersonaPlexGen` is NVIDIA's rewrite: `max_delay + 3` columns, any stream may be forced
  ("provided") and forced tokens also teacher-force the depformer; no forward on the first call;
  the input column is `offset - 1`, so user frames always enter one call later (lag 1).

The token cache is a host-side table of lazy `mx.array`s (one `[B]` array per stream and column),
so a whole step (embeddings -> transformer -> text sample -> depformer sub-steps) stays one lazy
graph; the caller evaluates once per step (`arrays()` lists what must be evaluated with it).
Which entries are forced, initial or not yet generated depends only on the call sequence, never
on token values, so all the bookkeeping runs on the host without a device sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import numpy as np

from ...errors import CheckpointError
from ...nn import CompiledStep, RingStep, compile_enabled, fixed_shapes, ring_mask_kind, sample
from .config import GenConfig, LmConfig
from .lm import LmState

UNGENERATED = -2  # sentinel of the reference caches; never fed to the model
TEXT_PAD = 3  # PersonaPlex's "zero text code" during prompts


Sampling = GenConfig  # per-session settings: the checkpoint defaults with overrides


class _Rng:
    """An explicit key chain: seeded runs are reproducible and never touch the global RNG."""

    def __init__(self, seed: int):
        self.key = mx.random.key(seed)

    def next(self) -> mx.array:
        self.key, sub = mx.random.split(self.key)
        return sub


@dataclass
class StepOut:
    """One LM step. `tokens` [B, S, 1] int32 is the complete output frame (text + audio streams,
    S = 1 + dep_q) or None before the first one; `text` [B] is the text token of this step."""

    tokens: mx.array | None
    text: mx.array | None


class _StepState:
    """The temporal transformer's TransformerState inside a compiled step: the stream position
    an int32 array, the rings RingSteps (their clock arrays), so the trace never changes with
    the position."""

    def __init__(self, batch: int, offset: mx.array, layers: list[RingStep]):
        self.batch, self.offset, self.layers = batch, offset, layers

    def mask(self, length: int):
        return self.layers[0].make_mask(length)


def temporal_graph(lm, tokens: mx.array, keys: list[mx.array], values: list[mx.array],
                   offset: mx.array, kind: str | None, capacity: int, window: int,
                   start: mx.array):
    """One temporal step (tokens [B, K, 1]) as a pure graph: (z, text logits, new keys,
    new values); `offset` the stream position (int32 scalar), `kind` its ring mask's form,
    `start` its ring slot ((1,) int32)."""
    views = [RingStep(k, v, offset, offset, capacity, window, None, kind, start)
             for k, v in zip(keys, values, strict=True)]
    z, text_logits = lm.forward_tokens(tokens, LmState(_StepState(tokens.shape[0], offset,
                                                                  views), None))
    return z, text_logits, [r.keys for r in views], [r.values for r in views]


def depformer_loop(lm, dep, z: mx.array, text: mx.array, keys: list[mx.array | None],
                   forced: list[mx.array | None], temp: float, top_k: int) -> list[mx.array]:
    """The depformer's sub-steps of one frame over the (reset) state `dep`: sub-step k samples
    codebook k with `keys[k]`; a forced token replaces the sample as the next input."""
    prev, out = text, []
    for k, key in enumerate(keys):
        logits = lm.depformer_logits(k, prev, z, dep)
        tok = sample(logits, temp, top_k, key)
        out.append(tok)
        prev = tok if forced[k] is None else forced[k]
    return out


def depformer_graph(lm, z, text, keys, forced, temp, top_k, _fixed):
    """`depformer_loop` as a pure graph: over a fresh depformer state (the slots a reset state
    keeps from the last frame are masked, so they never count)."""
    dep = lm.depformer.make_state(z.shape[0], lm.config.dep_q)
    return depformer_loop(lm, dep, z, text, keys, forced, temp, top_k)


class CompiledLm:
    """One LM's streaming steps compiled at their shapes (nn.compiled), shared by every
    session over it: the temporal step and the whole depformer loop of a frame."""

    def __init__(self, lm):
        self.temporal = CompiledStep(partial(temporal_graph, lm), "moshi.temporal")
        self.depformer = CompiledStep(partial(depformer_graph, lm), "moshi.depformer")


class _GenBase:
    def __init__(self, lm, config: LmConfig, sampling: Sampling, seed: int, batch: int,
                 columns: int, steps: CompiledLm | None = None):
        self.lm, self.config, self.sampling = lm, config, sampling
        self.steps = steps or CompiledLm(lm)
        self.batch = batch
        self.state = lm.make_state(batch)
        self.rng = _Rng(seed)
        self.offset = 0
        K = config.num_codebooks
        self.delays = list(config.delays)
        self.cache: list[list[mx.array | None]] = [[None] * K for _ in range(columns)]
        self._initial = [mx.full((batch,), config.text_card if k == 0 else config.card,
                                 dtype=mx.int32) for k in range(K)]

    @property
    def columns(self) -> int:
        return len(self.cache)

    def arrays(self) -> list[mx.array]:
        """Everything a step leaves lazy: evaluate these together with the step's outputs."""
        out = [self.rng.key, *self.state.arrays()]
        out += [a for col in self.cache for a in col if a is not None]
        return out

    def _column(self, pos: int, what: str, col: list | None = None) -> mx.array:
        col = self.cache[pos] if col is None else col
        missing = [k for k, a in enumerate(col) if a is None]
        if missing:  # the reference's `check=True` assertion
            raise RuntimeError(f"{what}: streams {missing} are not generated yet "
                               f"(offset {self.offset})")
        return mx.stack(col, axis=1)[..., None]  # [B, K, 1]

    def _sample_text(self, text_logits: mx.array) -> mx.array:
        s = self.sampling
        return sample(text_logits[:, -1], s.temp_text, s.top_k_text,
                      self.rng.next() if s.temp_text > 0 else None)

    def _forward(self, x: mx.array):
        """The temporal step over input tokens [B, K, 1]: (z, text logits); compiled once
        the rings hold slots (the first step allocates them plainly)."""
        main = self.state.main
        n = [c.prepare(1) for c in main.layers][0] if compile_enabled() else None
        if n is None:
            return self.lm.forward_tokens(x, self.state)
        kind = ring_mask_kind([main.offset], 1, n, main.capacity, main.window)
        z, text_logits, keys, values = self.steps.temporal(
            (x.shape, n, kind), x, [c.keys for c in main.layers],
            [c.values for c in main.layers], mx.array(main.offset, mx.int32), kind,
            main.capacity, main.window, mx.array([main.offset % main.capacity], mx.int32))
        for c, k, v in zip(main.layers, keys, values, strict=True):
            c.advance(k, v, 1)
        main.offset += 1
        return z, text_logits

    def _depformer(self, z: mx.array, text: mx.array, n_run: int,
                   forced: list[mx.array | None]) -> list[mx.array]:
        """Sub-steps 0..n_run-1 (one compiled graph per frame shape); a forced token
        replaces the sample as the next input."""
        s = self.sampling
        keys = [self.rng.next() if s.temp > 0 else None for _ in range(n_run)]
        forced = list(forced[:n_run])
        if compile_enabled() and n_run:
            key = (z.shape, n_run, tuple(f is None for f in forced), s.temp > 0, s.temp,
                   s.top_k, fixed_shapes())
            return self.steps.depformer(key, z, text, keys, forced, s.temp, s.top_k,
                                        fixed_shapes())
        self.state.dep.reset()
        return depformer_loop(self.lm, self.state.dep, z, text, keys, forced, s.temp, s.top_k)

    def _tokens(self, ids) -> list[mx.array]:
        """[B, n, 1] (mx or numpy) -> n arrays of [B] int32."""
        a = mx.array(ids) if not isinstance(ids, mx.array) else ids
        if a.ndim != 3 or a.shape[0] != self.batch or a.shape[2] != 1:
            raise ValueError(f"tokens must be [batch={self.batch}, n, 1], got {a.shape}")
        a = a.astype(mx.int32)
        return [a[:, i, 0] for i in range(a.shape[1])]


class KyutaiGen(_GenBase):
    """Kyutai `LMGen` (moshi 0.2.13), greedy when a temperature is 0."""

    def __init__(self, lm, config: LmConfig, sampling: Sampling, *, user_lag: int = 0,
                 seed: int = 0, batch: int = 1, steps: CompiledLm | None = None):
        if user_lag not in (0, 1):
            raise ValueError(f"user_lag must be 0 or 1, got {user_lag}")
        super().__init__(lm, config, sampling, seed, batch, config.max_delay + 2, steps)
        self.user_lag = user_lag
        self._prev_user: list[mx.array] | None = None

    def step(self, user) -> StepOut:
        """`user` [B, n_user, 1] Mimi codes of the user's latest frame (extra rows ignored;
        -1 = no input). Returns the output frame `[B, 1 + dep_q, 1]` from call max_delay on."""
        cfg = self.config
        u = self._tokens(user)
        if len(u) < cfg.n_user:
            raise ValueError(f"expected {cfg.n_user} user codebooks, got {len(u)}")
        u = u[: cfg.n_user]
        if self.user_lag:  # feed the previous frame; the very first one twice
            u, self._prev_user = (self._prev_user or u), u
        CT, o, A = self.columns, self.offset, 1 + cfg.n_agent
        for i, tok in enumerate(u):
            self.cache[(o + self.delays[A + i]) % CT][A + i] = tok
        # initial tokens replace the input (not the cache) while offset <= delay
        col = [self._initial[k] if o <= d else a
               for k, (d, a) in enumerate(zip(self.delays, self.cache[o % CT], strict=True))]
        x = self._column(o % CT, "input", col)
        z, text_logits = self._forward(x)
        text = self._sample_text(text_logits)
        audio = self._depformer(z, text, cfg.dep_q, [None] * cfg.dep_q)
        self.offset = o = o + 1
        nxt = self.cache[o % CT]
        nxt[0] = text
        for j, a in enumerate(audio):
            nxt[1 + j] = a
        if o <= cfg.max_delay:
            return StepOut(None, text)
        out = [self.cache[(o - cfg.max_delay + self.delays[k]) % CT][k]
               for k in range(cfg.dep_q + 1)]
        return StepOut(mx.stack(out, axis=1)[..., None], text)


class PersonaPlexGen(_GenBase):
    """NVIDIA PersonaPlex `LMGen` with forced ("provided") tokens (spec §9.1)."""

    def __init__(self, lm, config: LmConfig, sampling: Sampling, *, seed: int = 0,
                 batch: int = 1, steps: CompiledLm | None = None):
        super().__init__(lm, config, sampling, seed, batch, config.max_delay + 3, steps)
        self.provided = np.zeros((self.columns, config.num_codebooks), dtype=bool)

    def _write(self, first: int, toks: list[mx.array]) -> None:
        CT, o = self.columns, self.offset
        for i, tok in enumerate(toks):
            k = first + i
            pos = (o + self.delays[k]) % CT
            self.cache[pos][k] = tok
            self.provided[pos, k] = True

    def _prepare(self, user, agent, text):
        cfg = self.config
        n = cfg.n_agent
        if user is not None:
            u = self._tokens(user)
            if len(u) != cfg.n_user:
                raise ValueError(f"expected {cfg.n_user} user codebooks, got {len(u)}")
            self._write(1 + n, u)
        if agent is not None:
            a = self._tokens(agent)
            if len(a) != n:
                raise ValueError(f"expected {n} agent codebooks, got {len(a)}")
            self._write(1, a)
        if text is not None:
            self._write(0, [mx.full((self.batch,), int(text), dtype=mx.int32)])
        CT, o = self.columns, self.offset
        for k, d in enumerate(self.delays):
            if o <= d:
                self.cache[o % CT][k] = self._initial[k]
                self.provided[o % CT, k] = True
        if o == 0:  # the reference does no forward on its first call
            self.cache[0] = list(self._initial)
            self.offset = 1
            return None
        return (o - 1) % CT, o % CT

    def _process(self, z: mx.array, text_logits: mx.array, inp: int, tgt: int) -> StepOut:
        cfg = self.config
        prov = self.provided[tgt].copy()
        target = list(self.cache[tgt])
        text = target[0] if prov[0] else self._sample_text(text_logits)
        forced = [target[1 + k] if prov[1 + k] else None for k in range(cfg.dep_q)]
        # Sub-steps after the last free stream cannot change any kept token (causal depformer),
        # so they are skipped: their samples would be discarded by the reference too.
        free = [k for k in range(cfg.dep_q) if not prov[1 + k]]
        audio = self._depformer(z, text, free[-1] + 1 if free else 0, forced)
        self.provided[inp] = False
        col = self.cache[tgt]
        if not self.provided[tgt, 0]:
            col[0] = text
        for k in free:
            col[1 + k] = audio[k]
        o = self.offset
        self.offset = o + 1
        if o <= cfg.max_delay:
            return StepOut(None, text)
        CT = self.columns
        out = [self.cache[(o - cfg.max_delay + self.delays[k]) % CT][k]
               for k in range(cfg.dep_q + 1)]
        if any(a is None for a in out):
            raise RuntimeError(f"output frame incomplete at offset {o}")
        return StepOut(mx.stack(out, axis=1)[..., None], text)

    def step(self, user=None, agent=None, text: int | None = None) -> StepOut | None:
        """Force any of: `user` [B, n_user, 1], `agent` [B, n_agent, 1] codes, a `text` id.
        Returns None on the very first call (no forward), else this call's StepOut."""
        pos = self._prepare(user, agent, text)
        if pos is None:
            return None
        inp, tgt = pos
        z, text_logits = self._forward(self._column(inp, "input"))
        return self._process(z, text_logits, inp, tgt)

    def step_embeddings(self, e: mx.array) -> StepOut:
        """Replay one stored voice-prompt step: `e` [B, 1, dim] is the summed input embedding;
        the bookkeeping runs with dummy forced tokens (PAD text, initial audio)."""
        cfg = self.config
        dummy_u = mx.full((self.batch, cfg.n_user, 1), cfg.card, dtype=mx.int32)
        dummy_a = mx.full((self.batch, cfg.n_agent, 1), cfg.card, dtype=mx.int32)
        pos = None
        while pos is None:
            pos = self._prepare(dummy_u, dummy_a, TEXT_PAD)
        e = mx.array(e).reshape(self.batch, 1, -1)
        z, text_logits = self.lm.forward_embeddings(e, self.state)
        return self._process(z, text_logits, *pos)

    def set_cache(self, tokens) -> None:
        """Overwrite the token cache (a voice file's `cache`, [B, K, columns]); -2 = empty."""
        t = np.asarray(tokens)
        if t.shape != (self.batch, self.config.num_codebooks, self.columns):
            want = (self.batch, self.config.num_codebooks, self.columns)
            raise ValueError(f"cache must be {want}, got {t.shape}")
        for k in range(self.config.num_codebooks):  # every id must index its stream's table
            top = self.config.text_card if k == 0 else self.config.card
            row = t[:, k]
            bad = row[(row != UNGENERATED) & ((row < -1) | (row > top))]
            if bad.size:
                raise CheckpointError(f"voice cache: stream {k} holds token {int(bad[0])}, "
                                      f"outside -1..{top}")
        for pos in range(self.columns):
            for k in range(self.config.num_codebooks):
                v = t[:, k, pos]
                self.cache[pos][k] = (None if (v == UNGENERATED).any()
                                      else mx.array(v.astype(np.int32)))
