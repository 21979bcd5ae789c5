"""The Experts plot: a heat strip of a mixture of experts' load, MoE layers down, experts
across, coloured by each expert's share as a multiple of an even share (1: even, 0: idle).
Experts that got no token at the step are crossed out and counted in the title."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg

from core.runs.experts import ExpertLoad

IDLE_COLOR = "#c62828"
TICK_PX = {"bottom": 28, "left": 16}  # room a label needs; more cells than fit: every n-th


def load_grid(load: ExpertLoad) -> np.ndarray:
    """[layer, expert] load as a multiple of an even share (NaN where a layer has fewer
    experts than the widest)."""
    grid = np.full((len(load.shares), load.n_experts), np.nan)
    for i, row in enumerate(load.shares):
        grid[i, : len(row)] = np.asarray(row) * len(row)
    return grid


def ticks(labels: list[int], pixels: float, per_label: int) -> list[list[tuple[float, str]]]:
    """Labels at cell centres, every n-th when they would not fit in `pixels`."""
    fit = max(1, int(pixels // per_label))
    every = max(1, math.ceil(len(labels) / fit))
    return [[(i + 0.5, str(v)) for i, v in enumerate(labels) if i % every == 0]]


class ExpertStrip(pg.PlotWidget):
    """One step's layer x expert load (core.runs.experts.ExpertLoad), or empty."""

    def __init__(self, title: str = "Experts", parent=None):
        super().__init__(parent=parent)
        self.base_title = title
        self.load: ExpertLoad | None = None
        item = self.getPlotItem()
        item.setLabel("bottom", "expert")
        item.setLabel("left", "MoE layer")
        item.invertY(True)  # the first layer on top, as a table reads
        item.setMouseEnabled(x=False, y=False)
        item.hideButtons()
        self.image = pg.ImageItem(axisOrder="row-major")
        item.addItem(self.image)
        self.bar = pg.ColorBarItem(
            values=(0, 2),
            colorMap=pg.colormap.get("viridis"),
            label="load (1 = even share)",
            interactive=False,
            colorMapMenu=False,
        )
        self.bar.setImageItem(self.image, insert_in=item)
        self.idle_marks = pg.ScatterPlotItem(
            symbol="x", size=9, pen=pg.mkPen(IDLE_COLOR, width=2), brush=pg.mkBrush(IDLE_COLOR)
        )
        item.addItem(self.idle_marks)
        self.scene().sigMouseMoved.connect(self._hover)
        self.setMinimumSize(180, 120)
        self.show_load(None)

    def show_load(self, load: ExpertLoad | None, label: str = "") -> None:
        """Draw `load` (None: clear); `label` goes after the title (Compare: the run)."""
        self.load = load
        item = self.getPlotItem()
        title = f"{self.base_title} {label}".strip()
        if load is None:
            self.image.clear()
            self.idle_marks.setData([], [])
            item.setTitle(title)
            return
        grid = load_grid(load)
        self.image.setImage(grid, autoLevels=False)
        # a fixed scale reads alike from step to step; a hotter expert widens it
        self.bar.setLevels((0.0, max(2.0, math.ceil(float(np.nanmax(grid))))))
        rows, cols = np.nonzero(grid == 0)
        self.idle_marks.setData(cols + 0.5, rows + 0.5)
        self._label_axes()
        item.setRange(xRange=(0, grid.shape[1]), yRange=(0, grid.shape[0]), padding=0)
        style = {"color": IDLE_COLOR} if load.idle() else {}
        item.setTitle(f"{title}, step {load.step}: {load.idle_line()}", size="10pt", **style)

    def cell_text(self, x: float, y: float) -> str:
        """What the cell at view point (x, y) holds, for the tooltip ('' off the strip)."""
        load = self.load
        row, col = math.floor(y), math.floor(x)
        if load is None or not (0 <= row < len(load.shares) and 0 <= col < len(load.shares[row])):
            return ""
        share = load.shares[row][col]
        even = share * len(load.shares[row])
        return (
            f"layer {load.layers[row]}, expert {col}: {share:.1%} of the assignments "
            f"({even:.2f} x an even share){', idle' if share == 0 else ''}"
        )

    def _hover(self, pos) -> None:
        point = self.getPlotItem().getViewBox().mapSceneToView(pos)
        self.setToolTip(self.cell_text(point.x(), point.y()))

    def _label_axes(self) -> None:
        """Expert numbers across, layer indices down, as many as the plot's size holds."""
        if getattr(self, "load", None) is None:  # also: resized while being built
            return
        view = self.getPlotItem().getViewBox().size()
        for axis, labels, pixels in (
            ("bottom", list(range(self.load.n_experts)), view.width()),
            ("left", list(self.load.layers), view.height()),
        ):
            self.getPlotItem().getAxis(axis).setTicks(ticks(labels, pixels, TICK_PX[axis]))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._label_axes()
