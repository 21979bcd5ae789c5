"""GUI tests that train: short cpu-tiny runs started, stopped and resumed from the window."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from PySide6.QtCore import Qt

from core.runs import checkpoint as ckpt_lib
from core.runs.folder import RunFolder, checkpoint_summary, read_metrics
from core.training.trainer import Trainer

RUN_TIMEOUT_MS = 60_000
SMALL_CORPUS = 200_000  # bytes: reading less of the embedded corpus keeps runs short


def tiny_window(make_window, **values):
    """A window with cpu-tiny selected and a few fields changed."""
    window = make_window()
    window.show()
    window.select_preset("cpu-tiny")
    window.form.set_values(corpus_max_bytes=SMALL_CORPUS, **values)
    return window


def run_to_end(qtbot, window, start) -> dict:
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        assert start() is not False
    return blocker.args[0]


def test_run_from_the_window_updates_plots_progress_and_run_folder(make_window, qtbot, gui_env):
    window = tiny_window(make_window, max_steps=30)
    run_dir = gui_env / "first run"
    window.out_edit.setText(str(run_dir))
    assert window.start_button.isEnabled() and not window.stop_button.isEnabled()

    def click_start():
        qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
        assert window.running and window.stop_button.isEnabled()
        assert not window.start_button.isEnabled() and not window.form.isEnabled()

    result = run_to_end(qtbot, window, click_start)
    assert result["status"] == "finished" and result["step"] == 30
    assert window.state == "finished" and "Finished" in window.run_view.status_label.text()
    # plots: every step drawn, evaluations at 25 and 30
    assert window.plots.curve_points("loss") == 30
    assert window.plots.curve_points("val_loss") == 2
    assert window.plots.curve_points("tokens_per_s") == 30
    assert window.plots.curve_points("rss_mb") == 30
    assert window.plots.curve_points("lr") == 30
    assert window.plots.experts.isHidden()  # a dense model: no Experts plot
    # progress
    assert (window.run_view.progress.value(), window.run_view.progress.maximum()) == (30, 30)
    timing = window.run_view.timing_label.text()
    assert "tok/s" in timing and "elapsed" in timing
    assert window.run_view.sample_view.toPlainText().startswith("--- step 30 ---")
    assert "finished at step 30" in window.run_view.log_view.toPlainText()
    # run folder
    folder = RunFolder(run_dir)
    assert folder.read_status()["state"] == "finished"
    assert folder.latest.is_file() and folder.config_file.is_file()
    train, evals = read_metrics(folder.metrics_file)
    assert [r["step"] for r in train] == list(range(1, 31))
    # idle again; the one-shot run folder was cleared so the next Start makes a new one
    assert window.start_button.isEnabled() and window.out_edit.text() == ""


@pytest.mark.slow  # over ~10 s on 2 cores
def test_stop_leaves_a_checkpoint_and_resume_continues_the_curve(make_window, qtbot, dialogs):
    window = tiny_window(make_window, max_steps=5000, ckpt_every=1000, eval_every=10)
    assert window.start()
    progress = window.run_view.run_progress
    qtbot.waitUntil(lambda: (progress.step or 0) >= 15, timeout=60_000)
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(window.stop_button, Qt.MouseButton.LeftButton)
        assert window.state == "stopping" and not window.stop_button.isEnabled()
    result = blocker.args[0]
    stopped_at = result["step"]
    assert result["status"] == "stopped" and 15 <= stopped_at < 5000
    assert window.state == "stopped"
    run = RunFolder(result["run_dir"])
    assert run.read_status()["state"] == "stopped"
    # Stop saved a checkpoint at the step it stopped on, and it loads.
    state = ckpt_lib.load(run.latest)
    assert state["step"] == stopped_at
    assert checkpoint_summary(run.latest)["step"] == stopped_at

    # A new launch offers to resume the interrupted run and shows what it holds.
    second = make_window()
    second.show()
    assert second.offer_interrupted_resume()
    dialog = second.resume_dialog
    assert dialog.isVisible() and "did not finish" in dialog.note.text()
    assert f"{stopped_at:,} of 5,000" in dialog.details.text()
    assert "hidden 64, 2 layers, 4 heads" in dialog.details.text()
    dialog.max_steps.setValue(stopped_at + 20)
    with qtbot.waitSignal(second.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(dialog.resume_button, Qt.MouseButton.LeftButton)
    result = blocker.args[0]
    assert result["status"] == "finished" and result["step"] == stopped_at + 20
    # The loss curve holds the history from metrics.jsonl and continues it, no gap, no repeat.
    xs = second.plots.series["loss"].x
    assert np.array_equal(xs, np.arange(1, stopped_at + 21))
    assert second.plots.curve_points("loss") == stopped_at + 20
    assert "plots refilled with" in second.run_view.log_view.toPlainText()
    train, _ = read_metrics(run.metrics_file)
    assert [r["step"] for r in train] == list(range(1, stopped_at + 21))
    assert second.form.validated().max_steps == stopped_at + 20

    # An incompatible checkpoint: core refuses, the dialog carries its message.
    with qtbot.waitSignal(second.run_ended, timeout=RUN_TIMEOUT_MS):
        assert second.resume_from(str(run.path), {"hidden_dim": 128})
    title, text = dialogs.named("critical")[-1]
    assert title == "Cannot train with these settings"
    assert "different settings" in text and "hidden_dim 64 -> 128" in text
    assert second.state == "failed" and second.start_button.isEnabled()


def test_core_errors_show_a_dialog_and_leave_the_window_usable(
    make_window, qtbot, dialogs, gui_env
):
    missing = gui_env / "no such corpus.txt"
    window = tiny_window(make_window, max_steps=10, data=str(missing))
    result = run_to_end(qtbot, window, window.start)
    assert result["status"] == "failed"
    title, text = dialogs.named("critical")[-1]
    assert title == "Cannot train with these settings"
    assert text.startswith("data:") and "neither a file nor a folder" in text
    assert window.state == "failed" and "Failed" in window.run_view.status_label.text()
    # nothing lost: the settings are still there and the window takes the next run
    assert window.form.validated().data == str(missing)
    assert window.start_button.isEnabled() and window.form.isEnabled()
    window.form.set_values(data=None)
    assert run_to_end(qtbot, window, window.start)["status"] == "finished"
    # A refused start does not wipe the last run's curves.
    window.form.set_values(data=str(missing))
    assert run_to_end(qtbot, window, window.start)["status"] == "failed"
    assert window.plots.curve_points("loss") == 10

    # Resume of something that is not a run: the dialog comes before any thread starts.
    assert window.resume_from(str(gui_env / "nothing here")) is False
    assert "resume:" in dialogs.named("critical")[-1][1]
    assert window.worker is None


def oom_fault(at_step, times):
    """Raise a CUDA-style OOM at micro-batch 0 of a step, `times` times."""
    fired = []

    def fault(step, micro):
        if step == at_step and micro == 0 and len(fired) < times:
            fired.append(step)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    return fault


def test_out_of_memory_notice_updates_the_form_then_fails_at_batch_1(
    make_window, qtbot, dialogs, monkeypatch
):
    import gui.worker

    faults = [oom_fault(3, 1), oom_fault(3, 99)]
    monkeypatch.setattr(gui.worker, "TRAIN_IN_CHILD", False)  # the fault lives in this process
    monkeypatch.setattr(
        gui.worker,
        "Trainer",
        lambda cfg, run_dir, resume_from=None: Trainer(cfg, run_dir, resume_from, faults.pop(0)),
    )
    window = tiny_window(make_window, max_steps=6)
    result = run_to_end(qtbot, window, window.start)
    assert result["status"] == "finished"
    notice = window.run_view.notice
    assert not notice.isHidden() and "batch_size 4 x grad_accum 2" in notice.text()
    cfg = window.form.validated()
    assert (cfg.batch_size, cfg.grad_accum) == (4, 2)
    assert dialogs.named("critical") == []

    result = run_to_end(qtbot, window, window.start)  # OOM all the way down to batch 1
    assert result["status"] == "failed"
    assert window.run_view.notice.isHidden() is False
    assert (window.form.validated().batch_size, window.form.validated().grad_accum) == (1, 8)
    title, text = dialogs.named("critical")[-1]
    assert title == "Training stopped" and "out of memory" in text and "batch_size 1" in text


@pytest.mark.slow  # over ~10 s on 2 cores
def test_autostart_resume_latest_and_resume_from_the_command_line(make_window, qtbot, gui_env):
    from gui.__main__ import build_parser, launch

    def parse(*args):
        return build_parser().parse_args([*args, "--runs-root", str(gui_env / "runs")])

    window = make_window()
    window.show()
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        launch(window, parse("--preset", "cpu-tiny", "--max-steps", "8", "--autostart"))
    first = blocker.args[0]
    assert first["status"] == "finished" and first["step"] == 8
    assert str(gui_env / "runs") in first["run_dir"]

    # Resume latest on a finished run asks how far to go (as many steps again by default).
    qtbot.mouseClick(window.resume_latest_button, Qt.MouseButton.LeftButton)
    dialog = window.resume_dialog
    assert dialog.isVisible() and "has finished" in dialog.note.text()
    assert dialog.max_steps.value() == 16
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(dialog.resume_button, Qt.MouseButton.LeftButton)
    assert blocker.args[0]["step"] == 16 and blocker.args[0]["run_dir"] == first["run_dir"]

    # `--resume latest --max-steps 20` opens the same dialog, prefilled.
    launch(window, parse("--resume", "latest", "--max-steps", "20"))
    qtbot.waitUntil(lambda: window.resume_dialog is not dialog, timeout=5_000)
    assert window.resume_dialog.max_steps.value() == 20
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(window.resume_dialog.resume_button, Qt.MouseButton.LeftButton)
    assert blocker.args[0]["status"] == "finished" and blocker.args[0]["step"] == 20
    status = json.loads(RunFolder(first["run_dir"]).status_file.read_text())
    assert status["state"] == "finished" and status["step"] == 20
    train, _ = read_metrics(RunFolder(first["run_dir"]).metrics_file)
    assert [r["step"] for r in train] == list(range(1, 21))
    assert window.plots.curve_points("loss") == 20


def test_tokenizer_field_bpe_run_shows_preparation_data_and_bits_per_byte(
    make_window, qtbot, gui_env
):
    text = gui_env / "book.txt"
    text.write_text("It was the best of times, it was the worst of times.\n" * 4000)
    window = tiny_window(make_window, max_steps=10, eval_every=5)
    form = window.form
    assert not form.widgets["vocab_size"].isEnabled()  # bytes: nothing to size
    form.data.set_value(str(text))
    assert "MB, used whole" in form.data_info.text()
    form.widgets["tokenizer"].set_text("bpe")
    assert form.widgets["vocab_size"].isEnabled()
    form.widgets["vocab_size"].setValue(512)
    cfg = form.validated()
    assert (cfg.tokenizer, cfg.vocab_size) == ("bpe", 512)
    formats = []
    window.out_edit.setText(str(gui_env / "bpe run"))
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        window.start()
        bar = window.run_view.progress
        window.worker.preparing.connect(lambda *a: formats.append(bar.format()))
    assert blocker.args[0]["status"] == "finished"
    assert any(f.startswith("preparing data:") and "MB/s" in f for f in formats)
    log = window.run_view.log_view.toPlainText()
    assert "512-token BPE" in log
    info = json.loads((gui_env / "bpe run" / "data.json").read_text())
    assert info["tokenizer"] == "bpe" and info["source_bytes"] == text.stat().st_size
    assert window.plots.curve_points("val_bpb") == 2


def test_stop_during_data_preparation_cancels_and_caches_nothing(
    make_window, qtbot, gui_env, monkeypatch
):
    from core.data import build_text
    from core.data import prepare as data_mod

    text = gui_env / "big.txt"
    text.write_text("lorem ipsum dolor sit amet\n" * 40_000)
    monkeypatch.setattr(build_text, "BLOCK", 4096)  # many progress reports: time to press Stop
    advance = data_mod.Progress.advance

    def slow_advance(self, n):
        time.sleep(0.005)  # a slow disk: preparation outlasts the click
        advance(self, n)

    monkeypatch.setattr(data_mod.Progress, "advance", slow_advance)
    monkeypatch.setattr("gui.worker.TRAIN_IN_CHILD", False)  # the slow disk is patched here
    window = tiny_window(make_window, max_steps=5)
    window.form.data.set_value(str(text))
    window.out_edit.setText(str(gui_env / "cancelled"))

    def stop_on_first_progress(*_):
        if window.state != "stopping":
            window.stop()

    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        window.start()
        window.worker.preparing.connect(stop_on_first_progress)
    assert blocker.args[0]["status"] == "cancelled"
    assert "cancelled" in window.run_view.status_label.text()
    assert not (gui_env / "cancelled").exists()
    cache = data_mod.default_cache_dir()
    assert not any(str(text) in p.read_text() for p in cache.glob("*/manifest.json"))
    assert window.start_button.isEnabled()


def test_a_killed_training_process_leaves_the_window_up_and_resume_continues(
    make_window, qtbot, dialogs
):
    window = tiny_window(make_window, max_steps=5000, ckpt_every=10, eval_every=1000)
    saved = []
    assert window.start()
    window.worker.checkpoint_saved.connect(lambda path, step: saved.append(step))
    qtbot.waitUntil(lambda: len(saved) >= 2, timeout=60_000)
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        window.worker.child.process.kill()  # a driver fault, the OOM killer, Task Manager
    result = blocker.args[0]
    assert result["status"] == "failed" and window.state == "failed"
    title, text = dialogs.named("critical")[-1]
    assert title == "Training failed" and "ended without a result" in text
    assert "Resume continues from the last checkpoint" in text
    assert window.start_button.isEnabled() and window.form.isEnabled()

    # The run folder is intact: Resume latest picks it up from its last checkpoint.
    run = RunFolder(result["run_dir"])
    last = ckpt_lib.load(run.latest)["step"]
    assert last >= 20 and last % 10 == 0
    window.form.set_values(max_steps=last + 5)
    resumed = run_to_end(
        qtbot, window, lambda: window.resume_from(str(run.path), {"max_steps": last + 5})
    )
    assert resumed["status"] == "finished" and resumed["step"] == last + 5
    assert resumed["run_dir"] == result["run_dir"]
    train, _ = read_metrics(run.metrics_file)
    assert [r["step"] for r in train] == list(range(1, last + 6))


def test_chat_jsonl_is_described_in_the_form_and_trains_from_the_window(
    make_window, qtbot, gui_env
):
    rows = [{"prompt": f"q{i}", "completion": f"answer {i}"} for i in range(30)]
    rows += [
        {
            "messages": [
                {"role": "user", "content": "x" * 200},
                {"role": "assistant", "content": "long"},
            ]
        }
    ]
    data = gui_env / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    window = tiny_window(make_window, max_steps=6, eval_every=3, seq_len=128)
    form = window.form
    form.data.set_value(str(data))
    info = form.data_info.text()
    assert info.startswith("Chat data: 31 examples (prompt/completion 30, messages 1)")
    # the long one: 200 x's, ChatML's marks and "long", 265 bytes; a row holds 129
    cut = (
        "1 of 31 examples were longer than seq_len 128 and were cut (longest 265 tokens; "
        "136 tokens lost); --drop-long drops them instead"
    )
    assert cut in info and "answers only" in info
    form.widgets["drop_long"].setChecked(True)
    assert (
        "1 of 31 examples were longer than seq_len 128 and were dropped (longest 265 tokens)"
        in (form.data_info.text())
    )
    result = run_to_end(qtbot, window, window.start)
    assert result["status"] == "finished"
    log = window.run_view.log_view.toPlainText()
    assert (
        "chat data: 29 training and 1 held-out examples; loss on answers only; 1 of 31 examples "
        "were longer than seq_len 128 and were dropped (longest 265 tokens)" in log
    )


def test_finish_cools_the_lr_down_saves_and_ends_as_finished(make_window, qtbot):
    from core.config import recipe

    window = tiny_window(
        make_window,
        max_steps=100_000,
        arch="llama",
        optimizer="auto",
        lr=None,
        schedule="wsd",
        warmup_steps=5,
        ckpt_every=1000,
        eval_every=1000,
        sample_tokens=0,
    )
    cfg = window.form.validated()
    assert not window.finish_button.isEnabled()
    assert window.start()
    assert window.finish_button.isEnabled() == window.stop_button.isEnabled() is True
    assert "low learning rate" in window.finish_button.toolTip()
    progress = window.run_view.run_progress
    qtbot.waitUntil(lambda: (progress.step or 0) >= 10, timeout=60_000)
    assert window.run_view.progress.maximum() == 100_000
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(window.finish_button, Qt.MouseButton.LeftButton)
        assert window.state == "finishing" and window.stop_button.isEnabled()
        assert "cooling the learning rate down" in window.run_view.status_label.text()
    result = blocker.args[0]
    assert result["status"] == "finished" and 10 < result["step"] < 1000
    assert window.state == "finished" and "Finished" in window.run_view.status_label.text()
    assert "finishing:" in window.run_view.log_view.toPlainText()
    # the bar followed the run's new end
    bar = window.run_view.progress
    assert (bar.value(), bar.maximum()) == (result["step"], result["step"])
    run = RunFolder(result["run_dir"])
    train, _ = read_metrics(run.metrics_file)
    last = train[-1]
    assert last["step"] == result["step"] and last["max_steps"] == result["step"]
    floor = recipe.adamw_lr(cfg) * cfg.min_lr_ratio
    assert last["lr"] == pytest.approx(floor, rel=1e-9)
    assert run.latest.is_file() and ckpt_lib.load(run.latest)["step"] == result["step"]
    assert run.read_status()["state"] == "finished"
