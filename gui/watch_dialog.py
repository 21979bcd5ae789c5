"""Watch from another device: the window starts the web monitor (core.monitor) on its runs
folder and shows the page's link and a QR code of it for a phone's camera.

The monitor is the window's, not the dialog's: closing the dialog leaves it serving (the
button says so), closing the window stops it. Its options are fixed while it serves; Stop
serving, change them, Start serving again (a new link: the old one stops working).
"""

from __future__ import annotations

import io
from pathlib import Path

import segno
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
)

from core.errors import UserError
from core.monitor.reading import RunIndex
from core.monitor.server import DEFAULT_PORT, LOOPBACK, Monitor

LAN_HOST = "0.0.0.0"
QR_PIXELS = 5  # a module's size: a 2 KB URL's code stays under 400 px


def qr_pixmap(text: str) -> QPixmap:
    """The QR code of text as an image (segno: pure Python, ISO 18004)."""
    png = io.BytesIO()
    segno.make(text, error="m").save(png, kind="png", scale=QR_PIXELS, border=4)
    pixmap = QPixmap()
    pixmap.loadFromData(png.getvalue(), "PNG")
    return pixmap


class WatchDialog(QDialog):
    def __init__(self, runs_root: Path, parent=None, port: int = DEFAULT_PORT, log=None):
        super().__init__(parent)
        self.setWindowTitle("Watch from another device")
        self.runs_root = Path(runs_root)
        self.port = port
        self.log = log or (lambda message: None)
        self.monitor: Monitor | None = None

        intro = QLabel(
            "A live page of your runs (plots, progress, samples, the log) for a phone, a "
            f"tablet or another computer. It shows the runs under {self.runs_root}/."
        )
        intro.setWordWrap(True)
        self.lan_box = QCheckBox("On my network (needed for a phone or another computer)")
        self.lan_box.setToolTip(
            "Off: only this computer can open the page. On: every device on your network can "
            "reach it; the page still needs the link's token."
        )
        self.control_box = QCheckBox("Allow Stop from the page (Stop, Save now, Finish)")
        self.control_box.setToolTip("Off: the page only shows. On: it has the run's buttons too.")
        self.start_button = QPushButton("Start serving")
        self.start_button.clicked.connect(self.toggle)
        self.url_edit = QLineEdit()
        self.url_edit.setReadOnly(True)
        self.url_edit.setPlaceholderText("the page's link appears here")
        self.copy_button = QPushButton("Copy link")
        self.copy_button.clicked.connect(self.copy_url)
        self.qr = QLabel()
        self.qr.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.qr.setMinimumSize(200, 200)
        self.reach = QLabel()
        self.reach.setWordWrap(True)
        self.qr_text = ""

        link_row = QHBoxLayout()
        link_row.addWidget(self.url_edit, 1)
        link_row.addWidget(self.copy_button)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.lan_box)
        layout.addWidget(self.control_box)
        layout.addWidget(self.start_button)
        layout.addLayout(link_row)
        layout.addWidget(self.reach)
        layout.addWidget(self.qr, 1)
        self.resize(460, 560)
        self._show_state()

    @property
    def serving(self) -> bool:
        return self.monitor is not None

    def toggle(self) -> None:
        if self.serving:
            self.stop_serving()
        else:
            self.start_serving()

    def start_serving(self) -> bool:
        host = LAN_HOST if self.lan_box.isChecked() else LOOPBACK
        try:
            monitor = Monitor(
                RunIndex(self.runs_root, single=False),
                host=host,
                port=self.port,
                control=self.control_box.isChecked(),
            )
        except (UserError, OSError) as e:
            self.reach.setText(f"⚠ Cannot serve the page: {e}")
            self.reach.setStyleSheet("color: #b00020;")
            return False
        self.monitor = monitor.start()
        reach = "REACHABLE FROM YOUR NETWORK" if monitor.lan else "this computer only"
        mode = ", Stop allowed from the page" if monitor.control else ", read-only"
        self.log(f"watch from another device: serving {monitor.base_url} ({reach}{mode})")
        self._show_state()
        return True

    def stop_serving(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
            self.log("watch from another device: stopped serving")
        self._show_state()

    def copy_url(self) -> None:
        if self.url_edit.text():
            QGuiApplication.clipboard().setText(self.url_edit.text())

    def _show_state(self) -> None:
        m = self.monitor
        self.lan_box.setEnabled(m is None)
        self.control_box.setEnabled(m is None)
        self.start_button.setText("Stop serving" if m else "Start serving")
        self.copy_button.setEnabled(m is not None)
        self.url_edit.setText(m.url if m else "")
        self.url_edit.setCursorPosition(0)  # the address first, the token after
        self.qr_text = m.url if m else ""
        self.qr.setPixmap(qr_pixmap(m.url) if m else QPixmap())
        self.reach.setStyleSheet("color: #b00020;" if m and m.lan else "")
        if m is None:
            self.reach.setText("Not serving.")
        elif m.lan:
            can = "watch and stop" if m.control else "watch"
            self.reach.setText(
                f"⚠ Reachable from your network: anyone on it with this link can {can} your "
                "runs. Scan the code with the phone's camera (same Wi-Fi). "
                + (m.port_note + "." if m.port_note else "")
            )
        else:
            self.reach.setText(
                "Only this computer can open it. For a phone, stop serving and tick "
                "'On my network'. " + (m.port_note + "." if m.port_note else "")
            )
