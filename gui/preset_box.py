"""The preset chooser: built-in and user presets, the recommended one starred."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QPushButton,
    QVBoxLayout,
)

from core.config import presets as preset_lib
from core.config.spec import TrainConfig
from core.errors import ConfigError, UserError
from core.training.planner import recommend_preset
from gui.hardware_panel import HardwareInfo


class PresetBox(QGroupBox):
    """Choosing a preset emits `applied` with its config; errors go out as `problem`."""

    applied = Signal(object)  # TrainConfig
    save_requested = Signal(str)  # the name typed for "Save as preset…"
    problem = Signal(str, str)  # title, message

    def __init__(self, info: HardwareInfo, parent=None):
        super().__init__("Preset", parent)
        self.info = info
        self.presets: list[preset_lib.Preset] = []
        self.recommended: str | None = None
        self.combo = QComboBox()
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.combo.currentIndexChanged.connect(self._chosen)
        self.save_button = QPushButton("Save as preset…")
        self.save_button.setToolTip("Save the current settings as a user preset")
        self.save_button.clicked.connect(self._save_clicked)
        self.info_label = QLabel()
        self.info_label.setWordWrap(True)
        self.info_label.setStyleSheet("color: #555;")
        row = QHBoxLayout()
        row.addWidget(self.combo, 1)
        row.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.info_label)

    def reload(self) -> None:
        """List the presets again (after a save), marking the one recommended for this machine."""
        try:
            self.presets = preset_lib.list_presets()
            self.recommended = self._recommend().name
        except UserError as e:
            self.problem.emit("Presets", str(e))
        self.combo.blockSignals(True)
        self.combo.clear()
        for p in self.presets:
            text = p.name
            if p.name == self.recommended:
                text += "  ★ recommended"
            if not p.builtin:
                text += "  (user)"
            self._add_item(text, p.name, p.description)
        self.combo.blockSignals(False)

    def _add_item(self, text: str, name: str, tip: str) -> None:
        self.combo.addItem(text, name)
        self.combo.setItemData(self.combo.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)

    def add_file(self, preset: preset_lib.Preset) -> None:
        """List a preset loaded from a YAML path (python -m gui --preset FILE) and show it."""
        self.presets.append(preset)
        self.combo.blockSignals(True)
        self._add_item(f"{preset.name}  (file)", preset.name, str(preset.path))
        self.combo.setCurrentIndex(self.combo.count() - 1)
        self.combo.blockSignals(False)
        self._show_info(preset.name)

    def _recommend(self) -> preset_lib.Preset:
        if self.info.gpus:
            g = self.info.gpus[0]
            return recommend_preset(g["total_bytes"], g["free_bytes"], presets=self.presets)
        return recommend_preset(presets=self.presets)

    def current(self) -> str:
        return self.combo.currentData() or ""

    def select(self, name: str, apply: bool = True) -> bool:
        """Select a preset by name; with apply, `applied` carries its values."""
        index = self.combo.findData(name)
        if index < 0:
            return False
        if not apply:
            self.combo.blockSignals(True)
        self.combo.setCurrentIndex(index)
        self.combo.blockSignals(False)
        if apply:
            self._chosen(index)
        self._show_info(name)
        return True

    def _chosen(self, index: int) -> None:
        if index < 0 or index >= len(self.presets):
            return
        preset = self.presets[index]
        try:
            cfg: TrainConfig = preset_lib.to_config(preset)
        except ConfigError as e:
            self.problem.emit("Preset", str(e))
            return
        self._show_info(preset.name)
        self.applied.emit(cfg)

    def _show_info(self, name: str) -> None:
        preset = next((p for p in self.presets if p.name == name), None)
        if preset is None:
            self.info_label.clear()
            return
        parts = [preset.description]
        if preset.hardware:
            parts.append(f"For: {preset.hardware}.")
        if preset.name == self.recommended:
            parts.append("Recommended for this machine.")
        self.info_label.setText(" ".join(p for p in parts if p))

    def _save_clicked(self) -> None:
        name, ok = QInputDialog.getText(
            self, "Save as preset", "Preset name (letters, digits, - and _):"
        )
        if ok and name.strip():
            self.save_requested.emit(name.strip())
