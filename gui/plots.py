"""Live training plots: records go into growable buffers; a timer redraws what changed.

Each curve clips to the visible x range and peak-downsamples to the screen width, so a run
with hundreds of thousands of steps redraws as fast as a short one.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from core.config import methods
from core.config.methods.base import Curve
from core.platform.hardware import CARD_FIELDS
from core.runs import experts
from core.runs.signals import CURVES, EVAL_KEYS, PLOTS
from gui.experts_plot import ExpertStrip

# One plot per tick (see _tick). While a run trains every redraw takes the GIL from it, so
# the ticks slow down: each plot then refreshes about once a second.
REDRAW_MS = 50
REDRAW_MS_TRAINING = 250

# Antialiasing a dense, noisy curve costs 5x the paint time (measured 88 vs 17 ms for 150k
# loss points, 94 vs 17 with the smoothed curve); only sparse or monotone curves get it.
pg.setConfigOptions(background="w", foreground="k", antialias=False)


class Series:
    """Append-only x/y arrays that grow by doubling (amortised O(1) appends)."""

    def __init__(self, capacity: int = 1024):
        self._x = np.empty(capacity)
        self._y = np.empty(capacity)
        self.size = 0
        self.version = 0  # bumped on every change, so the redraw knows what is stale

    def append(self, x: float, y: float) -> None:
        if self.size == len(self._x):
            self._grow(self.size * 2)
        self._x[self.size] = x
        self._y[self.size] = y
        self.size += 1
        self.version += 1

    def extend(self, xs, ys) -> None:
        xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        need = self.size + len(xs)
        if need > len(self._x):
            self._grow(max(need, self.size * 2))
        self._x[self.size : need] = xs
        self._y[self.size : need] = ys
        self.size = need
        self.version += 1

    def clear(self) -> None:
        self.size = 0
        self.version += 1

    def _grow(self, capacity: int) -> None:
        for name in ("_x", "_y"):
            old = getattr(self, name)
            new = np.empty(capacity)
            new[: self.size] = old[: self.size]
            setattr(self, name, new)

    @property
    def x(self) -> np.ndarray:
        return self._x[: self.size]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self.size]


def moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over `window` points (shorter at the start); vectorised via cumsum."""
    if window <= 1 or len(y) == 0:
        return y
    c = np.concatenate(([0.0], np.cumsum(y)))
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def fixed_label(widest: str) -> QLabel:
    """A label for text that changes several times a second.

    A fixed size keeps each new text from invalidating the window's layout, which on a
    busy CPU costs a relayout and repaint of every widget.
    """
    label = QLabel()
    label.setFixedSize(label.fontMetrics().horizontalAdvance(widest) + 8, label.sizeHint().height())
    label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return label


CurveSpec = Curve  # a curve: a record field drawn in a plot (core.config.methods.base)

CARD_COLORS = ("#17becf", "#bcbd22", "#8c564b", "#e377c2", "#7f7f7f", "#000000")  # not in CURVES
STRIP = "experts"  # the Experts heat strip: a step's load, not a curve (gui/experts_plot.py)
METHOD_PLOTS = {p.name: p for p in methods.plots()}  # beside the loss once a run reports
SMOOTH_KEY = "loss_smooth"


