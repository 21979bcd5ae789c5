"""One trainer per run folder: a lock file holding the owner's PID, host and start time.

A lock whose process is gone (a crash, a power cut) is stale and taken over; the start time
guards against a new process that reuses the dead one's PID.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import psutil

from core.errors import UserError

LOCK_NAME = ".traindeck.lock"


class RunLocked(UserError):
    pass


def _me() -> dict:
    proc = psutil.Process()
    return {
        "pid": proc.pid,
        "host": socket.gethostname(),
        "started": proc.create_time(),
        "locked_at": time.time(),
    }


def _alive(owner: dict) -> bool:
    if owner.get("host") != socket.gethostname():
        return True  # another machine's process (a shared folder): cannot tell, so respect it
    try:
        proc = psutil.Process(int(owner["pid"]))
        return abs(proc.create_time() - float(owner["started"])) < 1.0
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def held(folder: Path) -> bool:
    """Whether a live process (or one on another machine) holds the run in folder: a
    watcher's test for "training now", which takes nothing."""
    owner = RunLock(folder).owner()
    return owner is not None and _alive(owner)


class RunLock:
    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK_NAME
        self.held = False

    def owner(self) -> dict | None:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def acquire(self) -> None:
        """Take the lock, or raise RunLocked naming the process that holds it."""
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self.owner()
                if owner is None and time.time() - self._mtime() < 2:
                    time.sleep(0.2)  # being written by its owner right now
                    continue
                if owner is not None and _alive(owner):
                    raise RunLocked(
                        f"run: {self.path.parent} is in use by process {owner['pid']} on "
                        f"{owner.get('host', '?')}; stop that one first (or wait for it to end)"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(_me(), f)
            self.held = True
            return
        raise RunLocked(f"run: could not lock {self.path.parent}; try again")

    def _mtime(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0

    def release(self) -> None:
        if self.held:
            owner = self.owner()
            if owner is not None and owner.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False
