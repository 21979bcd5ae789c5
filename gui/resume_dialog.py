"""Pick a run folder or checkpoint, see what it holds, and continue it."""

from __future__ import annotations

import html
import time
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from core.config import methods
from core.errors import UserError
from core.runs.folder import checkpoint_summary, resolve_resume
from gui.form import INT_MAX


def _data_text(cfg: dict) -> str:
    """The data source, and the others mixed with it (with their weights)."""
    sources = [cfg.get("data") or "embedded corpus", *(cfg.get("extra_data") or [])]
    weights = cfg.get("data_weights")
    return " + ".join(sources) + (f" (weights {weights})" if weights and len(sources) > 1 else "")


def _lr_text(cfg: dict) -> str:
    """The optimizer and its peak lr as saved; an unset lr was scaled with the width."""
    lr = cfg.get("lr")
    name = cfg.get("optimizer", "adamw")
    return f"{name}, lr {'auto' if lr is None else format(lr, 'g')}"


def _fmt_loss(value) -> str:
    return "—" if value is None else f"{value:.4f}"


def _fmt_int(value) -> str:
    return "?" if value is None else f"{value:,}"


def _best_row(summary: dict) -> tuple[str, str]:
    """The best evaluation so far, as the run's method shows it (core.config.methods: GRPO's
    best.pt is chosen by the held-out reward, higher is better; its older checkpoints saved
    minus it as val_loss); else the validation loss."""
    val = summary.get("val_loss")
    own = methods.get(summary["config"].get("method", methods.DEFAULT)).best
    recorded = [
        m.best
        for m in methods.METHODS.values()
        if m.best is not None and summary.get(m.best.key) is not None
    ]
    best = own or (recorded[0] if recorded else None)  # a recorded one shows in any case
    if best is None:
        return "Best val loss", _fmt_loss(val)
    value = summary.get(best.key)
    if value is None and val is not None and best.negated_val_loss:
        value = -val
    return best.label, _fmt_loss(value)


def summary_html(ckpt: Path, run_dir: Path, summary: dict, state: str | None) -> str:
    """What a checkpoint holds, as a small table."""
    cfg = summary["config"]
    saved = summary.get("saved_at")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(saved)) if saved else "unknown"
    rows = [
        ("Run folder", str(run_dir)),
        ("Checkpoint", str(ckpt)),
        ("Saved", when),
        ("Step", f"{summary['step']:,} of {_fmt_int(summary.get('max_steps'))}"),
        ("Run state", state or "unknown"),
        ("Train loss", _fmt_loss(summary.get("loss"))),
        _best_row(summary),
        ("Preset", cfg.get("preset") or "custom"),
        (
            "Model",
            f"hidden {cfg['hidden_dim']}, {cfg['n_layers']} layers, {cfg['n_heads']} heads, "
            f"context {cfg['seq_len']}",
        ),
        (
            "Batch",
            f"{cfg['batch_size']} x {cfg['grad_accum']} accumulation, {_lr_text(cfg)}, "
            f"{cfg['precision']}",
        ),
        ("Data", _data_text(cfg)),
    ]
    body = "".join(
        f"<tr><td><b>{html.escape(k)}</b>&nbsp;&nbsp;</td><td>{html.escape(str(v))}</td></tr>"
        for k, v in rows
    )
    return f"<table>{body}</table>"


class ResumeDialog(QDialog):
    """Non-modal use: connect `resume_requested` and call open()."""

    resume_requested = Signal(str, dict)  # checkpoint path, config changes

    def __init__(self, runs_root: Path, parent=None, spec: str = "", note: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Resume a run")
        self.runs_root = Path(runs_root)
        self.checkpoint: Path | None = None
        self.summary: dict | None = None
        self.step_override: int | None = None

        self.note = QLabel(note)
        self.note.setWordWrap(True)
        self.note.setVisible(bool(note))
        self.note.setStyleSheet("font-weight: bold;")
        self.path = QLineEdit(spec)
        self.path.setPlaceholderText("run folder, checkpoint file (.pt), or 'latest'")
        self.path.editingFinished.connect(self.load)
        folder = QPushButton("Folder…")
        folder.clicked.connect(self._pick_folder)
        ckpt = QPushButton("Checkpoint…")
        ckpt.clicked.connect(self._pick_checkpoint)
        self.details = QLabel()
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setWordWrap(True)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c62828;")
        self.max_steps = QSpinBox()
        self.max_steps.setRange(1, INT_MAX)
        self.max_steps.setGroupSeparatorShown(True)
        self.max_steps.setToolTip("max_steps for the continued run; raise it to train further")

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.resume_button = self.buttons.addButton(
            "Resume", QDialogButtonBox.ButtonRole.AcceptRole
        )
        self.buttons.accepted.connect(self._resume)
        self.buttons.rejected.connect(self.reject)

        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(folder)
        row.addWidget(ckpt)
        steps = QFormLayout()
        steps.addRow("Train until step", self.max_steps)
        layout = QVBoxLayout(self)
        layout.addWidget(self.note)
        layout.addLayout(row)
        layout.addWidget(self.details)
        layout.addWidget(self.error)
        layout.addLayout(steps)
        layout.addWidget(self.buttons)
        self.resize(640, 380)
        self.load()

    def _pick_folder(self):
        start = self.path.text() or str(self.runs_root)
        path = QFileDialog.getExistingDirectory(self, "Run folder to resume", start)
        if path:
            self.path.setText(path)
            self.load()

    def _pick_checkpoint(self):
        start = self.path.text() or str(self.runs_root)
        path, _ = QFileDialog.getOpenFileName(
            self, "Checkpoint to resume", start, "Checkpoints (*.pt);;All files (*)"
        )
        if path:
            self.path.setText(path)
            self.load()

    def set_max_steps(self, value: int | None) -> None:
        """A --max-steps given on the command line wins over the checkpoint's."""
        self.step_override = value
        if value is not None:
            self.max_steps.setValue(value)

    def load(self) -> bool:
        """Read the checkpoint named in the path box; errors are core's message, inline."""
        spec = self.path.text().strip()
        self.checkpoint = self.summary = None
        self.resume_button.setEnabled(False)
        self.details.clear()
        self.error.clear()
        if not spec:
            self.error.setText("Choose a run folder or a checkpoint file.")
            return False
        try:
            ckpt, run = resolve_resume(spec, self.runs_root)
            summary = checkpoint_summary(ckpt)
        except UserError as e:
            self.error.setText(str(e))
            return False
        self.checkpoint, self.summary = ckpt, summary
        state = run.read_status().get("state")
        self.details.setText(summary_html(ckpt, run.path, summary, state))
        saved_max = summary.get("max_steps") or summary["step"]
        # A finished run only continues if asked for more steps: offer as many again.
        default = saved_max if summary["step"] < saved_max else summary["step"] + saved_max
        self.max_steps.setValue(self.step_override or default)
        self.resume_button.setEnabled(True)
        return True

    def changes(self) -> dict:
        """Config edits for the continued run (only the step limit is offered here)."""
        if self.summary is None:
            return {}
        if self.max_steps.value() == self.summary.get("max_steps"):
            return {}
        return {"max_steps": self.max_steps.value(), "max_epochs": None, "max_time": None}

    def _resume(self):
        if self.checkpoint is None and not self.load():
            return
        self.resume_requested.emit(str(self.checkpoint), self.changes())
        self.accept()
