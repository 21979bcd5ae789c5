"""The Evaluate tab: perplexity of a text and multiple-choice accuracy for a run (and, for a
fine-tune, the model it started from beside it), computed by core.use.evaluate in a thread;
for a chat fine-tune, held-out prompts answered before and after (core.use.report)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QThread, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from core.errors import UserError
from core.use.evaluate import evaluate_files, format_table
from core.use.report import DEFAULT_EXAMPLES, make_report
from gui.playground import fill_run_combo


def evaluate_request(request: dict) -> dict:
    """The tab's evaluations: text and questions (evaluate_files), then the report."""
    request = dict(request)
    n = request.pop("report", None)
    out = {}
    if request["text"] or request["choices"] or not n:
        out = evaluate_files(**request)
    if n:
        out["report"] = make_report(request["target"], n)
    return out


class EvalThread(QThread):
    done = Signal(dict)
    failed = Signal(str)

    def __init__(self, request: dict):
        super().__init__()
        self.request = request

    def run(self) -> None:
        try:
            self.done.emit(evaluate_request(self.request))
        except UserError as e:
            self.failed.emit(str(e))
        except Exception as e:  # the thread must never die silently
            self.failed.emit(f"{type(e).__name__}: {e}")


def _file_row(edit: QLineEdit, pick) -> QWidget:
    row = QWidget()
    layout = QGridLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    button = QPushButton("File…")
    button.clicked.connect(pick)
    layout.addWidget(edit, 0, 0)
    layout.addWidget(button, 0, 1)
    return row


class EvaluateTab(QWidget):
    finished = Signal()  # an evaluation ended, with a result or an error

    def __init__(self, runs_root: Path, parent=None):
        super().__init__(parent)
        self.runs_root = Path(runs_root)
        self.thread: EvalThread | None = None
        self.result: dict | None = None
        self.run_combo = QComboBox()
        self.run_combo.setEditable(True)
        self.run_combo.lineEdit().setPlaceholderText("a run folder, a model folder or hub id")
        self.text = QLineEdit()
        self.text.setPlaceholderText("a text file: perplexity and bits per byte")
        self.choices = QLineEdit()
        self.choices.setPlaceholderText("questions (.jsonl, .csv, .parquet): accuracy")
        self.fewshot = QSpinBox()
        self.fewshot.setRange(0, 25)
        self.fewshot.setToolTip("questions shown with their answers before each other")
        self.compare = QCheckBox("Compare with the model it started from")
        self.report = QCheckBox("Before/after answers")
        self.report.setToolTip(
            "a chat fine-tune: its first held-out prompts answered by the model it started "
            "from and by the fine-tuned one (greedy), side by side; also in RUN/eval/report.md"
        )
        self.report_n = QSpinBox()
        self.report_n.setRange(1, 100)
        self.report_n.setValue(DEFAULT_EXAMPLES)
        self.report_n.setToolTip("how many held-out prompts")
        self.button = QPushButton("Evaluate")
        self.button.setStyleSheet("font-weight: bold;")
        self.button.clicked.connect(self.evaluate)
        self.status = QLabel("Pick a run and a text or questions, then press Evaluate.")
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        grid = QGridLayout()
        rows = [("Run", self._run_row()), ("Text", _file_row(self.text, self._pick_text)),
                ("Questions", _file_row(self.choices, self._pick_choices))]  # fmt: skip
        for i, (label, widget) in enumerate(rows):
            grid.addWidget(QLabel(label), i, 0)
            grid.addWidget(widget, i, 1)
        options = QHBoxLayout()  # one row: the tab stays as short as the Playground
        for widget in (QLabel("Few-shot"), self.fewshot, self.compare):
            options.addWidget(widget)
        options.addStretch(1)
        options.addWidget(self.button)
        grid.addLayout(options, len(rows), 1)
        self.output.setMinimumHeight(60)
        self.report_view = QTextBrowser()  # the before/after report, rendered Markdown
        self.report_view.setMinimumHeight(60)
        self.report_view.hide()
        layout = QVBoxLayout(self)
        layout.addLayout(grid)
        layout.addWidget(self.status)
        layout.addWidget(self.output, 1)
        layout.addWidget(self.report_view, 3)
        self.refresh_runs()

    def _run_row(self) -> QWidget:
        """The run, and the report about the run itself (beside it: the options row is full)."""
        row = QWidget()
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.run_combo, 1)
        layout.addWidget(self.report)
        layout.addWidget(self.report_n)
        return row

    def refresh_runs(self, current: str | Path | None = None) -> None:
        fill_run_combo(self.run_combo, self.runs_root, current)

    def _pick_text(self) -> None:
        path = QFileDialog.getOpenFileName(self, "Text to score")[0]
        if path:
            self.text.setText(path)

    def _pick_choices(self) -> None:
        path = QFileDialog.getOpenFileName(self, "Questions", "", "*.jsonl *.csv *.parquet")[0]
        if path:
            self.choices.setText(path)

    def evaluate(self) -> None:
        request = {
            "target": self.run_combo.currentText().strip(),
            "text": self.text.text().strip() or None,
            "choices": self.choices.text().strip() or None,
            "fewshot": self.fewshot.value(),
            "compare": self.compare.isChecked(),
            "report": self.report_n.value() if self.report.isChecked() else None,
        }
        self.button.setEnabled(False)
        self.status.setText("Evaluating…")
        if self.thread is not None:  # the last one has reported; let it end before it goes
            self.thread.wait()
        self.thread = EvalThread(request)
        self.thread.done.connect(self._done)
        self.thread.failed.connect(self._failed)
        self.thread.start()

    def _done(self, result: dict) -> None:
        self.result = result
        table = format_table(result)
        self.output.setPlainText(table)
        self.output.setVisible(bool(table) or "report" not in result)
        self.report_view.setVisible("report" in result)
        if "report" in result:
            self.report_view.setMarkdown(result["report"]["markdown"])
        self.status.setText("Done. A run's results are also in its eval/ folder.")
        self.button.setEnabled(True)
        self.finished.emit()

    def _failed(self, message: str) -> None:
        self.status.setText("Evaluation failed.")
        self.button.setEnabled(True)
        QMessageBox.critical(self, "Evaluate", message)
        self.finished.emit()
