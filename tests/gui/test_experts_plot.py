"""The Experts plot of a mixture of experts' run: a layer x expert load strip of the latest
step with its idle experts flagged, router entropy and aux loss as curves; absent for dense
runs; refilled on resume; and Compare's routing curves and final strip. Fed synthetic step
records (no MoE model needed)."""

from __future__ import annotations

import json

import numpy as np

from core.runs import experts

EVEN = [0.25, 0.25, 0.25, 0.25]


def moe_record(step: int, load: list[list[float]], layers=(1, 3), entropy=1.3, aux=2.0):
    return {
        "step": step,
        "loss": 3.0 - 0.1 * step,
        "lr": 1e-3,
        "elapsed_s": float(step),
        experts.AUX: aux,
        experts.ENTROPY: entropy,
        experts.LOAD: load,
        experts.LAYERS: list(layers),
    }


def title(strip) -> str:
    return strip.getPlotItem().titleLabel.text


def test_the_strip_shows_the_latest_load_and_flags_idle_experts(qtbot):
    from PySide6.QtCore import QPointF
    from PySide6.QtTest import QTest

    from gui.plots import PlotPanel

    panel = PlotPanel()
    qtbot.addWidget(panel)
    panel.resize(1000, 800)
    panel.show()
    panel.add_train(moe_record(1, [EVEN, EVEN], entropy=1.38, aux=2.0))
    panel.add_train(moe_record(2, [[0.5, 0.0, 0.5, 0.0], [0.1, 0.2, 0.3, 0.4]], aux=2.5))
    panel.redraw()
    assert not panel.experts.isHidden() and not panel.plots[experts.PLOT].isHidden()
    # layers down, experts across, each share as a multiple of an even share
    expected = np.array([[2.0, 0.0, 2.0, 0.0], [0.4, 0.8, 1.2, 1.6]])
    np.testing.assert_allclose(panel.experts.image.image, expected)
    xs, ys = panel.experts.idle_marks.getData()
    assert sorted(zip(xs, ys, strict=True)) == [(1.5, 0.5), (3.5, 0.5)]  # layer 1's experts 1, 3
    assert "step 2: 2 experts idle in layer 1" in title(panel.experts)
    # hovering a cell names it (x: expert, y: the row of a MoE layer)
    assert panel.experts.cell_text(1.5, 0.5) == (
        "layer 1, expert 1: 0.0% of the assignments (0.00 x an even share), idle"
    )
    assert panel.experts.cell_text(3.2, 1.9).startswith("layer 3, expert 3: 40.0%")
    assert panel.experts.cell_text(4.5, 0.5) == ""  # off the strip
    strip = panel.experts
    qtbot.wait(100)  # the row laid out, so cells map to where they show
    scene = strip.getPlotItem().getViewBox().mapViewToScene(QPointF(3.5, 0.5))
    QTest.mouseMove(strip.viewport(), strip.mapFromScene(scene))
    assert strip.toolTip().startswith("layer 1, expert 3: 0.0%")
    assert panel.curve_points(experts.ENTROPY) == 2 and panel.curve_points(experts.AUX) == 2
    image = panel.grab()  # a real paint of the strip, its colour bar and the curves
    assert not image.isNull()
    # the next log step: the timer redraws the strip with it, the idle marks go
    panel.add_train(moe_record(3, [EVEN, EVEN]))
    for _ in range(len(panel.plots) + 1):
        panel._tick()
    np.testing.assert_allclose(panel.experts.image.image, np.ones((2, 4)))
    assert len(panel.experts.idle_marks.getData()[0]) == 0
    assert "step 3: no idle experts" in title(panel.experts)


def test_a_dense_run_shows_no_experts_plot(qtbot):
    from gui.plots import PlotPanel

    panel = PlotPanel()
    qtbot.addWidget(panel)
    panel.add_train({"step": 1, "loss": 3.0, "lr": 1e-3})
    panel.redraw()
    assert panel.experts.isHidden() and panel.plots[experts.PLOT].isHidden()
    # after a mixture of experts' run, the next (dense) run's plots drop the strip again
    panel.add_train(moe_record(2, [EVEN, EVEN]))
    panel.redraw()
    assert not panel.experts.isHidden()
    panel.clear()
    panel.add_train({"step": 1, "loss": 3.0, "lr": 1e-3})
    panel.redraw()
    assert panel.experts.isHidden() and panel.plots[experts.PLOT].isHidden()
    assert panel.experts.load is None


def write_run(folder, records) -> None:
    folder.mkdir(parents=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (folder / "metrics.jsonl").write_text(lines, encoding="utf-8")


def test_resume_refills_the_strip_and_compare_draws_routing(make_window, tmp_path):
    run = tmp_path / "moe-run"
    write_run(
        run,
        [
            moe_record(1, [EVEN, EVEN], entropy=1.38),
            moe_record(2, [[1.0, 0.0, 0.0, 0.0], EVEN], entropy=1.0),
            {"step": 2, "val_loss": 2.9},
            moe_record(3, [EVEN, EVEN], entropy=1.2),  # past the checkpoint: not history
        ],
    )
    dense = tmp_path / "dense-run"
    write_run(dense, [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.8}])
    window = make_window()
    window.run_view._refill_plots(run, 2)
    window.plots.redraw()
    assert not window.plots.experts.isHidden()
    assert window.plots.experts.load.step == 2
    assert "3 experts idle in layer 1" in title(window.plots.experts)
    assert window.plots.curve_points(experts.ENTROPY) == 2

    compare = window.run_view.compare
    compare.tick(dense)
    assert compare.strip.isHidden()  # dense runs have no load strip
    compare.tick(run)
    assert compare.measure.currentText() == "loss"  # routing curves only when asked for
    # picked as Qt does it: the text changes, then `activated` says the user chose it
    index = compare.measure.findText("router entropy (MoE)")
    compare.measure.setCurrentIndex(index)
    compare.measure.activated.emit(index)
    assert compare.measure.currentText() == "router entropy (MoE)"
    items = compare.plot.getPlotItem().listDataItems()
    assert [list(item.getData()[1]) for item in items] == [[1.38, 1.0, 1.2]]  # the MoE run's
    assert not compare.strip.isHidden()
    assert compare.strip.load.step == 3 and "moe-run" in title(compare.strip)
    headers = [
        compare.table.horizontalHeaderItem(i).text() for i in range(compare.table.columnCount())
    ]
    assert {"router entropy", "idle experts"} <= set(headers)
    # the run selected in the list shows its own final strip
    other = tmp_path / "moe-other"
    write_run(other, [moe_record(5, [[0.5, 0.5, 0.0, 0.0], EVEN])])
    compare.tick(other)
    items = [compare.runs.item(i) for i in range(compare.runs.count())]
    compare.runs.setCurrentItem(next(it for it in items if it.text() == "moe-other"))
    assert compare.strip.load.step == 5 and "moe-other" in title(compare.strip)
    assert "2 experts idle in layer 1" in title(compare.strip)
    compare.grab()  # a real paint of the curves and the strip
