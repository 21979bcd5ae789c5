"""The Evaluate tab's Before/after answers: the report of a chat fine-tune, rendered in the tab."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from hf_models import make_model  # noqa: E402

from core.training.trainer import Trainer  # noqa: E402


def test_evaluate_tab_shows_the_before_after_report(make_window, gui_env, qtbot, dialogs):
    make_model(gui_env / "base", "llama")
    rows = [{"prompt": f"Add {i} and {i + 1}", "completion": f"{2 * i + 1}"} for i in range(40)]
    data = gui_env / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run = gui_env / "runs" / "chat"
    cfg = tiny_config(
        init_from=str(gui_env / "base"),
        tokenizer="model",
        data=str(data),
        lora_rank=4,
        max_steps=3,
        eval_every=3,
        ckpt_every=3,
        n_heads=4,
        bias=False,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(cfg, run).run()
    tab = make_window().run_view.evaluate
    tab.refresh_runs(run)
    assert not tab.report_view.isVisibleTo(tab)
    tab.report.setChecked(True)
    tab.report_n.setValue(2)  # the data holds 2 held-out examples: 19 and 39
    with qtbot.waitSignal(tab.finished, timeout=60_000):
        tab.button.click()  # no text or questions: the report alone
    assert not dialogs.named("critical")
    examples = tab.result["report"]["examples"]
    assert [ex["reference"] for ex in examples] == ["39", "79"]
    assert tab.report_view.isVisibleTo(tab) and not tab.output.isVisibleTo(tab)
    shown = tab.report_view.toPlainText()  # rendered: no Markdown marks left
    assert "Example 1" in shown and "Example 2" in shown and "## Example" not in shown
    assert "user: Add 39 and 40" in shown and "Start model\nFine-tuned" in shown
    for ex in examples:  # a random model's answers, punctuation and all, shown as they are
        for key in ("start", "fine_tuned"):
            visible = "".join(c if c.isprintable() or c == "\n" else "\ufffd" for c in ex[key])
            for line in visible.strip().splitlines():
                assert line.strip() in shown
    assert (run / "eval" / "report.md").read_text(encoding="utf-8").startswith("# Before")
    tab.run_combo.setCurrentText(str(gui_env / "base"))  # a model folder is no run
    with qtbot.waitSignal(tab.finished, timeout=60_000):
        tab.button.click()
    assert "is not a run folder" in dialogs.named("critical")[0][1]
