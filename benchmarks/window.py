"""What the window costs the trainer, and how responsive it stays.

    python benchmarks/window.py [--steps 1500] [--rounds 5] [--preset cpu-tiny]
                                [--quick] [--unbatched]

Runs the same config headless (a Trainer in this process) and from a real MainWindow
(Start pressed: the trainer in its child process, the plots drawing) in rounds, at the same
torch thread count (the one the window gives its training process); the side that runs
first alternates from round to round. Throughput is the median `tokens_per_s` of the run's
metrics.jsonl, which counts training time only. Per round it prints the ratio, the longest
event-loop gap, the time the GUI thread spent in plot redraws, and where the CPU went
during the window run: CPU seconds (user + system) of this (the window's) process, its GUI
thread apart, and of the training child (in all, and from its first step on), the pipe
messages the child sent for how many trainer events, the time it spent sending them, and
its torch and OS thread counts. Then the median ratio with its spread, and the cost of
redrawing and painting 150k points. --unbatched sends one pipe message per step (the
protocol before batching) to compare; --quick is a short smoke run (300 steps, 2 rounds).
Target: window / headless >= 0.95. Runs offscreen unless a display is set (QT_QPA_PLATFORM).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

from core import child_process, presets  # noqa: E402
from core.runs import read_metrics  # noqa: E402
from core.trainer import Trainer  # noqa: E402
from gui.worker import cpu_training_threads  # noqa: E402


def median_tps(run_dir: Path) -> float:
    train, _ = read_metrics(run_dir / "metrics.jsonl")
    values = [r["tokens_per_s"] for r in train[len(train) // 10 :]]  # skip the warm-up
    return statistics.median(values)


def headless(cfg, run_dir: Path) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(cpu_training_threads())
    try:
        Trainer(cfg, run_dir).run()
    finally:
        torch.set_num_threads(before)
    return median_tps(run_dir)


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


def in_window(app, cfg, run_dir: Path, tmp: Path) -> tuple[float, float, Redraws, float, dict]:
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
    cpu0, gui0 = cpu_split()
    t0 = time.perf_counter()
    assert window.start(), window.form.error
    worker = window.worker
    training: list[tuple[float, float, float]] = []  # (wall, process CPU, GUI thread CPU)
    worker.train_started.connect(lambda info: training.append((time.perf_counter(), *cpu_split())))
    worker.train_ended.connect(lambda result: training.append((time.perf_counter(), *cpu_split())))
    loop.exec()
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


def describe_cpu(cpu: dict, wall: float) -> str:
    """The window run's CPU split and the child's sending cost, in two lines."""
    if "messages" not in cpu:
        return "  (the child sent no figures)"
    train_s = cpu["train_s"]
    child_train = cpu["cpu_s"] - (cpu["cpu_before_train_s"] or 0.0)
    per_msg = cpu["send_s"] / max(cpu["messages"], 1) * 1e6
    return (
        f"  CPU s: window process {cpu['window_cpu_s']:.2f} (GUI thread "
        f"{cpu['gui_thread_cpu_s']:.2f}) in {wall:.1f} s; child {cpu['cpu_s']:.2f} "
        f"({child_train:.2f} from its first step, {train_s:.1f} s of run)\n"
        f"  while training ({cpu.get('train_wall_s', float('nan')):.1f} s): window process "
        f"{cpu.get('train_window_cpu_s', float('nan')):.2f} CPU s, GUI thread "
        f"{cpu.get('train_gui_cpu_s', float('nan')):.2f}\n"
        f"  pipe: {cpu['messages']} messages for {cpu['events']} events, sending "
        f"{cpu['send_s'] * 1000:.1f} ms ({per_msg:.0f} us per message, "
        f"{cpu['send_s'] / max(train_s, 1e-9) * 1000:.2f} ms per second of run); child "
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
            window_first = i % 2 == 1
            if window_first:
                tps, gap, redraws, wall, cpu = in_window(app, cfg, tmp / f"window-{i}", tmp)
            head = headless(cfg, tmp / f"headless-{i}")
            if not window_first:
                tps, gap, redraws, wall, cpu = in_window(app, cfg, tmp / f"window-{i}", tmp)
            ratios.append(tps / head)
            busy = sum(redraws.times)
            print(
                f"round {i + 1} ({'window' if window_first else 'headless'} first): headless "
                f"{head:,.0f} tok/s (torch threads {cpu_training_threads()}), window "
                f"{tps:,.0f} tok/s, ratio {ratios[-1]:.3f}; longest event-loop gap {gap:.0f} "
                f"ms; redraws {len(redraws.times)}, {busy / wall * 1000:.1f} ms per second of "
                f"run, longest {max(redraws.times, default=0) * 1000:.1f} ms"
            )
            print(describe_cpu(cpu, wall))
        print(
            f"window / headless: median {statistics.median(ratios):.3f}, "
            f"min {min(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} rounds"
        )
    if not args.quick:
        full, tick = paint_cost()
        print(
            f"150k points: redraw + paint of all plots {full:.0f} ms, one timer tick {tick:.0f} ms"
        )


if __name__ == "__main__":
    main()
