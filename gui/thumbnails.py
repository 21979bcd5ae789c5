"""Image thumbnails for the data preview and the Playground: each file read as training reads
it (core.data.images: Pillow, EXIF orientation, RGB), scaled with its aspect kept, the file
name as its tooltip; an image that cannot be read shows its one-line reason instead."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QLabel

from core.data import images

THUMB = 72  # pixels: the longer side of a thumbnail


def thumbnail_pixmap(path: str | Path, size: int = THUMB) -> QPixmap:
    """The image at path scaled to fit size x size; ImageProblem for one that cannot be read."""
    picture = images.open_rgb(Path(path))
    picture.thumbnail((size, size))
    w, h = picture.size
    data = picture.tobytes()
    return QPixmap.fromImage(QImage(data, w, h, 3 * w, QImage.Format.Format_RGB888).copy())


def thumbnail_label(path: str | Path, size: int = THUMB) -> QLabel:
    """A thumbnail of the image at path, or (unreadable) its one-line reason in red."""
    label = QLabel()
    name = Path(path).name
    try:
        label.setPixmap(thumbnail_pixmap(path, size))
        label.setToolTip(name)
    except images.ImageProblem as e:
        reason = f"{name} {e}"
        label.setText(reason)
        label.setToolTip(f"{path} {e}")
        label.setWordWrap(True)
        label.setMaximumWidth(3 * size)
        label.setStyleSheet("color: #b00020; font-size: 11px;")
    label.setAlignment(Qt.AlignmentFlag.AlignCenter)
    label.setObjectName("thumbnail")
    return label
