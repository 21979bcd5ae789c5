"""What the window costs the trainer, and how responsive it stays.

    python benchmarks/window.py [--steps 1500] [--rounds 2] [--preset cpu-tiny]

Runs the same config headless (a Trainer in this process) and from a real MainWindow
(Start pressed: the trainer in its child process, the plots drawing), alternating, at the
same torch thread count (the one the window gives its training process). Throughput is
the median `tokens_per_s` of the run's metrics.jsonl, which counts training time only.
Also prints the longest event-loop gap during the window run, the time the GUI thread
spent in plot redraws, and the cost of redrawing and painting 150k points.
Target: window / headless >= 0.95. Runs offscreen unless a display is set (QT_QPA_PLATFORM).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from core import presets  # noqa: E402
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


def in_window(app, cfg, run_dir: Path, tmp: Path) -> tuple[float, float, Redraws, float]:
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
    t0 = time.perf_counter()
    assert window.start(), window.form.error
    loop.exec()
    wall = time.perf_counter() - t0
    ticker.stop()
    window.close()
    window.deleteLater()
    app.processEvents()
    gap = float(np.diff(ticks).max() * 1000) if len(ticks) > 1 else float("nan")
    return median_tps(run_dir), gap, redraws, wall


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--preset", default="cpu-tiny")
    args = ap.parse_args()

    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    cfg = dataclasses.replace(
        presets.to_config(presets.load_preset(args.preset)), max_steps=args.steps
    )
    print(
        f"preset {args.preset}, {args.steps} steps, torch {torch.__version__}, "
        f"{cpu_training_threads()} training thread(s) of {os.cpu_count()} cores, "
        f"Qt platform {os.environ['QT_QPA_PLATFORM']}"
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ.setdefault("TRAINDECK_CACHE", str(tmp / "cache"))
        heads, wins = [], []
        for i in range(args.rounds):
            heads.append(headless(cfg, tmp / f"headless-{i}"))
            tps, gap, redraws, wall = in_window(app, cfg, tmp / f"window-{i}", tmp)
            wins.append(tps)
            busy = sum(redraws.times)
            print(
                f"round {i + 1}: headless {heads[-1]:,.0f} tok/s, window {tps:,.0f} tok/s "
                f"({tps / heads[-1]:.3f}); longest event-loop gap {gap:.0f} ms; redraws "
                f"{len(redraws.times)}, {busy / wall * 1000:.1f} ms per second of run, "
                f"longest {max(redraws.times, default=0) * 1000:.1f} ms"
            )
        h, w = statistics.median(heads), statistics.median(wins)
        print(f"window / headless: {w / h:.3f}  (median {w:,.0f} vs {h:,.0f} tok/s)")
    full, tick = paint_cost()
    print(f"150k points: redraw + paint of all plots {full:.0f} ms, one timer tick {tick:.0f} ms")


if __name__ == "__main__":
    main()
