"""The window with two GPUs found (detection mocked): "Shard across 2 GPUs (torchrun)" with
each card's share, never beside the split, and a sharded run started, plotted and stopped from
the window (two torchrun processes on the CPU standing in for the cards)."""

from __future__ import annotations

import pytest
from helpers import TWO
from PySide6.QtCore import Qt

from core.platform import hardware
from core.runs import checkpoint as ckpt
from core.runs.folder import read_metrics
from core.training.estimate import estimate
from core.training.sharding import rank_estimate
from gui import worker
from gui.form import shard_offered


def test_sharding_is_offered_on_two_cards_with_each_cards_share_and_not_beside_the_split(
    make_window, two_gpus
):
    window = make_window()
    form = window.form
    box = form.shard
    assert box.isVisibleTo(form) and box.text() == "Shard across 2 GPUs (torchrun)"
    assert not box.isChecked() and not form.config().shard
    box.setChecked(True)
    cfg = form.validated()
    assert cfg.shard and cfg.devices == "" and not form.widgets["device"].isEnabled()
    fit = window.estimate.fit
    each = rank_estimate(estimate(cfg, on_gpu=True), cfg, 2).device_total
    assert [(c.device, c.total) for c in fit.cards] == [("cuda:0", each), ("cuda:1", each)]
    assert each < estimate(cfg, on_gpu=True).device_total  # a share, not the whole
    shown = window.estimate.label.text()
    assert shown.startswith("sharded over 2 GPUs (a process each):")
    # the preset for the larger card: activations are not sharded, so the smaller one is short
    assert f"cuda:0: 1/2 of every layer, ~{each / 1024**3:.2f} GiB of 22.0 GiB free — fits" in shown
    assert "cuda:1: 1/2 of every layer" in shown and "of 11.0 GiB free — does NOT fit" in shown
    assert not fit.fits
    assert fit.free == TWO[1]["free_bytes"]  # the bar: the card with the least free
    form.split.setChecked(True)  # one or the other
    assert not box.isChecked() and form.validated().devices == "cuda:0,cuda:1"
    assert not form.validated().shard
    box.setChecked(True)
    assert not form.split.isChecked()


def test_no_sharding_on_one_card_or_on_windows(make_window, monkeypatch):
    assert shard_offered(2, "linux") and not shard_offered(2, "win32")
    assert not shard_offered(1, "linux")
    monkeypatch.setattr(hardware, "gpus", lambda: [dict(TWO[0])])
    window = make_window()
    assert not window.form.shard.isVisibleTo(window.form) and not window.form.config().shard


@pytest.mark.slow  # over ~10 s on 2 cores
def test_a_sharded_run_from_the_window_plots_and_stops_with_a_sharded_checkpoint(
    make_window, qtbot, gui_env, two_gpus, monkeypatch
):
    monkeypatch.setattr(worker, "shard_processes", lambda: 2)
    window = make_window()
    window.show()
    window.select_preset("cpu-tiny")
    window.form.set_values(
        corpus_max_bytes=200_000, max_steps=100_000, log_every=1, eval_every=10**6
    )
    window.form.shard.setChecked(True)
    run_dir = gui_env / "sharded run"
    window.out_edit.setText(str(run_dir))
    with qtbot.waitSignal(window.run_ended, timeout=120_000) as ended:
        qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: window.plots.curve_points("loss") >= 3, timeout=90_000)
        qtbot.mouseClick(window.stop_button, Qt.MouseButton.LeftButton)
    result = ended.args[0]
    assert result["status"] == "stopped" and result["step"] >= 3
    log = window.run_view.log_view.toPlainText()
    assert "sharded over 2 processes" in log
    train, _ = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in train] == list(range(1, result["step"] + 1))
    state = ckpt.load(run_dir / "checkpoints" / "latest.pt")
    assert state["step"] == result["step"] and state["shards"]  # each rank's part on disk
    assert window.start_button.isEnabled()
