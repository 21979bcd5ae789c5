"""GUI tests that need no training run: form, presets, plots, hardware, estimate, CLI."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from core.config import presets as preset_lib
from core.platform import hardware
from core.training.estimate import estimate, usable_bytes
from core.training.planner import longest_context

GiB = 1024**3
FAKE_8GB = {
    "index": 0,
    "name": "NVIDIA GeForce RTX 4060 (simulated)",
    "total_bytes": 8 * GiB,
    "free_bytes": int(7.5 * GiB),
    "capability": "8.9",
    "bf16": True,
    "tf32": True,
    "driver": "550.54",
}


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(hardware, "gpus", lambda: [])


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(hardware, "gpus", lambda: [dict(FAKE_8GB)])


# -- plots -------------------------------------------------------------------------------


def test_series_grows_and_moving_average_is_trailing():
    from gui.plots import Series, moving_average

    s = Series(capacity=2)
    for i in range(5):
        s.append(i, i * 10)
    s.extend([5, 6], [50, 60])
    assert s.size == 7 and list(s.x) == list(range(7)) and s.y[-1] == 60
    y = np.array([1.0, 3.0, 5.0, 7.0])
    assert list(moving_average(y, 2)) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average(y, 1) is y


def test_plot_paints_150k_points_downsampled(qtbot):
    """A real PlotWidget paint (PySide6 6.12.0 + pyqtgraph 0.14.0 aborts here) at scale.
    How long it takes is measured by benchmarks/window.py, not asserted here."""
    from gui.plots import PlotPanel

    panel = PlotPanel()
    qtbot.addWidget(panel)
    panel.resize(1000, 700)
    panel.show()
    n = 150_000
    steps = np.arange(1, n + 1)
    train = [
        {"step": int(s), "loss": 5.0 / np.sqrt(s), "lr": 1e-3, "tokens_per_s": 5e4, "rss_mb": 300}
        for s in steps
    ]
    evals = [{"step": int(s), "val_loss": 5.0 / np.sqrt(s)} for s in steps[::1000]]
    panel.load_history(train, evals)
    panel.smooth.setChecked(True)
    panel.log_scale.setChecked(True)
    panel.redraw()
    assert panel.curve_points("loss") == n
    assert panel.curve_points("val_loss") == len(evals)
    panel.add_train({"step": n + 1, "loss": 0.01, "lr": 1e-3, "tokens_per_s": 5e4, "rss_mb": 1})
    panel.redraw()
    image = panel.grab()  # paints every plot
    assert not image.isNull() and image.width() > 500
    assert panel.curve_points("loss") == n + 1
    # Clip-to-view and peak downsampling keep the painted points near the screen width.
    shown = panel.curves["loss"].getData()[0]
    assert len(shown) < 10_000
    # What the timer does: one stale plot per tick.
    panel.add_train({"step": n + 2, "loss": 0.01})
    panel._tick()
    assert panel.curve_points("loss") == n + 2


def test_gpu_plot_appears_only_with_nvml_data(qtbot):
    from gui.plots import PlotPanel

    panel = PlotPanel()
    qtbot.addWidget(panel)
    panel.add_train({"step": 1, "loss": 3.0, "rss_mb": 10.0})
    panel.redraw()
    assert panel.plots["gpu"].isHidden()
    panel.add_train(
        {
            "step": 2,
            "loss": 2.9,
            "mem_allocated_mb": 100,
            "nvml_used_mb": 900,
            "nvml_total_mb": 8192,
            "gpu_util": 97,
            "gpu_temp_c": 65,
            "gpu_power_w": 180,
        }
    )
    panel.redraw()
    assert not panel.plots["gpu"].isHidden()
    assert panel.curve_points("gpu_power_w") == 1
    assert panel._total_line is not None and panel._total_line.value() == 8192
    panel.grab()


# -- presets and the form ----------------------------------------------------------------


def test_preset_selection_fills_the_form_and_cpu_is_recommended(make_window, no_gpu):
    window = make_window()
    assert window.recommended == "cpu"
    cpu_index = window.preset_combo.findData("cpu")
    assert "recommended" in window.preset_combo.itemText(cpu_index)
    assert window.preset_combo.currentData() == "cpu"  # preselected on first launch

    for name in ("cpu-tiny", "gpu-large"):
        assert window.select_preset(name)
        expected = preset_lib.to_config(preset_lib.load_preset(name))
        got = window.form.validated()
        for field in (
            "hidden_dim",
            "n_layers",
            "n_heads",
            "seq_len",
            "batch_size",
            "grad_accum",
            "lr",
            "max_steps",
            "precision",
            "eval_every",
            "ckpt_every",
            "log_every",
            "corpus_max_bytes",
            "warmup_steps",
        ):
            assert getattr(got, field) == getattr(expected, field), (name, field)
        assert got.preset == name
        assert window.form.widgets["hidden_dim"].value() == expected.hidden_dim
    assert "20 GB" in window.preset_info.text()


def test_fields_carry_ranges_and_tooltips_from_core(make_window):
    from core.config.spec import LIMITS

    window = make_window()
    spin = window.form.widgets["n_layers"]
    assert (spin.minimum(), spin.maximum()) == (LIMITS["n_layers"][1], LIMITS["n_layers"][2])
    assert "transformer blocks" in spin.toolTip() and "1 to 256" in spin.toolTip()
    lr = window.form.widgets["lr"]
    lr.lineEdit().setText("3e-4")
    lr.interpretText()
    assert window.form.validated().lr == pytest.approx(3e-4)
    assert lr.text() == "0.0003"
    # Every field declared with a label in core.config.spec has its widget, and it round-trips.
    from core.config.spec import SPECS

    for name, spec in SPECS.items():
        if spec.label:
            assert ("limit" if spec.widget == "limit" else name) in window.form.widgets, name
    changed = dataclasses.replace(window.form.validated(), beta2=0.99, bias=False, grad_clip=0.5)
    window.form.set_config(changed)
    assert window.form.validated() == changed
    # An optional whole number (unset: "auto") round-trips unset and set.
    assert window.form.validated().image_max_pixels is None
    assert window.form.widgets["image_max_pixels"].text() == "auto"
    sized = dataclasses.replace(changed, image_max_pixels=50_176)
    window.form.set_config(sized)
    assert window.form.validated() == sized


def test_the_biases_box_shows_only_for_models_that_have_biases(make_window):
    form = make_window().form
    form.set_values(arch="llama")
    assert form.widgets["bias"].isHidden()  # RMSNorm and SwiGLU without biases
    form.set_values(arch="gpt2")
    assert not form.widgets["bias"].isHidden()


def test_invalid_field_is_flagged_and_blocks_start(make_window, dialogs):
    window = make_window()
    window.select_preset("cpu-tiny")
    assert window.start_button.isEnabled()
    window.form.set_values(hidden_dim=100, n_heads=3)
    assert not window.form.is_valid
    assert "divisible by n_heads" in window.form.field_error("hidden_dim")
    assert not window.start_button.isEnabled()
    assert "divisible" in window.start_button.toolTip()
    assert window.estimate.fit is None  # no estimate for an invalid config
    assert window.start() is False and window.worker is None
    assert dialogs.named("critical")[0][0] == "Invalid settings"
    window.form.widgets["n_heads"].setValue(4)
    assert window.form.is_valid and window.form.field_error("hidden_dim") is None
    assert window.start_button.isEnabled()


def test_the_error_shows_under_the_field_it_carries_not_the_one_its_text_starts_with(
    make_window, monkeypatch
):
    import gui.form
    from core.errors import ConfigError

    form = make_window().form

    def refuse(cfg):
        raise ConfigError("lr: worded as if about the learning rate", field="batch_size")

    monkeypatch.setattr(gui.form, "validate", refuse)
    assert form.check() == "lr: worded as if about the learning rate"
    assert "worded as if" in form.field_error("batch_size")
    assert form.field_error("lr") is None
    assert form.widgets["batch_size"].property("invalid")

    def unplaced(cfg):
        raise ConfigError("seed: no field given")

    monkeypatch.setattr(gui.form, "validate", unplaced)
    form.check()
    assert form.field_error("seed") is None and form.field_error("batch_size") is None
    assert not form.general_error.isHidden()  # shown under the form instead


def test_text_fields_show_their_declared_hints(make_window):
    from core.config.spec import SPECS

    form = make_window().form
    for name in ("reward", "reward_weights", "eval_data"):  # GRPO's two, then a common one
        assert form.widgets[name].placeholderText() == SPECS[name].placeholder != ""


def test_epochs_limit_and_a_bad_seed_are_core_checked(make_window):
    window = make_window()
    limit = window.form.widgets["limit"]
    limit.mode.setCurrentText("epochs")
    limit.epochs.setValue(2.5)
    cfg = window.form.validated()
    assert cfg.max_epochs == 2.5 and cfg.max_steps is None
    window.form.widgets["seed"].setText("abc")
    assert "seed" in window.form.field_error("seed")
    assert not window.form.advanced.isHidden()  # the flagged field is shown


def test_optional_learning_rates_show_auto_and_read_back_none(make_window):
    from core.config import recipe

    window = make_window()
    form, lr, muon_lr = window.form, window.form.widgets["lr"], window.form.widgets["muon_lr"]
    form.set_values(lr=None, muon_lr=None, optimizer="muon", hidden_dim=512, n_heads=8)
    assert (lr.value(), lr.minimum()) == (0.0, 0.0)
    assert lr.text() == "auto (0.003)" and muon_lr.text() == "auto (0.02)"
    cfg = form.validated()
    assert cfg.lr is None and cfg.muon_lr is None
    assert recipe.adamw_lr(cfg) == pytest.approx(0.003)  # what the box says auto is
    form.set_values(lr=2e-4, muon_lr=0.05)
    assert lr.text() == "0.0002" and form.validated().lr == pytest.approx(2e-4)
    assert form.validated().muon_lr == pytest.approx(0.05)
    lr.lineEdit().setText("")  # an emptied box: auto again
    lr.interpretText()
    assert form.validated().lr is None and lr.text().startswith("auto")
    lr.stepBy(1)  # from auto to the value it stands for
    assert form.validated().lr == pytest.approx(0.003)
    form.set_values(lr=None)
    assert lr.text().startswith("auto") and form.validated().lr is None


def test_the_compile_box_is_auto_by_default_and_reads_back_all_three_states(make_window):
    from PySide6.QtCore import Qt

    window = make_window()
    form, box = window.form, window.form.widgets["compile"]
    form.set_values(compile=None)
    assert box.checkState() == Qt.CheckState.PartiallyChecked
    assert box.text() == "torch.compile (auto: on a GPU)" and form.validated().compile is None
    for state, value in ((Qt.CheckState.Checked, True), (Qt.CheckState.Unchecked, False)):
        box.setCheckState(state)  # as a click does
        assert box.text() == "torch.compile" and form.validated().compile is value
    box.setCheckState(Qt.CheckState.PartiallyChecked)
    assert form.validated().compile is None


def test_minutes_limit_sets_max_time_and_round_trips(make_window):
    window = make_window()
    form, limit = window.form, window.form.widgets["limit"]
    limit.mode.setCurrentText("minutes")
    limit.minutes.setValue(45)
    cfg = form.validated()
    assert (cfg.max_time, cfg.max_steps, cfg.max_epochs) == ("45m", None, None)
    assert limit.values() == {"max_steps": None, "max_epochs": None, "max_time": "45m"}
    limit.minutes.setValue(90.5)
    assert form.validated().max_time == "1h30m30s"
    form.set_values(max_time="2h")
    assert limit.mode.currentText() == "minutes" and limit.minutes.value() == 120
    assert not limit.minutes.isHidden() and limit.steps.isHidden() and limit.epochs.isHidden()
    form.set_values(max_steps=300)  # naming one limit clears the others
    cfg = form.validated()
    assert (cfg.max_steps, cfg.max_time, limit.mode.currentText()) == (300, None, "steps")
    # the new fields round-trip: values -> TrainConfig -> the form -> the same TrainConfig
    changed = dataclasses.replace(
        cfg,
        arch="gpt2",
        qk_norm=False,
        optimizer="adamw",
        schedule="cosine",
        decay_fraction=0.3,
        decay_shape="sqrt",
        lr=1e-3,
        muon_lr=None,
        max_steps=None,
        max_time="1h30m",
        finish_steps=7,
        n_kv_heads=None,
    )
    form.set_config(changed)
    assert form.validated() == changed
    changed = dataclasses.replace(changed, arch="llama", qk_norm=True, n_kv_heads=2, muon_lr=0.01)
    form.set_config(changed)
    assert form.validated() == changed


def test_save_as_preset_writes_a_user_preset(make_window, dialogs, gui_env):
    window = make_window()
    window.select_preset("cpu-tiny")
    window.form.set_values(hidden_dim=96, n_heads=3)
    path = window.save_preset_as("my-tiny", "tiny but wider")
    assert path is not None and path.is_file()
    assert str(gui_env) in str(path)  # never the real user folder
    assert window.preset_combo.currentData() == "my-tiny"
    assert "(user)" in window.preset_combo.currentText()
    assert preset_lib.to_config(preset_lib.load_preset("my-tiny")).hidden_dim == 96
    assert window.save_preset_as("cpu") is None  # a built-in name: core refuses it
    assert "built-in" in dialogs.named("critical")[-1][1]


def test_settings_and_geometry_persist_between_launches(make_window):
    first = make_window()
    first.select_preset("cpu-tiny")
    first.form.set_values(lr=0.0042, max_steps=77)
    first.plots.log_scale.setChecked(True)
    first.show()
    first.resize(first.width(), 700)  # the offscreen screen is 800x800: vary the height
    height = first.height()
    first.close()
    second = make_window()
    assert second.preset_combo.currentData() == "cpu-tiny"
    cfg = second.form.validated()
    assert cfg.lr == pytest.approx(0.0042) and cfg.max_steps == 77
    assert second.plots.log_scale.isChecked()
    assert second.height() == height and height != 950  # not the default size


def drag_handle(splitter, dy: int) -> None:
    """Drag the handle between a vertical splitter's two panels by dy pixels, as a user does."""
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtTest import QTest

    handle = splitter.handle(1)
    start = handle.rect().center()
    end = start + QPoint(0, dy)
    QTest.mousePress(handle, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, start)
    QTest.mouseMove(handle, end)
    QTest.mouseRelease(handle, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, end)


