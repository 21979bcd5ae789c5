"""The data preview under Data: a table's layout and first rows (core.data.describe), each row
beside thumbnails of the images it names; an image that cannot be read shows its one-line
reason in place of its thumbnail."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from core.data.describe import PreviewImage
from gui.thumbnails import thumbnail_label

THUMB = 56  # pixels: small beside the form's text
STYLE = "color: #555; font-family: monospace; font-size: 11px;"


def _text_label(text: str) -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(True)  # never wider than the form
    label.setStyleSheet(STYLE)
    return label


def _image_label(image: PreviewImage) -> QLabel:
    if image.path is not None:
        return thumbnail_label(image.path, THUMB)
    label = QLabel(image.problem)  # a URL or an empty name: nothing to read
    label.setObjectName("thumbnail")
    label.setToolTip(image.problem)
    label.setWordWrap(True)
    label.setMaximumWidth(3 * THUMB)
    label.setStyleSheet("color: #b00020; font-size: 11px;")
    return label


class DataPreview(QWidget):
    """Plain text lines (the first, the file's layout; then one per row) with each row's
    images at its right."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("data_preview")
        self.rows = QVBoxLayout(self)
        self.rows.setContentsMargins(0, 0, 0, 0)
        self.rows.setSpacing(2)
        self._text = ""

    def text(self) -> str:
        return self._text

    def set_preview(self, text: str, row_images: list[list[PreviewImage]] = ()) -> None:
        """Show text (a line each) with row_images[i] beside line i + 2 (the i-th row)."""
        self._text = text
        while self.rows.count():
            widget = self.rows.takeAt(0).widget()
            if widget is not None:
                widget.setParent(None)
                widget.deleteLater()
        lines = text.splitlines()
        for i, line in enumerate(lines):
            pictures = row_images[i - 1] if 0 < i <= len(row_images) else []
            self.rows.addWidget(self._row(line, pictures))
        self.setVisible(bool(text))

    @staticmethod
    def _row(line: str, pictures: list[PreviewImage]) -> QWidget:
        if not pictures:
            return _text_label(line)
        row = QWidget()
        row.setObjectName("preview_row")
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(_text_label(line), 1)
        for image in pictures:
            layout.addWidget(_image_label(image), 0, Qt.AlignmentFlag.AlignTop)
        return row

    def thumbnails(self) -> list[QLabel]:
        """The image labels shown, in order (a thumbnail, or an image's reason)."""
        return self.findChildren(QLabel, "thumbnail")
