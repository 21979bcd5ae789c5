"""The TrainDeck window: settings on the left, live plots and progress on the right.

Layout and wiring only. The run's lifecycle is `RunSession`, its progress arithmetic
`core.runs.progress.Progress`, presets `PresetBox`, persistence `SettingsStore`; training
happens in `TrainThread`, whose events arrive as queued signals and land in buffers that
timers draw.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from core.config import presets as preset_lib
from core.config.spec import TrainConfig, validate
from core.errors import ConfigError, UserError
from core.runs.folder import (
    DEFAULT_RUNS_ROOT,
    interrupted_run,
    list_runs,
    new_run_dir,
    resume_config,
)
from core.training.planner import (
    checkpoint_line,
    fewest_checkpointed,
    fit_micro_batch,
    fit_pretrained,
    walk_ladder,
)
from core.weights.loader import apply_pretrained
from gui.estimate_panel import EstimatePanel, context_hint, judge
from gui.form import ConfigForm
from gui.hardware_panel import HardwareInfo, HardwarePanel, detect
from gui.preset_box import PresetBox
from gui.resume_dialog import ResumeDialog
from gui.run_controls import ControlsBox, OutputBox, out_edit, out_problem
from gui.run_session import RunSession, RunState
from gui.run_view import RunView
from gui.settings_store import SettingsStore
from gui.start_from import StartFromBox
from gui.watch_dialog import WatchDialog
from gui.worker import settle_heap

FAILURE_TITLES = {
    "input": "Cannot train with these settings",
    "training": "Training stopped",
    "crash": "Training failed",
}


class MainWindow(QMainWindow):
    run_ended = Signal(dict)  # the run's result, once its thread has finished

    def __init__(
        self,
        settings: QSettings | None = None,
        runs_root: Path | str | None = None,
        hardware_info: HardwareInfo | None = None,
    ):
        super().__init__()
        self.store = SettingsStore(settings)
        self.runs_root = Path(runs_root) if runs_root else DEFAULT_RUNS_ROOT
        self.info = hardware_info or detect()
        self.session = RunSession(self)
        self.session.failed.connect(self._on_failed)
        self.session.ended.connect(self._on_run_ended)
        self.resume_dialog: ResumeDialog | None = None
        self.watch_dialog: WatchDialog | None = None  # it holds the web monitor while serving
        self._close_when_done = False

        self.setWindowTitle("TrainDeck")
        self._build()
        self.preset_box.reload()
        self.store.restore(self)
        self.start_from.set_source(self.form.config().init_from)
        self._form_changed()
        settle_heap()

    # The run's state lives in the session; these read it.
    @property
    def worker(self):
        return self.session.worker

    @property
    def state(self) -> RunState:
        return self.session.state

    @property
    def running(self) -> bool:
        return self.session.running

    @property
    def run_dir(self) -> Path | None:
        return self.session.run_dir

    @property
    def last_result(self) -> dict | None:
        return self.session.result

    @property
    def recommended(self) -> str | None:
        return self.preset_box.recommended

    @property
    def preset_combo(self):
        return self.preset_box.combo

    @property
    def preset_info(self) -> QLabel:
        return self.preset_box.info_label

    # -- layout --------------------------------------------------------------------------

    def _build(self) -> None:
        self.hardware = HardwarePanel(self.info)
        self.hardware.info_changed.connect(self._hardware_changed)
        self.form = ConfigForm(gpu_count=len(self.info.gpus))
        self.form.changed.connect(self._form_changed)
        self.estimate = EstimatePanel(self.info)
        self.estimate.fit_requested.connect(self.fit_to_gpu)

        self.out_edit = out_edit(self.runs_root)
        settings_column = QWidget()
        column = QVBoxLayout(settings_column)
        column.addWidget(self.hardware)
        self.preset_box = PresetBox(self.info)
        self.preset_box.applied.connect(self._preset_applied)
        self.preset_box.save_requested.connect(self.save_preset_as)
        self.preset_box.problem.connect(self.show_error)
        column.addWidget(self.preset_box)
        self.start_from = StartFromBox()
        self.start_from.changed.connect(self._start_from_changed)
        self.start_from.configured.connect(self._ladder_before_download)
        column.addWidget(self.start_from)
        column.addWidget(self.form)
        self.output_box = OutputBox(self.out_edit, self._choose_out)
        column.addWidget(self.output_box)
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
        left_layout.addWidget(ControlsBox(self))

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.run_view = RunView(self.session, self.runs_root, lambda: self.info)
        self.plots, self.playground = self.run_view.plots, self.run_view.playground
        self.splitter.addWidget(self.run_view)
        self.splitter.setStretchFactor(1, 1)
        self.setCentralWidget(self.splitter)
        self.resize(1500, 950)

    # -- presets -------------------------------------------------------------------------

    def select_preset(self, name: str, apply: bool = True) -> bool:
        return self.preset_box.select(name, apply)

    def _preset_applied(self, cfg: TrainConfig) -> None:
        cfg.data = self.form.data.value()  # the data choice is the user's, not the preset's
        cfg.extra_data, cfg.data_weights = self.form.data.extra(), self.form.data.weights()
        self.form.set_config(cfg)
        if self.start_from.pretrained is not None:  # the preset's batch, the model's shape
            self.form.set_pretrained(self.start_from.pretrained)

    def _start_from_changed(self, pretrained) -> None:
        self.form.set_pretrained(pretrained)
        self.estimate.set_choice("")
        gpu = self.info.gpu_for(self.form.config().device)
        if pretrained is not None and gpu and gpu.get("free_bytes") and self.form.is_valid:
            self._fit_pretrained(self.form.validated(), gpu, quiet=True)  # the recommendation
        self._update_controls()

    def _ladder_before_download(self, pre) -> None:
        """The fit ladder of a hub model from its config.json alone, while its weights
        download: whether and how it fits is known before gigabytes arrive."""
        gpu = self.info.gpu_for(self.form.config().device)
        if not (gpu and gpu.get("free_bytes") and self.form.is_valid):
            return
        try:
            cfg = dataclasses.replace(self.form.validated(), init_from=pre.name)
            cfg = validate(apply_pretrained(cfg, pre))
        except UserError:
            return  # the form's own line says what is wrong
        self._show_ladder(cfg, gpu, "from config.json; the weights are downloading")

    def _show_ladder(self, cfg: TrainConfig, gpu: dict, note: str = ""):
        """Walk the fit ladder for cfg on gpu and show it; (the fitted config or None, why)."""
        rungs = walk_ladder(cfg, gpu["free_bytes"])
        fitted, why = fit_pretrained(cfg, gpu["free_bytes"], rungs)
        self.estimate.set_ladder(gpu["name"], rungs, why, note)
        return fitted, why

    def save_preset_as(self, name: str, description: str = "") -> Path | None:
        """Write the form as a user preset and select it."""
        try:
            cfg = self.form.validated()
            path = preset_lib.save_user_preset(name, cfg, description)
        except UserError as e:
            self.show_error("Cannot save preset", str(e))
            return None
        data = self.form.data.value()
        self.preset_box.reload()
        self.select_preset(name, apply=False)
        cfg = dataclasses.replace(cfg, preset=name, data=data)
        self.form.set_config(cfg)
        self.log(f"saved preset {name!r} to {path}")
        return path

    # -- form, estimate, hardware --------------------------------------------------------

    def _form_changed(self) -> None:
        cfg = self.form.validated() if self.form.is_valid else None
        self.estimate.update_for(cfg)
        self.form.set_context_hint(*(context_hint(cfg, self.info) if cfg else ("", False)))
        self._update_controls()

    def _hardware_changed(self, info: HardwareInfo) -> None:
        self.info = info
        self.preset_box.info = info
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
        if cfg.init_from:
            return self._fit_pretrained(cfg, gpu)
        fitted = fit_micro_batch(cfg, gpu["free_bytes"])
        if fitted is None:
            self.show_error(
                "Fit to my GPU",
                f"Even a micro-batch of 1 does not fit the {gpu['free_bytes'] / 1024**3:.1f} GiB "
                "free on this GPU: lower hidden_dim, n_layers or seq_len, or turn on gradient "
                "checkpointing.",
            )
            return False
        fitted = fewest_checkpointed(fitted, gpu["free_bytes"])  # under checkpointing
        self.form.set_values(
            batch_size=fitted.batch_size,
            grad_accum=fitted.grad_accum,
            checkpoint_blocks=fitted.checkpoint_blocks,
        )
        ckpt = checkpoint_line(fitted)
        self.log(
            f"fit to {gpu['name']}: batch_size {fitted.batch_size} x grad_accum "
            f"{fitted.grad_accum} (effective batch {fitted.batch_size * fitted.grad_accum})"
            + (f", {ckpt}" if ckpt else "")
        )
        return True

    def _fit_pretrained(self, cfg: TrainConfig, gpu: dict, quiet: bool = False) -> bool:
        """The fit ladder's first rung that fits (full AdamW, full 8-bit AdamW, LoRA, QLoRA,
        each then with activation checkpointing); every rung is shown with its need."""
        fitted, why = self._show_ladder(cfg, gpu)
        if fitted is None:
            if not quiet:
                self.show_error("Fit to my GPU", why)
            return False
        self.form.set_values(
            lora_rank=fitted.lora_rank,
            lora_alpha=fitted.lora_alpha,
            grad_checkpointing=fitted.grad_checkpointing,
            checkpoint_blocks=fitted.checkpoint_blocks,
            offload_checkpoints=fitted.offload_checkpoints,
            optimizer=fitted.optimizer,
            base_bits=fitted.base_bits,
            batch_size=fitted.batch_size,
            grad_accum=fitted.grad_accum,
        )
        self.log(f"fit to {gpu['name']}: {why}")
        return True

    def _choose_out(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Run folder", str(self.runs_root))
        if path:
            self.out_edit.setText(path)

    # -- starting and controlling a run --------------------------------------------------

    def start(self) -> bool:
        """Start a new run from the form; returns False when nothing was started."""
        if self.running:
            return False
        try:
            cfg = self.form.validated()
        except ConfigError as e:
            self.show_error("Invalid settings", str(e))
            return False
        problem = out_problem(self.out_edit.text())
        if problem:  # refused before any work, the user's folder untouched
            self.show_error("Run folder", f"The run folder cannot be used: {problem}")
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
        self.start_from.set_source(cfg.init_from)
        if cfg.preset:
            self.select_preset(cfg.preset, apply=False)
        self._launch(cfg, run.path, ckpt)
        return True

    def _launch(self, cfg: TrainConfig, run_dir: Path, resume_from: Path | None) -> None:
        self.save_settings()
        worker = self.session.launch(cfg, run_dir, resume_from)
        self.run_view.attach(worker)
        worker.oom.connect(self._on_oom)
        self.setWindowTitle(f"TrainDeck — {self.run_dir.name}")
        verb = "Resuming" if resume_from else "Starting"
        self.run_view.show_status(f"{verb} — loading data and building the model…")
        source = f" from {resume_from}" if resume_from else ""
        self.log(f"{verb.lower()} run in {self.run_dir}{source}")
        self.session.begin()
        self._update_controls()

    def stop(self) -> None:
        if self.session.stop():
            self.run_view.show_status("Stopping — finishing the step and saving a checkpoint…")
            self._update_controls()

    def finish(self) -> None:
        if self.session.finish():
            self.run_view.show_status("Finishing — cooling the learning rate down, then saving…")
            self.log("finish requested: a learning-rate cooldown, then a checkpoint and the end")
            self._update_controls()

    def save_now(self) -> None:
        if self.session.save_now():
            self.log("checkpoint requested: saving after this step")

    def _update_controls(self) -> None:
        idle = not self.running
        problem = self.form.error
        if self.start_from.pretrained_button.isChecked() and self.start_from.pretrained is None:
            problem = self.start_from.error or "name a pretrained model folder or hub id"
        self.start_button.setEnabled(idle and problem is None)
        tip = "Start a new run with these settings"
        self.start_button.setToolTip(tip if problem is None else f"Fix this first: {problem}")
        active = self.running and self.state != "stopping"
        for button in (self.stop_button, self.finish_button, self.save_button):
            button.setEnabled(active)
        for w in (
            self.resume_button,
            self.resume_latest_button,
            self.form,
            self.preset_box,
            self.start_from,
            self.out_edit,
        ):
            w.setEnabled(idle)

    # -- events from the training thread -------------------------------------------------

    def _on_oom(self, info: dict) -> None:
        """The trainer halved the micro-batch: the form shows what now runs."""
        self.form.set_values(batch_size=info["batch_size"], grad_accum=info["grad_accum"])

    def _on_failed(self, kind: str, message: str) -> None:
        self.run_view.show_status(f"Failed: {message}")
        text = message
        if kind == "crash" and self.run_dir is not None:
            text += f"\n\nDetails are in {self.run_dir / 'train.log'}."
        self.show_error(FAILURE_TITLES.get(kind, "Training failed"), text)

    def _on_run_ended(self, result: dict) -> None:
        self.playground.refresh_runs(self.run_dir)
        self.run_view.refresh_progress()
        self.plots.redraw()
        status, step = result.get("status"), result.get("step")
        if status == "cancelled":
            self.run_view.show_status("Data preparation cancelled; nothing was started.")
            self.run_view.progress.setRange(0, 1)
            self.run_view.progress.setValue(0)
            self.run_view.progress.setFormat("no run yet")
        elif status == "finished":
            self.run_view.show_status(f"Finished at step {step}. Run folder: {self.run_dir}")
        elif status == "stopped":
            self.run_view.show_status(
                f"Stopped at step {step}; checkpoint saved. Resume continues it. "
                f"Run folder: {self.run_dir}"
            )
        elif "kind" not in result:  # a failure not already shown by _on_failed
            self.run_view.show_status(f"Failed: {result.get('error', 'unknown error')}")
        self._update_controls()
        self.save_settings()
        self.run_ended.emit(result)
        if self._close_when_done:
            self.close()

    # -- dialogs (tests patch QMessageBox's static functions) ----------------------------

    def log(self, message: str) -> None:
        self.run_view.log(message)

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

    # -- watch from another device (core.monitor) -----------------------------------------

    def open_watch_dialog(self) -> WatchDialog:
        """Non-blocking; the monitor it starts serves until stopped or the window closes."""
        if self.watch_dialog is None:
            self.watch_dialog = WatchDialog(self.runs_root, self, log=self.log)
        self.watch_dialog.show()
        self.watch_dialog.raise_()
        return self.watch_dialog

    # -- command line --------------------------------------------------------------------

    def apply_launch(
        self,
        preset: str | None = None,
        data: str | None = None,
        out: str | None = None,
        max_steps: int | None = None,
        init_from: str | None = None,
    ) -> None:
        """Prefill from `python -m gui` arguments (already checked by __main__)."""
        if preset and not self.select_preset(preset):
            # A YAML file path: load it like the CLI does.
            try:
                loaded = preset_lib.load_preset(preset)
                cfg = preset_lib.to_config(loaded)
            except UserError as e:
                self.show_error("Preset", str(e))
            else:
                self.preset_box.add_file(loaded)
                self.form.set_config(cfg)
        changes = {}
        if data:
            changes["data"] = data
        if max_steps:
            changes.update(max_steps=max_steps, max_epochs=None, max_time=None)
        if changes:
            self.form.set_values(**changes)
        if out:
            self.out_edit.setText(out)
        if init_from:
            self.start_from.set_source(init_from)

    # -- settings ------------------------------------------------------------------------

    def save_settings(self) -> None:
        self.store.save(self)

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
        self.run_view.set_timers(False)
        if self.run_view.evaluate.thread is not None:  # a QThread must end before it goes
            self.run_view.evaluate.thread.wait()
        self.start_from.cancel_download()  # the files it finished stay in the cache
        if self.watch_dialog is not None:
            self.watch_dialog.stop_serving()
        super().closeEvent(event)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        self.run_view.set_timers(True)
        super().showEvent(event)

    def request_quit(self) -> None:
        """Ctrl+C in the terminal: stop gracefully (checkpoint first), then close."""
        if self.running:
            self._close_when_done = True
            self.stop()
        else:
            self.close()