def test_playground_output_box_gets_the_room_at_the_default_size(make_window, qtbot):
    window = make_window()
    window.show()
    view = window.run_view
    pg = view.playground
    view.tabs.setCurrentWidget(pg)
    qtbot.waitUntil(pg.output.isVisible)
    assert window.size().toTuple() == (1500, 950)  # the default size (nothing saved yet)
    lines = pg.prompt.fontMetrics().lineSpacing()
    assert 3 * lines <= pg.prompt.height() < 5 * lines  # a few lines
    assert pg.output.height() >= 3 * pg.prompt.height()


def test_plots_and_tabs_splitter_drags_both_ways_and_is_remembered(make_window, qtbot, gui_env):
    from PySide6.QtCore import QSettings

    first = make_window()
    first.show()
    qtbot.waitUntil(first.run_view.tabs.isVisible)
    lower = first.run_view.lower_splitter
    plots, tabs = lower.sizes()  # at the default size
    drag_handle(lower, 60)  # tabs smaller
    assert lower.sizes() == [plots + 60, tabs - 60]
    drag_handle(lower, -100)  # tabs larger
    assert lower.sizes() == [plots - 40, tabs + 40]
    first.close()  # saves the settings
    # The offscreen screen (800x800) would shrink a restored 1500x950 window: forget the
    # geometry, so the next window opens at the same default size and only the split is kept.
    QSettings(str(gui_env / "gui.ini"), QSettings.Format.IniFormat).remove("window/geometry")
    second = make_window()
    second.show()
    qtbot.waitUntil(second.run_view.tabs.isVisible)
    assert second.size() == first.size()
    assert second.run_view.lower_splitter.sizes() == [plots - 40, tabs + 40]


