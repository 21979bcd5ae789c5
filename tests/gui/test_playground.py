"""The Playground tab: generate from a run in a thread, stop it, export from the window."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import tiny_config

from core.training.trainer import Trainer
from core.use.generate import generate_ids, load, stream_text


@pytest.fixture
def trained(gui_env):
    run = gui_env / "runs" / "tiny"
    Trainer(tiny_config(max_steps=20, eval_every=10, ckpt_every=10), run).run()
    return run


def test_playground_lists_runs_and_streams_the_same_text_as_core(make_window, qtbot, trained):
    window = make_window()
    pg = window.playground
    assert window.run_view.tabs.tabText(window.run_view.tabs.indexOf(pg)) == "Playground"
    pg.refresh_runs()
    assert pg.target() == str(trained)
    pg.prompt.setPlainText("import ")
    pg.temperature.setValue(0.7)
    pg.length.setValue(60)
    pg.seed.setValue(4)
    with qtbot.waitSignal(pg.generation_done, timeout=30_000):
        assert pg.generate()
        assert not pg.generate_button.isEnabled() and pg.stop_button.isEnabled()
    loaded = load(trained)
    ids = loaded.tokenizer.encode("import ")
    expected = "".join(
        stream_text(loaded.tokenizer, generate_ids(loaded.model, ids, 60, 0.7, seed=4))
    )
    assert pg.output.toPlainText() == "import " + expected
    assert pg.status.text().startswith("Done with best.pt, step 20")
    assert pg.generate_button.isEnabled()


def test_stop_ends_generation_early_and_the_window_stays_responsive(make_window, qtbot, trained):
    window = make_window()
    pg = window.playground
    pg.refresh_runs(trained)
    pg.length.setValue(100_000)
    with qtbot.waitSignal(pg.generation_done, timeout=30_000):
        assert pg.generate()  # returns at once: the model loads and runs in its thread
        # text arrives while the event loop keeps running (waitUntil processes events)
        qtbot.waitUntil(lambda: len(pg.output.toPlainText()) > 20, timeout=20_000)
        pg.stop()
    assert pg.status.text().startswith("Stopped")
    assert len(pg.output.toPlainText()) < 100_000


def test_export_dialog_writes_a_transformers_folder(make_window, trained, gui_env, qtbot):
    pytest.importorskip("transformers")
    pg = make_window().playground
    pg.refresh_runs(trained)
    dialog = pg.export_clicked()
    dialog.format.setCurrentIndex(dialog.format.findData("hf"))
    assert not dialog.quant.isEnabled() and dialog.size.text() == ""  # hf has no quant
    out = gui_env / "exported"
    dialog.out.setText(str(out))
    with qtbot.waitSignal(dialog.thread_done, timeout=60_000):
        dialog.export_button.click()
    assert dialog.path == out and dialog.show_button.isEnabled()
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_export_dialog_quantizes_gguf_with_progress_and_predicted_size(
    make_window, trained, gui_env, qtbot
):
    pg = make_window().playground
    pg.refresh_runs(trained)
    dialog = pg.export_clicked()
    assert dialog.chosen_format() == "gguf" and dialog.quant.currentText() == "q4_k_m"
    assert dialog.quant.findText("mxfp4") == -1  # a dense model: no experts for MXFP4
    small = dialog.size.text()
    dialog.quant.setCurrentText("f32")
    assert small.startswith("about ") and dialog.size.text() != small  # f32 predicts more
    dialog.quant.setCurrentText("q8_0")
    dialog.out.setText(str(gui_env / "gguf"))
    with qtbot.waitSignal(dialog.thread_done, timeout=60_000):
        dialog.export_button.click()
    assert (gui_env / "gguf" / "model.gguf").is_file()
    assert dialog.bar.value() == dialog.bar.maximum() > 0
    assert "perplexity" in dialog.log.toPlainText()


def test_export_dialog_names_a_bad_target_folder_in_a_dialog(
    make_window, trained, gui_env, qtbot, dialogs
):
    pg = make_window().playground
    pg.refresh_runs(trained)
    dialog = pg.export_clicked()
    taken = gui_env / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    dialog.out.setText(str(taken))
    with qtbot.waitSignal(dialog.thread_done, timeout=60_000):
        dialog.export_button.click()
    assert "not an empty folder" in dialogs.named("critical")[0][1]
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]


def test_a_missing_run_is_a_dialog_not_a_crash(make_window, qtbot, dialogs, gui_env):
    window = make_window()
    pg = window.playground
    pg.run_combo.setCurrentText(str(gui_env / "nothing-here"))
    with qtbot.waitSignal(pg.generation_done, timeout=30_000):
        pg.generate()
    assert "is neither a run folder" in dialogs.named("critical")[0][1]
    assert pg.status.text().startswith("Failed")


def test_evaluate_tab_scores_a_run_and_names_bad_input(
    make_window, trained, gui_env, qtbot, dialogs
):
    tab = make_window().run_view.evaluate
    tab.refresh_runs(trained)
    text = gui_env / "t.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 20, encoding="utf-8")
    tab.text.setText(str(text))
    with qtbot.waitSignal(tab.finished, timeout=60_000):
        tab.button.click()
    assert tab.result["text"]["word_perplexity"] > 1
    assert "bits_per_byte" in tab.output.toPlainText()
    assert len(list((Path(trained) / "eval").glob("text-t.txt-*.json"))) == 1
    tab.text.setText(str(gui_env / "missing.txt"))
    with qtbot.waitSignal(tab.finished, timeout=60_000):
        tab.button.click()
    assert "missing.txt not found" in dialogs.named("critical")[0][1]
    tab.text.setText(str(text))
    tab.compare.setChecked(True)  # a run trained from scratch has no start model
    with qtbot.waitSignal(tab.finished, timeout=60_000):
        tab.button.click()
    assert "not a fine-tune" in dialogs.named("critical")[1][1]


def test_compare_tab_overlays_ticked_runs_with_their_settings(make_window, gui_env, qtbot):
    from core.training.trainer import Trainer

    runs = gui_env / "runs"
    for name, lr in (("a", 3e-3), ("b", 1e-2)):
        Trainer(tiny_config(max_steps=6, eval_every=3, ckpt_every=3, lr=lr), runs / name).run()
    tab = make_window().run_view.compare
    tab.refresh_runs()
    assert tab.runs.count() == 2 and tab.ticked() == []
    tab.tick(runs / "a")
    tab.tick(runs / "b")
    items = tab.plot.getPlotItem().listDataItems()
    assert len(items) == 4  # train and validation of each run
    names = [item.name() for item in items]
    assert any("a (new 32x2, embedded, lr 0.003" in n for n in names)
    assert any("b (new 32x2, embedded, lr 0.01" in n and "validation" in n for n in names)
    tab.axis.setCurrentText("training time (s)")  # by time: elapsed seconds, not steps
    xs = tab.plot.getPlotItem().listDataItems()[0].getData()[0]
    assert 0 < xs[-1] < 100 and list(xs) != [3, 6]
