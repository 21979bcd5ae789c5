"""The settings form: one widget per TrainConfig field, checked by core's `validate`.

The form never judges values itself: ranges and tooltips come from `core.config.spec.LIMITS`,
and the field named in a ConfigError is flagged under its widget.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from core.config import methods, recipe
from core.config.declare import ADVANCED, BATCH, DATA, EXECUTION, INTERVALS, MODEL
from core.config.methods.base import PAIRS, PROMPTS, WINDOWS
from core.config.spec import (
    KINDS,
    LIMITS,
    SPECS,
    TrainConfig,
    describe_limit,
    format_duration,
    parse_duration,
    validate,
)
from core.data import preference, tables
from core.data.chat import thinking_vars
from core.data.describe import data_line, preview_data, preview_images
from core.data.sources import find_sources
from core.errors import ConfigError, UserError
from core.platform import compiling, distributed
from core.weights import families
from core.weights.loader import apply_pretrained
from gui.data_preview import DataPreview

INT_MAX = 2**31 - 1  # QSpinBox holds a C int

# Box order in the form; each field names its box (core.config.spec's Spec.group).
# a method's own box (GRPO's rewards and sampling) shows for that method alone
METHOD_BOXES = {m.name: m.form_group for m in methods.METHODS.values() if m.form_group}
GROUP_ORDER = (DATA, *METHOD_BOXES.values(), MODEL, BATCH, EXECUTION, INTERVALS)
LABELS = {name: spec.label for name, spec in SPECS.items() if spec.label}
ADVANCED_FIELDS = [name for name, spec in SPECS.items() if spec.group == ADVANCED and spec.label]
LOG_STEP_FIELDS = ("lr", "muon_lr", "max_epochs")  # these step by a factor, not by a fixed amount


# What a pretrained model decides: shown, not edited.
PRETRAINED_FIXED = ("hidden_dim", "n_layers", "n_heads", "bias", "tokenizer", "arch", "qk_norm")
AUTO = "auto"  # an optional number left unset: core picks it (core.config.recipe)


_reward_checks: dict[tuple, str | None] = {}


def check_reward_files(cfg: TrainConfig) -> None:
    """Import each reward file and find its function (once per file version): a ConfigError
    naming the reward, shown under the Rewards field."""
    from core.config.spec import split_reward
    from core.training import rewards

    for spec in cfg.reward:
        parts = split_reward(spec)
        if parts is None:
            continue
        path = Path(parts[0]).expanduser()
        key = (spec, path.stat().st_mtime if path.is_file() else None)
        if key not in _reward_checks:
            try:
                rewards.load_function(spec)
                _reward_checks[key] = None
            except UserError as e:
                _reward_checks[key] = str(e)
        if _reward_checks[key]:
            raise ConfigError(_reward_checks[key], field="reward")


def tooltip(name: str) -> str:
    text = f"{name}: {SPECS[name].help}."
    if name in LIMITS:
        text += f"\nAllowed: {describe_limit(name)}."
    elif SPECS[name].choices:
        text += f"\nAllowed: {', '.join(SPECS[name].choices)}."
    if name == "compile":  # what it needs on this OS; without it the run goes on uncompiled
        text += f"\n{compiling.needs_text()}; without them the run trains uncompiled."
    return text


def group_fields(group: str) -> list[str]:
    """The fields shown in one box, in declaration order."""
    return [n for n, s in SPECS.items() if s.group == group and s.label]


class _NoWheelUnlessFocused:
    """Scrolling the settings panel must not change the value under the mouse."""

    def wheelEvent(self, event):  # noqa: N802 (Qt override)
        if self.hasFocus():
            super().wheelEvent(event)
        else:
            event.ignore()


class AutoCheck(QCheckBox):
    """A yes/no field that may stay unset (torch.compile): checked, unchecked, or partly
    checked for "auto" (core decides from the device), which its text says."""

    def __init__(self, label: str, auto_text: str):
        super().__init__(label)
        self.label, self.auto_text = label, auto_text
        self.setTristate(True)
        self.stateChanged.connect(self._relabel)

    def _relabel(self) -> None:
        auto = self.checkState() == Qt.CheckState.PartiallyChecked
        self.setText(f"{self.label} ({self.auto_text})" if auto else self.label)

    def field_value(self) -> bool | None:
        state = self.checkState()
        return None if state == Qt.CheckState.PartiallyChecked else state == Qt.CheckState.Checked

    def set_field_value(self, value: bool | None) -> None:
        if value is None:
            self.setCheckState(Qt.CheckState.PartiallyChecked)
        else:
            self.setCheckState(Qt.CheckState.Checked if value else Qt.CheckState.Unchecked)
        self._relabel()


def shard_offered(gpu_count: int, platform: str = sys.platform) -> bool:
    """Sharding needs several CUDA cards and NCCL (core.platform.distributed)."""
    return gpu_count >= 2 and distributed.nccl_available(platform)


AUTO_TEXTS = {"compile": "auto: on a GPU"}  # what an unset yes/no field does


class IntSpin(_NoWheelUnlessFocused, QSpinBox):
    """optional: one below the field's minimum shows "auto" and reads back as None."""

    def __init__(self, name: str, optional: bool = False):
        super().__init__()
        _, low, high, _ = LIMITS[name]
        self.optional = optional
        self.setRange(int(low) - optional, INT_MAX if high is None else min(int(high), INT_MAX))
        if optional:
            self.setSpecialValueText(AUTO)
        self.setGroupSeparatorShown(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)

    def field_value(self) -> int | None:
        if self.optional and self.value() == self.minimum():
            return None
        return self.value()

    def set_field_value(self, value: int | None) -> None:
        self.setValue(self.minimum() if value is None else value)


