"""The Playground tab: try prompts on a run's model, and export it, while the window lives.

Generation runs in its own QThread and streams text back through a queued signal, so the
window never waits on it. Its model copy lives on the CPU while a run is training (the run
keeps the GPU and its memory to itself) and on the GPU when the window is idle and one exists.
A vision model also sees images (Image… or files dropped on the tab), as core.generate --image.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, QThread, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from core.data.chat import set_thinking
from core.data.images import conversation_images
from core.errors import UserError
from core.platform.device import inference_device
from core.runs.folder import list_runs
from core.use.generate import (
    check_images,
    generate_ids,
    image_refusal,
    load,
    seeing,
    start_ids,
    stream_text,
)
from gui.export_dialog import ExportDialog
from gui.thumbnails import thumbnail_label

PROMPT_LINES = 3  # the prompt box's height; the output box takes the rest
IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.webp)"  # what core.data.images reads


def text_height(edit: QPlainTextEdit, lines: int) -> int:
    """The height of a text box that shows `lines` lines of its font."""
    margins = 2 * (edit.frameWidth() + edit.document().documentMargin())
    return int(lines * edit.fontMetrics().lineSpacing() + margins)


def fill_run_combo(combo, runs_root: Path, current: str | Path | None = None) -> None:
    """List the runs with checkpoints, newest first; select current (or keep the text)."""
    keep = str(current) if current else combo.currentText()
    combo.clear()
    combo.addItems([str(r.path) for r in list_runs(runs_root)])
    if keep:
        combo.setCurrentText(keep)


# The Playground's thinking choices: (shown, core.data.chat.set_thinking's value or None).
THINKING_CHOICES = (
    ("as trained", None),
    ("on", "on"),
    ("off", "off"),
    ("template's own", "default"),
)


class GenerateThread(QThread):
    """Loads the checkpoint and streams the continuation of a prompt."""

    loaded = Signal(str)  # a line describing the model
    text = Signal(str)
    failed = Signal(str)

    def __init__(
        self,
        target: str,
        which: str,
        device: str,
        prompt: str,
        options: dict,
        chat=False,
        history=(),
        thinking=None,
        images=(),
    ):
        super().__init__()
        self.target, self.which, self.device = target, which, device
        self.prompt, self.options, self.chat = prompt, options, chat
        self.history = list(history)  # chat: the conversation before this prompt
        self.thinking = thinking  # chat: None keeps the run's setting (core.data.chat)
        self.images = [str(p) for p in images]  # files the prompt shows (a vision model)
        self.answer = ""  # the text generated, as shown
        self._stop = threading.Event()

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        try:
            model = load(self.target, self.which, self.device)
            self.loaded.emit(
                f"{model.checkpoint.name}, step {model.step}, {model.model.num_params():,} "
                f"parameters, {model.tokenizer.kind} tokenizer, on {self.device}"
            )
            tok = model.tokenizer
            if self.chat and self.thinking:
                set_thinking(tok, self.thinking)
            shown = self._seeing(model)
            ids, stops, until = start_ids(
                tok, self.prompt, self.chat, history=self.history, seeing=shown
            )
            pixels = shown.pixels if shown else None
            new = generate_ids(
                model.model,
                ids,
                should_stop=self._stop.is_set,
                stop_ids=stops,
                images=pixels,
                **self.options,
            )
            for piece in stream_text(tok, new, hide=stops, until=until):
                self.answer += piece
                self.text.emit(piece)
        except UserError as e:
            self.failed.emit(str(e))
        except Exception as e:  # the thread must never die silently
            self.failed.emit(f"{type(e).__name__}: {e}")

    def _seeing(self, model):
        """The images the model sees, as core.generate's --image: a chat's earlier images
        (in its history) first, then this prompt's; None when there are none."""
        earlier = conversation_images(self.history) if self.chat else []
        every = [*earlier, *self.images]
        if not every:
            return None
        shown = seeing(model, every, check_images(every, "image"), "image")
        return dataclasses.replace(shown, paths=self.images)


