"""The Playground tab: generate from a run in a thread, stop it, export from the window."""

from __future__ import annotations

import pytest
from helpers import tiny_config
from PySide6.QtWidgets import QFileDialog, QInputDialog

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


def test_export_action_writes_a_transformers_folder(make_window, trained, gui_env, monkeypatch):
    pytest.importorskip("transformers")
    window = make_window()
    pg = window.playground
    pg.refresh_runs(trained)
    out = gui_env / "exported"
    monkeypatch.setattr(QInputDialog, "getItem", lambda *a, **k: ("hf", True))
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    assert pg.export_clicked() == out
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert "Exported hf" in pg.status.text()


def test_a_missing_run_is_a_dialog_not_a_crash(make_window, qtbot, dialogs, gui_env):
    window = make_window()
    pg = window.playground
    pg.run_combo.setCurrentText(str(gui_env / "nothing-here"))
    with qtbot.waitSignal(pg.generation_done, timeout=30_000):
        pg.generate()
    assert "is neither a run folder" in dialogs.named("critical")[0][1]
    assert pg.status.text().startswith("Failed")
