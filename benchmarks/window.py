"""What the window costs the trainer, and how responsive it stays.

    python benchmarks/window.py [--steps 1500] [--rounds 5] [--preset cpu-tiny]
                                [--quick] [--unbatched] [--aa]

Each round runs the same config twice at once: headless (`python -m core.train`, as a user
starts it) and from a real MainWindow (Start pressed: the trainer in its child process, the
plots drawing), both at the torch thread count the window gives its training process. Only
one of the two trains at a time: every 5 seconds one is suspended and the other resumed
(psutil), so both see the same machine. This VM's speed drifts by 10-30% over tens of
seconds; run one after the other, two headless runs differed by up to 15% (--aa shows the
method's own noise: two headless runs, alternated). Turns last 5 s: the plots lag the data
by up to a second, so a tenth to a fifth of the GUI's work falls into the headless turn.

Throughput is the median `tokens_per_s` of the run's metrics.jsonl (training time only; the
one log interval a suspension falls in is an outlier the median ignores). Per round it
prints the ratio, the longest event-loop gap, the time the GUI thread spent in plot redraws,
and where the CPU went during the window run: CPU seconds (user + system) of this (the
window's) process, its GUI thread apart, and of the training child (in all, and from its
first step on), the pipe messages the child sent for how many trainer events, the time it
spent sending them, and its torch and OS thread counts. Per-second figures are per second of
the child's training CPU time (one thread: its time on a core). Then the median ratio with
its spread, and the cost of redrawing and painting 150k points. --unbatched sends one pipe
message per step (the protocol before batching) to compare; --quick is a short smoke run
(300 steps, 2 rounds: each run gets a turn or two, so its ratios say nothing). Target:
median >= 0.97, no round below 0.93. Runs offscreen unless a display is set
(QT_QPA_PLATFORM).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

from core.config import presets  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training import child_process  # noqa: E402
from gui.worker import cpu_training_threads  # noqa: E402


def median_tps(run_dir: Path) -> float:
    train, _ = read_metrics(run_dir / "metrics.jsonl")
    values = [r["tokens_per_s"] for r in train[len(train) // 10 :]]  # skip the warm-up
    return statistics.median(values)


def start_headless(preset: str, steps: int, run_dir: Path) -> subprocess.Popen:
    """The same run from the CLI, as a user starts it, at the window's torch thread count."""
    env = dict(os.environ, OMP_NUM_THREADS=str(cpu_training_threads()))
    cmd = [sys.executable, "-m", "core.train", "--preset", preset, "--max-steps", str(steps)]
    cmd += ["--out", str(run_dir)]
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:  # the child keeps its copy
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def finish_headless(proc: subprocess.Popen, run_dir: Path) -> float:
    if proc.wait() != 0:
        log = run_dir.parent / f"{run_dir.name}.log"
        sys.exit(f"the headless run failed:\n{log.read_text()[-2000:]}")
    return median_tps(run_dir)


