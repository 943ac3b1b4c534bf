"""The served models by name: loaded when a request first names one, freed when idle.

`Models` holds one `Entry` per `--model`. What a model is (its kind, the name messages use) is
known at start from its config files (`mlx_speech.locate`, which checks the kind before
anything is read); its weights are loaded on the engine thread (a `ModelLoad` job: like every
MLX call) when a request first needs them, while that request waits, up to `load_timeout_s`.
A request or session holds the model with a `Lease` (`await models.acquire(id)`), released
when it is done; a job on the engine that steps the model keeps it too. With
`unload_after_s`, the engine frees a model no lease and no job has used for that long: the
store drops the model, the garbage collector its arrays, `mx.clear_cache()` MLX's buffer
cache; the MLX active and peak memory before and after are logged and kept for /v1/models.
The next request loads it again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MlxSpeechError
from .common import KINDS, ModelNotFound
from .jobs import Job

log = logging.getLogger("mlx_speech.server")

SERVED_KINDS = ("asr", "tts", "duplex")
LOAD_TIMEOUT_S = 300.0  # how long a request waits for its model to load (--load-timeout-s)
MB = 1 << 20


class ModelUnavailable(Exception):
    """A model could not be had for a request: `code` "model_loading" (still loading after
    the timeout: try again), "model_load_failed" (the load raised), "server_shutdown"."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


@dataclass
class Entry:
    """One served model: what it is before loading, and the loaded model when it is."""

    id: str
    kind: str  # from the config files (the family's class) before any load
    name: str  # how messages name it ("Voxtral Realtime speech-to-text", ...)
    source: str | Path | None = None  # what mlx_speech.load takes; None: never reloaded
    load_kwargs: dict = field(default_factory=dict)
    model: object | None = None
    leases: int = 0
    idle_since: float = 0.0
    loading: concurrent.futures.Future | None = None
    loads: int = 0
    unloads: int = 0  # counted once the memory after it is measured
    load_s: float | None = None  # the last load's seconds
    details: dict | None = None  # sample rate, voices... (known from the first load on)
    budget: tuple | None = None  # (weight bytes, bytes per duplex session or 0)
    memory: dict = field(default_factory=dict)  # MLX memory around the last load and unload
    error: str | None = None  # the last load's failure

    @property
    def state(self) -> str:
        if self.model is not None:
            return "loaded"
        return "loading" if self.loading is not None else "not_loaded"


class Lease:
    """A request's or a session's hold on a loaded model: `model` stays loaded until
    `release()` (idempotent)."""

    def __init__(self, store: Models, entry: Entry):
        self._store, self._entry = store, entry
        self.id, self.model = entry.id, entry.model
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released, self.model = True, None
            self._store._release(self._entry)


async def acquire_told(models: Models, model_id: str, tell: Callable[[dict], None]) -> Lease:
    """`models.acquire(model_id)` for a WebSocket client, who is told `{"type":
    "model.loading", "model": ID}` when the model must be loaded, then `{"type":
    "model.loaded", "model": ID, "seconds": S}`; ModelUnavailable as `acquire`."""
    t0 = time.perf_counter()
    waited = []

    def loading(entry) -> None:
        waited.append(True)
        tell({"type": "model.loading", "model": model_id})

    lease = await models.acquire(model_id, loading)
    if waited:
        tell({"type": "model.loaded", "model": model_id,
              "seconds": round(time.perf_counter() - t0, 3)})
    return lease


class ModelLoad(Job):
    """Loading one model on the engine thread (`start`): its waiters hear through the
    entry's future. Live streams of other models pause while it runs (one thread owns MLX)."""

    phase = 4

    def __init__(self, store: Models, entry: Entry):
        super().__init__(None, lambda ev: None)
        self.store, self.entry = store, entry

    def start(self) -> None:
        self.store._load(self.entry)
        self.finished = True

    @classmethod
    def step_many(cls, engine, jobs: list) -> bool:
        return False

    def fail(self, code: str, message: str) -> None:
        super().fail(code, message)
        self.store._failed(self.entry, code, message)


def _memory() -> dict:
    import mlx.core as mx

    return {"active": mx.get_active_memory(), "peak": mx.get_peak_memory(),
            "cache": mx.get_cache_memory()}


def measure_free() -> dict:
    """Free what MLX keeps after references are dropped (the garbage collector first, for
    arrays held in reference cycles, then MLX's buffer cache): the memory after (bytes)."""
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()
    return _memory()


