"""Drive `mlx_speech.app --simulate` in a subprocess (tests and benchmarks/app.py)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.pulse import favoured

ROOT = Path(__file__).resolve().parents[2]


class Sim:
    """A running `--simulate` process: send commands, read its JSON events."""

    def __init__(self, args, env, cwd=ROOT):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlx_speech.app", "--simulate", *map(str, args)],
            cwd=cwd, env={**os.environ, **env}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=favoured)  # its audio ahead of other work on a busy machine
        self.events: list[dict] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            ev = json.loads(line)
            ev["recv"] = time.monotonic()  # when this process read it
            self._q.put(ev)
        self._q.put(None)

    def send(self, *lines: str) -> None:
        self.proc.stdin.write("".join(f"{x}\n" for x in lines))
        self.proc.stdin.flush()

    def until(self, pred, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                ev = self._q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no matching event; got {self.events}") from None
            if ev is None:
                err = self.proc.stderr.read()
                raise AssertionError(f"the app exited; events {self.events}\n{err[-2000:]}")
            self.events.append(ev)
            if pred(ev):
                return ev

    def quit(self, timeout: float = 60.0) -> int:
        self.send("quit")
        self.proc.stdin.close()
        try:
            while self._q.get(timeout=timeout) is not None:
                pass
        except queue.Empty:
            self.proc.kill()
        rc = self.proc.wait(timeout=timeout)
        assert rc == 0, self.proc.stderr.read()[-2000:]
        return rc

    def of(self, kind):
        return [e for e in self.events if e["event"] == kind]