class Alternator:
    """Lets one of two training processes run at a time, switching every PERIOD_S.

    Compared at the same moments, two runs see the same machine: this VM's speed drifts
    by 10-30% over tens of seconds, far more than the window costs. A suspended process
    leaves its one log interval slow; the median of the intervals ignores it. Turns are
    long because the window's plots lag its data by up to a second (one plot redrawn per
    250 ms tick): that much of its GUI work falls into the headless turn, and with 1 s
    turns the two sides would share the window's cost."""

    PERIOD_S = 5.0

    def __init__(self, procs: list[psutil.Process | None], turn: int):
        self.procs = procs  # None: not started yet
        self.turn = turn  # the one suspended at the first tick

    def tick(self) -> None:
        live = self._live()
        if len(live) < 2:
            self.release()
            return
        self.turn = 1 - self.turn
        _resume(self.procs[self.turn])
        _suspend(self.procs[1 - self.turn])

    def release(self) -> None:
        for p in self._live():
            _resume(p)

    def _live(self) -> list[psutil.Process]:
        return [p for p in self.procs if p is not None and _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _resume(p: psutil.Process) -> None:
    with contextlib.suppress(psutil.Error):  # it may have ended since
        p.resume()


def _suspend(p: psutil.Process) -> None:
    with contextlib.suppress(psutil.Error):
        p.suspend()


def headless_pair(preset: str, steps: int, tmp: Path, i: int) -> tuple[float, float]:
    """Two headless runs, alternated: the noise floor of the method."""
    dirs = [tmp / f"a-{i}", tmp / f"b-{i}"]
    procs = [start_headless(preset, steps, d) for d in dirs]
    alternator = Alternator([psutil.Process(p.pid) for p in procs], turn=i % 2)
    while any(p.poll() is None for p in procs):
        alternator.tick()
        time.sleep(Alternator.PERIOD_S)
    first, second = (finish_headless(p, d) for p, d in zip(procs, dirs, strict=True))
    return first, second


class Redraws:
    """Times every PlotPanel.redraw call (what holds the GIL in the GUI thread)."""

    def __init__(self, panel):
        self.times: list[float] = []
        original = panel.redraw

        def timed(*args, **kwargs):
            t = time.perf_counter()
            original(*args, **kwargs)
            self.times.append(time.perf_counter() - t)

        panel.redraw = timed


def cpu_split() -> tuple[float, float]:
    """(CPU seconds of this process, of its main (GUI) thread), user + system."""
    me = psutil.Process()
    times = me.cpu_times()
    main_id = threading.main_thread().native_id
    gui = sum(t.user_time + t.system_time for t in me.threads() if t.id == main_id)
    return times.user + times.system, gui


def in_window(
    app, cfg, run_dir: Path, tmp: Path, rival: subprocess.Popen, turn: int
) -> tuple[float, float, Redraws, float, dict]:
    """The run from a real window, alternated with `rival` (the headless run)."""
    from PySide6.QtCore import QEventLoop, QSettings, QTimer

    from gui.main_window import MainWindow

    settings = QSettings(
        str(tmp / f"settings-{time.monotonic_ns()}.ini"), QSettings.Format.IniFormat
    )
    window = MainWindow(settings=settings, runs_root=tmp / "runs")
    window.resize(1500, 950)
    window.show()
    window.form.set_config(cfg)
    window.out_edit.setText(str(run_dir))
    redraws = Redraws(window.plots)
    ticks: list[float] = []
    ticker = QTimer()
    ticker.setInterval(20)
    ticker.timeout.connect(lambda: ticks.append(time.perf_counter()))
    loop = QEventLoop()
    window.run_ended.connect(lambda result: loop.quit())
    ticker.start()
    alternator = Alternator([psutil.Process(rival.pid), None], turn)

    def alternate():
        child = window.worker.child if window.worker else None
        if child is not None and child.process.pid is not None and alternator.procs[1] is None:
            alternator.procs[1] = psutil.Process(child.process.pid)
        alternator.tick()

    switcher = QTimer()
    switcher.setInterval(int(Alternator.PERIOD_S * 1000))
    switcher.timeout.connect(alternate)
    switcher.start()
    cpu0, gui0 = cpu_split()
    t0 = time.perf_counter()
    assert window.start(), window.form.error
    worker = window.worker
    training: list[tuple[float, float, float]] = []  # (wall, process CPU, GUI thread CPU)
    worker.train_started.connect(lambda info: training.append((time.perf_counter(), *cpu_split())))
    worker.train_ended.connect(lambda result: training.append((time.perf_counter(), *cpu_split())))
    loop.exec()
    switcher.stop()
    alternator.release()
    wall = time.perf_counter() - t0
    cpu1, gui1 = cpu_split()
    ticker.stop()
    worker.wait()
    cpu = dict(worker.child_stats or {}, window_cpu_s=cpu1 - cpu0, gui_thread_cpu_s=gui1 - gui0)
    if len(training) == 2:  # first step to the end: what the GUI costs while it trains
        (w0, c0, g0), (w1, c1, g1) = training
        cpu.update(train_wall_s=w1 - w0, train_window_cpu_s=c1 - c0, train_gui_cpu_s=g1 - g0)
    window.close()
    window.deleteLater()
    app.processEvents()
    gap = float(np.diff(ticks).max() * 1000) if len(ticks) > 1 else float("nan")
    train, _ = read_metrics(run_dir / "metrics.jsonl")
    cpu["train_s"] = train[-1]["elapsed_s"] if train else float("nan")
    return median_tps(run_dir), gap, redraws, wall, cpu


def paint_cost() -> tuple[float, float]:
    """(ms to redraw and paint every plot, ms for one timer tick) at 150k points."""
    from gui.plots import PlotPanel

    panel = PlotPanel()
    panel.resize(1000, 700)
    panel.show()
    n = 150_000
    train = [
        {"step": s, "loss": 5.0 / s**0.5, "lr": 1e-3, "tokens_per_s": 5e4} for s in range(1, n)
    ]
    panel.load_history(train, [])
    panel.redraw()
    panel.grab()
    panel.add_train({"step": n, "loss": 0.01, "lr": 1e-3, "tokens_per_s": 5e4})
    t = time.perf_counter()
    panel.redraw()
    panel.grab()
    full = time.perf_counter() - t
    panel.add_train({"step": n + 1, "loss": 0.01})
    t = time.perf_counter()
    panel._tick()
    panel.plots["loss"].grab()
    tick = time.perf_counter() - t
    panel.close()
    return full * 1000, tick * 1000


def training_cpu_s(cpu: dict) -> float:
    """The child's CPU seconds from its first step: with one thread, its time training."""
    if "cpu_s" not in cpu:
        return float("nan")
    return cpu["cpu_s"] - (cpu["cpu_before_train_s"] or 0.0)


def describe_cpu(cpu: dict, wall: float) -> str:
    """The window run's CPU split and the child's sending cost, in two lines."""
    if "messages" not in cpu:
        return "  (the child sent no figures)"
    train_s = cpu["train_s"]  # wall time, its suspended turns included
    child_train = training_cpu_s(cpu)
    per_msg = cpu["send_s"] / max(cpu["messages"], 1) * 1e6
    return (
        f"  CPU s: window process {cpu['window_cpu_s']:.2f} (GUI thread "
        f"{cpu['gui_thread_cpu_s']:.2f}) in {wall:.1f} s; child {cpu['cpu_s']:.2f} "
        f"({child_train:.2f} from its first step, {train_s:.1f} s of alternated run)\n"
        f"  while training ({cpu.get('train_wall_s', float('nan')):.1f} s): window process "
        f"{cpu.get('train_window_cpu_s', float('nan')):.2f} CPU s, GUI thread "
        f"{cpu.get('train_gui_cpu_s', float('nan')):.2f}\n"
        f"  pipe: {cpu['messages']} messages for {cpu['events']} events, sending "
        f"{cpu['send_s'] * 1000:.1f} ms ({per_msg:.0f} us per message, "
        f"{cpu['send_s'] / max(child_train, 1e-9) * 1000:.2f} ms per training second); child "
        f"threads: torch {cpu['torch_threads']}, OS {cpu['os_threads']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--quick", action="store_true", help="300 steps, 2 rounds: a smoke run")
    ap.add_argument(
        "--unbatched", action="store_true", help="one pipe message per step (before batching)"
    )
    ap.add_argument("--aa", action="store_true", help="headless against headless: the noise floor")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.rounds = 300, 2
    if args.unbatched:
        child_process.BATCH_S = 0.0  # read when the window starts its child

    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    cfg = dataclasses.replace(
        presets.to_config(presets.load_preset(args.preset)), max_steps=args.steps
    )
    print(
        f"preset {args.preset}, {args.steps} steps, {args.rounds} rounds, torch "
        f"{torch.__version__}, {cpu_training_threads()} training thread(s) of "
        f"{os.cpu_count()} cores, Qt platform {os.environ['QT_QPA_PLATFORM']}, "
        f"events {'unbatched' if args.unbatched else f'batched ({child_process.BATCH_S} s)'}"
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ.setdefault("TRAINDECK_CACHE", str(tmp / "cache"))
        ratios = []
        for i in range(args.rounds):
            if args.aa:
                first, second = headless_pair(args.preset, args.steps, tmp, i)
                ratios.append(second / first)
                print(
                    f"round {i + 1}: headless {first:,.0f} and {second:,.0f} tok/s, "
                    f"ratio {ratios[-1]:.3f}"
                )
                continue
            head_dir = tmp / f"headless-{i}"
            rival = start_headless(args.preset, args.steps, head_dir)
            tps, gap, redraws, wall, cpu = in_window(
                app, cfg, tmp / f"window-{i}", tmp, rival, turn=i % 2
            )
            head = finish_headless(rival, head_dir)
            ratios.append(tps / head)
            busy = sum(redraws.times)
            print(
                f"round {i + 1}: headless {head:,.0f} tok/s, window {tps:,.0f} tok/s "
                f"(torch threads {cpu_training_threads()}), ratio {ratios[-1]:.3f}; longest "
                f"event-loop gap {gap:.0f} ms; redraws {len(redraws.times)}, "
                f"{busy / training_cpu_s(cpu) * 1000:.1f} ms per training second, longest "
                f"{max(redraws.times, default=0) * 1000:.1f} ms"
            )
            print(describe_cpu(cpu, wall))
        print(
            f"{'headless / headless' if args.aa else 'window / headless'}: median "
            f"{statistics.median(ratios):.3f}, "
            f"min {min(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} rounds"
        )
    if not (args.quick or args.aa):
        full, tick = paint_cost()
        print(
            f"150k points: redraw + paint of all plots {full:.0f} ms, one timer tick {tick:.0f} ms"
        )


if __name__ == "__main__":
    main()
