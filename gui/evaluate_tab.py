"""The Evaluate tab: lm-evaluation-harness's measures of a text (word and byte perplexity, bits
per byte) and of questions (acc, acc_norm, acc_bytes), lm_eval tasks themselves, for a run
(and, for a fine-tune, the model it started from beside it), computed by core.use.evaluate in
a thread; a run's saved results listed; for a chat fine-tune, held-out prompts answered before
and after (core.use.report)."""

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
from core.use.evaluate import (
    QuestionFormat,
    evaluate_files,
    evaluate_tasks,
    format_table,
    list_results,
    unescape,
)
from core.use.report import DEFAULT_EXAMPLES, make_report
from gui.playground import fill_run_combo


def evaluate_request(request: dict, progress=None) -> dict:
    """The tab's evaluations: text and questions (evaluate_files), lm_eval tasks, then the
    report; progress(n) hears each batch of n requests scored."""
    request = dict(request)
    n = request.pop("report", None)
    tasks = request.pop("tasks", None)
    chat = request.pop("chat", False)
    template = request.pop("template", None)
    out = {}
    if request["text"] or request["choices"] or not (n or tasks):
        fmt = QuestionFormat(template=unescape(template), chat=chat)
        out = evaluate_files(**request, fmt=fmt, progress=progress)
    if tasks:
        ran = evaluate_tasks(
            request["target"],
            tasks,
            request.get("fewshot") or None,
            chat=chat,
            compare=request.get("compare", False),
            progress=progress,
        )
        out["tasks"] = ran["tasks"]
        if "start" in ran:
            out.setdefault("start", {})["tasks"] = ran["start"]["tasks"]
    if n:
        out["report"] = make_report(request["target"], n)
    return out


class EvalThread(QThread):
    done = Signal(dict)
    failed = Signal(str)
    progress = Signal(int)  # requests scored so far

    def __init__(self, request: dict):
        super().__init__()
        self.request = request
        self.scored = 0

    def _count(self, n: int) -> None:
        self.scored += n
        self.progress.emit(self.scored)

    def run(self) -> None:
        try:
            self.done.emit(evaluate_request(self.request, self._count))
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
        self.records: list[dict] = []
        self.run_combo.currentIndexChanged.connect(lambda _: self.refresh_saved())
        self.run_combo.lineEdit().editingFinished.connect(self.refresh_saved)
        self.text = QLineEdit()
        self.text.setPlaceholderText("a text file: perplexity and bits per byte")
        self.choices = QLineEdit()
        self.choices.setPlaceholderText("questions (.jsonl, .csv, .parquet): accuracy")
        self.template = QLineEdit()
        self.template.setPlaceholderText("{{question}}\\nAnswer: (default: context as is)")
        self.template.setToolTip(
            "a question's prompt (lm_eval's doc_to_text): a Jinja template over the file's "
            "columns, or a column name; empty: the context column as is, else "
            "Question: …\\nAnswer:"
        )
        self.tasks = QLineEdit()
        self.tasks.setPlaceholderText("lm_eval tasks: hellaswag,arc_easy or a task YAML")
        self.tasks.setToolTip(
            "lm-evaluation-harness tasks run on this model (names or task "
            "YAML files; needs the eval extra)"
        )
        self.fewshot = QSpinBox()
        self.fewshot.setRange(0, 25)
        self.fewshot.setToolTip(
            "answered examples before each question, drawn as "
            "lm-evaluation-harness draws them (seed 1234)"
        )
        self.chat = QCheckBox("Chat template")
        self.chat.setToolTip(
            "the model's chat template, the examples as turns "
            "(lm_eval's apply_chat_template, fewshot_as_multiturn)"
        )
        self.saved = QComboBox()
        self.saved.setToolTip("this run's saved results (RUN/eval/)")
        self.saved.activated.connect(self._show_saved)
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
        rows = [
            ("Run", self._run_row()),
            ("Text", _file_row(self.text, self._pick_text)),
            ("Questions", _file_row(self.choices, self._pick_choices)),
            ("Prompt", self._pair(self.template, "Tasks", self.tasks)),
        ]
        for i, (label, widget) in enumerate(rows):
            grid.addWidget(QLabel(label), i, 0)
            grid.addWidget(widget, i, 1)
        options = QHBoxLayout()  # one row: the tab stays as short as the Playground
        for widget in (QLabel("Few-shot"), self.fewshot, self.chat, self.compare):
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
        status = QHBoxLayout()  # the saved results beside the status: the tab stays short
        status.addWidget(self.status, 1)
        status.addWidget(QLabel("Saved"))
        status.addWidget(self.saved, 1)
        layout.addLayout(status)
        layout.addWidget(self.output, 1)
        layout.addWidget(self.report_view, 3)
        self.refresh_runs()

    @staticmethod
    def _pair(left: QWidget, label: str, right: QWidget) -> QWidget:
        row = QWidget()
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(left, 1)
        layout.addWidget(QLabel(label))
        layout.addWidget(right, 1)
        return row

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
        self.refresh_saved()

    def refresh_saved(self) -> None:
        """The selected run's saved results, newest first."""
        self.saved.clear()
        path = Path(self.run_combo.currentText().strip() or ".")
        self.records = list_results(path) if (path / "eval").is_dir() else []
        for r in self.records:
            before = ", before/after" if r.get("start") else ""
            self.saved.addItem(f"{r.get('time', '')}  {r.get('kind')}: {r.get('data')}{before}")
        self.saved.setEnabled(bool(self.records))
        if not self.records:
            self.saved.addItem("no saved results for this run")

    def _show_saved(self, index: int) -> None:
        if 0 <= index < len(self.records):
            r = self.records[index]
            part = r["kind"] if r["kind"] in ("text", "choices") else None
            shown = {part: r["result"]} if part else dict(r["result"])
            if r.get("start"):
                shown["start"] = {part: r["start"]} if part else dict(r["start"])
            self.output.setPlainText(format_table(shown))
            self.output.show()

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
            "template": self.template.text() or None,
            "chat": self.chat.isChecked(),
            "tasks": self.tasks.text().strip() or None,
            "report": self.report_n.value() if self.report.isChecked() else None,
        }
        self.button.setEnabled(False)
        self.status.setText("Evaluating…")
        if self.thread is not None:  # the last one has reported; let it end before it goes
            self.thread.wait()
        self.thread = EvalThread(request)
        self.thread.done.connect(self._done)
        self.thread.failed.connect(self._failed)
        self.thread.progress.connect(
            lambda n: self.status.setText(f"Evaluating… {n:,} requests scored")
        )
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
        self.refresh_saved()
        self.button.setEnabled(True)
        self.finished.emit()

    def _failed(self, message: str) -> None:
        self.status.setText("Evaluation failed.")
        self.button.setEnabled(True)
        QMessageBox.critical(self, "Evaluate", message)
        self.finished.emit()
