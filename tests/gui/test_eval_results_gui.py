"""Evaluations in the window: questions with a prompt template, the run's saved results listed
in the Evaluate tab, and shown in Compare runs beside the loss."""

from __future__ import annotations

import json

from helpers import tiny_config

from core.training.trainer import Trainer
from core.use import evaluate

ITEMS = [
    {"q": "2 + 2 is", "choices": ["four", "five"], "answer": 0},
    {"q": "The quick brown fox", "choices": ["jumps", "sleeps", "flies"], "answer": 0},
    {"q": "def add(a, b): return", "choices": ["a + b", "a - b"], "answer": 0},
]


def test_questions_saved_results_and_the_compare_table(make_window, gui_env, qtbot, dialogs):
    runs = gui_env / "runs"
    for name in ("a", "b"):
        Trainer(tiny_config(max_steps=4, eval_every=2, ckpt_every=2), runs / name).run()
    questions = gui_env / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in ITEMS), encoding="utf-8")
    window = make_window()
    tab = window.run_view.evaluate
    tab.refresh_runs(runs / "a")
    assert not tab.saved.isEnabled()  # nothing saved yet
    tab.choices.setText(str(questions))
    tab.template.setText("Q: {{q}}\nA:")  # the file has no question column: a template
    tab.fewshot.setValue(1)
    with qtbot.waitSignal(tab.finished, timeout=60_000):
        tab.button.click()
    assert not dialogs.calls, dialogs.calls
    out = tab.output.toPlainText()
    assert "acc_norm" in out and "acc_bytes" in out and tab.result["choices"]["n"] == 3
    assert tab.thread.scored == 7  # the progress counted every choice of every question
    assert tab.saved.isEnabled() and tab.saved.count() == 1
    assert "choices: q.jsonl" in tab.saved.itemText(0)
    record = evaluate.list_results(runs / "a")[0]
    assert record["settings"]["template"] == "Q: {{q}}\nA:" and record["settings"]["fewshot"] == 1
    tab.output.setPlainText("")
    tab._show_saved(0)  # a saved result shown again
    assert "acc_norm" in tab.output.toPlainText()

    compare = window.run_view.compare
    compare.refresh_runs()
    compare.tick(runs / "a")
    compare.tick(runs / "b")
    headers = [
        compare.table.horizontalHeaderItem(i).text() for i in range(compare.table.columnCount())
    ]
    assert headers[:2] == ["val_loss", "best val_loss"] and "q.jsonl acc" in headers
    assert compare.table.rowCount() == 2
    col = headers.index("q.jsonl acc")
    rows = {compare.table.verticalHeaderItem(i).text(): i for i in range(2)}
    assert compare.table.item(rows["a"], col).text() == f"{record['result']['acc']:.4g}"
    assert compare.table.item(rows["b"], col).text() == ""  # run b was not evaluated
