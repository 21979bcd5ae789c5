"""The Compare tab: tick several runs and their loss curves (train, and validation with
points) are drawn over each other, by step or by training time, each run's settings in the
legend, like TensorBoard's run selector; GRPO runs by their reward instead (training and
held-out); below, a table of each run's last and best validation loss (or held-out reward)
beside its saved evaluations (RUN/eval/: perplexities, accuracies, lm_eval tasks). A mixture of
experts' runs can be drawn by their router entropy or aux loss, and the selected run's final
expert load shows as a strip (the window's Experts plot) under the curves."""

from __future__ import annotations

from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from core.config import methods
from core.runs.compare import MEASURES, run_curves, run_summary
from core.runs.experts import run_load
from core.runs.folder import list_runs
from gui.experts_plot import ExpertStrip

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"]
AXES = {"step": (0, "step"), "training time (s)": (1, "s")}


class CompareTab(QWidget):
    def __init__(self, runs_root: Path, parent=None):
        super().__init__(parent)
        self.runs_root = Path(runs_root)
        self.runs = QListWidget()
        self.runs.itemChanged.connect(self.redraw)
        self.runs.currentItemChanged.connect(self.show_strip)
        self.axis = QComboBox()
        self.axis.addItems(list(AXES))
        self.axis.currentTextChanged.connect(self.redraw)
        self.measure = QComboBox()  # a GRPO run's loss says little: its reward is the curve
        self.measure.addItems(list(MEASURES))
        self.measure.setToolTip(
            "; ".join(["loss: training and validation loss", *(m.help for m in methods.measures())])
        )
        self.measure.currentTextChanged.connect(self.redraw)
        self.measure_chosen = False  # until the user picks one, GRPO runs alone show reward
        self.measure.activated.connect(self._measure_picked)
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.refresh_runs)
        add = QPushButton("Add folder…")
        add.clicked.connect(self._add_folder)
        self.plot = pg.PlotWidget(title="loss")
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        self.legend = self.plot.addLegend(offset=(-10, 10))
        left = QWidget()
        column = QVBoxLayout(left)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(QLabel("Runs (tick to compare)"))
        column.addWidget(self.runs, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(refresh)
        buttons.addWidget(add)
        column.addLayout(buttons)
        column.addWidget(QLabel("x axis"))
        column.addWidget(self.axis)
        column.addWidget(QLabel("curve"))
        column.addWidget(self.measure)
        self.table = QTableWidget()  # loss and saved evaluations, a row per ticked run
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setMinimumHeight(100)  # a header and two runs stay readable
        right = QSplitter(Qt.Orientation.Vertical)
        self.strip = ExpertStrip("Expert load (final)")  # a mixture of experts' run only
        self.strip.setVisible(False)
        right.addWidget(self.plot)
        right.addWidget(self.strip)
        right.addWidget(self.table)
        right.setStretchFactor(0, 2)
        right.setStretchFactor(1, 1)
        right.setStretchFactor(2, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)
        self.refresh_runs()

    def refresh_runs(self) -> None:
        ticked = set(self.ticked())
        self.runs.blockSignals(True)
        self.runs.clear()
        for run in list_runs(self.runs_root):
            self._add(run.path, str(run.path) in ticked)
        self.runs.blockSignals(False)
        self.redraw()

    def _add(self, path: Path, checked: bool = False) -> None:
        item = QListWidgetItem(path.name)
        item.setData(Qt.ItemDataRole.UserRole, str(path))
        item.setToolTip(str(path))
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
        self.runs.addItem(item)

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Run folder", str(self.runs_root))
        if folder:
            self._add(Path(folder), checked=True)

    def tick(self, path: str | Path) -> None:
        """Tick a run (adding it to the list when it is not under the runs folder)."""
        for i in range(self.runs.count()):
            item = self.runs.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == str(path):
                item.setCheckState(Qt.CheckState.Checked)
                return
        self._add(Path(path), checked=True)
        self.redraw()

    def ticked(self) -> list[str]:
        items = (self.runs.item(i) for i in range(self.runs.count()))
        return [
            it.data(Qt.ItemDataRole.UserRole)
            for it in items
            if it.checkState() == Qt.CheckState.Checked
        ]

    def _measure_picked(self, index: int) -> None:
        """The user's pick stands. Qt changes the text (a redraw that still chose for them)
        before it says the user picked, so the pick is applied again here."""
        self.measure_chosen = True
        self.measure.setCurrentIndex(index)
        self.redraw()

    @staticmethod
    def _measure_for(ticked: list[str]) -> str:
        """A method's measure when every ticked run has it (GRPO runs: reward), else loss."""
        for m in methods.measures():
            if all(run_curves(p, m.name)["train"] for p in ticked):
                return m.name
        return "loss"

    def redraw(self, *_) -> None:
        self.plot.clear()
        self.legend.clear()
        column, unit = AXES[self.axis.currentText()]
        ticked = self.ticked()
        if not self.measure_chosen and ticked:
            self.measure.blockSignals(True)
            self.measure.setCurrentText(self._measure_for(ticked))
            self.measure.blockSignals(False)
        measure = self.measure.currentText()
        self.plot.setTitle(measure)
        self.plot.setLabel("bottom", self.axis.currentText())
        held_out = "validation" if measure == "loss" else "held-out"
        for i, path in enumerate(ticked):
            curves = run_curves(path, measure)
            color = COLORS[i % len(COLORS)]
            if curves["train"]:
                xs, ys = [r[column] for r in curves["train"]], [r[2] for r in curves["train"]]
                self.plot.plot(
                    xs, ys, pen=pg.mkPen(color, width=1), name=f"{curves['label']} train"
                )
            if curves["val"]:
                xs, ys = [r[column] for r in curves["val"]], [r[2] for r in curves["val"]]
                self.plot.plot(
                    xs,
                    ys,
                    pen=pg.mkPen(color, width=2),
                    symbol="o",
                    symbolSize=5,
                    symbolBrush=color,
                    name=f"{curves['label']} {held_out}",
                )

        self.fill_table()
        self.show_strip()

    def show_strip(self, *_) -> None:
        """The final expert load of the selected run, else of the first ticked run that has
        one; hidden when none has (dense runs)."""
        current = self.runs.currentItem()
        selected = [current.data(Qt.ItemDataRole.UserRole)] if current is not None else []
        for path in dict.fromkeys([*selected, *self.ticked()]):
            load = run_load(path)
            if load is not None:
                self.strip.show_load(load, Path(path).name)
                self.strip.setVisible(True)
                return
        self.strip.show_load(None)
        self.strip.setVisible(False)

    def fill_table(self) -> None:
        """A row per ticked run: its loss, then every measure any of them saved."""
        paths = self.ticked()
        rows = [run_summary(p) for p in paths]
        columns = list(dict.fromkeys(k for r in rows for k in r))
        self.table.clear()
        self.table.setRowCount(len(rows))
        self.table.setColumnCount(len(columns))
        self.table.setHorizontalHeaderLabels(columns)
        self.table.setVerticalHeaderLabels([Path(p).name for p in paths])
        for i, row in enumerate(rows):
            for j, key in enumerate(columns):
                value = row.get(key)
                self.table.setItem(i, j, QTableWidgetItem("" if value is None else f"{value:.4g}"))
        self.table.resizeColumnsToContents()