class Playground(QWidget):
    """Run and checkpoint pickers, a prompt and its images, sampling controls, Generate /
    Stop, Export."""

    generation_done = Signal()

    def __init__(self, runs_root: Path, training_active=lambda: False, parent=None):
        super().__init__(parent)
        self.runs_root = Path(runs_root)
        self.training_active = training_active
        self.thread: GenerateThread | None = None
        self.images: list[Path] = []  # the files the next prompt shows

        browse = self._make_widgets()
        self._make_chat()
        self._make_images()
        self._lay_out(browse)
        self.setAcceptDrops(True)  # an image file dropped anywhere on the Playground
        for box in (self.prompt, self.output):  # the text boxes would take it as text
            box.viewport().installEventFilter(self)
        self.refresh_runs()

    def _make_widgets(self) -> QPushButton:
        """The run pickers, prompt, sampling knobs, buttons and output; returns Browse."""
        self.run_combo = QComboBox()
        self.run_combo.setEditable(True)
        self.run_combo.setToolTip("A run folder or a checkpoint file")
        self.run_combo.lineEdit().setPlaceholderText(
            "a run folder, a checkpoint file, or a model folder / hub id"
        )
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.which = QComboBox()
        self.which.addItems(["best", "latest"])
        self.which.setToolTip("best.pt (lowest validation loss) or latest.pt")
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip(
            "Write this run's model for transformers, PEFT, llama.cpp or Ollama"
        )
        self.export_button.clicked.connect(self.export_clicked)

        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Prompt (empty: start from a newline)")
        self.prompt.setFixedHeight(text_height(self.prompt, PROMPT_LINES))
        self.temperature = self._float(0.0, 5.0, 0.8, 0.1, "0 = greedy (always the likeliest)")
        self.top_k = self._int(0, 65536, 0, "keep the k likeliest tokens; 0 = off")
        self.top_p = self._float(0.01, 1.0, 1.0, 0.05, "nucleus sampling; 1 = off")
        self.length = self._int(1, 100_000, 200, "tokens to generate")
        self.seed = self._int(0, 2**31 - 1, 0, "same seed, same settings: same text")
        self.generate_button = QPushButton("Generate")
        self.generate_button.setStyleSheet("font-weight: bold;")
        self.generate_button.clicked.connect(self.generate)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop)
        self.status = QLabel("Pick a run and press Generate.")
        self.status.setStyleSheet("color: #555;")
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.output.setMinimumHeight(text_height(self.output, PROMPT_LINES))  # it stretches

        return browse

    def _make_chat(self) -> None:
        self.chat = QCheckBox("Chat")
        self.chat.setToolTip(
            "A conversation: each prompt is your next message in the model's own chat "
            "template (the one it was fine-tuned with), and each answer stops at its end of "
            "turn"
        )
        self.chat.toggled.connect(self.new_chat)
        self.new_chat_button = QPushButton("New chat")
        self.new_chat_button.setToolTip("Forget the conversation so far")
        self.new_chat_button.clicked.connect(self.new_chat)
        self.history: list[dict] = []  # the chat so far: user and assistant messages
        self._chat_epoch = 0  # counts New chat presses: an answer joins only its own chat
        self.run_combo.currentTextChanged.connect(self.new_chat)
        self.thinking = QComboBox()
        for text, value in THINKING_CHOICES:
            self.thinking.addItem(text, value)
        self.thinking.setToolTip(
            "Chat: the template's thinking switch (enable_thinking); as trained: the run's "
            "Thinking setting; template's own: what the template does unasked"
        )

    def _make_images(self) -> None:
        self.image_button = QPushButton("Image…")
        self.image_button.clicked.connect(self._choose_images)
        self.image_strip = QHBoxLayout()  # a thumbnail and its remove button per image
        self.image_strip.setContentsMargins(0, 0, 0, 0)
        self.image_strip.addStretch(1)
        self.image_row = QWidget()
        self.image_row.setLayout(self.image_strip)
        self.image_row.setVisible(False)
        # a chat's images stay in view once sent (the transcript names them [image NAME])
        self.chat_images: list[Path] = []
        self.chat_strip = QHBoxLayout()
        self.chat_strip.setContentsMargins(0, 0, 0, 0)
        self.chat_strip.addWidget(QLabel("In this chat:"), 0, Qt.AlignmentFlag.AlignTop)
        self.chat_strip.addStretch(1)
        self.chat_row = QWidget()
        self.chat_row.setLayout(self.chat_strip)
        self.chat_row.setVisible(False)
        self.run_combo.currentTextChanged.connect(self._update_image_button)

    def _lay_out(self, browse: QPushButton) -> None:
        top = QHBoxLayout()
        top.addWidget(QLabel("Run"))
        top.addWidget(self.run_combo, 1)
        top.addWidget(browse)
        top.addWidget(self.which)
        top.addWidget(self.export_button)
        knobs = QGridLayout()
        for col, (label, w) in enumerate(
            [
                ("Temperature", self.temperature),
                ("Top-k", self.top_k),
                ("Top-p", self.top_p),
                ("Length", self.length),
                ("Seed", self.seed),
            ]
        ):
            knobs.addWidget(QLabel(label), 0, col)
            knobs.addWidget(w, 1, col)
        knobs.addWidget(self.chat, 0, 5)
        knobs.addWidget(self.new_chat_button, 0, 6)
        knobs.addWidget(QLabel("Thinking"), 0, 7)
        knobs.addWidget(self.thinking, 1, 7)
        knobs.addWidget(self.generate_button, 1, 5)
        knobs.addWidget(self.stop_button, 1, 6)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        prompt_row = QHBoxLayout()
        prompt_row.addWidget(self.prompt, 1)
        prompt_row.addWidget(self.image_button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(prompt_row)
        layout.addWidget(self.image_row)
        layout.addLayout(knobs)
        layout.addWidget(self.status)
        layout.addWidget(self.chat_row)
        layout.addWidget(self.output, 1)

    @staticmethod
    def _float(low, high, value, step, tip) -> QDoubleSpinBox:
        w = QDoubleSpinBox()
        w.setRange(low, high)
        w.setSingleStep(step)
        w.setDecimals(2)
        w.setValue(value)
        w.setToolTip(tip)
        return w

    @staticmethod
    def _int(low, high, value, tip) -> QSpinBox:
        w = QSpinBox()
        w.setRange(low, high)
        w.setValue(value)
        w.setToolTip(tip)
        return w

    # -- runs ----------------------------------------------------------------------------

    def refresh_runs(self, current: str | Path | None = None) -> None:
        fill_run_combo(self.run_combo, self.runs_root, current)
        self._update_image_button()

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Run folder", str(self.runs_root))
        if folder:
            self.run_combo.setCurrentText(folder)

    def target(self) -> str:
        return self.run_combo.currentText().strip()

    # -- generation ----------------------------------------------------------------------

    def device(self) -> str:
        return inference_device(busy=self.training_active())

    def generate(self) -> bool:
        if self.thread is not None:
            return False
        if not self.target():
            QMessageBox.warning(self, "Playground", "Choose a run folder or a checkpoint first.")
            return False
        options = {
            "n_new": self.length.value(),
            "temperature": self.temperature.value(),
            "top_k": self.top_k.value() or None,
            "top_p": self.top_p.value() if self.top_p.value() < 1.0 else None,
            "seed": self.seed.value(),
        }
        prompt = self.prompt.toPlainText()
        chat = self.chat.isChecked()
        images = list(self.images)
        shown = "".join(f"[image {p.name}] " for p in images)  # which images it answers
        if chat:  # the transcript grows; the prompt box is ready for the next message
            self._append(("\n\n" if self.history else "") + f"You: {shown}{prompt}\n\nModel: ")
            self.prompt.clear()
            self.clear_images()  # they are in the conversation now
            self._show_chat_images([*self.chat_images, *images])
        else:
            self.output.setPlainText(shown.rstrip() + ("\n" if shown else "") + prompt)
        which = self.which.currentText()
        thread = GenerateThread(
            self.target(),
            which,
            self.device(),
            prompt,
            options,
            chat,
            self.history,
            self.thinking.currentData(),
            images,
        )
        thread.epoch = self._chat_epoch
        thread.loaded.connect(lambda line: self.status.setText(f"Generating with {line}…"))
        thread.text.connect(self._append)
        thread.failed.connect(self._failed)
        thread.finished.connect(self._done)
        self.thread = thread
        self.status.setText("Loading the model…")
        self.generate_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        thread.start()
        return True

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.request_stop()

    def _append(self, text: str) -> None:
        cursor = self.output.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        cursor.insertText(text)
        self.output.setTextCursor(cursor)
        self.output.ensureCursorVisible()  # the newest text in view, as in a chat

    def _failed(self, message: str) -> None:
        self.status.setText(f"Failed: {message}")
        QMessageBox.critical(self, "Playground", message)

    def new_chat(self, *_) -> None:
        """Start the conversation afresh (also when the model or the mode changes)."""
        self.history = []
        self._chat_epoch += 1
        self.output.clear()
        self._show_chat_images([])

    def _done(self) -> None:
        thread, self.thread = self.thread, None
        if thread.chat and thread.epoch == self._chat_epoch:  # not a chat begun afresh since
            content = thread.prompt
            if thread.images:  # the user's turn holds its images, as core.generate --chat
                parts = [{"type": "image", "image": p} for p in thread.images]
                content = [*parts, {"type": "text", "text": thread.prompt}]
            self.history = [
                *self.history,
                {"role": "user", "content": content},
                {"role": "assistant", "content": thread.answer},
            ]
        text = self.status.text()
        if text.startswith("Generating"):
            word = "Stopped" if thread.stop_requested else "Done"
            self.status.setText(word + text.removeprefix("Generating").rstrip("…"))
        thread.deleteLater()
        self.generate_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        self.generation_done.emit()

    # -- images --------------------------------------------------------------------------

    def _update_image_button(self, *_) -> None:
        """The Image… button is off, with the reason as its tooltip, for a text-only model."""
        reason = image_refusal(self.target())
        self.image_button.setEnabled(not reason)
        self.image_button.setToolTip(
            f"Images: {reason}"
            if reason
            else "Show the model an image (PNG, JPEG or WebP) with the prompt; or drop one here"
        )

    def _choose_images(self) -> None:
        files, _ = QFileDialog.getOpenFileNames(self, "Image", "", IMAGE_FILTER)
        if files:
            self.add_images(files)

    def add_images(self, files) -> bool:
        """Attach image files to the next prompt; a dialog with the one-line reason for a
        model without a vision tower or a file that is not a readable image."""
        reason = image_refusal(self.target())
        if reason:
            QMessageBox.warning(self, "Playground", f"Images: {reason}")
            return False
        added = False
        for f in files:
            try:
                check_images([f], "image")
            except UserError as e:
                QMessageBox.critical(self, "Playground", str(e))
                continue
            self.images.append(Path(f))
            added = True
        self._show_images()
        return added

    def remove_image(self, index: int) -> None:
        del self.images[index]
        self._show_images()

    def clear_images(self) -> None:
        self.images = []
        self._show_images()

    def _show_images(self) -> None:
        """The strip: each image's thumbnail with a × that removes it."""
        while self.image_strip.count() > 1:  # all but the closing stretch
            widget = self.image_strip.takeAt(0).widget()
            if widget is not None:
                widget.setParent(None)  # gone from the strip now, deleted later
                widget.deleteLater()
        for i, path in enumerate(self.images):
            self.image_strip.insertWidget(i, self._image_item(i, path))
        self.image_row.setVisible(bool(self.images))

    def _show_chat_images(self, paths: list[Path]) -> None:
        """The strip above the transcript: the images the conversation holds, in order."""
        self.chat_images = paths
        while self.chat_strip.count() > 2:  # all but the label and the closing stretch
            widget = self.chat_strip.takeAt(1).widget()
            if widget is not None:
                widget.setParent(None)
                widget.deleteLater()
        for i, path in enumerate(paths):
            self.chat_strip.insertWidget(i + 1, thumbnail_label(path))
        self.chat_row.setVisible(bool(paths))

    def _image_item(self, index: int, path: Path) -> QWidget:
        item = QWidget()
        item.setObjectName("image_item")
        box = QHBoxLayout(item)
        box.setContentsMargins(0, 0, 6, 0)
        box.setSpacing(2)
        box.addWidget(thumbnail_label(path))
        remove = QToolButton()
        remove.setText("×")
        remove.setObjectName("remove_image")
        remove.setToolTip(f"Remove {path.name}")
        remove.clicked.connect(lambda: self.remove_image(index))
        box.addWidget(remove, 0, Qt.AlignmentFlag.AlignTop)
        return item

    @staticmethod
    def _dropped_files(event) -> list[str]:
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        return [u.toLocalFile() for u in urls if u.isLocalFile()]

    def eventFilter(self, watched, event) -> bool:
        """Files dropped on the prompt or output box come to the Playground as images."""
        kinds = (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop)
        if event.type() in kinds and self._dropped_files(event):
            {
                QEvent.Type.DragEnter: self.dragEnterEvent,
                QEvent.Type.DragMove: self.dragMoveEvent,
                QEvent.Type.Drop: self.dropEvent,
            }[event.type()](event)
            return True
        return super().eventFilter(watched, event)

    def dragEnterEvent(self, event) -> None:
        if self._dropped_files(event):
            event.acceptProposedAction()

    def dragMoveEvent(self, event) -> None:
        if self._dropped_files(event):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        files = self._dropped_files(event)
        if files:
            event.acceptProposedAction()
            self.add_images(files)

    # -- export --------------------------------------------------------------------------

    def export_clicked(self) -> ExportDialog | None:
        """The Export dialog for the chosen run (format, quantization, progress)."""
        if not self.target():
            QMessageBox.warning(self, "Export", "Choose a run folder or a checkpoint first.")
            return None
        self.export_dialog = ExportDialog(self.target(), self.which.currentText(), self)
        self.export_dialog.show()
        return self.export_dialog