# -- hardware and the memory estimate ----------------------------------------------------


def test_cpu_machine_panel_and_disabled_fit_button(make_window, no_gpu):
    window = make_window()
    assert "no CUDA GPU" in window.hardware.label.text()
    assert "cores" in window.hardware.label.text()
    assert not window.estimate.fit_button.isEnabled()
    assert "No CUDA GPU" in window.estimate.fit_button.toolTip()
    assert "RAM" in window.estimate.label.text()
    # the details: the estimate's peak by component, shown on request
    panel = window.estimate
    assert not panel.details.isVisibleTo(panel)
    panel.details_button.click()
    assert panel.details.isVisibleTo(panel)
    est = estimate(window.form.validated(), on_gpu=False)
    assert "saved activations" in panel.details.text()
    assert f"{est.device_total / 1024**2:.1f} MiB" in panel.details.text()  # the total
    assert "The CPU estimate is for the lean C heap. A run here takes the" in panel.details.text()


def test_simulated_8gb_gpu_estimate_warning_and_fit(make_window, fake_gpu, dialogs):
    window = make_window()
    assert "RTX 4060" in window.hardware.label.text()
    assert "8.0 GiB total" in window.hardware.label.text()
    assert "capability 8.9" in window.hardware.label.text()
    assert window.recommended == "gpu-8gb"  # 7.5 GiB free reaches the 8 GB tier
    assert window.preset_combo.currentData() == "gpu-8gb"
    assert "Recommended: gpu-8gb" in window.hardware.label.text()
    assert window.estimate.fit_button.isEnabled()
    assert window.estimate.fit.on_gpu and window.estimate.fit.fits
    assert "VRAM" in window.estimate.label.text()

    window.form.set_values(batch_size=512, grad_accum=2, hidden_dim=512, n_heads=8)
    fit = window.estimate.fit
    assert fit.need == estimate(window.form.validated()).device_total
    assert not fit.fits and "does NOT fit" in window.estimate.label.text()
    assert window.estimate.bar.value() == window.estimate.bar.maximum()

    dialogs.answer_yes = False
    assert window.start() is False and window.worker is None
    title, text = dialogs.named("question")[-1]
    assert title == "Start anyway?" and "not to fit" in text

    assert window.fit_to_gpu()
    cfg = window.form.validated()
    assert cfg.batch_size * cfg.grad_accum == 1024 and cfg.batch_size < 512
    assert window.estimate.fit.fits


