"""What this machine has: GPUs (or the CPU), and a "Check GPU" diagnostic."""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
)

from core.platform import hardware
from core.platform.device import gpu_index
from core.training.planner import recommend_preset, recommendation_line

GiB = 1024**3


@dataclass
class HardwareInfo:
    gpus: list[dict] = field(default_factory=list)
    cpu: dict = field(default_factory=dict)

    def gpu_for(self, device: str) -> dict | None:
        """The GPU a config's device setting trains on; None means the CPU."""
        index = gpu_index(device, len(self.gpus))
        if index is None:
            return None
        return next((g for g in self.gpus if g["index"] == index), None)


def detect() -> HardwareInfo:
    # Looked up on the module so tests can substitute core.platform.hardware.gpus.
    return HardwareInfo(gpus=hardware.gpus(), cpu=hardware.cpu_info())


def gpu_line(g: dict) -> str:
    free = f"{g['free_bytes'] / GiB:.1f} GiB free" if g.get("free_bytes") is not None else "free ?"
    line = (
        f"<b>GPU {g['index']}: {g['name']}</b><br>"
        f"{g['total_bytes'] / GiB:.1f} GiB total, {free}<br>"
        f"compute capability {g['capability']}, bf16 {'yes' if g['bf16'] else 'no'}, "
        f"driver {g.get('driver') or 'unknown'}"
    )
    if g.get("build_problem"):  # training on it would fail at the first kernel
        line += f"<br><span style='color:#c0392b'><b>{html.escape(g['build_problem'])}</b></span>"
    return line


def recommended_line(g: dict) -> str:
    """The preset the window preselects for this card, and why (the largest VRAM tier at or
    below its free memory)."""
    preset = recommend_preset(g["total_bytes"], g.get("free_bytes"))
    text = html.escape(recommendation_line(preset, g.get("free_bytes")))
    return f"<i>{text[0].upper()}{text[1:]}</i>"


def split_line(gpus: list[dict]) -> str:
    """Several cards: how one model can use them all (docs/multi-gpu.md)."""
    free = sum(g.get("free_bytes") or 0 for g in gpus)
    return (
        f"<i>{len(gpus)} GPUs, {free / GiB:.1f} GiB free together: a model too large for one "
        f"can have its layers split across them (Execution: Split layers across {len(gpus)} "
        f"GPUs), or on Linux be sharded over them (Shard across {len(gpus)} GPUs)</i>"
    )


def cpu_line(cpu: dict) -> str:
    return (
        "<b>no CUDA GPU — training on CPU</b><br>"
        f"{cpu.get('name') or 'CPU'}: {cpu['cores']} cores, "
        f"{cpu['ram_bytes'] / GiB:.1f} GiB RAM ({cpu['ram_free_bytes'] / GiB:.1f} GiB free)"
    )


class ReportDialog(QDialog):
    """Monospaced text in a window that does not block the app."""

    def __init__(self, title: str, text: str, parent=None):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.text = QPlainTextEdit(text)
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addWidget(buttons)
        self.resize(760, 320)


class _ReportRunner(QObject):
    done = Signal(str, object)  # report text, fresh HardwareInfo


class HardwarePanel(QGroupBox):
    """Shows the detected hardware; "Check GPU" runs core's diagnostic off the GUI thread."""

    info_changed = Signal(object)  # HardwareInfo, re-read after a check (free VRAM moves)

    def __init__(self, info: HardwareInfo, parent=None):
        super().__init__("Hardware", parent)
        self.info = info
        self.dialog: ReportDialog | None = None
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.check_button = QPushButton("Check GPU")
        self.check_button.setToolTip(
            "Run the GPU diagnostic: torch and CUDA build, driver, a short matmul speed test"
        )
        self.check_button.clicked.connect(self.run_check)
        self._runner = _ReportRunner()
        self._runner.done.connect(self._show_report)

        row = QHBoxLayout(self)
        row.addWidget(self.label, 1)
        row.addWidget(self.check_button)
        self.show_info(info)

    def show_info(self, info: HardwareInfo) -> None:
        self.info = info
        if info.gpus:
            lines = [gpu_line(g) for g in info.gpus] + [recommended_line(info.gpus[0])]
            if len(info.gpus) >= 2:
                lines.append(split_line(info.gpus))
            self.label.setText("<br>".join(lines))
        else:
            self.label.setText(cpu_line(info.cpu))

    def run_check(self) -> None:
        self.check_button.setEnabled(False)
        self.check_button.setText("Checking…")
        threading.Thread(target=self._report_thread, daemon=True).start()

    def _report_thread(self) -> None:
        try:
            text = hardware.test_gpu_report()
        except Exception as e:  # a broken driver is exactly what this button is for
            text = f"GPU check failed: {type(e).__name__}: {e}"
        try:
            info = detect()
        except Exception:
            info = None
        self._runner.done.emit(text, info)

    def _show_report(self, text: str, info) -> None:
        if info is not None:
            self.show_info(info)
            self.info_changed.emit(info)
        self.check_button.setEnabled(True)
        self.check_button.setText("Check GPU")
        self.dialog = ReportDialog("GPU check", text, self.window())
        self.dialog.open()
