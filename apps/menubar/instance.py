"""One running app per user: an flock'ed file that holds the owner's pid.

The second launch (a double click, the Login Item, a terminal) finds the lock taken, sends
the owner SIGUSR1 (which opens its menu) and exits with a message: never two models, two
event taps, every hotkey handled twice.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

SHOW_MENU = getattr(signal, "SIGUSR1", None)


class InstanceLock:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> bool:
        """True when this process is now the one instance (held until release or exit)."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.ftruncate(fd, 0)
            os.close(fd)  # closing drops the flock


def holder(path: str | Path) -> int | None:
    """The pid written by the instance holding the lock (None if unreadable)."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def show_running(path: str | Path) -> int | None:
    """Ask the running instance to open its menu; returns its pid (None if unknown)."""
    pid = holder(path)
    if pid is None or pid == os.getpid() or SHOW_MENU is None:
        return pid
    try:
        os.kill(pid, SHOW_MENU)
    except OSError:
        return None
    return pid