def test_the_context_field_says_the_longest_that_fits_and_warns_past_it(make_window, fake_gpu):
    window = make_window()
    window.form.set_values(batch_size=8, grad_accum=1, hidden_dim=512, n_heads=8, seq_len=256)
    cfg = window.form.validated()
    longest = longest_context(cfg, usable_bytes(FAKE_8GB["free_bytes"]))
    assert 256 < longest < 65536 and longest % 256 == 0
    hint = window.form.context_hint
    assert hint.isVisibleTo(window.form)
    assert hint.text() == f"fits up to {longest:,} tokens on this GPU"
    window.form.set_values(seq_len=longest + 256)  # one step past it: warned before a start
    assert hint.text().startswith(f"⚠ {longest + 256:,} will NOT fit")
    assert f"fits up to {longest:,} tokens" in hint.text()
    assert not window.estimate.fit.fits


def test_on_the_cpu_the_context_hint_counts_free_ram(make_window, no_gpu):
    window = make_window()
    assert " GiB of free RAM" in window.form.context_hint.text()


def test_check_gpu_shows_cores_report_off_the_gui_thread(make_window, qtbot, monkeypatch):
    monkeypatch.setattr(hardware, "test_gpu_report", lambda: "torch 9.9\nGPU 0 fake: fine")
    window = make_window()
    window.show()
    qtbot.mouseClick(window.hardware.check_button, qtbot_button())
    qtbot.waitUntil(lambda: window.hardware.dialog is not None, timeout=10_000)
    assert window.hardware.dialog.isVisible()
    assert "GPU 0 fake: fine" in window.hardware.dialog.text.toPlainText()
    assert window.hardware.check_button.isEnabled()
    window.hardware.dialog.close()


