"""Start from: a new model (the preset's shape) or a pretrained one (a Hugging Face model
folder or hub id), with a line saying what the model is."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
)

from core.errors import UserError
from core.use import start_model
from core.weights import download, families
from core.weights.loader import Pretrained, info_line, is_hub_id, open_pretrained
from gui.hub_download import HubDownload


class StartFromBox(QGroupBox):
    """`changed` carries the Pretrained model, or None for a new model."""

    changed = Signal(object)
    # A hub model's config.json while its weights download: enough for the fit ladder.
    configured = Signal(object)

    def __init__(self, parent=None):
        super().__init__("Start from", parent)
        self.pretrained: Pretrained | None = None
        self.error: str | None = None
        self.download: HubDownload | None = None  # a hub model being fetched
        self.fetched: set[str] = set()  # hub ids downloaded in this window
        self.new_button = QRadioButton("A new model (preset)")
        self.pretrained_button = QRadioButton("A pretrained model")
        group = QButtonGroup(self)
        for button in (self.new_button, self.pretrained_button):
            group.addButton(button)
        self.new_button.setChecked(True)
        self.source = QLineEdit()
        self.source.setPlaceholderText(
            "model folder, Hugging Face id such as HuggingFaceTB/SmolLM2-135M, or a finished run"
        )
        self.source.setToolTip(
            "A Hugging Face model folder (config.json, model.safetensors, tokenizer.json) or a "
            "hub id, downloaded once into the Hugging Face cache. Families: "
            f"{families.display_list()}; no code from the model is ever run."
        )
        self.choose = QPushButton("Folder…")
        self.choose.clicked.connect(self._choose)
        self.info = QLabel()
        self.info.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.pretrained_button)
        row.addWidget(self.source, 1)
        row.addWidget(self.choose)
        layout = QVBoxLayout(self)
        layout.addWidget(self.new_button)
        layout.addLayout(row)
        layout.addWidget(self.info)
        self.new_button.toggled.connect(self._mode_changed)
        self.source.editingFinished.connect(self.reload)
        self._mode_changed()

    def _choose(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Pretrained model folder")
        if path:
            self.set_source(path)

    def _mode_changed(self, *_) -> None:
        pretrained = self.pretrained_button.isChecked()
        self.source.setEnabled(pretrained)
        self.choose.setEnabled(pretrained)
        self.reload()

    def set_source(self, text: str | None) -> None:
        """Select a pretrained start from a folder or hub id (None or empty: a new model)."""
        self.source.setText(text or "")
        (self.pretrained_button if text else self.new_button).setChecked(True)
        self.reload()

    def reload(self) -> None:
        """Read the model the box names (config and tokenizer; weights load at Start)."""
        text = self.source.text().strip()
        if not self.pretrained_button.isChecked() or not text:
            found, self.error = None, None
            message = "" if self.new_button.isChecked() else "Name a model folder or hub id."
        elif self._needs_download(text):
            self._start_download(text)
            return
        else:
            try:
                found, self.error, message = self._open(text), None, ""
                if found.name != text:  # a finished run, written as a model folder
                    message = f"the finished run {text}, as the model folder {found.name}: "
                message += info_line(found.info())
            except UserError as e:
                found, self.error = None, str(e)
                message = "⚠ " + self.error
        self.info.setText(message)
        self.info.setStyleSheet("color: #c62828;" if self.error else "color: #555;")
        self.info.setVisible(bool(message))
        self.pretrained = found
        self.changed.emit(found)

    @staticmethod
    def _open(text: str) -> Pretrained:
        """A model folder or hub id; a finished run (SFT, then DPO) through its best
        checkpoint written once as a model folder (core.use.start_model)."""
        if start_model.is_run(text):
            return open_pretrained(start_model.start_folder(text, log=lambda line: None))
        return open_pretrained(text)

    # -- a hub id not in the cache: fetched off the GUI thread ------------------------------

    def _needs_download(self, text: str) -> bool:
        if self.download is not None and self.download.thread.repo_id == text:
            return True  # already under way
        return is_hub_id(text) and text not in self.fetched and download.cached(text) is None

    def _start_download(self, text: str) -> None:
        if self.download is not None and self.download.thread.repo_id == text:
            return
        self.error = f"{text} is downloading"
        self.info.setText(f"Downloading {text} into the Hugging Face cache…")
        self.info.setStyleSheet("color: #555;")
        self.info.setVisible(True)
        self.pretrained = None  # Start waits for the model
        self.changed.emit(None)
        self.download = HubDownload(text, self)
        self.download.thread.done.connect(lambda _folder: self._downloaded(text))
        self.download.thread.failed.connect(self._download_failed)
        self.download.thread.configured.connect(self.configured.emit)
        self.download.thread.described.connect(
            lambda what: self.info.setText(
                f"Downloading {text} ({what}) into the Hugging Face cache…"
            )
        )
        self.download.start()

    def _downloaded(self, text: str) -> None:
        self.fetched.add(text)
        self._download_over()
        self.reload()

    def _download_failed(self, message: str) -> None:
        self._download_over()
        self.error = message
        self.info.setText("⚠ " + message)
        self.info.setStyleSheet("color: #c62828;")
        self.pretrained = None
        self.changed.emit(None)

    def cancel_download(self) -> None:
        """Stop a download under way (between chunks) and wait for its thread."""
        if self.download is not None:
            self.download.cancel()
            self.download.thread.wait()
            self.download = None

    def _download_over(self) -> None:
        if self.download is not None:
            self.download.thread.wait()
            self.download.dialog.close()
        self.download = None