class FloatSpin(_NoWheelUnlessFocused, QDoubleSpinBox):
    """Shows 0.0003 or 3e-05 rather than a fixed number of decimals.

    optional: the minimum is 0 and shows "auto" (core picks the value); `field_value`
    reads it back as None. An emptied box means auto too."""

    def __init__(self, name: str, optional: bool = False):
        super().__init__()
        _, low, high, _ = LIMITS[name]
        self.optional = optional
        self.auto_value: float | None = None  # what auto stands for, where the form knows
        self.setDecimals(12)
        self.setRange(0.0 if optional else float(low), 1e12 if high is None else float(high))
        self._min_width = 0
        if optional:  # room for the longest "auto (...)" without cutting it off
            self.setSpecialValueText(f"{AUTO} (0.000375)")
            self._min_width = self.sizeHint().width()
            self.setSpecialValueText(AUTO)
        self.setSingleStep(0.01)
        self.log_step = name in LOG_STEP_FIELDS
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)

    def minimumSizeHint(self):  # noqa: N802 (Qt override)
        hint = super().minimumSizeHint()
        hint.setWidth(max(hint.width(), self._min_width))
        return hint

    def field_value(self) -> float | None:
        if self.optional and self.value() == self.minimum():
            return None
        return self.value()

    def set_field_value(self, value: float | None) -> None:
        self.setValue(self.minimum() if value is None else value)

    def set_auto_hint(self, value: float | None) -> None:
        """Show what auto resolves to, e.g. "auto (0.003)"; stepping from auto starts there."""
        self.auto_value = value
        self.setSpecialValueText(AUTO if value is None else f"{AUTO} ({value:.3g})")

    def _is_auto_text(self, text: str) -> bool:
        stripped = text.strip()
        return self.optional and (stripped == "" or stripped == self.specialValueText())

    def textFromValue(self, value: float) -> str:  # noqa: N802 (Qt override)
        return f"{value:.6g}"

    def valueFromText(self, text: str) -> float:  # noqa: N802 (Qt override)
        if self._is_auto_text(text):
            return self.minimum()
        try:
            return float(text)
        except ValueError:
            return self.value()

    def validate(self, text: str, pos: int):
        stripped = text.strip()
        if self._is_auto_text(text):
            return QValidator.State.Acceptable, text, pos
        if self.optional and self.specialValueText().startswith(stripped):
            return QValidator.State.Intermediate, text, pos  # "au", on the way to "auto"
        try:
            value = float(stripped)
        except ValueError:
            intermediate = stripped in ("", "-", ".", "+") or stripped[-1:] in "eE-+."
            state = QValidator.State.Intermediate if intermediate else QValidator.State.Invalid
            return state, text, pos
        ok = self.minimum() <= value <= self.maximum()
        return (QValidator.State.Acceptable if ok else QValidator.State.Intermediate), text, pos

    def stepBy(self, steps: int) -> None:  # noqa: N802 (Qt override)
        if self.field_value() is None and self.auto_value is not None:
            self.setValue(self.auto_value)  # from auto to the value auto stands for
        elif self.log_step and self.value() > 0:
            self.setValue(self.value() * 10 ** (steps / 10))
        else:
            super().stepBy(steps)