def qtbot_button():
    from PySide6.QtCore import Qt

    return Qt.MouseButton.LeftButton


# -- the command line --------------------------------------------------------------------


def test_unknown_preset_exits_2_before_any_window(capsys, gui_env):
    from gui.__main__ import main

    assert main(["--preset", "no-such-preset"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: preset: unknown preset 'no-such-preset'")
    assert main(["--resume", str(gui_env / "missing"), "--runs-root", str(gui_env)]) == 2
    assert "resume:" in capsys.readouterr().err


def test_command_line_prefills_the_window(make_window, gui_env):
    from gui.__main__ import build_parser, launch

    window = make_window()
    data = gui_env / "corpus.txt"
    data.write_text("hello " * 1000)
    args = build_parser().parse_args(
        [
            "--preset",
            "cpu-tiny",
            "--data",
            str(data),
            "--out",
            str(gui_env / "r1"),
            "--max-steps",
            "7",
        ]
    )
    launch(window, args)
    cfg = window.form.validated()
    assert cfg.preset == "cpu-tiny" and cfg.max_steps == 7 and cfg.data == str(data)
    assert window.out_edit.text() == str(gui_env / "r1")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-steps", "0"])


def test_a_preset_file_from_the_command_line_is_named_in_the_preset_box(make_window, gui_env):
    from gui.__main__ import build_parser, launch

    path = gui_env / "my-bpe.yaml"
    path.write_text("description: tiny with a BPE\nhidden_dim: 48\ntokenizer: bpe\n")
    window = make_window()
    launch(window, build_parser().parse_args(["--preset", str(path)]))
    cfg = window.form.validated()
    assert (cfg.hidden_dim, cfg.tokenizer) == (48, "bpe")
    assert window.preset_combo.currentText() == "my-bpe  (file)"
    assert window.preset_info.text().startswith("tiny with a BPE")


def test_no_display_on_linux_is_a_clear_error_not_a_qt_abort(capsys, monkeypatch):
    from gui.__main__ import main

    monkeypatch.setattr("sys.platform", "linux")
    for var in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(var, raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no display found") and "python -m core.train" in err
