"""What the web monitor costs training: `core.train --monitor` with pages connected against
the same run without it.

    python benchmarks/monitor.py [--steps 1500] [--rounds 5] [--preset cpu-tiny]
                                 [--clients 3] [--aa]

Each round starts the same config twice at once, as a user starts it: plain
`python -m core.train`, and `python -m core.train --monitor` (the server in a process of its
own beside the trainer, core/monitor/beside.py) with `--clients` pages connected to the run's
live stream (threads of this script reading /api/stream as a browser's EventSource does, with
the token). Only one of the two trains at a time: every 5 seconds one is suspended, with its
children (the monitor), and the other resumed (benchmarks/window.py's Alternator), so both
see the same machine; this VM's speed drifts by 10-30% over tens of seconds. Torch threads:
the window's count for both (all cores but one), so the server and the clients have a core,
as on a desktop where the browser is on a phone.

Throughput is the median `tokens_per_s` of each run's metrics.jsonl (training time only).
Per round it prints both, their ratio, and what the pages received (events, bytes, the
newest step they saw against the run's last). Target: median ratio >= 0.97 (issue 59).
--aa: plain against plain, the method's own noise.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from benchmarks.window import Alternator, finish_headless  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from gui.worker import cpu_training_threads  # noqa: E402


def start(preset: str, steps: int, run_dir: Path, monitor: bool) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(cpu_training_threads()))
    cmd = [sys.executable, "-m", "core.train", "--preset", preset, "--max-steps", str(steps)]
    cmd += ["--out", str(run_dir)] + (["--monitor", "--monitor-port", "0"] if monitor else [])
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def monitor_url(run_dir: Path, proc: subprocess.Popen) -> str:
    log = run_dir.parent / f"{run_dir.name}.log"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"Monitor: (http://\S+)", log.read_text())
        if found:
            return found.group(1)
        time.sleep(0.1)
    sys.exit(f"no monitor URL from the run:\n{log.read_text()[-2000:]}")


class Page(threading.Thread):
    """One open page: reads the run's stream until the server goes, counting what came."""

    def __init__(self, url: str, run: str):
        super().__init__(daemon=True)
        base, token = url.split("/?token=")
        self.port = int(base.rsplit(":", 1)[1])
        self.token, self.run_name = token, run
        self.events = self.bytes = self.last_step = 0

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            conn.request(
                "GET",
                f"/api/stream?run={self.run_name}",
                headers={"Authorization": f"Bearer {self.token}"},
            )
            resp = conn.getresponse()
            while line := resp.fp.readline():
                self.bytes += len(line)
                if line.startswith(b"event: "):
                    self.events += 1
                elif line.startswith(b"data: "):
                    steps = re.findall(rb'"step":(\d+)', line)
                    if steps:
                        self.last_step = max(self.last_step, int(steps[-1]))
        except OSError:
            pass  # the run ended and its monitor with it
        finally:
            conn.close()


class TreeAlternator(Alternator):
    """Suspends and resumes a run with its children: the watched run's monitor is a process
    of its own (core.monitor.beside), and its work belongs to the watched side's turns."""

    def tick(self) -> None:
        super().tick()
        both = len(self._live()) == 2  # else both run (Alternator.release)
        for turn, proc in enumerate(self.procs):
            for child in _children(proc):
                with contextlib.suppress(psutil.Error):
                    child.resume() if turn == self.turn or not both else child.suspend()

    def release(self) -> None:
        super().release()
        for proc in self.procs:
            for child in _children(proc):
                with contextlib.suppress(psutil.Error):
                    child.resume()


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def one_round(args, tmp: Path, i: int) -> tuple[float, float, list[Page], tuple]:
    plain_dir, watched_dir = tmp / f"plain-{i}", tmp / f"watched-{i}"
    plain = start(args.preset, args.steps, plain_dir, monitor=False)
    watched = start(args.preset, args.steps, watched_dir, monitor=not args.aa)
    pages = []
    if not args.aa:
        url = monitor_url(watched_dir, watched)
        pages = [Page(url, watched_dir.name) for _ in range(args.clients)]
        for page in pages:
            page.start()
    procs = [psutil.Process(p.pid) for p in (plain, watched)]
    alternator = TreeAlternator(procs, turn=i % 2)
    cpu = {}  # CPU seconds (user + system), last seen: the monitor process(es), the trainer
    try:
        while plain.poll() is None or watched.poll() is None:
            alternator.tick()
            time.sleep(Alternator.PERIOD_S)
            for proc in [procs[1], *_children(procs[1])]:
                with contextlib.suppress(psutil.Error):
                    times = proc.cpu_times()
                    cpu[proc.pid] = times.user + times.system
    finally:  # interrupted: no run is left behind, suspended
        alternator.release()
        for proc in (plain, watched):
            if proc.poll() is None and sys.exc_info()[0] is not None:
                proc.kill()
    for page in pages:
        page.join(timeout=10)
    trainer_cpu = cpu.pop(procs[1].pid, 0.0)
    tps = finish_headless(plain, plain_dir), finish_headless(watched, watched_dir)
    return *tps, pages, (sum(cpu.values()), trainer_cpu)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--aa", action="store_true", help="plain against plain: the noise floor")
    args = ap.parse_args()
    print(
        f"preset {args.preset}, {args.steps} steps, {args.rounds} rounds, "
        f"{cpu_training_threads()} torch thread(s) of {os.cpu_count()} cores, "
        + ("plain against plain (--aa)" if args.aa else f"{args.clients} pages connected")
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ.setdefault("TRAINDECK_CACHE", str(tmp / "cache"))
        ratios = []
        for i in range(args.rounds):
            plain, watched, pages, (monitor_cpu, trainer_cpu) = one_round(args, tmp, i)
            ratios.append(watched / plain)
            line = (
                f"round {i + 1}: without {plain:,.0f} tok/s, with the monitor {watched:,.0f} "
                f"tok/s, ratio {ratios[-1]:.3f}"
            )
            if pages:
                train, _ = read_metrics(tmp / f"watched-{i}" / "metrics.jsonl")
                line += (
                    f"; pages got {min(p.events for p in pages)}-{max(p.events for p in pages)} "
                    f"events, {max(p.bytes for p in pages) / 1e3:,.0f} kB each, newest step "
                    f"{min(p.last_step for p in pages)} of {train[-1]['step']}; CPU: the "
                    f"monitor {monitor_cpu:.2f} s (start-up included), the trainer "
                    f"{trainer_cpu:.1f} s ({monitor_cpu / max(trainer_cpu, 1e-9):.1%})"
                )
            print(line, flush=True)
        print(
            f"median ratio {statistics.median(ratios):.3f} "
            f"({min(ratios):.3f}-{max(ratios):.3f}); target >= 0.97"
        )


if __name__ == "__main__":
    main()