class WheelSafeDoubleSpin(_NoWheelUnlessFocused, QDoubleSpinBox):
    """A plain QDoubleSpinBox (fixed decimals) that ignores the wheel unless focused."""


class Combo(_NoWheelUnlessFocused, QComboBox):
    def __init__(self, items):
        super().__init__()
        self.addItems(list(items))
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)

    def set_text(self, text: str) -> None:
        if self.findText(text) < 0:
            self.addItem(text)  # e.g. cuda:1 from a saved config on another machine
        self.setCurrentText(text)


class LimitField(QWidget):
    """How long a run trains: max_steps, max_epochs or max_time (minutes), one of them."""

    changed = Signal()
    KEYS = ("max_steps", "max_epochs", "max_time")

    def __init__(self):
        super().__init__()
        self.mode = Combo(["steps", "epochs", "minutes"])
        self.mode.setToolTip("What limits the run: optimizer steps, passes over the data, or time")
        self.steps = IntSpin("max_steps")
        self.epochs = FloatSpin("max_epochs")
        self.epochs.setValue(1.0)
        self.minutes = self._minutes_spin()
        self.boxes = {"steps": self.steps, "epochs": self.epochs, "minutes": self.minutes}
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for box in self.boxes.values():
            layout.addWidget(box, 1)
            box.valueChanged.connect(self.changed)
        layout.addWidget(self.mode)
        self.mode.currentTextChanged.connect(self._show_mode)
        self.mode.currentTextChanged.connect(self.changed)
        self._show_mode()

    @staticmethod
    def _minutes_spin() -> QDoubleSpinBox:
        spin = WheelSafeDoubleSpin()
        spin.setDecimals(2)
        spin.setRange(0.1, 100_000.0)
        spin.setValue(30.0)
        spin.setSingleStep(5.0)
        spin.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        spin.setToolTip(f"max_time: {SPECS['max_time'].help}.")
        return spin

    def _show_mode(self, *_):
        for mode, box in self.boxes.items():
            box.setVisible(mode == self.mode.currentText())

    def values(self) -> dict:
        """All three keys; the ones not in use are None."""
        mode, out = self.mode.currentText(), dict.fromkeys(self.KEYS)
        if mode == "steps":
            out["max_steps"] = self.steps.value()
        elif mode == "epochs":
            out["max_epochs"] = self.epochs.value()
        else:
            out["max_time"] = format_duration(self.minutes.value() * 60)
        return out

    def set_values(self, max_steps, max_epochs, max_time=None) -> None:
        """As core reads them: max_time wins over max_epochs, which wins over max_steps."""
        if max_time:
            self.minutes.setValue(parse_duration(max_time) / 60)
            self.mode.setCurrentText("minutes")
        elif max_epochs is not None:
            self.epochs.setValue(max_epochs)
            self.mode.setCurrentText("epochs")
        else:
            self.steps.setValue(int(max_steps))
            self.mode.setCurrentText("steps")


