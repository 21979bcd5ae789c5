"""The Experts plot fed synthetic step records of a mixture of experts (no model is built):
what redrawing and painting the strip costs at a large model's shape, and a window to look at.

    python benchmarks/experts_plot.py [--layers 48] [--experts 128] [--top-k 8] [--repeats 50]
    python benchmarks/experts_plot.py --show 15 [--layers 8 --experts 16 --top-k 2]

The first form times, offscreen, the strip's redraw (parse the record, colour the image, mark
the idle experts) and a paint of it, per log step. --show opens the window instead, as a run
draws it: records arrive in batches, as from the training process, for that many seconds (the
screenshot docs/experts_plot.png: under xvfb-run, `import -window root`).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from core.runs import experts  # noqa: E402


def synthetic_records(steps: int, layers: int, n_experts: int, top_k: int, seed: int = 0):
    """Step records as a mixture of experts' run writes them: each layer's router drifts from
    even towards a few favourites, and in one layer a few experts stop getting tokens."""
    rng = np.random.default_rng(seed)
    sparse = list(range(1, 2 * layers, 2))  # every second layer is MoE (decoder_sparse_step 2)
    tokens = 2048
    favourites = rng.dirichlet(np.full(n_experts, 0.7), size=layers)
    out = []
    for step in range(1, steps + 1):
        t = step / steps
        probs = (1 - 0.6 * t) / n_experts + 0.6 * t * favourites
        starved = layers // 2
        probs[starved, : max(1, n_experts // 8)] *= max(0.0, 1 - 2 * t)  # dying experts
        probs /= probs.sum(axis=1, keepdims=True)
        counts = np.stack([rng.multinomial(tokens * top_k, p) for p in probs])
        shares = counts / counts.sum(axis=1, keepdims=True)
        entropy = float(np.mean(-np.sum(probs * np.log(np.maximum(probs, 1e-12)), axis=1)))
        aux = float(n_experts * np.mean(np.sum(shares * probs, axis=1)) * top_k)
        out.append(
            {
                "step": step,
                "loss": 4.0 * math.exp(-2 * t) + 1.2 + 0.05 * rng.standard_normal(),
                "lr": 3e-4 * min(1.0, step / 50),
                "tokens_per_s": 5200 + 200 * rng.standard_normal(),
                "elapsed_s": step * 0.4,
                "rss_mb": 2100 + 10 * t,
                experts.AUX: aux,
                experts.ENTROPY: entropy + 0.01 * rng.standard_normal(),
                experts.LOAD: shares.round(6).tolist(),
                experts.LAYERS: sparse,
            }
        )
    return out


def time_strip(args) -> None:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from gui.plots import PlotPanel

    app = QApplication.instance() or QApplication([])
    panel = PlotPanel()
    panel.resize(1200, 900)
    panel.show()
    records = synthetic_records(args.repeats, args.layers, args.experts, args.top_k)
    panel.add_train(records[0])
    panel.redraw()
    app.processEvents()
    redraw, paint = [], []
    for record in records:
        panel.add_train(record)
        t0 = time.perf_counter()
        panel._redraw_strip()
        t1 = time.perf_counter()
        panel.experts.grab()
        t2 = time.perf_counter()
        redraw.append(t1 - t0)
        paint.append(t2 - t1)
    line = panel.experts.load.idle_line()
    print(
        f"{args.layers} MoE layers x {args.experts} experts: strip redraw median "
        f"{1e3 * np.median(redraw):.2f} ms, paint median {1e3 * np.median(paint):.1f} ms "
        f"({args.repeats} log steps); last step: {line}"
    )


def show(args) -> None:
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from gui.main_window import MainWindow
    from gui.run_session import RunState

    app = QApplication.instance() or QApplication([])
    tmp = Path(tempfile.mkdtemp())
    window = MainWindow(settings=QSettings(str(tmp / "gui.ini"), QSettings.Format.IniFormat))
    window.resize(1400, 980)
    window.move(0, 0)
    window.show()
    steps = 600
    records = iter(synthetic_records(steps, args.layers, args.experts, args.top_k)[:420])
    view = window.run_view
    view.lower_splitter.setSizes([720, 150])  # as a user drags it to watch the plots
    # the look of a run (no process is started): its state, and a clock that ticks for the ETA
    window.session.state = RunState.RUNNING
    type(window.session).running = property(lambda session: True)
    view.on_train_started(
        {
            "max_steps": steps,
            "start_step": 0,
            "resumed": False,
            "device": "cpu",
            "precision": "fp32",
            "n_params": 1_210_000_000,
            "n_trainable": 1_210_000_000,
            "data_source": "synthetic MoE records (benchmarks/experts_plot.py)",
        }
    )
    view.set_training(True)
    feed = QTimer()
    feed.timeout.connect(lambda: view.on_batches(list(itertools.islice(records, 10))))
    feed.start(100)
    QTimer.singleShot(int(args.show * 1000), app.quit)
    app.exec()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--experts", type=int, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--show", type=float, default=0, help="seconds to show the window")
    args = parser.parse_args()
    small = args.show > 0  # a shape that reads on screen; the timing: Qwen3-30B-A3B's
    args.layers = args.layers or (8 if small else 48)
    args.experts = args.experts or (16 if small else 128)
    args.top_k = args.top_k or (2 if small else 8)
    show(args) if small else time_strip(args)


if __name__ == "__main__":
    main()
