"""The window with two GPUs found (detection mocked): the hardware panel lists both, the form
offers "Split layers across 2 GPUs" with each card's estimate, and the memory plot draws a
line per card from a split run's records; one card keeps the window as it was."""

from __future__ import annotations

from helpers import TWO

from core.platform import hardware


def test_two_cards_are_listed_and_the_split_is_offered_with_each_cards_estimate(
    make_window, two_gpus
):
    window = make_window()
    text = window.hardware.label.text()
    assert "GPU 0: NVIDIA GeForce RTX 4090" in text and "GPU 1: NVIDIA GeForce RTX 3090" in text
    assert "22.0 GiB free" in text and "11.0 GiB free" in text
    assert "2 GPUs, 33.0 GiB free together" in text
    box = window.form.split
    assert box.isVisibleTo(window.form) and box.text() == "Split layers across 2 GPUs"
    assert not box.isChecked() and window.form.config().devices == ""
    assert window.form.context_hint.isVisibleTo(window.form)  # one card's longest context
    box.setChecked(True)
    assert not window.form.context_hint.isVisibleTo(window.form)  # not a split's
    cfg = window.form.validated()
    assert cfg.devices == "cuda:0,cuda:1" and not window.form.widgets["device"].isEnabled()
    fit = window.estimate.fit
    assert [c.device for c in fit.cards] == ["cuda:0", "cuda:1"] and fit.fits
    shown = window.estimate.label.text()
    assert shown.startswith("layers split over 2 GPUs:")
    assert "cuda:0: layers 0-" in shown and "+ embeddings, head, loss" in shown
    assert "of 11.0 GiB free — fits" in shown
    # the bar shows the card nearest its limit
    worst = max(fit.cards, key=lambda c: c.total / c.free)
    assert fit.need == worst.total and fit.free == worst.free
    box.setChecked(False)
    assert window.form.validated().devices == "" and window.estimate.fit.cards == []


def test_one_card_offers_no_split(make_window, monkeypatch):
    monkeypatch.setattr(hardware, "gpus", lambda: [dict(TWO[0])])
    window = make_window()
    assert not window.form.split.isVisibleTo(window.form)
    assert "together" not in window.hardware.label.text()
    assert window.form.config().devices == ""


def split_record(step: int, used: float) -> dict:
    return {
        "step": step,
        "loss": 3.0,
        "lr": 1e-3,
        "mem_reserved_mb": 900.0 + step,
        "nvml_used_mb": 1200.0,
        "nvml_total_mb": 24576.0,
        "card_reserved_mb": {"cuda:0": 900.0 + step, "cuda:1": 500.0 + step},
        "card_used_mb": {"cuda:0": 1200.0, "cuda:1": used},
    }


def test_the_memory_plot_draws_a_line_per_card(qtbot):
    from gui.plots import PlotPanel

    panel = PlotPanel()
    qtbot.addWidget(panel)
    for step in range(1, 6):
        panel.add_train(split_record(step, 700.0))
    panel.redraw()
    labels = {panel.specs[k].label for k in panel.curves if k.startswith("card_")}
    assert labels == {
        "cuda:0 reserved",
        "cuda:1 reserved",
        "cuda:0 used (NVML)",
        "cuda:1 used (NVML)",
    }
    x, y = panel.curves["card_reserved_mb:cuda:1"].getData()
    assert list(x) == [1, 2, 3, 4, 5] and list(y) == [501, 502, 503, 504, 505]
    # a resumed run's history refills them; the next (one-card) run drops them
    panel.load_history([split_record(s, 650.0) for s in (1, 2)], [])
    assert panel.series["card_used_mb:cuda:1"].y.tolist() == [650.0, 650.0]
    panel.clear()
    panel.add_train({"step": 1, "loss": 3.0, "lr": 1e-3, "mem_reserved_mb": 900.0})
    panel.redraw()
    assert not any(k.startswith("card_") for k in [*panel.curves, *panel.series])
    assert "mem_reserved_mb" in panel.curves