class DataChooser(QWidget):
    """A file or a folder of text, or a Hugging Face dataset id; empty means core's embedded
    corpus. Add source mixes more sources in, each with a weight (empty: by their tokens)."""

    changed = Signal()

    def __init__(self):
        super().__init__()
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("embedded corpus (Python standard library sources)")
        self.edit.setToolTip(
            "A text file, a table of chat examples or texts (.jsonl, .parquet, .csv, .json), "
            "or a folder of either; leave empty for the embedded corpus"
        )
        self.edit.setClearButtonEnabled(True)
        file_btn = QPushButton("File…")
        folder_btn = QPushButton("Folder…")
        file_btn.clicked.connect(self._pick_file)
        folder_btn.clicked.connect(self._pick_folder)
        self.weight = self._weight_edit()
        add_btn = QPushButton("Add source")
        add_btn.setToolTip("Mix another file, folder or dataset into the training data")
        add_btn.clicked.connect(lambda: self.add_source())
        layout = QHBoxLayout()
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.edit, 1)
        layout.addWidget(file_btn)
        layout.addWidget(folder_btn)
        layout.addWidget(self.weight)
        layout.addWidget(add_btn)
        self.rows_layout = QVBoxLayout(self)
        self.rows_layout.setContentsMargins(0, 0, 0, 0)
        self.rows_layout.addLayout(layout)
        self.rows: list[tuple[QWidget, QLineEdit, QLineEdit]] = []  # (row, path, weight)
        self.edit.textChanged.connect(self.changed)

    def _weight_edit(self, text: str = "") -> QLineEdit:
        weight = QLineEdit(text)
        weight.setPlaceholderText("weight")
        weight.setFixedWidth(60)
        weight.setToolTip(
            "This source's share of the training sequences (e.g. 0.8 and 0.2); all empty: "
            "proportional to each source's training tokens"
        )
        weight.setVisible(bool(getattr(self, "rows", None)))
        weight.textChanged.connect(self.changed)
        return weight

    def add_source(self, path: str = "", weight: str = "") -> QLineEdit:
        """A row for one more source of the mix: path, File…, Folder…, weight, Remove."""
        row = QWidget()
        edit = QLineEdit(path)
        edit.setPlaceholderText("another file, folder, owner/dataset or 'embedded'")
        edit.setClearButtonEnabled(True)
        weight_edit = self._weight_edit(weight)
        weight_edit.setVisible(True)
        buttons = [QPushButton(t) for t in ("File…", "Folder…", "Remove")]
        buttons[0].clicked.connect(lambda: self._pick_file(edit))
        buttons[1].clicked.connect(lambda: self._pick_folder(edit))
        buttons[2].clicked.connect(lambda: self._remove(row))
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(edit, 1)
        for w in (buttons[0], buttons[1], weight_edit, buttons[2]):
            layout.addWidget(w)
        self.rows.append((row, edit, weight_edit))
        self.rows_layout.addWidget(row)
        self.weight.setVisible(True)
        edit.textChanged.connect(self.changed)
        self.changed.emit()
        return edit

    def _remove(self, row: QWidget) -> None:
        self.rows = [r for r in self.rows if r[0] is not row]
        row.setParent(None)
        row.deleteLater()
        self.weight.setVisible(bool(self.rows))
        self.changed.emit()

    def extra(self) -> list[str]:
        """The mixed-in sources (config extra_data), rows left empty skipped."""
        return [e.text().strip() for _, e, _ in self.rows if e.text().strip()]

    def weights(self) -> str | None:
        """data_weights: the weights as typed, in order; None when all are empty."""
        used = [(self.weight, None)] + [(w, e) for _, e, w in self.rows if e.text().strip()]
        texts = [w.text().strip() for w, _ in used]
        return ",".join(texts) if len(texts) > 1 and any(texts) else None

    def set_mix(self, extra: list[str], weights: str | None) -> None:
        for row, _, _ in list(self.rows):
            self._remove(row)
        parts = [w.strip() for w in weights.split(",")] if weights else []
        parts += [""] * (1 + len(extra) - len(parts))
        self.weight.setText(parts[0])
        for path, weight in zip(extra, parts[1:], strict=False):
            self.add_source(path, weight)

    def _pick_file(self, edit: QLineEdit | None = None):
        edit = self.edit if edit is None else edit
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Training data",
            edit.text(),
            "Text, chat or table data (*.txt *.md *.jsonl *.parquet *.csv *.json);;All files (*)",
        )
        if path:
            edit.setText(path)

    def _pick_folder(self, edit: QLineEdit | None = None):
        edit = self.edit if edit is None else edit
        path = QFileDialog.getExistingDirectory(self, "Folder of training text", edit.text())
        if path:
            edit.setText(path)

    def value(self) -> str | None:
        return self.edit.text().strip() or None

    def set_value(self, path: str | None) -> None:
        self.edit.setText(path or "")


