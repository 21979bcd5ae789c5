"""Screenshot of the window with two simulated GPUs (docs/multi_gpu_panel.png): the hardware
panel lists both cards, Execution offers "Split layers across 2 GPUs" and the estimate shows
each card's share; the memory plot draws a line per card from a split run's records.

    xvfb-run -a -s "-screen 0 1600x1560x24" python benchmarks/multi_gpu_panel.py OUT.png
    ... OUT.png --shard: "Shard across 2 GPUs (torchrun)" checked instead (docs/multi_gpu_shard.png)
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication, QScrollArea

from core.platform import hardware

GiB = 1024**3


def card(i: int, name: str, total: int, free: float) -> dict:
    return {
        "index": i,
        "name": name,
        "total_bytes": total * GiB,
        "free_bytes": int(free * GiB),
        "capability": "8.6",
        "bf16": True,
        "tf32": True,
        "driver": "550.54",
    }


def record(s: int, shard: bool = False) -> dict:
    """A split run's train record as the trainer writes it (simulated figures); sharded,
    the second card holds about what the first does."""
    second = 14700.0 if shard else 7600.0
    return {
        "step": s,
        "loss": 4 * math.exp(-s / 40) + 1.5,
        "lr": 3e-4,
        "tokens_per_s": 9000.0,
        "mem_allocated_mb": 14000.0,
        "mem_reserved_mb": 15000.0 + 5 * math.sin(s / 5),
        "nvml_used_mb": 16000.0,
        "nvml_total_mb": 24576.0,
        "card_reserved_mb": {
            "cuda:0": 15000.0 + 30 * math.sin(s / 5),
            "cuda:1": second + 30 * math.cos(s / 5),
        },
        "card_used_mb": {"cuda:0": 16000.0, "cuda:1": second + 800.0},
    }


def main(out: str, shard: bool = False) -> None:
    hardware.gpus = lambda: [
        card(0, "NVIDIA GeForce RTX 4090 (simulated)", 24, 22.0),
        card(1, "NVIDIA GeForce RTX 3090 (simulated)", 24, 11.0),
    ]
    app = QApplication(sys.argv)
    from gui.main_window import MainWindow

    tmp = Path(tempfile.mkdtemp())
    settings = QSettings(str(tmp / "gui.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings, runs_root=tmp / "runs")
    w.resize(1600, 1560)
    w.form.set_values(hidden_dim=2048, n_heads=16, n_layers=24, seq_len=1024, batch_size=4)
    (w.form.shard if shard else w.form.split).setChecked(True)
    for s in range(1, 121):
        w.plots.add_train(record(s, shard))  # a sharded run's records carry every card's too
    w.show()

    def snap():
        areas = [a for a in w.findChildren(QScrollArea) if a.widget()]
        area = next(a for a in areas if a.widget().isAncestorOf(w.form))
        area.ensureWidgetVisible(w.estimate, 50, 50)
        w.plots.redraw()
        app.processEvents()
        subprocess.run(["import", "-window", "root", out], check=True)
        app.quit()

    QTimer.singleShot(2500, snap)
    app.exec()


if __name__ == "__main__":
    main(sys.argv[1], shard="--shard" in sys.argv[2:])
