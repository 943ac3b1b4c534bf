"""The engine: one thread owns every MLX call; the asyncio side only queues audio and reads events.

Jobs (server/jobs.py) are handed over with `submit(job)` from any thread. Each tick the engine
adopts the new ones (`job.start()`, on this thread), drops those closed or finished, and steps
the rest kind by kind in the kinds' `phase` order: the jobs of one kind and one model go to
that kind's `step_many(engine, jobs)` together (one batched model call for streams; one
session at a time with `batch=False`, a debug/benchmark switch). Jobs submitted during a tick
(a turn stream's transcription streams) are adopted before the next phase steps. There is no
timeout on waiting for the next step: a job waits as long as the engine is alive, and an
engine that dies fails every open job with an error event and marks itself unhealthy.
"""

from __future__ import annotations

import collections
import logging
import threading
import traceback
from collections.abc import Callable

from ..errors import MlxSpeechError

log = logging.getLogger("mlx_speech.server")

IDLE_WAIT_S = 0.5  # how often an idle engine looks at its stop flag (not a step timeout)


class Engine:
    """Owns the models' MLX work on one thread. Create, `start()`, then `submit` jobs."""

    def __init__(self, batch: bool = True, max_buffer_s: float = 60.0):
        self.batch = batch
        self.max_buffer_s = max_buffer_s
        self.failed: str | None = None
        self._wake = threading.Event()
        self._stop = False
        self._new: collections.deque = collections.deque()  # jobs to adopt
        self._jobs: list = []
        self._thread = threading.Thread(target=self._run, name="mlx_speech-engine", daemon=True)
        self.ticks = 0
        self.batch_sizes: collections.Counter = collections.Counter()  # streams per model call
        self.cancel_reason: str | None = None  # set (from a signal handler): fail everything
        # run on this thread after every step and idle wait (freeing idle models)
        self.chores: list[Callable[[], None]] = []

    def cancel_all(self, reason: str) -> None:
        """Fail every open job at the engine's next look (within IDLE_WAIT_S): a plain
        attribute store, safe from a signal handler (no lock taken)."""
        self.cancel_reason = reason

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> Engine:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop = True
        self.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def healthy(self) -> bool:
        return self.failed is None and self._thread.is_alive() and not self._stop

    def wake(self) -> None:
        self._wake.set()

    # -- the I/O side's API (any thread) -------------------------------------------
    def submit(self, job):
        """Queue `job` (server/jobs.py) for the engine thread; returns it."""
        job.attach(self)
        self._new.append(job)
        self.wake()
        if self.failed is not None:  # checked after queueing: no race with a dying engine
            job.fail("processing_error", f"engine failed: {self.failed}")
        return job

    @property
    def open_jobs(self) -> int:
        """Jobs submitted and not yet dropped (closed or finished, seen at a tick)."""
        return len(self._jobs) + len(self._new)

    def uses(self, model) -> bool:
        """Whether a job not yet dropped steps `model` (the engine thread)."""
        return any(j.model is model for j in self._jobs) or any(
            j.model is model for j in list(self._new))

    def batches(self, items: list) -> list[list]:
        """`items` as the model calls that step them: one call, or one each (batch=False)."""
        if not items:
            return []
        return [items] if self.batch else [[it] for it in items]

    # -- the engine thread -------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop:
                busy = self.step()
                for chore in self.chores:
                    chore()
                if not busy:
                    self._wake.wait(IDLE_WAIT_S)
                    self._wake.clear()
        except BaseException as e:  # a dead engine must not leave clients hanging
            self.failed = f"{type(e).__name__}: {e}"
            log.error("engine thread died:\n%s", traceback.format_exc())
            for j in self._jobs + list(self._new):
                if not j.finished:
                    j.fail("processing_error", f"engine failed: {self.failed}")
        finally:
            # MLX aborts the process at exit when a thread that ran MLX work left its streams
            # behind (mlx#3126); this thread owns them, so it frees them on the way out.
            import mlx.core as mx

            mx.clear_streams()

    def step(self) -> bool:
        """One round over every job (on the engine thread); False when there was nothing to
        do."""
        if self.cancel_reason is not None:
            for j in self._jobs + list(self._new):
                if not (j.finished or j.closed):
                    j.fail("server_shutdown", self.cancel_reason)
                j.closed = True
        busy = self._adopt()
        self._jobs = [j for j in self._jobs if not (j.closed or j.finished)]
        last = -1
        while True:
            groups: dict[tuple, list] = {}  # (phase, kind, model) -> its jobs, in order
            for j in self._jobs:
                if j.phase > last:
                    key = (j.phase, type(j), id(j.model))
                    group = groups.get(key)
                    if group is None:
                        groups[key] = [j]
                    else:
                        group.append(j)
            for (phase, kind, _), group in sorted(groups.items(), key=_phase):
                if phase > last and self._new:  # submitted during the last phase: adopted,
                    busy |= self._adopt()  # then the phases after it again, with them
                    break
                live = [j for j in group if not (j.closed or j.finished)]
                if live:
                    busy |= kind.step_many(self, live)
                last = phase
            else:
                if not self._new:
                    break
                busy |= self._adopt()
        if busy:
            self.ticks += 1
        return busy

    def _adopt(self) -> bool:
        """Start the jobs submitted since the last look (on this thread)."""
        adopted = False
        while self._new:
            j = self._new.popleft()
            adopted = True
            if j.finished or j.closed:
                continue
            try:
                j.start()
            except Exception as e:
                j.fail("invalid_request" if isinstance(e, MlxSpeechError)
                       else "processing_error", str(e))
                continue
            self._jobs.append(j)
        return adopted


def _phase(item) -> int:
    return item[0][0]