class ConfigForm(QWidget):
    """Edits a TrainConfig. `changed` fires on every edit, after the flags are updated."""

    changed = Signal()

    def __init__(self, gpu_count: int = 0, parent=None):
        super().__init__(parent)
        self._base = TrainConfig()
        self._pretrained = None  # core.weights.loader.Pretrained of a pretrained start
        self._loading = False
        self.error: str | None = None
        self.widgets: dict[str, QWidget] = {}
        self.errors: dict[str, QLabel] = {}
        self.context_hint = QLabel()  # the longest context that fits (set_context_hint)
        self.context_hint.setObjectName("context_hint")
        self.context_hint.setWordWrap(True)
        self.context_hint.setVisible(False)

        devices = ["auto", "cpu"] + [f"cuda:{i}" for i in range(gpu_count)]
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.data = DataChooser()
        self.data.changed.connect(self._edited)
        self.data_info = QLabel()
        self.data_info.setStyleSheet("color: #555;")
        self.data_info.setWordWrap(True)  # chat data gets a longer line
        self._data_info_key = None
        self._pairs_key, self._pairs = None, False  # whether the data holds preference pairs
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addWidget(self.data)
        top_layout.addWidget(self.data_info)
        self.data_preview = DataPreview()  # a table's layout, first rows and their images
        self.data_preview.setVisible(False)
        top_layout.addWidget(self.data_preview)
        self.boxes: dict[str, QGroupBox] = {}
        for group in GROUP_ORDER:
            top_widget = top if group == DATA else None
            box = self._group(group, group_fields(group), devices, top=top_widget)
            self.boxes[group] = box
            layout.addWidget(box)
        for group in METHOD_BOXES.values():
            self.boxes[group].setVisible(False)  # until its method is chosen
        self.split = self._split_box(gpu_count)
        self.shard = self._shard_box(gpu_count)
        self.advanced_toggle = QToolButton()
        self.advanced_toggle.setText("Advanced settings")
        self.advanced_toggle.setCheckable(True)
        self.advanced_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.advanced_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.advanced_toggle.toggled.connect(self._toggle_advanced)
        layout.addWidget(self.advanced_toggle)
        self.advanced = self._group(ADVANCED, ADVANCED_FIELDS, devices)
        self.advanced.setVisible(False)
        layout.addWidget(self.advanced)
        self.general_error = self._error_label()
        layout.addWidget(self.general_error)

    # -- building ------------------------------------------------------------------------

    @staticmethod
    def _error_label() -> QLabel:
        label = QLabel()
        label.setWordWrap(True)
        label.setStyleSheet("color: #c62828;")
        label.setVisible(False)
        return label

    def _make_widget(self, name: str, devices: list[str]) -> QWidget:
        spec = SPECS[name]
        if spec.widget == "limit":
            w = LimitField()
            w.changed.connect(self._edited)
        elif KINDS[name] is bool and spec.optional:
            w = AutoCheck(LABELS[name], AUTO_TEXTS.get(name, AUTO))
            w.stateChanged.connect(self._edited)
        elif KINDS[name] is bool:
            w = QCheckBox(LABELS[name])
            w.toggled.connect(self._edited)
        elif spec.choices or spec.widget == "device":
            w = Combo(spec.choices or devices)
            w.currentTextChanged.connect(self._edited)
        elif spec.widget == "text":
            w = QLineEdit()  # e.g. a seed past a C int, or free text
            w.setPlaceholderText(spec.placeholder)
            w.textChanged.connect(self._edited)
        elif KINDS[name] is int:
            w = IntSpin(name, optional=spec.optional)
            w.valueChanged.connect(self._edited)
        else:
            w = FloatSpin(name, optional=spec.optional)
            w.valueChanged.connect(self._edited)
        w.setToolTip(tooltip(name))
        w.setObjectName(name)
        return w

    def _group(self, title: str, names: list[str], devices: list[str], top=None) -> QGroupBox:
        """Two label/field pairs per row; each field's error shows right under it."""
        box = QGroupBox(title)
        grid = QGridLayout(box)
        grid.setHorizontalSpacing(8)
        grid.setVerticalSpacing(2)
        if top is not None:
            grid.addWidget(top, 0, 0, 1, 4)
        for i, name in enumerate(names):
            row, col = (i // 2) * 2 + (top is not None), (i % 2) * 2
            w = self._make_widget(name, devices)
            key = "limit" if SPECS[name].widget == "limit" else name  # max_steps or max_epochs
            self.widgets[key] = w
            self.errors[key] = self._error_label()
            if isinstance(w, QCheckBox):
                grid.addWidget(w, row, col, 1, 2)
            else:
                label = QLabel(LABELS[name])
                label.setToolTip(tooltip(name))
                label.setBuddy(w)
                grid.addWidget(label, row, col)
                grid.addWidget(w, row, col + 1)
            below = self.errors[key]
            if name == "seq_len":  # the longest context that fits, under its error line
                below = QWidget()
                stack = QVBoxLayout(below)
                stack.setContentsMargins(0, 0, 0, 0)
                stack.setSpacing(0)
                stack.addWidget(self.errors[key])
                stack.addWidget(self.context_hint)
            grid.addWidget(below, row + 1, col, 1, 2)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        return box

    def _split_box(self, gpu_count: int) -> QCheckBox:
        """ "Split layers across N GPUs" (--devices cuda:0,...), under Execution where this
        machine has several: the layers on each card by its free memory, in one process."""
        box = QCheckBox(f"Split layers across {gpu_count} GPUs")
        box.setObjectName("devices")
        box.setToolTip(
            "Put consecutive layers on each GPU, in proportion to its free memory, in one "
            "process: for a model too large for one card. Any OS, Windows included (no NCCL); "
            "the cards compute in turn, so it is no faster than one card. The estimate shows "
            "each card's share (docs/multi-gpu.md)"
        )
        box.toggled.connect(self._edited)
        box.setVisible(gpu_count >= 2)
        self._gpu_count = gpu_count
        grid = self.boxes[EXECUTION].layout()
        grid.addWidget(box, grid.rowCount(), 0, 1, 4)
        return box

    def _shard_box(self, gpu_count: int) -> QCheckBox:
        """ "Shard across N GPUs (torchrun)" (--shard), where this machine has several and
        NCCL exists (not Windows): one process a card, each holding 1/N of the model."""
        box = QCheckBox(f"Shard across {gpu_count} GPUs (torchrun)")
        box.setObjectName("shard")
        box.setToolTip(
            f"Start {gpu_count} processes with torchrun, one a GPU, each holding 1/{gpu_count} "
            "of the weights, gradients and optimizer state (FSDP2): for a model too large for "
            "one card, and every card computes at once. Batch size is per GPU. Linux only "
            "(NCCL); on Windows split the layers instead (docs/multi-gpu.md)"
        )
        box.toggled.connect(lambda on: on and self.split.setChecked(False))
        self.split.toggled.connect(lambda on: on and box.setChecked(False))
        box.toggled.connect(self._edited)
        self._shard_offered = shard_offered(gpu_count)
        box.setVisible(self._shard_offered)
        grid = self.boxes[EXECUTION].layout()
        grid.addWidget(box, grid.rowCount(), 0, 1, 4)
        return box

    def _toggle_advanced(self, shown: bool) -> None:
        self.advanced.setVisible(shown)
        arrow = Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow
        self.advanced_toggle.setArrowType(arrow)

    # -- values --------------------------------------------------------------------------

    def set_config(self, cfg: TrainConfig) -> None:
        """Show a config; fields the form has no widget for are kept as they are."""
        self._loading = True
        try:
            self._base = cfg
            for name, w in self.widgets.items():
                if name == "limit":
                    w.set_values(cfg.max_steps, cfg.max_epochs, cfg.max_time)
                elif name == "arch" and self._pretrained is not None:
                    self._show_family(w)
                else:
                    self._set_widget(w, getattr(cfg, name))
            self.data.set_value(cfg.data)
            self.data.set_mix(cfg.extra_data, cfg.data_weights)
            self.split.setChecked(bool(cfg.devices) and self._gpu_count >= 2)
            self.shard.setChecked(cfg.shard and self._shard_offered)
        finally:
            self._loading = False
        self._edited()

    def _show_family(self, w: Combo) -> None:
        """The greyed Architecture field names the pretrained model's family (Gemma 2, Phi-3),
        not the "llama" a new model of that shape would be."""
        w.setCurrentIndex(-1)
        w.setPlaceholderText(families.get(self._pretrained.family).display)

    @staticmethod
    def _set_widget(w: QWidget, value) -> None:
        if isinstance(w, AutoCheck):
            w.set_field_value(value)
        elif isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, Combo):
            w.set_text(str(value))
        elif isinstance(w, QLineEdit):
            text = "" if value is None else value
            w.setText(", ".join(text) if isinstance(text, list) else str(text))
        elif isinstance(w, (FloatSpin, IntSpin)):
            w.set_field_value(value)
        else:
            w.setValue(value)

    @staticmethod
    def _read_widget(w: QWidget):
        if isinstance(w, AutoCheck):
            return w.field_value()
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, Combo):
            return w.currentText()
        if isinstance(w, QLineEdit):
            return w.text().strip()
        if isinstance(w, (FloatSpin, IntSpin)):
            return w.field_value()
        return w.value()

    def set_pretrained(self, pre) -> None:
        """A pretrained start (core.weights.loader.Pretrained) fixes the shape and the tokenizer;
        None goes back to a new model."""
        self._pretrained = pre
        cfg = self.config()
        if pre is None:
            tokenizer = "bytes" if cfg.tokenizer == "model" else cfg.tokenizer
            cfg = dataclasses.replace(cfg, init_from=None, tokenizer=tokenizer)
        else:
            cfg = dataclasses.replace(cfg, init_from=pre.name)
            if not pre.config.moe:  # the expert switches mean nothing to a dense model
                cfg = dataclasses.replace(cfg, lora_experts=False, train_router=False)
            if not self._has_tower():  # nor a tower's to a model without one
                cfg = dataclasses.replace(cfg, train_vision=False)
            cfg = apply_pretrained(cfg, pre)
            if not cfg.eval_data:  # offered: a fine-tune's plot then shows forgetting
                cfg = dataclasses.replace(cfg, eval_data="embedded")
        self.set_config(cfg)

    def set_values(self, **values) -> None:
        """Change some fields, e.g. batch_size and grad_accum after an OOM or a fit. Naming
        one of max_steps, max_epochs and max_time clears the other two."""
        if values.keys() & set(LimitField.KEYS):
            values = {**dict.fromkeys(LimitField.KEYS), **values}
        self.set_config(dataclasses.replace(self.config(), **values))

    def config(self) -> TrainConfig:
        """The form's values over the last config shown; not validated."""
        values = {}
        for name, w in self.widgets.items():
            if name == "limit":
                values.update(w.values())
            elif name == "arch" and w.currentIndex() < 0:
                continue  # a pretrained model's family is shown: its arch stays the config's
            else:
                values[name] = self._read_widget(w)
        seed = values["seed"]
        values["seed"] = int(seed) if seed.isdigit() else seed  # core names a bad seed
        values["reward"] = [r.strip() for r in values["reward"].split(",") if r.strip()]
        values["data"] = self.data.value()
        values["extra_data"], values["data_weights"] = self.data.extra(), self.data.weights()
        split = self.split.isChecked() and self._gpu_count >= 2
        values["devices"] = ",".join(f"cuda:{i}" for i in range(self._gpu_count)) if split else ""
        values["shard"] = self.shard.isChecked() and self._shard_offered
        if values["shard"] and str(values["device"]).startswith("cuda:"):
            values["device"] = "auto"  # each process takes its own card
        return dataclasses.replace(self._base, **values)

    def validated(self) -> TrainConfig:
        """The form's config checked by core; raises ConfigError naming the field."""
        cfg = self.config()
        if self._pretrained is not None:  # a context past the model's is named
            cfg = apply_pretrained(cfg, self._pretrained, explicit={"seq_len"})
            thinking_vars(self._pretrained.tokenizer.chat_template, cfg.thinking)
        cfg = validate(cfg)
        if methods.owns(cfg, "reward"):  # a reward file imports and has its function
            check_reward_files(cfg)
        return cfg

    # -- checking ------------------------------------------------------------------------

    def _edited(self, *_):
        if self._loading:
            return
        self.widgets["vocab_size"].setEnabled(self.widgets["tokenizer"].currentText() == "bpe")
        for name in PRETRAINED_FIXED:
            self.widgets[name].setEnabled(self._pretrained is None)
        # the split names the cards; sharded, each process takes its own
        self.widgets["device"].setEnabled(not (self.split.isChecked() or self.shard.isChecked()))
        self._show_train_vision()
        # Llama-style models have no such biases: the box shows only where it means something.
        bias, arch = self.widgets["bias"], self.widgets["arch"].currentText()
        bias.setVisible(bias.isChecked() if self._pretrained else arch == "gpt2")
        self._describe_data()
        self.check()
        self._show_auto_lrs()
        self.changed.emit()

    def _has_tower(self) -> bool:
        """Whether the pretrained start has a vision tower TrainDeck trains."""
        from core.weights import vision

        pre = self._pretrained
        return pre is not None and vision.kind_of(pre.hf_config or {}) is not None

    def _show_train_vision(self) -> None:
        """Train vision tower: offered only where the model has one (the tooltip says why)."""
        box, has = self.widgets["train_vision"], self._has_tower()
        box.setEnabled(has or box.isChecked())  # a checked box stays, to be unchecked
        why = "" if has else "\n\nThis model has no vision tower (Gemma 3 4B and up have one)."
        box.setToolTip(tooltip("train_vision") + why)

    def _show_auto_lrs(self) -> None:
        """What "auto" means for the learning rates of this config (core.config.recipe)."""
        cfg = self.config()
        self.widgets["lr"].set_auto_hint(recipe.adamw_lr(dataclasses.replace(cfg, lr=None)))
        muon = recipe.optimizer(cfg) == "muon"
        self.widgets["muon_lr"].set_auto_hint(recipe.MUON_LR if muon else None)

    def _describe_data(self) -> None:
        """Size of the chosen data, so the user sees what a run will read (whole)."""
        cfg = self.config()
        self._method_follows_data(cfg)
        pretrained = self._pretrained
        key = (
            cfg.data,
            tuple(cfg.data_extensions),
            cfg.corpus_max_bytes,
            cfg.data_format,
            cfg.seq_len,
            cfg.drop_long,
            cfg.train_on_prompts,
            cfg.thinking,
            pretrained and pretrained.name,
            cfg.method,
            tuple(tables.columns_of(cfg).items()),
            tuple(cfg.extra_data),
            cfg.data_weights,
        )
        if key == self._data_info_key:
            return
        self._data_info_key = key
        tokenizer = pretrained.tokenizer if pretrained is not None else None
        self.data_info.setText(data_line(cfg, tokenizer))
        self.data_preview.set_preview(preview_data(cfg), preview_images(cfg))

    def _method_follows_data(self, cfg: TrainConfig) -> None:
        """Preference pairs train with DPO and nothing else does: the method that fits, on
        every change (a preset or restored settings may have set the other one)."""
        key = (cfg.data, tuple(cfg.data_extensions), tuple(tables.columns_of(cfg).items()))
        if key != self._pairs_key:
            try:
                self._pairs = cfg.data is not None and preference.holds_pairs(
                    find_sources(cfg.data, cfg.data_extensions, 0, chat=True).files,
                    tables.columns_of(cfg),
                )
            except UserError:
                self._pairs = False
            self._pairs_key = key
        pairs = self._pairs
        method = self.widgets["method"]
        # No file says it holds prompts: a method taking them is the user's choice, unless
        # the data are pairs. Otherwise the data choose: pairs their method, else windows'.
        if pairs or methods.get(method.currentText()).data != PROMPTS:
            wanted = methods.taking(PAIRS if pairs else WINDOWS).name
            if method.currentText() != wanted:
                method.setCurrentText(wanted)
        for name, group in METHOD_BOXES.items():
            self.boxes[group].setVisible(method.currentText() == name)

    def check(self) -> str | None:
        """Validate with core and flag the named field; returns the message or None."""
        field = None
        try:
            self.validated()
            self.error = None
        except ConfigError as e:
            self.error, field = str(e), e.field
        self._show_error(self.error, field)
        return self.error

    def _show_error(self, message: str | None, field: str | None = None) -> None:
        """The message under the widget of the field the error names (its `field`), else
        under the form."""
        for label in [*self.errors.values(), self.general_error]:
            label.setVisible(False)
        for w in self.widgets.values():
            w.setProperty("invalid", False)
            w.setStyleSheet("")
        if message is None:
            return
        name = field or ""
        if name in LimitField.KEYS:
            name = "limit"
        label = self.errors.get(name, self.general_error)
        label.setText("⚠ " + message)
        label.setVisible(True)
        if name in self.widgets:
            self.widgets[name].setProperty("invalid", True)
            self.widgets[name].setStyleSheet("background: #ffebee;")
        if name in ADVANCED_FIELDS and not self.advanced_toggle.isChecked():
            self.advanced_toggle.setChecked(True)

    def set_context_hint(self, text: str, warn: bool = False) -> None:
        """Under the context field: the longest context that fits, red when seq_len is past
        it (the estimate panel works it out; empty hides it)."""
        self.context_hint.setText(("⚠ " if warn else "") + text)
        self.context_hint.setStyleSheet(f"color: {'#c62828' if warn else '#555'};")
        self.context_hint.setVisible(bool(text))

    @property
    def is_valid(self) -> bool:
        return self.error is None

    def field_error(self, name: str) -> str | None:
        """The message shown under a field, or None (for tests and the status line)."""
        label = self.errors.get(name)
        if label is None or label.isHidden():
            return None
        return label.text()
