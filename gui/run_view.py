"""The right-hand side of the window: a run's status, progress, plots, log and samples."""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from core.runs.folder import RunFolder, read_metrics
from core.runs.progress import Progress, describe_run_data
from core.training import spill
from gui.compare_tab import CompareTab
from gui.completions_view import CompletionsView
from gui.evaluate_tab import EvaluateTab
from gui.hardware_panel import HardwareInfo
from gui.playground import Playground
from gui.plots import PlotPanel, fixed_label
from gui.run_session import RunSession, RunState
from gui.worker import TrainThread

STATUS_COLORS = {
    "ready": "#444",
    "starting": "#1565c0",
    "running": "#1565c0",
    "finishing": "#2e7d32",
    "stopping": "#ef6c00",
    "stopped": "#ef6c00",
    "finished": "#2e7d32",
    "failed": "#c62828",
}
# Plots and tabs at the default window size (pixels; another size shares them out in this
# ratio). The tabs get enough for the Playground's output box to show its text.
LOWER_SPLIT = [480, 390]
PROGRESS_MS = 250  # labels (elapsed, ETA) refresh rate
PROGRESS_MS_TRAINING = 1000  # elapsed time shows whole seconds; a repaint costs the trainer


class RunView(QWidget):
    """Shows what a session's training thread reports; changes nothing but itself."""

    def __init__(
        self, session: RunSession, runs_root: Path, hardware_info: Callable[[], HardwareInfo]
    ):
        super().__init__()
        self.session = session
        self.hardware_info = hardware_info
        self.run_progress = Progress()
        self.prepare_started: tuple[str, float] | None = None
        self.compiling_since: float | None = None  # a compiled run's first step, until done
        self._build(runs_root)
        self.progress_timer = QTimer(self)
        self.progress_timer.setInterval(PROGRESS_MS)
        self.progress_timer.timeout.connect(self.refresh_progress)
        self.progress_timer.start()

    def _build(self, runs_root: Path) -> None:
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.notice = QLabel()
        self.notice.setWordWrap(True)
        self.notice.setStyleSheet(
            "background: #fff3e0; border: 1px solid #ffb74d; padding: 4px; color: #e65100;"
        )
        self.notice.setVisible(False)
        self.progress = QProgressBar()
        self.progress.setFormat("no run yet")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.timing_label = fixed_label(
            "loss 10.0000    val 10.0000    99,999,999 tok/s    elapsed 999:59:59    ETA 999:59:59"
        )
        self.timing_label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        timing_row = QHBoxLayout()
        timing_row.addWidget(self.timing_label)
        timing_row.addStretch(1)

        self.plots = PlotPanel()
        fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setMaximumBlockCount(10_000)
        self.log_view.setFont(fixed)
        self.sample_view = QPlainTextEdit()
        self.sample_view.setReadOnly(True)
        self.sample_view.setFont(fixed)
        self.sample_view.setPlaceholderText("Text generated at each evaluation appears here.")
        self.tabs = QTabWidget()
        self.tabs.addTab(self.log_view, "Log")
        self.tabs.addTab(self.sample_view, "Latest sample")
        self.completions = CompletionsView()  # GRPO: the latest completions and rewards
        self.tabs.addTab(self.completions, "Completions")
        self.playground = Playground(runs_root, training_active=lambda: self.session.running)
        self.tabs.addTab(self.playground, "Playground")
        self.evaluate = EvaluateTab(runs_root)
        self.tabs.addTab(self.evaluate, "Evaluate")
        self.compare = CompareTab(runs_root)
        self.tabs.addTab(self.compare, "Compare runs")

        lower = QSplitter(Qt.Orientation.Vertical)
        lower.addWidget(self.plots)
        lower.addWidget(self.tabs)
        lower.setChildrenCollapsible(False)  # dragged to an end, a panel keeps its minimum
        lower.setHandleWidth(8)
        lower.setStretchFactor(0, 1)
        lower.setStretchFactor(1, 1)
        lower.setSizes(LOWER_SPLIT)  # proportions until restored from the settings
        self.lower_splitter = lower

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 0, 6, 0)
        layout.addWidget(self.status_label)
        layout.addWidget(self.notice)
        layout.addWidget(self.progress)
        layout.addLayout(timing_row)
        layout.addWidget(lower, 1)
        self.show_status("Ready. Choose a preset and press Start.")

    def attach(self, worker: TrainThread) -> None:
        """A new run: forget the last one's progress and follow this thread's events."""
        self.notice.setVisible(False)
        self.run_progress.reset()
        self.prepare_started = None
        worker.train_started.connect(self.on_train_started)
        worker.preparing.connect(self.on_preparing)
        worker.batches.connect(self.on_batches)
        worker.evaluated.connect(self.on_eval)
        worker.checkpoint_saved.connect(self.on_checkpoint)
        worker.sampled.connect(self.on_sample)
        worker.logged.connect(self.log)
        worker.oom.connect(self.on_oom)
        worker.compiled.connect(self.on_compiled)
        self.compiling_since = None
        self.set_training(True)
        worker.finished.connect(lambda: self.set_training(False))

    def set_training(self, training: bool) -> None:
        """Redraw less often while a run trains: the GUI thread shares the GIL with it."""
        self.plots.set_training(training)
        self.progress_timer.setInterval(PROGRESS_MS_TRAINING if training else PROGRESS_MS)

    def on_preparing(self, phase: str, done: float, total: float) -> None:
        """Data preparation before the first step: a progress bar in MB with its speed."""
        now = time.monotonic()
        if self.prepare_started is None or self.prepare_started[0] != phase:
            self.prepare_started = (phase, now)
        rate = done / 1e6 / max(now - self.prepare_started[1], 1e-3)
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * done / max(total, 1)))
        self.progress.setFormat(
            f"preparing data: {phase} {done / 1e6:,.0f} / {total / 1e6:,.0f} MB "
            f"({rate:,.0f} MB/s) — Stop cancels"
        )

    def on_train_started(self, info: dict) -> None:
        self.run_progress.start(info["max_steps"], info["start_step"])
        self.prepare_started = None
        self.progress.setRange(0, max(1, info["max_steps"]))
        self.progress.setFormat("step %v / %m (%p%)")
        self.progress.setValue(info["start_step"])
        if info.get("compiling"):  # the first step compiles: seconds, not a step's time
            self.compiling_since = time.monotonic()
            self._show_compiling()
        # Cleared only now: a run refused at setup leaves the last run's curves on screen.
        if info.get("resumed"):
            self._refill_plots(Path(info["run_dir"]), info["start_step"])
        else:
            self.plots.clear()
        gpu = self.hardware_info().gpu_for(info["device"]) if info["device"] != "cpu" else None
        if gpu is not None:
            self.plots.set_device_total(gpu["total_bytes"] / 1024**2)
        if self.session.state not in (RunState.STOPPING, RunState.FINISHING):
            params = f"{info['n_params']:,} parameters"
            trainable = info.get("n_trainable", info["n_params"])
            if trainable != info["n_params"]:  # LoRA: the adapters train, the base is frozen
                params = f"{trainable:,} of {info['n_params']:,} parameters training (LoRA)"
            self.show_status(
                f"Running on {info['device']} ({info['precision']}), {params}, "
                f"data: {describe_run_data(info)}",
            )

    def _refill_plots(self, run_dir: Path, start_step: int) -> None:
        """Curves continue from the history; records past the checkpoint are not history."""
        train, evals = read_metrics(RunFolder(run_dir).metrics_file)
        train = [r for r in train if r.get("step", 0) <= start_step]
        evals = [r for r in evals if r.get("step", 0) <= start_step]
        self.plots.load_history(train, evals)
        self.plots.redraw()
        self.log(f"plots refilled with {len(train)} steps from {run_dir.name}/metrics.jsonl")

    def on_batches(self, records: list) -> None:
        now = time.monotonic()
        for record in records:
            self.plots.add_train(record)  # drawn by the plot timer, not here
            self.run_progress.add_batch(record, now)
        if records and "reward" in records[-1]:
            self.completions.refresh(self.session.run_dir)
        if records:
            self._follow_max_steps(records[-1].get("max_steps"))

    def _follow_max_steps(self, max_steps: int | None) -> None:
        """Finish or a time budget moves the run's end: the bar and the ETA follow it."""
        if not max_steps or max_steps == self.run_progress.max_steps:
            return
        self.run_progress.max_steps = max_steps
        self.progress.setRange(0, max(1, max_steps))

    def on_eval(self, record: dict) -> None:
        self.plots.add_eval(record)
        self.run_progress.add_eval(record)

    def on_checkpoint(self, path: str, step: int) -> None:
        self.log(f"checkpoint saved at step {step}: {path}")

    def on_sample(self, step: int, text: str) -> None:
        self.sample_view.setPlainText(f"--- step {step} ---\n{text}")

    def on_oom(self, info: dict) -> None:
        message = (
            f"Out of memory at step {info['step']}: the micro-batch was halved to "
            f"batch_size {info['batch_size']} x grad_accum {info['grad_accum']} "
            "(same effective batch) and training goes on."
        )
        self.notice.setText("⚠ " + message)
        self.notice.setVisible(True)
        self.log(message)

    def _show_compiling(self) -> None:
        seconds = time.monotonic() - self.compiling_since
        self.progress.setFormat(f"compiling (first step)… {seconds:.0f} s")

    def on_compiled(self, info: dict) -> None:
        self.compiling_since = None
        self.progress.setFormat("step %v / %m (%p%)")

    def refresh_progress(self) -> None:
        if self.compiling_since is not None:
            self._show_compiling()
        step = self.run_progress.step
        if step is not None:
            self.progress.setValue(min(step, self.progress.maximum()))
        self.timing_label.setText(self.run_progress.summary(time.monotonic(), self.session.running))

    def show_status(self, text: str) -> None:
        """The status line: the session's state in its colour, then `text`."""
        state = self.session.state.value
        color = STATUS_COLORS.get(state, "#444")
        self.status_label.setText(
            f"<span style='color:{color}; font-weight:bold; font-size:13pt'>"
            f"{state.capitalize()}</span>&nbsp;&nbsp;{html.escape(text)}"
        )

    def log(self, message: str) -> None:
        self.log_view.appendPlainText(f"{time.strftime('%H:%M:%S')}  {message}")
        if message.startswith(spill.PREFIX):  # VRAM spilling into shared memory: in sight
            self.notice.setText(message)
            self.notice.setVisible(True)

    def set_timers(self, on: bool) -> None:
        """A hidden or closed window has nothing to draw."""
        for timer in (self.plots.timer, self.progress_timer):
            timer.start() if on else timer.stop()