class PlotPanel(QWidget):
    """The plot grid with its options row (smoothing, log scale)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.series = {spec.key: Series() for spec in CURVES}
        self.specs = {spec.key: spec for spec in CURVES}
        self.curves: dict[str, pg.PlotDataItem] = {}
        self._drawn: dict[str, tuple[int, bool, int]] = {}
        self._total_line: pg.InfiniteLine | None = None
        self._next_plot = 0
        self._load_record: dict | None = None  # the latest step record with an expert load
        self._card_dashed: dict[str, bool] = {}  # a layer split's per-card curves: dashed?
        self._load_version = 0
        self._load_drawn = 0

        self.smooth = QCheckBox("Smooth loss")
        self.smooth.setToolTip("Draw a trailing moving average over the raw train loss")
        self.smooth_window = QSpinBox()
        self.smooth_window.setRange(2, 10_000)
        self.smooth_window.setValue(25)
        self.smooth_window.setSuffix(" steps")
        self.smooth_window.setToolTip("Moving-average window for the smoothed loss")
        self.log_scale = QCheckBox("Log scale")
        self.log_scale.setToolTip("Logarithmic y axis on the loss plot")
        self.smooth.toggled.connect(self._options_changed)
        self.smooth_window.valueChanged.connect(self._options_changed)
        self.log_scale.toggled.connect(self._options_changed)

        options = QHBoxLayout()
        options.addWidget(self.smooth)
        options.addWidget(self.smooth_window)
        options.addWidget(self.log_scale)
        options.addStretch(1)
        self.points_label = fixed_label("9,999,999 steps, 99,999,999 points")
        options.addWidget(self.points_label)

        self.plots = {name: self._make_plot(title, unit) for name, (title, unit) in PLOTS.items()}
        self.experts = ExpertStrip(parent=self)
        self._right_views = {
            "gpu": self._add_right_axis(self.plots["gpu"], "power", "W"),
            # bits per byte compare across tokenizers; nats per token do not
            "loss": self._add_right_axis(self.plots["loss"], "bits/byte", ""),
            **{
                name: self._add_right_axis(self.plots[name], plot.right_label, "")
                for name, plot in METHOD_PLOTS.items()
            },
            experts.PLOT: self._add_right_axis(
                self.plots[experts.PLOT], experts.ROUTING.right_label, ""
            ),
        }
        self.grid = QGridLayout()
        self.grid.setSpacing(4)
        self._place_plots()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(options)
        layout.addLayout(self.grid, 1)

        self.timer = QTimer(self)
        self.timer.setInterval(REDRAW_MS)
        self.timer.timeout.connect(self._tick)
        self.timer.start()

    # -- building ------------------------------------------------------------------------

    def _make_plot(self, title: str, unit: str) -> pg.PlotWidget:
        w = pg.PlotWidget(title=title)
        item = w.getPlotItem()
        item.setLabel("bottom", "step")
        item.setLabel("left", unit)
        item.showGrid(x=True, y=True, alpha=0.2)
        item.setClipToView(True)
        item.setDownsampling(auto=True, mode="peak")
        item.addLegend(offset=(-8, 8), labelTextSize="8pt")
        w.setMinimumSize(180, 120)
        return w

    def set_training(self, training: bool) -> None:
        self.timer.setInterval(REDRAW_MS_TRAINING if training else REDRAW_MS)

    def _add_right_axis(self, widget: pg.PlotWidget, label: str, unit: str) -> pg.ViewBox:
        """A second ViewBox sharing x, drawn against the right axis (pyqtgraph's recipe)."""
        item = widget.getPlotItem()
        view = pg.ViewBox()
        item.showAxis("right")
        item.scene().addItem(view)
        item.getAxis("right").linkToView(view)
        item.getAxis("right").setLabel(label, units=unit)
        view.setXLink(item)

        def follow():
            view.setGeometry(item.vb.sceneBoundingRect())
            view.linkedViewChanged(item.vb, view.XAxis)

        item.vb.sigResized.connect(follow)
        return view

    def _place_plots(self) -> None:
        """Loss on top, a method's plot beside it once its run reports (DPO's preference,
        GRPO's rewards); the GPU plot only takes a slot once NVML data has arrived; a mixture
        of experts' Experts strip and routing curves a row at the bottom once a load has."""
        for w in (*self.plots.values(), self.experts):
            self.grid.removeWidget(w)
        gpu_shown = self._has_gpu_data()
        beside = self._method_plot_with_data()
        self.grid.addWidget(self.plots["loss"], 0, 0, 1, 1 if beside else 2)
        for name in METHOD_PLOTS:
            self.plots[name].setVisible(name == beside)
        if beside:
            self.grid.addWidget(self.plots[beside], 0, 1)
        self.grid.addWidget(self.plots["memory"], 1, 0)
        self.grid.addWidget(self.plots["throughput"], 1, 1)
        self.grid.addWidget(self.plots["lr"], 2, 0, 1, 1 if gpu_shown else 2)
        self.plots["gpu"].setVisible(gpu_shown)
        if gpu_shown:
            self.grid.addWidget(self.plots["gpu"], 2, 1)
        moe = self._has_moe_data()
        if moe:  # a mixture of experts: its load strip and routing curves, a row of their own
            self.grid.addWidget(self.experts, 3, 0)
            self.grid.addWidget(self.plots[experts.PLOT], 3, 1)
        # after addWidget: a widget it reparents shows only later, on the event loop
        self.experts.setVisible(moe)
        self.plots[experts.PLOT].setVisible(moe)
        self.grid.setRowStretch(0, 3)
        self.grid.setRowStretch(1, 2)
        self.grid.setRowStretch(2, 2)
        self.grid.setRowStretch(3, 3 if moe else 0)
        self.grid.setColumnStretch(0, 1)  # the strip as wide as the routing curves beside it
        self.grid.setColumnStretch(1, 1)
        self._gpu_placed = gpu_shown
        self._method_placed = beside
        self._moe_placed = moe

    def _method_plot_with_data(self) -> str | None:
        """The first method plot (registry order) whose run has reported, or None."""
        for name, plot in METHOD_PLOTS.items():
            if any(self.series[k].size for k in plot.shown_by):
                return name
        return None

    def _has_moe_data(self) -> bool:
        """Whether the run's records carry an expert load (dense runs never do)."""
        return self._load_record is not None

    def _has_gpu_data(self) -> bool:
        return any(self.series[k].size for k in ("gpu_util", "gpu_temp_c", "gpu_power_w"))

    def _curve(self, key: str) -> pg.PlotDataItem:
        """Created on first data, so legends list only what this machine reports."""
        if key in self.curves:
            return self.curves[key]
        if key == SMOOTH_KEY:
            spec = CurveSpec(SMOOTH_KEY, "loss", "train loss (smoothed)", "#0b3d91", 2.0)
        else:
            spec = self.specs[key]
        pen = pg.mkPen(spec.color, width=spec.width)
        if self._card_dashed.get(key):
            pen.setStyle(Qt.PenStyle.DashLine)
        kwargs = {"pen": pen, "name": spec.label, "antialias": spec.antialias}
        if spec.symbol:
            kwargs.update(symbol=spec.symbol, symbolSize=5, symbolBrush=spec.color)
        if spec.right_axis:
            curve = pg.PlotDataItem(**kwargs)
            curve.setClipToView(True)
            curve.setDownsampling(auto=True, method="peak")
            self._right_views[spec.plot].addItem(curve)
            legend = self.plots[spec.plot].getPlotItem().legend
            if legend is not None:
                legend.addItem(curve, spec.label)
        else:
            curve = self.plots[spec.plot].getPlotItem().plot(**kwargs)
        self.curves[key] = curve
        return curve

    # -- data in -------------------------------------------------------------------------

    def add_train(self, record: dict) -> None:
        step = record["step"]
        for key, series in self.series.items():
            value = record.get(key)
            if value is not None and key not in EVAL_KEYS:
                series.append(step, value)
        if record.get(experts.LOAD) is not None:
            self._set_load_record(record)
        self._add_cards(step, record)
        total = record.get("nvml_total_mb")
        if total and self._total_line is None:
            self.set_device_total(total)

    def add_eval(self, record: dict) -> None:
        for key in EVAL_KEYS:
            if record.get(key) is not None:
                self.series[key].append(record["step"], record[key])

    def load_history(self, train: list[dict], evals: list[dict]) -> None:
        """Refill from a run's metrics.jsonl so a resumed run's curves continue."""
        self.clear()
        for key, series in self.series.items():
            source = evals if key in EVAL_KEYS else train
            pairs = [(r["step"], r[key]) for r in source if r.get(key) is not None]
            if pairs:
                xs, ys = zip(*pairs, strict=True)
                series.extend(xs, ys)
        for r in train:
            self._add_cards(r["step"], r)
        totals = [r["nvml_total_mb"] for r in train if r.get("nvml_total_mb")]
        if totals:
            self.set_device_total(totals[-1])
        loaded = [r for r in train if r.get(experts.LOAD) is not None]
        if loaded:
            self._set_load_record(loaded[-1])

    def _add_cards(self, step: int, record: dict) -> None:
        """A layer split's memory per card ({device: MiB} fields): one line a card and field
        on the memory plot, made on first sight (one card: none, the plot as it was)."""
        for field in CARD_FIELDS:
            for n, (device, value) in enumerate((record.get(field) or {}).items()):
                key = f"{field}:{device}"
                if key not in self.series:
                    what = "reserved" if field == "card_reserved_mb" else "used (NVML)"
                    dash = field == "card_used_mb"  # the card's NVML line beside its own
                    color = CARD_COLORS[n % len(CARD_COLORS)]
                    self.specs[key] = CurveSpec(key, "memory", f"{device} {what}", color)
                    self.series[key] = Series()
                    self._card_dashed[key] = dash
                if value is not None:
                    self.series[key].append(step, value)

    def _drop_cards(self) -> None:
        """The last run's per-card lines, gone with it."""
        for key in list(self._card_dashed):
            curve = self.curves.pop(key, None)
            if curve is not None:
                item = self.plots["memory"].getPlotItem()
                item.removeItem(curve)
                if item.legend is not None:
                    item.legend.removeItem(curve)
            for table in (self.series, self.specs, self._drawn, self._card_dashed):
                table.pop(key, None)

    def _set_load_record(self, record: dict) -> None:
        """Kept as it came; parsed and drawn by the timer, at most once a tick."""
        self._load_record = record
        self._load_version += 1

    def clear(self) -> None:
        self._drop_cards()
        for series in self.series.values():
            series.clear()
        self._load_record = None
        self._load_version += 1
        if self._method_placed or self._moe_placed:  # the next run may be another kind
            self._place_plots()

    def set_device_total(self, total_mb: float) -> None:
        """The card's total memory as a dashed line on the memory plot."""
        if self._total_line is None:
            self._total_line = pg.InfiniteLine(
                angle=0,
                pen=pg.mkPen("#555", width=1, style=pg.QtCore.Qt.PenStyle.DashLine),
                label="card total {value:.0f} MiB",
                labelOpts={"position": 0.25, "color": "#555", "anchors": [(0.5, 0.0), (0.5, 0.0)]},
            )
            self.plots["memory"].addItem(self._total_line)
        self._total_line.setValue(total_mb)

    # -- drawing -------------------------------------------------------------------------

    def _options_changed(self, *_):
        self.plots["loss"].getPlotItem().setLogMode(y=self.log_scale.isChecked())
        self.redraw("loss")

    def _stale_keys(self, plot: str | None) -> list[str]:
        """Series whose curve no longer shows their buffer (in one plot, or in all)."""
        smooth = self.smooth.isChecked()
        stale = []
        for key, series in self.series.items():
            if plot is not None and self.specs[key].plot != plot:
                continue
            if series.size == 0 and key not in self.curves:
                continue
            if self._drawn.get(key) != (series.version, smooth, 0):
                stale.append(key)
        if plot in (None, "loss") and self._drawn.get(SMOOTH_KEY) != self._smooth_state():
            stale.append(SMOOTH_KEY)
        return stale

    def _smooth_state(self) -> tuple:
        return (self.series["loss"].version, self.smooth.isChecked(), self.smooth_window.value())

    def _tick(self) -> None:
        """Timer: redraw at most one plot per tick, so no single frame paints them all.

        Each plot still refreshes several times a second; what this bounds is the time
        the GUI thread spends in one go while the training thread competes for the GIL.
        """
        names = [*PLOTS, STRIP]
        for i in range(len(names)):
            name = names[(self._next_plot + i) % len(names)]
            if self._strip_stale() if name == STRIP else self._stale_keys(name):
                self._next_plot = (self._next_plot + i + 1) % len(names)
                self.redraw(name)
                return

    def redraw(self, plot: str | None = None) -> None:
        """Push changed buffers to their curves (one plot's, or all); never called per step."""
        smooth = self.smooth.isChecked()
        changed = set()
        if plot in (None, STRIP) and self._strip_stale():
            self._redraw_strip()
        for key in self._stale_keys(plot):
            changed.add(self.specs[key].plot if key != SMOOTH_KEY else "loss")
            if key == SMOOTH_KEY:
                self._redraw_smoothed(smooth)
                continue
            series = self.series[key]
            self._drawn[key] = (series.version, smooth, 0)
            curve = self._curve(key)
            curve.setData(series.x, series.y)
            if key == "loss":
                curve.setOpacity(0.35 if smooth else 1.0)
        for name in changed:
            # pyqtgraph fits the axes to new data only when the view is about to paint, and
            # the new range then asks for a second paint: two paints per redraw, nearly all
            # of it axis text. Fitting them now makes it one (measured 41 -> 21 paints and
            # 136 -> 76 ms of GUI thread per second, 4 plots fed 200 steps/s).
            self.plots[name].scene().prepareForPaint()
        if (
            (self._has_gpu_data() and not self._gpu_placed)
            or self._method_plot_with_data() != self._method_placed
            or self._has_moe_data() != self._moe_placed
        ):
            self._place_plots()
        total = sum(s.size for s in self.series.values())
        self.points_label.setText(f"{self.series['loss'].size:,} steps, {total:,} points")

    def _strip_stale(self) -> bool:
        return self._load_drawn != self._load_version

    def _redraw_strip(self) -> None:
        self._load_drawn = self._load_version
        record = self._load_record
        self.experts.show_load(None if record is None else experts.from_record(record))

    def _redraw_smoothed(self, smooth: bool) -> None:
        self._drawn[SMOOTH_KEY] = self._smooth_state()
        if not smooth:
            if SMOOTH_KEY in self.curves:
                self.curves[SMOOTH_KEY].setData([], [])
            return
        series = self.series["loss"]
        window = self.smooth_window.value()
        self._curve(SMOOTH_KEY).setData(series.x, moving_average(series.y, window))

    def curve_points(self, key: str) -> int:
        """How many points the curve for `key` holds (0 when it has not been drawn)."""
        curve = self.curves.get(key)
        if curve is None or curve.xData is None:
            return 0
        return len(curve.xData)
