"""The run's buttons (Start, Stop, Finish, Resume, Save now) and the run-folder field: built
here, wired to the window's slots, kept as the window's attributes (tests and the window's
state logic use them by name)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
)

from core.errors import ConfigError
from core.runs.folder import check_out

FINISH_TIP = (
    "Cool the learning rate down over a short cooldown, save, and stop: a run ended early "
    "still ends at a low learning rate"
)


def out_edit(runs_root: Path) -> QLineEdit:
    edit = QLineEdit()
    edit.setPlaceholderText(f"new folder under {runs_root}/")
    edit.setToolTip(
        "Where the run's checkpoints, metrics and logs go; empty picks "
        f"{runs_root}/<preset>-<date>-<time>. Used once: the next Start picks a new one."
    )
    edit.setClearButtonEnabled(True)
    return edit


def out_problem(text: str) -> str:
    """Why a chosen run folder will be refused (core.runs.folder.check_out: a folder holding
    what is not ours, a run, a file, a link, a place we cannot write), in the window's words;
    "" when it is fine or empty (a new folder is picked)."""
    if not text.strip():
        return ""
    try:
        check_out(Path(text.strip()).expanduser())
    except ConfigError as e:
        return str(e).replace("--out: ", "", 1).replace("with --resume", "with Resume…")
    return ""


class OutputBox(QGroupBox):
    """The run-folder field, with a warning under it while the folder will be refused."""

    def __init__(self, edit: QLineEdit, choose_folder):
        super().__init__("Run folder")
        choose = QPushButton("Choose…")
        choose.clicked.connect(choose_folder)
        self.warning = QLabel()
        self.warning.setWordWrap(True)
        self.warning.setStyleSheet("color: #b00020;")
        self.warning.hide()
        row = QHBoxLayout()
        row.addWidget(edit, 1)
        row.addWidget(choose)
        column = QVBoxLayout(self)
        column.addLayout(row)
        column.addWidget(self.warning)
        edit.textChanged.connect(self._check)

    def _check(self, text: str) -> None:
        problem = out_problem(text)
        self.warning.setText(f"⚠ {problem}" if problem else "")
        self.warning.setVisible(bool(problem))


def _button(text: str, slot, tip: str = "") -> QPushButton:
    button = QPushButton(text)
    button.clicked.connect(slot)
    if tip:
        button.setToolTip(tip)
    return button


class ControlsBox(QGroupBox):
    """Sets window.start_button, stop_button, finish_button, save_button, resume_button,
    resume_latest_button and watch_button."""

    def __init__(self, window):
        super().__init__("Training")
        w = window
        w.start_button = _button("Start", w.start)
        w.start_button.setStyleSheet("font-weight: bold;")
        w.stop_button = _button(
            "Stop", w.stop, "Finish the current step, save a checkpoint, then stop"
        )
        w.finish_button = _button("Finish", w.finish, FINISH_TIP)
        w.save_button = _button("Save checkpoint now", w.save_now)
        w.resume_button = _button(
            "Resume…",
            lambda: w.open_resume_dialog(),
            "Continue a run from its folder or a checkpoint file",
        )
        w.resume_latest_button = _button(
            "Resume latest", w.resume_latest, f"Continue the newest run under {w.runs_root}/"
        )
        w.watch_button = _button(
            "Watch from another device…",
            w.open_watch_dialog,
            "A live page of your runs for a phone or another computer: its link and QR code",
        )
        grid = QGridLayout(self)
        rows = [
            (w.start_button, w.stop_button, w.finish_button),
            (w.resume_button, w.resume_latest_button, w.save_button),
        ]
        for r, row in enumerate(rows):
            for c, button in enumerate(row):
                grid.addWidget(button, r, c)
        grid.addWidget(w.watch_button, len(rows), 0, 1, 3)