class Models:
    """The served models by id (iterating gives the ids, in --model order)."""

    def __init__(self, entries: list[Entry], *, unload_after_s: float | None = None,
                 load_timeout_s: float = LOAD_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] | None = None):
        self.entries = {e.id: e for e in entries}
        self.say = say or log.info  # loads and unloads, a line each (the command's log)
        self.unload_after_s = unload_after_s
        self.load_timeout_s = load_timeout_s
        self.clock = clock
        self.engine = None  # set by `attach`
        self.sweeps = 0  # idle checks so far
        self._lock = threading.Lock()
        now = clock()
        for e in entries:
            e.idle_since = now
            if e.model is not None:
                self._describe(e, e.model)

    # -- building ------------------------------------------------------------------
    @classmethod
    def loaded(cls, models: dict[str, object], sources: dict | None = None, **kw) -> Models:
        """A store of models loaded already (`sources[id]`: where to load one again after
        an unload; without one a model stays loaded)."""
        from .common import model_kind

        sources = sources or {}
        return cls([Entry(i, model_kind(m), m.name, sources.get(i), model=m)
                    for i, m in models.items()], **kw)

    @classmethod
    def locate(cls, ids, *, log_line: Callable[[str], None] | None = None,
               load_kwargs: dict | None = None, **kw) -> Models:
        """A store of models not loaded yet: each id (a folder, an archive or a hub repo) is
        checked now from its config files (a model of another kind, an unknown option: one
        error line, before anything loads) and its files downloaded."""
        import mlx_speech

        from ..registry import family

        ids = list(ids)
        if len(set(ids)) != len(ids):
            twice = next(m for m in ids if ids.count(m) > 1)
            raise MlxSpeechError(f"--model {twice} is given twice")
        load_kwargs = dict(load_kwargs or {})
        entries = []
        for m in ids:
            model_type, path = mlx_speech.locate(m, kind=SERVED_KINDS, log=log_line,
                                                 **load_kwargs)
            cls_ = family(model_type)
            entries.append(Entry(str(m), cls_.kind, cls_.name, path, load_kwargs))
        return cls(entries, **{"say": log_line, **kw})

    def preload(self) -> None:
        """Load every model now, on this thread (at start, before the engine runs)."""
        for e in self.entries.values():
            if e.model is None:
                self._load(e)

    def attach(self, engine) -> None:
        """Load and unload on `engine`'s thread: the idle check runs there after each step."""
        self.engine = engine
        if self.unload_after_s is not None:
            engine.chores.append(self.sweep)

    # -- reading (any thread) ------------------------------------------------------------
    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, model_id) -> bool:
        return model_id in self.entries

    def kind(self, model_id: str) -> str:
        return self.entries[model_id].kind

    def state(self, model_id: str) -> str:
        """"loaded", "loading" or "not_loaded"."""
        return self.entries[model_id].state

    def details(self, model_id: str) -> dict:
        """What /v1/models says of a model beyond its kind: its state, and once it has been
        loaded the sample rate, voices, roles, languages (kept across unloads)."""
        e = self.entries[model_id]
        out = {"loaded": e.model is not None, "state": e.state, **(e.details or {})}
        if e.error is not None and e.model is None:
            out["error"] = e.error
        return out

    def budgets(self) -> list[tuple]:
        """(kind, weight bytes, bytes per duplex session) of every model loaded at least
        once (the session limit's input)."""
        return [(e.kind, *e.budget) for e in self.entries.values() if e.budget is not None]

    def pick(self, name: str | None, kind: str) -> str:
        """The id of the served model called `name` (None: the only one of `kind`); loads
        nothing. ModelNotFound says what is served."""
        ids = [m for m, e in self.entries.items() if e.kind == kind]
        if not name:
            if len(ids) == 1:
                return ids[0]
            if not ids:
                raise ModelNotFound(f"this server has no {KINDS[kind]} model (serving: "
                                    f"{', '.join(self.entries)})")
            raise ModelNotFound(f"name a model: one of {', '.join(ids)}", "model_required")
        if name not in self.entries:
            raise ModelNotFound(f"model {name!r} is not served here; served: "
                                f"{', '.join(self.entries)}")
        if name not in ids:
            raise ModelNotFound(f"model {name!r} is a {KINDS[self.kind(name)]} model, not "
                                f"{KINDS[kind]} (those served: {', '.join(ids) or 'none'})")
        return name

    # -- holding -------------------------------------------------------------------------
    async def acquire(self, model_id: str, loading: Callable[[Entry], None] | None = None,
                      timeout: float | None = None) -> Lease:
        """A lease on `model_id`, loaded first when it is not (`loading(entry)` is called
        once then, before the wait); ModelUnavailable when it cannot be had within `timeout`
        (default `load_timeout_s`)."""
        e = self.entries[model_id]
        with self._lock:
            e.leases += 1
            if e.model is not None:
                return Lease(self, e)
            fut = e.loading
            if fut is None:
                fut = e.loading = concurrent.futures.Future()
                start = True
            else:
                start = False
        try:
            if start:
                self.engine.submit(ModelLoad(self, e))
            if loading is not None:
                loading(e)
            wait = asyncio.wrap_future(fut)
            done, _ = await asyncio.wait({wait}, timeout=self.load_timeout_s
                                         if timeout is None else timeout)
            if not done:
                raise ModelUnavailable(f"model {model_id!r} is still loading (waited "
                                       f"{self.load_timeout_s if timeout is None else timeout:g}"
                                       " s); try again shortly", "model_loading")
            code, message = wait.result()
            if code is not None:
                raise ModelUnavailable(message, code)
            with self._lock:
                if e.model is None:  # freed in between (only after its own idle time)
                    raise ModelUnavailable(f"model {model_id!r} was unloaded while this "
                                           "request waited; try again", "model_loading")
                return Lease(self, e)
        except BaseException:
            self._release(e)
            raise

    def _release(self, e: Entry) -> None:
        with self._lock:
            e.leases -= 1
            if e.leases == 0:
                e.idle_since = self.clock()

    # -- the engine thread ---------------------------------------------------------------
    def _load(self, e: Entry) -> None:
        import mlx.core as mx

        import mlx_speech

        from ..registry import check_loaded

        if e.source is None:
            raise MlxSpeechError(f"{e.id} cannot be loaded again")
        before = measure_free()
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        self.say(f"loading {e.id} ({e.name})")
        model = mlx_speech.load(str(e.source), kind=SERVED_KINDS, **e.load_kwargs)
        check_loaded(e.id, model, SERVED_KINDS)
        after = _memory()
        with self._lock:
            e.model, e.error, e.loads = model, None, e.loads + 1
            e.load_s = time.perf_counter() - t0
            e.idle_since = self.clock()
            e.memory["load"] = {"before": before, "after": after}
            self._describe(e, model)
            fut, e.loading = e.loading, None
        self.say(f"loaded {e.id} in {e.load_s:.2f} s: MLX active memory "
                 f"{before['active'] / MB:.1f} -> {after['active'] / MB:.1f} MB (peak "
                 f"{after['peak'] / MB:.1f} MB)")
        if fut is not None:
            fut.set_result((None, None))

    def _failed(self, e: Entry, code: str, message: str) -> None:
        with self._lock:
            fut, e.loading = e.loading, None
            if code != "server_shutdown":
                e.error = message
                code = "model_load_failed"
                message = f"model {e.id!r} failed to load: {message}"
        self.say(f"error: {message}")
        if fut is not None:
            fut.set_result((code, message))

    def _describe(self, e: Entry, model) -> None:
        from .limits import duplex_session_bytes

        d = {"sample_rate": model.sample_rate}
        if e.kind != "asr":
            d["voices"] = list(model.voices)
        if e.kind == "duplex":
            d["roles"] = model.roles
        if e.kind == "asr" and model.languages is not None:  # the checkpoint's
            d["languages"] = list(model.languages)
        e.details = d
        try:
            per = duplex_session_bytes(model) if e.kind == "duplex" else 0
            e.budget = (model.weight_bytes(), per)
        except Exception:  # a model without the expected config: no budget from it
            e.budget = None

    def sweep(self) -> None:
        """Free the models idle for `unload_after_s` (the engine thread, after each step):
        no lease, no job of the engine on it."""
        now = self.clock()
        self.sweeps += 1
        for e in self.entries.values():
            if e.model is None or e.source is None:
                continue
            with self._lock:
                if e.leases or self.engine.uses(e.model):
                    e.idle_since = now
                    continue
                if now - e.idle_since < self.unload_after_s:
                    continue
                before = _memory()
                e.model = None  # the store's reference: the last, with no lease and no job
            self._unload(e, before, now - e.idle_since)

    def _unload(self, e: Entry, before: dict, idle_s: float) -> None:
        after = measure_free()
        e.memory["unload"] = {"before": before, "after": after}
        e.unloads += 1
        self.say(f"unloaded {e.id} after {idle_s:.0f} s idle: MLX active memory "
                 f"{before['active'] / MB:.1f} -> {after['active'] / MB:.1f} MB, cache "
                 f"{before['cache'] / MB:.1f} -> {after['cache'] / MB:.1f} MB (peak "
                 f"{after['peak'] / MB:.1f} MB)")
