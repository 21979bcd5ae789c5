"""The TrainDeck window: settings on the left, live plots and progress on the right.

Everything here is presentation and wiring. Training happens in `TrainThread`, which owns
core's Trainer; its events arrive as queued signals and land in buffers that timers draw.
"""

from __future__ import annotations

import dataclasses
import html
import json
import time
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from core import presets as preset_lib
from core.config import TrainConfig, from_dict, validate
from core.errors import ConfigError, UserError
from core.estimate import fit_micro_batch, recommend_preset
from core.runs import (
    DEFAULT_RUNS_ROOT,
    RunFolder,
    interrupted_run,
    list_runs,
    new_run_dir,
    read_metrics,
    resume_config,
)
from gui.playground import Playground

from .estimate_panel import EstimatePanel, judge
from .form import ConfigForm
from .hardware_panel import HardwareInfo, HardwarePanel, detect
from .plots import PlotPanel, fixed_label
from .resume_dialog import ResumeDialog
from .worker import TrainThread, settle_heap, warm_up

STATUS_COLORS = {
    "ready": "#444",
    "starting": "#1565c0",
    "running": "#1565c0",
    "stopping": "#ef6c00",
    "stopped": "#ef6c00",
    "finished": "#2e7d32",
    "failed": "#c62828",
}
FAILURE_TITLES = {
    "input": "Cannot train with these settings",
    "training": "Training stopped",
    "crash": "Training failed",
}
PROGRESS_MS = 250  # labels (elapsed, ETA) refresh rate


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def describe_run_data(info: dict) -> str:
    """'<source>, 11.2 MB, 3.1M tokens (bpe), 2.4 passes' for the status line."""
    data = info.get("data") or {}
    if not data:
        return info.get("data_source", "")
    steps = info["max_steps"] - info["start_step"]
    passes = info["max_steps"] * info["tokens_per_step"] / max(1, data["train_tokens"])
    used = f"{data['source_bytes'] / 1e6:,.1f} MB"
    if data["source_bytes"] < data["total_bytes"]:
        used = f"using {data['source_bytes'] / 1e6:,.1f} of {data['total_bytes'] / 1e6:,.1f} MB"
    tokens = data["train_tokens"] + data["val_tokens"]
    return (
        f"{data['source']}, {used}, {tokens:,} tokens ({data['tokenizer']}), "
        f"{passes:.2f} passes over the training data ({steps:,} steps to go)"
    )


