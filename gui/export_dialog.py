"""The Export dialog: a run's model to transformers, PEFT, GGUF (llama.cpp, LM Studio) or an
Ollama folder, with the GGUF type and its predicted size, a progress bar while the export runs
in its own thread, and "Show in folder" at the end."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QThread, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from core.errors import UserError
from core.use.export import FORMATS, QUANTIZED, export
from core.use.gguf_quality import model_shape, predicted_bytes
from core.use.gguf_quants import EXPERT_TYPE, QUANTS

FORMAT_HELP = {
    "hf": "transformers (safetensors, config, tokenizer)",
    "peft": "a LoRA run's adapter for PEFT",
    "gguf": "llama.cpp, LM Studio",
    "ollama": "GGUF + Modelfile for ollama create",
    "safetensors": "TrainDeck's own weights",
    "gguf-lora": "a LoRA run's adapter for llama.cpp --lora, Ollama ADAPTER",
}


class ExportThread(QThread):
    progress = Signal(int, int)
    line = Signal(str)
    done = Signal(str)
    failed = Signal(str)

    def __init__(self, request: dict):
        super().__init__()
        self.request = request

    def run(self) -> None:
        try:
            path = export(**self.request, log=self.line.emit, progress=self.progress.emit)
            self.done.emit(str(path))
        except UserError as e:
            self.failed.emit(str(e))
        except Exception as e:  # the thread must never die silently
            self.failed.emit(f"{type(e).__name__}: {e}")


class ExportDialog(QDialog):
    thread_done = Signal()  # the export ended, written or failed

    def __init__(self, target: str, which: str = "best", parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Export")
        self.target, self.which = target, which
        self.thread: ExportThread | None = None
        self.path: Path | None = None
        try:
            self.shape = model_shape(target, which)
        except (UserError, OSError, KeyError):
            self.shape = None  # no size prediction; the export itself names the problem
        self._build()
        self._format_changed()

    def _build(self) -> None:
        self.format = QComboBox()
        for fmt in FORMATS:
            self.format.addItem(f"{fmt}: {FORMAT_HELP[fmt]}", fmt)
        self.format.setCurrentIndex(FORMATS.index("gguf"))
        self.format.currentIndexChanged.connect(self._format_changed)
        self.quant = QComboBox()
        moe = self.shape is None or bool(self.shape.moe)  # mxfp4 holds experts only
        self.quant.addItems([q for q in QUANTS if moe or q not in EXPERT_TYPE])
        self.quant.setCurrentText("q4_k_m")
        self.quant.currentTextChanged.connect(self._show_size)
        self.size = QLabel()
        self.system = QLineEdit()
        self.system.setPlaceholderText("optional: the Modelfile's SYSTEM prompt")
        self.out = QLineEdit(str(Path(self.target).with_name(Path(self.target).name + "-export")))
        choose = QPushButton("Choose…")
        choose.clicked.connect(self._choose)
        out_row = QHBoxLayout()
        out_row.addWidget(self.out, 1)
        out_row.addWidget(choose)
        form = QFormLayout()
        form.addRow("Format", self.format)
        form.addRow("Quantization", self.quant)
        form.addRow("", self.size)
        form.addRow("System prompt", self.system)
        form.addRow("New folder", out_row)
        self.bar = QProgressBar()
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumHeight(110)
        self.buttons = QDialogButtonBox()
        role = QDialogButtonBox.ButtonRole
        self.export_button = self.buttons.addButton("Export", role.ApplyRole)
        self.show_button = self.buttons.addButton("Show in folder", role.ActionRole)
        self.show_button.setEnabled(False)
        self.buttons.addButton(QDialogButtonBox.StandardButton.Close)
        self.export_button.clicked.connect(self.start)
        self.show_button.clicked.connect(self.show_in_folder)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.bar)
        layout.addWidget(self.log)
        layout.addWidget(self.buttons)
        self.resize(560, self.sizeHint().height())

    def chosen_format(self) -> str:
        return self.format.currentData()

    def _format_changed(self) -> None:
        quantized = self.chosen_format() in QUANTIZED
        self.quant.setEnabled(quantized)
        self.system.setEnabled(self.chosen_format() == "ollama")
        self._show_size()

    def _show_size(self) -> None:
        if self.shape is None or self.chosen_format() not in QUANTIZED:
            self.size.setText("")
            return
        mb = predicted_bytes(self.shape, self.quant.currentText()) / 1e6
        self.size.setText(f"about {mb:,.1f} MB")

    def _choose(self) -> None:
        folder = QFileDialog.getSaveFileName(self, "Export to a new folder", self.out.text())[0]
        if folder:
            self.out.setText(folder)

    def start(self) -> None:
        fmt = self.chosen_format()
        request = {
            "target": self.target,
            "fmt": fmt,
            "out": self.out.text().strip(),
            "which": self.which,
        }
        if fmt in QUANTIZED:
            request["quant"] = self.quant.currentText()
        if fmt == "ollama" and self.system.text().strip():
            request["system"] = self.system.text().strip()
        self.export_button.setEnabled(False)
        self.bar.setRange(0, 0)  # busy until the first tensor is written
        if self.thread is not None:  # the last one has reported; let it end before it goes
            self.thread.wait()
        self.thread = ExportThread(request)
        self.thread.progress.connect(self._progress)
        self.thread.line.connect(self.log.appendPlainText)
        self.thread.done.connect(self._done)
        self.thread.failed.connect(self._failed)
        self.thread.start()

    def _progress(self, done: int, total: int) -> None:
        self.bar.setRange(0, total)
        self.bar.setValue(done)

    def _done(self, path: str) -> None:
        self.path = Path(path)
        self.bar.setRange(0, 1)
        self.bar.setValue(1)
        self.log.appendPlainText(f"Exported to {path}")
        if self.chosen_format() == "ollama":
            self.log.appendPlainText(f"Import it: ollama create NAME -f {self.path / 'Modelfile'}")
        self.show_button.setEnabled(True)
        self.export_button.setEnabled(True)
        self.thread_done.emit()

    def _failed(self, message: str) -> None:
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        self.log.appendPlainText(f"Export failed: {message}")
        self.export_button.setEnabled(True)
        QMessageBox.critical(self, "Export", message)
        self.thread_done.emit()

    def show_in_folder(self) -> None:
        if self.path is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.path)))

    def wait(self) -> None:
        """Tests and closing: let a running export finish."""
        if self.thread is not None:
            self.thread.wait()
