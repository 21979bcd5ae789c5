"""`core.train --monitor`: the monitor in a process of its own beside the training process, so
serving pages never takes the trainer's GIL (a training loop is Python-bound on a fast GPU) and
a fault in it cannot touch the run.

The child is `python -m core.monitor RUN --run --with-parent`: it serves the one run folder
(which may not exist yet), prints its link, and ends when its stdin closes (the parent's end,
or its death), after open pages have heard of the run's end. Its output is the parent's: the
link first, then a line for each action taken from the page.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from core.errors import ConfigError
from core.monitor import server

START_S = 60.0  # the child imports no torch: it prints its link in well under a second
STOP_S = server.LINGER_S + 5.0


def check_port(host: str, port: int, explicit: bool) -> None:
    """Before any work: a named port that is taken, or a host that is not this machine's,
    is refused now (the child binds the same again a moment later)."""
    if explicit or host != server.LOOPBACK:
        bound, _ = server.bind(host, port, explicit)
        bound.server_close()


class BesideRun:
    def __init__(self, run_dir: Path, host: str, port: int, explicit: bool, control: bool):
        args = [str(Path(run_dir).absolute()), "--run", "--with-parent", "--host", host]
        args += ["--port", str(port)] if explicit else []
        args += ["--control"] if control else []
        root = str(Path(__file__).resolve().parents[2])  # where the core package is
        paths = [root, os.environ.get("PYTHONPATH")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "core.monitor", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            encoding="utf-8",
        )

    def wait_for_link(self, say) -> None:
        """Hand each line to say() until the link has come; a child that ends first raises
        its error line."""
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            say(line.rstrip("\n"))
            if line.startswith("Monitor: http"):
                threading.Thread(target=self._forward, args=(say,), daemon=True).start()
                return
        self.proc.kill()
        error = self.proc.stderr.read().strip().splitlines()
        raise ConfigError(error[-1].removeprefix("error: ") if error else "monitor: did not start")

    def _forward(self, say) -> None:
        for line in self.proc.stdout:
            say(line.rstrip("\n"))

    def close(self) -> None:
        """The run is over: the child lets open pages see the end, then exits."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=STOP_S)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