class MainWindow(QMainWindow):
    run_ended = Signal(dict)  # the run's result, once its thread has finished

    def __init__(
        self,
        settings: QSettings | None = None,
        runs_root: Path | str | None = None,
        hardware_info: HardwareInfo | None = None,
    ):
        super().__init__()
        warm_up()
        self.settings = settings if settings is not None else QSettings("TrainDeck", "TrainDeck")
        self.runs_root = Path(runs_root) if runs_root else DEFAULT_RUNS_ROOT
        self.info = hardware_info or detect()
        self.worker: TrainThread | None = None
        self.state = "ready"
        self.run_dir: Path | None = None
        self.presets: list[preset_lib.Preset] = []
        self.recommended: str | None = None
        self.resume_dialog: ResumeDialog | None = None
        self.last_result: dict | None = None
        self._close_when_done = False
        self._reset_progress()

        self.setWindowTitle("TrainDeck")
        self._build()
        self._load_presets()
        self._restore_settings()
        self._form_changed()

        self.progress_timer = QTimer(self)
        self.progress_timer.setInterval(PROGRESS_MS)
        self.progress_timer.timeout.connect(self._refresh_progress)
        self.progress_timer.start()
        settle_heap()

    # -- layout --------------------------------------------------------------------------

    def _build(self) -> None:
        self.hardware = HardwarePanel(self.info)
        self.hardware.info_changed.connect(self._hardware_changed)
        self.form = ConfigForm(gpu_count=len(self.info.gpus))
        self.form.changed.connect(self._form_changed)
        self.estimate = EstimatePanel(self.info)
        self.estimate.fit_requested.connect(self.fit_to_gpu)

        settings_column = QWidget()
        column = QVBoxLayout(settings_column)
        column.addWidget(self.hardware)
        column.addWidget(self._preset_box())
        column.addWidget(self.form)
        column.addWidget(self._output_box())
        column.addWidget(self.estimate)
        column.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidget(settings_column)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(settings_column.sizeHint().width() + 24)

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(scroll, 1)
        left_layout.addWidget(self._controls_box())

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(self._run_view())
        self.splitter.setStretchFactor(1, 1)
        self.setCentralWidget(self.splitter)
        self.resize(1500, 950)

    def _preset_box(self) -> QGroupBox:
        box = QGroupBox("Preset")
        self.preset_combo = _combo()
        self.preset_combo.currentIndexChanged.connect(self._preset_chosen)
        self.save_preset_button = QPushButton("Save as preset…")
        self.save_preset_button.setToolTip("Save the current settings as a user preset")
        self.save_preset_button.clicked.connect(self._save_preset_clicked)
        self.preset_info = QLabel()
        self.preset_info.setWordWrap(True)
        self.preset_info.setStyleSheet("color: #555;")
        row = QHBoxLayout()
        row.addWidget(self.preset_combo, 1)
        row.addWidget(self.save_preset_button)
        layout = QVBoxLayout(box)
        layout.addLayout(row)
        layout.addWidget(self.preset_info)
        return box

    def _output_box(self) -> QGroupBox:
        box = QGroupBox("Run folder")
        self.out_edit = QLineEdit()
        self.out_edit.setPlaceholderText(f"new folder under {self.runs_root}/")
        self.out_edit.setToolTip(
            "Where the run's checkpoints, metrics and logs go; empty picks "
            f"{self.runs_root}/<preset>-<date>-<time>. Used once: the next Start picks a new one."
        )
        self.out_edit.setClearButtonEnabled(True)
        choose = QPushButton("Choose…")
        choose.clicked.connect(self._choose_out)
        row = QHBoxLayout(box)
        row.addWidget(self.out_edit, 1)
        row.addWidget(choose)
        return box

    def _controls_box(self) -> QGroupBox:
        box = QGroupBox("Training")
        self.start_button = QPushButton("Start")
        self.start_button.setStyleSheet("font-weight: bold;")
        self.start_button.clicked.connect(self.start)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Finish the current step, save a checkpoint, then stop")
        self.stop_button.clicked.connect(self.stop)
        self.save_button = QPushButton("Save checkpoint now")
        self.save_button.clicked.connect(self.save_now)
        self.resume_button = QPushButton("Resume…")
        self.resume_button.setToolTip("Continue a run from its folder or a checkpoint file")
        self.resume_button.clicked.connect(lambda: self.open_resume_dialog())
        self.resume_latest_button = QPushButton("Resume latest")
        self.resume_latest_button.setToolTip(f"Continue the newest run under {self.runs_root}/")
        self.resume_latest_button.clicked.connect(self.resume_latest)
        grid = QGridLayout(box)
        grid.addWidget(self.start_button, 0, 0)
        grid.addWidget(self.stop_button, 0, 1)
        grid.addWidget(self.save_button, 0, 2)
        grid.addWidget(self.resume_button, 1, 0)
        grid.addWidget(self.resume_latest_button, 1, 1)
        return box

    def _run_view(self) -> QWidget:
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
        self.playground = Playground(self.runs_root, training_active=lambda: self.running)
        self.tabs.addTab(self.playground, "Playground")

        lower = QSplitter(Qt.Orientation.Vertical)
        lower.addWidget(self.plots)
        lower.addWidget(self.tabs)
        lower.setStretchFactor(0, 4)
        lower.setStretchFactor(1, 1)
        self.lower_splitter = lower

        view = QWidget()
        layout = QVBoxLayout(view)
        layout.setContentsMargins(4, 0, 6, 0)
        layout.addWidget(self.status_label)
        layout.addWidget(self.notice)
        layout.addWidget(self.progress)
        layout.addLayout(timing_row)
        layout.addWidget(lower, 1)
        self._set_state("ready", "Ready. Choose a preset and press Start.")
        return view

    # -- presets -------------------------------------------------------------------------

    def _load_presets(self) -> None:
        try:
            self.presets = preset_lib.list_presets()
            self.recommended = self._recommend().name
        except UserError as e:
            self.show_error("Presets", str(e))
        self.preset_combo.blockSignals(True)
        self.preset_combo.clear()
        for p in self.presets:
            text = p.name
            if p.name == self.recommended:
                text += "  ★ recommended"
            if not p.builtin:
                text += "  (user)"
            self.preset_combo.addItem(text, p.name)
            self.preset_combo.setItemData(
                self.preset_combo.count() - 1, p.description, Qt.ItemDataRole.ToolTipRole
            )
        self.preset_combo.blockSignals(False)

    def _recommend(self) -> preset_lib.Preset:
        if self.info.gpus:
            g = self.info.gpus[0]
            return recommend_preset(g["total_bytes"], g["free_bytes"], presets=self.presets)
        return recommend_preset(presets=self.presets)

    def select_preset(self, name: str, apply: bool = True) -> bool:
        """Select a preset by name; with apply, its values fill the form."""
        index = self.preset_combo.findData(name)
        if index < 0:
            return False
        if not apply:
            self.preset_combo.blockSignals(True)
        self.preset_combo.setCurrentIndex(index)
        self.preset_combo.blockSignals(False)
        if apply:
            self._preset_chosen(index)
        self._show_preset_info(name)
        return True

    def _preset_chosen(self, index: int) -> None:
        if index < 0 or index >= len(self.presets):
            return
        preset = self.presets[index]
        try:
            cfg = preset_lib.to_config(preset)
        except ConfigError as e:
            self.show_error("Preset", str(e))
            return
        cfg.data = self.form.data.value()  # the data choice is the user's, not the preset's
        self.form.set_config(cfg)
        self._show_preset_info(preset.name)

    def _show_preset_info(self, name: str) -> None:
        preset = next((p for p in self.presets if p.name == name), None)
        if preset is None:
            self.preset_info.clear()
            return
        parts = [preset.description]
        if preset.hardware:
            parts.append(f"For: {preset.hardware}.")
        if preset.name == self.recommended:
            parts.append("Recommended for this machine.")
        self.preset_info.setText(" ".join(p for p in parts if p))

    def _save_preset_clicked(self) -> None:
        name, ok = QInputDialog.getText(
            self, "Save as preset", "Preset name (letters, digits, - and _):"
        )
        if ok and name.strip():
            self.save_preset_as(name.strip())

    def save_preset_as(self, name: str, description: str = "") -> Path | None:
        """Write the form as a user preset and select it."""
        try:
            cfg = self.form.validated()
            path = preset_lib.save_user_preset(name, cfg, description)
        except UserError as e:
            self.show_error("Cannot save preset", str(e))
            return None
        data = self.form.data.value()
        self._load_presets()
        self.select_preset(name, apply=False)
        cfg = dataclasses.replace(cfg, preset=name, data=data)
        self.form.set_config(cfg)
        self.log(f"saved preset {name!r} to {path}")
        return path

    # -- form, estimate, hardware --------------------------------------------------------

    def _form_changed(self) -> None:
        self.estimate.update_for(self.form.validated() if self.form.is_valid else None)
        self._update_controls()

    def _hardware_changed(self, info: HardwareInfo) -> None:
        self.info = info
        self.estimate.set_info(info)
        self._form_changed()

    def fit_to_gpu(self) -> bool:
        """Set the largest micro-batch that fits free VRAM, keeping the effective batch."""
        if not self.form.is_valid:
            return False
        cfg = self.form.validated()
        gpu = self.info.gpu_for(cfg.device)
        if gpu is None or gpu.get("free_bytes") is None:
            self.show_error("Fit to my GPU", "No CUDA GPU with a known amount of free VRAM.")
            return False
        fitted = fit_micro_batch(cfg, gpu["free_bytes"])
        if fitted is None:
            self.show_error(
                "Fit to my GPU",
                f"Even a micro-batch of 1 does not fit the {gpu['free_bytes'] / 1024**3:.1f} GiB "
                "free on this GPU: lower hidden_dim, n_layers or seq_len, or turn on gradient "
                "checkpointing.",
            )
            return False
        self.form.set_values(batch_size=fitted.batch_size, grad_accum=fitted.grad_accum)
        self.log(
            f"fit to {gpu['name']}: batch_size {fitted.batch_size} x grad_accum "
            f"{fitted.grad_accum} (effective batch {fitted.batch_size * fitted.grad_accum})"
        )
        return True

    def _choose_out(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Run folder", str(self.runs_root))
        if path:
            self.out_edit.setText(path)

    # -- starting and controlling a run --------------------------------------------------

    @property
    def running(self) -> bool:
        return self.worker is not None

    def start(self) -> bool:
        """Start a new run from the form; returns False when nothing was started."""
        if self.running:
            return False
        try:
            cfg = self.form.validated()
        except ConfigError as e:
            self.show_error("Invalid settings", str(e))
            return False
        fit = judge(cfg, self.info)
        if not fit.fits and not self.confirm(
            "Start anyway?",
            f"This run is estimated not to fit in memory: {fit.describe()}.\n\n"
            "It may fail with out-of-memory (on a GPU the batch is halved automatically). "
            "Start anyway?",
        ):
            return False
        run_dir = self._next_run_dir(cfg)
        self.out_edit.clear()
        self._launch(cfg, run_dir, None)
        return True

    def _next_run_dir(self, cfg: TrainConfig) -> Path:
        text = self.out_edit.text().strip()
        if text:
            return Path(text)
        return new_run_dir(self.runs_root, cfg.preset)

    def resume_from(self, spec: str, changes: dict | None = None, preset: str | None = None):
        """Continue a run: its checkpoint's config, with `changes` (and a preset) on top."""
        if self.running:
            return False
        try:
            cfg, ckpt, run = resume_config(spec, self.runs_root, preset, changes)
            if run.resume_note:
                self.log(run.resume_note)
        except UserError as e:
            self.show_error("Cannot resume", str(e))
            return False
        self.form.set_config(cfg)
        if cfg.preset:
            self.select_preset(cfg.preset, apply=False)
        self._launch(cfg, run.path, ckpt)
        return True

    def _launch(self, cfg: TrainConfig, run_dir: Path, resume_from: Path | None) -> None:
        self.save_settings()
        self.notice.setVisible(False)
        self._reset_progress()
        self.last_result = None
        self.run_dir = Path(run_dir)
        self.setWindowTitle(f"TrainDeck — {self.run_dir.name}")
        worker = TrainThread(cfg, self.run_dir, resume_from, self)
        worker.train_started.connect(self._on_train_started)
        worker.preparing.connect(self._on_preparing)
        worker.batch_end.connect(self._on_batch)
        worker.evaluated.connect(self._on_eval)
        worker.checkpoint_saved.connect(self._on_checkpoint)
        worker.sampled.connect(self._on_sample)
        worker.logged.connect(self.log)
        worker.oom.connect(self._on_oom)
        worker.train_ended.connect(self._on_train_ended)
        worker.failed.connect(self._on_failed)
        worker.finished.connect(self._on_worker_finished)
        self.worker = worker
        verb = "Resuming" if resume_from else "Starting"
        self._set_state("starting", f"{verb} — loading data and building the model…")
        source = f" from {resume_from}" if resume_from else ""
        self.log(f"{verb.lower()} run in {self.run_dir}{source}")
        settle_heap()
        worker.start()
        self._update_controls()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.request_stop()
            self._set_state("stopping", "Stopping — finishing the step and saving a checkpoint…")
            self._update_controls()

    def save_now(self) -> None:
        if self.worker is not None:
            self.worker.request_save()
            self.log("checkpoint requested: saving after this step")

    def _update_controls(self) -> None:
        idle = not self.running
        self.start_button.setEnabled(idle and self.form.is_valid)
        self.start_button.setToolTip(
            "Start a new run with these settings"
            if self.form.is_valid
            else f"Fix this first: {self.form.error}"
        )
        active = self.running and self.state != "stopping"
        self.stop_button.setEnabled(active)
        self.save_button.setEnabled(active)
        for w in (
            self.resume_button,
            self.resume_latest_button,
            self.form,
            self.preset_combo,
            self.save_preset_button,
            self.out_edit,
        ):
            w.setEnabled(idle)

    # -- events from the training thread -------------------------------------------------

    def _on_preparing(self, phase: str, done: float, total: float) -> None:
        """Data preparation before the first step: a progress bar in MB with its speed."""
        now = time.monotonic()
        if self._prepare_started is None or self._prepare_started[0] != phase:
            self._prepare_started = (phase, now)
        rate = done / 1e6 / max(now - self._prepare_started[1], 1e-3)
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * done / max(total, 1)))
        self.progress.setFormat(
            f"preparing data: {phase} {done / 1e6:,.0f} / {total / 1e6:,.0f} MB "
            f"({rate:,.0f} MB/s) — Stop cancels"
        )

    def _on_train_started(self, info: dict) -> None:
        self._max_steps = info["max_steps"]
        self._start_step = info["start_step"]
        self.progress.setRange(0, max(1, self._max_steps))
        self.progress.setFormat("step %v / %m (%p%)")
        self.progress.setValue(self._start_step)
        # Cleared only now: a run refused at setup leaves the last run's curves on screen.
        if info.get("resumed"):
            self._refill_plots(Path(info["run_dir"]), info["start_step"])
        else:
            self.plots.clear()
        gpu = self.info.gpu_for(info["device"]) if info["device"] != "cpu" else None
        if gpu is not None:
            self.plots.set_device_total(gpu["total_bytes"] / 1024**2)
        if self.state != "stopping":
            self._set_state(
                "running",
                f"Running on {info['device']} ({info['precision']}), "
                f"{info['n_params']:,} parameters, data: {describe_run_data(info)}",
            )

    def _refill_plots(self, run_dir: Path, start_step: int) -> None:
        """Curves continue from the history; records past the checkpoint are not history."""
        train, evals = read_metrics(RunFolder(run_dir).metrics_file)
        train = [r for r in train if r.get("step", 0) <= start_step]
        evals = [r for r in evals if r.get("step", 0) <= start_step]
        self.plots.load_history(train, evals)
        self.plots.redraw()
        self.log(f"plots refilled with {len(train)} steps from {run_dir.name}/metrics.jsonl")

    def _on_batch(self, record: dict) -> None:
        self.plots.add_train(record)  # drawn by the plot timer, not here
        now = time.monotonic()
        if self._first is None:
            self._first = (record["step"], now)
        self._last, self._last_at = record, now

    def _on_eval(self, record: dict) -> None:
        self.plots.add_eval(record)
        self._last_val = record.get("val_loss")

    def _on_checkpoint(self, path: str, step: int) -> None:
        self.log(f"checkpoint saved at step {step}: {path}")

    def _on_sample(self, step: int, text: str) -> None:
        self.sample_view.setPlainText(f"--- step {step} ---\n{text}")

    def _on_oom(self, info: dict) -> None:
        message = (
            f"Out of memory at step {info['step']}: the micro-batch was halved to "
            f"batch_size {info['batch_size']} x grad_accum {info['grad_accum']} "
            "(same effective batch) and training goes on."
        )
        self.notice.setText("⚠ " + message)
        self.notice.setVisible(True)
        self.form.set_values(batch_size=info["batch_size"], grad_accum=info["grad_accum"])
        self.log(message)

    def _on_train_ended(self, result: dict) -> None:
        self.last_result = result

    def _on_failed(self, kind: str, message: str) -> None:
        self.last_result = {"status": "failed", "error": message, "kind": kind}
        self._set_state("failed", f"Failed: {message}")
        text = message
        if kind == "crash" and self.run_dir is not None:
            text += f"\n\nDetails are in {self.run_dir / 'train.log'}."
        self.show_error(FAILURE_TITLES.get(kind, "Training failed"), text)

    def _on_worker_finished(self) -> None:
        worker, self.worker = self.worker, None
        result = dict(self.last_result or worker.result or {"status": "failed"})
        result.setdefault("run_dir", str(self.run_dir))
        self.last_result = result
        worker.deleteLater()
        self.playground.refresh_runs(self.run_dir)
        self._refresh_progress()
        self.plots.redraw()
        status, step = result.get("status"), result.get("step")
        if status == "cancelled":
            self._set_state("stopped", "Data preparation cancelled; nothing was started.")
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self.progress.setFormat("no run yet")
        elif status == "finished":
            self._set_state("finished", f"Finished at step {step}. Run folder: {self.run_dir}")
        elif status == "stopped":
            self._set_state(
                "stopped",
                f"Stopped at step {step}; checkpoint saved. Resume continues it. "
                f"Run folder: {self.run_dir}",
            )
        elif self.state != "failed":
            self._set_state("failed", f"Failed: {result.get('error', 'unknown error')}")
        self._update_controls()
        self.save_settings()
        self.run_ended.emit(result)
        if self._close_when_done:
            self.close()

    # -- progress, status, log -----------------------------------------------------------

    def _reset_progress(self) -> None:
        self._prepare_started = None
        self._max_steps = None
        self._start_step = 0
        self._first: tuple[int, float] | None = None
        self._last: dict | None = None
        self._last_at = 0.0
        self._last_val = None

    def _refresh_progress(self) -> None:
        last = self._last
        if last is None:
            self.timing_label.setText("")
            return
        step = last["step"]
        self.progress.setValue(min(step, self.progress.maximum()))
        elapsed = last.get("elapsed_s")
        eta = None
        if self.running and elapsed is not None:
            elapsed += time.monotonic() - self._last_at
        if self._first is not None and self._max_steps and step > self._first[0]:
            rate = (step - self._first[0]) / max(self._last_at - self._first[1], 1e-6)
            eta = (self._max_steps - step) / rate if self.running else 0.0
        parts = [
            f"loss {last['loss']:.4f}",
            f"val {self._last_val:.4f}" if self._last_val is not None else None,
            f"{last.get('tokens_per_s', 0):,.0f} tok/s",
            f"elapsed {fmt_duration(elapsed)}",
            f"ETA {fmt_duration(eta)}",
        ]
        self.timing_label.setText("    ".join(p for p in parts if p))

    def _set_state(self, state: str, text: str) -> None:
        self.state = state
        color = STATUS_COLORS.get(state, "#444")
        self.status_label.setText(
            f"<span style='color:{color}; font-weight:bold; font-size:13pt'>"
            f"{state.capitalize()}</span>&nbsp;&nbsp;{html.escape(text)}"
        )

    def log(self, message: str) -> None:
        self.log_view.appendPlainText(f"{time.strftime('%H:%M:%S')}  {message}")

    # -- dialogs (tests patch QMessageBox's static functions) ----------------------------

    def show_error(self, title: str, message: str) -> None:
        self.log(f"error: {message}")
        QMessageBox.critical(self, title, message)

    def confirm(self, title: str, message: str) -> bool:
        answer = QMessageBox.question(self, title, message)
        return answer == QMessageBox.StandardButton.Yes

    # -- resume --------------------------------------------------------------------------

    def open_resume_dialog(
        self, spec: str = "", note: str = "", max_steps: int | None = None, preset=None
    ) -> ResumeDialog:
        """Non-blocking: the dialog shows what the checkpoint holds; Resume continues it."""
        if not spec:
            runs = list_runs(self.runs_root)
            spec = str(runs[0].path) if runs else ""
        dialog = ResumeDialog(self.runs_root, self, spec, note)
        dialog.set_max_steps(max_steps)
        dialog.resume_requested.connect(
            lambda ckpt, changes: self.resume_from(ckpt, changes, preset=preset)
        )
        self.resume_dialog = dialog
        dialog.open()
        return dialog

    def resume_latest(self) -> bool:
        """Continue the newest run; a finished one first asks how far to train it."""
        runs = list_runs(self.runs_root)
        if runs and runs[0].read_status().get("state") == "finished":
            self.open_resume_dialog(
                str(runs[0].path), "The latest run has finished. Train it further?"
            )
            return False
        return self.resume_from("latest")

    def offer_interrupted_resume(self) -> bool:
        """At start-up: if the newest run has no clean finish, offer to continue it."""
        run = interrupted_run(self.runs_root)
        if run is None:
            return False
        status = run.read_status()
        state = status.get("state", "unknown")
        note = (
            f"The last run did not finish (state: {state}, step {status.get('step', '?')} of "
            f"{status.get('max_steps', '?')}). Resume it?"
        )
        self.open_resume_dialog(str(run.path), note)
        return True

    # -- command line --------------------------------------------------------------------

    def apply_launch(
        self,
        preset: str | None = None,
        data: str | None = None,
        out: str | None = None,
        max_steps: int | None = None,
    ) -> None:
        """Prefill from `python -m gui` arguments (already checked by __main__)."""
        if preset and not self.select_preset(preset):
            # A YAML file path: load it like the CLI does.
            try:
                self.form.set_config(preset_lib.to_config(preset_lib.load_preset(preset)))
            except UserError as e:
                self.show_error("Preset", str(e))
        changes = {}
        if data:
            changes["data"] = data
        if max_steps:
            changes.update(max_steps=max_steps, max_epochs=None)
        if changes:
            self.form.set_values(**changes)
        if out:
            self.out_edit.setText(out)

    # -- settings ------------------------------------------------------------------------

    def save_settings(self) -> None:
        s = self.settings
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/splitter", self.splitter.saveState())
        s.setValue("window/lower_splitter", self.lower_splitter.saveState())
        s.setValue("preset", self.preset_combo.currentData() or "")
        s.setValue("config", json.dumps(self.form.config().to_dict()))
        s.setValue("plots/smooth", self.plots.smooth.isChecked())
        s.setValue("plots/smooth_window", self.plots.smooth_window.value())
        s.setValue("plots/log", self.plots.log_scale.isChecked())
        s.sync()

    def _restore_settings(self) -> None:
        s = self.settings
        if s.value("window/geometry"):
            self.restoreGeometry(s.value("window/geometry"))
        if s.value("window/splitter"):
            self.splitter.restoreState(s.value("window/splitter"))
        if s.value("window/lower_splitter"):
            self.lower_splitter.restoreState(s.value("window/lower_splitter"))
        self.plots.smooth.setChecked(_as_bool(s.value("plots/smooth", False)))
        self.plots.smooth_window.setValue(int(s.value("plots/smooth_window", 25)))
        self.plots.log_scale.setChecked(_as_bool(s.value("plots/log", False)))
        # The last-used preset, else the recommended one (a saved user preset may be gone).
        names = [s.value("preset"), self.recommended] + [p.name for p in self.presets[:1]]
        next((n for n in names if n and self.select_preset(n)), None)
        saved = self._saved_config()
        if saved is not None:
            self.form.set_config(saved)

    def _saved_config(self) -> TrainConfig | None:
        """The last-used settings, or None if missing or no longer valid for core."""
        text = self.settings.value("config")
        if not text:
            return None
        try:
            return validate(from_dict(json.loads(text), source="saved settings"))
        except (UserError, ValueError, TypeError):
            return None

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        if self.running:
            if self._close_when_done or self.confirm(
                "Training is running",
                "Stop training (a checkpoint is saved first) and close TrainDeck?",
            ):
                self._close_when_done = True
                self.stop()
            event.ignore()
            return
        self.save_settings()
        self.plots.timer.stop()  # a closed window has nothing to draw
        self.progress_timer.stop()
        super().closeEvent(event)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        self.plots.timer.start()
        self.progress_timer.start()
        super().showEvent(event)

    def request_quit(self) -> None:
        """Ctrl+C in the terminal: stop gracefully (checkpoint first), then close."""
        if self.running:
            self._close_when_done = True
            self.stop()
        else:
            self.close()


def _combo() -> QComboBox:
    combo = QComboBox()
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
    return combo


def _as_bool(value) -> bool:
    # QSettings' INI backend hands booleans back as the strings "true"/"false".
    return value is True or str(value).lower() == "true"
